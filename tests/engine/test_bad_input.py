"""Hostile and malformed input: a specific error, and the group state left as it was."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from svc_sdk.errors import InternalError
from svc_sdk.mls import Engine, Group, MlsError, inspect

from ..conftest import ISSUER
from .helpers import make_group

MakeEngine = Callable[..., Engine]
PREFIX = "^MLS engine error: "


def assert_unchanged(sender: Group, receiver: Group, epoch: int) -> None:
    assert receiver.epoch == epoch
    assert not receiver.has_pending_commit
    assert receiver.process(sender.encrypt(b"still fine")).data == b"still fine"


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [
        (b"", "malformed MLS message"),
        (b"\x00", "malformed MLS message"),
        (b"\xff" * 64, "malformed MLS message"),
        (os.urandom(4096), "malformed MLS message"),
    ],
)
def test_garbage_is_rejected(make_engine: MakeEngine, garbage: bytes, reason: str) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    with pytest.raises(MlsError, match=PREFIX + reason):
        bob.process(garbage)
    assert_unchanged(alice, bob, 1)


def test_truncated_message(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    ciphertext = alice.encrypt(b"x" * 100)
    for cut in (1, len(ciphertext) // 2, len(ciphertext) - 1):
        with pytest.raises(MlsError, match=PREFIX + "malformed MLS message"):
            bob.process(ciphertext[:cut])
    assert bob.process(ciphertext).data == b"x" * 100


def test_tampered_ciphertext(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    ciphertext = bytearray(alice.encrypt(b"payload"))
    ciphertext[-5] ^= 0x40
    with pytest.raises(MlsError, match=PREFIX):
        bob.process(bytes(ciphertext))
    assert_unchanged(alice, bob, 1)


def test_replayed_message(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    ciphertext = alice.encrypt(b"once")
    assert bob.process(ciphertext).data == b"once"
    with pytest.raises(MlsError, match=PREFIX + r".*(replayed|generation|consumed)"):
        bob.process(ciphertext)
    assert_unchanged(alice, bob, 1)


def test_replayed_commit(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    pending = alice.self_update()
    alice.apply_pending_commit()
    bob.process(pending.commit)
    with pytest.raises(MlsError, match=PREFIX + "wrong epoch"):
        bob.process(pending.commit)
    assert_unchanged(alice, bob, 2)


def test_message_for_another_group(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    other = make_engine("mallory").create_group(b"elsewhere")
    with pytest.raises(MlsError, match=PREFIX + "message belongs to group"):
        bob.process(other.encrypt(b"x"))
    assert_unchanged(alice, bob, 1)


def test_forged_message_from_non_member(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    # Mallory knows the group id but none of its secrets.
    fake = make_engine("mallory").create_group(b"org/ns/svc")
    for _ in range(2):
        fake.self_update()
        fake.apply_pending_commit()
    with pytest.raises(MlsError, match=PREFIX):
        bob.process(fake.encrypt(b"forged"))
    assert_unchanged(alice, bob, 1)


def test_message_from_the_future(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    alice.self_update()
    alice.apply_pending_commit()  # bob never sees this commit
    with pytest.raises(
        MlsError, match=PREFIX + "wrong epoch: message is for epoch 2, group is at epoch 1"
    ):
        bob.process(alice.encrypt(b"from epoch 2"))
    assert bob.epoch == 1


def test_wrong_message_kinds(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    key_package = make_engine("carol").generate_key_package()
    with pytest.raises(MlsError, match=PREFIX + "expected a group message"):
        bob.process(key_package)
    with pytest.raises(MlsError, match=PREFIX + "expected a key package, got private message"):
        alice.add_members([alice.encrypt(b"not a key package")])
    with pytest.raises(MlsError, match=PREFIX + "expected a Welcome, got key package"):
        make_engine("dave").join_group(key_package)
    assert_unchanged(alice, bob, 1)


def test_key_package_of_another_cipher_suite(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    p256 = make_engine("carol", cipher_suite=2)
    with pytest.raises(
        MlsError, match=PREFIX + "bad key package: it uses cipher suite 2, the group uses 1"
    ):
        alice.add_members([p256.generate_key_package()])
    assert not alice.has_pending_commit
    assert_unchanged(alice, bob, 1)


def test_key_package_garbage_and_duplicates(make_engine: MakeEngine, tmp_path: Path) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    with pytest.raises(MlsError, match=PREFIX + "malformed key package"):
        alice.add_members([b"\x00\x01garbage"])
    with pytest.raises(MlsError, match=PREFIX + "malformed key package list"):
        alice.add_members([])
    # The same identity from a second data_dir: bob's agent reinstalled on another host.
    bob_elsewhere = ISSUER.certify(Engine(tmp_path / "bob-host2", b"bob"))
    account = ISSUER.account
    with pytest.raises(
        MlsError, match=PREFIX + f'bad key package: "bob@{account}" is already a member'
    ):
        alice.add_members([bob_elsewhere.generate_key_package()])
    carol_1 = ISSUER.certify(Engine(tmp_path / "c1", b"carol"))
    carol_2 = ISSUER.certify(Engine(tmp_path / "c2", b"carol"))
    with pytest.raises(
        MlsError, match=PREFIX + f'bad key package: "carol@{account}" is already a member'
    ):
        alice.add_members([carol_1.generate_key_package(), carol_2.generate_key_package()])
    assert_unchanged(bob, alice, 1)


def test_welcome_for_someone_else(make_engine: MakeEngine) -> None:
    alice_engine, bob_engine, carol_engine = (
        make_engine("alice"),
        make_engine("bob"),
        make_engine("carol"),
    )
    group = alice_engine.create_group(b"g")
    pending = group.add_members([bob_engine.generate_key_package()])
    assert pending.welcome is not None
    with pytest.raises(
        MlsError, match=PREFIX + "invalid Welcome: it is not addressed to any key package"
    ):
        carol_engine.join_group(pending.welcome)
    assert carol_engine.group_ids() == []
    joined = bob_engine.join_group(pending.welcome)
    assert joined.group_id == b"g"
    with pytest.raises(MlsError, match=PREFIX):
        bob_engine.join_group(pending.welcome)


def test_welcome_garbage(make_engine: MakeEngine) -> None:
    engine = make_engine("bob")
    with pytest.raises(MlsError, match=PREFIX + "malformed Welcome"):
        engine.join_group(b"\x00\x01\x00\x03abc")
    assert engine.group_ids() == []


def test_engine_arguments(tmp_path: Path) -> None:
    Engine(tmp_path / "a", b"alice")
    with pytest.raises(MlsError, match=PREFIX + 'data_dir belongs to identity "alice", not "bob"'):
        Engine(tmp_path / "a", b"bob")
    with pytest.raises(MlsError, match=PREFIX + "identity must be 1 to 1024 bytes, got 0"):
        Engine(tmp_path / "b", b"")
    with pytest.raises(MlsError, match=PREFIX + "unsupported cipher suite 7"):
        Engine(tmp_path / "c", b"x", cipher_suite=7)
    with pytest.raises(MlsError, match=PREFIX + "data_dir was created with cipher suite 1, not 2"):
        Engine(tmp_path / "a", b"alice", cipher_suite=2)
    (tmp_path / "file").write_text("not a directory")
    # Not an MLS failure: the folder is unusable as given.
    with pytest.raises(
        InternalError, match="^runtime error: cannot use data_dir .* not a directory"
    ):
        Engine(tmp_path / "file", b"x")
    with pytest.raises(TypeError):
        Engine(tmp_path / "d", "a str is not bytes")  # type: ignore[arg-type]


def test_data_dir_permissions(tmp_path: Path) -> None:
    data_dir = tmp_path / "agent"
    engine = ISSUER.certify(Engine(data_dir, b"alice"))
    engine.create_group(b"g").encrypt(b"x")
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    files = list(data_dir.iterdir())
    assert files, "the store must exist"
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f"{f.name} is readable by others"


def test_loose_data_dir_is_tightened(tmp_path: Path) -> None:
    data_dir = tmp_path / "loose"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)
    Engine(data_dir, b"alice")
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700


def test_credential_entry_points_refuse_bad_input(make_engine: Callable[..., Engine]) -> None:
    from svc_sdk.mls import verify_agent_credential, verify_credential_request

    engine = make_engine("alice")
    for account in (b"", b"x" * 15, b"x" * 17):
        with pytest.raises(MlsError, match=PREFIX + "malformed account id"):
            engine.credential_request(account, 0)
    content, proof = engine.credential_request(bytes(16), 1)
    for bad_content, bad_proof in (
        (content[:-1], proof),
        (content + b"\0", proof),
        (b"", proof),
        (content, proof[:-1]),
        (content, b""),
    ):
        with pytest.raises(MlsError, match=PREFIX):
            verify_credential_request(bad_content, bad_proof)
    assert verify_credential_request(content, proof).identity == b"alice"
    for anchors in ({"": bytes(32)}, {"k": bytes(31)}, {"k\u00e9": bytes(32)}):
        with pytest.raises(MlsError, match=PREFIX + "malformed trust anchor"):
            verify_agent_credential(b"\0" * 200, anchors)
    with pytest.raises(MlsError, match=PREFIX + "malformed agent credential"):
        verify_agent_credential(b"\xff" * 10, {"k": bytes(32)})
    # The engine's own entry points: refused, and what it trusted before is kept.
    before = engine.credential
    assert before is not None
    engine.set_trust_anchors({"k": bytes(32)})
    for anchors in ({"": bytes(32)}, {"k": bytes(31)}):
        with pytest.raises(MlsError, match=PREFIX + "malformed trust anchor"):
            engine.set_trust_anchors(anchors)
    assert engine.trust_anchors == ["k"]
    for credential in (b"", b"\xff" * 10):
        with pytest.raises(MlsError, match=PREFIX + "malformed agent credential"):
            engine.install_credential(credential)
    after = engine.credential
    assert after is not None and after.signature_key == before.signature_key
    assert (after.not_before, after.not_after) == (before.not_before, before.not_after)


@pytest.mark.parametrize("version", [0x0000, 0x0002, 0x0101, 0xFFFF])
def test_only_mls_1_0_messages_are_read(make_engine: MakeEngine, version: int) -> None:
    """The MLSMessage wrapper's protocol version is not signed. A key package under any
    version but MLS 1.0 (0x0001) was accepted by add_members and inspect (found by
    tests/fuzz/test_engine.py), while every other kind was refused, late; now every kind
    is refused as it is decoded."""
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    carol = make_engine("carol")
    key_package = carol.generate_key_package()
    relabel = version.to_bytes(2, "big")
    for message in (key_package, alice.encrypt(b"x")):
        with pytest.raises(MlsError, match=PREFIX + "malformed .*protocol version"):
            inspect(relabel + message[2:])
    with pytest.raises(MlsError, match=PREFIX + "malformed key package: .*protocol version"):
        alice.add_members([relabel + key_package[2:]])
    assert not alice.has_pending_commit
    with pytest.raises(MlsError, match=PREFIX + "malformed .*protocol version"):
        bob.process(relabel + alice.encrypt(b"x")[2:])
    assert_unchanged(alice, bob, alice.epoch)
    alice.add_members([key_package])  # the genuine one still works
