"""MCP sessions sharing one channel (docs/protocols.md, "Sessions").

Every member of a channel reads every frame sent on it, and JSON-RPC ids are chosen by
each client on its own, so two MCP clients on one channel would read, and answer, each
other's frames. Each session therefore has an id: a client's frames carry it in their
envelope metadata (``svc.mcp.session``, with ``svc.mcp.from: "client"``), the server
answers with the same id (``svc.mcp.from: "server"``), and a client that leaves says so
(``svc.mcp.end: true``). A frame without an id comes from a peer that uses
:class:`~svc_sdk.adapters.mcp.SvcTransport` directly: it reaches every client session of
the agent and the server's one session for such peers.

One :class:`Hub` per agent and channel is the only reader of the channel's MCP frames;
it routes each to its session. A second reader would take frames meant for the first.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import anyio
import anyio.to_thread

from svc_sdk.adapters._reader import SLICE, EnvelopeReader
from svc_sdk.adapters.content import JSON_TYPE, decode_jsonrpc
from svc_sdk.agent_id import AgentId
from svc_sdk.aio import AsyncSvcChannelManager
from svc_sdk.channel import Message
from svc_sdk.envelope import Envelope, Protocol
from svc_sdk.errors import ChannelClosedError, SvcError
from svc_sdk.manager import SvcChannelManager
from svc_sdk.names import check_channel_name

if TYPE_CHECKING:
    from mcp.shared.message import SessionMessage

log = logging.getLogger("svc_sdk.mcp")

SESSION = "svc.mcp.session"
FROM = "svc.mcp.from"
END = "svc.mcp.end"
# The frame a leaving client sends: a JSON-RPC notification, so that a peer reading with
# SvcTransport sees a well-formed message it can ignore.
END_PAYLOAD = b'{"jsonrpc":"2.0","method":"notifications/svc/session_end"}'

Side = Literal["client", "server"]
T = TypeVar("T")


def is_mcp(envelope: Envelope) -> bool:
    return envelope.protocol is Protocol.MCP


class Inbox(Generic[T]):
    """Items the hub's thread hands to one coroutine. Only the coroutine takes them out,
    so a cancelled wait loses nothing; ``get`` returns None once closed and empty."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._cond = threading.Condition()
        self._closed = False

    def put(self, item: T) -> None:
        with self._cond:
            if not self._closed:
                self._items.append(item)
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _wait(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._items) or self._closed, timeout)

    async def get(self, limiter: anyio.CapacityLimiter) -> T | None:
        while True:
            with self._cond:
                if self._items:
                    return self._items.popleft()
                if self._closed:
                    return None
            # A thread of the session's own (limiter) waits, so idle sessions never
            # hold the threads that sends need.
            await anyio.to_thread.run_sync(
                self._wait, SLICE, abandon_on_cancel=True, limiter=limiter
            )


@dataclass
class Route:
    """Where one session's frames go, and from whom they are taken: the member whose
    frame came first (the client's server, the server's client). MLS authenticates the
    sender, so another member cannot answer or speak in a session not its own."""

    inbox: Inbox[Any] = field(default_factory=Inbox)
    peer: AgentId | None = None

    def admits(self, sender: AgentId) -> bool:
        if self.peer is None:
            self.peer = sender
        return self.peer == sender


@dataclass
class ServerSide:
    """The sessions of the MCP server this agent runs on the channel. The key None is the
    one session of the peers whose frames carry no id."""

    accepted: Inbox[tuple[str | None, Inbox[Any]]] = field(default_factory=Inbox)
    sessions: dict[str | None, Route] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)

    def deliver(self, session: str | None, sender: AgentId, item: Any, end: bool) -> None:
        route = self.sessions.get(session)
        if route is None:
            if end or (session is not None and session in self.ended):
                return  # a late frame of a session that ended
            route = self.sessions[session] = Route(peer=None if session is None else sender)
            self.accepted.put((session, route.inbox))
        elif session is not None and not route.admits(sender):
            log.debug("MCP session %s: dropped a frame of another member", session)
            return
        if end:
            self.finish(session)
        else:
            route.inbox.put(item)

    def finish(self, session: str | None) -> None:
        """``session`` is over: its client left or the server's run of it ended."""
        route = self.sessions.pop(session, None)
        if route is not None:
            route.inbox.close()
        if session is not None:
            self.ended.add(session)

    def close(self) -> None:
        self.accepted.close()
        for route in self.sessions.values():
            route.inbox.close()
        self.sessions.clear()


_hubs: dict[tuple[SvcChannelManager, str], Hub] = {}
_hubs_lock = threading.Lock()  # guards _hubs and every hub's sessions


class Hub:
    """The one reader of MCP frames of an agent on a channel, routing them to sessions.
    Its thread runs while any session is open."""

    def __init__(self, manager: SvcChannelManager, channel: str) -> None:
        self.manager = manager
        self.channel = channel
        self.clients: dict[str, Route] = {}
        self.server: ServerSide | None = None
        self.error: SvcError | None = None
        self._reader = EnvelopeReader(manager, channel, is_mcp)
        self._thread = threading.Thread(target=self._run, name=f"svc-mcp-{channel}", daemon=True)

    # -- opening and closing sessions (any thread) ----------------------------------------

    @staticmethod
    def _for(manager: SvcChannelManager, channel: str) -> Hub:
        """The running hub of ``manager`` on ``channel``, started if needed (holds the
        lock)."""
        hub = _hubs.get((manager, channel))
        if hub is None:
            hub = _hubs[(manager, channel)] = Hub(manager, channel)
            hub._thread.start()
        return hub

    @staticmethod
    def open_client(manager: SvcChannelManager, channel: str) -> tuple[Hub, str, Inbox[Any]]:
        _check_member(manager, channel)
        session, route = uuid.uuid4().hex, Route()
        with _hubs_lock:
            hub = Hub._for(manager, channel)
            hub.clients[session] = route
        return hub, session, route.inbox

    def close_client(self, session: str) -> None:
        with _hubs_lock:
            route = self.clients.pop(session, None)
        if route is not None:
            route.inbox.close()

    @staticmethod
    def open_server(manager: SvcChannelManager, channel: str) -> tuple[Hub, ServerSide]:
        _check_member(manager, channel)
        with _hubs_lock:
            hub = Hub._for(manager, channel)
            if hub.server is not None:
                raise SvcError(f"this agent already serves MCP on channel {channel!r}")
            server = hub.server = ServerSide()
        return hub, server

    def close_server(self) -> None:
        with _hubs_lock:
            server, self.server = self.server, None
        if server is not None:
            server.close()

    def finish(self, session: str | None) -> None:
        with _hubs_lock:
            if self.server is not None:
                self.server.finish(session)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with _hubs_lock:
                if not self.clients and self.server is None:
                    # Gone from the registry under the lock: a session opened from now
                    # on starts a new hub, and this thread no longer takes any frame.
                    del _hubs[(self.manager, self.channel)]
                    return
            try:
                self._reader.fetch(SLICE)
                taken = self._reader.take()
                if not taken and _closed(self.manager, self.channel):
                    raise ChannelClosedError(f"the channel {self.channel!r} is closed")
            except SvcError as exc:
                self._fail(exc)
                return
            except Exception as exc:  # a fault: end the sessions rather than hang them
                log.exception("MCP reader of %s", self.channel)
                self._fail(SvcError(f"MCP reader of {self.channel!r} failed: {exc}"))
                return
            for message, envelope in taken:
                self._route(message, envelope)

    def _route(self, message: Message, envelope: Envelope) -> None:
        metadata = envelope.metadata or {}
        session = metadata.get(SESSION)
        side = metadata.get(FROM)
        end = isinstance(session, str) and metadata.get(END) is True
        item = None if end else _decode(message, envelope)
        with _hubs_lock:
            if not isinstance(session, str):
                for route in self.clients.values():
                    route.inbox.put(item)
                if self.server is not None:
                    self.server.deliver(None, message.sender, item, end=False)
            elif side == "server":
                client = self.clients.get(session)
                if client is not None and not end and client.admits(message.sender):
                    client.inbox.put(item)
            elif side == "client" and self.server is not None:
                self.server.deliver(session, message.sender, item, end)

    def _fail(self, error: SvcError) -> None:
        """Ends every session: clients see the error, then the end of their stream."""
        with _hubs_lock:
            self.error = error
            clients, self.clients = self.clients, {}
            server = self.server
            if _hubs.get((self.manager, self.channel)) is self:
                del _hubs[(self.manager, self.channel)]
        for route in clients.values():
            route.inbox.put(error)
            route.inbox.close()
        if server is not None:
            server.close()


def _check_member(manager: SvcChannelManager, channel: str) -> None:
    check_channel_name(channel)
    if channel not in manager.list_channels():
        raise ChannelClosedError(
            f"not in channel {channel!r}; create it, join it or join_with_token first"
        )


def _closed(manager: SvcChannelManager, channel: str) -> bool:
    try:
        return manager.client.channel(channel).closed
    except KeyError:
        return True


def _decode(message: Message, envelope: Envelope) -> SessionMessage | Exception:
    """The frame as the MCP SDK's transports deliver it: a SessionMessage, or the
    Exception that says why it is not one (the session reports it and goes on)."""
    from mcp.shared.message import SessionMessage
    from mcp.types import jsonrpc_message_adapter

    try:
        raw = decode_jsonrpc(envelope.payload)
        return SessionMessage(jsonrpc_message_adapter.validate_python(raw))
    except ValueError as exc:  # pydantic's ValidationError is one too
        return ValueError(f"malformed JSON-RPC frame (seq {message.seq}): {exc}")


def _encode(message: Any) -> bytes:
    obj = message.model_dump(by_alias=True, mode="json", exclude_unset=True)
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


def tag(session: str | None, side: Side) -> dict[str, Any] | None:
    return None if session is None else {SESSION: session, FROM: side}


async def send_end(manager: SvcChannelManager, channel: str, session: str) -> None:
    """Tells the server the client left (at most a few seconds; best effort: a server
    that never hears it keeps the session until it stops)."""
    metadata = {SESSION: session, FROM: "client", END: True}
    envelope = Envelope(Protocol.MCP, JSON_TYPE, END_PAYLOAD, metadata)
    with anyio.move_on_after(5, shield=True):
        try:
            await AsyncSvcChannelManager(manager).send_envelope(channel, envelope)
        except SvcError as exc:
            log.debug("end of MCP session %s on %s not sent: %s", session, channel, exc)


@asynccontextmanager
async def session_streams(
    manager: SvcChannelManager, channel: str, inbox: Inbox[Any], metadata: dict[str, Any] | None
) -> AsyncIterator[Any]:
    """The ``(read_stream, write_stream)`` pair of the MCP SDK's transports for one
    session: frames from ``inbox``, and frames sent with ``metadata``."""
    from mcp.shared.message import SessionMessage

    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    limiter = anyio.CapacityLimiter(1)

    async def inbound() -> None:
        async with read_writer:
            while (item := await inbox.get(limiter)) is not None:
                try:
                    await read_writer.send(item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return

    async def outbound() -> None:
        async with write_reader:
            async for session_message in write_reader:
                envelope = Envelope(
                    Protocol.MCP, JSON_TYPE, _encode(session_message.message), metadata
                )
                await AsyncSvcChannelManager(manager).send_envelope(channel, envelope)

    async with anyio.create_task_group() as tg:
        tg.start_soon(inbound)
        tg.start_soon(outbound)
        try:
            yield read_stream, write_stream
        finally:
            tg.cancel_scope.cancel()
            for stream in (read_stream, write_stream, read_writer, write_reader):
                await stream.aclose()
