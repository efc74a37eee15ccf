"""Every adapter entry point answers bad input with a specific error and keeps working."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import AgentCard

from svc_sdk import (
    ChannelClosedError,
    ChannelNameError,
    MlsError,
    Protocol,
    ProtocolBridge,
    SLIMAdapter,
    SvcA2AAdapter,
    SvcTransport,
)
from svc_sdk.adapters.a2a import with_svc_extension
from svc_sdk.adapters.a2a_rpc import SvcA2AClientTransport, SvcA2AServer
from svc_sdk.testing import LocalStack

from .test_a2a import Echo


def test_slim(stack: LocalStack, channel_name: str, ids: Callable[[str], str]) -> None:
    manager = stack.manager(ids("slim"))
    slim = SLIMAdapter(manager)
    with pytest.raises(ChannelClosedError, match="not in channel"):
        slim.receive("acme/never/joined", timeout=0.1)
    manager.create(channel_name)
    with pytest.raises(TypeError, match="payload must be bytes"):
        slim.publish(channel_name, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="metadata must be a dict"):
        slim.publish(channel_name, b"x", metadata=[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        slim.publish(channel_name, b"x" * (2 * 1024 * 1024))
    slim.publish(channel_name, b"still fine")  # nothing above broke the channel


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


def test_a2a_adapter(stack: LocalStack, ids: Callable[[str], str]) -> None:
    manager = stack.manager(ids("a2a"))
    with pytest.raises(ValueError, match="agent_id"):
        SvcA2AAdapter(manager, "")
    adapter = SvcA2AAdapter(manager, "agent")
    with pytest.raises(MlsError, match="MLS engine error"):
        adapter.join_context("ctx-bad", b"not a welcome")
    with pytest.raises(ChannelClosedError, match="not in channel"):
        adapter.receive_messages("ctx-never", timeout=0.1)
    adapter.create_context("ctx-roles")
    with pytest.raises(ValueError, match="role must be 'user' or 'agent'"):
        adapter.send_message("ctx-roles", [{"type": "text", "text": "x"}], role="boss")
    # Was AttributeError from protobuf's Struct.update (tests/client/test_error_contract.py).
    with pytest.raises(TypeError, match="metadata must be a dict or None, not list"):
        adapter.send_message("ctx-roles", [{"type": "text", "text": "x"}], metadata=[1])  # type: ignore[arg-type]
    # Data protobuf cannot carry: NaN and infinity (refused as not JSON) and nesting past
    # its limit of 100 (was protobuf's ParseError; tests/fuzz/test_envelopes.py found it).
    for data in (float("nan"), float("inf"), _nested(150)):
        with pytest.raises(ValueError, match="A2A message|must be JSON"):
            adapter.send_message("ctx-roles", [{"type": "data", "data": {"x": data}}])
    adapter.send_message("ctx-roles", [{"type": "text", "text": "still works"}])
    with pytest.raises(ValueError, match="invalid channel name"):
        with_svc_extension(AgentCard(name="a"), adapter, channel="not/a")


@pytest.mark.anyio
async def test_a2a_transport_and_server(stack: LocalStack, ids: Callable[[str], str]) -> None:
    manager = stack.manager(ids("rpc"))
    with pytest.raises(ChannelNameError, match="invalid channel name"):
        SvcA2AClientTransport(manager, "no slashes")
    handler = DefaultRequestHandler(Echo(), InMemoryTaskStore(), AgentCard(name="e"))
    with pytest.raises(ChannelNameError, match="invalid channel name"):
        await SvcA2AServer(handler, manager).serve("a//b")
    with anyio.fail_after(10):  # a channel the agent is not in: serving ends at once
        await SvcA2AServer(handler, manager).serve("acme/never/joined")


@pytest.mark.anyio
async def test_mcp_transport_outside_the_channel(
    stack: LocalStack, ids: Callable[[str], str]
) -> None:
    transport = SvcTransport(stack.manager(ids("mcp")), "acme/never/joined")
    with pytest.raises(ChannelClosedError, match="not in channel"):
        await transport.write({"jsonrpc": "2.0", "method": "ping", "id": 1})
    with pytest.raises(ChannelClosedError, match="not in channel"):
        await transport.read()
    with pytest.raises(ValueError, match="must be JSON"):
        await transport.write({"jsonrpc": "2.0", "id": 1, "result": float("nan")})


def test_bridge_after_stop(stack: LocalStack, channel_name: str, ids: Callable[[str], str]) -> None:
    manager = stack.manager(ids("bridge"))
    manager.create(channel_name)
    manager.create(channel_name + "-out")
    bridge = ProtocolBridge(manager)
    bridge.stop()
    with pytest.raises(ChannelClosedError, match="stopped"):
        bridge.bridge(channel_name, channel_name + "-out", Protocol.A2A, Protocol.SLIM)
