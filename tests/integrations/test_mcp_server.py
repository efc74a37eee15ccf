"""`svc mcp` as a subprocess, driven over stdio by the real MCP client."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.to_thread
import mcp
import pytest
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client

from svc_integrations.mcp_server import Connection, build_server
from svc_sdk import SvcChannelManager, credentials
from svc_sdk.testing import LocalStack

from . import TOOL_NAMES

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).parents[2]


def server(stack: LocalStack, identity: str, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-P", "-m", "svc_cli", "mcp"],
        env={
            "SVC_IDENTITY": identity,
            "SVC_RELAY": stack.relay_url,
            "SVC_API_URL": stack.api_url,
            "SVC_API_KEY": stack.api_key,
            "SVC_DATA_DIR": str(stack.agent_dir(identity)),
            **env,
        },
    )


def client(params: StdioServerParameters, errlog: TextIO | None = None) -> mcp.Client:
    """An MCP client of the server process, its stderr going to ``errlog``."""
    if errlog is None:
        return mcp.Client(params)
    return mcp.Client(stdio_client(params, errlog=errlog))


def text(result: Any) -> str:
    return str(result.content[0].text)


async def call(client: mcp.Client, name: str, **arguments: object) -> str:
    result = await client.call_tool(name, arguments)
    assert not result.is_error, result.content
    return text(result)


async def test_two_mcp_servers_share_a_channel(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    async with AsyncExitStack() as stack_:
        alice = await stack_.enter_async_context(client(server(stack, ids("alice"))))
        bob = await stack_.enter_async_context(client(server(stack, ids("bob"))))
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
            # The client checks structuredContent against the declared output schema.
            got = await bob.call_tool("svc_receive", {"channel": channel_name, "timeout": 10})
            expected = [
                {"from": f"{ids('alice')}@{stack.account_id}", "message": "over MCP, encrypted"}
            ]
            assert json.loads(text(got)) == expected
            assert got.structured_content == {"messages": expected}
            listed = await bob.call_tool("svc_list_channels", {})
            assert listed.structured_content == {"channels": [channel_name]}
            sent = await call(
                alice, "svc_send_envelope", channel=channel_name, protocol="a2a", message="{}"
            )
            assert sent == f"sent an envelope (a2a, text/plain) to {channel_name}"
            got = await bob.call_tool("svc_receive_envelopes", {"channel": channel_name})
            envelope = {"protocol": "a2a", "content_type": "text/plain", "message": "{}"}
            assert got.structured_content == {"envelopes": [{**envelope, "metadata": None}]}

            # A failing call is a tool error with the library's message; the server lives on.
            bad = await alice.call_tool("svc_send", {"channel": "bad name", "message": "x"})
            assert bad.is_error
            assert text(bad).startswith("invalid channel name: 'bad name'")
            # svc_join on a channel the agent is in does not vouch for the token.
            bad = await bob.call_tool("svc_join", {"channel": channel_name, "token": "svc_inv_x"})
            assert bad.is_error
            expected_text = f"already in channel {channel_name!r}; the invite token was not used"
            assert text(bad) == expected_text
            assert json.loads(await call(alice, "svc_list_channels")) == [channel_name]


def refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"sent to a worker thread: {args!r}")


@pytest.mark.parametrize("through", ["manager", "connection"])
async def test_send_and_receive_take_no_worker_thread(
    stack: LocalStack,
    channel_name: str,
    ids: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    through: str,
) -> None:
    """The server in this process (the SDK's in-memory client): once connected, svc_send
    and svc_receive run on the loop, while anyio's worker threads and the loop's
    executor fail the test."""
    alice, bob = stack.manager(ids("alice")), stack.manager(ids("bob"))
    alice.create(channel_name)
    bob.join_with_token(channel_name, alice.invite(channel_name), timeout=30)
    served: SvcChannelManager | Connection = bob
    if through == "connection":
        served = Connection(lambda: bob).start()
        served.get()  # connected: the wait for it is the one call that may take a thread
    monkeypatch.setattr(anyio.to_thread, "run_sync", refuse)
    monkeypatch.setattr(asyncio.get_running_loop(), "run_in_executor", refuse)
    async with mcp.Client(build_server(served)) as client:
        with anyio.fail_after(30):
            await call(client, "svc_send", channel=channel_name, message="from mcp")
            alice.send(channel_name, "to mcp")
            got = await client.call_tool("svc_receive", {"channel": channel_name, "timeout": 10})
            assert [m["message"] for m in got.structured_content["messages"]] == ["to mcp"]
            bad = await client.call_tool("svc_send", {"channel": "bad name", "message": "x"})
            assert bad.is_error and text(bad).startswith("invalid channel name: 'bad name'")
    assert alice.receive(channel_name, timeout=10) == ["from mcp"]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (
            {"channel": "acme/x/y", "ttl": "soon"},
            "invalid arguments: ttl: Input should be a valid integer, unable to parse string "
            "as an integer (got 'soon')",
        ),
        ({}, "invalid arguments: channel: Field required"),
        (
            {"channel": "acme/x/y", "max_uses": 0, "extra": 1},
            "invalid arguments: max_uses: Input should be greater than or equal to 1 (got 0); "
            "extra: Extra inputs are not permitted",
        ),
    ],
)
async def test_invalid_arguments_are_one_line(
    stack: LocalStack, ids: Callable[[str], str], arguments: dict[str, Any], expected: str
) -> None:
    async with client(server(stack, ids("alice"))) as alice:
        with anyio.fail_after(60):
            bad = await alice.call_tool("svc_invite", arguments)
    assert bad.is_error and text(bad) == expected


async def test_version_annotations_and_output_schemas(
    stack: LocalStack, ids: Callable[[str], str]
) -> None:
    async with client(server(stack, ids("alice"))) as alice:
        with anyio.fail_after(60):
            tools = {t.name: t for t in (await alice.list_tools()).tools}
        assert alice.server_info is not None
        assert alice.server_info.name == "svc"
        assert alice.server_info.version == importlib.metadata.version("svc-sdk")
    hints = {name: tool.annotations for name, tool in tools.items()}
    assert hints["svc_list_channels"] is not None
    assert hints["svc_list_channels"].read_only_hint is True
    assert hints["svc_list_channels"].open_world_hint is False
    for name in TOOL_NAMES - {"svc_list_channels"}:
        annotations = hints[name]
        assert annotations is not None, name
        # Receiving takes messages off the inbox: no tool but the listing is read-only.
        assert annotations.read_only_hint is False, name
        assert annotations.destructive_hint is False, name
        assert annotations.open_world_hint is True, name
    assert hints["svc_create_channel"].idempotent_hint is True  # type: ignore[union-attr]
    assert hints["svc_send"].idempotent_hint is False  # type: ignore[union-attr]
    assert hints["svc_receive"].idempotent_hint is False  # type: ignore[union-attr]
    structured = {name for name, tool in tools.items() if tool.output_schema is not None}
    assert structured == {"svc_receive", "svc_receive_envelopes", "svc_list_channels"}
    for name in structured:
        assert tools[name].output_schema["type"] == "object"  # type: ignore[index]


async def test_a_refused_key_is_reported_on_every_call(
    stack: LocalStack, ids: Callable[[str], str], tmp_path: Path
) -> None:
    params = server(stack, ids("alice"), SVC_API_KEY="sk_live_not-a-key")
    with (tmp_path / "stderr").open("w+") as errlog:
        async with client(params, errlog) as alice:
            with anyio.fail_after(60):
                assert {t.name for t in (await alice.list_tools()).tools} == TOOL_NAMES
                for _ in range(2):
                    bad = await alice.call_tool("svc_list_channels", {})
                    assert bad.is_error
                    assert text(bad).startswith(f"auth error: API key rejected by {stack.api_url}")
                # Arguments are checked first: what the model got wrong, it can fix now.
                bad = await alice.call_tool("svc_send", {"channel": "acme/x/y"})
                assert text(bad) == "invalid arguments: message: Field required"
                # A refused key is retried every minute, not on the fast schedule of
                # transport errors (which would have made attempts 2 and 3 by now).
                await anyio.sleep(3.5)
                bad = await alice.call_tool("svc_list_channels", {})
                assert text(bad).startswith("auth error: API key rejected")
        errlog.seek(0)
        logged = errlog.read()
    attempts = re.findall(
        r"^svc mcp: auth error: API key rejected by .*\(attempt (\d+); ", logged, re.M
    )
    assert attempts == ["1"]


async def test_an_unreachable_api_is_reported_then_recovered(
    ids: Callable[[str], str], tmp_path: Path
) -> None:
    with LocalStack() as stack:
        stack.kill()  # same addresses and data on restart()
        params = server(stack, ids("alice"))
        with (tmp_path / "stderr").open("w+") as errlog:
            async with client(params, errlog) as alice:
                with anyio.fail_after(60):
                    assert {t.name for t in (await alice.list_tools()).tools} == TOOL_NAMES
                    bad = await alice.call_tool("svc_list_channels", {})
                assert bad.is_error
                assert text(bad).startswith(f"transport error: account API {stack.api_url}")
                assert "unreachable" in text(bad) and "keeps trying" in text(bad)

                await anyio.to_thread.run_sync(stack.restart)
                with anyio.fail_after(60):  # the next attempt is at most 10 s away
                    while (await alice.call_tool("svc_list_channels", {})).is_error:
                        await anyio.sleep(0.5)
                assert json.loads(await call(alice, "svc_list_channels")) == []
            errlog.seek(0)
            logged = errlog.read()
    failures = re.findall(r"^svc mcp: transport error: .*\(attempt (\d+); next in", logged, re.M)
    assert failures[:2] == ["1", "2"]
    assert re.search(r"^svc mcp: connected after \d+ failed attempts$", logged, re.M)


def documented_blocks() -> list[Any]:
    """Every ``mcpServers`` JSON block of the README and the docs."""
    blocks = []
    for name in ("README.md", "docs/protocols.md"):
        for block in re.findall(r"```json\n(.*?)```", (ROOT / name).read_text(), re.S):
            if "mcpServers" in block:
                blocks.append(pytest.param(json.loads(block), id=name))
    return blocks


def test_the_docs_have_the_mcp_servers_block() -> None:
    assert [block.id for block in documented_blocks()] == ["README.md", "docs/protocols.md"]


@pytest.mark.parametrize("block", documented_blocks())
async def test_the_documented_mcp_servers_block_works(
    stack: LocalStack, ids: Callable[[str], str], tmp_path: Path, block: dict[str, Any]
) -> None:
    """The block as a host runs it: its command (found on PATH), args and env. Only the
    values that name a deployment are this test's: identity, key, addresses."""
    (entry,) = block["mcpServers"].values()
    assert entry["command"] == "svc"
    env: dict[str, str] = entry["env"]
    assert set(env) == {"SVC_IDENTITY", "SVC_API_KEY", "SVC_API_URL", "SVC_RELAY"}
    assert env["SVC_API_KEY"].startswith("sk_live_")
    assert env["SVC_API_URL"] == credentials.DEFAULT_API_URL
    assert env["SVC_RELAY"] == credentials.DEFAULT_RELAY_URL
    identity = ids("planner")
    deployment = {"SVC_API_URL": stack.api_url, "SVC_RELAY": stack.relay_url}
    # The default data dir is under /tmp; keep the test's agent in the test's directory.
    extra = {"SVC_DATA_DIR": str(tmp_path / "agent"), "PATH": _path_with_svc()}
    params = StdioServerParameters(
        command=entry["command"],
        args=entry["args"],
        env={**env, **deployment, "SVC_IDENTITY": identity, **extra},
    )
    async with client(params) as pasted:  # the placeholder key, as pasted
        with anyio.fail_after(60):
            assert {t.name for t in (await pasted.list_tools()).tools} == TOOL_NAMES
            bad = await pasted.call_tool("svc_list_channels", {})
        assert bad.is_error and text(bad).startswith("auth error: API key rejected")
    params.env = {**params.env, "SVC_API_KEY": stack.api_key}  # type: ignore[dict-item]
    async with client(params) as configured:
        with anyio.fail_after(60):
            channel = f"acme/docs/{identity}"
            await call(configured, "svc_create_channel", channel=channel)
            assert json.loads(await call(configured, "svc_list_channels")) == [channel]


def _path_with_svc() -> str:
    """PATH with this interpreter's scripts folder first, where pip put ``svc``."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def test_missing_identity_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, "-P", "-m", "svc_cli", "mcp"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "SVC_IDENTITY" in done.stderr
