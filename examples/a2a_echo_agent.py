"""Serving an A2A agent over end-to-end encrypted svc channels, in a few lines.

    svc up &                                    # a local account API and relay
    python examples/a2a_echo_agent.py           # agent on http://127.0.0.1:9000

The echo agent itself is installed with svc-sdk: ``svc-a2a-echo`` (or ``python -m
svc_integrations.a2a_echo``) runs it with options. Put your own ``AgentExecutor`` and
card in place of the echo's to serve your agent the same way. A caller creates a
channel under the card's ``channelPrefix``, POSTs an invite token to its ``joinPath``
and talks A2A over the channel; a2a clients without svc use the card's JSON-RPC
interface (see integrations/a2a_agent.py and notebooks/04).
"""

from __future__ import annotations

import uvicorn

from svc_integrations.a2a_agent import SvcA2AAgent
from svc_integrations.a2a_echo import EchoExecutor, echo_card
from svc_sdk import SvcChannelManager


def main() -> None:
    with SvcChannelManager("echo-agent") as manager:
        agent = SvcA2AAgent(manager, echo_card(), EchoExecutor(), url="http://127.0.0.1:9000")
        uvicorn.run(agent.app, host="127.0.0.1", port=9000)


if __name__ == "__main__":
    main()
