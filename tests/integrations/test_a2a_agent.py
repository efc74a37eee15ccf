"""The example A2A agent: fetch its card over HTTP, find the svc extension, invite the
agent into a channel, and talk to it with an unmodified a2a client through it."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import uvicorn
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.client import ClientConfig
from a2a.client.client_factory import ClientFactory
from a2a.types import Message, Part, Role, SendMessageRequest

from svc_integrations.a2a_agent import SvcA2AAgent
from svc_sdk.adapters.a2a import EXTENSION_URI, find_svc_extension
from svc_sdk.adapters.a2a_rpc import register_svc_transport
from svc_sdk.testing import LocalStack

from ..support import free_port

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).parents[2] / "examples" / "a2a_echo_agent.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("a2a_echo_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def agent_url(stack: LocalStack, ids: Callable[[str], str]) -> Iterator[str]:
    example = load_example()
    agent = SvcA2AAgent(stack.manager(ids("echo")), example.echo_card(), example.EchoExecutor())
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(agent.app, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "agent did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


async def test_card_extension_and_a_conversation(
    stack: LocalStack, agent_url: str, channel_name: str, ids: Callable[[str], str]
) -> None:
    caller = stack.manager(ids("caller"))
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, agent_url).get_agent_card()
        assert EXTENSION_URI in [e.uri for e in card.capabilities.extensions]
        params = find_svc_extension(card)
        assert params is not None
        assert params["relay"] == stack.relay_url and params["joinPath"] == "/svc/join"
        assert "SVC" in [i.protocol_binding for i in card.supported_interfaces]

        caller.create(channel_name)
        token = caller.invite(channel_name)
        joined = await http.post(
            agent_url + params["joinPath"], json={"channel": channel_name, "token": token}
        )
        assert joined.status_code == 200, joined.text

        factory = ClientFactory(ClientConfig(supported_protocol_bindings=["SVC"], streaming=False))
        register_svc_transport(factory, caller, channel_name)
        client = factory.create(card)
        request = SendMessageRequest(
            message=Message(message_id="m1", role=Role.ROLE_USER, parts=[Part(text="hi")])
        )
        events = [event async for event in client.send_message(request)]
        assert events[-1].message.parts[0].text == f"HI (to {caller.identity.decode()})"
        await client.close()


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        (b"not json", 400, "must be JSON"),
        (b"[1]", 422, "expected {channel, token}"),
        (b'{"channel": "bad", "token": "svc_inv_x"}', 422, "invalid channel name"),
        (b'{"channel": "a/b/c", "token": "sk_live_x"}', 422, "svc_inv_"),
        (b'{"channel": "a/b/c", "token": "svc_inv_nope"}', 409, "invite"),
    ],
)
async def test_join_refuses_bad_requests(
    agent_url: str, body: bytes, status: int, detail: str
) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(agent_url + "/svc/join", content=body)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    assert detail in response.json()["detail"]
