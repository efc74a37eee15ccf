"""Getting a channel's commits accepted by the relay.

Commits follow mls-rs's explicit states: a commit is pending until the relay accepts it
(apply) or another member's commit wins the epoch (clear, process theirs, try again).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from svc_sdk._native import PendingCommit
from svc_sdk.errors import PolicyError, TransportError, relay_error
from svc_sdk.relay_frames import Code, Commit, CreateChannel, RelayError

if TYPE_CHECKING:
    from svc_sdk.channel import Channel

STALE = Code.FAILED_PRECONDITION
COMMIT_ATTEMPTS = 20


class Commits:
    """A channel's commit loop. ``active`` while a commit is under way: the work a
    commit finds (``Admissions``) waits until it is done."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self.active = False

    def commit(self, make: Callable[[], PendingCommit | None]) -> PendingCommit | None:
        """Builds a commit with ``make`` (None: nothing to do any more) and gets it
        accepted, retrying when another member's commit wins the epoch."""
        channel = self._channel
        link = channel._client.link
        with channel._lock:
            channel._check_open()
            self.active = True
            try:
                refreshed = False
                for _ in range(COMMIT_ATTEMPTS):
                    channel._drain_available()
                    channel._check_open()
                    if channel._group.has_pending_commit:
                        self.settle()  # left by a crash or a lost connection
                    try:
                        pending = make()
                    except PolicyError:
                        # The engine judges the policy on this agent's copy of the group:
                        # a role granted by a commit the relay accepted but this agent
                        # has not received yet counts once it has caught up.
                        if refreshed:
                            raise
                        refreshed = True
                        head = channel._relay(CreateChannel(channel=channel.name))
                        if head.epoch <= channel._group.epoch:
                            raise
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
                    # What the relay ordered before the commit was sent in the epoch it
                    # ends: read it in that epoch (mls-rs refuses a past epoch's message
                    # from a leaf the commit changed, e.g. a member it removes), then
                    # apply the commit with its echo.
                    with contextlib.suppress(TransportError):
                        link.wait_received(channel.name, reply.seq, channel._client.timeout)
                    channel._drain_available()
                    if channel._group.has_pending_commit:
                        channel._group.apply_pending_commit()
                    channel._admissions.proposals = False
                    return pending
                raise TransportError(
                    f"channel {channel.name!r}: commit kept losing to other members' commits"
                )
            finally:
                self.active = False

    def catch_up(self, epoch: int) -> None:
        """Processes deliveries until the group reaches ``epoch``. Caller holds the lock."""
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
            channel._drain_available()
            channel._check_open()

    def settle(self) -> bool:
        """A pending commit whose outcome is unknown: read the log up to the relay's head.
        Our echoed commit applies it (True); another member's clears it. If neither came,
        it was never stored: drop it (False) so the caller builds a new one."""
        channel = self._channel
        link = channel._client.link
        reply = channel._relay(CreateChannel(channel=channel.name))  # head_seq
        link.wait_received(channel.name, reply.head_seq, channel._client.timeout)
        epoch = channel._group.epoch
        channel._drain_available()
        if channel._group.has_pending_commit:
            channel._group.clear_pending_commit()
            return False
        return channel._group.epoch > epoch and not channel._closed
