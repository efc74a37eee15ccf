"""MLS members talking through a real relay, driven at the protocol level."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.mls import Engine, Group, PendingCommit
from svc_sdk.relay_client import RelayConnection
from svc_sdk.testing import certify_with_api

from ..conftest import ISSUER


def commit_frame(channel: str, pending: PendingCommit) -> pb.Commit:
    """The Commit request that sends ``pending``."""
    return pb.Commit(
        channel=channel,
        epoch=pending.epoch,
        commit=pending.commit,
        welcome=pending.welcome or b"",
    )


@dataclass
class Member:
    name: str
    engine: Engine
    conn: RelayConnection
    group: Group | None = None
    cursor: int = 0
    received: list[bytes] = field(default_factory=list)
    #: Members whose key updates the last commit ``next`` processed applied.
    updated: list[bytes] = field(default_factory=list)

    @property
    def identity(self) -> bytes:
        return self.name.encode()

    @property
    def member_id(self) -> bytes:
        """How the group and the relay name this member: account, then identity."""
        member_id = self.engine.member_id
        assert member_id is not None
        return member_id

    async def create(self, channel: str, cipher_suite: int | None = None) -> None:
        self.group = self.engine.create_group(channel.encode(), cipher_suite)
        await self.conn.request(
            pb.CreateChannel(channel=channel, group_info=self.group.group_info())
        )
        await self.subscribe(channel)

    async def subscribe(self, channel: str) -> pb.Reply:
        return await self.conn.request(pb.Subscribe(channel=channel, after_seq=self.cursor))

    async def add(self, channel: str, other: Member) -> None:
        assert self.group is not None
        await self.commit(channel, self.group.add_members([other.engine.generate_key_package()]))

    async def commit(self, channel: str, pending: PendingCommit) -> pb.Reply:
        """Sends ``pending`` and applies it once the relay accepted it."""
        assert self.group is not None
        reply = await self.conn.request(commit_frame(channel, pending))
        self.group.apply_pending_commit()
        self.cursor = reply.seq
        return reply

    async def refused(self, channel: str, key_packages: list[bytes]) -> pb.Reply:
        """Commits adding ``key_packages`` expecting a refusal: the relay's Reply, with
        the pending commit cleared."""
        assert self.group is not None
        pending = self.group.add_members(key_packages)
        reply = await self.conn.request(commit_frame(channel, pending), check=False)
        self.group.clear_pending_commit()
        return reply

    async def join(self, channel: str) -> None:
        welcome = await asyncio.wait_for(self.conn.welcomes.get(), 10)
        assert welcome.channel == channel
        self.group = self.engine.join_group(welcome.welcome)
        self.cursor = welcome.seq
        await self.subscribe(channel)

    async def send(self, channel: str, text: str) -> int:
        assert self.group is not None
        reply = await self.conn.request(
            pb.Publish(channel=channel, message=[self.group.encrypt(text.encode())])
        )
        return reply.seq

    async def next(self, timeout: float = 10.0) -> pb.Delivery:
        """The next delivery, processed by the engine (commits applied, text recorded)."""
        assert self.group is not None
        delivery = await asyncio.wait_for(self.conn.deliveries.get(), timeout)
        self.cursor = delivery.seq
        while delivery.handshake and delivery.sender == self.member_id:
            # Own commits are echoed (already applied on the Reply): skip them.
            delivery = await asyncio.wait_for(self.conn.deliveries.get(), timeout)
            self.cursor = delivery.seq
        received = self.group.process(delivery.message)
        if received.data is not None:
            self.received.append(received.data)
        if received.kind == "commit":
            self.updated = received.updated
        return delivery


async def create_channel(
    conn: RelayConnection, api: tuple[str, str], root: Path, channel: str
) -> Group:
    """Creates ``channel`` over a raw connection: an engine for the connection's identity,
    with a credential from the account API at ``api`` (url, API key), makes the group the
    relay then tracks."""
    made = await asyncio.to_thread(engine, root, conn.identity.decode(), api)
    group = made.create_group(channel.encode())
    await conn.request(pb.CreateChannel(channel=channel, group_info=group.group_info()))
    return group


def engine(root: Path, name: str, api: tuple[str, str] | None = None) -> Engine:
    """An engine with a credential: from the account API at ``api`` (url, API key), as
    the relay verifies key packages against it, else from the tests' local issuer (for
    messages whose credentials the relay never sees)."""
    made = Engine(root / name, name.encode())
    if api is None:
        return ISSUER.certify(made)
    return certify_with_api(made, *api)


def raw_stream(relay_url: str, token: str) -> tuple[grpc.aio.Channel, Any]:
    """A Connect stream (as agent ``raw``) that writes bytes as given: for frames no client
    would build. Returns the gRPC channel, to close, and the call."""
    channel = grpc.aio.insecure_channel(relay_url.removeprefix("http://"))
    call = channel.stream_stream(
        "/svc.relay.v1.Relay/Connect",
        request_serializer=lambda b: b,
        response_deserializer=pb.ServerFrame.FromString,
    )(metadata=(("authorization", f"Bearer {token}"), ("svc-identity", b"raw".hex())))
    return channel, call
