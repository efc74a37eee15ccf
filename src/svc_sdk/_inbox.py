"""A channel's decrypted messages waiting for a reader, and the record on disk of what
was read and how far the channel was handled.

The cursor (the last sequence number handled) is written with inbox rows, and otherwise
when the reader is idle or after CONSUMED_FLUSH_SECONDS: if a crash loses that last write,
the relay sends those messages again, their keys are already used, and the engine skips
them. Nothing is lost and nothing is handed out twice.

Memory holds the oldest unread messages up to MEMORY_MESSAGES / MEMORY_BYTES; the newer
ones are on disk only and are read back in order as readers take the older ones.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from svc_sdk.agent_id import AgentId
from svc_sdk.errors import InternalError
from svc_sdk.message import Accept, Message

if TYPE_CHECKING:
    from svc_sdk.client import SvcClient

log = logging.getLogger("svc_sdk.channel")  # one logger for all of a channel's parts

CONSUMED_FLUSH = 256
CONSUMED_FLUSH_SECONDS = 0.1
# How much of the inbox memory holds: every stored message is on disk, so past this the
# newer ones stay there only and are read back, in order, as readers take the older
# ones. An agent that sends but reads slowly (each send processes what arrived, to
# encrypt in the newest epoch) or a flood from another member costs disk, not memory.
MEMORY_MESSAGES = 4096
MEMORY_BYTES = 16 * 1024 * 1024
FILTERED_PAGE = 256


class StorageFaults:
    """A channel's standing storage faults: storing what it received (``store``) and
    recording what was read (``record``), and since when either has stood (what
    ``Channel.health`` shows)."""

    __slots__ = ("record", "since", "store")

    def __init__(self) -> None:
        self.store: InternalError | None = None
        self.record: InternalError | None = None
        self.since: float | None = None

    @property
    def current(self) -> InternalError | None:
        return self.store or self.record

    def set_store(self, error: InternalError | None) -> None:
        self.store = error
        self._since(error)

    def set_record(self, error: InternalError | None) -> None:
        self.record = error
        self._since(error)

    def _since(self, error: InternalError | None) -> None:
        if error is not None:
            self.since = self.since or time.time()
        elif self.store is None and self.record is None:
            self.since = None


class Inbox:
    """The decrypted messages waiting for readers, in channel order, and the record of
    what was read. Guarded by the channel's ``_cond``: every method expects the caller
    to hold it."""

    def __init__(
        self,
        client: SvcClient,
        name: str,
        cursor: int,
        rows: list[tuple[int, bytes, bytes]],
        faults: StorageFaults,
    ) -> None:
        self._client = client
        self._name = name
        self._faults = faults
        # The oldest unread messages, in channel order; when ``spilled``, newer stored
        # ones wait on disk only, every one after ``loaded_through``.
        self.messages: deque[Message] = deque()
        self.spilled = False
        self.loaded_through = 0
        self._bytes = 0
        self._add_rows(rows)
        if len(rows) >= MEMORY_MESSAGES:
            self.spilled = True  # the caller loads one memory's worth; more may follow
        # Handled through here (each message stored, handed out or skipped), and the part
        # of that on disk; see the module docstring.
        self.cursor = cursor
        self.saved_cursor = cursor
        # Sequence numbers read but not yet deleted from the inbox (see mark_consumed).
        self.unflushed: list[int] = []
        self.flushed_at = time.monotonic()

    def add(self, messages: list[Message], bounded: bool = True) -> None:
        """Buffers stored messages (newer than any buffered), as far as memory's bound
        allows (``bounded``); the rest wait on disk."""
        for message in messages:
            if message.seq <= self.loaded_through:
                continue  # read back from disk already (stored, then added here)
            if self.spilled or (bounded and self._over()):
                self.spilled = True
                return
            self.messages.append(message)
            self._bytes += len(message.data)
            self.loaded_through = message.seq

    def unread(self) -> int:
        """Messages waiting to be read, in memory and on disk."""
        on_disk = 0
        if self.spilled:
            with contextlib.suppress(OSError, InternalError):
                on_disk = self._client.state.inbox_count(self._name, self.loaded_through)
        return len(self.messages) + on_disk

    def _over(self) -> bool:
        return len(self.messages) >= MEMORY_MESSAGES or self._bytes >= MEMORY_BYTES

    def _add_rows(self, rows: list[tuple[int, bytes, bytes]], bounded: bool = True) -> None:
        messages = [Message(self._name, s, AgentId.from_member_id(f), d) for s, f, d in rows]
        self.add(messages, bounded)

    def _read_back(self, filtered: bool) -> bool:
        """Moves the next stored messages from disk into memory; whether any came. A
        filtered read takes a page even past the bound: what its filter leaves unread
        stays in memory, and it must see what comes after."""
        if not self.spilled or (not filtered and self._over()):
            return False
        room = FILTERED_PAGE if filtered else MEMORY_MESSAGES - len(self.messages)
        try:
            rows = self._client.state.inbox(self._name, self.loaded_through, room)
        except (OSError, InternalError) as exc:
            log.warning("channel %s: could not read the inbox back: %s", self._name, exc)
            return False
        self.spilled = False  # add() sets it again if memory fills before the page ends
        self._add_rows(rows, bounded=not filtered)
        if len(rows) == room:
            self.spilled = True  # there may be more
        return bool(rows)

    def pop(self, accept: Accept | None, limit: int | None) -> list[Message]:
        """Takes up to ``limit`` buffered messages that ``accept`` wants, in order."""
        if len(self.messages) < MEMORY_MESSAGES // 2:
            self._read_back(filtered=False)
        taken = self._pop(accept, limit)
        while accept is not None and not taken and self._read_back(filtered=True):
            taken = self._pop(accept, limit)
        return taken

    def _pop(self, accept: Accept | None, limit: int | None) -> list[Message]:
        plain = self.messages
        if accept is None:
            count = len(plain) if limit is None else min(limit, len(plain))
            head = [plain.popleft() for _ in range(count)]
            self._bytes -= sum(len(m.data) for m in head)
            return head
        taken: list[Message] = []
        kept: list[Message] = []
        while plain and (limit is None or len(taken) < limit):
            message = plain.popleft()
            (taken if accept(message) else kept).append(message)
        plain.extendleft(reversed(kept))
        self._bytes -= sum(len(m.data) for m in taken)
        return taken

    def mark_consumed(self, taken: list[Message], stored: bool = True) -> None:
        # Deleting from the inbox per read would be a write per read: at most one delete
        # per CONSUMED_FLUSH messages or CONSUMED_FLUSH_SECONDS while reading, and when a
        # reader waits (the manager's listeners and close() flush what is left). A crash
        # can then hand out up to CONSUMED_FLUSH messages a second time, never lose one.
        # Messages handed over without the inbox (not ``stored``) only move the cursor.
        if stored:
            self.unflushed.extend(m.seq for m in taken)
        if (
            len(self.unflushed) >= CONSUMED_FLUSH
            or time.monotonic() - self.flushed_at >= CONSUMED_FLUSH_SECONDS
        ):
            self.flush()

    def outstanding(self) -> bool:
        """Whether reads or the cursor are not on disk yet."""
        return bool(self.unflushed) or self.cursor != self.saved_cursor

    def flush(self) -> None:
        """Everything before the oldest buffered message was read (messages are buffered
        in channel order), so that prefix goes in one range delete; what a filtered read
        took from further on goes by sequence number. The cursor goes in the same
        transaction."""
        cursor = self.cursor
        if not self.unflushed and cursor == self.saved_cursor:
            self.flushed_at = time.monotonic()  # nothing outstanding counts as recorded
            return
        if self.unflushed:
            through = self.messages[0].seq - 1 if self.messages else max(self.unflushed)
            extra = [seq for seq in self.unflushed if seq > through]
        else:
            through, extra = 0, []
        unflushed, self.unflushed = self.unflushed, []
        self.flushed_at = time.monotonic()
        try:
            self._client.state.consumed(self._name, through, extra, cursor)
        except (InternalError, OSError) as exc:
            # Only the record of what was read failed (disk full, I/O error); the
            # messages were handed over. Kept to record again on the next flush: a crash
            # meanwhile hands them out a second time, never loses one.
            self.unflushed = unflushed + self.unflushed
            error = InternalError(
                f"channel {self._name!r}: could not record which messages were read ({exc}); "
                "retried on the next read"
            )
            self._faults.set_record(error)
            log.warning("%s", error)
            return
        self._faults.set_record(None)
        self.saved_cursor = cursor

    def flush_if_due(self) -> None:
        """Records reads when the last record is older than CONSUMED_FLUSH_SECONDS."""
        if time.monotonic() - self.flushed_at >= CONSUMED_FLUSH_SECONDS:
            self.flush()
