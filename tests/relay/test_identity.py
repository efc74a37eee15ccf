"""The relay knows which verified agent each stream is: an (account, identity) pair. A
Welcome reaches only the verified owner of a key package it is addressed to."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_server.stack import Stack

from .conftest import Account, connect, new_account
from .helpers import Member, engine

pytestmark = pytest.mark.anyio
CHANNEL = "acme/identity/check"
INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]


async def member(stack: Stack, account: Account, root: Path, name: str, dirname: str) -> Member:
    # In a thread: the account API serves on this event loop.
    made = await asyncio.to_thread(engine, root / dirname, name, (account.api_url, account.key))
    return Member(name, made, await connect(stack, account, name.encode()))


async def test_a_welcome_goes_only_to_the_key_packages_owner(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    other = await new_account(stack.api_url, "other@example.com")
    alice = await member(stack, account, tmp_path, "alice", "a")
    bob = await member(stack, account, tmp_path, "bob", "b")
    # Another account's agent that chose the same identity, connected before the commit.
    impostor = await member(stack, other, tmp_path, "bob", "impostor")
    await alice.create(CHANNEL)
    await alice.add(CHANNEL, bob)
    await bob.join(CHANNEL)
    await asyncio.sleep(0.3)
    assert impostor.conn.welcomes.empty()
    # Messages carry the stream's verified pair, not the bare identity.
    seq = await alice.send(CHANNEL, "hi")
    delivery = await bob.next()
    assert delivery.seq == seq and delivery.sender == alice.member_id
    assert alice.member_id == bytes.fromhex(account.account_id.replace("-", "")) + b"alice"
    for m in (alice, bob, impostor):
        await m.conn.close()


async def test_commits_whose_welcome_does_not_match_the_added_members_are_refused(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    alice = await member(stack, account, tmp_path, "alice", "a")
    bob = await member(stack, account, tmp_path, "bob", "b")
    carol = await member(stack, account, tmp_path, "carol", "c")
    await alice.create(CHANNEL)
    assert alice.group is not None
    # A Welcome of another group, addressed to carol.
    api = (account.api_url, account.key)
    other_engine = await asyncio.to_thread(engine, tmp_path / "o", "other", api)
    other = other_engine.create_group(b"other/group/x")
    carol_welcome = other.add_members([carol.engine.generate_key_package()]).welcome
    pending = alice.group.add_members([bob.engine.generate_key_package()])
    assert pending.welcome is not None

    def commit(**fields: object) -> pb.Commit:
        base = {"channel": CHANNEL, "epoch": pending.epoch, "commit": pending.commit}
        return pb.Commit(**{**base, "welcome": pending.welcome, **fields})  # type: ignore[arg-type]

    cases = [
        (commit(welcome=carol_welcome), "not addressed to exactly"),
        (commit(welcome=b""), "needs their Welcome"),
        (commit(welcome=pending.commit), "must be an MLS Welcome"),
    ]
    for frame, message in cases:
        reply = await alice.conn.request(frame, check=False)
        assert reply.code == INVALID and message in reply.message, (message, reply)
    # Nothing was stored: the honest commit for the same epoch is accepted.
    reply = await alice.conn.request(commit())
    alice.group.apply_pending_commit()
    await bob.join(CHANNEL)
    assert carol.conn.welcomes.empty()
    for m in (alice, bob, carol):
        await m.conn.close()
