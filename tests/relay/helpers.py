"""MLS members talking through a real relay, driven at the protocol level."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.mls import Engine, Group
from svc_sdk.relay_client import RelayConnection


@dataclass
class Member:
    name: str
    engine: Engine
    conn: RelayConnection
    group: Group | None = None
    cursor: int = 0
    received: list[bytes] = field(default_factory=list)

    @property
    def identity(self) -> bytes:
        return self.name.encode()

    async def create(self, channel: str) -> None:
        await self.conn.request(create=pb.CreateChannel(channel=channel))
        self.group = self.engine.create_group(channel.encode())
        await self.subscribe(channel)

    async def subscribe(self, channel: str) -> pb.Reply:
        return await self.conn.request(
            subscribe=pb.Subscribe(channel=channel, after_seq=self.cursor)
        )

    async def add(self, channel: str, other: Member) -> None:
        assert self.group is not None
        pending = self.group.add_members([other.engine.generate_key_package()])
        reply = await self.conn.request(
            commit=pb.Commit(
                channel=channel,
                epoch=pending.epoch,
                commit=pending.commit,
                welcome=pending.welcome or b"",
                joiners=[other.identity],
            )
        )
        self.group.apply_pending_commit()
        self.cursor = reply.seq

    async def join(self, channel: str) -> None:
        welcome = await asyncio.wait_for(self.conn.welcomes.get(), 10)
        assert welcome.channel == channel
        self.group = self.engine.join_group(welcome.welcome)
        self.cursor = welcome.seq
        await self.subscribe(channel)

    async def send(self, channel: str, text: str) -> int:
        assert self.group is not None
        reply = await self.conn.request(
            publish=pb.Publish(channel=channel, message=[self.group.encrypt(text.encode())])
        )
        return reply.seq

    async def next(self, timeout: float = 10.0) -> pb.Delivery:
        """The next delivery, processed by the engine (commits applied, text recorded)."""
        assert self.group is not None
        delivery = await asyncio.wait_for(self.conn.deliveries.get(), timeout)
        self.cursor = delivery.seq
        while delivery.handshake and delivery.sender == self.identity:
            # Own commits are echoed (already applied on the Reply): skip them.
            delivery = await asyncio.wait_for(self.conn.deliveries.get(), timeout)
            self.cursor = delivery.seq
        received = self.group.process(delivery.message)
        if received.data is not None:
            self.received.append(received.data)
        return delivery


def engine(root: Path, name: str) -> Engine:
    return Engine(root / name, name.encode())
