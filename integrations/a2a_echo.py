"""The example A2A agent, installed: it echoes text, upper-cased, over svc channels and
over A2A's JSON-RPC binding (``pip install 'svc-sdk[a2a,server]'``).

    svc up &                                   # a local account API and relay
    svc-a2a-echo --port 9000                   # or: python -m svc_integrations.a2a_echo

Its card (http://127.0.0.1:9000/.well-known/agent-card.json) lists the SVC interface
first and JSON-RPC at http://127.0.0.1:9000/ second. A caller with the svc transport
creates a channel under the card's ``channelPrefix``, POSTs an invite token to its
``joinPath`` and talks A2A over the channel; any other a2a client uses JSON-RPC.

The agent's identity, relay and API key come from the usual places (``SVC_API_KEY`` or
``svc signup``'s key file, ``SVC_API_URL``, ``SVC_RELAY``, ``SVC_DATA_DIR``).
"""

from __future__ import annotations

import argparse

from a2a.helpers.proto_helpers import new_text_message
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.events import EventQueue
from a2a.types import AgentCapabilities, AgentCard, AgentSkill
from a2a.utils.errors import TaskNotCancelableError

from svc_integrations.a2a_agent import SvcA2AAgent
from svc_sdk import SvcChannelManager

#: What the echo calls a caller that reached it without svc (JSON-RPC over HTTP).
ANONYMOUS = "anonymous"


class EchoExecutor(AgentExecutor):
    """Replies with the caller's text, upper-cased, naming the caller: its MLS identity
    over svc, ``anonymous`` over JSON-RPC, where nothing authenticates it."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        user = context.call_context.user
        caller = user.user_name if user.is_authenticated else ANONYMOUS
        reply = f"{context.get_user_input().upper()} (to {caller})"
        await event_queue.enqueue_event(new_text_message(reply, context_id=context.context_id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        # Echo answers with a Message at once: it never has a running task to stop.
        raise TaskNotCancelableError("echo replies at once; there is nothing to cancel")


def echo_card() -> AgentCard:
    """The echo agent's card before ``SvcA2AAgent`` adds svc and JSON-RPC to it."""
    return AgentCard(
        name="echo",
        description="Echoes text back, over end-to-end encrypted channels",
        version="1.0",
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="Upper-cases text", tags=["demo"])],
    )


def main(argv: list[str] | None = None) -> None:
    """``svc-a2a-echo``: serves the echo agent until interrupted."""
    import uvicorn  # the server extra; imported here so that the module imports without it

    parser = argparse.ArgumentParser(
        prog="svc-a2a-echo", description="An A2A echo agent over svc channels and JSON-RPC."
    )
    parser.add_argument("--identity", default="echo-agent", help="the agent's MLS identity")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=9000, help="port to listen on")
    parser.add_argument(
        "--url",
        help="the base URL callers reach the agent at, for the card's JSON-RPC interface "
        "(default http://HOST:PORT; set it when listening on 0.0.0.0 or behind a proxy)",
    )
    args = parser.parse_args(argv)
    host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address
    url = args.url or f"http://{host}:{args.port}"
    with SvcChannelManager(args.identity) as manager:
        agent = SvcA2AAgent(manager, echo_card(), EchoExecutor(), url=url)
        uvicorn.run(agent.app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
