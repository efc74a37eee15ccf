"""Entries held back while a commit's access recheck runs, bounded in bytes.

After a handshake is stored, the channel's later entries wait until every stream's
access has been checked again, so a stream of an account the commit removed never
receives what was sent after it. The recheck asks the database, which can stall; what
arrives meanwhile is bounded per channel and across the relay. Past either bound the
channel's held entries are dropped, not queued: they are in the log, and when the
recheck is over every subscription of the channel is sent ``Lagged`` and reads them
there (see :meth:`Relay._recheck_and_release`).
"""

from __future__ import annotations

from collections import deque

from .store import Entry


class Hold:
    """One channel's entries stored since a handshake whose recheck runs."""

    __slots__ = ("bytes", "dropped", "dropped_handshake", "entries")

    def __init__(self) -> None:
        self.entries: deque[Entry] = deque()
        self.bytes = 0
        # Entries were dropped: the channel's subscriptions read on from the log.
        self.dropped = False
        # A dropped entry was a handshake, whose recheck has not run.
        self.dropped_handshake = False

    def take_dropped_handshake(self) -> bool:
        dropped, self.dropped_handshake = self.dropped_handshake, False
        return dropped


class Holds:
    """Every channel's :class:`Hold`: at most ``channel_bytes`` of messages held for one
    channel and ``relay_bytes`` for all (one entry is always held, however large)."""

    def __init__(self, channel_bytes: int, relay_bytes: int) -> None:
        self.channel_bytes = channel_bytes
        self.relay_bytes = relay_bytes
        self.bytes = 0  # held across channels
        self._holds: dict[str, Hold] = {}

    def get(self, channel: str) -> Hold | None:
        return self._holds.get(channel)

    def start(self, channel: str) -> Hold:
        hold = self._holds[channel] = Hold()
        return hold

    def add(self, hold: Hold, entry: Entry) -> None:
        size = len(entry.message)
        if (
            not hold.dropped
            and hold.entries
            and (hold.bytes + size > self.channel_bytes or self.bytes + size > self.relay_bytes)
        ):
            self._drop(hold)
        if hold.dropped:
            hold.dropped_handshake |= entry.handshake
            return
        hold.entries.append(entry)
        hold.bytes += size
        self.bytes += size

    def release(self, hold: Hold) -> list[Entry]:
        """The held entries up to and including the next handshake, in order."""
        released: list[Entry] = []
        while hold.entries and not (released and released[-1].handshake):
            released.append(hold.entries.popleft())
        size = sum(len(e.message) for e in released)
        hold.bytes -= size
        self.bytes -= size
        return released

    def end(self, channel: str) -> None:
        hold = self._holds.pop(channel)
        self._drop(hold)

    def _drop(self, hold: Hold) -> None:
        hold.dropped_handshake |= any(e.handshake for e in hold.entries)
        hold.dropped = True
        hold.entries.clear()
        self.bytes -= hold.bytes
        hold.bytes = 0
