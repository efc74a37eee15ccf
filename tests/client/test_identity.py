"""Verified agent identities end to end: members are (account, identity) pairs that every
member checked, and credentials are renewed in every channel before they expire."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from svc_sdk import AgentId, MlsError
from svc_sdk.testing import LocalStack

from .helpers import client, take


def test_two_accounts_alices_are_told_apart(stack: LocalStack, channel_name: str, ids: Any) -> None:
    name = ids("alice")
    other_key = stack.signup()["api_key"]["key"]
    ours = stack.manager(name)
    theirs = stack.manager(name, api_key=other_key, data_dir=stack.agent_dir(name + "-b"))
    ours.create(channel_name)
    theirs.join_with_token(channel_name, ours.invite(channel_name), timeout=20)
    assert ours.agent_id.identity == theirs.agent_id.identity == name.encode()
    assert ours.agent_id.account == stack.account_id != theirs.agent_id.account
    assert str(theirs.agent_id) == f"{name}@{theirs.agent_id.account}"
    assert sorted(ours.members(channel_name)) == sorted([ours.agent_id, theirs.agent_id])

    theirs.send(channel_name, "from the other alice")
    (message,) = ours.receive_messages(channel_name, timeout=10)
    assert message.sender == theirs.agent_id != ours.agent_id

    # An identity alone is ambiguous here: removal needs the AgentId.
    with pytest.raises(MlsError, match="names 2 members of different accounts"):
        ours.remove_member(channel_name, name)
    ours.remove_member(channel_name, theirs.agent_id)
    assert ours.members(channel_name) == [ours.agent_id]


def test_agent_id_round_trips() -> None:
    account = uuid.uuid4()
    who = AgentId(str(account), b"\xffodd")
    assert AgentId.from_member_id(who.member_id) == who
    assert str(who) == f"\\xffodd@{account}"
    with pytest.raises(ValueError, match="16 account bytes"):
        AgentId.from_member_id(account.bytes)


def test_renewal_moves_every_channel_to_the_new_credential(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    with client(stack, ids("a")) as a, client(stack, ids("b")) as b:
        chan_a = a.create_channel(channel_name)
        chan_b = b.join_channel(channel_name, chan_a.add_member(b.generate_key_package()))
        first = a.engine.credential
        assert first is not None
        epoch = chan_b.epoch
        time.sleep(1.1)  # a later not_before, so the renewal is visibly a new credential
        a.renew_credential()
        renewed = a.engine.credential
        assert renewed is not None and renewed.not_before > first.not_before
        # The update commit reached b; the member is the same agent.
        chan_a.send(b"after renewal")
        assert take(chan_b, 1) == [b"after renewal"]
        assert chan_b.epoch == epoch + 1
        assert chan_b.members() == chan_a.members() == [a.agent_id, b.agent_id]


def test_credentials_renew_by_themselves_before_they_expire(channel_name: str, ids: Any) -> None:
    ttl = 10
    with (
        LocalStack(agent_credential_ttl_seconds=ttl) as short,
        client(short, ids("a")) as a,
        client(short, ids("b")) as b,
    ):
        chan_a = a.create_channel(channel_name)
        chan_b = b.join_channel(channel_name, chan_a.add_member(b.generate_key_package()))
        first = a.engine.credential
        assert first is not None and first.not_after - first.not_before == ttl
        # Past the first credential's expiry: both renewed on their own, and commits
        # (which need a valid credential of the committer) still go through.
        time.sleep(first.not_after - time.time() + 1)
        renewed = a.engine.credential
        assert renewed is not None and renewed.not_after > first.not_after
        with client(short, ids("c")) as c:
            chan_c = c.join_channel(channel_name, chan_a.add_member(c.generate_key_package()))
            chan_b.send(b"still verified")
            assert take(chan_c, 1) == [b"still verified"]
            assert take(chan_a, 1) == [b"still verified"]


def test_a_data_dir_cannot_change_account(stack: LocalStack, ids: Any) -> None:
    name = ids("a")
    with client(stack, name):
        pass
    other_key = stack.signup()["api_key"]["key"]
    with pytest.raises(MlsError, match="agent credential is for account"):
        client(stack, name, api_key=other_key)
