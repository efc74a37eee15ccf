"""Relay capacity with raw subscribers (no decryption).

    python bench/relay.py [--redis] [--messages 20000]

Starts `svc api` and one `svc relay` process (SQLite log) pinned to CPU 0 — or, with
--redis, a redis-server and two `svc relay` processes sharing it — and drives them from
this process pinned to CPU 1: deliveries per second at 1→1 and 1→50 fan-out with 256-byte messages,
delivery latency at a paced 1,000 messages/s, and the relay's RSS with 1,000 idle
streams. The bound printed beside it is measured in the same run: the relay's two
per-message costs outside the network, storing a message and framing a delivery; and
how long one full garbage collection stops a started relay, before and after its
start-up heap is frozen (server/heap.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from svc_sdk._relay_pb import relay_pb2 as pb  # noqa: E402
from svc_sdk.mls import Engine  # noqa: E402
from svc_sdk.relay_client import RelayConnection, open_channel  # noqa: E402
from svc_sdk.testing import LocalIssuer, certify_with_api  # noqa: E402
from tests.support import RedisServer, free_port, wait_healthy  # noqa: E402

CHANNEL = "bench/relay/fanout"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def spawn(args: list[str], cpu: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["taskset", "-c", cpu, sys.executable, "-P", "-m", "svc_cli", *args],
        env={
            **os.environ,
            "SVC_SIGNUP_RATE_LIMIT": "1000/minute",
            # 1,000 idle streams of one account, and those of the phases before.
            "SVC_RELAY_STREAMS_PER_ACCOUNT": "10000",
            **(env or {}),
        },
        stdout=subprocess.DEVNULL,
    )


async def wait_relay(target: str, token: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            async with RelayConnection(target, token, b"probe") as conn:
                # Any answer will do (the channel may not exist yet): the relay is up.
                await conn.request(pb.CreateChannel(channel=CHANNEL), timeout=2, check=False)
                return
        except (ConnectionError, TimeoutError):
            await asyncio.sleep(0.2)
    raise SystemExit(f"relay {target} did not start")


async def create_channel(target: str, token: str, api: tuple[str, str]) -> None:
    """Creates the benchmark's channel once, as the relay requires: with the GroupInfo
    of a real MLS group whose creator holds an agent credential from the account API.
    Later CreateChannel frames without a GroupInfo only read the channel's head."""

    def group_info() -> bytes:
        engine = certify_with_api(Engine(Path(tempfile.mkdtemp()) / "creator", b"creator"), *api)
        return engine.create_group(CHANNEL.encode()).group_info()

    info = await asyncio.to_thread(group_info)
    async with RelayConnection(target, token, b"creator") as conn:
        await conn.request(pb.CreateChannel(channel=CHANNEL, group_info=info))


def message(size: int) -> bytes:
    sender = LocalIssuer().certify(Engine(Path(tempfile.mkdtemp()) / "m", b"sender"))
    group = sender.create_group(CHANNEL.encode())
    ciphertext = group.encrypt(b"\x5a" * (size - 150))
    return ciphertext


async def publish_all(
    sender: RelayConnection, msg: bytes, count: int, window: int = 64
) -> dict[int, float]:
    """Pipelined publishes (up to ``window`` in flight); returns seq -> send time."""
    sent: dict[int, float] = {}
    inflight: set[asyncio.Future[pb.Reply]] = set()

    def done(t: float) -> Callable[[asyncio.Future[pb.Reply]], None]:
        def record(fut: asyncio.Future[pb.Reply]) -> None:
            sent[fut.result().seq] = t

        return record

    for _ in range(count):
        while len(inflight) >= window:
            _, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        t = time.perf_counter()
        fut = await sender.send(pb.Publish(channel=CHANNEL, message=[msg]))
        fut.add_done_callback(done(t))
        inflight.add(fut)
    if inflight:
        await asyncio.wait(inflight)
    return sent


class Subscriber:
    """A raw subscriber (no decryption) that does what the SDK's link does when the relay
    says it lagged (its stream's queue at the relay overflowed because this process read
    too slowly): it subscribes again after the last seq it got, as a new subscription,
    and the rest comes from the log. Without that, a slow reader would wait forever."""

    lags = 0  # across every subscriber of the run

    def __init__(self, target: str, token: str, identity: bytes) -> None:
        self.conn = RelayConnection(target, token, identity, on_frame=self._on_frame)
        self.deliveries: asyncio.Queue[pb.Delivery] = asyncio.Queue()
        self.subscription = 0
        self.last = 0

    async def subscribe(self, after_seq: int) -> None:
        # The id and the cursor are taken together: only the new subscription counts.
        self.subscription += 1
        self.last = max(self.last, after_seq)
        subscribe = pb.Subscribe(
            channel=CHANNEL, after_seq=self.last, subscription=self.subscription
        )
        await self.conn.request(subscribe)

    def _on_frame(self, frame: pb.ServerFrame) -> None:
        kind = frame.WhichOneof("kind")
        if kind == "deliveries":
            for item in frame.deliveries.items:
                if item.subscription == self.subscription and item.seq > self.last:
                    self.last = item.seq
                    self.deliveries.put_nowait(item)
        elif kind == "lagged":
            Subscriber.lags += 1
            asyncio.get_running_loop().create_task(self.subscribe(self.last))


async def drain(sub: Subscriber, count: int, arrivals: dict[int, float] | None = None) -> None:
    """Takes ``count`` deliveries, as cheaply as possible for the client: the client
    shares one core among 50 subscribers and must not be what limits the measurement."""
    queue = sub.deliveries
    got = 0
    async with asyncio.timeout(120):
        while got < count:
            d = await queue.get()
            got += 1
            if arrivals is not None:
                arrivals[d.seq] = time.perf_counter()
            while got < count and not queue.empty():
                d = queue.get_nowait()
                got += 1
                if arrivals is not None:
                    arrivals[d.seq] = time.perf_counter()


async def fanout(targets: list[str], token: str, subscribers: int, count: int, msg: bytes) -> float:
    """Deliveries per second for one sender to ``subscribers`` raw subscribers."""
    sender = RelayConnection(targets[0], token, b"sender")
    await sender.open()
    subs = [
        Subscriber(targets[i % len(targets)], token, f"sub-{i}".encode())
        for i in range(subscribers)
    ]
    await asyncio.gather(*(s.conn.open() for s in subs))
    head = (await sender.request(pb.CreateChannel(channel=CHANNEL))).head_seq
    # Numbered like the SDK's: each delivery carries its subscription's id.
    await asyncio.gather(*(s.subscribe(head) for s in subs))
    start = time.perf_counter()
    receivers = [asyncio.create_task(drain(s, count)) for s in subs]
    await publish_all(sender, msg, count)
    await asyncio.gather(*receivers)
    elapsed = time.perf_counter() - start
    await asyncio.gather(sender.close(), *(s.conn.close() for s in subs))
    return subscribers * count / elapsed


def _record(sent: dict[int, float], t: float) -> Callable[[asyncio.Future[pb.Reply]], None]:
    def record(fut: asyncio.Future[pb.Reply]) -> None:
        sent[fut.result().seq] = t

    return record


async def paced_latency(
    targets: list[str], token: str, rate: int, seconds: float, msg: bytes
) -> list[float]:
    sender = RelayConnection(targets[0], token, b"pacer")
    sub = Subscriber(targets[-1], token, b"paced-sub")
    await sender.open()
    await sub.conn.open()
    head = (await sender.request(pb.CreateChannel(channel=CHANNEL))).head_seq
    await sub.subscribe(head)
    count = int(rate * seconds)
    arrivals: dict[int, float] = {}
    receiver = asyncio.create_task(drain(sub, count, arrivals))
    sent: dict[int, float] = {}
    replies = []
    start = time.perf_counter()
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = time.perf_counter()
        fut = await sender.send(pb.Publish(channel=CHANNEL, message=[msg]))
        fut.add_done_callback(_record(sent, t))
        replies.append(fut)
    await asyncio.gather(*replies)
    await receiver
    await sender.close()
    await sub.conn.close()
    return sorted((arrivals[s] - sent[s]) * 1000 for s in sent if s in arrivals)


async def idle_streams(target: str, token: str, pid: int, streams: int) -> tuple[float, float]:
    """Relay RSS before and after ``streams`` subscribed, idle streams (50 per connection)."""
    before = rss_mb(pid)
    channels = [open_channel(target) for _ in range(streams // 50)]
    conns = [
        RelayConnection(target, token, f"idle-{i}".encode(), channel=channels[i % len(channels)])
        for i in range(streams)
    ]
    async with RelayConnection(target, token, b"head") as probe:
        head = (await probe.request(pb.CreateChannel(channel=CHANNEL))).head_seq
    for i in range(0, streams, 100):
        batch = conns[i : i + 100]
        await asyncio.gather(*(c.open() for c in batch))
        await asyncio.gather(
            *(c.request(pb.Subscribe(channel=CHANNEL, after_seq=head)) for c in batch)
        )
    await asyncio.sleep(1)
    after = rss_mb(pid)
    await asyncio.gather(*(c.close() for c in conns))
    del channels  # the last reference closes each connection
    return before, after


async def store_bound(messages: int, msg: bytes) -> float:
    """µs per message to store (SQLite log, group commit) in this process."""
    from svc_server.relay.sqlite_store import SqliteLogStore

    async def run() -> float:
        store = SqliteLogStore(Path(tempfile.mkdtemp()) / "relay.sqlite3")
        await store.start()
        start = time.perf_counter()
        for _ in range(0, messages, 64):
            await asyncio.gather(*(store.append(CHANNEL, b"s", msg, 1) for _ in range(64)))
        elapsed = time.perf_counter() - start
        await store.close()
        return elapsed / messages * 1e6

    return await run()


def framing_bound(msg: bytes) -> float:
    """µs per delivery for what the relay does per subscriber: append a message's
    pre-encoded Delivery, with the subscription's id, to a 256-item frame (encoding
    happens once per message)."""
    from svc_server.relay.hub import deliveries_frame, encode_item, frame_item, subscription_tail
    from svc_server.relay.store import Entry

    encoded = encode_item(Entry(CHANNEL, 1, b"sender", False, 1, msg, 0.0))
    pieces = list(frame_item(encoded, subscription_tail(1)))
    size = sum(map(len, pieces)) * 256  # the outbox counts it as it takes the deliveries
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(200):
            deliveries_frame(pieces * 256, size)
        rounds.append((time.perf_counter() - start) / (200 * 256) * 1e6)
    return statistics.median(rounds)


# A relay started in a fresh interpreter, as `svc relay` starts it: how long one full
# collection of the cyclic garbage collector takes (the event loop waits it out), before
# and after server/heap.py's settle() freezes the start-up heap. Median of five each.
GC_PAUSE = """
import asyncio, gc, statistics, tempfile, time
from svc_server.config import Settings
from svc_server.heap import settle
from svc_server.relay.server import start_relay

def full_collection_ms():
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        gc.collect()
        rounds.append((time.perf_counter() - start) * 1e3)
    return statistics.median(rounds)

async def main():
    running = await start_relay(Settings(data_dir=tempfile.mkdtemp()), "127.0.0.1", 0)
    before = full_collection_ms()
    frozen = settle()
    print(before, full_collection_ms(), frozen)
    await running.stop()

asyncio.run(main())
"""


def gc_pause() -> tuple[float, float, int]:
    """A started relay's full garbage collection in ms, before and after settle(), and
    how many objects settle() froze."""
    out = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-P", "-c", GC_PAUSE],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


async def run_bench(
    args: argparse.Namespace, targets: list[str], token: str, pid: int, api: tuple[str, str]
) -> None:
    msg = message(256)
    for t in targets:
        await wait_relay(t, token)
    await create_channel(targets[0], token, api)
    # Idle streams first, on a relay that has carried no traffic yet: memory freed after
    # the load phases is not returned to the OS and would inflate the reading.
    before, after = await idle_streams(targets[0], token, pid, 1000)
    one = await fanout(targets, token, 1, args.messages, msg)
    fifty = await fanout(targets, token, 50, args.messages // 10, msg)
    lat = await paced_latency(targets, token, 1000, args.seconds, msg)
    store_us = await store_bound(5000, msg)
    frame_us = framing_bound(msg)
    gc_before, gc_after, frozen = gc_pause()
    mode = "two relay processes on Redis" if len(targets) > 1 else "one relay process, SQLite log"
    print(f"Relay capacity, {mode}; 256 B messages; raw subscribers; client on the other core\n")
    print("| measure | value |")
    print("|---|---:|")
    print(f"| deliveries/s, 1 → 1 (pipelined publishes) | {one:,.0f} |")
    print(f"| deliveries/s, 1 → 50 | {fifty:,.0f} |")
    print(f"| latency at 1,000 msg/s, p50 | {statistics.median(lat):.2f} ms |")
    print(f"| latency at 1,000 msg/s, p99 | {lat[int(len(lat) * 0.99) - 1]:.2f} ms |")
    print(f"| relay RSS at start, no streams | {before:.0f} MB |")
    print(f"| relay RSS, 1,000 idle subscribed streams | {after:.0f} MB |")
    print(f"| bound: store one message (SQLite, group commit), in process | {store_us:.1f} µs |")
    print(
        f"| bound: frame one delivery (pre-encoded, 256 a frame), in process | {frame_us:.3f} µs |"
    )
    print(f"| relay CPU per delivery at 1 → 50 (one core ÷ rate) | {1e6 / fifty:.1f} µs |")
    print(f"| a full garbage collection of a started relay, in process | {gc_before:.1f} ms |")
    print(f"| the same after settle() froze its {frozen:,} start-up objects | {gc_after:.2f} ms |")
    print(f"| subscribers told they lagged (caught up from the log) | {Subscriber.lags} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--redis", action="store_true", help="two relays sharing a redis-server")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {1})
    data = Path(tempfile.mkdtemp(prefix="svc-bench-relay-"))
    procs: list[subprocess.Popen[bytes]] = []
    redis: RedisServer | None = None
    api_port = free_port()
    api_url = f"http://127.0.0.1:{api_port}"
    try:
        if args.redis:
            redis = RedisServer()
            redis.start()
            common = ["--data-dir", str(data)]
            procs.append(spawn(["api", "--port", str(api_port), *common], "1"))
            wait_healthy(api_url)
            ports = [free_port(), free_port()]
            for port in ports:
                procs.append(
                    spawn(
                        [
                            "relay",
                            "--port",
                            str(port),
                            "--redis-url",
                            redis.url,
                            "--api-url",
                            api_url,
                            *common,
                        ],
                        "0",
                    )
                )
            targets = [f"127.0.0.1:{p}" for p in ports]
            relay_pid = procs[1].pid
        else:
            procs.append(spawn(["api", "--port", str(api_port), "--data-dir", str(data)], "1"))
            wait_healthy(api_url)
            relay_port = free_port()
            relay_args = ["relay", "--port", str(relay_port), "--data-dir", str(data)]
            procs.append(spawn(relay_args, "0"))
            targets = [f"127.0.0.1:{relay_port}"]
            relay_pid = procs[1].pid
        key = httpx.post(f"{api_url}/v1/accounts", json={"email": "bench@example.com"}).json()[
            "api_key"
        ]["key"]
        token = httpx.post(
            f"{api_url}/v1/tokens", headers={"Authorization": f"Bearer {key}"}
        ).json()["token"]
        asyncio.run(run_bench(args, targets, token, relay_pid, (api_url, key)))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        if redis is not None:
            redis.stop()
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
