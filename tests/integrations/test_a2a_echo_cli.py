"""The echo agent runs from the installed package, as a user without the clone runs it:
``python -P -m svc_integrations.a2a_echo`` or ``svc-a2a-echo``, from a directory where
nothing of the repository is importable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.client import ClientConfig
from a2a.client.client_factory import ClientFactory
from a2a.types import Message, Part, Role, SendMessageRequest

from svc_sdk.adapters.a2a import find_svc_extension
from svc_sdk.adapters.a2a_rpc import register_svc_transport
from svc_sdk.testing import LocalStack

from ..support import free_port

pytestmark = pytest.mark.anyio


def outside_env(stack: LocalStack, data_dir: Path) -> dict[str, str]:
    """The agent's environment: the stack's credentials, no path into the clone."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        SVC_API_KEY=stack.api_key,
        SVC_API_URL=stack.api_url,
        SVC_RELAY=stack.relay_url,
        SVC_DATA_DIR=str(data_dir),
    )
    return env


@pytest.fixture
def echo_url(stack: LocalStack, tmp_path: Path, ids: Callable[[str], str]) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-P", "-m", "svc_integrations.a2a_echo"]
    proc = subprocess.Popen(
        [*command, "--port", str(port), "--identity", ids("echo")],
        cwd=tmp_path,
        env=outside_env(stack, tmp_path / "agent"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"the agent exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(url + "/.well-known/agent-card.json", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the agent did not start"
        time.sleep(0.1)
    yield url
    proc.send_signal(signal.SIGINT)  # what Ctrl-C does: uvicorn stops, the manager closes
    try:
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_installed_agent_answers_over_svc_and_json_rpc(
    stack: LocalStack, echo_url: str, ids: Callable[[str], str]
) -> None:
    caller = stack.manager(ids("caller"))
    request = SendMessageRequest(
        message=Message(message_id="m1", role=Role.ROLE_USER, parts=[Part(text="hi")])
    )
    async with httpx.AsyncClient(timeout=60) as http:
        card = await A2ACardResolver(http, echo_url).get_agent_card()
        assert [i.protocol_binding for i in card.supported_interfaces] == ["SVC", "JSONRPC"]
        params = find_svc_extension(card)
        assert params is not None and params["relay"] == stack.relay_url
        channel = params["channelPrefix"] + uuid.uuid4().hex
        caller.create(channel)
        joined = await http.post(
            echo_url + params["joinPath"],
            json={"channel": channel, "token": caller.invite(channel)},
        )
        assert joined.status_code == 200, joined.text

    factory = ClientFactory(ClientConfig(supported_protocol_bindings=["SVC"], streaming=False))
    register_svc_transport(factory, caller, channel)
    for client, expected in [
        (factory.create(card), f"HI (to {caller.agent_id})"),
        (ClientFactory(ClientConfig(streaming=False)).create(card), "HI (to anonymous)"),
    ]:
        events = [event async for event in client.send_message(request)]
        await client.close()
        assert events[-1].message.parts[0].text == expected


def test_console_script_is_installed(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("svc-a2a-echo")
    done = subprocess.run(
        [str(script), "--help"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: svc-a2a-echo") and "--url" in done.stdout
