"""Commits an owner's or admin's channel makes on its own: adding agents that redeemed
invites, and committing members' proposals (their leaving, their key updates).
Processing finds them; they need the relay, so they are made after the lock for
processing is released."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from svc_sdk._native import PendingCommit
from svc_sdk.errors import AccessError, InternalError, MlsError, SvcError

if TYPE_CHECKING:
    from svc_sdk.channel import Channel

log = logging.getLogger("svc_sdk.channel")  # one logger for all of a channel's parts


class Admissions:
    """The join requests (who, key package) and whether proposals wait for a commit."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self.join_requests: list[tuple[bytes, bytes]] = []
        self.proposals = False
        # The join request of the add commit being made.
        self._adding: tuple[bytes, bytes] | None = None
        #: Bumped (under the channel's lock) each time processing records work: what
        #: tells work that arrived since a pass from work that pass already tried.
        self.arrivals = 0
        self._tried = 0  # ``arrivals`` when the last pass began
        # do_work: one thread at a time, ``_worker``.
        self._working = threading.Lock()
        self._worker: int | None = None

    def has_work(self) -> bool:
        """Whether ``do_work`` has commits to make (they need the relay)."""
        return bool(self.join_requests or self.proposals) and self._channel._closed is None

    def do_work(self) -> None:
        """Adds agents that redeemed invites and commits members' proposals (an owner's or
        admin's channel only: plain members do not commit).

        Never waits for another thread's commit (a reader must not wait out a relay's
        round trips): work that arrives while a commit is under way, or while another
        thread does this work, is left to that thread, which takes it once it is done
        (``Commits.commit`` calls :meth:`after_commit`). Work a pass tried and could not
        do (the relay refused, or is away) waits for the next call, not retried in a
        loop."""
        me = threading.get_ident()
        if self._worker == me:
            return  # the thread doing the work, at the end of one of its commits
        while self.has_work():
            if self._channel._commits.busy or not self._working.acquire(blocking=False):
                return
            try:
                self._worker, self._tried = me, self.arrivals
                self._work()
            finally:
                self._worker = None
                self._working.release()
            if self.arrivals == self._tried:  # nothing new came in meanwhile
                return

    def after_commit(self) -> None:
        """A commit ended: takes work that arrived while it was under way. Never raises:
        the commit's own outcome is what its caller gets."""
        if self.arrivals != self._tried:
            try:
                self.do_work()
            except Exception:  # do_work logs the library's errors itself
                log.exception("channel %s: admissions after a commit", self._channel.name)

    def _work(self) -> None:
        channel = self._channel
        try:
            while self.join_requests and channel._closed is None:
                try:
                    if channel._commits.commit(self._next_admission) is None:
                        break
                except (AccessError, InternalError) as exc:
                    # The relay refused the commit adding it: the invite it came with is
                    # no longer valid, or its key package was used before. Asking again
                    # gets the same answer; the others go on.
                    if self._adding is None:
                        raise
                    refused = self._adding
                    log.warning(
                        "channel %s: join request from %r refused: %s",
                        channel.name,
                        refused[0],
                        exc,
                    )
                    self._drop(refused)
                    continue
                # That request is spent: its agent is in. Filtering by the roster alone
                # would add it again if a removal came in before the next look.
                if self._adding is not None:
                    self._drop(self._adding)
            if self.proposals and channel._closed is None:
                if self._is_admin():
                    channel._commits.commit(self._commit_proposals)
                else:
                    self.proposals = False  # only the owner and admins commit them
        except SvcError as exc:  # MlsError included
            log.warning("channel %s: %s", channel.name, exc)

    def _drop(self, request: tuple[bytes, bytes]) -> None:
        # Under the lock that processing appends under: a request that arrives now stays.
        with self._channel._lock:
            self.join_requests = [r for r in self.join_requests if r != request]

    def _is_admin(self) -> bool:
        return self._channel._is_admin()

    def _next_admission(self) -> PendingCommit | None:
        self._adding = None
        group = self._channel._group
        if not self._is_admin():
            # Only the owner and admins add members; a redemption is for them to act on.
            self.join_requests.clear()
            return None
        members = set(group.members())
        self.join_requests = [(w, kp) for w, kp in self.join_requests if w not in members]
        # One commit per joiner: a bad key package cannot hold up the others.
        while self.join_requests:
            who, kp = self.join_requests[0]
            try:
                self._adding = (who, kp)
                return group.add_members([kp])
            except MlsError as exc:
                log.warning(
                    "channel %s: join request from %r dropped: %s", self._channel.name, who, exc
                )
                self.join_requests.pop(0)
        return None

    def _commit_proposals(self) -> PendingCommit | None:
        return self._channel._group.self_update() if self.proposals else None
