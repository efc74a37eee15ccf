"""A2A's own client and server over an encrypted channel (``pip install 'svc-sdk[a2a]'``).

An unmodified a2a-sdk client talks to an unmodified a2a ``RequestHandler`` (for example
``DefaultRequestHandler`` around an ``AgentExecutor``); only the transport changes:

    # client side: register the transport, then use a2a as usual
    factory = ClientFactory(ClientConfig(supported_protocol_bindings=["SVC"]))
    register_svc_transport(factory, manager)
    client = factory.create(card)            # card lists an SVC interface, svc:{channel}

    # agent side
    await SvcA2AServer(handler, manager).serve(channel)

Frames are A2A envelopes (content type ``application/a2a-rpc+json``) holding A2A's
JSON-RPC 2.0 requests and responses, with the method names and JSON of A2A's JSON-RPC
binding. A streaming call gets any number of responses with its id, then
``{"jsonrpc": "2.0", "id": ..., "end": true}``. The server sees the caller as an
authenticated ``User`` whose name is its MLS identity.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

import anyio
import anyio.to_thread
from a2a.auth.user import User
from a2a.client.client import ClientCallContext, ClientConfig
from a2a.client.client_factory import ClientFactory
from a2a.client.errors import A2AClientError, A2AClientTimeoutError
from a2a.client.transports.base import ClientTransport
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2 as pb
from a2a.utils import errors as a2a_errors
from a2a.utils.proto_utils import to_stream_response
from google.protobuf import json_format
from google.protobuf.empty_pb2 import Empty
from google.protobuf.message import Message as Proto

from svc_sdk.adapters._reader import EnvelopeReader
from svc_sdk.adapters.a2a import PROTOCOL_BINDING
from svc_sdk.adapters.content import A2A_RPC_TYPE
from svc_sdk.agent_id import AgentId
from svc_sdk.aio import AsyncSvcChannelManager
from svc_sdk.envelope import Envelope, Protocol
from svc_sdk.errors import ChannelClosedError, TransportError
from svc_sdk.manager import SvcChannelManager
from svc_sdk.names import check_channel_name

log = logging.getLogger("svc_sdk.a2a")

DEFAULT_TIMEOUT = 60.0
_CODE_TO_ERROR = {code: kind for kind, code in a2a_errors.JSON_RPC_ERROR_CODE_MAP.items()}


def _is_rpc(envelope: Envelope) -> bool:
    return envelope.protocol is Protocol.A2A and envelope.content_type == A2A_RPC_TYPE


def _frame(obj: dict[str, Any]) -> Envelope:
    return Envelope(Protocol.A2A, A2A_RPC_TYPE, json.dumps(obj, separators=(",", ":")).encode())


async def _send(manager: SvcChannelManager, channel: str, obj: dict[str, Any]) -> None:
    await AsyncSvcChannelManager(manager).send_envelope(channel, _frame(obj))


# -- client ----------------------------------------------------------------------------


class SvcA2AClientTransport(ClientTransport):
    """An a2a ``ClientTransport`` whose requests travel over an encrypted channel."""

    def __init__(self, manager: SvcChannelManager, channel: str) -> None:
        self.manager = manager
        self.channel = check_channel_name(channel)
        self._reader = EnvelopeReader(manager, channel, _is_rpc)
        self._waiting: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._pump: asyncio.Task[None] | None = None

    async def _run_pump(self) -> None:
        while True:
            message, envelope = await self._reader.next()
            try:
                frame = json.loads(envelope.payload)
                rid = frame.get("id") if isinstance(frame, dict) else None
                queue = self._waiting.get(rid) if isinstance(rid, str) else None
            except (ValueError, RecursionError):  # not JSON, or nested too deeply
                queue = None
            if queue is None:
                log.debug("%s: seq %d is no answer to a request of ours", self.channel, message.seq)
                continue
            queue.put_nowait(frame)

    async def _call(
        self, method: str, request: Proto, context: ClientCallContext | None
    ) -> tuple[str, asyncio.Queue[dict[str, Any]], float]:
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(self._run_pump())
        rid = str(uuid.uuid4())
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._waiting[rid] = queue
        params = json_format.MessageToDict(request)
        try:
            await _send(
                self.manager,
                self.channel,
                {"jsonrpc": "2.0", "id": rid, "method": method, "params": params},
            )
        except BaseException:
            self._waiting.pop(rid, None)
            raise
        timeout = context.timeout if context is not None and context.timeout else DEFAULT_TIMEOUT
        return rid, queue, timeout

    @staticmethod
    async def _next(queue: asyncio.Queue[dict[str, Any]], timeout: float) -> dict[str, Any]:
        try:
            frame = await asyncio.wait_for(queue.get(), timeout)
        except TimeoutError:
            raise A2AClientTimeoutError(f"no answer over the channel within {timeout} s") from None
        error = frame.get("error")
        if error is not None:
            raise _error(error)
        return frame

    async def _unary(
        self, method: str, request: Proto, response: Proto, context: ClientCallContext | None
    ) -> Any:
        rid, queue, timeout = await self._call(method, request, context)
        try:
            frame = await self._next(queue, timeout)
        finally:
            self._waiting.pop(rid, None)
        result = frame.get("result")
        if not isinstance(result, dict):
            raise A2AClientError(f"invalid {method} answer: no result object")
        try:
            return json_format.ParseDict(result, response, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise A2AClientError(f"invalid {method} answer: {exc}") from None

    async def _stream(
        self, method: str, request: Proto, context: ClientCallContext | None
    ) -> AsyncGenerator[pb.StreamResponse]:
        rid, queue, timeout = await self._call(method, request, context)
        try:
            while True:
                frame = await self._next(queue, timeout)
                if frame.get("end"):
                    return
                result = frame.get("result")
                if not isinstance(result, dict):
                    raise A2AClientError(f"invalid {method} event: no result object")
                yield json_format.ParseDict(result, pb.StreamResponse(), ignore_unknown_fields=True)
        finally:
            self._waiting.pop(rid, None)

    async def send_message(
        self, request: pb.SendMessageRequest, *, context: ClientCallContext | None = None
    ) -> pb.SendMessageResponse:
        return await self._unary("SendMessage", request, pb.SendMessageResponse(), context)  # type: ignore[no-any-return]

    async def send_message_streaming(
        self, request: pb.SendMessageRequest, *, context: ClientCallContext | None = None
    ) -> AsyncGenerator[pb.StreamResponse]:
        async for event in self._stream("SendStreamingMessage", request, context):
            yield event

    async def get_task(
        self, request: pb.GetTaskRequest, *, context: ClientCallContext | None = None
    ) -> pb.Task:
        return await self._unary("GetTask", request, pb.Task(), context)  # type: ignore[no-any-return]

    async def list_tasks(
        self, request: pb.ListTasksRequest, *, context: ClientCallContext | None = None
    ) -> pb.ListTasksResponse:
        return await self._unary("ListTasks", request, pb.ListTasksResponse(), context)  # type: ignore[no-any-return]

    async def cancel_task(
        self, request: pb.CancelTaskRequest, *, context: ClientCallContext | None = None
    ) -> pb.Task:
        return await self._unary("CancelTask", request, pb.Task(), context)  # type: ignore[no-any-return]

    async def create_task_push_notification_config(
        self, request: pb.TaskPushNotificationConfig, *, context: ClientCallContext | None = None
    ) -> pb.TaskPushNotificationConfig:
        return await self._unary(  # type: ignore[no-any-return]
            "CreateTaskPushNotificationConfig", request, pb.TaskPushNotificationConfig(), context
        )

    async def get_task_push_notification_config(
        self,
        request: pb.GetTaskPushNotificationConfigRequest,
        *,
        context: ClientCallContext | None = None,
    ) -> pb.TaskPushNotificationConfig:
        return await self._unary(  # type: ignore[no-any-return]
            "GetTaskPushNotificationConfig", request, pb.TaskPushNotificationConfig(), context
        )

    async def list_task_push_notification_configs(
        self,
        request: pb.ListTaskPushNotificationConfigsRequest,
        *,
        context: ClientCallContext | None = None,
    ) -> pb.ListTaskPushNotificationConfigsResponse:
        return await self._unary(  # type: ignore[no-any-return]
            "ListTaskPushNotificationConfigs",
            request,
            pb.ListTaskPushNotificationConfigsResponse(),
            context,
        )

    async def delete_task_push_notification_config(
        self,
        request: pb.DeleteTaskPushNotificationConfigRequest,
        *,
        context: ClientCallContext | None = None,
    ) -> None:
        await self._unary("DeleteTaskPushNotificationConfig", request, Empty(), context)

    async def subscribe(
        self, request: pb.SubscribeToTaskRequest, *, context: ClientCallContext | None = None
    ) -> AsyncGenerator[pb.StreamResponse]:
        async for event in self._stream("SubscribeToTask", request, context):
            yield event

    async def get_extended_agent_card(
        self, request: pb.GetExtendedAgentCardRequest, *, context: ClientCallContext | None = None
    ) -> pb.AgentCard:
        return await self._unary("GetExtendedAgentCard", request, pb.AgentCard(), context)  # type: ignore[no-any-return]

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            self._pump = None


def _error(error: object) -> Exception:
    if not isinstance(error, dict):
        return A2AClientError(f"invalid JSON-RPC error: {error!r}")
    message = str(error.get("message", "error"))
    kind = _CODE_TO_ERROR.get(error.get("code"))  # type: ignore[arg-type]
    return kind(message) if kind is not None else A2AClientError(message)


def register_svc_transport(
    factory: ClientFactory, manager: SvcChannelManager, channel: str | None = None
) -> None:
    """Lets ``factory`` create clients for agent cards with an ``SVC`` interface: the
    channel is the interface url after ``svc:`` unless ``channel`` is given. The
    agent must already be in that channel (an invite token, for example)."""

    def produce(card: pb.AgentCard, url: str, config: ClientConfig) -> ClientTransport:
        name = channel or url.removeprefix("svc:")
        return SvcA2AClientTransport(manager, name)

    factory.register(PROTOCOL_BINDING, produce)


# -- server ----------------------------------------------------------------------------


class SvcUser(User):
    """The caller of a request that came over a channel: its credential, verified by
    MLS, names its account and identity, so it is an authenticated user.
    ``user_name`` is ``identity@account``; ``agent`` is the :class:`AgentId`."""

    def __init__(self, agent: AgentId) -> None:
        self.agent = agent

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return str(self.agent)


def _task_or_missing(result: pb.Task | None) -> Proto:
    if result is None:
        raise a2a_errors.TaskNotFoundError()
    return result


def _send_result(result: pb.Task | pb.Message) -> Proto:
    if isinstance(result, pb.Task):
        return pb.SendMessageResponse(task=result)
    return pb.SendMessageResponse(message=result)


def _same(result: Proto) -> Proto:
    return result


def _empty(result: None) -> Proto:
    return Empty()


_UNARY: dict[str, tuple[str, type[Proto], Callable[[Any], Proto]]] = {
    "SendMessage": ("on_message_send", pb.SendMessageRequest, _send_result),
    "GetTask": ("on_get_task", pb.GetTaskRequest, _task_or_missing),
    "ListTasks": ("on_list_tasks", pb.ListTasksRequest, _same),
    "CancelTask": ("on_cancel_task", pb.CancelTaskRequest, _task_or_missing),
    "CreateTaskPushNotificationConfig": (
        "on_create_task_push_notification_config",
        pb.TaskPushNotificationConfig,
        _same,
    ),
    "GetTaskPushNotificationConfig": (
        "on_get_task_push_notification_config",
        pb.GetTaskPushNotificationConfigRequest,
        _same,
    ),
    "ListTaskPushNotificationConfigs": (
        "on_list_task_push_notification_configs",
        pb.ListTaskPushNotificationConfigsRequest,
        _same,
    ),
    "DeleteTaskPushNotificationConfig": (
        "on_delete_task_push_notification_config",
        pb.DeleteTaskPushNotificationConfigRequest,
        _empty,
    ),
    "GetExtendedAgentCard": ("on_get_extended_agent_card", pb.GetExtendedAgentCardRequest, _same),
}
_STREAMING: dict[str, tuple[str, type[Proto]]] = {
    "SendStreamingMessage": ("on_message_send_stream", pb.SendMessageRequest),
    "SubscribeToTask": ("on_subscribe_to_task", pb.SubscribeToTaskRequest),
}


def _error_frame(rid: object, error: Exception) -> dict[str, Any]:
    if isinstance(error, a2a_errors.A2AError):
        code = a2a_errors.JSON_RPC_ERROR_CODE_MAP.get(type(error), -32603)
        message = str(error)
    else:
        code, message = -32603, "internal error"
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


class SvcA2AServer:
    """Answers A2A requests that arrive over channels with an a2a ``RequestHandler``."""

    def __init__(self, handler: RequestHandler, manager: SvcChannelManager) -> None:
        self.handler = handler
        self.manager = manager

    async def serve(self, channel: str) -> None:
        """Serves requests on ``channel`` until cancelled, or until this agent leaves
        or is removed from it; each request runs concurrently."""
        reader = EnvelopeReader(self.manager, check_channel_name(channel), _is_rpc)
        async with anyio.create_task_group() as tg:
            while True:
                try:
                    message, envelope = await reader.next()
                except ChannelClosedError as exc:
                    log.info("no longer serving %s: %s", channel, exc)
                    return
                sender = message.sender
                tg.start_soon(self._answer, channel, sender, envelope.payload)

    async def _answer(self, channel: str, sender: AgentId, payload: bytes) -> None:
        try:
            await self._answer_one(channel, sender, payload)
        except (ChannelClosedError, TransportError) as exc:  # the answer cannot go out
            log.warning("A2A answer on %s not sent: %s", channel, exc)

    async def _answer_one(self, channel: str, sender: AgentId, payload: bytes) -> None:
        try:
            frame = json.loads(payload)
        except (ValueError, RecursionError):  # not JSON, or nested too deeply
            await _send(self.manager, channel, _error_frame(None, a2a_errors.JSONParseError()))
            return
        if not isinstance(frame, dict) or "method" not in frame:
            if not isinstance(frame, dict) or ("result" not in frame and "error" not in frame):
                error = a2a_errors.InvalidRequestError()
                await _send(self.manager, channel, _error_frame(None, error))
            return  # an answer: for a client on this channel, not for us
        rid = frame.get("id")
        context = ServerCallContext(user=SvcUser(sender))
        context.state["method"] = frame["method"]
        try:
            if frame["method"] in _STREAMING:
                await self._stream(channel, rid, frame, context)
                return
            result = await self._unary(frame, context)
            answer = {"jsonrpc": "2.0", "id": rid, "result": result}
        except Exception as exc:
            if not isinstance(exc, a2a_errors.A2AError):
                log.exception("A2A request %s on %s failed", frame.get("method"), channel)
            answer = _error_frame(rid, exc)
        await _send(self.manager, channel, answer)

    @staticmethod
    def _params(frame: dict[str, Any], kind: type[Proto]) -> Proto:
        params = frame.get("params", {})
        if not isinstance(params, dict):
            raise a2a_errors.InvalidParamsError("params must be an object")
        try:
            return json_format.ParseDict(params, kind())
        except json_format.ParseError as exc:
            raise a2a_errors.InvalidParamsError(str(exc)) from None

    async def _unary(self, frame: dict[str, Any], context: ServerCallContext) -> dict[str, Any]:
        method = frame["method"]
        if method not in _UNARY:
            raise a2a_errors.MethodNotFoundError(f"method {method!r} is not supported")
        name, kind, wrap = _UNARY[method]
        result = await getattr(self.handler, name)(self._params(frame, kind), context)
        answer: dict[str, Any] = json_format.MessageToDict(wrap(result))
        return answer

    async def _stream(
        self, channel: str, rid: object, frame: dict[str, Any], context: ServerCallContext
    ) -> None:
        name, kind = _STREAMING[frame["method"]]
        events = getattr(self.handler, name)(self._params(frame, kind), context)
        async for event in events:
            result = json_format.MessageToDict(to_stream_response(event))
            await _send(self.manager, channel, {"jsonrpc": "2.0", "id": rid, "result": result})
        await _send(self.manager, channel, {"jsonrpc": "2.0", "id": rid, "end": True})
