"""Channel.leave() against a real local stack when other members' commits race it."""

from __future__ import annotations

import threading
from typing import Any

from svc_sdk import TransportError
from svc_sdk.relay_frames import Commit, Publish
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


def _proposal_left_out(
    stack: LocalStack, channel_name: str, ids: Any, *, relay_away_after: bool
) -> None:
    """b leaves while c's (an admin's) commit, built before b proposed, is ordered after
    b's proposal and leaves it out: the proposal dies with its epoch. With
    ``relay_away_after``, b's requests fail once its first proposal is in (the relay out
    of reach)."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    cc = client(stack, ids("c"))
    with ca, cb, cc:
        chan_c = cc.join_channel(channel_name, chan_a.add_member(cc.generate_key_package()))
        chan_a.set_role(cc.agent_id, "admin")  # c commits: only the owner and admins do
        wait_for(lambda: chan_c.roles()[cc.agent_id] == "admin")
        proposed = threading.Event()
        c_conn, b_conn = cc.link._conn, cb.link._conn
        assert c_conn is not None and b_conn is not None
        c_send, b_send, b_request = c_conn.send, b_conn.send, cb.link.request

        def commit_after_the_proposal(request: Any) -> Any:
            if isinstance(request, Commit):
                assert proposed.wait(20)
            return c_send(request)

        def proposing(request: Any) -> Any:
            future = b_send(request)
            if isinstance(request, Publish):
                future.add_done_callback(lambda _: proposed.set())
            return future

        def away_after_the_first(request: Any, **kwargs: Any) -> Any:
            if relay_away_after and proposed.is_set():
                raise TransportError("relay out of reach")
            return b_request(request, **kwargs)

        c_conn.send = commit_after_the_proposal  # type: ignore[method-assign]
        b_conn.send = proposing  # type: ignore[method-assign]
        cb.link.request = away_after_the_first  # type: ignore[method-assign]
        updating = threading.Thread(target=chan_c.update_keys)
        updating.start()
        wait_for(lambda: chan_c._group.has_pending_commit)
        errors: list[BaseException] = []

        def leave() -> None:
            try:
                chan_b.leave(timeout=3 if relay_away_after else 30)
            except BaseException as exc:
                errors.append(exc)

        leaving = threading.Thread(target=leave)
        leaving.start()
        updating.join(30)
        assert not updating.is_alive()
        # Only now a member that commits others' proposals is online.
        with listening(chan_a):
            leaving.join(40)
            assert not leaving.is_alive() and errors == []
            if not relay_away_after:
                wait_for(lambda: sorted(chan_a.members()) == sorted([ca.agent_id, cc.agent_id]))
        assert chan_b.closed and cb.channels() == []


def test_leave_proposes_again_when_a_commit_leaves_its_proposal_out(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """leave() proposes again in the new epoch, so b is removed from the group, not only
    forgotten on its own side."""
    _proposal_left_out(stack, channel_name, ids, relay_away_after=False)


def test_leave_forgets_the_channel_when_proposing_again_cannot_reach_the_relay(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """Proposing again fails (the relay is out of reach): as with no member online, the
    local state goes once ``timeout`` is up, and leave() does not raise."""
    _proposal_left_out(stack, channel_name, ids, relay_away_after=True)
