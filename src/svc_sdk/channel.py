"""A channel: one MLS group on the relay, as a blocking, thread-safe object.

:class:`Channel` holds the group, its lock and its queues, and the public API. Its
collaborators, each in a module of its own, do the rest: processing deliveries
(``_deliveries``), the inbox and the record of what was read (``_inbox``), commits
(``_commits``) and the commits it makes on its own (``_admissions``); what is sent
waits in the outbox (``outbox``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, cast

from svc_sdk._admissions import Admissions
from svc_sdk._checks import MAX_PAYLOAD, check_payload, check_wait
from svc_sdk._commits import Commits
from svc_sdk._deliveries import Deliveries
from svc_sdk._inbox import Inbox, StorageFaults
from svc_sdk._native import Group, inspect
from svc_sdk._reader import Reader
from svc_sdk._waiters import AsyncWaiters
from svc_sdk.agent_id import AgentId
from svc_sdk.errors import (
    AccessError,
    ChannelClosedError,
    MlsError,
    SvcError,
    TransportError,
)
from svc_sdk.health import ChannelHealth
from svc_sdk.message import Accept, Message, MessageIterator
from svc_sdk.outbox import Outbox
from svc_sdk.relay_frames import Reply, Request

if TYPE_CHECKING:
    from svc_sdk.client import SvcClient
    from svc_sdk.relay_frames import Delivery

__all__ = ["MAX_PAYLOAD", "Accept", "Channel", "Message", "MessageIterator"]

log = logging.getLogger("svc_sdk.channel")

# The bound on deliveries received but not processed yet (``Channel._raw``): past it the
# relay link pauses the channel's subscription, and resubscribes after the last seq it
# handed over once readers took the backlog down to half of both. The relay keeps the
# messages meanwhile, so a member that sends faster than this agent reads costs the
# agent about this much memory at most (plus the one relay frame, up to 256 deliveries
# and about 256 KiB, that crossed it). 4 MiB is 256 messages of 16 KiB; 4,096 deliveries
# of a few hundred bytes hold under 2 MiB (measured as RSS). The half left when it
# resumes keeps a reader busy while the new subscription's first frame comes back (a
# round trip and a log read), so a reader that is the bottleneck does not wait for it.
# A pause drops what the relay had already sent (it comes again from the log): with a
# bound of 1 MiB, 16 KiB messages paused so often that the relay spent three times the
# CPU per message (docs/performance-log.md).
BACKLOG_MESSAGES = 4096
BACKLOG_BYTES = 4 * 1024 * 1024


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
        self._joined_epoch = joined_epoch
        # Group state and draining, in order. Re-entrant: a commit drains while holding it.
        self._lock = threading.RLock()
        # Guards the queues below; never held while calling the engine or the relay.
        self._cond = threading.Condition()
        self._raw: deque[Delivery] = deque()
        self._raw_bytes = 0  # the sum of _raw's message sizes
        self._paused = False  # _raw went over the bound: resume once it is drained
        # The standing faults of storing what was received and what was read (health()).
        self._faults = StorageFaults()
        self._inbox = Inbox(client, name, cursor, inbox, self._faults)
        self._closed: SvcError | None = None
        # Readers on event loops (svc_sdk.aio), woken with the threads (see _notify).
        self._async_waiters = AsyncWaiters(self._cond)
        self._deliveries = Deliveries(self)
        self._reader = Reader(self)
        self._commits = Commits(self)
        self._admissions = Admissions(self)
        # Sent messages the relay has not acknowledged (svc_sdk.outbox).
        self._outbox = Outbox(self)

    def __repr__(self) -> str:
        return f"Channel({self.name!r})"

    # -- what the relay link calls (its thread; must not block) -------------------------

    def _deliver(self, items: list[Delivery]) -> bool:
        """Queues deliveries; True if the backlog is over its bound (the link pauses)."""
        size = sum(len(item.message) for item in items)
        with self._cond:
            self._raw.extend(items)
            self._raw_bytes += size
            self._notify()
            if len(self._raw) > BACKLOG_MESSAGES or self._raw_bytes > BACKLOG_BYTES:
                self._paused = True
                return True
            return False

    def _took(self, items: list[Delivery]) -> bool:
        """Accounts for ``items`` taken from ``_raw``; True if that drained a paused
        backlog enough to resume (the caller calls :meth:`_resume`). Caller holds
        ``_cond``."""
        if self._raw:
            self._raw_bytes -= sum(len(item.message) for item in items)
        else:
            self._raw_bytes = 0
        if (
            self._paused
            and len(self._raw) <= BACKLOG_MESSAGES // 2
            and self._raw_bytes <= BACKLOG_BYTES // 2
        ):
            self._paused = False
            return True
        return False

    def _resume(self) -> None:
        """Asks the link for the deliveries after the backlog (not holding ``_cond``)."""
        link = getattr(self._client, "link", None)
        if link is not None:
            link.resume(self.name)

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

    @property
    def cipher_suite(self) -> int:
        """The channel's MLS cipher suite: 1, or ``PQ_CIPHER_SUITE`` (65100) for a
        post-quantum channel (``create_channel(..., cipher_suite=...)``)."""
        self._check_open()
        return self._group.cipher_suite

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
        self._commits.commit(lambda: self._group.set_role(member_id, role))

    def set_members_invite(self, allowed: bool) -> None:
        """Whether plain members may create invites to this channel (default: only
        accounts with an owner or admin in it). Only the owner and admins may change it."""
        self._commits.commit(lambda: self._group.set_members_invite(bool(allowed)))

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
        blob = check_payload(payload)
        self._queue([blob])

    def send_batch(self, payloads: list[bytes]) -> None:
        """Sends several messages with one state write and one relay frame per 1,024.
        Returns once the relay stored them all, in order (like ``send`` followed by
        :meth:`wait_stored`, for these messages)."""
        if isinstance(cast(object, payloads), bytes | bytearray | memoryview | str):
            raise TypeError("send_batch takes a list of bytes; use send() for one message")
        blobs = [check_payload(payload) for payload in payloads]
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
        check_wait(timeout, None)
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
        check_wait(timeout, None)
        return MessageIterator(self, timeout)

    def next_message(
        self, timeout: float | None = None, accept: Accept | None = None
    ) -> Message | None:
        """The next message, waiting up to ``timeout`` (None: until one arrives or the
        channel closes). None on timeout or once closed.

        With ``accept``, the next message it returns true for: the others stay buffered,
        in order, for other readers (this is how adapters share a channel)."""
        taken = self._reader.read(timeout, accept, 1)
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
        return self._reader.read(timeout, accept, limit)

    def _pending_count(self) -> int:
        """Decrypted messages waiting to be read."""
        with self._cond:
            return self._inbox.unread()

    def health(self) -> ChannelHealth:
        """Whether this channel stores what it receives, and what waits: a standing
        storage fault shows here until storing works again (the reading calls raise it
        too), so an application learns of a full disk without reading a log.

        >>> if not channel.health().ok:
        ...     alert(channel.health().storage_error)
        """
        fault = self._faults.current
        with self._cond:
            backlog, unread, closed = len(self._raw), self._inbox.unread(), self._closed
        return ChannelHealth(
            name=self.name,
            storage_error=None if fault is None else str(fault),
            failing_since=None if fault is None else self._faults.since,
            backlog=backlog,
            unread=unread,
            closed=None if closed is None else str(closed),
        )

    def flush(self) -> None:
        """Records now which messages were read and how far the channel was handled (also
        done by close() and by waiting readers); InternalError if the write fails."""
        with self._cond:
            self._inbox.flush()
            if self._faults.record is not None:
                raise self._faults.record

    def _flush_if_due(self) -> None:
        """For the manager's idle listeners: records reads when the last record is older
        than CONSUMED_FLUSH_SECONDS. A failure is logged and retried on the next one."""
        with self._cond:
            self._inbox.flush_if_due()

    def _drain_available(self) -> None:
        """Processes every queued delivery. Caller holds ``_lock``."""
        self._deliveries.drain()

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
        pending = self._commits.commit(lambda: self._group.add_members([kp]))
        assert pending is not None and pending.welcome is not None
        return pending.welcome

    def remove_member(self, member: AgentId | bytes | str) -> None:
        """Removes a member; it can no longer read what is sent afterwards. ``member`` is
        an :class:`AgentId`, or an identity (bytes or str) that exactly one member has."""
        member_id = self._member_id(member)
        self._commits.commit(lambda: self._group.remove_members([member_id]))

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

    def update_keys(self, timeout: float | None = None) -> None:
        """Refreshes this agent's keys (an MLS update): post-compromise security, and the
        way a renewed credential reaches the channel.

        The owner and admins commit the update themselves. A plain member does not commit
        (docs/security.md, "Membership authority"): it proposes the update, an owner's
        or admin's client commits it, and this waits up to ``timeout`` (None: the
        client's timeout) for that commit. TransportError if none came: the keys are
        unchanged, and the proposal may still be committed while its epoch lasts."""
        check_wait(timeout, None)
        self._check_open()
        if self._is_admin():
            self._commits.commit(self._group.self_update)
            return
        wait = self._client.timeout if timeout is None else timeout
        start = self._group.epoch
        if not self._commits.propose_until(
            self._update_proposal,
            lambda: self._commits.updated_epoch > start,
            time.monotonic() + wait,
        ):
            self._check_open()
            raise TransportError(
                f"channel {self.name!r}: no owner or admin committed this agent's key update "
                f"within {wait:g} s"
            )

    def _update_proposal(self) -> bytes:
        """This agent's update proposal in the current epoch (caller holds the lock): the
        one made before in this epoch if any, since the relay holds one per member and
        epoch (sent again, it is the same proposal)."""
        epoch = self._group.epoch
        made = self._commits.update_proposal
        if made is not None and made[0] == epoch:
            return made[1]
        proposal = self._group.propose_update()
        self._commits.update_proposal = (epoch, proposal)
        return proposal

    def _is_admin(self) -> bool:
        """Whether this agent is the channel's owner or an admin: who commits."""
        me = self._client.engine.member_id
        return me is not None and self._group.roles().role(me) != "member"

    def leave(self, timeout: float = 5.0) -> None:
        """Leaves the channel: asks the owner and admins (an MLS remove proposal; MLS lets
        no agent commit its own removal, and only they commit) to commit this agent's
        removal, waits up to ``timeout`` for it, then forgets the channel and its keys. If
        none of them is online, the local state is deleted anyway.

        A proposal is valid in its epoch only: when another member's commit takes that
        epoch first (the relay refuses the proposal as stale, or the commit leaves it
        out), the proposal is made again in the new epoch, until ``timeout``. Removed by
        another member meanwhile, this agent is out as asked: leave() returns."""
        self._check_open()
        try:
            self._commits.propose_until(
                self._leave_proposal,
                lambda: self._closed is not None,
                time.monotonic() + timeout,
            )
        except ChannelClosedError:
            if self._forgotten():
                return  # removed meanwhile: out of the channel, as asked
            raise
        if self._closed is None:
            self._client._forget(self, ChannelClosedError(f"left channel {self.name!r}"))

    def _forgotten(self) -> bool:
        """Whether the client forgot this channel (this agent was removed, or left)."""
        return self._closed is not None and self._client._channels.get(self.name) is not self

    def _leave_proposal(self) -> bytes:
        """This agent's remove proposal (caller holds the lock, no commit under way)."""
        me = self._client.engine.member_id
        owner = me is not None and self._group.roles().role(me) == "owner"
        if owner and len(self._group.members()) > 1:
            raise AccessError(
                f"channel {self.name!r}: the owner cannot leave; hand ownership over "
                "first (set_role(member, 'owner'))"
            )
        return self._group.propose_leave()

    def _relay(self, request: Request, *, retry: bool = True) -> Reply:
        """``request`` about this channel, waited for; a refusal as a library error."""
        return self._client._request(request, channel=self.name, retry=retry)

    def _catch_up(self, epoch: int) -> None:
        """Processes deliveries until the group reaches ``epoch``. Caller holds the lock.
        (The outbox's pump calls it when its queued messages need a newer epoch.)"""
        self._commits.catch_up(epoch)
