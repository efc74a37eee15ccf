"""``svc mcp``: the svc operations as an MCP server over stdio (``pip install
'svc-sdk[mcp]'``), so an MCP host can give any model encrypted channels.

Configured by the environment: ``SVC_IDENTITY`` (the agent identity it acts as,
required), and ``SVC_RELAY``, ``SVC_API_URL``, ``SVC_API_KEY``, ``SVC_DATA_DIR`` as for
``SvcChannelManager``. Tools and arguments are those of the LangChain toolkit
(:mod:`svc_integrations.operations`). A failing call is an MCP tool error carrying the
library's message (``isError: true``); the server keeps running.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import anyio
import anyio.to_thread

from svc_sdk import SvcChannelManager
from svc_sdk.adapters._extras import require

require("mcp", "mcp", "svc mcp")

import mcp_types as types  # noqa: E402
from mcp.server.lowlevel import Server  # noqa: E402
from mcp.server.stdio import stdio_server  # noqa: E402

from .operations import OPERATIONS, OperationError  # noqa: E402

log = logging.getLogger("svc_integrations.mcp")

_BY_NAME = {operation.name: operation for operation in OPERATIONS}


def build_server(manager: SvcChannelManager) -> Server[Any]:
    """A low-level MCP server whose tools act as ``manager``'s agent."""
    tools = [
        types.Tool(
            name=op.name,
            description=op.description,
            input_schema=op.args.model_json_schema(),
        )
        for op in OPERATIONS
    ]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        operation = _BY_NAME.get(params.name)
        if operation is None:
            return _error(f"unknown tool {params.name!r}")
        arguments = dict(params.arguments or {})
        try:
            text = await anyio.to_thread.run_sync(operation, manager, arguments)
        except OperationError as exc:
            return _error(str(exc))
        except Exception as exc:  # the server outlives any one call
            log.exception("tool %s failed", params.name)
            return _error(f"runtime error: {exc}")
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    return Server("svc", on_list_tools=list_tools, on_call_tool=call_tool)


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )


async def serve_stdio(manager: SvcChannelManager) -> None:
    server = build_server(manager)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> int:
    """``svc mcp``: serves the tools over stdio until stdin closes; 2 if SVC_IDENTITY
    is missing."""
    identity = os.environ.get("SVC_IDENTITY")
    if not identity:
        print("svc mcp: set SVC_IDENTITY to the agent identity to act as", file=sys.stderr)
        return 2
    # stdout is the MCP wire: logs go to stderr.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with SvcChannelManager(identity) as manager:
        anyio.run(serve_stdio, manager)
    return 0
