"""MCP over encrypted channels (docs/protocols.md): JSON-RPC messages in MCP envelopes.

:class:`SvcTransport` is the dict-level transport. :class:`SvcMCPTransport` is
the transport the MCP SDK itself takes (``pip install 'svc-sdk[mcp]'``): it yields the
``(read_stream, write_stream)`` pair, so an unmodified ``mcp.Client`` /
``mcp.ClientSession`` talks to an MCP server over a channel::

    async with mcp.Client(SvcMCPTransport(manager, "acme/mcp/tools")) as client:
        tools = await client.list_tools()

and :func:`serve_mcp` runs an ``MCPServer`` (or a low-level ``Server``) on the other
member's side. Several client sessions, of one agent or of several, may share a served
channel: each frame carries its session's id (:mod:`svc_sdk.adapters._mcp_sessions`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread

from svc_sdk.adapters._mcp_sessions import Hub, Inbox, is_mcp, send_end, session_streams, tag
from svc_sdk.adapters._reader import EnvelopeReader
from svc_sdk.adapters.content import JSON_TYPE, decode_jsonrpc
from svc_sdk.aio import AsyncSvcChannelManager
from svc_sdk.envelope import Envelope, Protocol
from svc_sdk.errors import ChannelClosedError, SvcError
from svc_sdk.extras import require
from svc_sdk.manager import SvcChannelManager


class SvcTransport:
    """Asynchronous JSON-RPC transport over an encrypted channel.

    >>> transport = SvcTransport(manager, "acme/mcp/tools")        # doctest: +SKIP
    >>> await transport.write({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    >>> await transport.read()
    {'jsonrpc': '2.0', 'id': 1, 'result': {}}
    """

    def __init__(self, manager: SvcChannelManager, channel: str) -> None:
        self.manager = manager
        self.channel = channel
        self._reader = EnvelopeReader(manager, channel, is_mcp)
        self._closed = False

    async def read(self) -> dict[str, Any]:
        """The next JSON-RPC message; waits until one arrives. A frame that is not one
        raises ValueError (the next read goes on with the frame after it)."""
        self._check_open()
        message, envelope = await self._reader.next()
        try:
            return decode_jsonrpc(envelope.payload)
        except ValueError as exc:
            raise ValueError(f"malformed JSON-RPC frame (seq {message.seq}): {exc}") from None

    async def write(self, message: dict[str, Any]) -> None:
        """Encrypts and sends one JSON-RPC message; returns once it is durably queued in the
        agent's outbox (the relay stores it in order, in the background; Channel.send)."""
        self._check_open()
        if not isinstance(message, dict):
            raise TypeError(f"a JSON-RPC message is a dict, not {type(message).__name__}")
        if message.get("jsonrpc") != "2.0":
            raise ValueError('a JSON-RPC message needs "jsonrpc": "2.0"')
        try:
            payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"a JSON-RPC message must be JSON: {exc}") from None
        envelope = Envelope(Protocol.MCP, JSON_TYPE, payload)
        await AsyncSvcChannelManager(self.manager).send_envelope(self.channel, envelope)

    async def close(self) -> None:
        """Closes the transport (the channel stays; so does its membership)."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"the MCP transport on {self.channel!r} is closed")


@asynccontextmanager
async def mcp_streams(manager: SvcChannelManager, channel: str) -> AsyncIterator[Any]:
    """The ``(read_stream, write_stream)`` pair of the MCP SDK's transports for a new
    client session on ``channel`` (see "Sessions" in docs/protocols.md). A frame that is
    not a valid JSON-RPC message reaches the session as an Exception item (as the SDK's
    own transports deliver parse errors), never ends it."""
    require("mcp", "mcp", "SvcMCPTransport")
    hub, session, inbox = Hub.open_client(manager, channel)
    try:
        async with session_streams(manager, channel, inbox, tag(session, "client")) as streams:
            yield streams
    finally:
        hub.close_client(session)
        await send_end(manager, channel, session)


class SvcMCPTransport:
    """An MCP SDK transport over a channel: ``mcp.Client(SvcMCPTransport(m, channel))``
    or ``async with SvcMCPTransport(m, channel) as (read, write)`` for a ClientSession.
    Each time it is entered it opens a new MCP session; several may be open on one
    channel at once."""

    def __init__(self, manager: SvcChannelManager, channel: str) -> None:
        require("mcp", "mcp", "SvcMCPTransport")
        self.manager = manager
        self.channel = channel
        self._stack: AsyncExitStack | None = None

    async def __aenter__(self) -> Any:
        if self._stack is not None:
            raise SvcError(
                f"this SvcMCPTransport on {self.channel!r} is already open; make one per connection"
            )
        stack = AsyncExitStack()
        streams = await stack.enter_async_context(mcp_streams(self.manager, self.channel))
        self._stack = stack
        return streams

    async def __aexit__(self, *exc: object) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.aclose()


async def serve_mcp(server: Any, manager: SvcChannelManager, channel: str) -> None:
    """Serves an ``mcp.server.MCPServer`` (or a low-level ``Server``) over ``channel``
    until the task is cancelled: each client session gets its own run of the server, as
    each connection does over stdio or HTTP. ChannelClosedError once the agent is no
    longer in the channel."""
    require("mcp", "mcp", "serve_mcp")
    from mcp.server.mcpserver import MCPServer

    # mcp.Client reaches the low-level server the same way for in-process connections.
    lowlevel = server._lowlevel_server if isinstance(server, MCPServer) else server
    hub, side = Hub.open_server(manager, channel)

    async def run(session: str | None, inbox: Inbox[Any]) -> None:
        try:
            async with session_streams(manager, channel, inbox, tag(session, "server")) as (
                read_stream,
                write_stream,
            ):
                await lowlevel.run(
                    read_stream, write_stream, lowlevel.create_initialization_options()
                )
        finally:
            hub.finish(session)

    try:
        async with anyio.create_task_group() as tg:
            limiter = anyio.CapacityLimiter(1)
            while (accepted := await side.accepted.get(limiter)) is not None:
                tg.start_soon(run, *accepted)
    finally:
        hub.close_server()
    if hub.error is not None:
        raise hub.error
