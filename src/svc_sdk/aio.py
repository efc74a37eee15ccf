"""The client for event loops: ``await`` and ``async for`` over the same core.

Agent frameworks run in an event loop (LangChain's ``_arun``, MCP and A2A servers). An
:class:`AsyncChannel` reads on the caller's loop, with no thread per call: a
reader waits on a future that the relay link's thread completes when deliveries
arrive, and then decrypts in the loop (a batch takes microseconds per message).
Membership changes and account calls — rare, several round trips each — run the
blocking core in a worker thread. ``await channel.send`` is a local step (encrypt,
write the outbox row) like the blocking ``send``; it awaits room when the outbox is full.

>>> async with await AsyncSvcClient.connect(relay, data_dir, b"alice", api_key=key) as client:
...     channel = await client.create_channel("acme/support/triage")
...     await channel.send(b"hello")
...     async for payload in channel:
...         ...

Works on asyncio, and on anyio's asyncio backend. Cancelling a read loses nothing: a
message is taken from the channel only by the step that returns it, which has no
await in it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, cast

import anyio.to_thread

from svc_sdk._checks import check_payload, check_wait
from svc_sdk._reader import ReadState
from svc_sdk.agent_id import AgentId
from svc_sdk.channel import Accept, Channel, Message
from svc_sdk.client import SvcClient
from svc_sdk.envelope import Envelope
from svc_sdk.errors import ChannelClosedError
from svc_sdk.health import ChannelHealth, ClientHealth
from svc_sdk.manager import SvcChannelManager, to_envelope

# While another thread holds the channel's lock (a commit waiting for the relay), a
# task polls for it at this interval instead of blocking its loop.
_LOCK_POLL = 0.001


class AsyncChannel:
    """A :class:`Channel` for coroutines. Obtain one from :class:`AsyncSvcClient`, or
    wrap a channel of a blocking client: ``AsyncChannel(client.channel(name))`` — both
    faces can be used at once, from threads and tasks."""

    def __init__(self, channel: Channel) -> None:
        if not isinstance(channel, Channel):
            raise TypeError(f"AsyncChannel wraps a Channel, not {type(channel).__name__}")
        self.channel = channel

    @property
    def name(self) -> str:
        """The channel's name (org/namespace/service)."""
        return self.channel.name

    def __repr__(self) -> str:
        return f"AsyncChannel({self.name!r})"

    # -- local state: no waiting -------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The group's MLS epoch, as this agent has it."""
        return self.channel.epoch

    @property
    def cipher_suite(self) -> int:
        """See :attr:`Channel.cipher_suite`."""
        return self.channel.cipher_suite

    @property
    def closed(self) -> bool:
        """Whether the channel closed: left, removed, or its client closed."""
        return self.channel.closed

    def members(self) -> list[AgentId]:
        """The members, as this agent's MLS state has them (see :meth:`Channel.members`)."""
        return self.channel.members()

    def health(self) -> ChannelHealth:
        """See :meth:`Channel.health`."""
        return self.channel.health()

    # -- receiving ---------------------------------------------------------------------

    async def next_message(
        self, timeout: float | None = None, accept: Accept | None = None
    ) -> Message | None:
        """The next message (that ``accept`` wants), waiting up to ``timeout``; None on
        timeout or once the channel is closed (see :meth:`Channel.next_message`)."""
        taken = await self._read(timeout, accept, 1)
        return taken[0] if taken else None

    async def next_messages(
        self, timeout: float | None = None, accept: Accept | None = None, limit: int | None = None
    ) -> list[Message]:
        """Waits up to ``timeout`` for a message, then returns every one available (at
        most ``limit``), in channel order; [] on timeout or once closed."""
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ValueError(f"limit must be a positive integer or None, not {limit!r}")
        return await self._read(timeout, accept, limit)

    async def messages(self, timeout: float | None = None) -> AsyncIterator[bytes]:
        """Decrypted payloads, in channel order, until the channel closes (or, with
        ``timeout``, until that many seconds pass without one)."""
        check_wait(timeout, None)
        while True:
            message = await self.next_message(timeout)
            if message is None:
                return
            yield message.data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.messages()

    async def _read(
        self, timeout: float | None, accept: Accept | None, limit: int | None
    ) -> list[Message]:
        check_wait(timeout, accept)
        channel = self.channel
        await self._pending_work()  # what an earlier read found, before taking anything
        read = ReadState(None if timeout is None else time.monotonic() + timeout)
        while True:
            with channel._cond:
                taken = channel._reader.step(accept, limit, read)
                if taken is not None:
                    return taken
                waiting = channel._async_waiters.add() if read.wait else None
            if waiting is not None:
                await channel._async_waiters.park(waiting, read.wait)
                continue
            if not channel._lock.acquire(blocking=False):
                await asyncio.sleep(_LOCK_POLL)  # a commit in another thread; not for long
                continue
            try:
                handed = channel._deliveries.process_locked(accept, limit)
            finally:
                channel._lock.release()
            if handed:
                with channel._cond:
                    channel._inbox.mark_consumed(handed, stored=False)
                return handed  # no await since they were taken: a cancel cannot drop them
            await self._pending_work()

    async def _pending_work(self) -> None:
        """Admits joiners and commits proposals the channel found (relay round trips, in
        a worker thread). Only ever awaited with no message taken."""
        if self.channel._admissions.has_work():
            await anyio.to_thread.run_sync(self.channel._admissions.do_work)

    # -- sending: a local step, then the outbox's pump ---------------------------------

    async def send(self, payload: bytes) -> None:
        """See :meth:`Channel.send`: returns once the message is durably in the outbox,
        without blocking the loop (it awaits room when the outbox is full). A cancelled
        send either queued the message whole or not at all."""
        await self._queue([check_payload(payload)])

    async def send_batch(self, payloads: list[bytes]) -> None:
        """See :meth:`Channel.send_batch`: returns once the relay stored them all."""
        if isinstance(cast(object, payloads), bytes | bytearray | memoryview | str):
            raise TypeError("send_batch takes a list of bytes; use send() for one message")
        blobs = [check_payload(payload) for payload in payloads]
        outbox = self.channel._outbox
        if not blobs:
            outbox.raise_deferred()
            return
        last = await self._queue(blobs)
        await outbox.wait_async(last, self.channel._client.timeout)

    async def wait_stored(self, timeout: float | None = None) -> None:
        """See :meth:`Channel.wait_stored`."""
        check_wait(timeout, None)
        outbox = self.channel._outbox
        await outbox.wait_async(outbox.last_pos(), timeout)

    @property
    def unsent(self) -> int:
        """Messages sent on this channel that the relay has not acknowledged yet."""
        return self.channel.unsent

    async def _queue(self, blobs: list[bytes]) -> int:
        channel = self.channel
        outbox = channel._outbox
        outbox.raise_deferred()
        channel._check_open()
        size = sum(map(len, blobs))
        await outbox.wait_for_room_async(len(blobs), size, channel._client.timeout)
        outbox.raise_deferred()
        while not channel._lock.acquire(blocking=False):
            await asyncio.sleep(_LOCK_POLL)  # a commit in another thread; not for long
        try:  # no await from here on: the message is queued whole or not at all
            return channel._queue_locked(blobs)
        finally:
            channel._lock.release()

    # -- membership: a few round trips each, in a worker thread --------------------------

    async def add_member(self, key_package: bytes) -> bytes:
        """See :meth:`Channel.add_member`."""
        return await anyio.to_thread.run_sync(self.channel.add_member, key_package)

    async def remove_member(self, member: AgentId | bytes | str) -> None:
        """See :meth:`Channel.remove_member`."""
        await anyio.to_thread.run_sync(self.channel.remove_member, member)

    async def update_keys(self, timeout: float | None = None) -> None:
        """See :meth:`Channel.update_keys`."""
        await anyio.to_thread.run_sync(self.channel.update_keys, timeout)

    async def leave(self, timeout: float = 5.0) -> None:
        """See :meth:`Channel.leave`."""
        await anyio.to_thread.run_sync(self.channel.leave, timeout)


class AsyncSvcClient:
    """A :class:`SvcClient` for coroutines. ``connect`` takes SvcClient's arguments;
    or wrap a blocking client: ``AsyncSvcClient(client)``."""

    def __init__(self, client: SvcClient) -> None:
        if not isinstance(client, SvcClient):
            raise TypeError(f"AsyncSvcClient wraps an SvcClient, not {type(client).__name__}")
        self.client = client

    @classmethod
    async def connect(cls, *args: Any, **kwargs: Any) -> AsyncSvcClient:
        """Opens the agent's state, gets its credential and connects to the relay (in a
        worker thread, once)."""
        client = await anyio.to_thread.run_sync(lambda: SvcClient(*args, **kwargs))
        return cls(client)

    @property
    def agent_id(self) -> AgentId:
        """This agent as channel members see it: its account and identity."""
        return self.client.agent_id

    def channel(self, name: str) -> AsyncChannel:
        """A channel this agent is in (KeyError if it is not)."""
        return AsyncChannel(self.client.channel(name))

    def channels(self) -> list[str]:
        """Names of the channels this agent is in."""
        return self.client.channels()

    def health(self) -> ClientHealth:
        """See :meth:`SvcClient.health`."""
        return self.client.health()

    def generate_key_package(self, *, cipher_suite: int | None = None) -> bytes:
        """A one-time MLS key package to hand to a member (no round trip); see
        :meth:`SvcClient.generate_key_package`."""
        return self.client.generate_key_package(cipher_suite=cipher_suite)

    async def create_channel(self, name: str, *, cipher_suite: int | None = None) -> AsyncChannel:
        """See :meth:`SvcClient.create_channel`."""
        channel = await anyio.to_thread.run_sync(
            functools.partial(self.client.create_channel, name, cipher_suite=cipher_suite)
        )
        return AsyncChannel(channel)

    async def join_channel(self, name: str, welcome: bytes) -> AsyncChannel:
        """See :meth:`SvcClient.join_channel`."""
        channel = await anyio.to_thread.run_sync(self.client.join_channel, name, welcome)
        return AsyncChannel(channel)

    async def invite(self, channel: str, max_uses: int = 1, ttl: int = 3600) -> str:
        """See :meth:`SvcClient.invite`."""
        return await anyio.to_thread.run_sync(self.client.invite, channel, max_uses, ttl)

    async def join_with_token(
        self, channel: str, token: str, timeout: float = 60.0
    ) -> AsyncChannel:
        """See :meth:`SvcClient.join_with_token`."""
        joined = await anyio.to_thread.run_sync(
            self.client.join_with_token, channel, token, timeout
        )
        return AsyncChannel(joined)

    async def aclose(self) -> None:
        """Closes the client (see :meth:`SvcClient.close`)."""
        await anyio.to_thread.run_sync(self.client.close)

    async def __aenter__(self) -> AsyncSvcClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class AsyncSvcChannelManager:
    """A :class:`SvcChannelManager` for coroutines: the same channels and listeners,
    read on the caller's loop. ``connect`` takes the manager's arguments; or wrap one:
    ``AsyncSvcChannelManager(manager)``.

    >>> async with await AsyncSvcChannelManager.connect("alice") as alice:
    ...     await alice.create("acme/support/triage")
    ...     print(await alice.receive("acme/support/triage", timeout=5.0))
    """

    def __init__(self, manager: SvcChannelManager) -> None:
        if not isinstance(manager, SvcChannelManager):
            raise TypeError(
                f"AsyncSvcChannelManager wraps an SvcChannelManager, not {type(manager).__name__}"
            )
        self.manager = manager

    @classmethod
    async def connect(cls, *args: Any, **kwargs: Any) -> AsyncSvcChannelManager:
        """Opens the agent (in a worker thread, once); see :class:`SvcChannelManager`."""
        manager = await anyio.to_thread.run_sync(lambda: SvcChannelManager(*args, **kwargs))
        return cls(manager)

    @property
    def agent_id(self) -> AgentId:
        """This agent as channel members see it: its account and identity."""
        return self.manager.agent_id

    def list_channels(self) -> list[str]:
        """Names of all channels this agent is in."""
        return self.manager.list_channels()

    def members(self, channel_name: str) -> list[AgentId]:
        """See :meth:`SvcChannelManager.members`."""
        return self.manager.members(channel_name)

    def health(self) -> ClientHealth:
        """See :meth:`SvcChannelManager.health`."""
        return self.manager.health()

    def channel(self, channel_name: str) -> AsyncChannel:
        """The channel's :class:`AsyncChannel` (ChannelClosedError if not in it)."""
        return AsyncChannel(self.manager._channel(channel_name))

    # -- on the loop -------------------------------------------------------------------

    async def send(self, channel_name: str, message: str | bytes) -> None:
        """See :meth:`SvcChannelManager.send` (str is UTF-8 encoded)."""
        data = message.encode() if isinstance(message, str) else message
        await self.channel(channel_name).send(data)

    async def send_envelope(self, channel_name: str, envelope: Envelope) -> None:
        """See :meth:`SvcChannelManager.send_envelope`."""
        if not isinstance(envelope, Envelope):
            raise TypeError("send_envelope takes an Envelope")
        await self.channel(channel_name).send(envelope.serialize())

    async def receive(self, channel_name: str, timeout: float = 5.0) -> list[str]:
        """See :meth:`SvcChannelManager.receive`."""
        taken = await self.receive_messages(channel_name, timeout)
        return [m.data.decode(errors="replace") for m in taken]

    async def receive_messages(
        self, channel_name: str, timeout: float = 5.0, *, accept: Accept | None = None
    ) -> list[Message]:
        """See :meth:`SvcChannelManager.receive_messages`."""
        channel = self.manager._channel(channel_name)
        taken = await AsyncChannel(channel).next_messages(timeout, accept)
        if not taken and channel.closed and channel_name not in self.manager.list_channels():
            raise ChannelClosedError(f"no longer in channel {channel_name!r}")
        return taken

    async def receive_envelopes(self, channel_name: str, timeout: float = 5.0) -> list[Envelope]:
        """See :meth:`SvcChannelManager.receive_envelopes`."""
        return [to_envelope(m) for m in await self.receive_messages(channel_name, timeout)]

    # -- membership and invites: in a worker thread ------------------------------------

    async def create(self, channel_name: str, *, cipher_suite: int | None = None) -> None:
        """See :meth:`SvcChannelManager.create`."""
        await anyio.to_thread.run_sync(
            functools.partial(self.manager.create, channel_name, cipher_suite=cipher_suite)
        )

    async def invite(self, channel_name: str, max_uses: int = 1, ttl: int = 3600) -> str:
        """See :meth:`SvcChannelManager.invite`."""
        return await anyio.to_thread.run_sync(self.manager.invite, channel_name, max_uses, ttl)

    async def join_with_token(self, channel_name: str, token: str, timeout: float = 60.0) -> None:
        """See :meth:`SvcChannelManager.join_with_token`."""
        await anyio.to_thread.run_sync(self.manager.join_with_token, channel_name, token, timeout)

    async def remove_member(self, channel_name: str, member: AgentId | bytes | str) -> None:
        """See :meth:`SvcChannelManager.remove_member`."""
        await anyio.to_thread.run_sync(self.manager.remove_member, channel_name, member)

    async def leave(self, channel_name: str) -> None:
        """See :meth:`SvcChannelManager.leave`."""
        await anyio.to_thread.run_sync(self.manager.leave, channel_name)

    async def aclose(self) -> None:
        """Closes the manager (see :meth:`SvcChannelManager.close`)."""
        await anyio.to_thread.run_sync(self.manager.close)

    async def __aenter__(self) -> AsyncSvcChannelManager:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
