"""Stream authentication, token expiry and refresh, slow subscribers, retention, health."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from grpc_health.v1 import health_pb2, health_pb2_grpc

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.relay_client import Code, RelayConnection, StreamError
from svc_server.stack import Stack, start_stack, stop_stack

from .conftest import Account
from .helpers import create_channel
from .test_relay import CHANNEL, engine_group_message

_large: dict[int, bytes] = {}


def large_group_message(size: int) -> bytes:
    if size not in _large:
        import tempfile
        from pathlib import Path

        from .helpers import engine

        group = engine(Path(tempfile.mkdtemp()), "big").create_group(CHANNEL.encode())
        _large[size] = group.encrypt(b"\x00" * size)
    return _large[size]


pytestmark = pytest.mark.anyio


def forge(stack: Stack, account: Account, *, key: Any = None, **claims: Any) -> str:
    services = stack.services
    real = services.signer.get()
    now = int(time.time())
    body = {
        "sub": account.account_id,
        "plan": "free",
        "iss": "svc-api",
        "aud": "svc-relay",
        "iat": now,
        "exp": now + 300,
        "jti": uuid.uuid4().hex,
    }
    body.update(claims)
    return jwt.encode(body, key or real.private_key, algorithm="EdDSA", headers={"kid": real.kid})


async def open_status(stack: Stack, token: str, identity: bytes = b"x") -> grpc.StatusCode:
    conn = RelayConnection(stack.relay_url, token, identity)
    try:
        await conn.open()
        await conn.request(pb.Unsubscribe(channel=CHANNEL), timeout=10)
    except StreamError as exc:
        return grpc.StatusCode[exc.status.name]
    except ConnectionError:
        assert conn.closed is not None
        error = await conn.closed
        return grpc.StatusCode[error.status.name] if error is not None else grpc.StatusCode.OK
    finally:
        await conn.close()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"exp": int(time.time()) - 600}, "expired"),
        ({"aud": "someone-else"}, "audience"),
        ({"iss": "impostor"}, "issuer"),
    ],
)
async def test_bad_tokens_are_refused_at_once(
    stack: Stack, account: Account, claims: dict[str, Any], reason: str
) -> None:
    assert (
        await open_status(stack, forge(stack, account, **claims)) == grpc.StatusCode.UNAUTHENTICATED
    )


async def test_forged_missing_and_garbage_tokens(stack: Stack, account: Account) -> None:
    forged = forge(stack, account, key=Ed25519PrivateKey.generate())
    for token in (forged, "", "not-a-jwt"):
        assert await open_status(stack, token) == grpc.StatusCode.UNAUTHENTICATED
    assert (
        await open_status(stack, await account.token(), identity=b"")
        == grpc.StatusCode.INVALID_ARGUMENT
    )


async def test_token_of_a_revoked_key_stays_valid_until_exp(stack: Stack, account: Account) -> None:
    import httpx

    token = await account.token()
    async with httpx.AsyncClient(base_url=stack.api_url) as http:
        auth = {"Authorization": f"Bearer {account.key}"}
        spare = (await http.post("/v1/keys", headers=auth)).json()
        keys = (await http.get("/v1/keys", headers=auth)).json()["keys"]
        original = next(k["id"] for k in keys if k["id"] != spare["id"])
        await http.delete(
            f"/v1/keys/{original}", headers={"Authorization": f"Bearer {spare['key']}"}
        )
    assert await open_status(stack, token) == grpc.StatusCode.OK  # valid until it expires


async def test_stream_closes_when_token_expires_and_refresh_extends(
    stack: Stack, account: Account
) -> None:
    short = forge(stack, account, exp=int(time.time()) + 2)
    conn = RelayConnection(stack.relay_url, short, b"short-lived")
    await conn.open()
    await conn.request(pb.Unsubscribe(channel=CHANNEL))
    assert conn.closed is not None
    error = await asyncio.wait_for(conn.closed, 10)
    assert error is not None and error.status == Code.UNAUTHENTICATED
    assert "token expired" in error.details
    await conn.close()

    refreshed = RelayConnection(
        stack.relay_url, forge(stack, account, exp=int(time.time()) + 2), b"refresher"
    )
    await refreshed.open()
    await refreshed.request(pb.Refresh(token=await account.token()))
    await asyncio.sleep(3)
    assert (await refreshed.request(pb.Unsubscribe(channel=CHANNEL))).code == 0
    other = forge(stack, account, sub=str(uuid.uuid4()))
    reply = await refreshed.request(pb.Refresh(token=other), check=False)
    assert reply.code == grpc.StatusCode.UNAUTHENTICATED.value[0]
    await refreshed.close()


async def test_slow_subscriber_never_stalls_the_others(
    make_relay_settings: Any, tmp_path: Any, backend: str
) -> None:
    # The smallest buffer allowed, but on a Redis Cluster, where a relay learns of new
    # entries through Pub/Sub across the cluster bus, a notification now and then comes
    # some 50 ms late and a reader fed at full speed gets a batch of 10-20 at once.
    buffer = 64 if backend.startswith("redis+cluster") else 16
    stack = await start_stack(
        make_relay_settings(subscriber_buffer=buffer), api_port=0, relay_port=0
    )
    try:
        from .conftest import new_account

        account = await new_account(stack.api_url, "fanout@example.com")
        token = await account.token()
        sender = RelayConnection(stack.relay_url, token, b"sender")
        fast = RelayConnection(stack.relay_url, token, b"fast")
        for c in (sender, fast):
            await c.open()
        await create_channel(sender, (account.api_url, account.key), tmp_path, CHANNEL)
        await fast.request(pb.Subscribe(channel=CHANNEL))
        # A subscriber that never reads its stream.
        channel = grpc.aio.insecure_channel(stack.relay_url.removeprefix("http://"))
        stuck = channel.stream_stream(
            "/svc.relay.v1.Relay/Connect",
            request_serializer=pb.ClientFrame.SerializeToString,
            response_deserializer=pb.ServerFrame.FromString,
        )(metadata=(("authorization", f"Bearer {token}"), ("svc-identity", b"stuck".hex())))
        await stuck.write(pb.ClientFrame(request_id=1, subscribe=pb.Subscribe(channel=CHANNEL)))
        # 64 KiB messages: far more than gRPC's flow-control windows hold for the stuck one.
        big = large_group_message(64 * 1024)
        count = 300
        for _ in range(count):
            await sender.request(pb.Publish(channel=CHANNEL, message=[big]))
        got = [await asyncio.wait_for(fast.deliveries.get(), 10) for _ in range(count)]
        assert [d.seq for d in got] == list(range(1, count + 1))
        # The stuck one is told to resume from its cursor once it reads again.
        kinds = []
        while "lagged" not in kinds:
            frame = await asyncio.wait_for(stuck.read(), 10)
            kinds.append(frame.WhichOneof("kind"))
        assert kinds.count("deliveries") < count
        metrics = stack.relay.relay.metrics
        assert metrics.deliveries._value.get() >= count
        await channel.close()
        await sender.close()
        await fast.close()
    finally:
        await stop_stack(stack)


async def test_cursor_behind_retention_is_a_clear_error(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    conn = RelayConnection(stack.relay_url, await account.token(), b"old")
    await conn.open()
    await create_channel(conn, (account.api_url, account.key), tmp_path, CHANNEL)
    for _ in range(3):
        await conn.request(pb.Publish(channel=CHANNEL, message=[engine_group_message(stack)]))
    await stack.relay.relay.store.trim(time.time() + 1)  # as if retention had passed
    reply = await conn.request(pb.Subscribe(channel=CHANNEL, after_seq=0), check=False)
    assert reply.code == grpc.StatusCode.OUT_OF_RANGE.value[0]
    assert "removed by retention" in reply.message
    ok = await conn.request(pb.Subscribe(channel=CHANNEL, after_seq=3))
    assert ok.head_seq == 3
    await conn.close()


async def test_health_service(stack: Stack) -> None:
    async with grpc.aio.insecure_channel(stack.relay_url.removeprefix("http://")) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "svc.relay.v1.Relay"):
            response = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_client_that_never_reads_is_cut_off(make_relay_settings: Any) -> None:
    from svc_server.relay import session as relay_session

    stack = await start_stack(make_relay_settings(), api_port=0, relay_port=0)
    limit = relay_session.MAX_UNREAD_REPLIES
    relay_session.MAX_UNREAD_REPLIES = 50
    try:
        from .conftest import new_account

        account = await new_account(stack.api_url, "noreader@example.com")
        channel = grpc.aio.insecure_channel(stack.relay_url.removeprefix("http://"))
        call = channel.stream_stream(
            "/svc.relay.v1.Relay/Connect",
            request_serializer=pb.ClientFrame.SerializeToString,
            response_deserializer=pb.ServerFrame.FromString,
        )(
            metadata=(
                ("authorization", f"Bearer {await account.token()}"),
                ("svc-identity", b"n".hex()),
            )
        )
        # Requests whose replies are never read; each reply repeats the 60 KB name, so
        # gRPC's own buffers cannot absorb them all.
        name = "a/b/" + "c" * 60_000

        async def flood() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                for i in range(2_000):
                    frame = pb.ClientFrame(request_id=i + 1, subscribe=pb.Subscribe(channel=name))
                    await call.write(frame)

        writer = asyncio.create_task(flood())
        # The relay drops the session and its queued replies, although the client, which
        # is not reading, cannot even receive the status.
        ended = stack.relay.relay.metrics.streams_ended.labels("RESOURCE_EXHAUSTED")
        deadline = time.monotonic() + 20
        while ended._value.get() < 1:
            assert time.monotonic() < deadline, "the relay kept a stream that never reads"
            await asyncio.sleep(0.05)
        assert stack.relay.relay.metrics.streams._value.get() == 0
        writer.cancel()
        call.cancel()
        await channel.close()
    finally:
        relay_session.MAX_UNREAD_REPLIES = limit
        await stop_stack(stack)


async def test_an_account_has_a_bounded_number_of_streams(make_relay_settings: Any) -> None:
    """Past SVC_RELAY_STREAMS_PER_ACCOUNT, a new stream of that account is refused with
    RESOURCE_EXHAUSTED and a message that names the setting; the account's open streams
    and other accounts' go on, and a stream that closes frees its place."""
    from .conftest import new_account

    stack = await start_stack(
        make_relay_settings(relay_streams_per_account=3), api_port=0, relay_port=0
    )
    opened: list[RelayConnection] = []
    try:
        hog = await new_account(stack.api_url, "hog@example.com")
        token = await hog.token()
        for n in range(3):
            opened.append(RelayConnection(stack.relay_url, token, f"agent{n}".encode()))
            await opened[-1].open()
        refused = RelayConnection(stack.relay_url, token, b"one-too-many")
        with pytest.raises(StreamError) as caught:
            await refused.open()
        await refused.close()
        assert caught.value.status == Code.RESOURCE_EXHAUSTED
        assert "SVC_RELAY_STREAMS_PER_ACCOUNT" in str(caught.value)
        for conn in opened:  # still served
            await conn.request(pb.Unsubscribe(channel=CHANNEL), timeout=10)
        other = await new_account(stack.api_url, "other@example.com")
        assert await open_status(stack, await other.token()) == grpc.StatusCode.OK
        await opened.pop().close()
        for _ in range(100):  # the relay sees the stream end
            if await open_status(stack, token, b"agent-again") == grpc.StatusCode.OK:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("a closed stream's place was never freed")
    finally:
        for conn in opened:
            await conn.close()
        await stop_stack(stack)


async def test_an_account_asking_for_channels_it_may_not_use_is_throttled(
    stack: Stack, account: Account, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each refused access check costs the relay a group lookup and a database query:
    past its budget (100 at once, then 10 a second), an account's requests that need
    a check are answered RESOURCE_EXHAUSTED without one, while its requests that need
    none, the channels a stream was allowed before, and every other account go on. A
    stream stays refused for a channel it was throttled on, once the budget refilled
    too (what it pipelined behind the refused request must not overtake it); a new
    stream is checked again."""
    from svc_server.relay import session
    from svc_server.relay.denials import DENIAL_BURST, Denials

    from .conftest import connect, new_account

    now = [0.0]  # the budget's clock, moved by hand
    stack.relay.relay.denials = Denials(clock=lambda: now[0])
    owner = await connect(stack, account, b"owner")
    await create_channel(owner, (account.api_url, account.key), tmp_path, CHANNEL)
    prober = await new_account(stack.api_url, "prober@example.com")
    probe = await connect(stack, prober, b"probe")
    own = "p/r/ober"
    await create_channel(probe, (prober.api_url, prober.key), tmp_path, own)
    await probe.request(pb.Subscribe(channel=own))

    async def codes(n: int) -> list[int]:
        return [
            (await probe.request(pb.Subscribe(channel=CHANNEL), check=False)).code for _ in range(n)
        ]

    denied, throttled = Code.PERMISSION_DENIED, Code.RESOURCE_EXHAUSTED
    assert await codes(DENIAL_BURST + 5) == [denied] * DENIAL_BURST + [throttled] * 5
    reply = await probe.request(pb.CreateChannel(channel=CHANNEL, group_info=b""), check=False)
    assert reply.code == throttled and "retry" in reply.message
    monkeypatch.setattr(session, "ACCESS_TTL", 0.0)  # every request checks again
    await probe.request(pb.Subscribe(channel=own))  # allowed on this stream before: checked
    await probe.request(pb.Unsubscribe(channel=own))  # needs no check: served
    await owner.request(pb.Subscribe(channel=CHANNEL))  # another account: unaffected
    now[0] += 0.25  # 10 a second: two more refusals, each checked, but not on this stream
    assert await codes(2) == [throttled, throttled]
    await probe.close()
    probe = await connect(stack, prober, b"probe")
    assert await codes(3) == [denied, denied, throttled]
    # Join requests with ids the account never got, in a channel it may use, likewise.
    stack.relay.relay.denials = Denials(clock=lambda: now[0])
    joins = [
        (await probe.request(pb.JoinRequest(channel=own, join_id=str(uuid.uuid4())), check=False))
        for _ in range(DENIAL_BURST + 1)
    ]
    assert [j.code for j in joins] == [denied] * DENIAL_BURST + [throttled]
    await probe.close()
    await owner.close()


async def test_a_publish_behind_a_throttled_one_is_not_stored_before_it(
    stack: Stack, account: Account, tmp_path: Path
) -> None:
    """The sender's order holds when the account's budget throttles its Publish: a
    Publish pipelined behind the refused one (the budget refilled in between) is
    refused too on that stream, and both are stored in order once sent again on a new
    one. (Throttled, because a commit made every stream check the channel again while
    another agent of the account spent the budget.)"""
    from svc_server.relay.denials import DENIAL_BURST, Denials

    from .conftest import connect
    from .test_relay import member

    now = [0.0]
    stack.relay.relay.denials = Denials(clock=lambda: now[0])
    alice = await member(stack, account, tmp_path, "alice")
    await alice.create(CHANNEL)
    assert alice.group is not None
    await alice.commit(CHANNEL, alice.group.self_update())
    prober = await connect(stack, account, b"prober")
    for _ in range(DENIAL_BURST):
        await prober.request(pb.Subscribe(channel="some/one/else"), check=False)

    first, second = (alice.group.encrypt(text) for text in (b"first", b"second"))
    reply = await alice.conn.request(pb.Publish(channel=CHANNEL, message=[first]), check=False)
    assert reply.code == Code.RESOURCE_EXHAUSTED, reply
    now[0] += 60  # refilled
    reply = await alice.conn.request(pb.Publish(channel=CHANNEL, message=[second]), check=False)
    assert reply.code == Code.RESOURCE_EXHAUSTED, reply

    again = await connect(stack, account, b"alice")
    for message in (first, second):
        await again.request(pb.Publish(channel=CHANNEL, message=[message]))
    stored = await stack.relay.relay.store.read(CHANNEL, 0, 10)
    assert [e.message for e in stored if not e.handshake] == [first, second]
    for conn in (alice.conn, prober, again):
        await conn.close()


async def test_a_stream_held_back_on_too_many_channels_is_closed(
    stack: Stack, account: Account
) -> None:
    """Each channel a stream was throttled on is remembered for the stream's life: a
    stream that goes on asking for new names past the budget is closed at 1,000 of
    them, not left to grow."""
    from svc_server.relay import session
    from svc_server.relay.denials import DENIAL_BURST, Denials

    from .conftest import connect

    stack.relay.relay.denials = Denials(clock=lambda: 0.0)  # never refills
    probe = await connect(stack, account, b"probe")
    codes: collections.Counter[int] = collections.Counter()

    async def ask_on() -> None:
        for n in range(DENIAL_BURST + session.MAX_HELD_BACK + 10):
            reply = await probe.request(pb.Subscribe(channel=f"no/such/c{n}"), check=False)
            codes[reply.code] += 1

    with pytest.raises(ConnectionError):
        await ask_on()
    assert probe.closed is not None
    ended = await asyncio.wait_for(probe.closed, 10)
    assert isinstance(ended, StreamError) and ended.status == Code.RESOURCE_EXHAUSTED, ended
    assert codes[Code.PERMISSION_DENIED] == DENIAL_BURST
    # The request that passed the bound may be answered before the stream ends, or not.
    assert session.MAX_HELD_BACK <= codes[Code.RESOURCE_EXHAUSTED] <= session.MAX_HELD_BACK + 1
    await probe.close()
