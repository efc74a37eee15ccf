"""Who may let whom into a channel: the attacks of the membership issue that are closed so
far, each replayed as a user of the library would try it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from svc_sdk import AccessError, ChannelClosedError, InviteError
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.mls import MlsError
from svc_sdk.relay_client import Code, RelayConnection
from svc_sdk.testing import LocalStack

from .helpers import client, pair, take


def test_a_removed_member_cannot_invite_itself_back(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    bob_key = stack.signup()["api_key"]["key"]
    alice = stack.manager(ids("alice"))
    bob = stack.manager(ids("bob"), api_key=bob_key)
    alice.create(channel_name)
    bob.join_with_token(channel_name, alice.invite(channel_name), timeout=20)
    alice.remove_member(channel_name, bob.agent_id)
    # A fresh data_dir, the same key: the account lost the channel with its last member
    # (its spent redemption does not keep it in), so it cannot mint an invite to return.
    again = stack.manager(ids("bob"), api_key=bob_key, data_dir=stack.agent_dir(ids("bob2")))
    deadline = time.monotonic() + 15
    while True:  # the removal reaches the account API just after the relay took it
        try:
            again.invite(channel_name, max_uses=10_000, ttl=30 * 86_400)
        except InviteError as exc:
            assert "no channel" in str(exc)
            break
        except AccessError:  # still a (plain) member there: not yet, never an invite
            assert time.monotonic() < deadline, "the removal never reached the account API"
            time.sleep(0.1)
            continue
        pytest.fail("a removed member's account minted an invite")
    assert alice.members(channel_name) == [alice.agent_id]
    # Nor can any agent of bob's account still reach the channel on the relay.
    assert _relay_code(stack, bob_key, ids("bob"), channel_name) == DENIED


DENIED = Code.PERMISSION_DENIED


def _relay_code(stack: LocalStack, api_key: str, identity: str, channel: str) -> int:
    """The relay's answer to a raw Subscribe of ``channel`` by an agent of the account."""
    token = httpx.post(
        f"{stack.api_url}/v1/tokens", headers={"Authorization": f"Bearer {api_key}"}
    ).json()["token"]

    async def subscribe() -> int:
        async with RelayConnection(stack.relay_url, token, identity.encode()) as conn:
            reply = await conn.request(pb.Subscribe(channel=channel), check=False)
            return reply.code

    return asyncio.run(subscribe())


def test_a_plain_member_cannot_add_remove_or_promote_and_the_channel_goes_on(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """Roles live in the group: a member's own engine refuses to commit what the policy
    forbids (the relay and every other member refuse it too: tests/relay,
    native/tests/membership.rs), and nothing reaches the channel."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("alice"), ids("bob"))
    cc = client(stack, ids("carol"))
    with ca, cb, cc:
        assert chan_a.roles() == {ca.agent_id: "owner", cb.agent_id: "member"}
        epoch = chan_b.epoch
        with pytest.raises(MlsError, match="policy: "):
            chan_b.add_member(cc.generate_key_package())
        with pytest.raises(MlsError, match="policy: "):
            chan_b.remove_member(ca.agent_id)
        with pytest.raises(MlsError, match="policy: "):
            chan_b.set_role(cb.agent_id, "admin")
        assert chan_b.epoch == epoch
        chan_a.send(b"still one channel")
        assert take(chan_b, 1) == [b"still one channel"]
        # Once the owner makes bob an admin, the same add goes through.
        chan_a.set_role(cb.agent_id, "admin")
        deadline = time.monotonic() + 20
        while chan_b.roles().get(cb.agent_id) != "admin" and time.monotonic() < deadline:
            time.sleep(0.05)
        chan_c = cc.join_channel(channel_name, chan_b.add_member(cc.generate_key_package()))
        assert sorted(chan_c.members()) == sorted([ca.agent_id, cb.agent_id, cc.agent_id])
        # Nobody but the owner hands ownership over, and the owner cannot be removed.
        with pytest.raises(MlsError, match="policy: "):
            chan_b.remove_member(ca.agent_id)
        chan_a.send(b"after the refusals")
        assert take(chan_c, 1) == [b"after the refusals"]


def test_a_member_whose_promotion_is_still_in_flight_adds_at_once(
    stack: LocalStack, channel_name: str, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob's engine judges the policy on his copy of the group. When the owner's commit
    promoting him is accepted but not yet processed by his client (here: held back from
    his first look at what arrived), his add catches up with the relay and goes through
    instead of failing with a policy error."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("alice"), ids("bob"))
    cc = client(stack, ids("carol"))
    with ca, cb, cc:
        real = chan_b._drain_available
        held: list[bool] = []

        def late(*args: Any, **kwargs: Any) -> Any:
            if not held:
                held.append(True)
                return None
            return real(*args, **kwargs)

        monkeypatch.setattr(chan_b, "_drain_available", late)
        chan_a.set_role(cb.agent_id, "admin")
        chan_c = cc.join_channel(channel_name, chan_b.add_member(cc.generate_key_package()))
        assert held, "the promotion was held back once"
        assert chan_b.roles()[cb.agent_id] == "admin"
        chan_a.send(b"to carol")
        assert take(chan_c, 1) == [b"to carol"]


def behind(channel: Any) -> None:
    """The next call on ``channel`` acts before reading what arrived: as if a commit
    reached the relay just after this agent last looked."""
    real = channel._drain_available
    calls = [0]

    def drain() -> None:
        calls[0] += 1
        if calls[0] > 1:
            real()

    channel._drain_available = drain


def test_a_message_encrypted_before_a_commit_goes_again_in_the_new_epoch(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("alice"), ids("bob"))
    with ca, cb:
        epoch = chan_b.epoch
        chan_a.update_keys()
        behind(chan_b)
        chan_b.send(b"encrypted in the old epoch first")
        chan_b.wait_stored()  # refused as stale, re-encrypted in the new epoch, stored
        assert chan_b.epoch == epoch + 1
        assert take(chan_a, 1) == [b"encrypted in the old epoch first"]
        chan_b.send(b"next")
        assert take(chan_a, 1) == [b"next"], "once, in order"


def test_a_removed_members_late_message_is_refused_not_lost_in_the_log(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """Sent by bob just after his removal reached the relay: the relay used to store it
    behind the commit, where no member can read it (mls-rs refuses a past epoch's message
    from a leaf that is gone), and bob's send() returned. Now bob learns he is out: his
    send() is queued, and the refusal surfaces on his next call."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("alice"), ids("bob"))
    cc = client(stack, ids("carol"))
    with ca, cb, cc:
        chan_c = cc.join_channel(channel_name, chan_a.add_member(cc.generate_key_package()))
        take(chan_b, 0)
        chan_a.remove_member(cb.agent_id)
        behind(chan_b)
        chan_b.send(b"after my removal")
        with pytest.raises(ChannelClosedError):
            chan_b.wait_stored()
        assert chan_b.unsent == 0
        chan_a.send(b"only this")
        assert take(chan_c, 1) == [b"only this"]
        assert chan_c.next_messages(0.5) == []


def test_the_committer_reads_what_was_sent_before_its_commit(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """Found by the soak benchmark: bob's last message, stored just before alice's commit
    removing him, was read by every member but alice. She applied her commit on the
    relay's Reply, before reading what the relay had ordered ahead of it, and mls-rs then
    refuses a past epoch's message from a leaf the commit emptied."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("alice"), ids("bob"))
    with ca, cb:
        chan_b.send(b"last words")
        behind(chan_a)  # alice commits before she has read it
        chan_a.remove_member(cb.agent_id)
        assert take(chan_a, 1) == [b"last words"]


def test_a_removed_admins_invites_let_nobody_in(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """Mallory, an admin of another account, mints an invite with many uses and is then
    removed. With the owner's client online (it adds whoever redeems an invite), neither
    an agent of her own account nor one she hands the token to gets in with it."""
    mallory_key = stack.signup()["api_key"]["key"]
    eve_key = stack.signup()["api_key"]["key"]
    alice = stack.manager(ids("alice"))
    mallory = stack.manager(ids("mallory"), api_key=mallory_key)
    alice.create(channel_name)
    mallory.join_with_token(channel_name, alice.invite(channel_name), timeout=20)
    alice.client.channel(channel_name).set_role(mallory.agent_id, "admin")
    kept = mallory.invite(channel_name, max_uses=10, ttl=3600)
    alice.remove_member(channel_name, mallory.agent_id)
    for name, key in (("mallory2", mallory_key), ("eve", eve_key)):
        late = stack.manager(ids(name), api_key=key)
        with pytest.raises(InviteError) as info:
            late.join_with_token(channel_name, kept, timeout=10)
        assert info.value.reason == "expired", info.value
    assert alice.members(channel_name) == [alice.agent_id]
