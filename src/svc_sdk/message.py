"""What a reader gets from a channel: :class:`Message`, and :class:`MessageIterator` over
the payloads."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from svc_sdk.agent_id import AgentId

if TYPE_CHECKING:
    from svc_sdk.channel import Channel

# Which buffered messages a reader wants (adapters pick their protocol's envelopes).
Accept = Callable[["Message"], bool]


class Message:
    """A decrypted message: its position in the channel, the payload, and ``sender``, the
    :class:`AgentId` (account and identity) its verified credential names."""

    __slots__ = ("channel", "data", "sender", "seq")

    def __init__(self, channel: str, seq: int, sender: AgentId, data: bytes) -> None:
        self.channel = channel
        self.seq = seq
        self.sender = sender
        self.data = data

    def __repr__(self) -> str:
        return f"Message(channel={self.channel!r}, seq={self.seq}, {len(self.data)} bytes)"


class MessageIterator:
    """Blocking iterator over a channel's decrypted payloads (bytes), in channel order.

    Ends (StopIteration) when the channel is closed: left, removed, or its client closed.
    Iterators share the channel's buffer: dropping one and starting another loses and
    repeats nothing.
    """

    def __init__(self, channel: Channel, timeout: float | None = None) -> None:
        self._channel = channel
        self._timeout = timeout

    def __iter__(self) -> MessageIterator:
        return self

    def __next__(self) -> bytes:
        message = self._channel.next_message(self._timeout)
        if message is None:
            raise StopIteration
        return message.data
