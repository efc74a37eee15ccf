"""An A2A agent whose card advertises svc and which answers over encrypted channels.

``SvcA2AAgent`` is a Starlette app (serve it with uvicorn) around any a2a
``AgentExecutor``. It serves three things:

- ``GET /.well-known/agent-card.json``: the agent card, with the svc extension under
  ``capabilities.extensions`` (its params include ``joinPath``) and an ``SVC`` interface.
- ``POST /svc/join`` with ``{"channel": ..., "token": ...}``: the caller created a
  channel and invites the agent. The agent joins with the token and answers A2A requests
  on that channel from then on, through an a2a ``DefaultRequestHandler``. One channel per
  caller keeps callers apart.
- Every channel the agent was already in when it started (state lives in its data_dir).

The join endpoint only makes the agent join channels it has been given a valid invite
to; ``max_channels`` bounds how many it serves. Errors are RFC 9457 problem+json.

The caller's side is plain a2a-sdk::

    card = await A2ACardResolver(http, url).get_agent_card()
    params = find_svc_extension(card)                 # agentId, relay, joinPath, ...
    caller.create(channel)
    await http.post(url + params["joinPath"], json={"channel": channel,
                                                    "token": caller.invite(channel)})
    factory = ClientFactory(ClientConfig(supported_protocol_bindings=["SVC"]))
    register_svc_transport(factory, caller, channel)
    client = factory.create(card)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from svc_sdk import SvcChannelManager, TransportError
from svc_sdk.adapters._extras import require
from svc_sdk.names import is_valid_channel_name

require("a2a.types", "a2a", "SvcA2AAgent")
require("starlette", "server", "SvcA2AAgent")

from a2a.server.agent_execution.agent_executor import AgentExecutor  # noqa: E402
from a2a.server.request_handlers import DefaultRequestHandler  # noqa: E402
from a2a.server.routes.agent_card_routes import create_agent_card_routes  # noqa: E402
from a2a.server.tasks import InMemoryTaskStore  # noqa: E402
from a2a.types import AgentCard  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from svc_sdk.adapters.a2a import (  # noqa: E402
    EXTENSION_URI,
    SvcA2AAdapter,
    with_svc_extension,
)
from svc_sdk.adapters.a2a_rpc import SvcA2AServer  # noqa: E402

log = logging.getLogger("svc_integrations.a2a")

JOIN_PATH = "/svc/join"


def _problem(status: int, title: str, detail: str) -> JSONResponse:
    return JSONResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status_code=status,
        media_type="application/problem+json",
    )


class SvcA2AAgent:
    """An A2A agent reachable over svc channels; ``app`` is its Starlette application."""

    def __init__(
        self,
        manager: SvcChannelManager,
        card: AgentCard,
        executor: AgentExecutor,
        *,
        agent_id: str | None = None,
        max_channels: int = 1000,
    ) -> None:
        self.manager = manager
        self.adapter = SvcA2AAdapter(manager, agent_id or card.name or "agent")
        self.max_channels = max_channels
        self._base_card = card
        self.handler = DefaultRequestHandler(executor, InMemoryTaskStore(), self.card())
        self.server = SvcA2AServer(self.handler, manager)
        self._serving: set[str] = set()
        self._tasks: anyio.abc.TaskGroup | None = None
        routes = create_agent_card_routes(self.card(), card_modifier=self._card)
        routes.append(Route(JOIN_PATH, self._join, methods=["POST"]))
        self.app = Starlette(routes=routes, lifespan=self._lifespan)

    def card(self) -> AgentCard:
        """The current card: the svc extension lists the channels being served."""
        out = with_svc_extension(self._base_card, self.adapter)
        for extension in out.capabilities.extensions:
            if extension.uri == EXTENSION_URI:
                extension.params["joinPath"] = JOIN_PATH
        return out

    async def _card(self, card: AgentCard) -> AgentCard:
        return self.card()

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            for channel in self.manager.list_channels():
                self._serve(channel)
            yield
            tasks.cancel_scope.cancel()
        self._tasks = None

    def _serve(self, channel: str) -> None:
        assert self._tasks is not None
        if channel not in self._serving:
            self._serving.add(channel)
            self._tasks.start_soon(self._serve_one, channel)

    async def _serve_one(self, channel: str) -> None:
        # One channel's end (left, removed, or a fault) must not stop the others.
        try:
            await self.server.serve(channel)
        except Exception:
            log.exception("serving %s failed", channel)
        finally:
            self._serving.discard(channel)

    async def _join(self, request: Request) -> JSONResponse:
        try:
            body: Any = await request.json()
        except ValueError:
            return _problem(400, "Bad Request", "the body must be JSON")
        if not isinstance(body, dict):
            return _problem(422, "Unprocessable Content", "expected {channel, token}")
        channel, token = body.get("channel"), body.get("token")
        if not is_valid_channel_name(channel):
            return _problem(422, "Unprocessable Content", f"invalid channel name: {channel!r}")
        if not isinstance(token, str) or not token.startswith("svc_inv_") or len(token) > 256:
            return _problem(422, "Unprocessable Content", "token must be an svc_inv_ token")
        assert isinstance(channel, str)
        if channel in self._serving:
            return JSONResponse({"channel": channel, "status": "already serving"})
        if len(self._serving) >= self.max_channels:
            return _problem(429, "Too Many Requests", "this agent serves no more channels")
        try:
            await anyio.to_thread.run_sync(self.manager.join_with_token, channel, token, 30.0)
        except TransportError as exc:
            return _problem(503, "Service Unavailable", str(exc))
        except RuntimeError as exc:  # the library's message says what went wrong
            return _problem(409, "Conflict", str(exc))
        self._serve(channel)
        return JSONResponse({"channel": channel, "status": "joined"})
