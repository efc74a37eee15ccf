"""A member's proposal to leave, through a running relay: stored with the tracked group
that holds it, then committed by another member. Each test runs on the SQLite and the
Redis log."""

from __future__ import annotations

from pathlib import Path

import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_server.stack import Stack

from .conftest import Account
from .helpers import Member
from .test_relay import CHANNEL, close, member, pair

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


async def test_a_stored_proposal_is_read_and_committed_by_another_member(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    alice, bob, carol = await trio(stack, account, tmp_path)
    assert bob.group is not None and alice.group is not None
    epoch = bob.group.epoch
    proposed = await propose_leave(carol)
    head = await alice.conn.request(pb.CreateChannel(channel=CHANNEL))
    assert (head.head_seq, head.epoch) == (proposed, epoch), "a proposal moves no epoch"
    assert (await bob.next()).seq == proposed
    reply = await bob.commit(CHANNEL, bob.group.self_update())  # carries the proposal
    assert reply.epoch == epoch + 1
    await alice.next()  # the proposal
    await alice.next()  # bob's commit
    assert carol.member_id not in alice.group.members()
    assert carol.member_id not in bob.group.members()
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
