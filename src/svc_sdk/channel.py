"""A channel: one MLS group on the relay, as a blocking, thread-safe object.

Deliveries from the relay are queued raw by the link's thread and processed in channel
order by whichever caller needs them next (an iterator, a send, a commit), under the
channel's lock. Commits from other members are applied on the way. A decrypted message
that a waiting reader takes at once goes straight to it; the others go into the inbox
and wait there for a reader. The engine writes its new state (the used message keys
gone) only after that: a crash before it leaves the messages decryptable again.

The cursor (the last sequence number handled) is written with inbox rows, and otherwise
when the reader is idle or after CONSUMED_FLUSH_SECONDS: if a crash loses that last write,
the relay sends those messages again, their keys are already used, and the engine skips
them. Nothing is lost and nothing is handed out twice.

Commits follow mls-rs's explicit states: a commit is pending until the relay accepts it
(apply) or another member's commit wins the epoch (clear, process theirs, try again).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import grpc

from svc_sdk._native import Group, PendingCommit, inspect
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk._waiters import AsyncWaiters
from svc_sdk.agent_id import AgentId
from svc_sdk.errors import (
    AccessError,
    ChannelClosedError,
    InternalError,
    MlsError,
    PayloadTooLargeError,
    PolicyError,
    SvcError,
    TransportError,
    relay_error,
)
from svc_sdk.health import ChannelHealth
from svc_sdk.outbox import Outbox
from svc_sdk.relay_client import RelayError

if TYPE_CHECKING:
    from svc_sdk.client import SvcClient

log = logging.getLogger("svc_sdk.channel")

STALE = grpc.StatusCode.FAILED_PRECONDITION.value[0]
# RFC 9420 §6: an MLSMessage starts with version (u16) and wire_format (u16);
# 5 is mls_key_package. The relay has already parsed and checked every message.
KEY_PACKAGE = b"\x00\x05"
#: The largest payload ``send`` takes. MLS pads what it encrypts so that only the two
#: most significant bits of its length show (mls-rs's step function): anything over
#: 896 KiB pads to a full 1 MiB and, with its framing, would exceed the relay's 1 MiB
#: message limit. 1 KiB is left for the signature and MLS framing inside the padding.
MAX_PAYLOAD = 896 * 1024 - 1024
COMMIT_ATTEMPTS = 20
CONSUMED_FLUSH = 256
CONSUMED_FLUSH_SECONDS = 0.1
IDLE_FLUSH_SECONDS = 0.005  # a reader waiting this long records what it read
READ_WAKE = 0.5  # a waiting reader wakes at least this often (a missed wake-up costs this)

# Which buffered messages a reader wants (adapters pick their protocol's envelopes).
Accept = Callable[["Message"], bool]


# A commit to send and the key packages it adds (the relay routes the Welcome to their
# verified owners).
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


class Channel:
    """An encrypted channel. Obtain one from :class:`SvcClient`::

    channel = client.create_channel("acme/support/triage")
    welcome = channel.add_member(key_package)
    channel.send(b"hello")
    for payload in channel.messages():
        ...
    """

    def __init__(
        self,
        client: SvcClient,
        name: str,
        group: Group,
        cursor: int,
        joined_epoch: int,
        inbox: list[tuple[int, bytes, bytes]],
    ) -> None:
        self.name = name
        self._client = client
        self._group = group
        # Handled through here (each message stored, handed out or skipped), and the part
        # of that on disk; see the module docstring.
        self._cursor = cursor
        self._saved_cursor = cursor
        self._joined_epoch = joined_epoch
        # Group state and draining, in order. Re-entrant: a commit drains while holding it.
        self._lock = threading.RLock()
        # Guards the queues below; never held while calling the engine or the relay.
        self._cond = threading.Condition()
        self._raw: deque[pb.Delivery] = deque()
        self._plain: deque[Message] = deque(
            Message(name, seq, AgentId.from_member_id(sender), data) for seq, sender, data in inbox
        )
        self._closed: SvcError | None = None
        # Readers on event loops (svc_sdk.aio), woken with the threads (see _notify).
        self._async_waiters = AsyncWaiters(self._cond)
        # Sequence numbers read but not yet deleted from the inbox (see _mark_consumed).
        self._unflushed: list[int] = []
        self._flushed_at = time.monotonic()
        self._flush_error: InternalError | None = None  # the last record of reads failed
        # The standing fault of storing what was received, and since when (see health()).
        self._store_error: InternalError | None = None
        self._failing_since: float | None = None
        self._join_requests: list[tuple[bytes, bytes]] = []
        # Sent messages the relay has not acknowledged (svc_sdk.outbox).
        self._outbox = Outbox(self)
        self._proposals = False
        self._in_commit = False

    def __repr__(self) -> str:
        return f"Channel({self.name!r})"

    # -- what the relay link calls (its thread; must not block) -------------------------

    def _deliver(self, items: list[pb.Delivery]) -> None:
        with self._cond:
            self._raw.extend(items)
            self._notify()

    def _notify(self) -> None:
        """Wakes every waiting reader: threads, and tasks on event loops (each woken on
        its own loop; a loop that closed meanwhile has no reader left). Caller holds
        ``_cond``."""
        self._cond.notify_all()
        self._async_waiters.wake_all()

    def _failed(self, error: SvcError) -> None:
        log.warning("channel %s: %s", self.name, error)
        self._close(error)

    # -- state -------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The MLS epoch: it advances with every accepted commit."""
        self._check_open()
        return self._group.epoch

    def members(self) -> list[AgentId]:
        """The current members (account and identity, as their credentials say), in leaf
        order."""
        with self._lock:
            self._check_open()
            self._drain_available()
            return [AgentId.from_member_id(m) for m in self._group.members()]

    def roles(self) -> dict[AgentId, str]:
        """Every member's role: "owner", "admin" or "member". Roles are part of the
        group's state: every member and the relay enforce the same rules (only the owner
        and admins add or remove others and change roles; docs/security.md)."""
        with self._lock:
            self._check_open()
            self._drain_available()
            roles = self._group.roles()
            return {AgentId.from_member_id(m): roles.role(m) for m in self._group.members()}

    def set_role(self, member: AgentId | bytes | str, role: str) -> None:
        """Gives a member ``role``: "admin", "member", or "owner" (the owner hands
        ownership over and becomes an admin). Only the owner and admins may; the owner's
        role changes only by the owner handing it over."""
        if role not in ("owner", "admin", "member"):
            raise ValueError(f"role must be 'owner', 'admin' or 'member', not {role!r}")
        member_id = self._member_id(member)
        self._commit(lambda: self._group.set_role(member_id, role))

    def set_members_invite(self, allowed: bool) -> None:
        """Whether plain members may create invites to this channel (default: only
        accounts with an owner or admin in it). Only the owner and admins may change it."""
        self._commit(lambda: self._group.set_members_invite(bool(allowed)))

    def _is_admin(self) -> bool:
        me = self._client.engine.member_id
        return me is not None and self._group.roles().role(me) != "member"

    @property
    def closed(self) -> bool:
        """Whether the channel was left, this agent removed, or the client closed."""
        return self._closed is not None

    def _check_open(self) -> None:
        if self._closed is not None:
            raise self._closed

    def _close(self, reason: SvcError) -> None:
        with self._cond:
            if self._closed is None:
                self._closed = reason
            self._notify()
        self._outbox.stop()  # what is unsent stays on disk for the next start

    # -- sending -----------------------------------------------------------------------

    def send(self, payload: bytes) -> None:
        """Encrypts ``payload`` for every member and returns once it is durably queued in
        this agent's outbox (``data_dir``); the relay stores it in the background, in
        send order, exactly once, also across reconnects and restarts. Blocks while the
        outbox is full (TransportError after the client's timeout). An error that comes
        after ``send()`` returned is raised by the next send, send_batch or
        :meth:`wait_stored`. Safe to call from any thread."""
        blob = _payload(payload)
        self._queue([blob])

    def send_batch(self, payloads: list[bytes]) -> None:
        """Sends several messages with one state write and one relay frame per 1,024.
        Returns once the relay stored them all, in order (like ``send`` followed by
        :meth:`wait_stored`, for these messages)."""
        if isinstance(cast(object, payloads), bytes | bytearray | memoryview | str):
            raise TypeError("send_batch takes a list of bytes; use send() for one message")
        blobs = [_payload(payload) for payload in payloads]
        if not blobs:
            self._outbox.raise_deferred()
            return
        last = self._queue(blobs)
        self._outbox.wait(last, self._client.timeout)

    def wait_stored(self, timeout: float | None = None) -> None:
        """Waits until the relay stored every message sent on this channel before the
        call (None: without a time limit), then raises any error that came after a
        ``send()`` returned. TransportError on timeout: the messages stay queued and are
        still sent. (Not :meth:`flush`, which records what was *read*.)"""
        _check_wait(timeout, None)
        self._outbox.wait(self._outbox.last_pos(), timeout)

    @property
    def unsent(self) -> int:
        """Messages sent on this channel that the relay has not acknowledged yet."""
        return len(self._outbox)

    def _queue(self, blobs: list[bytes]) -> int:
        """Encrypts and queues ``blobs`` in the outbox; returns the last one's position.
        The engine stores the outbox rows in the transaction that saves the ratchet
        state, before the ciphertexts exist anywhere else (docs/architecture.md)."""
        outbox = self._outbox
        outbox.raise_deferred()
        self._check_open()
        outbox.wait_for_room(len(blobs), sum(map(len, blobs)), self._client.timeout)
        outbox.raise_deferred()
        with self._lock:
            return self._queue_locked(blobs)

    def _queue_locked(self, blobs: list[bytes]) -> int:
        """The step of ``_queue`` that encrypts and writes. Caller holds ``_lock``."""
        self._check_open()
        self._drain_available()  # encrypt in the newest epoch we know of
        return self._outbox.add(blobs)

    # -- receiving ---------------------------------------------------------------------

    def messages(self, timeout: float | None = None) -> MessageIterator:
        """A blocking iterator over decrypted payloads. With ``timeout`` it also stops
        after that many seconds without a message."""
        _check_wait(timeout, None)
        return MessageIterator(self, timeout)

    def next_message(
        self, timeout: float | None = None, accept: Accept | None = None
    ) -> Message | None:
        """The next message, waiting up to ``timeout`` (None: until one arrives or the
        channel closes). None on timeout or once closed.

        With ``accept``, the next message it returns true for: the others stay buffered,
        in order, for other readers (this is how adapters share a channel)."""
        taken = self._read(timeout, accept, 1)
        return taken[0] if taken else None

    def next_messages(
        self, timeout: float | None = None, accept: Accept | None = None, limit: int | None = None
    ) -> list[Message]:
        """Waits up to ``timeout`` for a message like :meth:`next_message`, then returns
        every message available (at most ``limit``), in channel order; [] on timeout or
        once closed. The way to keep up with a busy channel: what it decrypts for the
        caller is handed over at once, without a round through the on-disk inbox.

        >>> while batch := channel.next_messages(timeout=5):
        ...     handle(batch)
        """
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ValueError(f"limit must be a positive integer or None, not {limit!r}")
        return self._read(timeout, accept, limit)

    def _read(
        self, timeout: float | None, accept: Accept | None, limit: int | None
    ) -> list[Message]:
        _check_wait(timeout, accept)
        read = _ReadState(None if timeout is None else time.monotonic() + timeout)
        while True:
            with self._cond:
                taken = self._read_step(accept, limit, read)
                if taken is not None:
                    return taken
                if read.wait:
                    self._cond.wait(read.wait)
                    continue
            handed = self._process_for(accept, limit)
            if handed:
                with self._cond:
                    self._mark_consumed(handed, stored=False)
                return handed

    def _read_step(
        self, accept: Accept | None, limit: int | None, read: _ReadState
    ) -> list[Message] | None:
        """One step of a read (threads' and tasks' alike). Caller holds ``_cond``.
        Returns what the read returns (messages, or [] once closed or timed out), or
        None: then wait ``read.wait`` seconds, or with ``read.wait == 0`` process the
        queued deliveries."""
        read.wait = 0.0
        taken = self._pop(accept, limit)
        if taken:
            self._mark_consumed(taken)
            return taken
        if self._closed is not None:
            return []
        if self._raw:
            return None
        now = time.monotonic()
        remaining = None if read.deadline is None else read.deadline - now
        if remaining is not None and remaining <= 0:
            return []
        read.wait = READ_WAKE if remaining is None else min(remaining, READ_WAKE)
        if self._outstanding():
            # Nothing to read: the moment to record what was read. Not at once: in a
            # conversation the next message is about a millisecond away, and the write
            # would compete with it for the CPU.
            read.idle_since = now if read.idle_since is None else read.idle_since
            if now - read.idle_since >= IDLE_FLUSH_SECONDS:
                self._flush_consumed()
            else:
                read.wait = min(read.wait, IDLE_FLUSH_SECONDS)
        return None

    def _pop(self, accept: Accept | None, limit: int | None) -> list[Message]:
        """Takes up to ``limit`` buffered messages that ``accept`` wants, in order."""
        plain = self._plain
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

    def _wait_for_deliveries(self, timeout: float) -> bool:
        """Waits up to ``timeout`` for unprocessed deliveries (for listener threads)."""
        with self._cond:
            if not self._raw and self._closed is None:
                self._cond.wait(timeout)
            return bool(self._raw)

    def _pending_count(self) -> int:
        """Decrypted messages waiting to be read."""
        with self._cond:
            return len(self._plain)

    def _mark_consumed(self, taken: list[Message], stored: bool = True) -> None:
        # Deleting from the inbox per read would be a write per read: at most one delete
        # per CONSUMED_FLUSH messages or CONSUMED_FLUSH_SECONDS while reading, and when a
        # reader waits (the manager's listeners and close() flush what is left). A crash
        # can then hand out up to CONSUMED_FLUSH messages a second time, never lose one.
        # Messages handed over without the inbox (not ``stored``) only move the cursor.
        if stored:
            self._unflushed.extend(m.seq for m in taken)
        if (
            len(self._unflushed) >= CONSUMED_FLUSH
            or time.monotonic() - self._flushed_at >= CONSUMED_FLUSH_SECONDS
        ):
            self._flush_consumed()

    def _outstanding(self) -> bool:
        """Whether reads or the cursor are not on disk yet. Caller holds ``_cond``."""
        return bool(self._unflushed) or self._cursor != self._saved_cursor

    def _flush_consumed(self) -> None:
        """Caller holds ``_cond``. Everything before the oldest buffered message was read
        (messages are buffered in channel order), so that prefix goes in one range delete;
        what a filtered read took from further on goes by sequence number. The cursor
        goes in the same transaction."""
        cursor = self._cursor
        if not self._unflushed and cursor == self._saved_cursor:
            self._flushed_at = time.monotonic()  # nothing outstanding counts as recorded
            return
        if self._unflushed:
            through = self._plain[0].seq - 1 if self._plain else max(self._unflushed)
            extra = [seq for seq in self._unflushed if seq > through]
        else:
            through, extra = 0, []
        unflushed, self._unflushed = self._unflushed, []
        self._flushed_at = time.monotonic()
        try:
            self._client.state.consumed(self.name, through, extra, cursor)
        except (sqlite3.Error, OSError) as exc:
            # Only the record of what was read failed (disk full, I/O error); the
            # messages were handed over. Kept to record again on the next flush: a crash
            # meanwhile hands them out a second time, never loses one.
            self._unflushed = unflushed + self._unflushed
            self._flush_error = InternalError(
                f"channel {self.name!r}: could not record which messages were read ({exc}); "
                "retried on the next read"
            )
            self._failing_since = self._failing_since or time.time()
            log.warning("%s", self._flush_error)
            return
        self._flush_error = None
        if self._store_error is None:
            self._failing_since = None
        self._saved_cursor = cursor

    def health(self) -> ChannelHealth:
        """Whether this channel stores what it receives, and what waits: a standing
        storage fault shows here until storing works again (the reading calls raise it
        too), so an application learns of a full disk without reading a log.

        >>> if not channel.health().ok:
        ...     alert(channel.health().storage_error)
        """
        fault = self._store_error or self._flush_error
        with self._cond:
            backlog, unread, closed = len(self._raw), len(self._plain), self._closed
        return ChannelHealth(
            name=self.name,
            storage_error=None if fault is None else str(fault),
            failing_since=None if fault is None else self._failing_since,
            backlog=backlog,
            unread=unread,
            closed=None if closed is None else str(closed),
        )

    def flush(self) -> None:
        """Records now which messages were read and how far the channel was handled (also
        done by close() and by waiting readers); InternalError if the write fails."""
        with self._cond:
            self._flush_consumed()
            if self._flush_error is not None:
                raise self._flush_error

    def _flush_if_due(self) -> None:
        """For the manager's idle listeners: records reads when the last record is older
        than CONSUMED_FLUSH_SECONDS. A failure is logged and retried on the next one."""
        with self._cond:
            if time.monotonic() - self._flushed_at >= CONSUMED_FLUSH_SECONDS:
                self._flush_consumed()

    def _process_for(self, accept: Accept | None, limit: int | None) -> list[Message]:
        """Processes deliveries on behalf of a waiting reader until some are for it: up
        to ``limit`` of those are handed to it and never written to the inbox. Later
        deliveries stay queued for the next read, still encrypted."""
        with self._lock:
            handed = self._process_locked(accept, limit)
        self._do_pending_work()
        return handed

    def _process_locked(self, accept: Accept | None, limit: int | None) -> list[Message]:
        """The part of ``_process_for`` that needs no relay. Caller holds ``_lock``."""
        reader: Accept = accept or _any
        handed: list[Message] = []
        while not handed and self._closed is None:
            items = self._take_raw()
            if not items:
                break
            handed = self._handle(items, reader, limit)
        return handed

    def _has_pending_work(self) -> bool:
        """Whether ``_do_pending_work`` has commits to make (they need the relay)."""
        return bool(self._join_requests or self._proposals) and self._closed is None

    def _process_pending(self) -> None:
        """Processes everything the relay delivered so far (commits, messages, join
        requests). Reading and sending do this by themselves."""
        with self._lock:
            if self._closed is None:
                self._drain_available()
        self._do_pending_work()

    def _take_raw(self, limit: int = 4096) -> list[pb.Delivery]:
        with self._cond:
            if len(self._raw) <= limit:
                items = list(self._raw)
                self._raw.clear()
            else:
                items = [self._raw.popleft() for _ in range(limit)]
            return items

    def _drain_available(self) -> None:
        """Processes every queued delivery. Caller holds ``_lock``."""
        while True:
            items = self._take_raw()
            if not items:
                return
            self._handle(items)

    def _handle(
        self, items: list[pb.Delivery], reader: Accept | None = None, limit: int | None = None
    ) -> list[Message]:
        """Processes deliveries in order. With ``reader`` (a reader is waiting, and none
        of the buffered messages is for it), returns the first ``limit`` messages it
        accepts instead of buffering and storing them.

        If storing fails (disk full, I/O error), the group returns to its stored state,
        the deliveries not yet durable go back to the front of the queue, and the caller
        gets an InternalError: nothing decrypted is lost, and the next read or send
        processes them again."""
        progress = _Progress()
        try:
            handed = self._handle_items(items, reader, limit, progress)
        except (InternalError, sqlite3.Error, OSError) as exc:
            rest = items[progress.durable :]
            with contextlib.suppress(InternalError, MlsError):
                self._group.discard_unsaved()
            with self._cond:
                self._raw.extendleft(reversed(rest))
            detail = str(exc).removeprefix("runtime error: ")
            error = InternalError(
                f"channel {self.name!r}: could not store what it received ({detail}); "
                f"nothing is lost: {len(rest)} deliveries are processed again once storage "
                "works"
            )
            self._store_error = error
            self._failing_since = self._failing_since or time.time()
            raise error from None
        self._store_error = None
        if self._flush_error is None:
            self._failing_since = None
        return handed

    def _handle_items(
        self,
        items: list[pb.Delivery],
        reader: Accept | None,
        limit: int | None,
        progress: _Progress,
    ) -> list[Message]:
        me = self._client.member_id
        group = self._group
        run: list[pb.Delivery] = []
        received: list[Message] = []
        stored = 0  # how many of ``received`` the inbox holds
        removed = False

        def flush_run() -> None:
            nonlocal removed
            if not run:
                return
            # Written by save() below, once what it decrypts is stored or handed over.
            results = group.process_batch([item.message for item in run], save=False)
            for item, result in zip(run, results, strict=True):
                if isinstance(result, InternalError):
                    raise result  # storage, not the message: handled by _handle
                if isinstance(result, MlsError):
                    # A message this agent cannot read: from before it joined, a replay
                    # after a sender's reconnect, or hostile. Skipped, never fatal.
                    log.debug("channel %s seq %d skipped: %s", self.name, item.seq, result)
                elif result.kind == "application":
                    assert result.data is not None
                    assert result.sender is not None
                    sender = AgentId.from_member_id(result.sender)
                    received.append(Message(self.name, item.seq, sender, result.data))
                elif result.kind == "commit":
                    self._proposals = False
                    removed = removed or result.self_removed
                elif result.kind == "proposal":
                    self._proposals = True
            run.clear()

        def store(through: int) -> None:
            """Stores what was decrypted from items[:through] before the engine's state
            is written: the inbox is never behind the stored state."""
            nonlocal stored
            if through and stored < len(received):
                rows = [(m.seq, m.sender.member_id, m.data) for m in received[stored:]]
                self._client.state.advance(self.name, items[through - 1].seq, rows)
                stored = len(received)
                self._saved_cursor = items[through - 1].seq

        def publish_stored() -> None:
            """Once the engine's state is written too, the stored messages are readers'."""
            nonlocal received, stored
            if stored:
                with self._cond:
                    self._plain.extend(received[:stored])
                    self._notify()
                received, stored = received[stored:], 0

        for index, item in enumerate(items):
            if removed:
                break
            if item.message[2:4] == KEY_PACKAGE:
                flush_run()
                # An invite redemption: its agent is added if this one is the owner or an
                # admin (_next_admission; see join_with_token).
                self._join_requests.append((item.sender, item.message))
                continue
            if item.epoch < self._joined_epoch:
                continue  # from before this agent joined
            if item.handshake and group.has_pending_commit and item.epoch == group.epoch:
                flush_run()
                store(index)  # the commit below writes the engine's state
                if item.sender == me:
                    # Our own commit, echoed: the relay accepted it (we lost the Reply).
                    group.apply_pending_commit()
                    progress.durable = index + 1
                    publish_stored()
                    self._proposals = False
                    continue
                group.clear_pending_commit()  # another member's commit won this epoch
                progress.durable = index
                publish_stored()
            elif item.handshake and item.sender == me:
                continue  # our own commit, already applied when the relay acknowledged it
            run.append(item)
        flush_run()
        handed: list[Message] = []
        if reader is not None and len(received) > stored:
            with self._cond:
                if not any(reader(m) for m in self._plain):
                    kept = received[:stored]
                    for message in received[stored:]:
                        if reader(message) and (limit is None or len(handed) < limit):
                            handed.append(message)
                        else:
                            kept.append(message)
                    received = kept
        cursor = items[-1].seq
        # Stored before the engine's state moves on on disk: a crash in between leaves
        # them decryptable again (the cursor has not moved), never lost.
        store(len(items))
        group.save()
        progress.durable = len(items)
        self._cursor = cursor
        with self._cond:
            self._plain.extend(received)
            if received:
                self._notify()
        if removed:
            self._client._forget(self, ChannelClosedError(f"removed from channel {self.name!r}"))
        return handed

    # -- membership (commits) ----------------------------------------------------------

    def add_member(self, key_package: bytes) -> bytes:
        """Adds the agent whose MLS key package this is; returns the Welcome to hand to
        it, once the relay accepted the commit. If another member's commit wins the
        epoch first, that commit is processed and this one retried."""
        if not isinstance(key_package, bytes | bytearray | memoryview):
            raise TypeError(f"key_package must be bytes, not {type(key_package).__name__}")
        kp = bytes(key_package)
        info = inspect(kp)
        if info.wire_format != "key_package":
            raise MlsError(f"expected a key package, got a {info.wire_format}")
        pending = self._commit(lambda: self._group.add_members([kp]))
        assert pending is not None and pending.welcome is not None
        return pending.welcome

    def remove_member(self, member: AgentId | bytes | str) -> None:
        """Removes a member; it can no longer read what is sent afterwards. ``member`` is
        an :class:`AgentId`, or an identity (bytes or str) that exactly one member has."""
        member_id = self._member_id(member)
        self._commit(lambda: self._group.remove_members([member_id]))

    def _member_id(self, member: AgentId | bytes | str) -> bytes:
        if isinstance(member, AgentId):
            return member.member_id
        if isinstance(member, str):
            member = member.encode()
        if not isinstance(member, bytes | bytearray | memoryview):
            raise TypeError(f"member must be an AgentId, bytes or str, not {type(member).__name__}")
        identity = bytes(member)
        found = [m for m in self.members() if m.identity == identity]
        if len(found) > 1:
            raise MlsError(
                f"{identity!r} names {len(found)} members of different "
                f"accounts ({', '.join(map(str, found))}); pass the AgentId"
            )
        if not found:
            raise MlsError(f"{identity!r} is not a member of this channel")
        return found[0].member_id

    def update_keys(self) -> None:
        """Refreshes this agent's keys (an MLS update): post-compromise security."""
        self._commit(self._group.self_update)

    def leave(self, timeout: float = 5.0) -> None:
        """Leaves the channel: asks the other members (an MLS remove proposal) to commit
        this agent's removal, waits up to ``timeout`` for it, then forgets the channel and
        its keys. If no member is online, the local state is deleted anyway."""
        with self._lock:
            self._check_open()
            self._drain_available()
            me = self._client.engine.member_id
            owner = me is not None and self._group.roles().role(me) == "owner"
            if owner and len(self._group.members()) > 1:
                raise AccessError(
                    f"channel {self.name!r}: the owner cannot leave; hand ownership over "
                    "first (set_role(member, 'owner'))"
                )
            proposal = self._group.propose_leave()
            self._relay(publish=pb.Publish(channel=self.name, message=[proposal]))
        deadline = time.monotonic() + timeout
        while self._closed is None and time.monotonic() < deadline:
            with self._cond:
                if not self._raw:
                    self._cond.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            self._process_pending()
        if self._closed is None:
            self._client._forget(self, ChannelClosedError(f"left channel {self.name!r}"))

    def _relay(self, retry: bool = True, **kind: Any) -> pb.Reply:
        return self._client._request(self.name, retry, **kind)

    def _commit(self, make: Callable[[], PendingCommit | None]) -> PendingCommit | None:
        """Builds a commit with ``make`` (None: nothing to do any more) and gets it
        accepted, retrying when another member's commit wins the epoch."""
        link = self._client.link
        with self._lock:
            self._check_open()
            self._in_commit = True
            try:
                refreshed = False
                for _ in range(COMMIT_ATTEMPTS):
                    self._drain_available()
                    self._check_open()
                    if self._group.has_pending_commit:
                        self._settle()  # left by a crash or a lost connection
                    try:
                        pending = make()
                    except PolicyError:
                        # The engine judges the policy on this agent's copy of the group:
                        # a role granted by a commit the relay accepted but this agent
                        # has not received yet counts once it has caught up.
                        if refreshed:
                            raise
                        refreshed = True
                        head = self._relay(create=pb.CreateChannel(channel=self.name))
                        if head.epoch <= self._group.epoch:
                            raise
                        self._catch_up(head.epoch)
                        continue
                    if pending is None:
                        return None
                    frame = pb.Commit(
                        channel=self.name,
                        epoch=pending.epoch,
                        commit=pending.commit,
                        welcome=pending.welcome or b"",
                    )
                    try:
                        reply = self._client.wait(
                            link.submit(
                                link.request(self._client.timeout, retry=False, commit=frame)
                            )
                        )
                    except RelayError as exc:
                        self._group.clear_pending_commit()
                        if exc.code != STALE:
                            raise relay_error(exc, self.name) from None
                        self._catch_up(exc.reply.epoch)
                        continue
                    except TransportError:
                        # Unknown outcome: the log says (our own commits are echoed).
                        if self._settle():
                            return pending
                        continue
                    # What the relay ordered before the commit was sent in the epoch it
                    # ends: read it in that epoch (mls-rs refuses a past epoch's message
                    # from a leaf the commit changed, e.g. a member it removes), then
                    # apply the commit with its echo.
                    with contextlib.suppress(TransportError):
                        self._client.wait(
                            link.submit(
                                link.wait_received(self.name, reply.seq, self._client.timeout)
                            )
                        )
                    self._drain_available()
                    if self._group.has_pending_commit:
                        self._group.apply_pending_commit()
                    self._proposals = False
                    return pending
                raise TransportError(
                    f"channel {self.name!r}: commit kept losing to other members' commits"
                )
            finally:
                self._in_commit = False

    def _catch_up(self, epoch: int) -> None:
        """Processes deliveries until the group reaches ``epoch``. Caller holds the lock."""
        deadline = time.monotonic() + self._client.timeout
        while self._group.epoch < epoch:
            if time.monotonic() > deadline:
                raise TransportError(
                    f"channel {self.name!r}: the relay did not deliver the commit for epoch "
                    f"{epoch - 1} in time"
                )
            with self._cond:
                if not self._raw:
                    self._cond.wait(0.05)
            self._drain_available()
            self._check_open()

    def _settle(self) -> bool:
        """A pending commit whose outcome is unknown: read the log up to the relay's head.
        Our echoed commit applies it (True); another member's clears it. If neither came,
        it was never stored: drop it (False) so the caller builds a new one."""
        link = self._client.link
        reply = self._relay(create=pb.CreateChannel(channel=self.name))  # head_seq: the head
        self._client.wait(link.submit(link.wait_received(self.name, reply.head_seq, 30.0)))
        epoch = self._group.epoch
        self._drain_available()
        if self._group.has_pending_commit:
            self._group.clear_pending_commit()
            return False
        return self._group.epoch > epoch and not self._closed

    def _do_pending_work(self) -> None:
        """Adds agents that redeemed invites and commits members' leave proposals."""
        if self._in_commit or self._closed is not None:
            return
        try:
            while self._join_requests and self._closed is None:
                if self._commit(self._next_admission) is None:
                    break
            if self._proposals and self._closed is None:
                self._commit(self._commit_proposals)
        except SvcError as exc:  # MlsError included
            log.warning("channel %s: %s", self.name, exc)

    def _next_admission(self) -> PendingCommit | None:
        if not self._is_admin():
            # Only the owner and admins add members; a redemption is for them to act on.
            self._join_requests.clear()
            return None
        members = set(self._group.members())
        self._join_requests = [(w, kp) for w, kp in self._join_requests if w not in members]
        # One commit per joiner: a bad key package cannot hold up the others.
        while self._join_requests:
            who, kp = self._join_requests[0]
            try:
                return self._group.add_members([kp])
            except MlsError as exc:
                log.warning("channel %s: join request from %r dropped: %s", self.name, who, exc)
                self._join_requests.pop(0)
        return None

    def _commit_proposals(self) -> PendingCommit | None:
        return self._group.self_update() if self._proposals else None


class _ReadState:
    """Where a read is: its deadline, since when it has been idle, and how long its
    next wait is (``Channel._read_step``)."""

    __slots__ = ("deadline", "idle_since", "wait")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.idle_since: float | None = None
        self.wait = 0.0


class _Progress:
    """How many of a batch's deliveries are durable: decrypted messages in the inbox and
    the engine's state written (``Channel._handle``)."""

    __slots__ = ("durable",)

    def __init__(self) -> None:
        self.durable = 0


def _any(message: Message) -> bool:
    return True


def _check_wait(timeout: object, accept: object) -> None:
    """A reader's ``timeout`` (seconds ≥ 0, or None to wait until a message or the
    channel's end) and ``accept`` (a callable, or None for every message)."""
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise TypeError(f"timeout must be seconds or None, not {type(timeout).__name__}")
        if not timeout >= 0:  # also catches NaN
            raise ValueError(f"timeout must be 0 or more seconds, not {timeout}")
    if accept is not None and not callable(accept):
        raise TypeError(f"accept must be a callable or None, not {type(accept).__name__}")


def _payload(payload: object) -> bytes:
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
    if len(payload) > MAX_PAYLOAD:
        raise PayloadTooLargeError(
            f"payload is {len(payload)} bytes; the limit is {MAX_PAYLOAD} "
            "(the relay's 1 MiB message limit, less MLS padding and framing)"
        )
    return bytes(payload)
