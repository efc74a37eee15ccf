"""Local fan-out: which streams of this relay process want which channel, with a bounded
buffer per stream so a slow subscriber never stalls the others."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator, Sequence

from svc_sdk._relay_pb import relay_pb2 as pb

from .store import Entry, WelcomeEntry

MAX_BATCH = 256
MAX_BATCH_BYTES = 4 * 1024 * 1024


class Outbox:
    """Frames waiting to be written to one stream. Deliveries are bounded (a subscriber
    over the bound is told it lagged); replies to the client's own requests are not."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._deliveries: deque[Entry] = deque()
        self._controls: deque[pb.ServerFrame] = deque()
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def __len__(self) -> int:
        return len(self._deliveries)

    def offer(self, entry: Entry) -> bool:
        if len(self._deliveries) >= self.limit:
            return False
        self._deliveries.append(entry)
        if len(self._deliveries) >= self.limit // 2:
            self._room.clear()
        self._wake.set()
        return True

    def control(self, frame: pb.ServerFrame) -> None:
        self._controls.append(frame)
        self._wake.set()

    async def wait_for_room(self) -> None:
        await self._room.wait()

    async def next_frames(self) -> tuple[list[pb.ServerFrame], float | None]:
        """Waits for something to send; returns replies first, then one batch of
        deliveries (many messages in one frame), with the time its oldest was stored."""
        while not self._controls and not self._deliveries:
            self._wake.clear()
            await self._wake.wait()
        frames = list(self._controls)
        self._controls.clear()
        oldest: float | None = None
        if self._deliveries:
            oldest = self._deliveries[0].stored_at
            items: list[pb.Delivery] = []
            size = 0
            while self._deliveries and len(items) < MAX_BATCH and size < MAX_BATCH_BYTES:
                e = self._deliveries.popleft()
                size += len(e.message)
                items.append(
                    pb.Delivery(
                        channel=e.channel,
                        seq=e.seq,
                        message=e.message,
                        sender=e.sender,
                        handshake=e.handshake,
                        epoch=e.epoch,
                    )
                )
            frames.append(pb.ServerFrame(deliveries=pb.Deliveries(items=items)))
            if len(self._deliveries) < self.limit // 2:
                self._room.set()
        return frames, oldest


class Subscription:
    """One stream's interest in one channel. While it catches up from the log, live
    entries are held back; afterwards each entry is passed on exactly once, in order."""

    def __init__(self, hub: Hub, channel: str, identity: bytes, outbox: Outbox, after: int):
        self.hub = hub
        self.channel = channel
        self.identity = identity
        self.outbox = outbox
        self.last = after
        self.catching_up = True
        self.held: list[Entry] = []
        self.active = True

    def deliver(self, entry: Entry) -> None:
        if not self.active or entry.seq <= self.last:
            return
        if entry.seq != self.last + 1:
            self.lag()  # a gap: only the log can fill it
            return
        self.last = entry.seq
        if entry.sender == self.identity:
            return  # an agent's own messages are not echoed back to it
        if not self.outbox.offer(entry):
            self.lag()

    def offer_live(self, entry: Entry) -> None:
        if self.catching_up:
            self.held.append(entry)
            if len(self.held) > self.outbox.limit:
                self.lag()
        else:
            self.deliver(entry)

    def go_live(self) -> None:
        self.catching_up = False
        held, self.held = self.held, []
        for entry in held:
            self.deliver(entry)

    def lag(self) -> None:
        """Too far behind: stop live delivery and tell the client to resume from its cursor."""
        if self.active:
            self.active = False
            self.hub.remove(self)
            self.outbox.control(pb.ServerFrame(lagged=pb.Lagged(channel=self.channel)))


class Hub:
    def __init__(self) -> None:
        self._subs: dict[str, set[Subscription]] = {}
        self._by_identity: dict[bytes, set[Outbox]] = {}

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
            for sub in list(self._subs.get(entry.channel, ())):
                sub.offer_live(entry)
        for w in welcomes:
            for outbox in self._by_identity.get(w.recipient, ()):
                outbox.control(welcome_frame(w))


def welcome_frame(w: WelcomeEntry) -> pb.ServerFrame:
    return pb.ServerFrame(
        welcome=pb.Welcome(channel=w.channel, welcome=w.welcome, seq=w.seq, epoch=w.epoch)
    )
