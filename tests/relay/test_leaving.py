"""A member's proposals — to leave, to update its keys — through a running relay: stored
with the tracked group that holds them, then committed by an admin (plain members do not
commit). Each test runs on the SQLite and the Redis log."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import grpc
import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_server.stack import Stack

from .conftest import Account
from .helpers import Member
from .test_relay import CHANNEL, INVALID, STALE, close, member, pair

pytestmark = pytest.mark.anyio
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


async def trio(stack: Stack, account: Account, root: Path) -> tuple[Member, Member, Member]:
    """alice (the owner), bob (an admin) and carol in CHANNEL, all at the same epoch."""
    alice, bob = await pair(stack, account, root)
    carol = await member(stack, account, root, "carol")
    await alice.add(CHANNEL, carol)
    await carol.join(CHANNEL)
    await bob.next()
    assert alice.group is not None
    await alice.commit(CHANNEL, alice.group.set_role(bob.member_id, "admin"))
    await bob.next()
    await carol.next()
    return alice, bob, carol


async def head_seq(reader: Member) -> int:
    """The channel's newest seq, as the relay has it."""
    return (await reader.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq


async def propose_leave(leaver: Member) -> int:
    """Publishes ``leaver``'s proposal to leave; returns its seq."""
    assert leaver.group is not None
    proposal = leaver.group.propose_leave()
    reply = await leaver.conn.request(pb.Publish(channel=CHANNEL, message=[proposal]))
    return reply.seq


async def test_a_stored_proposal_is_read_and_committed_by_an_admin(
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


async def test_a_proposal_published_again_is_acknowledged_not_stored_again(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """A client resends a Publish whose Reply a lost connection took: the relay
    acknowledges the proposal it holds already and stores nothing again (storing it
    would write the whole group state each time). One commit carries it."""
    alice, bob, carol = await trio(stack, account, tmp_path)
    assert bob.group is not None and carol.group is not None
    epoch = bob.group.epoch
    proposal = carol.group.propose_leave()
    await carol.conn.request(pb.Publish(channel=CHANNEL, message=[proposal]))
    head = await head_seq(alice)
    version = await stack.relay.relay.store.group_version(CHANNEL)
    for _ in range(3):
        reply = await carol.conn.request(pb.Publish(channel=CHANNEL, message=[proposal]))
        assert reply.seq == head, reply
    assert await head_seq(alice) == head
    assert await stack.relay.relay.store.group_version(CHANNEL) == version
    await bob.next()
    reply = await bob.commit(CHANNEL, bob.group.self_update())
    assert reply.epoch == epoch + 1
    assert carol.member_id not in bob.group.members()
    await close(alice, bob, carol)


async def test_a_forged_or_past_proposal_is_refused_and_nothing_is_stored(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    alice, bob, carol = await trio(stack, account, tmp_path)
    assert alice.group is not None and carol.group is not None
    epoch = alice.group.epoch
    head = await head_seq(alice)
    proposal = carol.group.propose_leave()
    forged = bytearray(proposal)
    forged[-34] ^= 1  # the signature's last byte (a 32-byte membership tag follows it)
    reply = await carol.conn.request(
        pb.Publish(channel=CHANNEL, message=[bytes(forged)]), check=False
    )
    assert reply.code == INVALID, reply
    assert await head_seq(alice) == head

    # alice's commit ends the epoch the genuine proposal was made in.
    await alice.commit(CHANNEL, alice.group.self_update())
    reply = await carol.conn.request(pb.Publish(channel=CHANNEL, message=[proposal]), check=False)
    assert (reply.code, reply.epoch) == (STALE, epoch + 1), reply
    assert await head_seq(alice) == head + 1
    await close(alice, bob, carol)


async def test_a_proposal_the_log_cannot_store_leaves_the_group_as_it_was(
    stack: Stack, account: Account, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails: the proposal is refused (the leaver may retry), and neither the
    log nor the relay's tracked group holds it."""
    alice, bob, carol = await trio(stack, account, tmp_path)
    assert bob.group is not None and carol.group is not None
    relay = stack.relay.relay
    version = await relay.store.group_version(CHANNEL)
    head = await head_seq(alice)
    propose = relay.store.propose

    async def failing(*args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(relay.store, "propose", failing)
    proposal = carol.group.propose_leave()
    reply = await carol.conn.request(pb.Publish(channel=CHANNEL, message=[proposal]), check=False)
    assert reply.code == UNAVAILABLE, reply
    assert await relay.store.group_version(CHANNEL) == version
    assert await head_seq(alice) == head

    # Storage works again: the same proposal goes in and a member commits it.
    monkeypatch.setattr(relay.store, "propose", propose)
    await carol.conn.request(pb.Publish(channel=CHANNEL, message=[proposal]))
    assert await relay.store.group_version(CHANNEL) == version + 1
    await bob.next()
    await bob.commit(CHANNEL, bob.group.self_update())
    assert carol.member_id not in bob.group.members()
    await close(alice, bob, carol)


async def test_a_members_key_update_is_stored_and_committed_by_an_admin(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    alice, bob, carol = await trio(stack, account, tmp_path)
    assert alice.group and bob.group and carol.group
    epoch = bob.group.epoch
    proposal = carol.group.propose_update()
    proposed = (await carol.conn.request(pb.Publish(channel=CHANNEL, message=[proposal]))).seq
    assert (await bob.next()).seq == proposed
    reply = await bob.commit(CHANNEL, bob.group.self_update())  # carries the update
    assert reply.epoch == epoch + 1
    await carol.next()
    assert carol.updated == [carol.member_id]
    await alice.next()  # the proposal
    await alice.next()
    assert alice.updated == [carol.member_id]
    await carol.send(CHANNEL, "with fresh keys")
    await alice.next()
    assert alice.received[-1] == b"with fresh keys"
    await close(alice, bob, carol)


async def test_a_second_proposal_of_a_kind_in_one_epoch_is_refused(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """The proposals of an epoch stay in the tracked group until a commit ends it: a
    member has one key update and one leave proposal per epoch, not a flood of them."""
    alice, bob, carol = await trio(stack, account, tmp_path)
    assert carol.group is not None
    first = carol.group.propose_update()
    await carol.conn.request(pb.Publish(channel=CHANNEL, message=[first]))
    await carol.conn.request(pb.Publish(channel=CHANNEL, message=[first]))  # resent: fine
    head = await head_seq(alice)
    version = await stack.relay.relay.store.group_version(CHANNEL)
    again = carol.group.propose_update()
    reply = await carol.conn.request(pb.Publish(channel=CHANNEL, message=[again]), check=False)
    assert reply.code == INVALID, reply
    assert "one key update and one leave proposal per epoch" in reply.message, reply.message
    assert await head_seq(alice) == head
    assert await stack.relay.relay.store.group_version(CHANNEL) == version
    await close(alice, bob, carol)
