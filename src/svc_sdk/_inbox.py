"""A channel's decrypted messages waiting for a reader, and the record on disk of what
was read and how far the channel was handled.

The cursor (the last sequence number handled) is written with inbox rows, and otherwise
when the reader is idle or after CONSUMED_FLUSH_SECONDS: if a crash loses that last write,
the relay sends those messages again, their keys are already used, and the engine skips
them. Nothing is lost and nothing is handed out twice.
"""

from __future__ import annotations

import logging
import sqlite3
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
        self.messages: deque[Message] = deque(
            Message(name, seq, AgentId.from_member_id(sender), data) for seq, sender, data in rows
        )
        # Handled through here (each message stored, handed out or skipped), and the part
        # of that on disk; see the module docstring.
        self.cursor = cursor
        self.saved_cursor = cursor
        # Sequence numbers read but not yet deleted from the inbox (see mark_consumed).
        self.unflushed: list[int] = []
        self.flushed_at = time.monotonic()

    def pop(self, accept: Accept | None, limit: int | None) -> list[Message]:
        """Takes up to ``limit`` buffered messages that ``accept`` wants, in order."""
        plain = self.messages
        if accept is None:
            count = len(plain) if limit is None else min(limit, len(plain))
            return [plain.popleft() for _ in range(count)]
        taken: list[Message] = []
        kept: list[Message] = []
        while plain and (limit is None or len(taken) < limit):
            message = plain.popleft()
            (taken if accept(message) else kept).append(message)
        plain.extendleft(reversed(kept))
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
        except (InternalError, sqlite3.Error, OSError) as exc:
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
