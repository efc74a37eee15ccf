"""Reading a channel: what is buffered first, then deliveries processed on the reader's
behalf. Threads read with :meth:`Reader.read`; tasks on event loops (``svc_sdk.aio``)
drive :meth:`Reader.step` themselves, to wait without blocking their loop."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from svc_sdk._checks import check_wait
from svc_sdk.message import Accept, Message

if TYPE_CHECKING:
    from svc_sdk.channel import Channel

IDLE_FLUSH_SECONDS = 0.005  # a reader waiting this long records what it read
READ_WAKE = 0.5  # a waiting reader wakes at least this often (a missed wake-up costs this)


class Reader:
    """A channel's readers' side: every read, of any thread, goes through here."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def read(
        self, timeout: float | None, accept: Accept | None, limit: int | None
    ) -> list[Message]:
        check_wait(timeout, accept)
        channel = self._channel
        read = ReadState(None if timeout is None else time.monotonic() + timeout)
        while True:
            with channel._cond:
                taken = self.step(accept, limit, read)
                if taken is not None:
                    return taken
                if read.wait:
                    channel._cond.wait(read.wait)
                    continue
            handed = channel._deliveries.process_for(accept, limit)
            if handed:
                with channel._cond:
                    channel._inbox.mark_consumed(handed, stored=False)
                return handed

    def step(
        self, accept: Accept | None, limit: int | None, read: ReadState
    ) -> list[Message] | None:
        """One step of a read (threads' and tasks' alike). Caller holds ``_cond``.
        Returns what the read returns (messages, or [] once closed or timed out), or
        None: then wait ``read.wait`` seconds, or with ``read.wait == 0`` process the
        queued deliveries."""
        channel = self._channel
        read.wait = 0.0
        taken = channel._inbox.pop(accept, limit)
        if taken:
            channel._inbox.mark_consumed(taken)
            return taken
        if channel._closed is not None:
            return []
        if channel._raw:
            return None
        now = time.monotonic()
        remaining = None if read.deadline is None else read.deadline - now
        if remaining is not None and remaining <= 0:
            return []
        read.wait = READ_WAKE if remaining is None else min(remaining, READ_WAKE)
        if channel._inbox.outstanding():
            # Nothing to read: the moment to record what was read. Not at once: in a
            # conversation the next message is about a millisecond away, and the write
            # would compete with it for the CPU.
            read.idle_since = now if read.idle_since is None else read.idle_since
            if now - read.idle_since >= IDLE_FLUSH_SECONDS:
                channel._inbox.flush()
            else:
                read.wait = min(read.wait, IDLE_FLUSH_SECONDS)
        return None


class ReadState:
    """Where a read is: its deadline, since when it has been idle, and how long its
    next wait is (``Reader.step``)."""

    __slots__ = ("deadline", "idle_since", "wait")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.idle_since: float | None = None
        self.wait = 0.0
