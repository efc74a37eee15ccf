"""The example A2A agent: fetch its card over HTTP, find the svc extension, invite the
agent into a channel as the docs say, and talk to it with unmodified a2a clients, over
svc or, without the svc transport, over JSON-RPC. And what /svc/join refuses, and how."""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.client import Client, ClientConfig
from a2a.client.client_factory import ClientFactory
from a2a.types import Message, Part, Role, SendMessageRequest

from svc_integrations.a2a_agent import SvcA2AAgent
from svc_integrations.a2a_echo import EchoExecutor, echo_card
from svc_sdk import SvcChannelManager
from svc_sdk.adapters.a2a import EXTENSION_URI, find_svc_extension
from svc_sdk.adapters.a2a_rpc import register_svc_transport
from svc_sdk.testing import LocalStack

from ..support import free_port

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).parents[2] / "examples" / "a2a_echo_agent.py"


@contextlib.contextmanager
def running_agent(manager: SvcChannelManager, **options: Any) -> Iterator[str]:
    """Serves the echo agent with uvicorn in a thread; yields its base URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    agent = SvcA2AAgent(manager, echo_card(), EchoExecutor(), url=url, **options)
    server = uvicorn.Server(
        uvicorn.Config(agent.app, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "agent did not start"
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def agent_url(stack: LocalStack, ids: Callable[[str], str]) -> Iterator[str]:
    with running_agent(stack.manager(ids("echo"))) as url:
        yield url


def hello(text: str = "hi") -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)])
    )


async def reply(client: Client, text: str = "hi") -> str:
    events = [event async for event in client.send_message(hello(text))]
    await client.close()
    return str(events[-1].message.parts[0].text)


async def join(http: httpx.AsyncClient, url: str, channel: str, token: str) -> httpx.Response:
    return await http.post(url + "/svc/join", json={"channel": channel, "token": token})


async def test_card_lists_svc_first_then_json_rpc(agent_url: str, stack: LocalStack) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, agent_url).get_agent_card()
    assert [(i.protocol_binding, i.url) for i in card.supported_interfaces] == [
        ("SVC", "svc:"),
        ("JSONRPC", agent_url + "/"),
    ]
    assert EXTENSION_URI in [e.uri for e in card.capabilities.extensions]
    params = find_svc_extension(card)
    assert params is not None
    assert params["relay"] == stack.relay_url
    assert params["joinPath"] == "/svc/join" and params["channelPrefix"] == "org/a2a/"


async def test_a_caller_following_the_docs(
    stack: LocalStack, agent_url: str, ids: Callable[[str], str]
) -> None:
    # What integrations/a2a_agent.py and docs/protocols.md tell a caller to do.
    caller = stack.manager(ids("caller"))
    async with httpx.AsyncClient(timeout=60) as http:
        card = await A2ACardResolver(http, agent_url).get_agent_card()
        params = find_svc_extension(card)
        assert params is not None
        channel = params["channelPrefix"] + uuid.uuid4().hex
        caller.create(channel)
        joined = await http.post(
            agent_url + params["joinPath"],
            json={"channel": channel, "token": caller.invite(channel)},
        )
        assert joined.status_code == 200, joined.text
        assert joined.json() == {"channel": channel, "status": "joined"}
        again = await join(http, agent_url, channel, caller.invite(channel))
        assert again.json() == {"channel": channel, "status": "already serving"}
        # The channel is one of the card's contexts: the prefix means what it says.
        served = find_svc_extension(await A2ACardResolver(http, agent_url).get_agent_card())
        assert served is not None and served["contexts"] == [channel.removeprefix("org/a2a/")]

    factory = ClientFactory(ClientConfig(supported_protocol_bindings=["SVC"], streaming=False))
    register_svc_transport(factory, caller, channel)
    assert await reply(factory.create(card)) == f"HI (to {caller.agent_id})"


async def test_a2a_client_without_svc_uses_json_rpc(agent_url: str) -> None:
    # A stock client: default configuration, nothing of svc registered.
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, agent_url).get_agent_card()
    client = ClientFactory(ClientConfig(streaming=False)).create(card)
    assert await reply(client, "plain http") == "PLAIN HTTP (to anonymous)"


async def test_a2a_client_with_svc_prefers_it(
    stack: LocalStack, agent_url: str, ids: Callable[[str], str]
) -> None:
    caller = stack.manager(ids("caller"))
    channel = f"org/a2a/{uuid.uuid4().hex}"
    caller.create(channel)
    async with httpx.AsyncClient(timeout=60) as http:
        card = await A2ACardResolver(http, agent_url).get_agent_card()
        assert (await join(http, agent_url, channel, caller.invite(channel))).status_code == 200
    # The client lists JSON-RPC first, but a2a follows the card's order: svc.
    config = ClientConfig(supported_protocol_bindings=["JSONRPC", "SVC"], streaming=False)
    factory = ClientFactory(config)
    register_svc_transport(factory, caller, channel)
    # Over JSON-RPC the echo could not know who asked; over svc MLS tells it.
    assert await reply(factory.create(card)) == f"HI (to {caller.agent_id})"


@pytest.mark.parametrize(
    ("body", "slug", "detail"),
    [
        (b"not json", "invalid-request", "must be JSON"),
        (b"[1]", "invalid-request", "expected a JSON object {channel, token}"),
        (b'{"token": "svc_inv_x"}', "invalid-request", "invalid channel name"),
        (b'{"channel": "bad", "token": "svc_inv_x"}', "invalid-request", "invalid channel name"),
        (b'{"channel": "acme/a2a/x", "token": "svc_inv_x"}', "invalid-request", "channelPrefix"),
        (b'{"channel": "org/a2a/x"}', "invite-invalid", "svc_inv_"),
        (b'{"channel": "org/a2a/x", "token": "sk_live_x"}', "invite-invalid", "svc_inv_"),
        (b'{"channel": "org/a2a/x", "token": 7}', "invite-invalid", "svc_inv_"),
        # Well-formed on its face, but the account API knows no such invite.
        (b'{"channel": "org/a2a/x", "token": "svc_inv_nope"}', "invite-invalid", "not valid"),
    ],
)
async def test_join_refuses_bad_requests_with_400(
    agent_url: str, body: bytes, slug: str, detail: str
) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(agent_url + "/svc/join", content=body)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == f"urn:svc:problem:{slug}" and problem["status"] == 400
    assert detail in problem["detail"]


def problem_of(response: httpx.Response) -> tuple[int, str]:
    assert response.headers["content-type"] == "application/problem+json"
    return response.status_code, response.json()["type"].removeprefix("urn:svc:problem:")


async def test_join_refuses_a_token_for_another_channel_with_400(
    stack: LocalStack, agent_url: str, ids: Callable[[str], str]
) -> None:
    caller = stack.manager(ids("caller"))
    mine, other = (f"org/a2a/{uuid.uuid4().hex}" for _ in range(2))
    caller.create(mine)
    caller.create(other)
    async with httpx.AsyncClient(timeout=60) as http:
        response = await join(http, agent_url, mine, caller.invite(other))
    assert problem_of(response) == (400, "invite-invalid")


async def test_join_refuses_a_used_up_token_with_403(
    stack: LocalStack, agent_url: str, ids: Callable[[str], str]
) -> None:
    caller, first = stack.manager(ids("caller")), stack.manager(ids("first"))
    channel = f"org/a2a/{uuid.uuid4().hex}"
    caller.create(channel)
    token = caller.invite(channel, max_uses=1)
    first.join_with_token(channel, token, timeout=30)
    async with httpx.AsyncClient(timeout=60) as http:
        response = await join(http, agent_url, channel, token)
    assert problem_of(response) == (403, "invite-used-up")
    assert "no uses left" in response.json()["detail"]


async def test_join_refuses_an_expired_token_with_403(
    stack: LocalStack, agent_url: str, ids: Callable[[str], str]
) -> None:
    caller = stack.manager(ids("caller"))
    channel = f"org/a2a/{uuid.uuid4().hex}"
    caller.create(channel)
    token = caller.invite(channel, ttl=1)
    time.sleep(1.2)
    async with httpx.AsyncClient(timeout=60) as http:
        response = await join(http, agent_url, channel, token)
    assert problem_of(response) == (403, "invite-expired")


async def test_join_times_out_with_504_when_no_member_is_online(
    stack: LocalStack, ids: Callable[[str], str]
) -> None:
    caller = stack.manager(ids("caller"))
    channel = f"org/a2a/{uuid.uuid4().hex}"
    caller.create(channel)
    token = caller.invite(channel)
    caller.close()  # nobody left to add the agent
    with running_agent(stack.manager(ids("echo")), join_timeout=1.0) as url:
        async with httpx.AsyncClient(timeout=60) as http:
            response = await join(http, url, channel, token)
    assert problem_of(response) == (504, "join-timeout")


async def test_join_refuses_beyond_max_channels_with_429(
    stack: LocalStack, ids: Callable[[str], str]
) -> None:
    caller = stack.manager(ids("caller"))
    channel = f"org/a2a/{uuid.uuid4().hex}"
    caller.create(channel)
    with running_agent(stack.manager(ids("echo")), max_channels=0) as url:
        async with httpx.AsyncClient(timeout=60) as http:
            response = await join(http, url, channel, caller.invite(channel))
    assert problem_of(response) == (429, "too-many-channels")


def test_the_example_file_serves_the_installed_echo() -> None:
    # examples/ stays a few lines of wiring around the installed agent.
    spec = importlib.util.spec_from_file_location("a2a_echo_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.EchoExecutor is EchoExecutor and module.echo_card is echo_card
