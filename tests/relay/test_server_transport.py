"""The relay's native gRPC server (server/relay/transport.py over native/src/transport/
server.rs) against hostile connections: whatever one connection sends — an oversized
header block, bytes that are not HTTP/2, nothing at all, a stream it never reads — it
gets a clear refusal or a bounded wait, and every other client is served on."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.relay_client import Code, RelayConnection, StreamError
from svc_server.stack import Stack

from .conftest import Account

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("backend", ["sqlite"], indirect=True)]

METHOD = "/svc.relay.v1.Relay/Connect"


async def served(stack: Stack, account: Account) -> None:
    """A well-behaved client is served at once."""
    async with RelayConnection(stack.relay_url, await account.token(), b"fine") as conn:
        reply = await conn.request(pb.Unsubscribe(channel="acme/ok/chan"), timeout=5)
        assert reply.code == 0


async def test_a_header_block_over_the_limit_is_refused(stack: Stack, account: Account) -> None:
    token = await account.token()
    async with grpc.aio.insecure_channel(stack.relay_url.removeprefix("http://")) as channel:
        call = channel.stream_stream(METHOD)(
            metadata=(
                ("authorization", f"Bearer {token}"),
                ("svc-identity", b"big".hex()),
                ("x-padding", "a" * 40_000),
            )
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(call.read(), 10)
        assert info.value.code() != grpc.StatusCode.OK
    assert not stack.relay.relay.sessions  # it never reached the relay's code
    await served(stack, account)


@pytest.mark.parametrize(
    "junk",
    [
        b"GET / HTTP/1.1\r\nHost: relay\r\n\r\n",  # HTTP/1.1
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64,  # the preface, then garbage
        bytes(range(256)) * 4,
    ],
    ids=["http1", "bad-frames", "noise"],
)
async def test_bytes_that_are_not_http2_end_their_connection(
    stack: Stack, account: Account, junk: bytes
) -> None:
    port = int(stack.relay_url.rsplit(":", 1)[1])

    def send_junk() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(junk)
            try:
                while sock.recv(4096):  # a GOAWAY, say, until the relay closes it
                    pass
            except ConnectionResetError:
                pass  # closed with unread junk in its buffer: a reset

    await asyncio.to_thread(send_junk)  # returns: the relay closed the connection (no timeout)
    await served(stack, account)


async def test_connections_that_say_nothing_hold_up_no_one(stack: Stack, account: Account) -> None:
    port = int(stack.relay_url.rsplit(":", 1)[1])
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
    try:
        await asyncio.wait_for(served(stack, account), 10)
    finally:
        for sock in silent:
            sock.close()


async def test_a_stream_the_client_cancels_ends_its_session(stack: Stack, account: Account) -> None:
    conn = RelayConnection(stack.relay_url, await account.token(), b"leaver")
    await conn.open()
    await conn.request(pb.Unsubscribe(channel="acme/ok/chan"), timeout=5)
    assert len(stack.relay.relay.sessions) == 1
    await conn.close()
    for _ in range(500):
        if not stack.relay.relay.sessions:
            break
        await asyncio.sleep(0.01)
    assert not stack.relay.relay.sessions
    await served(stack, account)


async def test_a_stopping_relay_ends_open_streams_with_unavailable(
    stack: Stack, account: Account
) -> None:
    conn = RelayConnection(stack.relay_url, await account.token(), b"stays")
    await conn.open()
    assert conn.closed is not None
    await stack.relay.transport.stop(0.2)
    ended = await asyncio.wait_for(asyncio.shield(conn.closed), 5)
    assert isinstance(ended, StreamError), ended
    assert ended.status == Code.UNAVAILABLE and "shutting down" in ended.details
    await conn.close()
