"""A2A over encrypted channels with the real a2a-sdk classes, end to end."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from a2a.client.client import ClientConfig
from a2a.client.client_factory import ClientFactory
from a2a.helpers.proto_helpers import new_text_message
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
)
from a2a.utils.errors import (
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
)

from svc_sdk import SvcA2AAdapter
from svc_sdk.adapters.a2a import EXTENSION_URI, find_svc_extension, with_svc_extension
from svc_sdk.adapters.a2a_rpc import SvcA2AServer, register_svc_transport
from svc_sdk.testing import LocalStack

from .helpers import collect, members

_contexts = iter(range(10**6))


def context_id() -> str:
    return f"ctx-{next(_contexts)}"


def test_messages_in_a_context(stack: LocalStack, ids: Callable[[str], str]) -> None:
    alice_m, bob_m = stack.manager(ids("alice")), stack.manager(ids("bob"))
    alice, bob = SvcA2AAdapter(alice_m, "planner"), SvcA2AAdapter(bob_m, "booker")
    ctx = context_id()
    alice.create_context(ctx)
    welcome = alice_m.add_member(f"org/a2a/{ctx}", bob_m.generate_key_package())
    bob.join_context(ctx, welcome)
    file = {
        "bytes": base64.b64encode(b"%PDF").decode(),
        "name": "t.pdf",
        "mimeType": "application/pdf",
    }
    parts: list[dict[str, Any]] = [
        {"type": "text", "text": "two seats to Lyon"},
        {"type": "data", "data": {"seats": 2, "class": None}},
        {"type": "file", "file": file},
    ]
    message_id = alice.send_message(ctx, parts)
    (got,) = collect(lambda: bob.receive_messages(ctx, timeout=5.0), 1)
    assert got["parts"] == parts
    assert got["messageId"] == message_id and got["contextId"] == ctx
    assert got["role"] == "agent"
    # From the sender's verified credential, not claimed by the message.
    assert got["sender"] == str(alice_m.agent_id)
    assert got["sender_account"] == alice_m.agent_id.account
    assert got["sender_identity"] == alice_m.identity.decode()
    bob.send_message(ctx, [{"kind": "text", "text": "booked"}], role="user")
    (reply,) = collect(lambda: alice.receive_messages(ctx, timeout=5.0), 1)
    assert reply["parts"] == [{"type": "text", "text": "booked"}] and reply["role"] == "user"
    assert ctx in alice.contexts()


def test_bad_parts_are_refused_before_sending(stack: LocalStack, ids: Callable[[str], str]) -> None:
    adapter = SvcA2AAdapter(stack.manager(ids("alice")), "a")
    ctx = context_id()
    adapter.create_context(ctx)
    with pytest.raises(ValueError, match="unknown part type"):
        adapter.send_message(ctx, [{"type": "hologram"}])
    with pytest.raises(ValueError, match="non-empty list"):
        adapter.send_message(ctx, [])
    with pytest.raises(RuntimeError, match="invalid channel name"):
        adapter.create_context("has/slash")


def test_agent_card_carries_the_extension(stack: LocalStack, ids: Callable[[str], str]) -> None:
    manager = stack.manager(ids("agent"))
    adapter = SvcA2AAdapter(manager, "travel-agent")
    ctx = context_id()
    adapter.create_context(ctx)
    ext = adapter.agent_card_extension()
    assert ext["uri"] == EXTENSION_URI
    assert ext["params"]["agentId"] == "travel-agent"
    assert ext["params"]["channelPrefix"] == "org/a2a/"
    assert ext["params"]["contexts"] == [ctx]
    assert ext["params"]["relay"] == stack.relay_url
    card = with_svc_extension(AgentCard(name="travel"), adapter, channel=f"org/a2a/{ctx}")
    assert [e.uri for e in card.capabilities.extensions] == [EXTENSION_URI]
    assert card.supported_interfaces[0].url == f"svc:org/a2a/{ctx}"
    found = find_svc_extension(card)
    assert found is not None and found["agentId"] == "travel-agent"
    again = with_svc_extension(card, adapter)  # replaces, never duplicates
    assert len(again.capabilities.extensions) == 1
    assert [i.url for i in again.supported_interfaces] == ["svc:"]


def test_svc_interface_comes_before_the_cards_own(
    stack: LocalStack, ids: Callable[[str], str]
) -> None:
    adapter = SvcA2AAdapter(stack.manager(ids("agent")), "travel-agent")
    http = [
        AgentInterface(url="http://a.example/", protocol_binding="JSONRPC"),
        AgentInterface(url="http://a.example/v1", protocol_binding="HTTP+JSON"),
    ]
    card = with_svc_extension(AgentCard(name="travel", supported_interfaces=http), adapter)
    assert [(i.protocol_binding, i.url) for i in card.supported_interfaces] == [
        ("SVC", "svc:"),
        ("JSONRPC", "http://a.example/"),
        ("HTTP+JSON", "http://a.example/v1"),
    ]
    # Advertising again keeps that order instead of moving svc behind the others.
    again = with_svc_extension(card, adapter, channel="org/a2a/x")
    assert [i.protocol_binding for i in again.supported_interfaces] == [
        "SVC",
        "JSONRPC",
        "HTTP+JSON",
    ]


class Echo(AgentExecutor):
    """Answers every message with its text upper-cased, and who asked."""

    async def execute(self, context: RequestContext, event_queue) -> None:  # type: ignore[no-untyped-def]
        caller = context.call_context.user.user_name
        text = f"{context.get_user_input().upper()} (from {caller})"
        await event_queue.enqueue_event(new_text_message(text, context_id=context.context_id))

    async def cancel(self, context: RequestContext, event_queue) -> None:  # type: ignore[no-untyped-def]
        raise TaskNotCancelableError("echo replies at once")


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "streaming"])
@pytest.mark.anyio
async def test_unmodified_a2a_client_talks_to_a_request_handler(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str], streaming: bool
) -> None:
    agent_m, caller_m = members(stack, channel_name, ids("agent"), ids("caller"))
    card = with_svc_extension(
        AgentCard(name="echo", version="1", capabilities=AgentCapabilities(streaming=streaming)),
        SvcA2AAdapter(agent_m, "echo"),
        channel=channel_name,
    )
    handler = DefaultRequestHandler(Echo(), InMemoryTaskStore(), card)
    factory = ClientFactory(ClientConfig(supported_protocol_bindings=["SVC"], streaming=streaming))
    register_svc_transport(factory, caller_m)
    async with anyio.create_task_group() as tg:
        tg.start_soon(SvcA2AServer(handler, agent_m).serve, channel_name)
        client = factory.create(card)
        request = SendMessageRequest(
            message=Message(message_id="m1", role=Role.ROLE_USER, parts=[Part(text="hello")])
        )
        events = [event async for event in client.send_message(request)]
        assert events[-1].message.parts[0].text == f"HELLO (from {caller_m.agent_id})"
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id="no-such-task"))
        with pytest.raises(PushNotificationNotSupportedError):
            await client.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id="t", id="c")
            )
        await client.close()
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_serving_ends_quietly_when_the_agent_is_removed(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    owner, agent = members(stack, channel_name, ids("owner"), ids("agent"))
    card = AgentCard(name="echo", version="1")
    server = SvcA2AServer(DefaultRequestHandler(Echo(), InMemoryTaskStore(), card), agent)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, channel_name)
            await anyio.to_thread.run_sync(owner.remove_member, channel_name, agent.identity)
    # serve() returned by itself: the task group closed without being cancelled.
