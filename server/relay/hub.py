"""Local fan-out: which streams of this relay process want which channel, with a bounded
buffer per stream so a slow subscriber never stalls the others."""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Iterator, Sequence

from svc_sdk.protocol import encode_delivery
from svc_sdk.protocol import relay_pb2 as pb

from .store import Entry, WelcomeEntry

# One frame of deliveries: at most this many, and it is closed once its encoded
# deliveries reach MAX_BATCH_BYTES. The byte bound is for the receiver's memory, not the
# relay's: a client copies each frame whole several times on the way in (HTTP/2's
# buffer, the bytes it drains, the parsed message its deliveries keep alive), and once
# glibc has freed a buffer of a size it serves that size from its heaps, not mmap, so
# megabyte frames leave a reader's heap fragmented. 256 KiB still holds 256 deliveries of
# messages up to ~900 bytes, so small ones fan out in as few writes as before
# (docs/performance.md).
MAX_BATCH = 256
MAX_BATCH_BYTES = 256 * 1024


def _varint(n: int) -> bytes:
    # Called per delivery per subscriber (frame lengths): the common sizes take no loop.
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# The longest subscription tail: field 7's tag and a uint64 varint of up to ten bytes.
MAX_TAIL = 11

# A Delivery encoded once per stored message and shared by every subscriber: its fields
# but the subscription, and the ``Deliveries.items`` header (tag 1, length) for each
# length a subscription's tail can have, so framing it for a subscriber is an index.
Encoded = tuple[tuple[bytes, ...], bytes]


def encode_item(entry: Entry) -> Encoded:
    """One Delivery's fields but its subscription, with the item headers by tail length
    (see :data:`Encoded`)."""
    body = encode_delivery(
        entry.channel, entry.seq, entry.message, entry.sender, entry.handshake, entry.epoch
    )
    return _item_heads(len(body)), body


@functools.lru_cache(maxsize=4096)
def _item_heads(size: int) -> tuple[bytes, ...]:
    """The ``Deliveries.items`` headers of a body of ``size`` bytes, by tail length.
    Cached: a channel's messages mostly share a few sizes, and making the twelve headers
    cost three times the protobuf encoding of the body."""
    return tuple(b"\x0a" + _varint(size + n) for n in range(MAX_TAIL + 1))


def subscription_tail(subscription: int) -> bytes:
    """``Delivery.subscription`` (field 7, varint) as bytes to append to an encoded
    Delivery: protobuf reads fields in any order. Empty for 0, the default."""
    return b"\x38" + _varint(subscription) if subscription else b""


def frame_item(item: Encoded, tail: bytes) -> tuple[bytes, bytes, bytes]:
    """The pieces of one subscriber's ``Deliveries.items`` field: header, body, tail."""
    heads, body = item
    return heads[len(tail)], body, tail


def deliveries_frame(pieces: list[bytes], size: int) -> bytes:
    """A serialized ``ServerFrame{deliveries}`` (field 2) from :func:`frame_item` pieces
    of ``size`` bytes in all. The one join, header included, is the only copy of the
    shared bodies: joining first and prepending the header copied a frame of 16 KiB
    messages twice, ~7 µs a delivery (its fresh 256 KiB pages faulted in again)."""
    return b"".join((b"\x12" + _varint(size), *pieces))


class Buffers:
    """The bytes of deliveries queued in all of one relay's outboxes, against ``limit``.
    Each outbox is bounded on its own, but a connection may open a hundred streams and a
    client may open many connections: a relay whose streams do not read would otherwise
    hold every one of them full. Past the limit, the outbox that holds the most sheds its
    deliveries (its subscriptions lag and resume from the log), so the streams that do
    not read pay for it, not the ones that do."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.shed = 0  # outboxes shed, ever
        self._outboxes: set[Outbox] = set()

    def add(self, outbox: Outbox) -> None:
        self._outboxes.add(outbox)

    def remove(self, outbox: Outbox) -> None:
        self._outboxes.discard(outbox)

    def make_room(self, size: int, asking: Outbox) -> bool:
        """Whether ``size`` more bytes fit for ``asking``, once outboxes that hold more
        than it have shed theirs (largest first). False leaves ``asking`` to lag."""
        while self.used + size > self.limit:
            largest = max(self._outboxes, key=lambda o: o.bytes)
            if largest.bytes <= asking.bytes:
                return False
            largest.shed()
            self.shed += 1
        return True


class Outbox:
    """Frames waiting to be written to one stream. Deliveries are bounded in number and in
    bytes, and together with every other outbox's by the relay's :class:`Buffers` (a
    subscriber over a bound is told it lagged); replies to the client's own requests are
    not."""

    def __init__(self, limit: int, byte_limit: int, buffers: Buffers) -> None:
        self.limit = limit
        self.byte_limit = byte_limit
        self.bytes = 0  # of the queued deliveries' bodies
        self._buffers: Buffers | None = buffers
        buffers.add(self)
        # (item, its subscription's tail, when it was stored, the subscription)
        self._deliveries: deque[tuple[Encoded, bytes, float, object]] = deque()
        self._controls: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.closed = False

    def __len__(self) -> int:
        return len(self._deliveries)

    def close(self) -> None:
        """Wakes the writer so it can see the stream is ending; what is queued no longer
        counts against the relay's buffers."""
        self.closed = True
        self._wake.set()
        if self._buffers is not None:
            self._buffers.used -= self.bytes
            self._buffers.remove(self)
            self._buffers = None

    def _taken(self, size: int) -> None:
        self.bytes -= size
        if self._buffers is not None:
            self._buffers.used -= size
        if len(self._deliveries) < self.limit // 2 and self.bytes < self.byte_limit // 2:
            self._room.set()

    def offer(self, item: Encoded, tail: bytes, stored_at: float, owner: object = None) -> bool:
        """Queues an :func:`encode_item` body with its :func:`subscription_tail`, for the
        subscription ``owner`` (see :meth:`withdraw`). False when the outbox is full (by
        number, or by bytes: one delivery may take it past its byte limit, so a message
        larger than the limit still goes out), or the relay's buffers are and this outbox
        holds the most."""
        size = len(item[1])
        if len(self._deliveries) >= self.limit or self.bytes >= self.byte_limit:
            return False
        buffers = self._buffers
        if buffers is not None:
            if buffers.used + size > buffers.limit and not buffers.make_room(size, self):
                return False
            buffers.used += size
        self.bytes += size
        self._deliveries.append((item, tail, stored_at, owner))
        if len(self._deliveries) >= self.limit // 2 or self.bytes >= self.byte_limit // 2:
            self._room.clear()
        self._wake.set()
        return True

    def shed(self) -> None:
        """Drops every queued delivery, and has each subscription they were for lag: the
        relay's buffers are full and this outbox holds the most."""
        owners = {id(d[3]): d[3] for d in self._deliveries if isinstance(d[3], Subscription)}
        self._deliveries.clear()
        self._taken(self.bytes)
        for owner in owners.values():
            owner.lag()

    def withdraw(self, owner: object) -> int:
        """Drops what is still queued for the subscription ``owner``, which has ended: the
        client takes no delivery of an ended subscription, and a new one starts from its
        cursor. A client that pauses a channel it cannot keep up with then stops receiving
        it at once, instead of after up to ``limit`` deliveries it would only drop.
        Returns how many were dropped (none once the stream is closing: nothing more is
        written to it)."""
        if self.closed or not self._deliveries:
            return 0
        kept = deque(d for d in self._deliveries if d[3] is not owner)
        dropped = len(self._deliveries) - len(kept)
        if dropped:
            size = sum(len(d[0][1]) for d in self._deliveries if d[3] is owner)
            self._deliveries = kept
            self._taken(size)
        return dropped

    def control(self, frame: bytes) -> None:
        """Queues an encoded ServerFrame that is not deliveries: a Reply, a Welcome, a
        lag notice."""
        self._controls.append(frame)
        self._wake.set()

    @property
    def pending_controls(self) -> int:
        return len(self._controls)

    async def wait_for_room(self) -> None:
        await self._room.wait()

    async def next_frames(self) -> tuple[list[bytes], int, float | None]:
        """Waits for something to send; returns serialized frames (replies first, then
        one batch of deliveries), how many deliveries, and when the oldest was stored."""
        while not self._controls and not self._deliveries:
            if self.closed:
                return [], 0, None
            self._wake.clear()
            await self._wake.wait()
        frames = list(self._controls)
        self._controls.clear()
        count, oldest = 0, None
        if self._deliveries:
            oldest = self._deliveries[0][2]
            pieces: list[bytes] = []
            size = 0
            bodies = 0
            while self._deliveries and count < MAX_BATCH and size < MAX_BATCH_BYTES:
                (heads, body), tail, _, _ = self._deliveries.popleft()
                head = heads[len(tail)]
                bodies += len(body)
                size += len(head) + len(body) + len(tail)
                pieces += (head, body, tail)  # frame_item, inlined
                count += 1
            frames.append(deliveries_frame(pieces, size))
            self._taken(bodies)
        return frames, count, oldest


class Subscription:
    """One stream's interest in one channel. While it catches up from the log, live
    entries are held back; afterwards each entry is passed on exactly once, in order."""

    def __init__(
        self,
        hub: Hub,
        channel: str,
        identity: bytes,
        outbox: Outbox,
        after: int,
        subscription: int = 0,
    ):
        self.hub = hub
        self.channel = channel
        self.identity = identity
        self.outbox = outbox
        self.last = after
        self.catching_up = True
        self.held: list[tuple[Entry, Encoded]] = []
        self.held_bytes = 0
        # Live entries were dropped from ``held`` during catch-up: the log still has them
        # (an entry is stored before it is fanned out), so catch-up must read on.
        self.held_dropped = False
        self.active = True
        # The client's number for this subscription, echoed in each of its deliveries.
        self.subscription = subscription
        self.tail = subscription_tail(subscription)

    def deliver(self, entry: Entry, item: Encoded | None = None) -> None:
        if not self.active or entry.seq <= self.last:
            return
        if entry.seq != self.last + 1:
            self.lag()  # a gap: only the log can fill it
            return
        self.last = entry.seq
        if entry.sender == self.identity and not entry.handshake:
            # Own application messages are not echoed back. Own commits are: the log is
            # how an agent whose connection dropped before the Reply learns the outcome.
            return
        if not self.outbox.offer(item or encode_item(entry), self.tail, entry.stored_at, self):
            self.lag()

    def offer_live(self, entry: Entry, item: Encoded) -> None:
        if self.catching_up:
            if len(self.held) >= self.outbox.limit or self.held_bytes >= self.outbox.byte_limit:
                # Not a lag: the entries are in the log, and catch-up reads them there.
                # (A Redis follower replays the log from the cursor as live entries.)
                self.held.clear()
                self.held_bytes = 0
                self.held_dropped = True
            self.held.append((entry, item))
            self.held_bytes += len(item[1])
        else:
            self.deliver(entry, item)

    def take_held_dropped(self) -> bool:
        """Whether held entries were dropped since the last call (catch-up reads on)."""
        dropped, self.held_dropped = self.held_dropped, False
        return dropped

    def go_live(self) -> None:
        self.catching_up = False
        held, self.held = self.held, []
        self.held_bytes = 0
        for entry, item in held:
            self.deliver(entry, item)

    def lag(self) -> None:
        """Too far behind: stop live delivery and tell the client to resume from its cursor."""
        if self.active:
            self.active = False
            self.hub.remove(self)
            self.hub.lagged += 1
            lagged = pb.ServerFrame(lagged=pb.Lagged(channel=self.channel))
            self.outbox.control(lagged.SerializeToString())


class Hub:
    def __init__(self, buffer_bytes: int) -> None:
        #: What every stream's outbox queues, together (see :class:`Buffers`).
        self.buffers = Buffers(buffer_bytes)
        self._subs: dict[str, set[Subscription]] = {}
        self._by_identity: dict[bytes, set[Outbox]] = {}
        self.lagged = 0  # subscribers told to resume from their cursor, ever

    def add(self, sub: Subscription) -> bool:
        """Registers; True if it is the first local subscription of its channel."""
        subs = self._subs.setdefault(sub.channel, set())
        subs.add(sub)
        return len(subs) == 1

    def remove(self, sub: Subscription) -> bool:
        """Unregisters; True if no local subscription of its channel is left."""
        subs = self._subs.get(sub.channel)
        if subs is None:
            return False
        subs.discard(sub)
        if not subs:
            del self._subs[sub.channel]
            return True
        return False

    def subscriptions(self, channel: str) -> Iterator[Subscription]:
        return iter(list(self._subs.get(channel, ())))

    def connect(self, identity: bytes, outbox: Outbox) -> None:
        self._by_identity.setdefault(identity, set()).add(outbox)

    def disconnect(self, identity: bytes, outbox: Outbox) -> None:
        boxes = self._by_identity.get(identity)
        if boxes is not None:
            boxes.discard(outbox)
            if not boxes:
                del self._by_identity[identity]

    def publish(self, entries: Sequence[Entry], welcomes: Sequence[WelcomeEntry]) -> None:
        """Called with newly stored entries, in sequence order."""
        for entry in entries:
            subs = self._subs.get(entry.channel)
            if subs:
                item = encode_item(entry)
                for sub in list(subs):
                    sub.offer_live(entry, item)
        for w in welcomes:
            for outbox in self._by_identity.get(w.recipient, ()):
                outbox.control(welcome_frame(w))


def welcome_frame(w: WelcomeEntry) -> bytes:
    """The encoded ServerFrame of a Welcome."""
    frame: bytes = pb.ServerFrame(
        welcome=pb.Welcome(channel=w.channel, welcome=w.welcome, seq=w.seq, epoch=w.epoch)
    ).SerializeToString()
    return frame
