"""Post-quantum channels (cipher suite 65100, ML-KEM-768+X25519 with Ed25519 signatures)
through the library and a real local stack: created, joined by key package and by
invite, used both ways, a member removed; and every way a suite can be wrong."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import pytest

from svc_sdk import PQ_CIPHER_SUITE, MlsError, SvcClient
from svc_sdk.mls import Engine, GroupTracker, inspect
from svc_sdk.testing import LocalIssuer, LocalStack

from .helpers import client, take


def test_the_constant_is_the_private_range_hybrid_suite() -> None:
    assert PQ_CIPHER_SUITE == 65100


def test_a_pq_channel_joins_talks_and_removes(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    alice, bob, carol = (client(stack, ids(n)) for n in ("alice", "bob", "carol"))
    with alice, bob, carol:
        chan_a = alice.create_channel(channel_name, cipher_suite=PQ_CIPHER_SUITE)
        assert chan_a.cipher_suite == PQ_CIPHER_SUITE

        # By key package: bob makes one for the channel's suite, and the Welcome is of it.
        key_package = bob.generate_key_package(cipher_suite=PQ_CIPHER_SUITE)
        assert inspect(key_package).cipher_suite == PQ_CIPHER_SUITE
        welcome = chan_a.add_member(key_package)
        info = inspect(welcome)
        assert (info.wire_format, info.cipher_suite) == ("welcome", PQ_CIPHER_SUITE)
        chan_b = bob.join_channel(channel_name, welcome)
        assert chan_b.cipher_suite == PQ_CIPHER_SUITE

        # By invite: carol's first key package is of her own suite (1); the relay refuses it
        # and names the channel's, and she redeems the same invite again with a PQ one.
        token = alice.invite(channel_name)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            joining = pool.submit(carol.join_with_token, channel_name, token, 30)
            while not joining.done():  # alice's reads admit carol
                assert chan_a.next_message(0.2) is None
            chan_c = joining.result()
        assert chan_c.cipher_suite == PQ_CIPHER_SUITE

        chan_a.send(b"from alice")
        assert take(chan_b, 1) == [b"from alice"]
        assert take(chan_c, 1) == [b"from alice"]
        chan_b.send(b"from bob")
        chan_c.send(b"from carol")
        assert sorted(take(chan_a, 2)) == [b"from bob", b"from carol"]

        chan_a.remove_member(bob.agent_id)
        assert {str(m) for m in chan_a.members()} == {str(alice.agent_id), str(carol.agent_id)}
        chan_a.send(b"after bob")
        assert take(chan_c, 2) == [b"from bob", b"after bob"]
        # bob learns of his removal: his messages end, without what was sent after it.
        assert b"after bob" not in list(chan_b.messages(timeout=10))
        assert chan_b.closed


def test_suite_one_channels_are_as_before(stack: LocalStack, channel_name: str, ids: Any) -> None:
    alice, bob = client(stack, ids("alice")), client(stack, ids("bob"))
    with alice, bob:
        chan_a = alice.create_channel(channel_name)
        assert chan_a.cipher_suite == 1
        key_package = bob.generate_key_package()
        assert inspect(key_package).cipher_suite == 1
        welcome = chan_a.add_member(key_package)
        assert inspect(welcome).cipher_suite == 1
        chan_b = bob.join_channel(channel_name, welcome)
        chan_b.send(b"classic")
        assert take(chan_a, 1) == [b"classic"]
        # A key package for the post-quantum suite does not fit a suite-1 channel.
        with client(stack, ids("carol")) as carol:
            key_package = carol.generate_key_package(cipher_suite=65100)
        with pytest.raises(MlsError, match="cipher suite 65100, the group uses 1"):
            chan_a.add_member(key_package)


def test_a_suite_one_key_package_gets_a_clear_mls_error(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    alice, bob = client(stack, ids("alice")), client(stack, ids("bob"))
    with alice, bob:
        chan = alice.create_channel(channel_name, cipher_suite=PQ_CIPHER_SUITE)
        with pytest.raises(
            MlsError, match=r"^MLS engine error: .*cipher suite 1, the group uses 65100"
        ):
            chan.add_member(bob.generate_key_package())
        assert chan.members() == [alice.agent_id]


def _p256_client(stack: LocalStack, name: str) -> SvcClient:
    """An agent whose data_dir was made for suite 2 (a P-256 signature key)."""
    Engine(stack.agent_dir(name), name.encode(), cipher_suite=2).close()
    return client(stack, name)


def test_an_agent_that_cannot_use_the_pq_suite_gets_a_clear_mls_error(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    alice, pam = client(stack, ids("alice")), _p256_client(stack, ids("pam"))
    with alice, pam:
        assert pam.engine.channel_cipher_suites == [2]
        alice.create_channel(channel_name, cipher_suite=PQ_CIPHER_SUITE)
        with pytest.raises(MlsError, match="^MLS engine error: cipher suite 65100 is not one"):
            pam.generate_key_package(cipher_suite=PQ_CIPHER_SUITE)
        with pytest.raises(MlsError, match="^MLS engine error: cipher suite 65100 is not one"):
            pam.create_channel(channel_name + "x", cipher_suite=PQ_CIPHER_SUITE)
        # By invite: the relay names the channel's suite, which pam cannot make a key package
        # for; the invite's use is not lost to a failed admission on the member's side.
        with pytest.raises(MlsError, match=r"uses cipher suite 65100, which this agent cannot use"):
            pam.join_with_token(channel_name, alice.invite(channel_name), timeout=10)
        assert pam.channels() == []


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (
            3,
            MlsError,
            "cipher suite 3 is not one a channel of this agent can use; supported: 1, 65100",
        ),
        (2, MlsError, "cipher suite 2 is not one"),
        (0, MlsError, "cipher suite 0 is not one"),
        (65002, MlsError, "cipher suite 65002 is not one"),
        (70_000, MlsError, "cipher suite 70000 is not one"),
        (-1, MlsError, "cipher suite -1 is not one"),
        ("65100", TypeError, "cipher_suite must be an int"),
        (True, TypeError, "cipher_suite must be an int"),
        (65100.0, TypeError, "cipher_suite must be an int"),
    ],
)
def test_bad_suite_values_are_refused_clearly(
    stack: LocalStack, channel_name: str, ids: Any, value: object, error: type, match: str
) -> None:
    with client(stack, ids("alice")) as alice:
        with pytest.raises(error, match=match):
            alice.create_channel(channel_name, cipher_suite=value)  # type: ignore[arg-type]
        with pytest.raises(error, match=match):
            alice.generate_key_package(cipher_suite=value)  # type: ignore[arg-type]
        assert alice.channels() == []


def test_the_engine_refuses_bad_suites_and_the_tracker_follows_pq_commits(
    make_engine: Callable[..., Engine], issuer: LocalIssuer
) -> None:
    alice, bob, carol = make_engine("alice"), make_engine("bob"), make_engine("carol")
    for bad in (3, 70_000, -5):
        with pytest.raises(MlsError, match=f"cipher suite {bad} is not one"):
            alice.create_group(b"bad", bad)
        with pytest.raises(MlsError, match=f"cipher suite {bad} is not one"):
            alice.generate_key_package(bad)

    group = alice.create_group(b"pq", PQ_CIPHER_SUITE)
    group_info = group.group_info()
    assert inspect(group_info).cipher_suite == PQ_CIPHER_SUITE
    tracker = GroupTracker()
    tracker.set_trust_anchors(issuer.anchors)
    tracked = tracker.observe(group_info)
    assert tracked.cipher_suite == PQ_CIPHER_SUITE

    pending = group.add_members([bob.generate_key_package(PQ_CIPHER_SUITE)])
    tracked.process(pending.commit)  # the relay's validation, as it runs it
    group.apply_pending_commit()
    assert pending.welcome is not None
    bob_group = bob.join_group(pending.welcome)
    # The commit is a PublicMessage, whose framing names no suite: the tracker, which
    # verified it under the group's suite, and its size show it is a 65100 commit (its
    # update path carries X-Wing public keys of 1,216 bytes, not X25519's 32).
    assert inspect(pending.commit).cipher_suite is None
    assert len(pending.commit) > 1216

    add_carol = group.add_members([carol.generate_key_package(PQ_CIPHER_SUITE)])
    tracked.process(add_carol.commit)
    group.apply_pending_commit()
    bob_group.process(add_carol.commit)
    assert add_carol.welcome is not None
    carol_group = carol.join_group(add_carol.welcome)
    assert tracked.epoch == group.epoch == bob_group.epoch == carol_group.epoch
    assert carol_group.process(bob_group.encrypt(b"pq")).data == b"pq"


def test_the_manager_creates_a_pq_channel_and_admits_by_invite(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    alice, bob = stack.manager(ids("alice")), stack.manager(ids("bob"))
    alice.create(channel_name, cipher_suite=PQ_CIPHER_SUITE)
    bob.join_with_token(channel_name, alice.invite(channel_name), timeout=30)
    assert bob.client.channel(channel_name).cipher_suite == PQ_CIPHER_SUITE
    bob.send(channel_name, "hello from bob")
    assert alice.receive(channel_name, timeout=10) == ["hello from bob"]
