"""Creating a channel when a step of it fails: the name is registered in the account
database, the group stored in the log, the roster mirrored back. A failure between them
must not leave the name taken by nobody: the account that registered it creates it
again, and no other account can."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import grpc
import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_server.stack import Stack

from .conftest import Account, new_account
from .helpers import Member
from .test_relay import member

pytestmark = pytest.mark.anyio
CHANNEL = "acme/support/triage"
DENIED = grpc.StatusCode.PERMISSION_DENIED.value[0]
EXISTS = grpc.StatusCode.ALREADY_EXISTS.value[0]
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


async def create(m: Member) -> pb.Reply:
    """What SvcClient.create_channel does: a fresh group each call, its GroupInfo sent."""
    if m.group is not None:
        m.engine.delete_group(CHANNEL.encode())
    m.group = m.engine.create_group(CHANNEL.encode())
    request = pb.CreateChannel(channel=CHANNEL, group_info=m.group.group_info())
    reply: pb.Reply = await m.conn.request(request, check=False)
    return reply


def fail_once(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> None:
    original = getattr(owner, name)

    async def failing(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(owner, name, original)
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(owner, name, failing)


@pytest.mark.parametrize("step", ["store the group", "mirror the roster"])
async def test_a_creation_that_failed_half_way_is_finished_by_its_account_only(
    stack: Stack,
    account: Account,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
) -> None:
    relay = stack.relay.relay
    if step == "store the group":
        fail_once(monkeypatch, relay.store, "create_group")
    else:
        fail_once(monkeypatch, relay.access, "record")
    alice = await member(stack, account, tmp_path, "alice")
    reply = await create(alice)
    assert reply.code == UNAVAILABLE, reply

    # Another account cannot take the name over meanwhile, nor use what was stored.
    other = await new_account(stack.api_url, "mallory@example.com")
    mallory = await member(stack, other, tmp_path, "mallory")
    taken = await create(mallory)
    assert taken.code == DENIED, taken
    subscribe = pb.Subscribe(channel=CHANNEL, after_seq=0)
    assert (await mallory.conn.request(subscribe, check=False)).code == DENIED

    # The account that registered it creates it again, with the group its agent holds now.
    reply = await create(alice)
    assert reply.code == 0, reply
    await alice.subscribe(CHANNEL)
    bob = await member(stack, account, tmp_path, "bob")
    await alice.add(CHANNEL, bob)
    await bob.join(CHANNEL)
    await alice.send(CHANNEL, "made it")
    await bob.next()
    assert bob.received == [b"made it"]

    # Finished now: creating it again is refused, as for any channel that exists.
    assert (await create(mallory)).code == DENIED
    carol = await member(stack, account, tmp_path, "carol")
    assert (await create(carol)).code == EXISTS
    for m in (alice, bob, carol, mallory):
        await m.conn.close()
