"""A receiver's unprocessed deliveries are bounded: past the bound the link pauses the
channel's subscription and resumes it, as a new subscription, once readers drained the
backlog. Nothing is lost, duplicated or reordered, also across relay restarts and lag."""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import time
from typing import Any, cast

import pytest

from svc_sdk import Channel
from svc_sdk import channel as channel_module
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.relay_frames import Deliveries, Delivery, Event, Lagged, decode
from svc_sdk.relay_link import PAUSED, RelayLink, _Sub
from svc_sdk.testing import LocalStack

from .helpers import pair, wait_for

MAX_BATCH = 256  # deliveries in one relay frame (server/relay/hub.py)
MAX_BATCH_BYTES = 256 * 1024  # a relay frame closes once its encoded deliveries reach this


def event(frame: pb.ServerFrame) -> Event:
    """``frame`` as the relay sends it and the link gets it: encoded, then decoded."""
    decoded = decode(frame.SerializeToString())
    assert decoded is not None
    return decoded


class Watch:
    """Records the receiver's backlog after each frame the link hands over."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.frames = 0
        self.peak = 0  # the most deliveries queued
        self.peak_bytes = 0
        self.over = 0  # frames that left the backlog over its bound
        deliver = channel._deliver

        def watched(items: list[Delivery]) -> bool:
            full = deliver(items)
            self.frames += 1
            self.over += full
            self.peak = max(self.peak, len(channel._raw))
            self.peak_bytes = max(self.peak_bytes, channel._raw_bytes)
            return full

        channel._deliver = watched  # type: ignore[method-assign]

    def paused(self) -> bool:
        sub = self.channel._client.link._subs.get(self.channel.name)
        return sub is not None and sub.paused


def read_slowly(channel: Channel, count: int, pause: float = 0.002) -> list[bytes]:
    """Reads ``count`` messages in small batches with a pause after each."""
    got: list[bytes] = []
    while len(got) < count:
        batch = channel.next_messages(timeout=30, limit=32)
        assert batch, f"got {len(got)} of {count}; last {got[-3:]}"
        got += [m.data for m in batch]
        time.sleep(pause)
    return got


def send_in_background(channel: Channel, sent: list[bytes], batch: int) -> threading.Thread:
    """Sends ``sent`` with ``send_batch`` of ``batch`` messages each, from a thread."""
    sender = threading.Thread(
        target=lambda: [channel.send_batch(sent[i : i + batch]) for i in range(0, len(sent), batch)]
    )
    sender.start()
    return sender


def payloads(start: int, count: int, size: int = 0) -> list[bytes]:
    return [f"m{i}:".encode().ljust(size, b".") for i in range(start, start + count)]


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    """A bound a test reaches in a few hundred messages."""
    monkeypatch.setattr(channel_module, "BACKLOG_MESSAGES", 64)
    return 64


def test_a_fast_sender_cannot_grow_a_slow_readers_backlog_past_the_bound(
    stack: LocalStack, ids: Any
) -> None:
    """The bound as shipped: 16 KiB messages reach the byte bound, 4 MiB."""
    ca, chan_a, cb, chan_b = pair(stack, f"acme/tests/backlog-{ids('c')}", ids("a"), ids("b"))
    watch = Watch(chan_b)
    with ca, cb:
        sent = payloads(0, 1500, 16 * 1024)
        for i in range(0, len(sent), 500):
            chan_a.send_batch(sent[i : i + 500])
        # The reader has not read: the backlog stopped at the bound.
        wait_for(watch.paused)
        time.sleep(0.5)
        bound = channel_module.BACKLOG_BYTES
        # Closed by the delivery that reached it: 16 KiB padded and framed is ~21 KiB.
        one_frame = MAX_BATCH_BYTES + 32 * 1024
        assert bound < watch.peak_bytes <= bound + one_frame
        assert watch.peak < 1500
        got = read_slowly(chan_b, len(sent))
        assert got == sent
        assert chan_b.next_message(0.3) is None  # and nothing twice
        assert watch.peak_bytes <= bound + one_frame
        assert not watch.paused()


def test_many_pauses_lose_nothing_and_repeat_nothing(
    stack: LocalStack, ids: Any, small_bound: int
) -> None:
    """Thousands of small messages against a bound of 64: the channel pauses and
    resumes many times, while the sender keeps sending."""
    ca, chan_a, cb, chan_b = pair(stack, f"acme/tests/backlog-{ids('c')}", ids("a"), ids("b"))
    watch = Watch(chan_b)
    sent = payloads(0, 4000)
    with ca, cb:
        sender = send_in_background(chan_a, sent, batch=250)
        got = read_slowly(chan_b, len(sent), pause=0.005)
        sender.join(60)
        assert got == sent
        assert chan_b.next_message(0.3) is None
        assert watch.over > 1, "the backlog reached the bound"
        assert watch.peak <= small_bound + MAX_BATCH
        assert cb.link._subs[chan_b.name].current > 2  # resubscribed with new ids


def test_a_relay_restart_while_paused_keeps_the_pause_and_loses_nothing(
    ids: Any, small_bound: int
) -> None:
    with LocalStack() as stack:
        ca, chan_a, cb, chan_b = pair(stack, "acme/tests/backlog-restart", ids("a"), ids("b"))
        watch = Watch(chan_b)
        with ca, cb:
            sent = payloads(0, 1000)
            chan_a.send_batch(sent[:500])
            wait_for(watch.paused)
            stack.kill()
            stack.restart()
            wait_for(lambda: cb.link.reconnects >= 1 and cb.link.connected)
            chan_a.send_batch(sent[500:])  # while the reader is still paused
            time.sleep(0.5)
            assert watch.paused(), "the reconnect did not resubscribe a paused channel"
            assert watch.peak <= small_bound + MAX_BATCH
            got = read_slowly(chan_b, 300)
            stack.kill()  # and once more after it resumed
            stack.restart()
            got += read_slowly(chan_b, len(sent) - len(got))
            assert got == sent
            assert chan_b.next_message(0.3) is None
            assert watch.peak <= small_bound + MAX_BATCH


def test_lagged_resubscribes_unless_paused(
    ids: Any, small_bound: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay with a small per-stream buffer tells the receiver it lagged at every
    batch larger than it; the resubscribes interleave with pauses. (Not below the
    relay's catch-up page, 512: a catch-up page would not fit and lag again.)"""
    lagged = 0
    on_frame = RelayLink._on_frame

    def counting(self: RelayLink, frame: Event) -> None:
        nonlocal lagged
        lagged += isinstance(frame, Lagged)
        on_frame(self, frame)

    monkeypatch.setattr(RelayLink, "_on_frame", counting)
    with LocalStack(subscriber_buffer=600) as stack:
        ca, chan_a, cb, chan_b = pair(stack, "acme/tests/backlog-lagged", ids("a"), ids("b"))
        watch = Watch(chan_b)
        sent = payloads(0, 3000)
        with ca, cb:
            sender = send_in_background(chan_a, sent, batch=1000)
            got = read_slowly(chan_b, len(sent))
            sender.join(60)
            assert got == sent
            assert chan_b.next_message(0.3) is None
            assert lagged > 0 and watch.over > 0
            assert watch.peak <= small_bound + MAX_BATCH


def test_deliveries_the_old_subscription_had_queued_are_not_taken_for_the_new_ones(
    stack: LocalStack, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay writes the resubscribe's Reply before the deliveries it still had queued
    for the paused subscription, and those carry later seqs than the cursor. A client
    that dropped some of them while paused and took the rest after resuming would drop
    the new subscription's earlier seqs as seen: a gap.

    Every frame pauses the channel (a bound of one message); 1,000 messages published at
    once are queued at the relay as four frames. When a frame arrives while paused (and
    is dropped), the link's thread waits until the reader has drained the backlog, so
    the resubscribe goes out while the rest of that batch is still on its way."""
    monkeypatch.setattr(channel_module, "BACKLOG_MESSAGES", 1)
    resumed_early = 0
    on_frame = RelayLink._on_frame

    def drained_between_frames(self: RelayLink, frame: Event) -> None:
        nonlocal resumed_early
        items = frame.items if isinstance(frame, Deliveries) else []
        sub = self._subs.get(items[0].channel) if items else None
        was_paused = sub is not None and sub.paused
        on_frame(self, frame)
        if sub is not None and was_paused and sub.paused:  # dropped: wait for the reader
            channel = cast(Channel, sub.sink)
            deadline = time.monotonic() + 5
            while channel._paused and time.monotonic() < deadline:
                time.sleep(0.001)
            resumed_early += not channel._paused

    monkeypatch.setattr(RelayLink, "_on_frame", drained_between_frames)
    ca, chan_a, cb, chan_b = pair(stack, f"acme/tests/backlog-{ids('c')}", ids("a"), ids("b"))
    watch = Watch(chan_b)
    sent = payloads(0, 3000)
    with ca, cb:
        sender = send_in_background(chan_a, sent, batch=1000)
        got: list[bytes] = []
        while len(got) < len(sent):
            batch = chan_b.next_messages(timeout=10)
            if not batch:
                break
            got += [m.data for m in batch]
        sender.join(60)
        assert resumed_early > 0, "no resubscribe overtook queued deliveries"
        assert len(got) == len(sent), f"missing {sorted(set(sent) - set(got))[:5]}"
        assert got == sent
        assert chan_b.next_message(0.3) is None
        assert watch.peak <= 1 + MAX_BATCH


class _ListSink:
    def __init__(self, full_after: int) -> None:
        self.items: list[tuple[int, int]] = []
        self.full_after = full_after

    def _deliver(self, items: list[Delivery]) -> bool:
        self.items += [(d.seq, d.subscription) for d in items]
        return len(self.items) >= self.full_after

    def _failed(self, error: Exception) -> None:
        raise AssertionError(error)


def test_the_link_takes_only_the_current_subscriptions_deliveries() -> None:
    """The rule itself, frame by frame (the tests above run it against a real relay)."""
    link = RelayLink(["127.0.0.1:1"], b"me", tokens=cast(Any, None))
    sink = _ListSink(full_after=3)
    link._subs["a/b/c"] = _Sub(sink, received=5, current=3)

    def frame(*items: tuple[int, int]) -> Event:
        return event(
            pb.ServerFrame(
                deliveries=pb.Deliveries(
                    items=[pb.Delivery(channel="a/b/c", seq=s, subscription=n) for s, n in items]
                )
            )
        )

    # An earlier subscription's, the current one's, one of an older relay (no number),
    # one already handed over.
    link._on_frame(frame((6, 2), (6, 3), (7, 0), (7, 3)))
    assert sink.items == [(6, 3), (7, 0)]
    link._on_frame(frame((8, 3)))  # the backlog is full now: paused
    sub = link._subs["a/b/c"]
    assert sub.paused and sub.current == PAUSED and sub.received == 8
    link._on_frame(frame((9, 3), (10, 2**64 - 1), (11, 0)))
    assert sink.items == [(6, 3), (7, 0), (8, 3)]
    link._on_frame(event(pb.ServerFrame(lagged=pb.Lagged(channel="a/b/c"))))  # stays paused
    assert sub.paused


MALLINFO2_FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


def _mallinfo2() -> Any:
    """glibc's ``mallinfo2`` (2.33 and later), or None without it (musl, older glibc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS.split()]

    mallinfo2.restype = MallInfo2
    return mallinfo2


def _heap_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back (mmapped chunks included)."""
    info = _mallinfo2()()
    return int(info.uordblks + info.hblkhd)


@pytest.mark.skipif(_mallinfo2() is None, reason="needs glibc's mallinfo2")
def test_a_queued_delivery_does_not_keep_its_whole_frame_in_memory() -> None:
    """A backlog costs what its messages weigh: a delivery left queued must not hold on
    to the parse of the frame it came in (up to 256 KiB), or a backlog of one delivery
    per frame would weigh the frames."""

    class KeepFirst:
        def __init__(self) -> None:
            self.kept: list[Delivery] = []

        def _deliver(self, items: list[Delivery]) -> bool:
            self.kept.append(items[0])
            return False

        def _failed(self, error: Exception) -> None:
            raise AssertionError(error)

    link = RelayLink(["127.0.0.1:1"], b"me", tokens=cast(Any, None))
    sink = KeepFirst()
    link._subs["a/b/c"] = _Sub(sink, received=0, current=1)
    frames, per_frame, size = 16, 16, 16 * 1024

    def encoded(first: int) -> bytes:
        items = [
            pb.Delivery(channel="a/b/c", seq=first + i, message=bytes(size), subscription=1)
            for i in range(per_frame)
        ]
        return pb.ServerFrame(deliveries=pb.Deliveries(items=items)).SerializeToString()

    data = [encoded(1 + n * per_frame) for n in range(frames)]
    gc.collect()
    before = _heap_in_use()
    for one in data:
        decoded = decode(one)
        assert decoded is not None
        link._on_frame(decoded)
    gc.collect()
    grown = _heap_in_use() - before
    assert len(sink.kept) == frames and all(len(d.message) == size for d in sink.kept)
    # One message per frame is 256 KiB; the frames would be 4 MiB.
    assert grown < 2 * frames * size, grown
