"""An idle stream whose client pings every ~10 s (gRPC keepalive, as A8 allows) stays up:
the relay's ping policy must accept it. A misspelt server option once left gRPC's
5-minute default in place, and idle agents were cut off with GOAWAY too_many_pings."""

from __future__ import annotations

import asyncio

import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.relay_client import RelayConnection
from svc_server.stack import Stack

from .conftest import Account

pytestmark = pytest.mark.anyio


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_idle_stream_with_keepalive_pings_survives(stack: Stack, account: Account) -> None:
    conn = RelayConnection(
        stack.relay_url,
        await account.token(),
        b"idle",
        keepalive=10.5,  # just above the relay's 10 s minimum
        keepalive_timeout=5.0,
    )
    await conn.open()
    try:
        await asyncio.sleep(55)  # five pings without data: the third strike would end it
        assert conn.closed is not None and not conn.closed.done(), conn.closed
        reply = await conn.request(pb.Unsubscribe(channel="acme/idle/chan"))
        assert reply.code == 0
    finally:
        await conn.close()
