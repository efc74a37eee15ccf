"""`svc mcp` as a subprocess, driven over stdio by the real MCP client."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack

import anyio
import mcp
import pytest
from mcp import StdioServerParameters

from svc_sdk.testing import LocalStack

from . import TOOL_NAMES

pytestmark = pytest.mark.anyio


def server(stack: LocalStack, identity: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "svc_sdk.cli", "mcp"],
        env={
            "SVC_IDENTITY": identity,
            "SVC_RELAY": stack.relay_url,
            "SVC_API_URL": stack.api_url,
            "SVC_API_KEY": stack.api_key,
            "SVC_DATA_DIR": str(stack.agent_dir(identity)),
        },
    )


async def call(client: mcp.Client, name: str, **arguments: object) -> str:
    result = await client.call_tool(name, arguments)
    assert not result.is_error, result.content
    return result.content[0].text  # type: ignore[union-attr]


async def test_two_mcp_servers_share_a_channel(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    async with AsyncExitStack() as stack_:
        alice = await stack_.enter_async_context(mcp.Client(server(stack, ids("alice"))))
        bob = await stack_.enter_async_context(mcp.Client(server(stack, ids("bob"))))
        with anyio.fail_after(90):
            tools = (await alice.list_tools()).tools
            assert {t.name for t in tools} == TOOL_NAMES
            invite = next(t for t in tools if t.name == "svc_invite")
            assert set(invite.input_schema["properties"]) == {"channel", "max_uses", "ttl"}
            await call(alice, "svc_create_channel", channel=channel_name)
            token = await call(alice, "svc_invite", channel=channel_name, max_uses=1, ttl=600)
            assert token.startswith("svc_inv_")
            await call(bob, "svc_join", channel=channel_name, token=token, timeout=30)
            assert json.loads(await call(bob, "svc_list_channels")) == [channel_name]
            await call(alice, "svc_send", channel=channel_name, message="over MCP, encrypted")
            got = json.loads(await call(bob, "svc_receive", channel=channel_name, timeout=10))
            assert got == [{"from": ids("alice"), "message": "over MCP, encrypted"}]

            # A failing call is a tool error with the library's message; the server lives on.
            bad = await alice.call_tool("svc_send", {"channel": "bad name", "message": "x"})
            assert bad.is_error
            assert bad.content[0].text.startswith("invalid channel name: 'bad name'")  # type: ignore[union-attr]
            bad = await alice.call_tool("svc_invite", {"channel": channel_name, "ttl": "soon"})
            assert bad.is_error and "invalid arguments" in bad.content[0].text  # type: ignore[union-attr]
            assert json.loads(await call(alice, "svc_list_channels")) == [channel_name]


def test_missing_identity_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "svc_sdk.cli", "mcp"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "SVC_IDENTITY" in done.stderr
