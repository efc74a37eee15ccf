"""An A2A agent whose card advertises svc and which answers over encrypted channels.

``SvcA2AAgent`` is a Starlette app (serve it with uvicorn) around any a2a
``AgentExecutor``. It serves four things:

- ``GET /.well-known/agent-card.json``: the agent card, with the svc extension under
  ``capabilities.extensions`` (its params include ``joinPath`` and ``channelPrefix``).
  Its first interface is ``SVC``; when the agent knows its ``url``, a ``JSONRPC``
  interface at that url follows, so a2a clients without the svc transport still work.
- ``POST /svc/join`` with ``{"channel": ..., "token": ...}``: the caller created a
  channel whose name starts with the card's ``channelPrefix`` and invites the agent.
  The agent joins with the token and answers A2A requests on that channel from then
  on. One channel per caller keeps callers apart.
- ``POST /``: A2A's JSON-RPC binding over plain HTTP (a2a-sdk's own endpoint), for
  clients without svc. Not encrypted end to end, and its callers are unauthenticated.
- Every channel the agent was already in when it started (state lives in its data_dir).

Both the channels and JSON-RPC reach the same a2a ``DefaultRequestHandler``.

``/svc/join`` answers 200 ``{"channel", "status": "joined" | "already serving"}`` or an
RFC 9457 problem+json:

- 400: the body is not a JSON object ``{channel, token}``, the channel name is invalid
  or outside ``channelPrefix``, or the token is malformed, unknown or for another
  channel (``InviteError.reason == "invalid"``).
- 403: the invite is real but spent: expired or used up; or the relay refuses the
  channel to the agent's account.
- 429: the agent already serves ``max_channels`` channels.
- 503: the agent cannot reach its relay or account API. 504: the token was accepted
  but no member of the channel added the agent in time (keep a member online).

The caller's side is plain a2a-sdk::

    card = await A2ACardResolver(http, url).get_agent_card()
    params = find_svc_extension(card)          # agentId, relay, joinPath, channelPrefix
    channel = params["channelPrefix"] + uuid.uuid4().hex
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

from svc_sdk import AsyncSvcChannelManager, SvcChannelManager
from svc_sdk.errors import AccessError, AuthError, InviteError, TransportError
from svc_sdk.extras import require
from svc_sdk.names import is_valid_channel_name

require("a2a.types", "a2a", "SvcA2AAgent")
require("starlette", "server", "SvcA2AAgent")
require("sse_starlette", "a2a", "SvcA2AAgent")  # a2a-sdk's JSON-RPC endpoint streams with it

from a2a.server.agent_execution.agent_executor import AgentExecutor  # noqa: E402
from a2a.server.request_handlers import DefaultRequestHandler  # noqa: E402
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes  # noqa: E402
from a2a.server.tasks import InMemoryTaskStore  # noqa: E402
from a2a.types import AgentCard, AgentInterface  # noqa: E402
from a2a.utils.constants import (  # noqa: E402
    DEFAULT_RPC_URL,
    PROTOCOL_VERSION_CURRENT,
    TransportProtocol,
)
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from svc_sdk.adapters.a2a import (  # noqa: E402
    CHANNEL_PREFIX,
    EXTENSION_URI,
    SvcA2AAdapter,
    with_svc_extension,
)
from svc_sdk.adapters.a2a_rpc import SvcA2AServer  # noqa: E402

log = logging.getLogger("svc_integrations.a2a")

JOIN_PATH = "/svc/join"
#: Where the JSON-RPC binding is served: a2a-sdk's default, the agent's base url.
JSONRPC_PATH = DEFAULT_RPC_URL


def _problem(status: int, slug: str, title: str, detail: str) -> JSONResponse:
    # The same shape and type URIs as the account API's problems.
    return JSONResponse(
        {"type": f"urn:svc:problem:{slug}", "title": title, "status": status, "detail": detail},
        status_code=status,
        media_type="application/problem+json",
    )


def _bad_request(detail: str) -> JSONResponse:
    return _problem(400, "invalid-request", "Bad Request", detail)


def _join_failed(exc: Exception) -> JSONResponse:
    """The problem for a join_with_token failure; see the module docstring."""
    if isinstance(exc, InviteError):
        if exc.reason == "invalid":
            return _problem(400, "invite-invalid", "Bad Request", exc.detail)
        if exc.reason == "timeout":
            return _problem(504, "join-timeout", "Gateway Timeout", exc.detail)
        return _problem(403, f"invite-{exc.reason}", "Forbidden", exc.detail)
    if isinstance(exc, AccessError):
        return _problem(403, "access-denied", "Forbidden", exc.detail)
    # The agent's own connection or credentials: nothing the caller can fix, and the
    # details (addresses, key problems) are the operator's business, so they go to the log.
    log.error("joining a channel failed: %s", exc)
    if isinstance(exc, TransportError | AuthError):
        return _problem(503, "unavailable", "Service Unavailable", "the agent cannot join now")
    return _problem(500, "internal", "Internal Server Error", "the agent could not join")


class SvcA2AAgent:
    """An A2A agent reachable over svc channels and, for clients without svc, over
    A2A's JSON-RPC binding; ``app`` is its Starlette application. ``url`` is the base
    URL callers reach the app at (``http://host:port``); without it the card cannot
    list the JSON-RPC interface, which is still served at ``/``. ``join_timeout`` is
    how long ``/svc/join`` waits for a member of the caller's channel to add the agent."""

    def __init__(
        self,
        manager: SvcChannelManager,
        card: AgentCard,
        executor: AgentExecutor,
        *,
        agent_id: str | None = None,
        url: str | None = None,
        max_channels: int = 1000,
        join_timeout: float = 30.0,
    ) -> None:
        self.manager = manager
        self.aio = AsyncSvcChannelManager(manager)  # the manager's face for this loop
        self.adapter = SvcA2AAdapter(manager, agent_id or card.name or "agent")
        self.url = url
        self.max_channels = max_channels
        self.join_timeout = join_timeout
        self._base_card = card
        self.handler = DefaultRequestHandler(executor, InMemoryTaskStore(), self.card())
        self.server = SvcA2AServer(self.handler, manager)
        self._serving: set[str] = set()
        self._tasks: anyio.abc.TaskGroup | None = None
        routes = create_agent_card_routes(self.card(), card_modifier=self._card)
        routes.append(Route(JOIN_PATH, self._join, methods=["POST"]))
        routes.extend(create_jsonrpc_routes(self.handler, rpc_url=JSONRPC_PATH))
        self.app = Starlette(routes=routes, lifespan=self._lifespan)

    def card(self) -> AgentCard:
        """The current card: the svc extension lists the channels being served, and the
        interfaces are SVC first, then the card's own, then JSON-RPC at ``url``."""
        out = with_svc_extension(self._base_card, self.adapter)
        for extension in out.capabilities.extensions:
            if extension.uri == EXTENSION_URI:
                extension.params["joinPath"] = JOIN_PATH
        if self.url is not None:
            rpc_url = self.url.rstrip("/") + JSONRPC_PATH
            listed = {(i.protocol_binding, i.url) for i in out.supported_interfaces}
            if (TransportProtocol.JSONRPC, rpc_url) not in listed:
                out.supported_interfaces.append(
                    AgentInterface(
                        url=rpc_url,
                        protocol_binding=TransportProtocol.JSONRPC,
                        protocol_version=PROTOCOL_VERSION_CURRENT,
                    )
                )
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
            return _bad_request("the body must be JSON")
        if not isinstance(body, dict):
            return _bad_request("expected a JSON object {channel, token}")
        channel, token = body.get("channel"), body.get("token")
        if not is_valid_channel_name(channel):
            return _bad_request(f"invalid channel name: {channel!r}")
        assert isinstance(channel, str)
        if not channel.startswith(CHANNEL_PREFIX):
            # The card promises callers' channels live under channelPrefix.
            return _bad_request(f"the channel must start with channelPrefix {CHANNEL_PREFIX!r}")
        if not isinstance(token, str) or not token.startswith("svc_inv_") or len(token) > 256:
            return _problem(400, "invite-invalid", "Bad Request", "token must be an svc_inv_ token")
        if channel in self._serving:
            return JSONResponse({"channel": channel, "status": "already serving"})
        if len(self._serving) >= self.max_channels:
            return _problem(
                429, "too-many-channels", "Too Many Requests", "this agent serves no more channels"
            )
        try:
            # A join is a few round trips: aio runs it in a worker thread.
            await self.aio.join_with_token(channel, token, self.join_timeout)
        except RuntimeError as exc:  # every library error is one (svc_sdk.errors)
            return _join_failed(exc)
        self._serve(channel)
        return JSONResponse({"channel": channel, "status": "joined"})
