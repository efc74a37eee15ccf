"""Getting a channel's commits, and its proposals (leaving, key updates), accepted by the
relay.

Commits follow mls-rs's explicit states: a commit is pending until the relay accepts it
(apply) or another member's commit wins the epoch (clear, process theirs, try again). A
proposal is only valid in the epoch it was made in: one the relay refuses as stale is
made again once this agent has caught up.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from svc_sdk._native import PendingCommit
from svc_sdk.errors import PolicyError, TransportError, relay_error
from svc_sdk.relay_frames import Code, Commit, CreateChannel, Publish, RelayError

if TYPE_CHECKING:
    from svc_sdk.channel import Channel

log = logging.getLogger("svc_sdk.channel")  # one logger for all of a channel's parts

STALE = Code.FAILED_PRECONDITION
COMMIT_ATTEMPTS = 20


class Commits:
    """A channel's commit loop.

    The channel's lock is held while the commit is built and while its outcome is
    applied, not while the relay's answer is awaited: sends (encrypted in the epoch the
    commit ends; the relay orders each before or after it, and the outbox encrypts the
    ones it refuses as stale again in the next epoch) and reads go on meanwhile, so a
    slow or unreachable relay holds up this call, not the channel. One commit at a time.
    """

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        #: Set when this agent's pending commit came back in the log and was applied
        #: (by whichever thread processed it): what :meth:`settle` reports.
        self.echoed = False
        #: The epoch of the last commit that applied this agent's update proposal.
        self.updated_epoch = 0
        #: (epoch, proposal): this agent's update proposal of that epoch.
        self.update_proposal: tuple[int, bytes] | None = None
        self._one_at_a_time = threading.Lock()

    @property
    def busy(self) -> bool:
        """Whether a commit is under way (on any thread)."""
        return self._one_at_a_time.locked()

    def exclusive(self) -> threading.Lock:
        """Held, no commit is under way: for a change to the group that a pending commit
        forbids (a leave proposal). Take it before the channel's lock."""
        return self._one_at_a_time

    def commit(self, make: Callable[[], PendingCommit | None]) -> PendingCommit | None:
        """Builds a commit with ``make`` (None: nothing to do any more) and gets it
        accepted, retrying when another member's commit wins the epoch."""
        channel = self._channel
        try:
            with self._one_at_a_time:
                with channel._lock:
                    channel._check_open()
                return self._attempts(make)
        finally:
            channel._admissions.after_commit()

    def propose(self, make: Callable[[], bytes], deadline: float | None = None) -> int:
        """Makes a proposal with ``make`` (called with the channel's lock held, no commit
        under way) and publishes it; returns the epoch it was made in. When another
        member's commit took that epoch first (the relay refuses the proposal as stale),
        catches up and makes it again, until ``deadline`` (``time.monotonic()``) if given.
        The channel's lock is not held while the relay answers; the commit mutex is."""
        channel = self._channel
        for _ in range(COMMIT_ATTEMPTS):
            timeout = channel._client.timeout
            if deadline is not None:
                timeout = min(timeout, deadline - time.monotonic())
                if timeout <= 0:
                    break
            try:
                # mls-rs makes no proposal while a commit of this agent is pending.
                with self._one_at_a_time:
                    with channel._lock:
                        channel._check_open()
                        channel._drain_available()
                        channel._check_open()
                        epoch = channel._group.epoch
                        proposal = make()
                    try:
                        channel._client.link.request(
                            Publish(channel=channel.name, message=[proposal]), timeout=timeout
                        )
                    except RelayError as exc:
                        if exc.code != STALE:
                            raise relay_error(exc, channel.name) from None
                        current = exc.reply.epoch
                    else:
                        return epoch
            finally:
                # Work readers left to this thread while it held the commit mutex.
                channel._admissions.after_commit()
            self.catch_up(current)
        raise TransportError(
            f"channel {channel.name!r}: the proposal got into no epoch in time; other "
            "members' commits kept taking them first"
        )

    def propose_until(
        self, make: Callable[[], bytes], done: Callable[[], bool], deadline: float
    ) -> bool:
        """Proposes with ``make`` and waits until ``done()`` — an owner's or admin's
        commit carried the proposal — or ``deadline`` (``time.monotonic()``); returns
        ``done()``. A proposal is valid in its epoch only: when a commit ends that epoch
        without it, it is made again in the next. The first proposal's failure raises;
        a later one's is logged and tried again while time is left."""
        channel = self._channel
        proposed = self.propose(make, deadline)
        while not done() and channel._closed is None and time.monotonic() < deadline:
            with channel._cond:
                if not channel._raw:
                    channel._cond.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            channel._deliveries.process_pending()
            if not done() and channel._closed is None and channel._group.epoch > proposed:
                try:
                    proposed = self.propose(make, deadline)
                except TransportError as exc:
                    log.warning("channel %s: proposing again failed: %s", channel.name, exc)
        return done()

    def _attempts(self, make: Callable[[], PendingCommit | None]) -> PendingCommit | None:
        channel = self._channel
        link = channel._client.link
        refreshed = False
        for _ in range(COMMIT_ATTEMPTS):
            with channel._lock:
                channel._drain_available()
                channel._check_open()
                left_over = channel._group.has_pending_commit
            if left_over:
                self.settle()  # left by a crash or a lost connection
            with channel._lock:
                channel._drain_available()
                channel._check_open()
                refused: PolicyError | None = None
                try:
                    pending = make()
                except PolicyError as exc:
                    # The engine judges the policy on this agent's copy of the group: a
                    # role granted by a commit the relay accepted but this agent has not
                    # received yet counts once it has caught up.
                    if refreshed:
                        raise
                    refused, pending = exc, None
                self.echoed = False
            if refused is not None:
                refreshed = True
                head = channel._relay(CreateChannel(channel=channel.name))
                if head.epoch <= channel._group.epoch:
                    raise refused
                self.catch_up(head.epoch)
                continue
            if pending is None:
                return None
            frame = Commit(
                channel=channel.name,
                epoch=pending.epoch,
                commit=pending.commit,
                welcome=pending.welcome or b"",
            )
            try:
                reply = link.request(frame, timeout=channel._client.timeout, retry=False)
            except RelayError as exc:
                with channel._lock:
                    # A reader may have processed the winning commit meanwhile, which
                    # cleared this one already.
                    if channel._group.has_pending_commit:
                        channel._group.clear_pending_commit()
                if exc.code != STALE:
                    raise relay_error(exc, channel.name) from None
                self.catch_up(exc.reply.epoch)
                continue
            except TransportError:
                # Unknown outcome: the log says (our own commits are echoed).
                if self.settle():
                    return pending
                continue
            # What the relay ordered before the commit was sent in the epoch it ends: read
            # it in that epoch (mls-rs refuses a past epoch's message from a leaf the
            # commit changed, e.g. a member it removes), then apply the commit with its
            # echo (a reader may have done both already).
            with contextlib.suppress(TransportError):
                link.wait_received(channel.name, reply.seq, channel._client.timeout)
            with channel._lock:
                channel._drain_available()
                if channel._group.has_pending_commit:
                    channel._group.apply_pending_commit()
                    # Proposals it covered are done. (When a reader applied the echo, it
                    # cleared the flag then; one set since is for a later proposal.)
                    channel._admissions.proposals = False
            return pending
        raise TransportError(
            f"channel {channel.name!r}: commit kept losing to other members' commits"
        )

    def catch_up(self, epoch: int) -> None:
        """Processes deliveries until the group reaches ``epoch``."""
        channel = self._channel
        deadline = time.monotonic() + channel._client.timeout
        while channel._group.epoch < epoch:
            if time.monotonic() > deadline:
                raise TransportError(
                    f"channel {channel.name!r}: the relay did not deliver the commit for epoch "
                    f"{epoch - 1} in time"
                )
            with channel._cond:
                if not channel._raw:
                    channel._cond.wait(0.05)
            with channel._lock:
                channel._drain_available()
                channel._check_open()

    def settle(self) -> bool:
        """A pending commit whose outcome is unknown: read the log up to the relay's head.
        Our echoed commit applies it (True); another member's clears it. If neither came,
        it was never stored: drop it (False) so the caller builds a new one."""
        channel = self._channel
        link = channel._client.link
        with channel._lock:
            decided = not channel._group.has_pending_commit  # a reader got there first
        if not decided:
            reply = channel._relay(CreateChannel(channel=channel.name))  # head_seq
            link.wait_received(channel.name, reply.head_seq, channel._client.timeout)
        with channel._lock:
            channel._drain_available()
            if channel._group.has_pending_commit:
                channel._group.clear_pending_commit()
                return False
            return self.echoed and channel._closed is None
