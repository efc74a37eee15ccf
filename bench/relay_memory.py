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

For each it prints the relay's RSS before, its peak (sampled every 10 ms, and the
kernel's high-water mark, VmHWM), and the bound the relay's settings give
(docs/relay.md, "Memory a stream can hold"). A relay's RSS also holds what glibc keeps
of freed memory, so the peak is what counts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from pathlib import Path

import grpc
import httpx

# bench/e2e.py's reading of /proc/<pid>/status.
from e2e import _status_mib

from svc_sdk._argtypes import whole_number
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.mls import Engine, Group
from svc_sdk.relay_client import RelayConnection
from svc_sdk.testing import LocalStack, certify_with_api

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


async def member(stack: LocalStack, root: str) -> tuple[RelayConnection, Group, str]:
    async with httpx.AsyncClient(base_url=stack.api_url) as http:
        response = await http.post(
            "/v1/tokens", headers={"Authorization": f"Bearer {stack.api_key}"}
        )
        token: str = response.raise_for_status().json()["token"]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=whole_number(1), default=8)
    parser.add_argument("--stored", type=whole_number(1), default=300)
    parser.add_argument("--publishes", type=whole_number(1), default=2000)
    args = parser.parse_args()
    rows = []
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
