"""Group lifecycle through the Python API: membership, epochs, the commit flow."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from svc_sdk.agent_credential import CREDENTIAL_TYPE
from svc_sdk.mls import Engine, MlsError, PolicyError, inspect, verify_agent_credential

from ..conftest import ISSUER, member_id
from .helpers import make_group

MakeEngine = Callable[[str], Engine]


def test_two_members_exchange_both_ways(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    received = bob.process(alice.encrypt(b"hello bob"))
    assert (received.kind, received.sender, received.data) == (
        "application",
        member_id("alice"),
        b"hello bob",
    )
    received = alice.process(bob.encrypt(b"hello alice"))
    assert (received.sender, received.data) == (member_id("bob"), b"hello alice")
    assert alice.members() == bob.members() == [member_id("alice"), member_id("bob")]
    assert alice.epoch == bob.epoch == 1


def test_three_members_all_decrypt(make_engine: MakeEngine) -> None:
    groups = make_group(make_engine("alice"), make_engine("bob"), make_engine("carol"))
    for sender in groups:
        ciphertext = sender.encrypt(b"to everyone")
        for receiver in groups:
            if receiver is not sender:
                assert receiver.process(ciphertext).data == b"to everyone"


def test_add_reports_who_joined(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    pending = alice.add_members([make_engine("carol").generate_key_package()])
    assert pending.epoch == 1 and pending.welcome is not None
    assert alice.has_pending_commit
    applied = alice.apply_pending_commit()
    assert (applied.kind, applied.added, applied.epoch) == ("commit", [member_id("carol")], 2)
    seen = bob.process(pending.commit)
    assert (seen.sender, seen.added, seen.epoch) == (member_id("alice"), [member_id("carol")], 2)


def test_removed_member_can_no_longer_decrypt(make_engine: MakeEngine) -> None:
    bob_engine = make_engine("bob")
    alice, bob, carol = make_group(make_engine("alice"), bob_engine, make_engine("carol"))
    pending = alice.remove_members([member_id("bob")])
    alice.apply_pending_commit()
    outcome = bob.process(pending.commit)
    assert outcome.self_removed and outcome.removed == [member_id("bob")]
    assert carol.process(pending.commit).removed == [member_id("bob")]
    after = alice.encrypt(b"bob must not read this")
    with pytest.raises(MlsError, match="^MLS engine error: .*removed"):
        bob.process(after)
    assert bob_engine.group_ids() == []
    assert carol.process(after).data == b"bob must not read this"
    assert alice.members() == [member_id("alice"), member_id("carol")]


def test_remove_unknown_or_self_is_an_error(make_engine: MakeEngine) -> None:
    alice, _ = make_group(make_engine("alice"), make_engine("bob"))
    with pytest.raises(MlsError, match="not a member"):
        alice.remove_members([member_id("nobody")])
    with pytest.raises(MlsError, match="cannot remove itself"):
        alice.remove_members([member_id("alice")])
    assert not alice.has_pending_commit and alice.epoch == 1


def test_self_update_moves_everyone_to_next_epoch(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    pending = alice.self_update()
    assert pending.welcome is None
    alice.apply_pending_commit()
    assert bob.process(pending.commit).sender == member_id("alice")
    assert alice.epoch == bob.epoch == 2
    assert alice.process(bob.encrypt(b"fresh keys")).data == b"fresh keys"


def test_a_plain_members_key_update_is_a_proposal_an_admin_commits(
    make_engine: MakeEngine,
) -> None:
    alice, bob, carol = make_group(make_engine("alice"), make_engine("bob"), make_engine("carol"))
    with pytest.raises(PolicyError, match="only the owner and admins commit"):
        bob.self_update()
    assert not bob.has_pending_commit
    before = alice.epoch
    proposal = bob.propose_update()
    assert inspect(proposal).content_type == "proposal"
    assert alice.process(proposal).kind == carol.process(proposal).kind == "proposal"
    commit = alice.self_update()
    assert alice.apply_pending_commit().updated == [member_id("bob")]
    assert (
        bob.process(commit.commit).updated
        == carol.process(commit.commit).updated
        == [member_id("bob")]
    )
    assert alice.epoch == bob.epoch == carol.epoch == before + 1
    ciphertext = bob.encrypt(b"fresh keys")
    assert alice.process(ciphertext).data == carol.process(ciphertext).data == b"fresh keys"


def test_concurrent_commits_resolved_the_delivery_service_way(make_engine: MakeEngine) -> None:
    carol_engine = make_engine("carol")
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    promote = alice.set_role(member_id("bob"), "admin")
    alice.apply_pending_commit()
    bob.process(promote.commit)
    # Both admins commit in epoch 2; the relay accepts the first (alice's), rejects bob's.
    winner = alice.add_members([carol_engine.generate_key_package()])
    loser = bob.self_update()
    assert winner.epoch == loser.epoch == 2
    alice.apply_pending_commit()
    bob.clear_pending_commit()
    assert not bob.has_pending_commit
    bob.process(winner.commit)
    assert winner.welcome is not None
    carol = carol_engine.join_group(winner.welcome)
    # Bob rebuilds his commit on the new epoch; now it is the only one and is accepted.
    retry = bob.self_update()
    assert retry.epoch == 3
    bob.apply_pending_commit()
    alice.process(retry.commit)
    carol.process(retry.commit)
    assert alice.epoch == bob.epoch == carol.epoch == 4
    ciphertext = carol.encrypt(b"converged")
    assert alice.process(ciphertext).data == bob.process(ciphertext).data == b"converged"
    # The losing commit is stale for everyone.
    with pytest.raises(MlsError, match="wrong epoch"):
        alice.process(loser.commit)


def test_own_commit_echoed_by_relay_applies_it(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    pending = alice.self_update()
    # The relay echoes the accepted commit back; processing it applies the pending commit.
    assert alice.process(pending.commit).kind == "commit"
    assert not alice.has_pending_commit and alice.epoch == 2
    bob.process(pending.commit)
    assert bob.epoch == 2


def test_second_commit_while_one_is_pending_is_refused(make_engine: MakeEngine) -> None:
    alice, _ = make_group(make_engine("alice"), make_engine("bob"))
    alice.self_update()
    with pytest.raises(MlsError, match="already pending"):
        alice.self_update()
    alice.clear_pending_commit()
    with pytest.raises(MlsError, match="no commit is pending"):
        alice.apply_pending_commit()


def test_application_message_from_previous_epoch_still_decrypts(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    # Bob sends before he has seen alice's commit; the relay orders his message after it.
    late = bob.encrypt(b"sent in epoch 1")
    pending = alice.self_update()
    alice.apply_pending_commit()
    assert alice.process(late).data == b"sent in epoch 1"
    bob.process(pending.commit)


def test_inspect_reads_framing_without_keys(make_engine: MakeEngine) -> None:
    alice, _ = make_group(make_engine("alice"), make_engine("bob"))
    info = inspect(alice.encrypt(b"x"))
    assert (info.wire_format, info.content_type, info.epoch, info.group_id) == (
        "private_message",
        "application",
        1,
        b"org/ns/svc",
    )
    commit = alice.self_update().commit
    assert inspect(commit).content_type == "commit"
    assert inspect(alice.group_info()).wire_format == "group_info"


def test_inspect_reads_a_key_packages_credential_and_a_welcomes_recipients(
    make_engine: MakeEngine,
) -> None:
    dave = make_engine("dave")
    key_package = dave.generate_key_package()
    info = inspect(key_package)
    assert (info.wire_format, info.credential_type) == ("key_package", CREDENTIAL_TYPE)
    assert info.credential is not None and info.key_package_ref is not None
    # Unverified as read; it verifies for the key the leaf signs with.
    cred = verify_agent_credential(info.credential, ISSUER.anchors, info.signature_key)
    assert (cred.account, cred.identity) == (ISSUER.account.bytes, b"dave")
    assert info.signature_key == dave.signature_key
    group = make_engine("alice").create_group(b"g")
    welcome = group.add_members([key_package]).welcome
    assert welcome is not None
    assert inspect(welcome).welcome_refs == [info.key_package_ref]
    assert inspect(group.encrypt(b"x")).credential is None


def test_group_handles_are_shared(make_engine: MakeEngine) -> None:
    engine = make_engine("alice")
    group = engine.create_group(b"g")
    again = engine.group(b"g")
    group.self_update()
    assert again.has_pending_commit, "both handles must see one state"
    with pytest.raises(MlsError, match="already exists"):
        engine.create_group(b"g")
    with pytest.raises(MlsError, match="not found"):
        engine.group(b"missing")


def test_one_group_many_threads(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    results: list[bytes] = []
    lock = threading.Lock()

    def send(n: int) -> None:
        for i in range(20):
            ciphertext = alice.encrypt(f"{n}-{i}".encode())
            with lock:
                results.append(ciphertext)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    plaintexts = {bob.process(c).data for c in results}
    assert len(plaintexts) == 80


def test_different_groups_in_parallel(make_engine: MakeEngine) -> None:
    a, b = make_engine("alice"), make_engine("bob")
    pairs = [make_group(a, b, group_id=f"org/ns/g{i}".encode()) for i in range(3)]
    errors: list[BaseException] = []

    def chat(sender_receiver: list) -> None:  # type: ignore[type-arg]
        sender, receiver = sender_receiver
        try:
            for i in range(30):
                assert receiver.process(sender.encrypt(str(i).encode())).data == str(i).encode()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=chat, args=(pair,)) for pair in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_batches_persist_once_and_isolate_bad_messages(make_engine: MakeEngine) -> None:
    alice, bob = make_group(make_engine("alice"), make_engine("bob"))
    ciphertexts = alice.encrypt_batch([b"a", b"b", b"c"], b"meta")
    tampered = bytearray(ciphertexts[0])
    tampered[-2] ^= 1
    results = bob.process_batch([ciphertexts[0], bytes(tampered), b"junk", *ciphertexts[1:]])
    assert [r.data if not isinstance(r, MlsError) else None for r in results] == [
        b"a",
        None,
        None,
        b"b",
        b"c",
    ]
    assert isinstance(results[1], MlsError) and str(results[1]).startswith("MLS engine error: ")
    assert all(r.authenticated_data == b"meta" for r in results if not isinstance(r, MlsError))
    assert bob.process_batch([]) == []
    with pytest.raises(TypeError):
        bob.process_batch(["not bytes"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="save"):
        bob.process_batch([], save="yes")  # type: ignore[arg-type]
    bob.save()  # nothing unsaved: a no-op, not an error
