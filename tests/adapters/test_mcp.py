"""MCP over an encrypted channel: the spec's SvcTransport, and the real MCP SDK's client
and server talking through SvcMCPTransport."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import mcp
import pytest
from mcp.server.mcpserver import MCPServer

from svc_sdk import ChannelClosedError, Envelope, Protocol, SvcTransport
from svc_sdk.adapters.mcp import SvcMCPTransport, serve_mcp
from svc_sdk.testing import LocalStack

from .helpers import members

pytestmark = pytest.mark.anyio


async def test_transport_carries_json_rpc_dicts(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    a, b = members(stack, channel_name, ids("host"), ids("server"))
    left, right = SvcTransport(a, channel_name), SvcTransport(b, channel_name)
    request = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    await left.write(request)
    with anyio.fail_after(20):
        assert await right.read() == request
    await right.write({"jsonrpc": "2.0", "id": 1, "result": {}})
    b.send(channel_name, "not MCP: left for other readers")
    b.send_envelope(channel_name, Envelope(Protocol.MCP, "application/json", b"{oops"))
    await right.write({"jsonrpc": "2.0", "method": "notifications/initialized"})
    with anyio.fail_after(20):
        assert await left.read() == {"jsonrpc": "2.0", "id": 1, "result": {}}
        with pytest.raises(ValueError, match="malformed JSON-RPC frame"):
            await left.read()
        assert (await left.read())["method"] == "notifications/initialized"
    assert a.receive(channel_name, timeout=5.0) == ["not MCP: left for other readers"]
    with pytest.raises(TypeError):
        await left.write("not a dict")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='"jsonrpc": "2.0"'):
        await left.write({"id": 2, "method": "ping"})
    await left.close()
    with pytest.raises(ChannelClosedError):
        await left.read()


async def test_a_cancelled_read_loses_nothing(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    a, b = members(stack, channel_name, ids("host"), ids("server"))
    reader = SvcTransport(b, channel_name)
    with anyio.move_on_after(0.1):
        await reader.read()
    await SvcTransport(a, channel_name).write({"jsonrpc": "2.0", "method": "x"})
    with anyio.fail_after(20):
        assert (await reader.read())["method"] == "x"


def calculator() -> MCPServer:
    server = MCPServer("calculator")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        return a + b

    @server.tool()
    def shout(text: str) -> str:
        """Upper-cases text."""
        return text.upper()

    return server


async def test_mcp_client_and_server_over_a_channel(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    host, tools = members(stack, channel_name, ids("host"), ids("tools"))
    errors: list[Exception] = []

    async def on_message(message: object) -> None:
        if isinstance(message, Exception):
            errors.append(message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_mcp, calculator(), tools, channel_name)
        with anyio.fail_after(60):
            transport = SvcMCPTransport(host, channel_name)
            async with mcp.Client(transport, message_handler=on_message) as client:
                listed = await client.list_tools()
                assert sorted(tool.name for tool in listed.tools) == ["add", "shout"]
                result = await client.call_tool("add", {"a": 2, "b": 40})
                assert result.structured_content == {"result": 42}
                # A malformed frame reaches the session as an error value, not a crash.
                frame = Envelope(Protocol.MCP, "application/json", b'{"jsonrpc": "2.0", "id": ')
                tools.send_envelope(channel_name, frame)
                shouted = await client.call_tool("shout", {"text": "encrypted"})
                assert shouted.content[0].text == "ENCRYPTED"  # type: ignore[union-attr]
                while not errors:
                    await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert isinstance(errors[0], ValueError)
