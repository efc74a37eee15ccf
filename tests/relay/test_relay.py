"""The relay through real gRPC, with MLS members on both sides: ordering, commits,
Welcomes, catch-up, authorization. Each test runs on the SQLite and the Redis log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.relay_client import RelayConnection, Request
from svc_server.stack import Stack

from .conftest import Account, connect, new_account
from .helpers import Member, create_channel, engine, raw_stream

pytestmark = pytest.mark.anyio
CHANNEL = "acme/support/triage"
STALE = grpc.StatusCode.FAILED_PRECONDITION.value[0]
DENIED = grpc.StatusCode.PERMISSION_DENIED.value[0]
INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


async def member(stack: Stack, account: Account, root: Path, name: str) -> Member:
    # In a thread: the account API serves on this event loop.
    made = await asyncio.to_thread(engine, root, name, (account.api_url, account.key))
    return Member(name, made, await connect(stack, account, name.encode()))


async def pair(
    stack: Stack, account: Account, root: Path, *, bob_admin: bool = False
) -> tuple[Member, Member]:
    """alice (the owner) and bob in CHANNEL; bob an admin, who commits too, if asked."""
    alice = await member(stack, account, root, "alice")
    bob = await member(stack, account, root, "bob")
    await alice.create(CHANNEL)
    await alice.add(CHANNEL, bob)
    await bob.join(CHANNEL)
    if bob_admin:
        assert alice.group is not None
        await alice.commit(CHANNEL, alice.group.set_role(bob.member_id, "admin"))
        await bob.next()
    return alice, bob


async def close(*members: Member) -> None:
    for m in members:
        await m.conn.close()


async def test_messages_flow_in_one_order(stack: Stack, account: Account, tmp_path: Path) -> None:
    alice, bob = await pair(stack, account, tmp_path)
    carol = await member(stack, account, tmp_path, "carol")
    await alice.add(CHANNEL, carol)
    await bob.next()  # the commit adding carol
    await carol.join(CHANNEL)
    seqs = [await alice.send(CHANNEL, f"a{i}") for i in range(5)]
    seqs += [await bob.send(CHANNEL, f"b{i}") for i in range(5)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 10
    for _ in range(10):
        await carol.next()
    assert carol.received == [f"a{i}".encode() for i in range(5)] + [
        f"b{i}".encode() for i in range(5)
    ]
    # Own messages are not echoed: bob sees only alice's five.
    for _ in range(5):
        await bob.next()
    assert bob.received == [f"a{i}".encode() for i in range(5)]
    assert bob.conn.deliveries.empty()
    await close(alice, bob, carol)


async def test_concurrent_commits_one_wins(stack: Stack, account: Account, tmp_path: Path) -> None:
    alice, bob = await pair(stack, account, tmp_path, bob_admin=True)
    assert alice.group and bob.group
    a_commit = alice.group.self_update()
    b_commit = bob.group.self_update()
    frames = [
        m.conn.request(pb.Commit(channel=CHANNEL, epoch=c.epoch, commit=c.commit), check=False)
        for m, c in ((alice, a_commit), (bob, b_commit))
    ]
    replies = await asyncio.gather(*frames)
    codes = sorted(r.code for r in replies)
    assert codes == [0, STALE], replies
    winner, loser = (alice, bob) if replies[0].code == 0 else (bob, alice)
    rejected = replies[1] if winner is alice else replies[0]
    assert rejected.epoch == 3, "the rejection names the current epoch"
    assert "stale epoch" in rejected.message
    winner.group.apply_pending_commit()  # type: ignore[union-attr]
    loser.group.clear_pending_commit()  # type: ignore[union-attr]
    await loser.next()  # the winning commit, delivered in order
    retry = loser.group.self_update()  # type: ignore[union-attr]
    reply = await loser.conn.request(
        pb.Commit(channel=CHANNEL, epoch=retry.epoch, commit=retry.commit)
    )
    loser.group.apply_pending_commit()  # type: ignore[union-attr]
    assert reply.epoch == 4
    await winner.next()
    assert alice.group.epoch == bob.group.epoch == 4
    await alice.send(CHANNEL, "after the race")
    await bob.send(CHANNEL, "me too")
    await bob.next()
    await alice.next()
    assert bob.received[-1] == b"after the race" and alice.received[-1] == b"me too"
    await close(alice, bob)


async def test_rejected_commit_welcome_is_never_delivered(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    alice, bob = await pair(stack, account, tmp_path, bob_admin=True)
    dave = await member(stack, account, tmp_path, "dave")
    assert alice.group and bob.group
    # Bob's commit wins; alice's commit (which adds dave) is rejected.
    b_commit = bob.group.self_update()
    await bob.conn.request(pb.Commit(channel=CHANNEL, epoch=b_commit.epoch, commit=b_commit.commit))
    rejected = await alice.refused(CHANNEL, [dave.engine.generate_key_package()])
    assert rejected.code == STALE
    await asyncio.sleep(0.3)
    assert dave.conn.welcomes.empty()
    await close(alice, bob, dave)


async def test_offline_member_catches_up(stack: Stack, account: Account, tmp_path: Path) -> None:
    alice, bob = await pair(stack, account, tmp_path)
    await bob.conn.close()
    for i in range(40):
        await alice.send(CHANNEL, f"while away {i}")
    bob.conn = await connect(stack, account, b"bob")
    reply = await bob.subscribe(CHANNEL)
    assert reply.head_seq == bob.cursor + 40
    for _ in range(40):
        await bob.next()
    assert bob.received == [f"while away {i}".encode() for i in range(40)]
    await alice.send(CHANNEL, "live again")
    await bob.next()
    assert bob.received[-1] == b"live again"
    await asyncio.sleep(0.2)
    assert bob.conn.deliveries.empty(), "no duplicates"
    await close(alice, bob)


async def test_other_accounts_are_denied_until_admitted(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    alice, bob = await pair(stack, account, tmp_path)
    outsider = await new_account(stack.api_url, "mallory@example.com")
    mallory = await member(stack, outsider, tmp_path, "mallory")
    errors = []
    for frame in (
        pb.Subscribe(channel=CHANNEL),
        pb.Subscribe(channel="acme/support/nonexistent"),
        pb.Publish(channel=CHANNEL, message=[b"x"]),
        # Over the limits, counted and refused: still no word of the channel to an outsider.
        pb.Publish(channel=CHANNEL, message=[b"x"] * 1025),
        pb.CreateChannel(channel=CHANNEL),
    ):
        reply = await mallory.conn.request(frame, check=False)
        assert reply.code == DENIED, (frame, reply)
        errors.append(reply.message.replace("nonexistent", "triage"))
    assert len(set(errors)) == 1, "an existing channel and a missing one look the same"
    # Adding an agent of another account is what admits that account.
    await alice.add(CHANNEL, mallory)
    assert (await mallory.conn.request(pb.Subscribe(channel=CHANNEL))).code == 0
    await close(alice, bob, mallory)


async def test_bad_frames_get_clear_errors(stack: Stack, account: Account, tmp_path: Path) -> None:
    alice, bob = await pair(stack, account, tmp_path)
    assert alice.group
    many = [i.to_bytes(2, "big") for i in range(1025)]
    cases: list[tuple[Request, str]] = [
        (pb.CreateChannel(channel="no-slashes"), "invalid channel name"),
        (pb.Subscribe(channel="a/b/c/d"), "invalid channel name"),
        (pb.Publish(channel=CHANNEL, message=[b"garbage"]), "malformed MLS message"),
        (
            pb.Publish(channel=CHANNEL, message=[b"x" * (1024 * 1024 + 1)]),
            "the limit is 1048576",
        ),
        (
            pb.Publish(channel=CHANNEL, message=[alice.group.self_update().commit]),
            "send commits with Commit",
        ),
        (
            pb.Commit(channel=CHANNEL, epoch=1, commit=alice.group.encrypt(b"x")),
            "takes an MLS commit",
        ),
        # A cursor past SQLite's signed 64 bits raised OverflowError in the store: the
        # relay answered UNAVAILABLE ("retry") and kept the half-made subscription.
        # Found by tests/fuzz/test_relay_frames.py.
        (pb.Subscribe(channel=CHANNEL, after_seq=2**63), "after_seq"),
        (pb.Subscribe(channel=CHANNEL, after_seq=2**64 - 1), "after_seq"),
        # More than the extension decodes: it counts them, and the same rules hold.
        (pb.Publish(channel=CHANNEL, message=many), "Publish takes 1 to 1024 messages"),
        (pb.Publish(channel=CHANNEL, message=many[:2], message_id=many), "message_id takes"),
    ]
    # An application message whose (unencrypted, unauthenticated to the relay) epoch is
    # past 2^63-1 failed in the store the same way ("could not store the message; retry").
    message = bytearray(alice.group.encrypt(b"x"))
    at = 4 + 1 + len(CHANNEL)  # MLSMessage header, then the group id, then the epoch
    message[at : at + 8] = b"\xff" * 8
    cases.append((pb.Publish(channel=CHANNEL, message=[bytes(message)]), "epoch"))
    alice.group.clear_pending_commit()
    other = engine(tmp_path, "zed").create_group(b"other/group/id")
    cases.append((pb.Publish(channel=CHANNEL, message=[other.encrypt(b"x")]), "another group"))
    for frame, why in cases:
        reply = await alice.conn.request(frame, check=False)
        assert reply.code == INVALID and why in reply.message, (type(frame).__name__, reply)
    # The stream is still fine.
    await alice.send(CHANNEL, "still here")
    await bob.next()
    assert bob.received == [b"still here"]
    await close(alice, bob)


async def test_frames_that_do_not_parse(stack: Stack, account: Account) -> None:
    channel, call = raw_stream(stack.relay_url, await account.token())
    await call.write(b"\xff\xff\xff\xff not protobuf")
    reply = (await call.read()).reply
    assert reply.code == INVALID and "malformed frame" in reply.message
    await call.write(pb.ClientFrame(request_id=0).SerializeToString())
    assert "non-zero request_id" in (await call.read()).reply.message
    # A Publish is read by the extension, not protobuf: the same answers.
    publish = pb.Publish(channel="a/b/c", message=[b"m"])
    await call.write(pb.ClientFrame(request_id=0, publish=publish).SerializeToString())
    assert "non-zero request_id" in (await call.read()).reply.message
    await call.write(
        pb.ClientFrame(
            request_id=5, unsubscribe=pb.Unsubscribe(channel="a/b/c")
        ).SerializeToString()
    )
    assert (await call.read()).reply.code == 0
    # A frame beyond the transport limit ends the stream with a gRPC status.
    await call.write(
        pb.ClientFrame(
            request_id=6, publish=pb.Publish(channel="a/b/c", message=[b"x" * (2 * 1024 * 1024)])
        ).SerializeToString()
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await channel.close()


async def test_many_concurrent_streams(stack: Stack, account: Account, tmp_path: Path) -> None:
    token = await account.token()
    conns = [RelayConnection(stack.relay_url, token, f"agent-{i}".encode()) for i in range(200)]
    await asyncio.gather(*(c.open() for c in conns))
    await create_channel(conns[0], (account.api_url, account.key), tmp_path, CHANNEL)
    await asyncio.gather(*(c.request(pb.Subscribe(channel=CHANNEL)) for c in conns[1:]))
    # Raw subscribers: the relay does not decrypt, so any well-framed message will do.
    sender = engine_group_message(stack)
    await conns[0].request(pb.Publish(channel=CHANNEL, message=[sender]))
    got = await asyncio.gather(*(asyncio.wait_for(c.deliveries.get(), 20) for c in conns[1:]))
    assert {d.seq for d in got} == {1} and len(got) == 199
    await asyncio.gather(*(c.close() for c in conns))


_group_cache: dict[str, bytes] = {}


def engine_group_message(stack: Stack) -> bytes:
    if "m" not in _group_cache:
        import tempfile

        group = engine(Path(tempfile.mkdtemp()), "sender").create_group(CHANNEL.encode())
        _group_cache["m"] = group.encrypt(b"hello, everyone")
    return _group_cache["m"]


async def test_relay_sees_only_ciphertext(stack: Stack, account: Account, tmp_path: Path) -> None:
    alice, bob = await pair(stack, account, tmp_path)
    secret = b"the launch code is 0000"
    await alice.send(CHANNEL, secret.decode())
    await bob.next()
    for path in (tmp_path / "server").rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path
    await close(alice, bob)


async def test_forged_replayed_and_foreign_handshakes_are_refused_and_the_channel_commits(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """The wedge attack: a Commit frame the relay cannot validate used to move the channel
    to an epoch nobody could follow. Now each is refused, nothing is stored, and the
    members go on committing."""
    alice, bob = await pair(stack, account, tmp_path, bob_admin=True)
    assert alice.group and bob.group
    epoch = alice.group.epoch
    head = (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq

    async def refused(commit: bytes, at: int = epoch) -> pb.Reply:
        reply = await bob.conn.request(
            pb.Commit(channel=CHANNEL, epoch=at, commit=commit), check=False
        )
        assert reply.code != 0, reply
        return reply

    # An application message (PrivateMessage) posing as a commit.
    await refused(bob.group.encrypt(b"not a commit"))
    # A real commit of bob's with its signature broken.
    forged = bytearray(bob.group.self_update().commit)
    bob.group.clear_pending_commit()
    # A member's PublicMessage ends with the confirmation and membership tags (1 + 32
    # bytes each), which need the group's secrets to check; the signature comes before.
    forged[-(2 * 33) - 5] ^= 0x55
    await refused(bytes(forged))
    # A commit of another channel's group, by a member of that group.
    carol = await member(stack, account, tmp_path, "carol")
    await carol.create("acme/support/other")
    assert carol.group
    other = carol.group.self_update()
    reply = await refused(other.commit, other.epoch)
    assert reply.code == INVALID, reply
    assert (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq == head

    # A valid commit goes through; replaying it afterwards is refused as stale.
    update = bob.group.self_update()
    await bob.conn.request(pb.Commit(channel=CHANNEL, epoch=update.epoch, commit=update.commit))
    bob.group.apply_pending_commit()
    replay = await refused(update.commit, update.epoch)
    assert replay.code == STALE, replay
    await alice.next()  # bob's update, processed
    assert alice.group.epoch == bob.group.epoch == epoch + 1
    reply = await alice.commit(CHANNEL, alice.group.self_update())
    assert reply.epoch == epoch + 2
    await bob.next()
    await alice.send(CHANNEL, "the channel still works")
    await bob.next()
    assert bob.received[-1] == b"the channel still works"
    await close(alice, bob, carol)


async def test_a_publish_behind_one_the_store_failed_is_not_stored_before_it(
    stack: Stack, account: Account, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishes pipelined on one stream: the store fails the first. The ones behind it
    on that stream fail too (UNAVAILABLE, not stored), so that none overtakes it when the
    sender sends it again, on a new stream (store.Pipeline)."""
    from .test_store import fail_the_next_append

    alice = await member(stack, account, tmp_path, "alice")
    await alice.create(CHANNEL)
    assert alice.group is not None
    messages = [alice.group.encrypt(text) for text in (b"one", b"two", b"three")]
    ids = [b"id-1", b"id-2", b"id-3"]
    fail_the_next_append(stack.relay.relay.store, monkeypatch)
    frames = [
        pb.Publish(channel=CHANNEL, message=[m], message_id=[i])
        for m, i in zip(messages, ids, strict=True)
    ]
    replies = await asyncio.gather(*(alice.conn.request(f, check=False) for f in frames))
    assert [r.code for r in replies] == [UNAVAILABLE] * 3, replies
    assert "new stream" in replies[1].message
    assert [e.message for e in await stack.relay.relay.store.read(CHANNEL, 0, 10)] == []

    again = await connect(stack, account, b"alice")
    for f in frames:
        await again.request(f)
    stored = await stack.relay.relay.store.read(CHANNEL, 0, 10)
    assert [e.message for e in stored] == messages
    await close(alice)
    await again.close()
