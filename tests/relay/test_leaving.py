"""A member's proposal to leave, through a running relay: stored with the tracked group
that holds it, then committed by another member. Each test runs on the SQLite and the
Redis log."""

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
    """alice (the owner), bob and carol in CHANNEL, every one at the same epoch."""
    alice, bob = await pair(stack, account, root)
    carol = await member(stack, account, root, "carol")
    await alice.add(CHANNEL, carol)
    await carol.join(CHANNEL)
    await bob.next()
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
