"""Relay round trips while the account API of the same ``svc up`` is under attack.

    python bench/isolation.py [--seconds 12] [--flooders 4] [--slow 200] [--pin-server]

Starts one ``svc up`` (SQLite) and times, from this process pinned to CPU 1, sequential
relay round trips (a 256-byte publish and its reply) while a probe checks every 0.2 s
that the API still answers ``/healthz``. Five phases, one after the other, in one run:

- idle;
- header flood: ``--flooders`` processes each send ``GET /healthz`` with one header of
  up to 256 MiB, reconnecting whenever the server closes the connection;
- slow-loris: ``--slow`` connections each trickle a request head, one byte a second;
- request flood: wrk (Debian package ``wrk``; the phase is skipped without it) keeps
  16 connections of ``GET /healthz`` busy, so the API uses all the CPU it can get;
- idle again.

The attackers run at nice 19 on CPU 1, so they take CPU from this client only when it
has nothing to do. ``svc up`` is not pinned (as it runs for real), unless
``--pin-server`` puts it on CPU 0. Prints one table: per phase, the relay round trip's
median, p99 and maximum, the probe's answers and median, and what the attackers saw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from svc_sdk._relay_pb import relay_pb2 as pb  # noqa: E402
from svc_sdk.mls import Engine  # noqa: E402
from svc_sdk.relay_client import RelayConnection  # noqa: E402
from svc_sdk.testing import LocalIssuer, certify_with_api  # noqa: E402

CHANNEL = "bench/isolation/rtt"
HEADER_TOTAL = 256 * 1024 * 1024
CHUNK = 1024 * 1024


def pinned(cpu: str, nice: int = 0) -> list[str]:
    prefix = ["taskset", "-c", cpu] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []
    return [*prefix, "nice", "-n", str(nice)] if nice else prefix


def start_stack(data_dir: Path, pin: bool) -> tuple[subprocess.Popen[str], str, str]:
    env = {**os.environ, "SVC_DATA_DIR": str(data_dir), "SVC_SIGNUP_RATE_LIMIT": "1000/minute"}
    env.pop("SVC_DATABASE_URL", None)
    env.pop("SVC_REDIS_URL", None)
    command = ["up", "--api-port", "0", "--relay-port", "0"]
    proc = subprocess.Popen(
        [*(pinned("0") if pin else []), sys.executable, "-P", "-m", "svc_cli", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    found: dict[str, str] = {}
    for line in proc.stdout:
        match = re.match(r"svc (account API|relay)\s+(\S+)", line)
        if match:
            found[match.group(1)] = match.group(2)
        if len(found) == 2:
            break
    else:
        raise SystemExit("svc up did not start")
    stdout = proc.stdout
    threading.Thread(target=stdout.read, daemon=True).start()  # keep the pipe drained
    return proc, found["account API"], found["relay"]


def message(size: int = 256) -> bytes:
    sender = LocalIssuer().certify(Engine(Path(tempfile.mkdtemp()) / "m", b"sender"))
    group = sender.create_group(CHANNEL.encode())
    ciphertext: bytes = group.encrypt(b"\x5a" * (size - 150))
    return ciphertext


# -- attackers (each runs as `isolation.py --worker KIND HOST PORT SECONDS [COUNT]`) ------


def flood_worker(host: str, port: int, seconds: float) -> dict[str, Any]:
    """One connection at a time, each sending a header of up to 256 MiB."""
    end = time.monotonic() + seconds
    connections = answered = 0
    longest = 0.0
    chunk = b"a" * CHUNK
    while time.monotonic() < end:
        began = time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=5) as s:
                connections += 1
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Flood: ")
                sent = 0
                while sent < HEADER_TOTAL and time.monotonic() < end:
                    if select.select([s], [], [], 0)[0]:  # the server answered
                        break
                    s.sendall(chunk)
                    sent += len(chunk)
                s.settimeout(1)
                if s.recv(64).startswith(b"HTTP/1.1 431"):
                    answered += 1
        except OSError:
            pass
        longest = max(longest, time.monotonic() - began)
    return {"connections": connections, "answered_431": answered, "longest_s": longest}


def slow_worker(host: str, port: int, seconds: float, count: int) -> dict[str, Any]:
    """``count`` connections trickling a request head, one byte a second each; one the
    server closes is replaced. Reports how long the server let them live."""
    end = time.monotonic() + seconds
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
    conns: dict[socket.socket, tuple[float, int]] = {}
    held: list[float] = []

    def open_one() -> None:
        try:
            s = socket.create_connection((host, port), timeout=2)
        except OSError:
            return
        s.setblocking(False)
        conns[s] = (time.monotonic(), 0)

    for _ in range(count):
        open_one()
    while time.monotonic() < end:
        for s, (began, sent) in list(conns.items()):
            try:
                if s.recv(4096) == b"":
                    raise ConnectionResetError
            except BlockingIOError:
                pass
            except OSError:
                held.append(time.monotonic() - began)
                del conns[s]
                s.close()
                open_one()
                continue
            try:
                s.send(head[sent % len(head) : sent % len(head) + 1])
                conns[s] = (began, sent + 1)
            except OSError:
                pass
        time.sleep(1)
    alive = [time.monotonic() - began for began, _ in conns.values()]
    for s in conns:
        s.close()
    return {
        "dropped": len(held),
        "longest_held_s": max(held, default=0.0),
        "still_open": len(alive),
        "oldest_open_s": max(alive, default=0.0),
    }


def start_attack(kind: str, api_url: str, seconds: float, n: int) -> list[subprocess.Popen[str]]:
    host, port = api_url.removeprefix("http://").rsplit(":", 1)
    if kind == "wrk":
        wrk = ["wrk", "-t1", "-c16", f"-d{seconds:g}s", f"{api_url}/healthz"]
        return [subprocess.Popen([*pinned("1", 19), *wrk], stdout=subprocess.PIPE, text=True)]
    worker = [sys.executable, __file__, "--worker", kind, host, port, f"{seconds:g}"]
    if kind == "slow":
        return [
            subprocess.Popen([*pinned("1", 19), *worker, str(n)], stdout=subprocess.PIPE, text=True)
        ]
    return [
        subprocess.Popen([*pinned("1", 19), *worker], stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]


def attack_report(procs: list[subprocess.Popen[str]]) -> str:
    results: list[dict[str, Any]] = []
    for p in procs:
        stdout, _ = p.communicate(timeout=600)
        if "Requests/sec" in stdout:
            rate = next(line for line in stdout.splitlines() if "Requests/sec" in line)
            return f"wrk: {float(rate.split()[-1]):.0f} requests/s"
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    if not results:
        return ""
    if "connections" in results[0]:
        conns = sum(r["connections"] for r in results)
        answered = sum(r["answered_431"] for r in results)
        longest = max(r["longest_s"] for r in results)
        return f"{conns} connections, {answered} read a 431, longest {longest:.1f} s"
    r = results[0]
    return (
        f"{r['dropped']} closed by the server (after at most {r['longest_held_s']:.1f} s), "
        f"{r['still_open']} open at the end (oldest {r['oldest_open_s']:.1f} s)"
    )


# -- the measurement ---------------------------------------------------------------------


@dataclass
class Probe:
    """GET /healthz every 0.2 s from a thread, with a 2 s timeout."""

    api_url: str
    latencies: list[float] = field(default_factory=list)
    failed: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=2) as http:
            while not self._stop.is_set():
                t = time.perf_counter()
                try:
                    http.get(f"{self.api_url}/healthz").raise_for_status()
                    self.latencies.append((time.perf_counter() - t) * 1000)
                except httpx.HTTPError:
                    self.failed += 1
                self._stop.wait(0.2)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def group_info(api_url: str, key: str) -> bytes:
    """The GroupInfo the relay needs to create (and track) the channel: a real group whose
    creator, the probe's identity, holds an agent credential from the account API."""
    engine = certify_with_api(Engine(Path(tempfile.mkdtemp()) / "bench", b"bench"), api_url, key)
    return engine.create_group(CHANNEL.encode()).group_info()


async def round_trips(conn: RelayConnection, msg: bytes, seconds: float) -> list[float]:
    rtts: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        await conn.request(pb.Publish(channel=CHANNEL, message=[msg]), timeout=300)
        rtts.append((time.perf_counter() - t) * 1000)
    return rtts


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(args: argparse.Namespace) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    root = Path(tempfile.mkdtemp(prefix="svc-isolation-"))
    proc, api_url, relay_url = start_stack(root / "server", args.pin_server)
    phases: list[tuple[str, str, int]] = [
        ("idle", "", 0),
        (f"header flood: {args.flooders} x 256 MiB headers", "flood", args.flooders),
        (f"slow-loris: {args.slow} connections", "slow", args.slow),
    ]
    if shutil.which("wrk"):
        phases.append(("request flood: wrk, 16 connections", "wrk", 1))
    phases.append(("idle again", "", 0))
    rows = []
    try:
        async with httpx.AsyncClient(base_url=api_url, timeout=10) as http:
            signup = await http.post("/v1/accounts", json={"email": "bench@example.com"})
            key = signup.json()["api_key"]["key"]
            reply = await http.post("/v1/tokens", headers={"Authorization": f"Bearer {key}"})
        msg = message()
        conn = RelayConnection(relay_url, reply.json()["token"], b"bench")
        await conn.open()
        info = await asyncio.to_thread(group_info, api_url, key)
        await conn.request(pb.CreateChannel(channel=CHANNEL, group_info=info))
        await round_trips(conn, msg, 1.0)  # warm-up
        for name, kind, n in phases:
            attackers = start_attack(kind, api_url, args.seconds, n) if kind else []
            await asyncio.sleep(0.5 if kind else 0)  # let the attack get going
            with Probe(api_url) as probe:
                rtts = await round_trips(conn, msg, args.seconds - 1 if kind else args.seconds)
            seen = await asyncio.to_thread(attack_report, attackers)
            rows.append((name, rtts, probe, seen))
        await conn.close()
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)

    where = "on CPU 0" if args.pin_server else "unpinned"
    print(f"svc up {where}; this client on CPU 1; {args.seconds:g} s per phase\n")
    print(
        "| phase | relay round trips | median ms | p99 ms | max ms "
        "| API probe answered | probe median ms | attackers |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, rtts, probe, seen in rows:
        tried = len(probe.latencies) + probe.failed
        api_median = f"{statistics.median(probe.latencies):.1f}" if probe.latencies else "-"
        print(
            f"| {name} | {len(rtts)} | {statistics.median(rtts):.2f} | {pct(rtts, 0.99):.2f} "
            f"| {max(rtts):.1f} | {len(probe.latencies)}/{tried} | {api_median} | {seen} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="length of each phase")
    parser.add_argument("--flooders", type=int, default=4, help="parallel huge-header senders")
    parser.add_argument("--slow", type=int, default=200, help="slow-loris connections")
    parser.add_argument("--pin-server", action="store_true", help="run svc up on CPU 0")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, host, port, seconds, *rest = args.worker
        if kind == "flood":
            result = flood_worker(host, int(port), float(seconds))
        else:
            result = slow_worker(host, int(port), float(seconds), int(rest[0]))
        print(json.dumps(result), flush=True)
        return
    if args.seconds < 2 or args.flooders < 1 or args.slow < 1:
        parser.error("--seconds must be at least 2, --flooders and --slow at least 1")
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
