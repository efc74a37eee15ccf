"""Who may let whom into a channel: the attacks of the membership issue that are closed so
far, each replayed as a user of the library would try it."""

from __future__ import annotations

from typing import Any

import pytest

from svc_sdk import AccessError
from svc_sdk.testing import LocalStack


def test_a_removed_member_cannot_invite_itself_back(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    bob_key = stack.signup()["api_key"]["key"]
    alice = stack.manager(ids("alice"))
    bob = stack.manager(ids("bob"), api_key=bob_key)
    alice.create(channel_name)
    bob.join_with_token(channel_name, alice.invite(channel_name), timeout=20)
    alice.remove_member(channel_name, bob.agent_id)
    # A fresh data_dir, the same key: the account is still admitted, but it is not the
    # channel's owner, so it cannot mint the invite it would need to get back in.
    again = stack.manager(ids("bob"), api_key=bob_key, data_dir=stack.agent_dir(ids("bob2")))
    with pytest.raises(AccessError, match="only the account that created channel"):
        again.invite(channel_name, max_uses=10_000, ttl=30 * 86_400)
    assert alice.members(channel_name) == [alice.agent_id]
