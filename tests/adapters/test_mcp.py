"""MCP over an encrypted channel: the dict-level SvcTransport, and the real MCP SDK's client
and server talking through SvcMCPTransport."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import mcp
import pytest
from mcp.server.mcpserver import MCPServer

from svc_sdk import (
    ChannelClosedError,
    Envelope,
    Protocol,
    SvcChannelManager,
    SvcError,
    SvcTransport,
)
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


def calculator(lifespan: Any = None) -> MCPServer:
    server = MCPServer("calculator", lifespan=lifespan)

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


# -- several sessions on one served channel ----------------------------------------------


async def add(client: mcp.Client, a: int, b: int) -> object:
    result = await client.call_tool("add", {"a": a, "b": b})
    return result.structured_content


@pytest.mark.parametrize("same_agent", [True, False], ids=["same-agent", "other-agent"])
async def test_a_second_client_connects_while_the_first_is_open(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str], same_agent: bool
) -> None:
    tools, first, other = members(stack, channel_name, ids("tools"), ids("h1"), ids("h2"))
    second = first if same_agent else other
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_mcp, calculator(), tools, channel_name)
        async with mcp.Client(SvcMCPTransport(first, channel_name)) as one:
            assert await add(one, 1, 1) == {"result": 2}
            # Promptly: before sessions, this waited out the SDK's 10 s discover timeout
            # or hung, because both clients read (and answered) each other's frames.
            with anyio.fail_after(5):
                async with mcp.Client(SvcMCPTransport(second, channel_name)) as two:
                    for i in range(3):  # each gets its own answers, never the other's
                        assert await add(one, 10, i) == {"result": 10 + i}
                        assert await add(two, 20, i) == {"result": 20 + i}
            assert await add(one, 1, 2) == {"result": 3}  # the first outlives the second
        tg.cancel_scope.cancel()


async def test_a_handshake_session_after_a_client_on_one_channel(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    """mcp.Client negotiates the 2026 protocol; a ClientSession after it on the same
    served channel does the 2025 initialize handshake, and is served too."""
    tools, host = members(stack, channel_name, ids("tools"), ids("host"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_mcp, calculator(), tools, channel_name)
        with anyio.fail_after(20):
            async with mcp.Client(SvcMCPTransport(host, channel_name)) as client:
                assert await add(client, 2, 3) == {"result": 5}
                async with (
                    SvcMCPTransport(host, channel_name) as (read, write),
                    mcp.ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    result = await session.call_tool("add", {"a": 4, "b": 5})
                    assert result.structured_content == {"result": 9}
                    assert await add(client, 6, 7) == {"result": 13}
        tg.cancel_scope.cancel()


async def test_a_session_ends_on_the_server_when_its_client_leaves(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    tools, host = members(stack, channel_name, ids("tools"), ids("host"))
    runs: list[str] = []

    @asynccontextmanager
    async def lifespan(server: MCPServer) -> AsyncIterator[None]:
        runs.append("start")  # once per session: each session is a run of the server
        yield
        runs.append("end")

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_mcp, calculator(lifespan), tools, channel_name)
        with anyio.fail_after(20):
            for n in (1, 2):
                async with mcp.Client(SvcMCPTransport(host, channel_name)) as client:
                    assert await add(client, n, n) == {"result": 2 * n}
                while runs.count("end") < n:  # the client said it left
                    await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert runs == ["start", "end", "start", "end"]


async def test_a_peer_without_sessions_is_served(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    """A peer speaking plain JSON-RPC through SvcTransport (frames without a session id)
    gets a session of its own, answered without ids."""
    tools, peer = members(stack, channel_name, ids("tools"), ids("peer"))
    transport = SvcTransport(peer, channel_name)
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "plain", "version": "0"},
        },
    }
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_mcp, calculator(), tools, channel_name)
        with anyio.fail_after(20):
            await transport.write(initialize)
            reply = await transport.read()
            assert reply["id"] == 1 and reply["result"]["serverInfo"]["name"] == "calculator"
            await transport.write({"jsonrpc": "2.0", "method": "notifications/initialized"})
            call = {"name": "add", "arguments": {"a": 1, "b": 2}}
            await transport.write(
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}
            )
            reply = await transport.read()
            assert reply["id"] == 2 and reply["result"]["structuredContent"] == {"result": 3}
        tg.cancel_scope.cancel()


async def test_misuse_fails_at_once_saying_why(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    tools, host = members(stack, channel_name, ids("tools"), ids("host"))
    with anyio.fail_after(5):
        with pytest.raises(ChannelClosedError, match="not in channel 'acme/x/elsewhere'"):
            async with mcp.Client(SvcMCPTransport(host, "acme/x/elsewhere")):
                pass
        with pytest.raises(ChannelClosedError, match="not in channel"):
            await serve_mcp(calculator(), tools, "acme/x/elsewhere")
        transport = SvcMCPTransport(host, channel_name)
        async with transport:
            with pytest.raises(SvcError, match="already open; make one per connection"):
                await transport.__aenter__()
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_mcp, calculator(), tools, channel_name)
        await anyio.sleep(0.2)
        with anyio.fail_after(5), pytest.raises(SvcError, match="already serves MCP"):
            await serve_mcp(calculator(), tools, channel_name)
        tg.cancel_scope.cancel()


async def test_serving_ends_when_the_agent_leaves_the_channel(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    # The host creates the channel: its owner cannot leave, the tool server can.
    _host, tools = members(stack, channel_name, ids("host"), ids("tools"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, _leave_soon, tools, channel_name)
        with anyio.fail_after(20), pytest.raises(ChannelClosedError):
            await serve_mcp(calculator(), tools, channel_name)


def _leave_soon(manager: SvcChannelManager, channel: str) -> None:
    time.sleep(0.5)
    manager.leave(channel)


async def test_another_member_cannot_answer_in_a_session(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    """Every member reads every frame, session ids included; a reply forged by a member
    other than the server that answered the session first is dropped."""
    tools, host, intruder = members(stack, channel_name, ids("tools"), ids("host"), ids("x"))
    server = MCPServer("slow")

    @server.tool()
    async def echo(text: str) -> str:
        """Echoes text, after a second."""
        await anyio.sleep(1.0)
        return text

    def forge() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for envelope in intruder.receive_envelopes(channel_name, timeout=1.0):
                frame = json.loads(envelope.payload)
                if frame.get("method") == "tools/call":
                    metadata = {**(envelope.metadata or {}), "svc.mcp.from": "server"}
                    forged = {
                        "jsonrpc": "2.0",
                        "id": frame["id"],
                        "result": {"content": [{"type": "text", "text": "forged"}]},
                    }
                    payload = json.dumps(forged).encode()
                    intruder.send_envelope(
                        channel_name, Envelope(Protocol.MCP, "application/json", payload, metadata)
                    )
                    return
        raise AssertionError("the intruder saw no tools/call")

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_mcp, server, tools, channel_name)
        with anyio.fail_after(30):
            async with mcp.Client(SvcMCPTransport(host, channel_name)) as client:
                tg.start_soon(anyio.to_thread.run_sync, forge)
                result = await client.call_tool("echo", {"text": "genuine"})
                assert result.content[0].text == "genuine"  # type: ignore[union-attr]
        tg.cancel_scope.cancel()


async def test_a_read_on_a_closed_channel_raises_and_yields_the_loop(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    """Once the agent's channel is closed (here: the manager closed), ``read`` raises
    ChannelClosedError instead of polling a channel that returns nothing at once: a
    loop that never gave the event loop back, so ``fail_after`` could not fire either
    (the test then hangs until pytest-timeout ends it)."""
    _tools, host = members(stack, channel_name, ids("tools"), ids("host"))
    transport = SvcTransport(host, channel_name)
    host.close()
    with anyio.fail_after(5), pytest.raises(ChannelClosedError):
        await transport.read()
