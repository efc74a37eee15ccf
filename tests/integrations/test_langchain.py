"""The LangChain toolkit: direct tool calls, sync and async (``ainvoke`` on the event
loop, no worker thread for sending and receiving), and a create_agent agent driven by a
scripted model that creates a channel, invites a second agent and sends it a message."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import pytest
from langchain.agents import create_agent
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.tools import ToolException, tool

from svc_integrations.langchain import SvcToolkit
from svc_integrations.testing import ScriptedChatModel
from svc_sdk.testing import LocalStack

from . import TOOL_NAMES


def tools_of(stack: LocalStack, name: str) -> dict[str, Any]:
    return {t.name: t for t in SvcToolkit(manager=stack.manager(name)).get_tools()}


def two_in_a_channel(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tools of alice and bob, both in ``channel_name`` (set up with blocking calls)."""
    alice, bob = tools_of(stack, ids("alice")), tools_of(stack, ids("bob"))
    alice["svc_create_channel"].invoke({"channel": channel_name})
    token = alice["svc_invite"].invoke({"channel": channel_name})
    assert "joined" in bob["svc_join"].invoke({"channel": channel_name, "token": token})
    return alice, bob


def refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"sent to a worker thread: {args!r}")


def test_tools_have_the_documented_names_and_arguments(
    stack: LocalStack, ids: Callable[[str], str]
) -> None:
    tools = SvcToolkit(manager=stack.manager(ids("a"))).get_tools()
    assert {t.name for t in tools} == TOOL_NAMES
    by_name = {t.name: t for t in tools}
    assert set(by_name["svc_invite"].args) == {"channel", "max_uses", "ttl"}
    assert set(by_name["svc_join"].args) == {"channel", "token", "timeout"}
    assert set(by_name["svc_send"].args) == {"channel", "message"}
    assert set(by_name["svc_receive"].args) == {"channel", "timeout"}
    for t in tools:
        schema = t.args_schema.model_json_schema()
        assert all(p.get("description") for p in schema.get("properties", {}).values())


def test_direct_calls(stack: LocalStack, channel_name: str, ids: Callable[[str], str]) -> None:
    alice, bob = tools_of(stack, ids("alice")), tools_of(stack, ids("bob"))
    assert "created" in alice["svc_create_channel"].invoke({"channel": channel_name})
    token = alice["svc_invite"].invoke({"channel": channel_name, "max_uses": 1, "ttl": 600})
    assert token.startswith("svc_inv_")
    assert "joined" in bob["svc_join"].invoke({"channel": channel_name, "token": token})
    assert json.loads(bob["svc_list_channels"].invoke({})) == [channel_name]
    again = bob["svc_join"].invoke({"channel": channel_name, "token": "svc_inv_bogus"})
    assert again == f"already in channel {channel_name!r}; the invite token was not used"
    alice["svc_send"].invoke({"channel": channel_name, "message": "hi bob"})
    got = json.loads(bob["svc_receive"].invoke({"channel": channel_name, "timeout": 10}))
    assert got == [{"from": f"{ids('alice')}@{stack.account_id}", "message": "hi bob"}]
    assert (
        alice["svc_send_envelope"].invoke(
            {
                "channel": channel_name,
                "protocol": "slim",
                "content_type": "text/csv",
                "message": "a,b",
                "metadata": {"k": 1},
            }
        )
        == f"sent an envelope (slim, text/csv) to {channel_name}"
    )
    (env,) = json.loads(bob["svc_receive_envelopes"].invoke({"channel": channel_name}))
    assert env == {
        "protocol": "slim",
        "content_type": "text/csv",
        "message": "a,b",
        "metadata": {"k": 1},
    }


def test_errors_reach_the_model_as_messages(stack: LocalStack, ids: Callable[[str], str]) -> None:
    tools = tools_of(stack, ids("alice"))
    out = tools["svc_create_channel"].invoke({"channel": "no slashes"})
    assert out.startswith("invalid channel name: 'no slashes'")
    out = tools["svc_send"].invoke({"channel": "acme/x/never-joined", "message": "x"})
    assert "not in channel" in out
    # Schema validation, returned rather than raised, on one line.
    out = tools["svc_invite"].invoke({"channel": "acme/x/y", "max_uses": 0, "ttl": "soon"})
    assert out == (
        "invalid arguments: max_uses: Input should be greater than or equal to 1 (got 0); "
        "ttl: Input should be a valid integer, unable to parse string as an integer (got 'soon')"
    )
    strict = SvcToolkit(manager=stack.manager(ids("strict"))).get_tools()[0]
    strict.handle_tool_error = False
    with pytest.raises(ToolException, match="invalid channel name"):
        strict.invoke({"channel": "a//b"})


@pytest.mark.anyio
async def test_async_calls(stack: LocalStack, channel_name: str, ids: Callable[[str], str]) -> None:
    tools = tools_of(stack, ids("alice"))
    await tools["svc_create_channel"].ainvoke({"channel": channel_name})
    assert json.loads(await tools["svc_list_channels"].ainvoke({})) == [channel_name]
    out = await tools["svc_receive"].ainvoke({"channel": channel_name, "timeout": 0.1})
    assert json.loads(out) == []


def test_an_agent_invites_another_and_talks_to_it(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    bob = stack.manager(ids("bob"))

    @tool
    def hand_token_to_bob(token: str) -> str:
        """Gives an invite token to the agent bob, who joins with it."""
        bob.join_with_token(channel_name, token, timeout=20.0)
        return "bob joined"

    def with_token(messages: list[BaseMessage]) -> tuple[str, dict[str, str]]:
        last = messages[-1]
        assert isinstance(last, ToolMessage)
        return "hand_token_to_bob", {"token": str(last.content)}

    model = ScriptedChatModel(
        script=[
            ("svc_create_channel", {"channel": channel_name}),
            ("svc_invite", {"channel": channel_name}),
            with_token,
            ("svc_send", {"channel": channel_name, "message": "meet at noon"}),
            "Done: bob is in the channel and has the message.",
        ]
    )
    tools = [*SvcToolkit(manager=stack.manager(ids("alice"))).get_tools(), hand_token_to_bob]
    agent = create_agent(model, tools)
    result = agent.invoke({"messages": [{"role": "user", "content": "set up a channel"}]})
    assert result["messages"][-1].content.startswith("Done")
    assert bob.receive(channel_name, timeout=10.0) == ["meet at noon"]


@pytest.mark.anyio
async def test_async_send_and_receive_end_to_end(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    alice, bob = tools_of(stack, ids("alice")), tools_of(stack, ids("bob"))
    # Membership changes, awaited (aio runs them in a worker thread).
    assert "created" in await alice["svc_create_channel"].ainvoke({"channel": channel_name})
    token = await alice["svc_invite"].ainvoke({"channel": channel_name, "ttl": 600})
    joined = await bob["svc_join"].ainvoke({"channel": channel_name, "token": token})
    assert joined == f"joined channel {channel_name}"
    again = await bob["svc_join"].ainvoke({"channel": channel_name, "token": "svc_inv_x"})
    assert again == f"already in channel {channel_name!r}; the invite token was not used"

    sent = await alice["svc_send"].ainvoke({"channel": channel_name, "message": "hi bob"})
    assert sent == f"sent to {channel_name}"
    await alice["svc_send"].ainvoke({"channel": channel_name, "message": "and again"})
    got = json.loads(await bob["svc_receive"].ainvoke({"channel": channel_name, "timeout": 10}))
    sender = f"{ids('alice')}@{stack.account_id}"
    while len(got) < 2:  # the second may not have arrived with the first
        more = await bob["svc_receive"].ainvoke({"channel": channel_name, "timeout": 10})
        assert json.loads(more), "the second message did not arrive"
        got += json.loads(more)
    assert got == [
        {"from": sender, "message": "hi bob"},
        {"from": sender, "message": "and again"},
    ]
    out = await bob["svc_send_envelope"].ainvoke(
        {"channel": channel_name, "protocol": "a2a", "message": "{}", "metadata": {"k": 1}}
    )
    assert out == f"sent an envelope (a2a, text/plain) to {channel_name}"
    (env,) = json.loads(
        await alice["svc_receive_envelopes"].ainvoke({"channel": channel_name, "timeout": 10})
    )
    assert env == {
        "protocol": "a2a",
        "content_type": "text/plain",
        "message": "{}",
        "metadata": {"k": 1},
    }
    # Sync and async calls of one tool share the channel: each message reaches one of them.
    await bob["svc_send"].ainvoke({"channel": channel_name, "message": "to sync"})
    got = json.loads(alice["svc_receive"].invoke({"channel": channel_name, "timeout": 10}))
    assert got == [{"from": f"{ids('bob')}@{stack.account_id}", "message": "to sync"}]


@pytest.mark.anyio
async def test_async_send_and_receive_take_no_worker_thread(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob = two_in_a_channel(stack, channel_name, ids)  # blocking calls, before the ban
    # From here on, anyio's worker threads and the loop's executor (asyncio.to_thread)
    # fail the test; the old _arun ran every call through anyio.to_thread.run_sync.
    monkeypatch.setattr(anyio.to_thread, "run_sync", refuse)
    monkeypatch.setattr(asyncio.get_running_loop(), "run_in_executor", refuse)
    threads_before = {t.name for t in threading.enumerate()}

    await alice["svc_send"].ainvoke({"channel": channel_name, "message": "one"})
    await alice["svc_send"].ainvoke({"channel": channel_name, "message": "two"})
    got: list[str] = []
    while len(got) < 2:
        out = await bob["svc_receive"].ainvoke({"channel": channel_name, "timeout": 10})
        assert json.loads(out), "a message did not arrive"
        got += [m["message"] for m in json.loads(out)]
    assert got == ["one", "two"]
    await bob["svc_send_envelope"].ainvoke({"channel": channel_name, "message": "env"})
    out = await alice["svc_receive_envelopes"].ainvoke({"channel": channel_name, "timeout": 10})
    assert [e["message"] for e in json.loads(out)] == ["env"]
    # Waiting out the timeout happens on the loop too.
    empty = await bob["svc_receive"].ainvoke({"channel": channel_name, "timeout": 0.2})
    assert json.loads(empty) == []
    started = {t.name for t in threading.enumerate()} - threads_before
    assert not [name for name in started if "worker" in name.lower()], started


@pytest.mark.anyio
async def test_a_cancelled_async_receive_loses_no_message(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    alice, bob = two_in_a_channel(stack, channel_name, ids)
    receive = bob["svc_receive"]
    outcome: list[Any] = []

    async def cancelled_receive() -> None:
        began = time.monotonic()
        with anyio.move_on_after(0.5) as scope:
            outcome.append(await receive.ainvoke({"channel": channel_name, "timeout": 30}))
        outcome.append((scope.cancelled_caught, time.monotonic() - began))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(cancelled_receive)
        await anyio.sleep(1.0)  # the receive was cancelled half a second ago
        # The message arrives after the cancel: a read still waiting somewhere (the old
        # worker thread, which a cancel could not stop) would take it and lose it.
        await alice["svc_send"].ainvoke({"channel": channel_name, "message": "kept"})
    (cancelled, took) = outcome[-1]
    assert outcome[:-1] == [] and cancelled, outcome  # it ended by the cancel...
    assert took < 1.0  # ...promptly, not when a message or its timeout came
    # Let the message arrive before reading again: a read the cancel left behind would
    # take it now (so this read must not race it for the message).
    await anyio.sleep(2.0)
    got = json.loads(await receive.ainvoke({"channel": channel_name, "timeout": 10}))
    assert [m["message"] for m in got] == ["kept"]


BAD_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("svc_create_channel", {"channel": "no slashes"}),
    ("svc_send", {"channel": "acme/x/never-joined", "message": "x"}),
    ("svc_receive", {"channel": "acme/x/never-joined", "timeout": 0}),
    ("svc_receive_envelopes", {"channel": "a//b"}),
    ("svc_join", {"channel": "acme/x/y", "token": "svc_inv_bogus", "timeout": 1}),
    ("svc_invite", {"channel": "acme/x/y", "max_uses": 0, "ttl": "soon"}),
    ("svc_send", {"channel": "acme/x/y"}),
    ("svc_receive", {"channel": "acme/x/y", "timeout": -1, "extra": 1}),
]


@pytest.mark.anyio
async def test_async_calls_report_errors_as_sync_calls_do(
    stack: LocalStack, ids: Callable[[str], str]
) -> None:
    tools = tools_of(stack, ids("alice"))
    for name, arguments in BAD_CALLS:
        # Through LangChain (which validates first) and straight to _run/_arun (where the
        # operation validates): the same text either way, sync or async.
        sync_text = tools[name].invoke(arguments)
        assert sync_text == await tools[name].ainvoke(arguments), name
        with pytest.raises(ToolException) as sync_error:
            tools[name]._run(**arguments)
        with pytest.raises(ToolException) as async_error:
            await tools[name]._arun(**arguments)
        assert str(async_error.value) == str(sync_error.value), name
        if name == "svc_invite":
            assert sync_text.startswith("invalid arguments: max_uses: Input should be")
            assert str(sync_error.value) == sync_text
    assert str(sync_error.value).startswith("invalid arguments: timeout: Input should be")
    sample = await tools["svc_create_channel"].ainvoke({"channel": "no slashes"})
    assert sample.startswith("invalid channel name: 'no slashes'")
    sample = await tools["svc_send"].ainvoke({"channel": "acme/x/never-joined", "message": "x"})
    assert "not in channel" in sample
