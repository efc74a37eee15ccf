"""Reading one kind of envelope from a shared channel, from threads or coroutines.

A reader takes only the envelopes its ``accept`` wants; the manager keeps the others
buffered, in order, for other readers (``SvcChannelManager.receive_messages``). The async
side reads on the caller's loop (``svc_sdk.aio``), with no worker thread; what it takes
goes into the reader's own buffer in the same step, so cancelling a read never loses a
message.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from svc_sdk.aio import AsyncSvcChannelManager
from svc_sdk.channel import Message
from svc_sdk.envelope import Envelope
from svc_sdk.manager import SvcChannelManager

SLICE = 0.5  # seconds an async read waits per round (it loops until a message comes)


def parse(message: Message) -> Envelope | None:
    try:
        return Envelope.deserialize(message.data)
    except ValueError:
        return None


class EnvelopeReader:
    def __init__(
        self, manager: SvcChannelManager, channel: str, accept: Callable[[Envelope], bool]
    ) -> None:
        self.manager = manager
        self.channel = channel
        self._accept = accept
        self._buffer: deque[tuple[Message, Envelope]] = deque()
        self._lock = threading.Lock()

    def fetch(self, timeout: float) -> None:
        """Blocks up to ``timeout`` for wanted envelopes and buffers them (any thread)."""
        wanted, keep = self._wanted()
        keep(self.manager.receive_messages(self.channel, timeout, accept=wanted))

    async def afetch(self, timeout: float) -> int:
        """``fetch`` on the caller's event loop; returns how many it took."""
        wanted, keep = self._wanted()
        taken = await AsyncSvcChannelManager(self.manager).receive_messages(
            self.channel, timeout, accept=wanted
        )
        keep(taken)
        return len(taken)

    def _wanted(
        self,
    ) -> tuple[Callable[[Message], bool], Callable[[list[Message]], None]]:
        """The channel calls ``wanted`` on each candidate, under its lock; what it parsed
        is kept for the messages it takes (``keep``), so each payload is parsed once."""
        parsed: dict[int, Envelope] = {}

        def wanted(message: Message) -> bool:
            envelope = parse(message)
            if envelope is None or not self._accept(envelope):
                return False
            parsed[id(message)] = envelope
            return True

        def keep(taken: list[Message]) -> None:
            items = []
            for message in taken:
                envelope = parsed.get(id(message)) or parse(message)
                assert envelope is not None  # wanted() accepted it, so it parses
                items.append((message, envelope))
            with self._lock:
                self._buffer.extend(items)

        return wanted, keep

    def take(self, limit: int | None = None) -> list[tuple[Message, Envelope]]:
        with self._lock:
            count = len(self._buffer) if limit is None else min(limit, len(self._buffer))
            return [self._buffer.popleft() for _ in range(count)]

    def receive(self, timeout: float) -> list[tuple[Message, Envelope]]:
        """Everything buffered, or what arrives within ``timeout`` (blocking)."""
        taken = self.take()
        if taken:
            return taken
        self.fetch(timeout)
        return self.take()

    async def next(self) -> tuple[Message, Envelope]:
        """The next wanted envelope, waiting as long as it takes."""
        while True:
            taken = self.take(1)
            if taken:
                return taken[0]
            if not await self.afetch(SLICE):
                # Nothing within SLICE, or nothing at once because the channel is closed
                # (a read of a closed channel returns []): raise its reason, or this loop
                # would never give the event loop back.
                self.manager._channel(self.channel)._check_open()


class Readers:
    """One reader per channel, made on first use (thread-safe): a second reader of the
    same kind would hold messages in its own buffer that the first never sees."""

    def __init__(self, manager: SvcChannelManager, accept: Callable[[Envelope], bool]) -> None:
        self._manager = manager
        self._accept = accept
        self._readers: dict[str, EnvelopeReader] = {}
        self._lock = threading.Lock()

    def __getitem__(self, channel: str) -> EnvelopeReader:
        with self._lock:
            reader = self._readers.get(channel)
            if reader is None:
                reader = EnvelopeReader(self._manager, channel, self._accept)
                self._readers[channel] = reader
            return reader
