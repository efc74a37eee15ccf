"""What a member's streams can make the relay hold: its RSS under two floods of large
messages, beside what it held before them.

    python bench/relay_memory.py [--streams 8] [--stored 300] [--publishes 2000]

A fresh ``svc up`` on free loopback ports (SQLite log); one member of one channel, as
any account holder can be, with messages of ~900 KB (under the 1 MiB limit):

- **Subscribers that never read:** the member stores ``--stored`` messages, then opens
  ``--streams`` streams, each on its own connection, each subscribing from the start of
  the log and never reading. Every stream's catch-up queues what it may for its client.
- **Publishes faster than the log:** one stream writes ``--publishes`` publishes
  without waiting for their replies (pipelined, as the client's outbox does).
- **A relay on Redis that fell behind** (``--redis``: a redis-server, ``svc api`` and
  two ``svc relay`` processes sharing it): a stream on the second relay subscribes and
  reads; the second relay is stopped (SIGSTOP) while the member stores ``--stored``
  messages through the first, then resumed. Its RSS is measured from the resume until
  its subscriber has every message.

For each it prints the relay's RSS before, its peak (sampled every 10 ms, and the
kernel's high-water mark, VmHWM), and the bound the relay's settings give
(docs/relay.md, "Memory a stream can hold"). A relay's RSS also holds what glibc keeps
of freed memory, so the peak is what counts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx

# bench/e2e.py's reading of /proc/<pid>/status; bench/relay.py's processes.
from e2e import _status_mib
from relay import spawn, wait_relay

from svc_sdk._argtypes import whole_number
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.mls import Engine, Group
from svc_sdk.relay_client import RelayConnection
from svc_sdk.testing import LocalStack, certify_with_api

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support import RedisServer, free_port, wait_healthy

MIB = 1024 * 1024
CHANNEL = "bench/relay/memory"
PAYLOAD = 900_000


def _mib(pid: int, field: str) -> float:
    return _status_mib(pid, field) or 0.0  # 0 once the process is gone


class Peak:
    """The relay's RSS sampled every 10 ms on a thread, while in a ``with`` block."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = _mib(pid, "VmRSS")
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _mib(self.pid, "VmRSS"))

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _mib(self.pid, "VmRSS"))
        self.hwm = _mib(self.pid, "VmHWM")


async def member(stack: Any, root: str) -> tuple[RelayConnection, Group, str]:
    token = await member_token(stack)
    engine = certify_with_api(Engine(Path(root) / "m", b"m"), stack.api_url, stack.api_key)
    conn = RelayConnection(stack.relay_url, token, b"m")
    await conn.open()
    group = engine.create_group(CHANNEL.encode())
    await conn.request(pb.CreateChannel(channel=CHANNEL, group_info=group.group_info()))
    return conn, group, token


async def idle_subscribers(stack: LocalStack, pid: int, streams: int, stored: int) -> Peak:
    with tempfile.TemporaryDirectory() as root:
        conn, group, token = await member(stack, root)
        message = group.encrypt(os.urandom(PAYLOAD))
        for _ in range(stored):
            await conn.request(pb.Publish(channel=CHANNEL, message=[message]))
        await asyncio.sleep(1)  # the log's writes settle
        channels, calls = [], []
        with Peak(pid) as peak:
            for n in range(streams):
                channel = grpc.aio.insecure_channel(stack.relay_url.removeprefix("http://"))
                call = channel.stream_stream(
                    "/svc.relay.v1.Relay/Connect",
                    request_serializer=lambda b: b,
                    response_deserializer=lambda b: b,
                )(
                    metadata=(
                        ("authorization", f"Bearer {token}"),
                        ("svc-identity", f"idle{n}".encode().hex()),
                    )
                )
                subscribe = pb.Subscribe(channel=CHANNEL, after_seq=0)
                await call.write(
                    pb.ClientFrame(request_id=1, subscribe=subscribe).SerializeToString()
                )
                channels.append(channel)
                calls.append(call)
            await asyncio.sleep(5)
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close()
        await conn.close()
        return peak


async def pipelined_publishes(stack: LocalStack, pid: int, publishes: int) -> Peak:
    with tempfile.TemporaryDirectory() as root:
        conn, group, _ = await member(stack, root)
        message = group.encrypt(os.urandom(PAYLOAD))
        with Peak(pid) as peak:
            replies = [
                await conn.send(pb.Publish(channel=CHANNEL, message=[message]))
                for _ in range(publishes)
            ]
            codes = {reply.code for reply in await asyncio.gather(*replies)}
        assert codes == {0}, codes
        await conn.close()
        return peak


@contextlib.contextmanager
def redis_relays() -> Iterator[tuple[LocalStack, int]]:
    """A redis-server, ``svc api`` and two relays on it: a stack whose relay_url is the
    first relay, and the second relay's address and pid."""
    redis = RedisServer()
    redis.start()
    data = tempfile.TemporaryDirectory()
    api_port = free_port()
    api_url = f"http://127.0.0.1:{api_port}"
    procs = [spawn(["api", "--port", str(api_port), "--data-dir", data.name], "0-1")]
    try:
        wait_healthy(api_url)
        ports = [free_port(), free_port()]
        for port in ports:
            relay = ["relay", "--port", str(port), "--redis-url", redis.url]
            procs.append(spawn([*relay, "--api-url", api_url, "--data-dir", data.name], "0-1"))
        key = httpx.post(f"{api_url}/v1/accounts", json={"email": "m@example.com"})
        stack = SimpleNamespace(
            api_url=api_url,
            api_key=key.raise_for_status().json()["api_key"]["key"],
            relay_url=f"127.0.0.1:{ports[0]}",
            second=f"127.0.0.1:{ports[1]}",
        )
        yield stack, procs[2].pid  # type: ignore[misc]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            proc.wait(timeout=10)
        redis.stop()
        data.cleanup()


async def paused_follower(stack: Any, pid: int, stored: int) -> Peak:
    with tempfile.TemporaryDirectory() as root:
        token = await member_token(stack)
        for target in (stack.relay_url, stack.second):
            await wait_relay(target, token)
        conn, group, token = await member(stack, root)
        # A reader as a client is: it resubscribes from its cursor when told it lagged.
        deliveries: asyncio.Queue[int] = asyncio.Queue()

        def on_frame(frame: pb.ServerFrame) -> None:
            if frame.HasField("lagged"):
                deliveries.put_nowait(-1)
            for item in frame.deliveries.items:
                deliveries.put_nowait(item.seq)

        reader = RelayConnection(stack.second, token, b"reader", on_frame=on_frame)
        await reader.open()
        await reader.request(pb.Subscribe(channel=CHANNEL, after_seq=0))
        message = group.encrypt(os.urandom(PAYLOAD))
        os.kill(pid, signal.SIGSTOP)
        try:
            for _ in range(stored):
                await conn.request(pb.Publish(channel=CHANNEL, message=[message]))
        finally:
            with Peak(pid) as peak:
                os.kill(pid, signal.SIGCONT)
                seq = 0
                while seq < stored:
                    got = await asyncio.wait_for(deliveries.get(), 60)
                    if got < 0:
                        await reader.request(pb.Subscribe(channel=CHANNEL, after_seq=seq))
                    elif got == seq + 1:
                        seq = got
        await reader.close()
        await conn.close()
        return peak


async def member_token(stack: Any) -> str:
    """A relay token for the stack's account (``stack``: a LocalStack, or the same
    addresses and key of :func:`redis_relays`)."""
    async with httpx.AsyncClient(base_url=stack.api_url) as http:
        response = await http.post(
            "/v1/tokens", headers={"Authorization": f"Bearer {stack.api_key}"}
        )
        token: str = response.raise_for_status().json()["token"]
        return token


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=whole_number(1), default=8)
    parser.add_argument("--stored", type=whole_number(1), default=300)
    parser.add_argument("--publishes", type=whole_number(1), default=2000)
    parser.add_argument(
        "--redis", action="store_true", help="also a relay on Redis that fell behind"
    )
    args = parser.parse_args()
    rows = []
    if args.redis:
        with redis_relays() as (stack, pid):
            peak = asyncio.run(paused_follower(stack, pid, args.stored))
            rows.append(
                (
                    f"a relay on Redis resumed after {args.stored} were stored through another",
                    peak,
                    "4 entries of the channel, then 4 MiB pages",
                )
            )
    # A relay each, so neither flood inherits the other's heap.
    with LocalStack() as stack:
        assert stack.pid is not None
        peak = asyncio.run(idle_subscribers(stack, stack.pid, args.streams, args.stored))
        bound = f"{args.streams} x 16 MiB queued, 512 MiB in all"
        rows.append(
            (
                f"{args.streams} streams subscribed from {args.stored} stored, not reading",
                peak,
                bound,
            )
        )
    with LocalStack() as stack:
        assert stack.pid is not None
        peak = asyncio.run(pipelined_publishes(stack, stack.pid, args.publishes))
        rows.append((f"1 stream, {args.publishes} pipelined publishes", peak, "16 MiB in flight"))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"Relay RSS under floods of ~{PAYLOAD // 1000} KB messages; {when}")
    print()
    print(
        "| flood | RSS before, MiB | peak RSS, MiB | VmHWM, MiB | peak - before, MiB "
        "| bound held for it |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for name, p, bound in rows:
        grew = p.peak - p.before
        print(f"| {name} | {p.before:.0f} | {p.peak:.0f} | {p.hwm:.0f} | {grew:.0f} | {bound} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
