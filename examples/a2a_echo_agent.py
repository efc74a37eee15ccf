"""An A2A agent that answers over end-to-end encrypted svc channels.

    svc up &                                    # a local account API and relay
    python examples/a2a_echo_agent.py --port 9000

Its card (http://127.0.0.1:9000/.well-known/agent-card.json) carries the svc extension;
a caller creates a channel, POSTs an invite token to the card's joinPath, and then talks
A2A over the channel (see integrations/a2a_agent.py and notebooks/04).
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


class EchoExecutor(AgentExecutor):
    """Replies with the caller's text, upper-cased, naming the caller MLS authenticated."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        caller = context.call_context.user.user_name
        reply = f"{context.get_user_input().upper()} (to {caller})"
        await event_queue.enqueue_event(new_text_message(reply, context_id=context.context_id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        # Echo answers with a Message at once: it never has a running task to stop.
        raise TaskNotCancelableError("echo replies at once; there is nothing to cancel")


def echo_card() -> AgentCard:
    return AgentCard(
        name="echo",
        description="Echoes text back, over end-to-end encrypted channels",
        version="1.0",
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="Upper-cases text", tags=["demo"])],
    )


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--identity", default="echo-agent")
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    with SvcChannelManager(args.identity) as manager:
        agent = SvcA2AAgent(manager, echo_card(), EchoExecutor())
        uvicorn.run(agent.app, host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
