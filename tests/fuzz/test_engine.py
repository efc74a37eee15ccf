"""Fuzz target: the MLS engine's inputs from the network — key packages, Welcomes,
commits and application messages into a real group, GroupInfos and commits into the
relay's tracker. Only ``MlsError`` (``MLS engine error: …``) may escape, nothing mutated
is ever accepted, and the state is untouched: the same epoch, no pending commit, and a
fresh genuine message still decrypts (or a genuine commit still validates)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given

from svc_sdk.mls import (
    Engine,
    Group,
    GroupTracker,
    MlsError,
    PendingCommit,
    TrackedGroup,
    inspect,
)

from ..conftest import ISSUER, member_id
from ..engine.helpers import make_group
from .mutate import BATCH, batches, counted, settings_for

pytestmark = pytest.mark.fuzz

PREFIX = "MLS engine error: "


@dataclass
class World:
    alice: Group
    bob: Group
    joiner: Engine
    key_packages: list[bytes]
    welcomes: list[bytes]
    commits: list[bytes]
    messages: list[bytes]
    group_infos: list[bytes]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root: Path = tmp_path_factory.mktemp("fuzz-engine")

    def engine(name: str) -> Engine:
        return ISSUER.certify(Engine(root / name, name.encode()))

    alice, bob = make_group(engine("alice"), engine("bob"))
    carol, joiner = engine("carol"), engine("joiner")
    key_packages = [carol.generate_key_package(), joiner.generate_key_package()]
    welcomes, commits = [], []
    # Seeds the group never applies: each pending commit is made, kept, then cleared.
    # (Welcomes to the joiner alone: one to several agents carries each one's secrets
    # encrypted to that agent only, so a change in carol's part is no change for the
    # joiner — MLS by design, RFC 9420 §12.4.3.1.)
    makers: tuple[Callable[[], PendingCommit], ...] = (
        lambda: alice.add_members([key_packages[1]]),
        lambda: alice.add_members([key_packages[0]]),
        lambda: alice.self_update(),
        lambda: alice.remove_members([member_id("bob")]),
        lambda: alice.set_role(member_id("bob"), "admin"),
    )
    for make in makers:
        pending = make()
        commits.append(pending.commit)
        if pending.welcome is not None:
            welcomes.append(pending.welcome)
        alice.clear_pending_commit()
    messages = [alice.encrypt(b"genuine"), alice.encrypt(b"x" * 300, b"aad")]
    group_infos = [alice.group_info(), bob.group_info()]
    SEEN.extend(key_packages + welcomes + commits + messages + group_infos)
    return World(alice, bob, joiner, key_packages, welcomes, commits, messages, group_infos)


SEEN: list[bytes] = []


def describe(data: bytes) -> str:
    """Where ``data`` differs from the nearest seed (for a failure message)."""

    def common(a: bytes, b: bytes) -> int:
        return next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )

    seed = max(SEEN, key=lambda s: common(data, s) + common(data[::-1], s[::-1]))
    pre, suf = common(data, seed), common(data[::-1], seed[::-1])
    return (
        f"{len(data)} bytes; the nearest seed ({len(seed)} bytes) differs after byte {pre} "
        f"and before the last {suf}: {seed[pre : len(seed) - suf].hex()[:80]} became "
        f"{data[pre : len(data) - suf].hex()[:80]}"
    )


def refused(call: Callable[[bytes], object], data: bytes) -> None:
    """``call(data)`` raises MlsError, and nothing else."""
    try:
        result = call(data)
    except MlsError as exc:
        assert str(exc).startswith(PREFIX), exc
    else:
        pytest.fail(f"mutated input accepted: {result!r}: {describe(data)}")


def inspected(data: bytes) -> None:
    """What the relay runs on every frame's message first."""
    try:
        inspect(data)
    except MlsError as exc:
        assert str(exc).startswith(PREFIX), exc


def still_works(world: World, epoch: int) -> None:
    assert world.bob.epoch == epoch and world.alice.epoch == epoch
    assert not world.alice.has_pending_commit and not world.bob.has_pending_commit
    assert world.bob.process(world.alice.encrypt(b"fresh")).data == b"fresh"


def test_key_packages(world: World) -> None:
    epoch = world.alice.epoch
    with counted("engine key packages") as case:

        @settings_for(BATCH)
        @given(batch=batches(world.key_packages))
        def run(batch: list[bytes]) -> None:
            for data in batch:
                case()
                inspected(data)
                try:
                    refused(lambda d: world.alice.add_members([d]), data)
                finally:
                    if world.alice.has_pending_commit:
                        world.alice.clear_pending_commit()
                assert not world.alice.has_pending_commit and world.alice.epoch == epoch

        run()
    still_works(world, epoch)


def test_welcomes(world: World) -> None:
    epoch = world.alice.epoch
    with counted("engine welcomes") as case:

        @settings_for(BATCH)
        @given(batch=batches(world.welcomes))
        def run(batch: list[bytes]) -> None:
            for data in batch:
                case()
                inspected(data)
                refused(lambda d: world.joiner.join_group(d), data)
                assert world.joiner.group_ids() == []

        run()
    # The genuine Welcome still works for the key package it was made for.
    joined = world.joiner.join_group(world.welcomes[0])
    assert joined.epoch == epoch + 1
    world.joiner.delete_group(joined.group_id)
    still_works(world, epoch)


def test_commits(world: World) -> None:
    epoch = world.alice.epoch
    with counted("engine commits") as case:

        @settings_for(BATCH)
        @given(batch=batches(world.commits))
        def run(batch: list[bytes]) -> None:
            for data in batch:
                case()
                inspected(data)
                refused(lambda d: world.bob.process(d), data)
                assert world.bob.epoch == epoch and not world.bob.has_pending_commit

        run()
    still_works(world, epoch)


def test_application_messages(world: World) -> None:
    epoch = world.alice.epoch
    with counted("engine application messages") as case:

        @settings_for(BATCH)
        @given(batch=batches(world.messages))
        def run(batch: list[bytes]) -> None:
            for data in batch:
                case()
                inspected(data)
                refused(lambda d: world.bob.process(d), data)
                if case.cases % 16 == 0:  # the ratchet still decrypts what is genuine
                    assert world.bob.process(world.alice.encrypt(b"x")).data == b"x"

        run()
    still_works(world, epoch)


# A commit ends with its confirmation tag and membership tag (RFC 9420 §6.1-6.2), each
# a variable-length vector (32 bytes and a 1-byte length in a genuine one): MACs under
# the epoch's secrets, which the relay — not a member — cannot check. A commit that
# matches a genuine one up to its tags passes the tracker whatever the tags hold, and
# whatever their lengths (the members refuse it). Known and documented:
# docs/security.md, "Membership authority".
TAGS = 66


def only_tags_changed(data: bytes, commits: list[bytes]) -> bool:
    return any(data[: len(c) - TAGS] == c[: len(c) - TAGS] for c in commits)


def test_tracker(world: World) -> None:
    """The relay's view of a group: mutated GroupInfos are refused by ``observe``,
    mutated commits by ``process`` (on a copy, as the relay validates), and the tracked
    group stays as it was."""
    tracker = GroupTracker()
    tracker.set_trust_anchors(ISSUER.anchors)
    tracked: TrackedGroup = tracker.observe(world.alice.group_info())
    before = tracked.snapshot()
    epoch = tracked.epoch
    seeds = world.commits + world.group_infos
    tags_only: list[bytes] = []
    with counted("engine tracker") as case:

        @settings_for(BATCH)
        @given(batch=batches(seeds))
        def run(batch: list[bytes]) -> None:
            for data in batch:
                case()
                inspected(data)
                if only_tags_changed(data, world.commits):
                    tags_only.append(data)
                else:
                    refused(lambda d: tracked.copy().process(d), data)
                refused(lambda d: tracker.observe(d), data)
                assert tracked.epoch == epoch

        run()
    print(f"tracker: {len(tags_only)} cases changed only the MAC tags (not checkable)")
    assert tracked.snapshot() == before
    # A genuine commit still validates against it.
    pending = world.alice.self_update()
    try:
        tracked.process(pending.commit)
        assert tracked.epoch == epoch + 1
    finally:
        world.alice.clear_pending_commit()
