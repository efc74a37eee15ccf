"""Every public entry point of the client library given bad input: a specific error,
and the channel still works afterwards."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from svc_sdk import (
    AccessError,
    AuthError,
    ChannelClosedError,
    MlsError,
    SvcChannelManager,
    SvcClient,
    TransportError,
)
from svc_sdk.channel import MAX_PAYLOAD
from svc_sdk.relay_client import RelayError
from svc_sdk.relay_frames import JoinRequest
from svc_sdk.testing import LocalStack

from .helpers import client, pair, take


def test_constructor_arguments(stack: LocalStack, tmp_path: Path) -> None:
    auth: dict[str, Any] = {"api_key": stack.api_key, "api_url": stack.api_url}
    with pytest.raises(TypeError, match="identity must be bytes"):
        SvcClient(stack.relay_url, tmp_path / "a", "alice", **auth)  # type: ignore[arg-type]
    for identity in (b"", b"x" * 1025):
        with pytest.raises(ValueError, match="1 to 1024 bytes"):
            SvcClient(stack.relay_url, tmp_path / "a", identity, **auth)
    for endpoint in ("", " , "):
        with pytest.raises(TransportError, match="^transport error: no relay address"):
            SvcClient(endpoint, tmp_path / "a", b"a", **auth)
    with pytest.raises(TypeError, match="endpoint must be a str"):
        SvcClient(None, tmp_path / "a", b"a", **auth)  # type: ignore[arg-type]
    # An API address that is not a URL.
    with pytest.raises(TransportError, match="^transport error: account API address .* not a URL"):
        SvcClient(stack.relay_url, tmp_path / "a", b"a", stack.api_key, "http://[::1")
    for key in ("sk_live_REPLACE…", "sk_live_a\nb", "sk_live_\x00"):
        with pytest.raises(AuthError, match="^auth error: the API key contains characters"):
            SvcClient(stack.relay_url, tmp_path / "a", b"a", key, stack.api_url)


def test_channel_calls(stack: LocalStack, channel_name: str, ids: Any) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        with pytest.raises(TypeError, match="payload must be bytes"):
            chan_a.send("text")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="^runtime error: payload is .* the limit is"):
            chan_a.send(b"x" * (MAX_PAYLOAD + 1))
        with pytest.raises(RuntimeError):  # one error contract: also a RuntimeError
            chan_a.send_batch([b"small", b"x" * (MAX_PAYLOAD + 1)])
        # The largest payload goes through (MLS padding and framing included), and so does
        # the first size that used to pad past the relay's limit, refused now up front.
        chan_a.send(b"y" * MAX_PAYLOAD)
        assert take(chan_b, 1) == [b"y" * MAX_PAYLOAD]
        with pytest.raises(ValueError, match="the limit is"):
            chan_a.send(b"z" * 917_434)
        with pytest.raises(TypeError, match="takes a list of bytes"):
            chan_a.send_batch(b"abc")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="key_package must be bytes"):
            chan_a.add_member(5)  # type: ignore[arg-type]
        with pytest.raises(MlsError, match="^MLS engine error: .*not a member|^MLS engine"):
            chan_a.remove_member(b"nobody")
        with pytest.raises(TypeError, match="welcome must be bytes"):
            cb.join_channel("acme/tests/x", "welcome")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_uses must be a positive integer"):
            ca.invite(channel_name, max_uses=0)
        with pytest.raises(ValueError, match="ttl must be a positive integer"):
            ca.invite(channel_name, ttl=-1)
        with pytest.raises(KeyError):
            ca.channel("acme/tests/not-joined")
        with pytest.raises(TypeError, match="timeout must be seconds or None, not str"):
            chan_b.next_message("soon")  # type: ignore[arg-type]
        for timeout in (-1, float("nan")):
            with pytest.raises(ValueError, match="timeout must be 0 or more seconds"):
                chan_b.next_messages(timeout)
        with pytest.raises(TypeError, match="timeout must be seconds or None"):
            chan_b.messages(timeout=True)
        for bad in (-1, float("nan")):
            with pytest.raises(ValueError, match="timeout must be 0 or more seconds"):
                chan_b.update_keys(timeout=bad)
        with pytest.raises(TypeError, match="timeout must be seconds or None, not str"):
            chan_b.update_keys(timeout="soon")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="accept must be a callable or None, not int"):
            chan_b.next_messages(0.1, accept=5)  # type: ignore[arg-type]
        for limit in (0, -3, 1.5, True):
            with pytest.raises(ValueError, match="limit must be a positive integer or None"):
                chan_b.next_messages(0.1, limit=limit)  # type: ignore[arg-type]
        chan_a.send_batch([])  # nothing to do, not an error
        chan_a.send(b"still works")
        assert take(chan_b, 1) == [b"still works"]
    with pytest.raises(ChannelClosedError, match="^runtime error: the client is closed"):
        chan_a.send(b"after close")
    for closed in (chan_a, chan_b):  # an owner's commit, a plain member's proposal
        with pytest.raises(ChannelClosedError, match="^runtime error: the client is closed"):
            closed.update_keys()
    # The calls that go to the account API, too (they raised httpx's bare RuntimeError
    # "Cannot send a request, as the client has been closed"; tests/client/
    # test_error_contract.py found it).
    for call in (
        lambda: ca.invite(channel_name),
        ca.account_channels,
        lambda: ca.channel_members(channel_name),
        lambda: ca.channel_events(channel_name),
    ):
        with pytest.raises(ChannelClosedError, match="^runtime error: the client is closed"):
            call()
    assert list(chan_b.messages()) == []  # a closed channel's iterator ends


def test_manager_calls(stack: LocalStack, channel_name: str, ids: Any) -> None:
    with pytest.raises(TypeError, match="identity must be bytes or str"):
        SvcChannelManager(42, stack.relay_url, api_key=stack.api_key)  # type: ignore[arg-type]
    alice = stack.manager(ids("alice"))
    with pytest.raises(ChannelClosedError, match="not in channel"):
        alice.send(channel_name, "no such channel yet")
    with pytest.raises(ChannelClosedError, match="not in channel"):
        alice.receive(channel_name, timeout=0.1)
    alice.create(channel_name)
    with pytest.raises(TypeError, match="takes an Envelope"):
        alice.send_envelope(channel_name, b"raw bytes")  # type: ignore[arg-type]


def test_join_request_frames_are_checked(stack: LocalStack, channel_name: str, ids: Any) -> None:
    """The relay's JoinRequest: not a UUID, not the caller's, another agent's key package."""
    owner = client(stack, ids("owner"))
    other_key = stack.signup()["api_key"]["key"]
    mallory = client(stack, ids("mallory"), api_key=other_key)
    with owner, mallory:
        owner.create_channel(channel_name)
        token = owner.invite(channel_name, max_uses=2)
        assert mallory.api is not None
        # Another account's agent's key package: the API refuses to take it from mallory.
        with client(stack, ids("victim")) as victim:
            victim_kp = victim.generate_key_package()
        with pytest.raises(AccessError, match="belongs to an agent of another account"):
            mallory.api.redeem_invite(channel_name, token, victim_kp)
        # Mallory's own other agent's key package: the relay will not post it for mallory.
        with client(stack, ids("mallory2"), api_key=other_key) as mallory2:
            join_id = mallory.api.redeem_invite(
                channel_name, token, mallory2.generate_key_package()
            )

        def post(join: str) -> RelayError:
            with pytest.raises(RelayError) as info:
                mallory.link.request(JoinRequest(channel=channel_name, join_id=join), timeout=10)
            return info.value

        assert "not a UUID" in str(post("not-a-uuid"))
        assert "no valid join request" in str(post(str(uuid.uuid4())))
        assert "another agent identity" in str(post(join_id))
        # An account that never redeemed cannot post into the channel at all.
        third = client(stack, ids("third"), api_key=stack.signup()["api_key"]["key"])
        with third, pytest.raises(AccessError, match="already exists|no access"):
            third.create_channel(channel_name)
