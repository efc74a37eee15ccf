"""The LangChain toolkit: direct tool calls, and a create_agent agent driven by a
scripted model that creates a channel, invites a second agent and sends it a message."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from langchain.agents import create_agent
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.tools import ToolException, tool

from svc_integrations.langchain import SvcToolkit
from svc_integrations.testing import ScriptedChatModel
from svc_sdk.testing import LocalStack

from . import TOOL_NAMES


def tools_of(stack: LocalStack, name: str) -> dict[str, object]:
    return {t.name: t for t in SvcToolkit(manager=stack.manager(name)).get_tools()}


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
        schema = t.args_schema.model_json_schema()  # type: ignore[union-attr]
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
