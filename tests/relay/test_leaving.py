"""A member's proposal to leave, through a running relay: once the relay accepted it, the
epoch's commit must carry it, so no member can keep another in the channel by committing
without it. Each test runs on the SQLite and the Redis log."""

from __future__ import annotations

from pathlib import Path

import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.agent_id import AgentId
from svc_server.stack import Stack

from .conftest import Account
from .helpers import Member, commit_frame
from .test_relay import CHANNEL, STALE, close, member, pair

pytestmark = pytest.mark.anyio


async def trio(stack: Stack, account: Account, root: Path) -> tuple[Member, Member, Member]:
    """alice (the owner), bob and carol in CHANNEL, every one at the same epoch."""
    alice, bob = await pair(stack, account, root)
    carol = await member(stack, account, root, "carol")
    await alice.add(CHANNEL, carol)
    await carol.join(CHANNEL)
    await bob.next()
    return alice, bob, carol


async def propose_leave(leaver: Member) -> int:
    """Publishes ``leaver``'s proposal to leave; returns its seq."""
    assert leaver.group is not None
    proposal = leaver.group.propose_leave()
    reply = await leaver.conn.request(pb.Publish(channel=CHANNEL, message=[proposal]))
    return reply.seq


async def test_a_commit_without_a_pending_leave_is_refused_until_it_carries_it(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    alice, bob, carol = await trio(stack, account, tmp_path)
    assert bob.group is not None and alice.group is not None
    epoch = bob.group.epoch
    proposed = await propose_leave(carol)

    # bob commits without carol's proposal: he has not read it (a race), or keeps her in
    # on purpose. Either way the relay stores nothing and tells him to read on.
    reply = await bob.conn.request(commit_frame(CHANNEL, bob.group.self_update()), check=False)
    bob.group.clear_pending_commit()
    assert reply.code == STALE, reply
    assert reply.epoch == epoch
    carol_id = AgentId.from_member_id(carol.member_id)
    assert f"leaves out the proposal of {carol_id} to leave" in reply.message
    head = await alice.conn.request(pb.CreateChannel(channel=CHANNEL))
    assert (head.head_seq, head.epoch) == (proposed, epoch)

    # Having read it, his commit carries it and carol is out.
    delivery = await bob.next()
    assert delivery.seq == proposed
    reply = await bob.commit(CHANNEL, bob.group.self_update())
    assert reply.epoch == epoch + 1
    await alice.next()  # the proposal
    await alice.next()  # bob's commit
    assert carol.member_id not in alice.group.members()
    assert carol.member_id not in bob.group.members()
    await close(alice, bob, carol)


async def test_an_owners_leave_proposal_holds_no_commit_up(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """The policy never lets the owner leave a channel with other members, so no commit
    could carry the owner's proposal: the relay does not ask for it."""
    alice, bob, carol = await trio(stack, account, tmp_path)
    assert bob.group is not None
    epoch = bob.group.epoch
    await propose_leave(alice)  # an engine makes it; svc's client refuses to (channel.py)
    await bob.next()
    reply = await bob.commit(CHANNEL, bob.group.self_update())
    assert reply.epoch == epoch + 1
    assert alice.member_id in bob.group.members()
    await close(alice, bob, carol)


async def test_a_removal_by_an_admin_covers_a_pending_leave(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """A commit that removes the leaving member another way carries its departure too."""
    alice, bob, carol = await trio(stack, account, tmp_path)
    assert alice.group is not None
    epoch = alice.group.epoch
    await propose_leave(carol)
    # alice has not read the proposal; her commit removes carol anyway.
    reply = await alice.commit(CHANNEL, alice.group.remove_members([carol.member_id]))
    assert reply.epoch == epoch + 1
    assert carol.member_id not in alice.group.members()
    await close(alice, bob, carol)


async def test_a_proposal_published_twice_is_carried_once(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """A client resends a Publish whose Reply a lost connection took: the relay may then
    hold the same proposal twice. Members read both, and one commit carries it."""
    alice, bob, carol = await trio(stack, account, tmp_path)
    assert bob.group is not None and carol.group is not None
    epoch = bob.group.epoch
    proposal = carol.group.propose_leave()
    for _ in range(2):
        await carol.conn.request(pb.Publish(channel=CHANNEL, message=[proposal]))
    await bob.next()
    await bob.next()
    reply = await bob.commit(CHANNEL, bob.group.self_update())
    assert reply.epoch == epoch + 1
    assert carol.member_id not in bob.group.members()
    await close(alice, bob, carol)
