"""``svc mcp``: the svc operations as an MCP server over stdio (``pip install
'svc-sdk[mcp]'``), so an MCP host can give any model encrypted channels.

Configured by the environment: ``SVC_IDENTITY`` (the agent identity it acts as,
required), and ``SVC_RELAY``, ``SVC_API_URL``, ``SVC_API_KEY``, ``SVC_DATA_DIR`` as for
``SvcChannelManager``. Tools and arguments are those of the LangChain toolkit
(:mod:`svc_integrations.operations`), with MCP annotations from their hints and an
output schema where the result is structured. A failing call is an MCP tool error
carrying the library's message (``isError: true``); the server keeps running. Tool
calls run on the server's event loop through :mod:`svc_sdk.aio`: svc_send and
svc_receive take no worker thread; membership changes run in aio's worker thread.

The server answers the host even when the account API or the relay cannot be reached,
or the API key is refused: it connects in the background (:class:`Connection`), and until
it has, every tool call is a tool error saying why (``transport error: …``, ``auth error:
…``). A host that saw the process exit would only report "connection closed".
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from svc_sdk import AsyncSvcChannelManager, SvcChannelManager
from svc_sdk.errors import TransportError
from svc_sdk.extras import require

require("mcp", "mcp", "svc mcp")

import mcp_types as types  # noqa: E402
from mcp.server.lowlevel import Server  # noqa: E402
from mcp.server.stdio import stdio_server  # noqa: E402

from .operations import OPERATIONS, Operation, OperationError  # noqa: E402

log = logging.getLogger("svc_integrations.mcp")

_BY_NAME = {operation.name: operation for operation in OPERATIONS}

# How long a tool call waits for a connection attempt already under way (the first one
# at start-up, typically) before answering with the previous attempt's error.
CALL_WAIT = 30.0


class Connection:
    """The manager the tools act through, made by ``connect`` in a background thread,
    which tries again with backoff until it succeeds: after a transport error in 1, 2, 4, 8,
    then every ``retry_cap`` seconds; after any other error (a refused key, a data
    directory of another identity), which waiting rarely cures, every ``slow_retry``."""

    def __init__(
        self,
        connect: Callable[[], SvcChannelManager],
        *,
        retry_cap: float = 10.0,
        slow_retry: float = 60.0,
    ) -> None:
        self._connect = connect
        self._retry_cap = retry_cap
        self._slow_retry = slow_retry
        self._cond = threading.Condition()
        self._manager: SvcChannelManager | None = None
        self._error = "runtime error: not connected yet"
        self._trying = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="svc-mcp-connect", daemon=True)

    def start(self) -> Connection:
        """Starts connecting in the background; returns the Connection."""
        self._trying = True  # before the thread runs: a first call waits for its attempt
        self._thread.start()
        return self

    def get(self, wait: float = CALL_WAIT) -> SvcChannelManager:
        """The manager; OperationError with the last attempt's error while there is
        none. Waits up to ``wait`` seconds for an attempt under way."""
        with self._cond:
            self._cond.wait_for(lambda: self._manager is not None or not self._trying, wait)
            if self._manager is not None:
                return self._manager
            raise OperationError(self._error)

    def ready(self) -> SvcChannelManager | None:
        """The manager once connected, else None; never waits."""
        with self._cond:
            return self._manager

    def close(self) -> None:
        """Stops trying, and closes the manager if there is one."""
        with self._cond:
            self._closed = True
            manager, self._manager = self._manager, None
            self._cond.notify_all()
        if manager is not None:
            manager.close()

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                if self._closed:
                    return
                self._trying = True
            try:
                manager = self._connect()
            except Exception as exc:  # whatever it is, the tools report it and we retry
                failures += 1
                if isinstance(exc, TransportError):
                    delay = min(2.0 ** (failures - 1), self._retry_cap)
                else:
                    delay = self._slow_retry
                cause = str(exc) if isinstance(exc, RuntimeError) else f"runtime error: {exc}"
                log.warning("%s (attempt %d; next in %g s)", cause, failures, delay)
                with self._cond:
                    self._error = f"{cause} (svc mcp keeps trying to connect)"
                    self._trying = False
                    self._cond.notify_all()
                    self._cond.wait_for(lambda: self._closed, delay)
                continue
            if not self._publish(manager):
                manager.close()  # closed while connecting
            elif failures:
                log.warning("connected after %d failed attempts", failures)
            return

    def _publish(self, manager: SvcChannelManager) -> bool:
        with self._cond:
            if self._closed:
                return False
            self._manager = manager
            self._trying = False
            self._cond.notify_all()
            return True


def build_server(manager: SvcChannelManager | Connection) -> Server[Any]:
    """A low-level MCP server whose tools act as ``manager``'s agent (or that of the
    manager a :class:`Connection` makes)."""
    tools = [_tool(op) for op in OPERATIONS]
    # One asyncio face of the manager for every call, made once the manager exists.
    aio = None if isinstance(manager, Connection) else AsyncSvcChannelManager(manager)

    async def agent() -> AsyncSvcChannelManager:
        nonlocal aio
        if aio is None:
            assert isinstance(manager, Connection)
            # Waiting for a connection attempt blocks: that wait, only until connected,
            # goes to a worker thread.
            connected = manager.ready()
            if connected is None:
                connected = await anyio.to_thread.run_sync(manager.get)
            if aio is None:
                aio = AsyncSvcChannelManager(connected)
        return aio

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        operation = _BY_NAME.get(params.name)
        if operation is None:
            return _error(f"unknown tool {params.name!r}")
        arguments = dict(params.arguments or {})
        try:
            operation.parse(arguments)  # wrong arguments say so even while not connected
            reply = await operation.areply(await agent(), arguments)
        except OperationError as exc:
            return _error(str(exc))
        except Exception as exc:  # the server outlives any one call
            log.exception("tool %s failed", params.name)
            return _error(f"runtime error: {exc}")
        content = [types.TextContent(type="text", text=reply.text)]
        if reply.data is None:
            return types.CallToolResult(content=content)
        structured = reply.data.model_dump(mode="json", by_alias=True)
        return types.CallToolResult(content=content, structured_content=structured)

    return Server(
        "svc",
        version=importlib.metadata.version("svc-sdk"),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _tool(operation: Operation) -> types.Tool:
    hints = operation.hints
    return types.Tool(
        name=operation.name,
        description=operation.description,
        input_schema=operation.args.model_json_schema(),
        output_schema=None if operation.output is None else operation.output.model_json_schema(),
        annotations=types.ToolAnnotations(
            read_only_hint=hints.read_only,
            destructive_hint=hints.destructive,
            idempotent_hint=hints.idempotent,
            open_world_hint=hints.open_world,
        ),
    )


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )


async def serve_stdio(manager: SvcChannelManager | Connection) -> None:
    server = build_server(manager)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> int:
    """``svc mcp``: serves the tools over stdio until stdin closes; 2 if SVC_IDENTITY
    is missing. Starts even when the svc servers cannot be reached or refuse the key
    (each tool call then says why) and connects as soon as they can."""
    identity = os.environ.get("SVC_IDENTITY")
    if not identity:
        print("svc mcp: set SVC_IDENTITY to the agent identity to act as", file=sys.stderr)
        return 2
    # stdout is the MCP wire: logs go to stderr.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="svc mcp: %(message)s")
    connection = Connection(lambda: SvcChannelManager(identity)).start()
    try:
        anyio.run(serve_stdio, connection)
    finally:
        connection.close()
    return 0
