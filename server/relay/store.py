"""The per-channel log: what every backend (SQLite, Redis) provides."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored message. ``epoch`` is the epoch the message was sent in; a handshake
    (commit) entry moved the channel to ``epoch + 1``."""

    channel: str
    seq: int
    sender: bytes
    handshake: bool
    epoch: int
    message: bytes
    stored_at: float


#: Pending Welcomes handed to an agent when it connects: the newest ones. Older ones are
#: for key packages it has long replaced (and expire with retention anyway).
MAX_PENDING_WELCOMES = 64


@dataclass(frozen=True, slots=True)
class WelcomeEntry:
    channel: str
    recipient: bytes
    seq: int
    epoch: int
    welcome: bytes


class CommitRejected(Exception):
    """Another commit already moved the channel past this epoch."""

    def __init__(self, current_epoch: int) -> None:
        super().__init__(f"commit is for a stale epoch; the channel is at epoch {current_epoch}")
        self.current_epoch = current_epoch


class StaleMessages(Exception):
    """Application messages of an epoch the channel has left: a commit was stored first.
    The members of the new epoch may not be able to read them (a removed sender's never
    are), so they are refused, and the sender re-encrypts them in the new epoch."""

    def __init__(self, current_epoch: int) -> None:
        super().__init__(
            f"messages are for a past epoch; the channel is at epoch {current_epoch}: "
            "process its commits and send them again"
        )
        self.current_epoch = current_epoch


class Pipeline:
    """The appends of one stream to one channel, which the stream sends without waiting
    for each to be stored. Once one of them fails to be stored (not a refusal such as
    StaleMessages: the store did not answer), the store fails every later one with
    PipelineBroken without storing it: stored after the failed one, which its sender
    sends again, it would overtake it. Read and written only where the store orders its
    writes (its writer, under its lock)."""

    __slots__ = ("broken",)

    def __init__(self) -> None:
        self.broken = False


class PipelineBroken(Exception):
    """Not stored: an earlier append of the same pipeline failed (see Pipeline)."""

    def __init__(self) -> None:
        super().__init__("an earlier message of this stream to the channel was not stored")


class GroupConflict(Exception):
    """The channel's stored group changed since it was loaded (another relay process, or
    a concurrent request, stored a newer state first)."""

    def __init__(self, channel: str) -> None:
        super().__init__(f"the group of channel {channel!r} changed meanwhile; retry")


class CursorExpired(Exception):
    """Messages after the cursor were removed by retention."""

    def __init__(self, trimmed_through: int) -> None:
        super().__init__(
            f"messages up to seq {trimmed_through} were removed by retention; "
            "the agent must rejoin the channel"
        )
        self.trimmed_through = trimmed_through


EntrySink = Callable[[Sequence[Entry], Sequence[WelcomeEntry]], None]


class LogStore(Protocol):
    """Stores and orders messages. Every stored entry (and Welcome) is also handed, in
    sequence order, to the sink set with ``set_sink`` once it is durable."""

    def set_sink(self, sink: EntrySink) -> None: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def head(self, channel: str) -> tuple[int, int]:
        """(newest seq, current epoch); (0, 0) for a channel with no messages yet."""
        ...

    def append(self, channel: str, sender: bytes, message: bytes, epoch: int) -> Awaitable[Entry]:
        """Queues the message for storing *now*, so appends keep the order of the calls
        even when callers do not wait; the result resolves once the entry is durable."""
        ...

    def append_many(
        self,
        channel: str,
        sender: bytes,
        messages: Sequence[tuple[bytes, int]],
        ids: Sequence[bytes] = (),
        pipeline: Pipeline | None = None,
    ) -> asyncio.Future[list[Entry]]:
        """``append`` for several (message, epoch) pairs at once, stored consecutively;
        one result (an entry per message) for all of them. StaleMessages unless every
        message to store is of the channel's current epoch; PipelineBroken if an earlier
        append of ``pipeline`` failed.

        ``ids``: none, or one per message. A message whose id ``sender`` already stored in
        ``channel`` (and that retention has not trimmed) is not stored again: its entry
        carries the original seq. That check is atomic with the append and comes before
        the epoch check, so a resend re-encrypted in a later epoch still finds its
        original."""
        ...

    async def commit(
        self,
        channel: str,
        sender: bytes,
        epoch: int,
        commit: bytes,
        welcome: bytes,
        joiners: Sequence[bytes],
        group: tuple[int, bytes],
    ) -> Entry:
        """Appends the commit and stores the group state it leads to, if ``epoch`` is
        current and the stored group is still at version ``group[0]``; else raises
        CommitRejected. ``group[1]`` becomes version ``group[0] + 1``."""
        ...

    async def propose(
        self, channel: str, sender: bytes, epoch: int, proposal: bytes, group: tuple[int, bytes]
    ) -> Entry:
        """Appends a member's proposal and stores the group state that holds it, as one
        step: only while ``epoch`` is current (else StaleMessages) and the stored group is
        still at version ``group[0]`` (else GroupConflict). The tracked group then never
        holds a proposal that is not in the log, where the members find it."""
        ...

    async def create_group(self, channel: str, state: bytes) -> int:
        """Stores a new channel's tracked group; its version (1, or one past a group
        dropped before: a version is never reused, so no relay process mistakes its
        cached copy of a dropped group for the new one), or 0 if the channel has one."""
        ...

    async def drop_group(self, channel: str, version: int) -> bool:
        """Drops the channel's tracked group if it is still the one ``create_group``
        stored as ``version`` and nothing is in the channel's log: a creation that could
        not be finished. False if it was not dropped."""
        ...

    async def group_version(self, channel: str) -> int:
        """The stored group's version; 0 if the channel has none."""
        ...

    async def group(self, channel: str) -> tuple[int, bytes] | None:
        """(version, state) of the channel's tracked group."""
        ...

    async def read(
        self, channel: str, after_seq: int, limit: int, max_bytes: int | None = None
    ) -> list[Entry]:
        """Up to ``limit`` entries after ``after_seq``, in order, and with ``max_bytes``
        none after the one whose message takes them to ``max_bytes`` (so a page that
        stopped for its bytes holds at least that many); CursorExpired if some were
        trimmed."""
        ...

    async def welcomes(self, recipient: bytes) -> list[WelcomeEntry]: ...

    async def trim(self, older_than: float) -> int:
        """Removes entries stored before ``older_than`` (epoch seconds); returns how many."""
        ...

    def watch(self, channel: str, after_seq: int) -> None:
        """Local subscribers want this channel's new entries (from ``after_seq`` on)."""
        ...

    def unwatch(self, channel: str) -> None: ...
