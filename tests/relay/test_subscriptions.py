"""Subscription ids: each Delivery echoes the id of the Subscribe it belongs to, so a
client that resubscribes can tell the new subscription's deliveries from what the old
one still had queued. Each test runs on the SQLite and the Redis logs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from svc_sdk._native import RelayChannel, RelayStream
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.relay_client import RelayConnection
from svc_server.relay.hub import (
    MAX_BATCH,
    MAX_BATCH_BYTES,
    Outbox,
    deliveries_frame,
    encode_item,
    frame_item,
    subscription_tail,
)
from svc_server.relay.metrics import RelayMetrics
from svc_server.relay.service import Relay
from svc_server.relay.store import Entry
from svc_server.stack import Stack, start_stack, stop_stack

from .conftest import Account, connect, new_account
from .helpers import create_channel, raw_stream
from .test_relay import CHANNEL, INVALID, engine_group_message

pytestmark = pytest.mark.anyio
MAX_U64 = 2**64 - 1


async def take(conn: RelayConnection, n: int) -> list[tuple[int, int]]:
    """The next ``n`` deliveries as (seq, subscription)."""
    got = [await asyncio.wait_for(conn.deliveries.get(), 10) for _ in range(n)]
    return [(d.seq, d.subscription) for d in got]


async def publish(conn: RelayConnection, stack: Stack, n: int) -> None:
    message = engine_group_message(stack)
    await conn.request(pb.Publish(channel=CHANNEL, message=[message] * n))


async def test_deliveries_echo_the_subscription_id(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    sender = await connect(stack, account, b"sender")
    await create_channel(sender, (account.api_url, account.key), tmp_path, CHANNEL)
    await publish(sender, stack, 3)
    reader = await connect(stack, account, b"reader")
    # Catch-up from the log, then live.
    await reader.request(pb.Subscribe(channel=CHANNEL, after_seq=0, subscription=7))
    assert await take(reader, 3) == [(1, 7), (2, 7), (3, 7)]
    await publish(sender, stack, 2)
    assert await take(reader, 2) == [(4, 7), (5, 7)]
    # A resubscribe replaces the subscription; the largest uint64 is an id like any other.
    await reader.request(pb.Subscribe(channel=CHANNEL, after_seq=3, subscription=MAX_U64))
    assert await take(reader, 2) == [(4, MAX_U64), (5, MAX_U64)]
    await publish(sender, stack, 1)
    assert await take(reader, 1) == [(6, MAX_U64)]
    # A Subscribe without one (an older client): 0, for catch-up and live deliveries.
    await reader.request(pb.Subscribe(channel=CHANNEL, after_seq=5))
    assert await take(reader, 1) == [(6, 0)]
    await publish(sender, stack, 1)
    assert await take(reader, 1) == [(7, 0)]
    await asyncio.sleep(0.1)
    assert reader.deliveries.empty()
    await sender.close()
    await reader.close()


async def test_subscribe_churn_leaves_one_subscription_and_costs_no_one_a_delivery(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """A member that subscribes from the start of the log and unsubscribes again, as fast
    as its stream goes, while messages arrive: each Subscribe replaces the subscription
    before it and each Unsubscribe ends it, so the hub ends with none of its own, and a
    reader beside it gets every live message once, in order."""
    sender = await connect(stack, account, b"sender")
    await create_channel(sender, (account.api_url, account.key), tmp_path, CHANNEL)
    await publish(sender, stack, 100)  # a log for each Subscribe to read from the start
    reader = await connect(stack, account, b"reader")
    await reader.request(pb.Subscribe(channel=CHANNEL, after_seq=100, subscription=1))
    churner = await connect(stack, account, b"churner")

    async def churn() -> None:
        for i in range(200):
            subscribe = pb.Subscribe(channel=CHANNEL, after_seq=0, subscription=i + 2)
            await churner.request(subscribe)
            await churner.request(pb.Unsubscribe(channel=CHANNEL))

    async def live() -> None:
        for _ in range(50):
            await publish(sender, stack, 1)

    await asyncio.gather(churn(), live())
    assert await take(reader, 50) == [(seq, 1) for seq in range(101, 151)]
    hub = stack.relay.relay.hub
    assert [sub.subscription for sub in hub.subscriptions(CHANNEL)] == [1]  # the reader
    await churner.request(pb.Subscribe(channel=CHANNEL, after_seq=150, subscription=999))
    await publish(sender, stack, 1)
    assert await take(reader, 1) == [(151, 1)]
    deliveries = [await asyncio.wait_for(churner.deliveries.get(), 10)]
    while deliveries[-1].subscription != 999:  # what the ended subscriptions had queued
        deliveries.append(await asyncio.wait_for(churner.deliveries.get(), 10))
    assert deliveries[-1].seq == 151
    for conn in (sender, reader, churner):
        await conn.close()


async def test_subscribers_of_one_message_get_their_own_ids(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """The shared encoding of a message carries no subscription: each subscriber's
    deliveries carry its own."""
    sender = await connect(stack, account, b"sender")
    await create_channel(sender, (account.api_url, account.key), tmp_path, CHANNEL)
    readers = [await connect(stack, account, f"reader{i}".encode()) for i in range(3)]
    for i, reader in enumerate(readers):
        # 0 (none), a one-byte varint, and one of ten bytes.
        sub = [0, 1, MAX_U64][i]
        await reader.request(pb.Subscribe(channel=CHANNEL, subscription=sub))
    await publish(sender, stack, 2)
    assert await take(readers[0], 2) == [(1, 0), (2, 0)]
    assert await take(readers[1], 2) == [(1, 1), (2, 1)]
    assert await take(readers[2], 2) == [(1, MAX_U64), (2, MAX_U64)]
    for conn in (sender, *readers):
        await conn.close()


async def test_a_subscription_id_out_of_range_is_a_malformed_frame(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """A varint longer than a uint64's ten bytes does not parse; the stream goes on."""
    sender = await connect(stack, account, b"sender")
    await create_channel(sender, (account.api_url, account.key), tmp_path, CHANNEL)
    channel, call = raw_stream(stack.relay_url, await account.token())
    subscribe = pb.Subscribe(channel=CHANNEL).SerializeToString() + b"\x18" + b"\xff" * 11 + b"\x01"
    frame = b"\x08\x01" + b"\x1a" + bytes([len(subscribe)]) + subscribe
    await call.write(frame)
    reply = (await asyncio.wait_for(call.read(), 10)).reply
    assert reply.code == INVALID and "malformed frame" in reply.message
    ok = pb.Subscribe(channel=CHANNEL, subscription=MAX_U64)
    await call.write(pb.ClientFrame(request_id=2, subscribe=ok).SerializeToString())
    assert (await asyncio.wait_for(call.read(), 10)).reply.code == 0
    await publish(sender, stack, 1)
    frame = await asyncio.wait_for(call.read(), 10)
    assert [d.subscription for d in frame.deliveries.items] == [MAX_U64]
    await channel.close()
    await sender.close()


def test_a_frame_decodes_to_the_deliveries_it_was_built_from() -> None:
    # Sizes repeat (headers are cached by size) under tails of every length.
    entries = [
        Entry(CHANNEL, seq, b"s" * 3, seq % 2 == 0, seq, b"m" * size, 0.0)
        for seq, size in ((1, 100), (2, 200), (3, 100), (4, 20000), (5, 100), (6, 20000))
    ]
    subs = (0, 5, MAX_U64, 0, 300, MAX_U64)
    pieces = [
        piece
        for e, sub in zip(entries, subs, strict=True)
        for piece in frame_item(encode_item(e), subscription_tail(sub))
    ]
    frame = pb.ServerFrame.FromString(deliveries_frame(pieces, sum(map(len, pieces))))
    got = [
        (d.seq, d.sender, d.handshake, d.epoch, d.message, d.subscription)
        for d in frame.deliveries.items
    ]
    assert got == [
        (e.seq, e.sender, e.handshake, e.epoch, e.message, sub)
        for e, sub in zip(entries, subs, strict=True)
    ]


async def test_frames_of_large_messages_stop_at_the_byte_bound() -> None:
    """A subscriber's frames of 16 KiB messages close at 256 KiB (a reader holds each
    frame whole, several times over), small ones at MAX_BATCH; all in order, none lost."""
    outbox = Outbox(limit=4096)
    sizes = [16 * 1024] * 100 + [100] * 600
    for seq, size in enumerate(sizes, 1):
        outbox.offer(encode_item(Entry(CHANNEL, seq, b"s", False, 1, b"m" * size, 0.0)), b"", 0)
    frames: list[pb.ServerFrame] = []
    while len(outbox):
        data, count, _ = await outbox.next_frames()
        frame = pb.ServerFrame.FromString(data[0])
        assert len(frame.deliveries.items) == count
        frames.append(frame)
    for frame in frames:
        items = frame.deliveries.items
        assert len(items) <= MAX_BATCH
        # Closed by the message that reached the bound, so at most one past it.
        assert sum(len(d.message) for d in items[:-1]) < MAX_BATCH_BYTES <= 256 * 1024
    # Sixteen 16 KiB messages reach 256 KiB; small ones fill frames of MAX_BATCH.
    assert [len(f.deliveries.items) for f in frames] == [16] * 6 + [256, 256, 92]
    assert [d.seq for f in frames for d in f.deliveries.items] == list(range(1, 701))


async def test_withdraw_drops_only_the_ended_subscriptions_queued_deliveries() -> None:
    """Another subscription's deliveries stay, in order; room for more opens again; a
    closing stream withdraws nothing (nothing more is written to it)."""
    outbox = Outbox(limit=16)
    ended, other = object(), object()
    for seq in range(1, 13):
        owner = ended if seq % 3 else other
        item = encode_item(Entry(CHANNEL, seq, b"s", False, 1, b"m", 0.0))
        assert outbox.offer(item, b"", 0, owner)
    assert not outbox._room.is_set()  # over half full: catch-up waits
    assert outbox.withdraw(ended) == 8
    assert outbox.withdraw(ended) == 0
    assert outbox._room.is_set()
    data, count, _ = await outbox.next_frames()
    assert count == 4
    assert [d.seq for d in pb.ServerFrame.FromString(data[0]).deliveries.items] == [3, 6, 9, 12]
    outbox.offer(encode_item(Entry(CHANNEL, 13, b"s", False, 1, b"m", 0.0)), b"", 0, other)
    outbox.close()
    assert outbox.withdraw(other) == 0


async def test_an_unsubscribe_withdraws_what_the_relay_had_queued_for_it(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """A client that pauses a channel it cannot keep up with unsubscribes; the relay used
    to write everything it had queued for that subscription anyway (up to the stream's
    4,096 deliveries), all of it dropped by the client. Now it stops at what the
    transport already held: here 80-100 of the 300 deliveries (60 KB each)."""
    sender = await connect(stack, account, b"sender")
    group = await create_channel(sender, (account.api_url, account.key), tmp_path, CHANNEL)
    message = group.encrypt(b"x" * 60_000)
    for _ in range(20):  # frames under the relay's 1 MiB limit
        await sender.request(pb.Publish(channel=CHANNEL, message=[message] * 15))
    token = await account.token()
    reader = RelayStream(
        RelayChannel(stack.relay_url),
        [("authorization", f"Bearer {token}"), ("svc-identity", b"reader".hex())],
    )

    def request(request_id: int, **kind: Any) -> bytes:
        return pb.ClientFrame(request_id=request_id, **kind).SerializeToString()

    try:
        subscribe = pb.Subscribe(channel=CHANNEL, after_seq=0, subscription=1)
        assert reader.write(request(1, subscribe=subscribe))
        # Not drained: the transport's buffers fill, and the relay queues the rest.
        await asyncio.sleep(1.0)
        assert reader.write(request(2, unsubscribe=pb.Unsubscribe(channel=CHANNEL)))
        delivered, replies = 0, set()
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        while loop.time() - quiet_since < 1.0:
            _, ended, frames = reader.drain()
            assert ended is None
            for data in frames:
                frame = pb.ServerFrame.FromString(data)
                delivered += len(frame.deliveries.items)
                if frame.HasField("reply"):
                    replies.add(frame.reply.request_id)
            if frames:
                quiet_since = loop.time()
            await asyncio.sleep(0.02)
        assert replies == {1, 2}
        assert 0 < delivered <= 150, delivered
    finally:
        reader.close()
        await sender.close()


async def test_a_writer_with_a_backlog_lets_other_streams_write_between_its_frames() -> None:
    """A stream with three frames of deliveries waiting writes them a loop turn apart:
    another stream's frame goes out between them, not after the whole backlog."""
    written: list[str] = []

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        async def write(self, frame: bytes) -> None:
            written.append(self.name)

    relay = SimpleNamespace(metrics=RelayMetrics())
    busy = SimpleNamespace(closed=None, outbox=Outbox(limit=4096))
    quiet = SimpleNamespace(closed=None, outbox=Outbox(limit=4096))
    for seq in range(1, 3 * MAX_BATCH + 1):
        busy.outbox.offer(encode_item(Entry(CHANNEL, seq, b"s", False, 1, b"m", 0.0)), b"", 0)
    quiet.outbox.offer(encode_item(Entry(CHANNEL, 1, b"s", False, 1, b"m", 0.0)), b"", 0)
    writers = [
        asyncio.ensure_future(Relay._write(relay, busy, Stream("busy"))),
        asyncio.ensure_future(Relay._write(relay, quiet, Stream("quiet"))),
    ]
    try:
        while len(written) < 4:
            await asyncio.sleep(0.01)
    finally:
        for writer in writers:
            writer.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
    assert written == ["busy", "quiet", "busy", "busy"]


async def test_a_catch_up_longer_than_the_buffer_comes_in_pages_that_fit(
    make_relay_settings: Any, tmp_path: Path
) -> None:
    """A subscriber buffer smaller than the catch-up page (512) must not make every long
    catch-up lag: the reader would resubscribe from its cursor and lag again, forever."""
    stack = await start_stack(make_relay_settings(subscriber_buffer=100), api_port=0, relay_port=0)
    try:
        account = await new_account(stack.api_url, "catch-up@example.com")
        sender = await connect(stack, account, b"sender")
        await create_channel(sender, (account.api_url, account.key), tmp_path, CHANNEL)
        for _ in range(4):
            await publish(sender, stack, 250)
        kinds: list[str] = []
        seqs: list[int] = []
        done = asyncio.Event()

        def on_frame(frame: pb.ServerFrame) -> None:
            kinds.append(str(frame.WhichOneof("kind")))
            seqs.extend(d.seq for d in frame.deliveries.items)
            if len(seqs) >= 1000 or "lagged" in kinds:
                done.set()

        reader = RelayConnection(
            stack.relay_url, await account.token(), b"reader", on_frame=on_frame
        )
        await reader.open()
        await reader.request(pb.Subscribe(channel=CHANNEL, after_seq=0, subscription=1))
        await asyncio.wait_for(done.wait(), 30)
        assert "lagged" not in kinds
        assert seqs == list(range(1, 1001))
        await reader.close()
        await sender.close()
    finally:
        await stop_stack(stack)
