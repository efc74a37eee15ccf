"""Soak: agents on two relays sharing Redis, for minutes, while things go wrong.

    python bench/soak.py [--minutes 10] [--agents 50] [--channels 5] [--rate 1.0]

Starts `svc api` (PostgreSQL if this machine has it, else SQLite), a redis-server and two
`svc relay` processes, then ``--agents`` agents (SvcClient, both relay addresses, half of
them preferring each relay) in ``--channels`` channels. Each agent sends ``--rate``
messages a second and reads its channel. Meanwhile:

- membership churn: in each channel, every ``--churn`` seconds the owner removes one of
  two churning members and a new agent joins by invite in its place;
- every ``--kill-every`` seconds a relay, chosen at random, is killed with SIGKILL and
  started again 3 s later (clients fail over to the other);
- one agent's data_dir lives on a small tmpfs that a filler file fills for 15 s every
  minute (a real full disk; needs root to mount, else this part is skipped and said so).

At the end it waits for the channels to go quiet and prints, for the stable members
(in their channel for the whole run): messages sent (``send()`` returned), deliveries
expected and made, duplicated and lost (both must be 0), storage faults the full disk
surfaced to the reading agent, delivery latency (p50, p99), and each relay's RSS over
the run (flat, not growing). Not part of the test suite: it takes minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from svc_sdk import Channel, InternalError, SvcClient, SvcError  # noqa: E402
from svc_sdk._argtypes import whole_number  # noqa: E402
from tests.support import (  # noqa: E402
    PostgresServer,
    RedisServer,
    free_port,
    optional_server,
    start,
    stop,
    wait_healthy,
)


class Skipped(logging.Handler):
    """What agents' channels skipped (messages they could not read), by agent."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.threadName}: {record.getMessage()}")


SKIPPED = Skipped()


def wait_relay(port: int, proc: subprocess.Popen[str], seconds: float = 30) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"relay on {port} exited: {proc.stderr.read() if proc.stderr else ''}"
            )
        with (
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
            contextlib.suppress(grpc.RpcError),
        ):
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="svc.relay.v1.Relay"), timeout=1
            )
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return
        time.sleep(0.1)
    raise RuntimeError(f"relay on {port} did not come up")


class Relays:
    """Two relay processes on fixed ports, killed and restarted on demand."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.ports = [free_port(), free_port()]
        self.procs: list[subprocess.Popen[str]] = [self._start(p) for p in self.ports]
        for port, proc in zip(self.ports, self.procs, strict=True):
            wait_relay(port, proc)
        self.kills = 0
        self.rss: list[list[int]] = [[], []]

    def _start(self, port: int) -> subprocess.Popen[str]:
        proc = start(["relay", "--port", str(port), *self.args])
        # Read its output so a chatty relay never blocks on a full pipe.
        for stream in (proc.stdout, proc.stderr):
            threading.Thread(target=lambda s=stream: [None for _ in s], daemon=True).start()
        return proc

    @property
    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def kill_one(self) -> int:
        i = random.randrange(2)
        self.procs[i].kill()
        self.procs[i].wait()
        self.kills += 1
        time.sleep(3)
        self.procs[i] = self._start(self.ports[i])
        wait_relay(self.ports[i], self.procs[i])
        return i

    def sample_rss(self) -> None:
        for i, proc in enumerate(self.procs):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.rss[i].append(int(line.split()[1]) // 1024)

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)


class FullDisk:
    """A small tmpfs for one agent's data_dir, filled and freed on demand."""

    def __init__(self, size_mib: int) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="svc-soak-disk-"))
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(self.path)],
            capture_output=True,
        )
        self.mounted = done.returncode == 0
        self.fills = 0

    def fill(self, seconds: float) -> None:
        filler = self.path / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        self.fills += 1
        time.sleep(seconds)
        filler.unlink(missing_ok=True)

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)
        shutil.rmtree(self.path, ignore_errors=True)


@dataclass
class Agent:
    name: str
    client: SvcClient
    channel: Channel
    rate: float
    stable: bool
    sent: dict[int, float] = field(default_factory=dict)  # n -> when send() returned
    received: Counter[tuple[str, int]] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    faults: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)
    sending: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def run(self) -> None:
        """Sends at ``rate`` and reads, in one thread, until stopped or removed."""
        n = 0
        due = time.monotonic() + random.random() / max(self.rate, 1e-9)
        while not self.stop.is_set() and not self.channel.closed:
            now = time.monotonic()
            if self.sending.is_set() and now >= due:
                due = now + 1 / self.rate
                n += 1
                try:
                    self.channel.send(f"{self.name}|{n}|{time.time()}".encode())
                    self.sent[n] = time.monotonic()
                except SvcError as exc:
                    self.errors[type(exc).__name__] += 1
            try:
                for m in self.channel.next_messages(timeout=0.05) or []:
                    sender, seq, at = m.data.decode().split("|")
                    self.received[(sender, int(seq))] += 1
                    self.latencies.append(time.time() - float(at))
            except InternalError:
                self.faults += 1  # the full disk, said so; nothing is lost
                time.sleep(0.2)
            except SvcError as exc:
                self.errors[type(exc).__name__] += 1
                time.sleep(0.2)

    def begin(self) -> None:
        self.thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self.thread.start()

    def end(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)


@dataclass
class Soak:
    endpoints: list[str]
    api_url: str
    api_key: str
    rate: float
    root: Path
    disk: FullDisk | None
    agents: list[Agent] = field(default_factory=list)
    retired: list[Agent] = field(default_factory=list)
    counter: int = 0

    def client(self, name: str, data_dir: Path | None = None) -> SvcClient:
        order = self.endpoints if self.counter % 2 else self.endpoints[::-1]
        self.counter += 1
        return SvcClient(
            ",".join(order),
            data_dir or self.root / name,
            name.encode(),
            api_key=self.api_key,
            api_url=self.api_url,
        )

    def close(self) -> None:
        for a in self.agents:
            a.end()
        for a in self.agents + self.retired:
            a.client.close()

    def agent(self, name: str, channel: Channel, client: SvcClient, stable: bool) -> Agent:
        made = Agent(name, client, channel, self.rate, stable)
        made.begin()
        self.agents.append(made)
        return made

    def join(
        self, owner: Agent, channel: str, name: str, stable: bool, disk: bool = False
    ) -> Agent:
        token = owner.client.invite(channel)
        client = self.client(name, self.disk.path / name if disk and self.disk else None)
        joined = client.join_with_token(channel, token, timeout=60)
        return self.agent(name, joined, client, stable)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--agents", type=whole_number(4), default=50)
    parser.add_argument("--channels", type=whole_number(1), default=5)
    parser.add_argument("--rate", type=float, default=1.0, help="messages/s per agent")
    parser.add_argument("--churn", type=float, default=30, help="seconds between churns")
    parser.add_argument("--kill-every", type=float, default=60)
    args = parser.parse_args()
    # Reconnects and refused sends are expected here; the table counts what matters.
    logging.getLogger("svc_sdk").setLevel(logging.ERROR)
    channel_log = logging.getLogger("svc_sdk.channel")
    channel_log.setLevel(logging.DEBUG)
    channel_log.propagate = False
    channel_log.addHandler(SKIPPED)
    per_channel = args.agents // args.channels
    if per_channel < 4:
        parser.error("need at least 4 agents per channel (owner, stable members, 2 churning)")

    root = Path(tempfile.mkdtemp(prefix="svc-soak-"))
    disk = FullDisk(64) if hasattr(sys, "platform") and sys.platform == "linux" else None
    if disk is not None and not disk.mounted:
        print("# no tmpfs (needs root): the full-disk part is skipped")
        disk.close()
        disk = None
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(optional_server(RedisServer, "redis-server"))
        if redis is None:
            raise SystemExit("needs redis-server (apt-get install redis-server)")
        postgres = stack.enter_context(optional_server(PostgresServer, "postgresql"))
        database = (
            postgres.create_database(f"soak_{int(time.time())}")
            if postgres is not None
            else f"sqlite:///{root / 'shared.sqlite3'}"
        )
        common = ["--data-dir", str(root / "server"), "--database-url", database]
        api_port = free_port()
        api_url = f"http://127.0.0.1:{api_port}"
        api = start(["api", "--port", str(api_port), *common])
        stack.callback(stop, api)
        wait_healthy(api_url, api)
        relays = Relays(["--redis-url", redis.url, "--api-url", api_url, *common])
        stack.callback(relays.stop)
        key = httpx.post(f"{api_url}/v1/accounts", json={"email": "soak@example.com"}).json()[
            "api_key"
        ]["key"]
        soak = Soak(relays.endpoints, api_url, key, args.rate, root, disk)
        stack.callback(soak.close)
        if disk is not None:
            stack.callback(disk.close)
        run(soak, relays, disk, args, per_channel)


def run(
    soak: Soak, relays: Relays, disk: FullDisk | None, args: argparse.Namespace, per_channel: int
) -> None:
    started = time.monotonic()
    channels = [f"soak/load/c{i}" for i in range(args.channels)]
    owners: dict[str, Agent] = {}
    churning: dict[str, list[Agent]] = defaultdict(list)
    for i, name in enumerate(channels):
        client = soak.client(f"owner{i}")
        owners[name] = soak.agent(f"owner{i}", client.create_channel(name), client, stable=True)
        for j in range(per_channel - 1):
            stable = j < per_channel - 3
            on_disk = disk is not None and i == 0 and j == 0
            made = soak.join(owners[name], name, f"a{i}-{j}", stable, disk=on_disk)
            if not stable:
                churning[name].append(made)
    for a in soak.agents:
        a.sending.set()
    print(
        f"# {len(soak.agents)} agents in {len(channels)} channels, "
        f"set up in {time.monotonic() - started:.0f} s"
    )

    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    next_kill, next_churn = t0 + args.kill_every, t0 + args.churn
    next_fill, next_rss = t0 + 30, t0
    churns = generation = 0
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_rss:
            relays.sample_rss()
            next_rss = now + 10
        if now >= next_kill:
            print(f"# {now - t0:5.1f} s: killing a relay")
            killed = relays.kill_one()
            print(f"# {time.monotonic() - t0:5.1f} s: relay {killed} restarted")
            next_kill = now + args.kill_every
        if disk is not None and now >= next_fill:
            threading.Thread(target=disk.fill, args=(15,), daemon=True).start()
            next_fill = now + 60
        if now >= next_churn:
            print(f"# {now - t0:5.1f} s: churn")
            generation += 1
            for name in channels:
                out = churning[name].pop(0)
                try:
                    owners[name].channel.remove_member(out.client.agent_id)
                except SvcError as exc:
                    print(f"# removing {out.name} failed: {exc}")
                    churning[name].insert(0, out)
                    continue
                out.end()
                soak.agents.remove(out)
                soak.retired.append(out)
                try:
                    churning[name].append(
                        soak.join(
                            owners[name], name, f"{out.name.split('~')[0]}~{generation}", False
                        )
                    )
                    churning[name][-1].sending.set()
                except SvcError as exc:
                    print(f"# a join into {name} failed: {exc}")
                churns += 1
            next_churn = now + args.churn
        time.sleep(0.2)

    for a in soak.agents:
        a.sending.clear()
    report(soak, relays, disk, channels, churns, t0)


def report(
    soak: Soak, relays: Relays, disk: FullDisk | None, channels: list[str], churns: int, t0: float
) -> None:
    # Who sent what, per channel; stable members must have each exactly once.
    sent: dict[str, set[tuple[str, int]]] = defaultdict(set)
    when: dict[tuple[str, int], float] = {}
    for a in soak.agents + soak.retired:
        sent[a.channel.name].update((a.name, n) for n in a.sent)
        when.update({(a.name, n): t - t0 for n, t in a.sent.items()})
    stable = [a for a in soak.agents if a.stable]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        missing = sum(
            1
            for a in stable
            for key in sent[a.channel.name]
            if key[0] != a.name and key not in a.received
        )
        if missing == 0:
            break
        time.sleep(1)
    elapsed = time.monotonic() - t0
    for a in soak.agents:
        a.end()
    expected = delivered = duplicated = lost = 0
    latencies: list[float] = []
    for a in stable:
        want = {k for k in sent[a.channel.name] if k[0] != a.name}
        expected += len(want)
        delivered += sum(1 for k in want if k in a.received)
        lost_here = sorted(k for k in want if k not in a.received)
        lost += len(lost_here)
        if lost_here:
            shown = [f"{k[0]}#{k[1]} (sent at {when[k]:.1f} s)" for k in lost_here[:10]]
            print(f"# {a.name} never got {len(lost_here)}: {', '.join(shown)}")
        duplicated += sum(c - 1 for c in a.received.values() if c > 1)
        latencies += a.latencies
    errors: Counter[str] = Counter()
    for a in soak.agents + soak.retired:
        errors.update(a.errors)
    total_sent = sum(len(s) for s in sent.values())
    rows = [
        ("duration", f"{elapsed / 60:.1f} min"),
        (
            "agents (stable / churned in)",
            f"{len(soak.agents)} ({len(stable)} stable) / {len(soak.retired)} removed",
        ),
        ("membership changes", f"{churns} removals, {churns} joins"),
        ("relay kills (SIGKILL + restart)", str(relays.kills)),
        (
            "full-disk episodes / faults surfaced",
            f"{disk.fills} / {sum(a.faults for a in stable)}" if disk else "skipped (no tmpfs)",
        ),
        ("messages sent (send returned)", str(total_sent)),
        (
            "send errors (raised, not counted sent)",
            ", ".join(f"{k} {v}" for k, v in errors.items()) or "0",
        ),
        ("deliveries expected (stable members)", str(expected)),
        ("deliveries made", str(delivered)),
        ("duplicated", str(duplicated)),
        ("lost", str(lost)),
        (
            "latency p50 / p99",
            f"{percentile(latencies, 0.5) * 1000:.1f} ms / "
            f"{percentile(latencies, 0.99) * 1000:.1f} ms",
        ),
    ]
    for i, samples in enumerate(relays.rss):
        if samples:
            third = max(1, len(samples) // 3)
            rows.append(
                (
                    f"relay {i} RSS first third / last third / max",
                    f"{statistics.median(samples[:third])} / "
                    f"{statistics.median(samples[-third:])} / {max(samples)} MiB",
                )
            )
    width = max(len(k) for k, _ in rows)
    print(f"| {'measure'.ljust(width)} | value |")
    print(f"|{'-' * (width + 2)}|---:|")
    for k, v in rows:
        print(f"| {k.ljust(width)} | {v} |")
    for line in SKIPPED.records[:10]:
        print(f"# {line}")
    if duplicated or lost:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
