"""Subscription ids: each Delivery echoes the id of the Subscribe it belongs to, so a
client that resubscribes can tell the new subscription's deliveries from what the old
one still had queued. Each test runs on the SQLite and the Redis logs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from svc_sdk._native import RelayChannel, RelayStream
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.relay_client import RelayConnection
from svc_server.config import Settings
from svc_server.relay.hub import (
    MAX_BATCH,
    MAX_BATCH_BYTES,
    Buffers,
    Hub,
    Outbox,
    Subscription,
    deliveries_frame,
    encode_item,
    frame_item,
    subscription_tail,
)
from svc_server.relay.in_flight import Budget, InFlight
from svc_server.relay.metrics import RelayMetrics
from svc_server.relay.service import Relay
from svc_server.relay.sqlite_store import SqliteLogStore
from svc_server.relay.store import Entry
from svc_server.stack import Stack, start_stack, stop_stack

from .conftest import Account, connect, new_account
from .helpers import create_channel, raw_stream
from .test_relay import CHANNEL, INVALID, engine_group_message

pytestmark = pytest.mark.anyio
MAX_U64 = 2**64 - 1
MIB = 1024 * 1024


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
    outbox = Outbox(4096, 16 * MIB, Buffers(512 * MIB))
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
    outbox = Outbox(16, 16 * MIB, Buffers(512 * MIB))
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
    busy = SimpleNamespace(closed=None, outbox=Outbox(4096, 16 * MIB, Buffers(512 * MIB)))
    quiet = SimpleNamespace(closed=None, outbox=Outbox(4096, 16 * MIB, Buffers(512 * MIB)))
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


def _item(seq: int, size: int) -> Any:
    return encode_item(Entry(CHANNEL, seq, b"s", False, 1, b"m" * size, 0.0))


async def test_an_outbox_is_bounded_by_bytes_as_well_as_by_deliveries() -> None:
    """Deliveries of 1 MiB fill an 8 MiB outbox after eight, far below its 4,096; one
    delivery may take it past the bound, so a message larger than the bound goes out.
    Catch-up waits while it is half full, by either measure."""
    buffers = Buffers(512 * MIB)
    outbox = Outbox(4096, 8 * MIB, buffers)
    assert [outbox.offer(_item(seq, MIB), b"", 0) for seq in range(1, 11)] == [True] * 8 + [
        False
    ] * 2
    body = len(_item(1, MIB)[1])  # the message and the Delivery's other fields
    assert outbox.bytes == buffers.used == 8 * body
    assert not outbox._room.is_set()
    while outbox.bytes >= 4 * MIB:
        await outbox.next_frames()  # 256 KiB frames: a 1 MiB delivery each
    assert outbox._room.is_set() and buffers.used == outbox.bytes == 3 * body
    huge = Outbox(4096, 8 * MIB, buffers)
    assert huge.offer(_item(1, 12 * MIB), b"", 0)
    assert not huge.offer(_item(2, 1), b"", 0)
    huge.close()  # a closed stream's queue no longer counts
    assert buffers.used == 3 * body


def test_buffer_settings_below_their_floor_are_refused(tmp_path: Path) -> None:
    """A stream's byte bound must hold a catch-up page and the half it waits for; the
    relay's, a few streams' worth."""
    for field, value in (("subscriber_buffer_bytes", MIB), ("relay_buffer_bytes", 16 * MIB)):
        with pytest.raises(ValidationError, match=field):
            Settings(data_dir=tmp_path, **{field: value})


async def test_full_relay_buffers_shed_the_outbox_that_holds_the_most() -> None:
    """Past the relay's buffers, the stream holding the most loses its queue and its
    subscriptions lag (they resume from the log); the stream asking keeps going. When
    the asking stream holds the most, it is the one refused."""
    body = len(_item(1, MIB)[1])
    hub = Hub(10 * body)
    hog, other = Outbox(4096, 16 * MIB, hub.buffers), Outbox(4096, 16 * MIB, hub.buffers)
    subs = [Subscription(hub, CHANNEL, b"hog", hog, 0, n) for n in (1, 2)]
    for sub in subs:
        hub.add(sub)
        sub.catching_up = False
    for seq in range(1, 7):
        assert hog.offer(_item(seq, MIB), b"", 0, subs[seq % 2])
    for seq in range(1, 5):
        assert other.offer(_item(seq, MIB), b"", 0)
    assert hub.buffers.used == 10 * body
    assert other.offer(_item(5, MIB), b"", 0)  # the hog is shed
    assert len(hog) == 0 and hog.bytes == 0 and hub.buffers.used == 5 * body
    assert hub.buffers.shed == 1 and hub.lagged == 2 and not any(s.active for s in subs)
    frames, _, _ = await hog.next_frames()
    lagged = [pb.ServerFrame.FromString(f) for f in frames]
    assert [f.lagged.channel for f in lagged] == [CHANNEL, CHANNEL]
    for seq in range(6, 11):
        assert other.offer(_item(seq, MIB), b"", 0)
    assert not other.offer(_item(11, MIB), b"", 0)  # now it holds the most
    assert hub.buffers.used == 10 * body


async def test_in_flight_publishes_are_bounded_by_bytes_as_well_as_by_number() -> None:
    """A stream's reader waits while 16 MiB of its publishes are in flight, however few,
    or 1,024 however small."""
    limit = InFlight(count=1024, size=16 * MIB, budget=Budget(256 * MIB))
    for _ in range(16):
        await limit.acquire(MIB)
    waiting = asyncio.ensure_future(limit.acquire(MIB))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    limit.release(MIB)
    await asyncio.wait_for(waiting, 1)
    assert (limit.publishes, limit.bytes, limit.budget.bytes) == (16, 16 * MIB, 16 * MIB)
    few = InFlight(count=2, size=16 * MIB, budget=Budget(256 * MIB))
    await few.acquire(1)
    await few.acquire(1)
    blocked = asyncio.ensure_future(few.acquire(1))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    blocked.cancel()


async def test_the_relays_in_flight_budget_holds_back_streams_with_one_in_flight() -> None:
    """Past the relay's budget, a stream with a publish in flight waits until another is
    stored; a stream with none may still have one, so none is starved."""
    budget = Budget(4 * MIB)
    hog = InFlight(count=1024, size=16 * MIB, budget=budget)
    other = InFlight(count=1024, size=16 * MIB, budget=budget)
    for _ in range(4):
        await hog.acquire(MIB)
    held = asyncio.ensure_future(hog.acquire(MIB))
    await other.acquire(MIB)  # its first: goes through
    second = asyncio.ensure_future(other.acquire(MIB))
    await asyncio.sleep(0.01)
    assert not held.done() and not second.done() and budget.bytes == 5 * MIB
    hog.release(MIB)
    hog.release(MIB)  # under the budget again: one more fits
    await asyncio.wait_for(held, 1)
    assert not second.done()
    hog.release(MIB)
    await asyncio.wait_for(second, 1)
    assert budget.bytes == 4 * MIB and (hog.publishes, other.publishes) == (2, 2)


async def test_streams_that_do_not_read_hold_bounded_memory_and_a_reader_loses_nothing(
    make_relay_settings: Any, tmp_path: Path
) -> None:
    """A member stores 36 MB of ~900 KB messages, then sixteen streams subscribe from the
    start and never read. Each used to queue every stored message (576 MB here; a page
    of 512 such messages per stream, 100 streams per connection, would take tens of GB).
    Now each stream queues at most its 8 MiB and one delivery, all of them together the
    relay's 64 MiB; a stream that reads gets every message once, in order, resuming from
    its cursor whenever it is told it lagged (and skipping what it already has)."""
    settings = make_relay_settings(subscriber_buffer_bytes=8 * MIB, relay_buffer_bytes=64 * MIB)
    stack = await start_stack(settings, api_port=0, relay_port=0)
    account = await new_account(stack.api_url, "flood@example.com")
    sender = await connect(stack, account, b"sender")
    readers: list[RelayStream] = []
    try:
        group = await create_channel(sender, (account.api_url, account.key), tmp_path, CHANNEL)
        message = group.encrypt(b"x" * 900_000)
        for _ in range(40):
            await sender.request(pb.Publish(channel=CHANNEL, message=[message]))
        token = await account.token()

        def open_reader(n: int) -> RelayStream:
            # A connection each: streams of one connection share its flow-control window,
            # which those that do not read would keep full.
            identity = f"reader{n}".encode().hex()
            return RelayStream(
                RelayChannel(stack.relay_url),
                [("authorization", f"Bearer {token}"), ("svc-identity", identity)],
            )

        def subscribe(reader: RelayStream, request_id: int, after: int) -> None:
            frame = pb.ClientFrame(
                request_id=request_id, subscribe=pb.Subscribe(channel=CHANNEL, after_seq=after)
            )
            assert reader.write(frame.SerializeToString())

        for n in range(16):
            readers.append(open_reader(n))
            subscribe(readers[-1], 1, 0)
        hub = stack.relay.relay.hub
        peak = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        # Sixteen queues of 5-8 MiB do not fit in 64 MiB: some streams are told they
        # lagged (shed, or refused when they hold as much as any).
        while not hub.lagged and loop.time() < deadline:
            await asyncio.sleep(0.01)
            peak = max(peak, hub.buffers.used)
        assert hub.lagged > 0
        assert 0 < peak <= 64 * MIB, peak
        assert max(s.outbox.bytes for s in stack.relay.relay.sessions) <= 8 * MIB + 1_000_000

        reader, request_id = readers[0], 1
        seqs: list[int] = []
        deadline = loop.time() + 30
        while len(seqs) < 40 and loop.time() < deadline:
            _, ended, frames = reader.drain()
            assert ended is None
            for data in frames:
                frame = pb.ServerFrame.FromString(data)
                # As a client does: what an ended subscription still had queued arrives
                # after the lag notice, and the next one repeats it.
                seqs += [d.seq for d in frame.deliveries.items if d.seq > (seqs or [0])[-1]]
                if frame.HasField("lagged"):
                    request_id += 1
                    subscribe(reader, request_id, seqs[-1] if seqs else 0)
            await asyncio.sleep(0.01)
        assert seqs == list(range(1, 41)), seqs
    finally:
        for r in readers:
            r.close()
        await sender.close()
        await stop_stack(stack)


def _relay(tmp_path: Path) -> tuple[Relay, list[str], asyncio.Event]:
    """A relay whose access rechecks wait on an event (a stalled database), counted."""
    settings = Settings(data_dir=tmp_path, subscriber_buffer_bytes=8 * MIB)
    relay = Relay(settings, SqliteLogStore(tmp_path / "relay.sqlite3"), None, None, None)
    rechecks: list[str] = []
    stalled = asyncio.Event()

    async def recheck(channel: str) -> None:
        rechecks.append(channel)
        await stalled.wait()

    relay._recheck = recheck
    return relay, rechecks, stalled


def _live(relay: Relay, name: bytes) -> tuple[Subscription, Outbox]:
    outbox = Outbox(4096, 64 * MIB, relay.hub.buffers)
    sub = Subscription(relay.hub, CHANNEL, name, outbox, 0)
    relay.hub.add(sub)
    sub.catching_up = False
    return sub, outbox


def _entry(seq: int, size: int = 10, handshake: bool = False) -> Entry:
    return Entry(CHANNEL, seq, b"sender", handshake, 1, bytes([seq % 256]) * size, 0.0)


async def _delivered(outbox: Outbox) -> list[int]:
    seqs = []
    while len(outbox):
        frames, _, _ = await outbox.next_frames()
        for frame in frames:
            parsed = pb.ServerFrame.FromString(frame)
            if parsed.HasField("lagged"):
                seqs.append(-1)
            seqs.extend(d.seq for d in parsed.deliveries.items)
    return seqs


async def test_entries_after_a_commit_wait_for_the_access_recheck(tmp_path: Path) -> None:
    """What is stored after a commit reaches subscribers once their access is checked
    again, in order, a commit's worth at a time."""
    relay, rechecks, stalled = _relay(tmp_path)
    _, outbox = _live(relay, b"reader")
    relay._stored([_entry(1, handshake=True), _entry(2), _entry(3, handshake=True)], [])
    relay._stored([_entry(4)], [])
    await asyncio.sleep(0.01)
    assert await _delivered(outbox) == [1] and rechecks == [CHANNEL]
    stalled.set()
    await asyncio.gather(*relay._rechecks)
    assert await _delivered(outbox) == [2, 3, 4] and rechecks == [CHANNEL] * 2
    assert relay.holds.bytes == 0 and relay.holds.get(CHANNEL) is None


async def test_entries_held_for_a_stalled_access_recheck_are_bounded_in_bytes(
    tmp_path: Path,
) -> None:
    """A database that stalls the recheck after a commit must not let a member's large
    messages pile up in the relay: past the channel's bound (the stream buffer's bytes)
    they are dropped, the commits among them are rechecked for, and every subscription
    is told to read them from the log."""
    relay, rechecks, stalled = _relay(tmp_path)
    subs = [_live(relay, name) for name in (b"one", b"two")]
    relay._stored([_entry(1, handshake=True)], [])
    for seq in range(2, 40):
        relay._stored([_entry(seq, MIB, handshake=seq == 20)], [])
        assert relay.holds.bytes <= 8 * MIB
    stalled.set()
    await asyncio.gather(*relay._rechecks)
    assert rechecks == [CHANNEL] * 2, "the dropped commit was rechecked for"
    for sub, outbox in subs:
        # The notice goes ahead of what was queued (docs/relay.md, slow subscribers).
        assert not sub.active and await _delivered(outbox) == [-1, 1]
    assert relay.holds.bytes == 0 and relay.holds.get(CHANNEL) is None
    relay._stored([_entry(40)], [])  # held no longer
    assert all(len(outbox) == 0 for _, outbox in subs), "lagged subscriptions get nothing live"
