"""Channel.leave() against a real local stack when other members' commits race it."""

from __future__ import annotations

import threading
from typing import Any

from svc_sdk.relay_frames import Commit, Deliveries, Publish
from svc_sdk.testing import LocalStack

from .helpers import before_the_first_publish, client, listening, pair, wait_for


def test_leave_proposes_again_when_a_commit_wins_its_epoch(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """a's commit reaches the relay between b's catching up and b's proposal: the relay
    refuses the proposal as stale. leave() catches up and proposes in the new epoch,
    instead of failing the caller with the relay's refusal."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        # a's commit takes the epoch b's proposal is for.
        committed = before_the_first_publish(cb, chan_a.update_keys)
        with listening(chan_a):
            chan_b.leave(timeout=20)
            wait_for(lambda: chan_a.members() == [ca.agent_id])
        assert committed.is_set() and chan_a.epoch == 3  # the update, then b's removal
        assert chan_b.closed and cb.channels() == []


def test_leave_returns_when_a_commit_removes_the_agent_first(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """a removes b while b's proposal is on its way: the relay refuses the proposal as
    stale, b catches up and finds itself removed. That is what leaving asked for."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        removed = before_the_first_publish(cb, lambda: chan_a.remove_member(cb.agent_id))
        chan_b.leave(timeout=20)
        assert removed.is_set() and chan_b.closed and cb.channels() == []
        assert chan_a.members() == [ca.agent_id]


def test_a_commit_built_before_a_leave_proposal_is_built_again_with_it(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """c's commit, built before b proposed to leave, reaches the relay after b's proposal
    and leaves it out: the relay refuses it (every commit of the epoch must carry the
    proposal), c waits until it has read the proposal (held back here for 2 s) and commits
    again with it, and b is removed from the group, not only forgotten on its own side."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    cc = client(stack, ids("c"))
    with ca, cb, cc:
        chan_c = cc.join_channel(channel_name, chan_a.add_member(cc.generate_key_package()))
        proposed = threading.Event()
        c_conn, b_conn = cc.link._conn, cb.link._conn
        assert c_conn is not None and b_conn is not None
        c_send, b_send = c_conn.send, b_conn.send
        commits: list[Commit] = []

        def commit_after_the_proposal(request: Any) -> Any:
            if isinstance(request, Commit):
                assert proposed.wait(20)
                commits.append(request)
            return c_send(request)

        def proposing(request: Any) -> Any:
            future = b_send(request)
            if isinstance(request, Publish):
                future.add_done_callback(lambda _: proposed.set())
            return future

        deliver, held = c_conn._on_frame, threading.Event()
        b_id = cb.agent_id.member_id

        def proposal_late(frame: Any) -> None:
            # Building again at once, without the proposal, would only be refused again.
            from_b = isinstance(frame, Deliveries) and any(i.sender == b_id for i in frame.items)
            if from_b and not held.is_set():
                held.set()
                threading.Timer(2.0, deliver, (frame,)).start()
                return
            deliver(frame)

        c_conn._on_frame = proposal_late
        c_conn.send = commit_after_the_proposal  # type: ignore[method-assign]
        b_conn.send = proposing  # type: ignore[method-assign]
        errors: list[BaseException] = []

        def update() -> None:
            try:
                chan_c.update_keys()
            except BaseException as exc:
                errors.append(exc)

        updating = threading.Thread(target=update)
        updating.start()
        wait_for(lambda: chan_c._group.has_pending_commit)
        chan_b.leave(timeout=30)
        updating.join(30)
        assert not updating.is_alive() and errors == []
        assert held.is_set()
        assert len(commits) == 2, "the commit without the proposal, then the one with it"
        assert chan_b.closed and cb.channels() == []
        with listening(chan_a):
            wait_for(lambda: sorted(chan_a.members()) == sorted([ca.agent_id, cc.agent_id]))
        assert sorted(chan_c.members()) == sorted([ca.agent_id, cc.agent_id])
