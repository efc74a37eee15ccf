"""Real servers for the tests: the project's API on a free loopback port, and a
throwaway PostgreSQL cluster started from Debian's binaries."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from svc_server.api import create_app
from svc_server.api.serving import uvicorn_options
from svc_server.config import Settings


@contextlib.contextmanager
def optional_server(factory: Any, what: str) -> Iterator[Any]:
    """Starts the server ``factory`` makes, or yields None where its binary is missing —
    except under CI, which installs it, so there a missing binary fails the run."""
    try:
        server = factory()
    except FileNotFoundError:
        if os.environ.get("CI"):
            raise RuntimeError(f"CI must install {what}") from None
        yield None
        return
    server.start()
    try:
        yield server
    finally:
        server.stop()


def wait_healthy(url: str, proc: subprocess.Popen[Any] | None = None, seconds: float = 30) -> None:
    """Waits until ``url``/healthz answers 200; fails at once if ``proc`` has exited."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"server exited during start-up: {err!r}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy in {seconds} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class RunningApi:
    url: str
    settings: Settings
    server: uvicorn.Server


@contextlib.contextmanager
def run_api(settings: Settings) -> Iterator[RunningApi]:
    """The account API served by uvicorn in a thread, over real HTTP on loopback."""
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="off",
        **uvicorn_options(settings),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("API server did not start")
        time.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield RunningApi(f"http://127.0.0.1:{port}", settings, server)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        app.state.services.engine.dispose()


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


class PostgresServer:
    """A PostgreSQL cluster in a temporary directory, run as an unprivileged user (the
    server refuses to run as root), listening on a free loopback port."""

    USER = "svc-pgtest"

    def __init__(self) -> None:
        bindir = _pg_bin()
        if bindir is None:
            raise FileNotFoundError("no PostgreSQL server binaries (apt-get install postgresql)")
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="svc-pg-"))
        self.port = free_port()
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(self.USER)
            except KeyError:
                subprocess.run(
                    [
                        "useradd",
                        "--system",
                        "--no-create-home",
                        "--shell",
                        "/usr/sbin/nologin",
                        self.USER,
                    ],
                    check=True,
                )
            shutil.chown(self.root, self.USER, self.USER)
            self._as_user = ["runuser", "-u", self.USER, "--"]
        self.data = self.root / "data"

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self._as_user, *cmd], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        )
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-w",
            "-l",
            str(self.root / "log"),
            "start",
        )

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url().replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


class RedisServer:
    """redis-server (Debian package) on a free loopback port, no persistence."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("no redis-server binary (apt-get install redis-server)")
        self.binary = binary
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="svc-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def flush(self) -> None:
        import redis

        redis.Redis.from_url(self.url).flushall()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


class RedisCluster:
    """A Redis Cluster of three primaries, each with one replica, from the Debian
    package's redis-server on free loopback ports (cluster bus ports too), no
    persistence; ``redis-cli --cluster create`` assigns the slots and the replicas."""

    SIZE = 6

    def __init__(self) -> None:
        binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if binary is None or cli is None:
            raise FileNotFoundError("no redis-server/redis-cli (apt-get install redis-server)")
        self.binary, self.cli = binary, cli
        self.ports = [free_port() for _ in range(self.SIZE)]
        self.bus_ports = [free_port() for _ in range(self.SIZE)]
        self.root = Path(tempfile.mkdtemp(prefix="svc-redis-cluster-"))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def _spawn(self, port: int, bus_port: int) -> None:
        where = self.root / str(port)
        where.mkdir(exist_ok=True)
        self.procs[port] = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(port),
                "--cluster-port",
                str(bus_port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(where / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(where),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def node(self, port: int) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def start(self) -> None:
        for port, bus_port in zip(self.ports, self.bus_ports, strict=True):
            self._spawn(port, bus_port)
        for port in self.ports:
            self._wait_listening(port)
        subprocess.run(
            [
                self.cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        self.wait_ok()

    def _wait_listening(self, port: int) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {port} did not start")

    def primaries(self) -> list[int]:
        return [p for p in self.ports if self.node(p).info("replication")["role"] == "master"]

    def wait_ok(self, seconds: float = 30) -> None:
        """Until every node says cluster_state:ok, there are three primaries, and every
        replica's link to its primary is up (so a manual failover can start at once)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                states = [self.node(p).cluster("info")["cluster_state"] for p in self.ports]
                infos = [self.node(p).info("replication") for p in self.ports]
                primaries = [i for i in infos if i["role"] == "master"]
                replicas = [i for i in infos if i["role"] == "slave"]
                if (
                    all(s == "ok" for s in states)
                    and len(primaries) == 3
                    and all(i["connected_slaves"] == 1 for i in primaries)
                    and all(i["master_link_status"] == "up" for i in replicas)
                ):
                    return
            time.sleep(0.1)
        raise RuntimeError("the Redis cluster did not become healthy")

    def primary_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot."""
        slot = self.node(self.ports[0]).cluster("keyslot", key)
        for port in self.primaries():
            for line in self.node(port).execute_command("CLUSTER", "NODES").decode().splitlines():
                fields = line.split()
                if "myself" not in fields[2]:
                    continue
                for part in fields[8:]:
                    low, _, high = part.partition("-")
                    if int(low) <= slot <= int(high or low):
                        return port
        raise RuntimeError(f"no primary serves slot {slot}")

    def replica_of(self, primary: int) -> int:
        for port in self.ports:
            info = self.node(port).info("replication")
            if info["role"] == "slave" and int(info["master_port"]) == primary:
                return port
        raise RuntimeError(f"primary {primary} has no replica")

    def failover(self, primary: int) -> int:
        """A manual failover (``CLUSTER FAILOVER`` on the replica): the primary stops
        taking writes, the replica catches up with its replication stream and takes
        over, so nothing the primary acknowledged is lost. Returns the new primary."""
        replica = self.replica_of(primary)
        self.node(replica).execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.node(replica).info("replication")["role"] == "master":
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"replica {replica} was not promoted")
        self.wait_ok()
        return replica

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports[:3])

    def flush(self) -> None:
        for port in self.primaries():
            self.node(port).flushall()

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``svc <args>`` as a subprocess of this interpreter."""
    return subprocess.Popen(
        [sys.executable, "-m", "svc_cli", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    """Returns as soon as ``path`` exists, while ``proc`` runs: a moment in a server's
    start-up (its database file) to send it a signal at."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"exited before {path.name} existed"
        assert time.monotonic() < deadline, f"no {path.name} in {timeout:g} s"
        time.sleep(0.001)


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class ScaledOut:
    """One account API and two relay processes sharing a database and Redis."""

    api_url: str
    relay_ports: tuple[int, int]
    relays: list[subprocess.Popen[str]]


@contextlib.contextmanager
def scaled_out(
    tmp_path: Path,
    postgres: PostgresServer | None,
    redis_server: RedisServer | RedisCluster,
    name: str,
) -> Iterator[ScaledOut]:
    """Starts the processes (PostgreSQL if this machine has it, else a shared SQLite
    file); the API is healthy on return, the relays are started. Stops them all."""
    redis_server.flush()
    database = (
        postgres.create_database(f"{name}_{os.getpid()}_{time.monotonic_ns()}")
        if postgres is not None
        else f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    )
    common = ["--data-dir", str(tmp_path / "server"), "--database-url", database]
    api_port, a_port, b_port = free_port(), free_port(), free_port()
    api_url = f"http://127.0.0.1:{api_port}"
    api = start(["api", "--port", str(api_port), *common])
    relays: list[subprocess.Popen[str]] = []
    try:
        wait_healthy(api_url, api)
        for port in (a_port, b_port):
            relays.append(
                start(
                    [
                        "relay",
                        "--port",
                        str(port),
                        "--redis-url",
                        redis_server.url,
                        "--api-url",
                        api_url,
                        *common,
                    ]
                )
            )
        yield ScaledOut(api_url, (a_port, b_port), relays)
    finally:
        for proc in [*relays, api]:
            stop(proc)
