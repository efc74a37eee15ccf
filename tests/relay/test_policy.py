"""The channel policy against a member that does not play by it, through a running relay:
commits an honest engine refuses to build (made by native/examples/rogue_commit.rs with
mls-rs's permissive rules and the member's own key) and hostile GroupInfos for a new
channel are refused, nothing is stored, and the channel goes on."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.mls import Engine, Group, MlsError, PolicyError, inspect
from svc_sdk.testing import certify_with_api
from svc_server.db.session import transaction
from svc_server.relay.groups import pack, unpack
from svc_server.services import channels
from svc_server.stack import Stack

from .conftest import Account, connect, new_account
from .helpers import Member
from .test_relay import CHANNEL, close, member, pair

pytestmark = pytest.mark.anyio
DENIED = grpc.StatusCode.PERMISSION_DENIED.value[0]
INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
STALE = grpc.StatusCode.FAILED_PRECONDITION.value[0]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def rogue_commit() -> Path:
    """The rogue member's tool, built with cargo (incrementally: the suite's cargo test
    has compiled its dependencies)."""
    built = subprocess.run(
        [
            "cargo",
            *("build", "--locked", "-q", "-p", "svc-native", "--features", "attacker"),
            *("--example", "rogue_commit", "--message-format", "json"),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    for line in built.stdout.splitlines():
        artifact = json.loads(line)
        if artifact.get("reason") == "compiler-artifact" and artifact.get("executable"):
            return Path(artifact["executable"])
    raise AssertionError(f"cargo built no rogue_commit executable: {built.stdout[-2000:]}")


def rogue(tool: Path, data_dir: Path, identity: str, attack: str, *args: str) -> bytes:
    done = subprocess.run(
        [tool, data_dir, identity, CHANNEL, attack, *args], capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout
    return done.stdout


async def alice_with_bob_of_another_account(
    stack: Stack, account: Account, tmp_path: Path
) -> tuple[Member, Account, Member]:
    """Alice (``account``) creates CHANNEL and adds bob, an agent of a second account,
    who joins; returns alice, bob's account and bob."""
    alice = await member(stack, account, tmp_path, "alice")
    bobs = await new_account(stack.api_url, "bob@example.com")
    bob = await member(stack, bobs, tmp_path, "bob")
    await alice.create(CHANNEL)
    await alice.add(CHANNEL, bob)
    await bob.join(CHANNEL)
    return alice, bobs, bob


async def test_a_rogue_members_commits_are_refused_by_the_relay_and_the_members(
    stack: Stack, account: Account, tmp_path: Path, rogue_commit: Path
) -> None:
    alice, bob = await pair(stack, account, tmp_path)
    mallory = await member(stack, account, tmp_path, "mallory")
    await alice.add(CHANNEL, mallory)
    await mallory.join(CHANNEL)
    await bob.next()
    assert alice.group and bob.group and mallory.group
    epoch = alice.group.epoch
    head = (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq
    dave = await member(stack, account, tmp_path, "dave")
    kp_file = tmp_path / "dave.kp"
    kp_file.write_bytes(dave.engine.generate_key_package())
    # Mallory's engine lets go of her data_dir for the tool, which signs with her key.
    mallory.engine.close()
    data_dir = tmp_path / "mallory"
    attacks = {
        "remove-owner": rogue(rogue_commit, data_dir, "mallory", "remove-owner"),
        "promote-self": rogue(rogue_commit, data_dir, "mallory", "promote-self"),
        "add": rogue(rogue_commit, data_dir, "mallory", "add", str(kp_file)),
        # A plain member commits nothing, not even its own key update: a commit it
        # could spoil would strand every member (the next test).
        "update": rogue(rogue_commit, data_dir, "mallory", "update"),
    }
    for what, commit in attacks.items():
        reply = await mallory.conn.request(
            pb.Commit(channel=CHANNEL, epoch=epoch, commit=commit), check=False
        )
        assert reply.code == DENIED, (what, reply)
        assert "policy: " in reply.message, (what, reply.message)
        # Had a relay let it through, each member refuses it on its own.
        for group in (alice.group, bob.group):
            with pytest.raises(PolicyError, match="policy: "):
                await asyncio.to_thread(group.process, commit)
    assert (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq == head
    assert alice.group.epoch == bob.group.epoch == epoch

    # The channel is not wedged: the owner removes mallory, and the members go on.
    reply = await alice.commit(CHANNEL, alice.group.remove_members([mallory.member_id]))
    assert reply.epoch == epoch + 1
    await bob.next()
    await alice.send(CHANNEL, "mallory is out")
    await bob.next()
    assert bob.received[-1] == b"mallory is out"
    await close(alice, bob, mallory, dave)


async def test_hostile_group_infos_create_no_channel(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """CreateChannel's GroupInfo is where the relay's view of a group starts: one that
    names another group, another creator or more members than the creator is refused."""
    alice = await member(stack, account, tmp_path, "alice")
    bob = await member(stack, account, tmp_path, "bob")

    async def create(group_info: bytes) -> pb.Reply:
        return await alice.conn.request(
            pb.CreateChannel(channel=CHANNEL, group_info=group_info), check=False
        )

    def with_bob(group: Group) -> bytes:
        group.add_members([bob.engine.generate_key_package()])
        group.apply_pending_commit()
        return group.group_info()

    hostile = {
        "garbage": os.urandom(300),
        "another group": alice.engine.create_group(b"acme/support/other").group_info(),
        "another creator": bob.engine.create_group(CHANNEL.encode()).group_info(),
        "two members": with_bob(alice.engine.create_group(b"acme/support/pair")),
        "a key package": alice.engine.generate_key_package(),
    }
    for what, group_info in hostile.items():
        reply = await create(group_info)
        assert reply.code == INVALID, (what, reply)
        assert "group_info refused" in reply.message, (what, reply.message)
    # Nothing was created: the channel's name is still free for its real creator.
    await alice.create(CHANNEL)
    assert alice.group is not None and alice.group.epoch == 0
    await close(alice, bob)


async def test_a_removed_members_account_loses_every_stream_at_once(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """Access follows membership: when bob (another account) is removed, every stream of
    his account stops receiving the channel with the commit that removed him, and the
    account's calls on it are refused."""
    alice, bobs, bob = await alice_with_bob_of_another_account(stack, account, tmp_path)
    # Another agent of bob's account reads the channel's (ciphertext) stream.
    watcher = await connect(stack, bobs, b"bob-watcher")
    await watcher.request(pb.Subscribe(channel=CHANNEL, after_seq=bob.cursor))
    witness = await connect(stack, account, b"alice-witness")
    await witness.request(pb.Subscribe(channel=CHANNEL, after_seq=bob.cursor))
    await alice.send(CHANNEL, "before")
    await bob.next()
    assert bob.received == [b"before"]
    seen = (await asyncio.wait_for(watcher.deliveries.get(), 10)).seq

    assert alice.group is not None
    removal = await alice.commit(CHANNEL, alice.group.remove_members([bob.member_id]))
    last = await alice.send(CHANNEL, "after the removal")
    # A stream of alice's account has both by now; bob's account's end at the removal.
    while (await asyncio.wait_for(witness.deliveries.get(), 10)).seq != last:
        pass
    for stream in (bob.conn, watcher):
        got = []
        with contextlib.suppress(TimeoutError):
            while True:
                got.append((await asyncio.wait_for(stream.deliveries.get(), 1)).seq)
        assert max(got, default=seen) <= removal.seq, got
    for frame in (
        pb.Subscribe(channel=CHANNEL),
        pb.Publish(channel=CHANNEL, message=[b"x"]),
    ):
        for conn in (bob.conn, watcher):
            assert (await conn.request(frame, check=False)).code == DENIED, frame
    await close(alice, bob)
    await watcher.close()
    await witness.close()


async def test_application_messages_of_a_past_epoch_are_refused(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """Messages are stored only in the channel's current epoch: one encrypted before a
    commit the relay stored first would sit behind it where the new epoch's members may
    not read it. Refused with the epoch to catch up to; a batch is all or nothing."""
    alice, bob = await pair(stack, account, tmp_path)
    assert alice.group and bob.group
    epoch = bob.group.epoch
    late = [bob.group.encrypt(b"late 1"), bob.group.encrypt(b"late 2")]
    await alice.commit(CHANNEL, alice.group.self_update())
    head = (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq
    reply = await bob.conn.request(pb.Publish(channel=CHANNEL, message=late), check=False)
    assert reply.code == STALE, reply
    assert reply.epoch == epoch + 1
    assert (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq == head
    await bob.next()  # the commit
    await bob.send(CHANNEL, "in the new epoch")
    await alice.next()
    assert alice.received == [b"in the new epoch"]
    await close(alice, bob)


async def test_a_removal_reaches_the_account_api_when_the_committing_stream_ends(
    stack: Stack, account: Account, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The account API decides invites and access from the relay's roster mirror: a
    commit's roster is written even when the stream that sent it ends while the write
    waits (a slow database), and the commit is acknowledged only once it is written, so a
    removed member's account is out of the channel for the API when the remover hears of
    it, and stays out."""
    alice, bobs, bob = await alice_with_bob_of_another_account(stack, account, tmp_path)
    bob_account = uuid.UUID(bobs.account_id)
    deadline = time.monotonic() + 10
    while not await _in_mirror(stack, bob_account):
        assert time.monotonic() < deadline, "the addition never reached the account API"
        await asyncio.sleep(0.05)

    relay = stack.relay.relay
    write = relay.access.record
    writing, go_on = asyncio.Event(), asyncio.Event()

    async def slow_record(*args: Any, **kwargs: Any) -> None:
        writing.set()
        await go_on.wait()
        await write(*args, **kwargs)

    monkeypatch.setattr(relay.access, "record", slow_record)
    assert alice.group is not None
    pending = alice.group.remove_members([bob.member_id])
    frame = pb.Commit(channel=CHANNEL, epoch=pending.epoch, commit=pending.commit)
    sent = asyncio.ensure_future(alice.conn.request(frame, check=False))
    await asyncio.wait_for(writing.wait(), 10)
    await asyncio.wait({sent}, timeout=1)
    assert not sent.done(), "the removal was acknowledged before the account API had it"
    # The remover's stream ends (here: the relay closes it) while the roster is written.
    for session in list(relay.sessions):
        if session.member == alice.member_id:
            session.close(grpc.StatusCode.UNAVAILABLE, "going away")
    with contextlib.suppress(ConnectionError, asyncio.CancelledError, Exception):
        await asyncio.wait_for(sent, 10)
    go_on.set()
    deadline = time.monotonic() + 10
    while await _in_mirror(stack, bob_account):
        assert time.monotonic() < deadline, "the removal never reached the account API"
        await asyncio.sleep(0.05)
    await bob.conn.close()


async def _in_mirror(stack: Stack, account_id: uuid.UUID) -> bool:
    """Whether the account API counts the account in CHANNEL (member or redemption)."""

    def check() -> bool:
        with transaction(stack.services.sessions) as session:
            return channels.has_access(session, CHANNEL, account_id)

    return await asyncio.to_thread(check)


async def _invite(account: Account, max_uses: int = 1) -> str:
    async with httpx.AsyncClient(base_url=account.api_url) as http:
        made = await http.post(
            "/v1/invites",
            json={"channel": CHANNEL, "max_uses": max_uses},
            headers={"Authorization": f"Bearer {account.key}"},
        )
    assert made.status_code == 201, made.text
    token: str = made.json()["token"]
    return token


async def _redeem(account: Account, token: str, key_package: bytes) -> httpx.Response:
    async with httpx.AsyncClient(base_url=account.api_url) as http:
        return await http.post(
            "/v1/invites/redeem",
            json={
                "channel": CHANNEL,
                "token": token,
                "key_package": base64.b64encode(key_package).decode(),
            },
            headers={"Authorization": f"Bearer {account.key}"},
        )


async def test_a_removed_admins_invites_let_nobody_in(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """Mallory (another account) was an admin and minted invites. Once the owner removes
    her, none of them lets anybody in: a token she kept (or handed out) no longer
    redeems, a join request posted with one before her removal can no longer be added,
    and the redemption no longer admits its account to the channel."""
    alice = await member(stack, account, tmp_path, "alice")
    mallorys = await new_account(stack.api_url, "mallory@example.com")
    mallory = await member(stack, mallorys, tmp_path, "mallory")
    await alice.create(CHANNEL)
    await alice.add(CHANNEL, mallory)
    await mallory.join(CHANNEL)
    assert alice.group is not None
    # Acknowledged once the account API's roster has it: mallory's account may invite.
    await alice.commit(CHANNEL, alice.group.set_role(mallory.member_id, "admin"))
    early, kept = await _invite(mallorys), await _invite(mallorys, max_uses=10)
    eves = await new_account(stack.api_url, "eve@example.com")
    eve = await member(stack, eves, tmp_path, "eve")
    eve_kp = eve.engine.generate_key_package()
    redeemed = await _redeem(eves, early, eve_kp)
    assert redeemed.status_code == 201, redeemed.text
    join = pb.JoinRequest(channel=CHANNEL, join_id=redeemed.json()["join_id"])
    assert (await eve.conn.request(join, check=False)).code == 0
    # Her redemption admits her account to the channel's (ciphertext) stream meanwhile.
    await eve.conn.request(pb.Subscribe(channel=CHANNEL))
    # No admin was online to add eve. Now the owner removes mallory.
    await alice.commit(CHANNEL, alice.group.remove_members([mallory.member_id]))
    # Eve's stream stops at once: it does not get what is sent after the removal.
    after = await alice.send(CHANNEL, "after mallory")
    got = []
    with contextlib.suppress(TimeoutError):
        while True:
            got.append((await asyncio.wait_for(eve.conn.deliveries.get(), 1)).seq)
    assert got and max(got) < after, got

    # The token mallory kept: neither her account's other agent nor anyone she hands it
    # to gets in with it.
    for who, name in ((mallorys, "mallory2"), (eves, "eve2")):
        late = await member(stack, who, tmp_path, name)
        refused = await _redeem(who, kept, late.engine.generate_key_package())
        assert refused.status_code == 410, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["type"] == "urn:svc:problem:invite-expired"
        await late.conn.close()
    # Eve's join request, posted while mallory was an admin, is still in the log: an
    # owner's client that reads it now must not be able to add her with it.
    reply = await alice.refused(CHANNEL, [eve_kp])
    assert reply.code == DENIED, reply
    assert "invite" in reply.message, reply.message
    # Nor does her redemption keep her account in the channel.
    assert (await eve.conn.request(join, check=False)).code == DENIED
    assert (await eve.conn.request(pb.Subscribe(channel=CHANNEL), check=False)).code == DENIED
    # The channel goes on; the owner still adds whom she chooses, with a fresh key package.
    fresh = eve.engine.generate_key_package()
    assert (await alice.commit(CHANNEL, alice.group.add_members([fresh]))).code == 0
    await close(alice, mallory, eve)


async def test_a_key_package_the_channel_used_is_refused(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """A key package is for one use (RFC 9420, section 16.8). An admin that replays the
    key package a removed member joined with would put that member's leaf back without
    its consent, with no fresh key package: a member that nobody can read for (its
    agent deleted the private keys when it joined), whose account is back in the channel.
    The relay refuses the commit as invalid; the member's fresh key package still adds
    it."""
    alice = await member(stack, account, tmp_path, "alice")
    bob = await member(stack, account, tmp_path, "bob")
    await alice.create(CHANNEL)
    assert alice.group is not None
    used = bob.engine.generate_key_package()
    await alice.commit(CHANNEL, alice.group.add_members([used]))
    await bob.join(CHANNEL)
    await alice.commit(CHANNEL, alice.group.remove_members([bob.member_id]))
    epoch = alice.group.epoch
    head = (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq
    carol = await member(stack, account, tmp_path, "carol")
    # Alone, and alongside a fresh key package of another agent, with the group loaded
    # again from the store (another relay process, or a restart).
    for kps in ([used], [carol.engine.generate_key_package(), used]):
        stack.relay.relay.groups.evict(CHANNEL)
        reply = await alice.refused(CHANNEL, kps)
        assert reply.code == INVALID, reply
        assert "key package" in reply.message and "used" in reply.message, reply.message
    assert (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq == head
    assert alice.group.epoch == epoch
    # The channel goes on, and bob's fresh key package adds him again.
    fresh = bob.engine.generate_key_package()
    assert (await alice.commit(CHANNEL, alice.group.add_members([fresh]))).epoch == epoch + 1
    await close(alice, bob, carol)


async def test_a_post_quantum_channel_is_validated_and_keeps_its_suite(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """A channel of suite 65100 (X-Wing init keys of 1,216 bytes): the relay tracks and
    validates its commits, stores their used init keys (and refuses a replayed one after
    loading the group from the store again), and refuses a join request whose key
    package is of suite 1 before it reaches the log, naming the channel's suite."""
    pq = 65100
    alice = await member(stack, account, tmp_path, "alice")
    bob = await member(stack, account, tmp_path, "bob")
    await alice.create(CHANNEL, pq)
    assert alice.group is not None
    used = bob.engine.generate_key_package(pq)
    await alice.commit(CHANNEL, alice.group.add_members([used]))
    await bob.join(CHANNEL)
    await alice.commit(CHANNEL, alice.group.remove_members([bob.member_id]))
    stack.relay.relay.groups.evict(CHANNEL)
    reply = await alice.refused(CHANNEL, [used])
    assert reply.code == INVALID and "used" in reply.message, reply
    current = await stack.relay.relay.groups.current(CHANNEL)
    assert current is not None and current.group.cipher_suite == pq

    carols = await new_account(stack.api_url, "carol-pq@example.com")
    carol = await member(stack, carols, tmp_path, "carol")
    head = (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq
    token = await _invite(account)

    async def post(key_package: bytes) -> pb.Reply:
        redeemed = await _redeem(carols, token, key_package)
        assert redeemed.status_code == 201, redeemed.text
        join = pb.JoinRequest(channel=CHANNEL, join_id=redeemed.json()["join_id"])
        return await carol.conn.request(join, check=False)

    reply = await post(carol.engine.generate_key_package())
    assert (reply.code, reply.cipher_suite) == (INVALID, pq), reply
    assert "cipher suite 1; channel" in reply.message, reply.message
    assert (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq == head
    # Redeemed again by the same agent (no second use of the invite), with suite 65100.
    reply = await post(carol.engine.generate_key_package(pq))
    assert (reply.code, reply.cipher_suite) == (0, 0), reply
    await close(alice, bob, carol)


async def test_stored_group_states_keep_the_used_key_packages() -> None:
    tracked = b"\x00\x01tracked group snapshot"
    used = frozenset({b"\x01" * 32, b"\x02" * 32, b""})
    assert unpack(pack(tracked, used)) == (tracked, used)
    assert pack(tracked, used) == pack(tracked, frozenset(sorted(used, reverse=True)))
    # A state stored before the refs were kept: none used.
    assert unpack(tracked) == (tracked, frozenset())
    for cut in (pack(tracked, used)[:20], pack(tracked, used)[:24]):
        with pytest.raises(ValueError, match="cut short"):
            unpack(cut)


async def test_stored_group_states_keep_post_quantum_init_keys() -> None:
    """X-Wing init keys (suite 65100) are 1,216 bytes: stored with two length bytes, and
    only then; suite 1 and 2 states keep the one-byte format."""
    tracked = b"\x00\x01tracked group snapshot"
    classic = frozenset({b"\x01" * 32, b"\x02" * 65})
    assert pack(tracked, classic).startswith(b"\xff\xffsvc-used-kp\x00")
    used = frozenset({b"\x03" * 1216, b"\x04" * 1216, b"\x05" * 32})
    packed = pack(tracked, used)
    assert packed.startswith(b"\xff\xffsvc-used-kp\x01")
    assert unpack(packed) == (tracked, used)
    for cut in (packed[:20], packed[:24], packed[:600], packed[: 14 + 4 + 2 + 1216 + 1]):
        with pytest.raises(ValueError, match="cut short"):
            unpack(cut)
    with pytest.raises(ValueError, match="cannot be stored"):
        pack(tracked, frozenset({b"\x00" * 70_000}))


# The order of the P-256 group: an ECDSA signature (r, s) also verifies as (r, n - s).
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def _der_int(value: int) -> bytes:
    raw = value.to_bytes((value.bit_length() + 8) // 8, "big")  # a leading 0 when needed
    return b"\x02" + bytes([len(raw)]) + raw


def malleated(key_package: bytes) -> bytes:
    """The same P-256 key package with its signature (its last field: a 2-byte length,
    then DER ``SEQUENCE {r, s}``) changed from (r, s) to (r, n - s)."""
    for at in range(len(key_package) - 8, 0, -1):
        if key_package[at] == 0x30 and key_package[at + 1] + 2 == len(key_package) - at:
            break
    der = key_package[at:]
    r_len = der[3]
    r = int.from_bytes(der[4 : 4 + r_len], "big")
    s = int.from_bytes(der[6 + r_len :], "big")
    body = _der_int(r) + _der_int(P256_ORDER - s)
    signature = b"\x30" + bytes([len(body)]) + body
    assert key_package[at - 2] & 0xC0 == 0x40  # a 2-byte MLS varint length
    return key_package[: at - 2] + (0x4000 | len(signature)).to_bytes(2, "big") + signature


async def test_a_used_key_package_under_another_signature_encoding_is_refused(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """In a P-256 channel (suite 2) a used key package can be copied with its ECDSA
    signature's other valid form: another KeyPackageRef, the same key package. The relay
    tells key packages apart by their init key."""

    async def p256(name: str) -> Member:
        made = await asyncio.to_thread(
            certify_with_api, Engine(tmp_path / name, name.encode(), 2), *api
        )
        return Member(name, made, await connect(stack, account, name.encode()))

    api = (account.api_url, account.key)
    alice, bob = await p256("alice"), await p256("bob")
    await alice.create(CHANNEL)
    assert alice.group is not None and alice.group.cipher_suite == 2
    used = bob.engine.generate_key_package()
    await alice.commit(CHANNEL, alice.group.add_members([used]))
    await bob.join(CHANNEL)
    await alice.commit(CHANNEL, alice.group.remove_members([bob.member_id]))
    copy = malleated(used)
    assert inspect(copy).key_package_ref != inspect(used).key_package_ref
    reply = await alice.refused(CHANNEL, [copy])  # a valid key package to the engine
    assert reply.code == INVALID, reply
    assert "used in this channel before" in reply.message, reply.message
    await close(alice, bob)


async def test_a_plain_members_commit_with_a_spoiled_tag_is_refused(
    stack: Stack, account: Account, tmp_path: Path, rogue_commit: Path
) -> None:
    """The membership tag is a MAC under a key only members hold, outside the signature:
    the relay cannot check it, and every member refuses a commit whose tag is spoiled. A
    plain member's commit never gets that far: only the owner and admins commit, which the
    relay checks from the signature alone, so a plain member cannot strand the channel."""
    alice, bob = await pair(stack, account, tmp_path)
    assert alice.group and bob.group
    epoch = alice.group.epoch
    head = (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq
    bob.engine.close()  # the tool signs with bob's key from his data_dir
    spoiled = bytearray(rogue(rogue_commit, tmp_path / "bob", "bob", "update"))
    spoiled[-1] ^= 1  # the last byte of a member's PublicMessage is its membership tag
    with pytest.raises(MlsError, match="membership tag"):
        await asyncio.to_thread(alice.group.process, bytes(spoiled))
    frame = pb.Commit(channel=CHANNEL, epoch=epoch, commit=bytes(spoiled))
    reply = await bob.conn.request(frame, check=False)
    assert reply.code == DENIED, reply
    assert "only the owner and admins commit" in reply.message, reply.message
    assert (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq == head
    reply = await alice.commit(CHANNEL, alice.group.self_update())
    assert reply.epoch == epoch + 1
    await close(alice, bob)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="the relay follows groups from outside and cannot check membership tags "
    "(docs/security.md, 'A commit members cannot process')",
)
async def test_an_admins_commit_whose_membership_tag_is_wrong_is_refused(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """An admin can sign a valid commit and spoil its tag: every member refuses it, and a
    relay that stores it has moved the channel to an epoch nobody can enter. (Admins hold
    authority over the channel anyway: they can remove every other member.)"""
    alice, bob = await pair(stack, account, tmp_path)
    assert alice.group and bob.group
    await alice.commit(CHANNEL, alice.group.set_role(bob.member_id, "admin"))
    await bob.next()
    head = (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq
    pending = bob.group.self_update()
    spoiled = bytearray(pending.commit)
    spoiled[-1] ^= 1  # the last byte of a member's PublicMessage is its membership tag
    bob.group.clear_pending_commit()
    with pytest.raises(MlsError, match="membership tag"):
        await asyncio.to_thread(alice.group.process, bytes(spoiled))
    frame = pb.Commit(channel=CHANNEL, epoch=pending.epoch, commit=bytes(spoiled))
    reply = await bob.conn.request(frame, check=False)
    assert reply.code == INVALID, reply
    assert (await alice.conn.request(pb.CreateChannel(channel=CHANNEL))).head_seq == head
