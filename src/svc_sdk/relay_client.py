"""A low-level asyncio client of the relay protocol (proto/relay.proto): one stream,
request/reply matching by request_id, and every other frame handed to a callback, or put
in queues of deliveries and Welcomes for code that drives the protocol by hand.

The high-level ``SvcClient`` builds on this; benchmarks and tests use it directly.

A request is one of the messages a ``ClientFrame`` carries (:data:`Request`); every layer
above passes it on as it is, and :meth:`RelayConnection.send` alone wraps it in a frame.

    >>> async with RelayConnection("127.0.0.1:50051", token, b"agent-a") as relay:
    ...     await relay.request(pb.CreateChannel(channel="acme/ns/svc"))
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

import grpc
from google.protobuf import message_factory

from svc_sdk import credentials
from svc_sdk._relay_pb import relay_pb2 as pb

METHOD = "/svc.relay.v1.Relay/Connect"

#: What a client asks the relay: one of the messages of ``ClientFrame``'s ``kind`` oneof.
#: (Written out for type checkers; tests/client/test_relay_client.py holds it to the oneof.)
Request: TypeAlias = (
    pb.CreateChannel
    | pb.Subscribe
    | pb.Unsubscribe
    | pb.Publish
    | pb.Commit
    | pb.Refresh
    | pb.JoinRequest
)

# The oneof field of each request type, read from the descriptor so that the proto is
# the one place that says which message goes in which field.
_FIELD: dict[type, str] = {
    message_factory.GetMessageClass(field.message_type): field.name
    for field in pb.ClientFrame.DESCRIPTOR.oneofs_by_name["kind"].fields
}


def client_frame(request: Request, request_id: int) -> pb.ClientFrame:
    """The ``ClientFrame`` carrying ``request`` (copied into the oneof field of its
    type), numbered ``request_id``. TypeError for a message that is not a request.

    >>> client_frame(pb.Unsubscribe(channel="acme/ns/svc"), 7).WhichOneof("kind")
    'unsubscribe'
    """
    try:
        field = _FIELD[type(request)]
    except KeyError:
        raise TypeError(
            f"not a relay request: {type(request).__name__} (expected one of "
            f"{', '.join(t.__name__ for t in _FIELD)})"
        ) from None
    frame = pb.ClientFrame(request_id=request_id)
    # CopyFrom on the field, not a keyword argument: no dict per frame on the hot path.
    getattr(frame, field).CopyFrom(request)
    return frame


def target_of(endpoint: str) -> str:
    """``http://host:port`` or ``host:port`` → ``host:port`` for grpc."""
    for scheme in ("http://", "grpc://", "https://", "grpcs://"):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme) :].rstrip("/")
    return endpoint.rstrip("/")


def is_tls(endpoint: str) -> bool:
    return endpoint.startswith(("https://", "grpcs://"))


def open_channel(endpoint: str, options: list[tuple[str, Any]]) -> grpc.aio.Channel:
    """A gRPC channel to the relay: TLS for ``https://`` (roots from SVC_TLS_CA_FILE, else
    the system's), plaintext for ``http://`` and bare ``host:port``."""
    if is_tls(endpoint):
        ca = credentials.tls_ca_file()
        roots = Path(ca).read_bytes() if ca else None
        tls = grpc.ssl_channel_credentials(root_certificates=roots)
        return grpc.aio.secure_channel(target_of(endpoint), tls, options=options)
    return grpc.aio.insecure_channel(target_of(endpoint), options=options)


def code_name(code: int) -> str:
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return str(status.name)
    return str(code)


class RelayError(Exception):
    """A Reply with a non-OK code."""

    def __init__(self, reply: pb.Reply) -> None:
        super().__init__(f"{code_name(reply.code)}: {reply.message}")
        self.reply = reply
        self.code = reply.code


class RelayConnection:
    def __init__(
        self,
        endpoint: str,
        token: str,
        identity: bytes,
        *,
        options: list[tuple[str, Any]] | None = None,
        channel: grpc.aio.Channel | None = None,
        on_frame: Callable[[pb.ServerFrame], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.target = target_of(endpoint)
        self.identity = identity
        self._token = token
        self._options = options or [
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ]
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[pb.Reply]] = {}
        self._write_lock = asyncio.Lock()
        # Every frame but a Reply goes to ``on_frame`` (the client's RelayLink dispatches
        # them itself); without one, deliveries and Welcomes are queued here for tests and
        # benchmarks, and lag notices dropped (nothing of theirs resubscribes).
        if on_frame is None:
            self.deliveries: asyncio.Queue[pb.Delivery] = asyncio.Queue()
            self.welcomes: asyncio.Queue[pb.Welcome] = asyncio.Queue()
            on_frame = self._enqueue
        self._on_frame = on_frame
        self.closed: asyncio.Future[grpc.RpcError | None] | None = None
        # A shared channel (several streams over one HTTP/2 connection) stays open on close.
        self._shared = channel
        self._channel: grpc.aio.Channel | None = channel
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RelayConnection:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        self.closed = asyncio.get_running_loop().create_future()
        if self._shared is None:
            self._channel = open_channel(self.endpoint, self._options)
        assert self._channel is not None
        stream = self._channel.stream_stream(
            METHOD,
            request_serializer=pb.ClientFrame.SerializeToString,
            response_deserializer=pb.ServerFrame.FromString,
        )
        self._call = stream(
            metadata=(
                ("authorization", f"Bearer {self._token}"),
                ("svc-identity", self.identity.hex()),
            )
        )
        # The relay sends its initial metadata once it has accepted the stream, and only
        # a status when it refuses it. Waiting for one or the other before the first
        # write keeps a refusal's own status (UNAUTHENTICATED for a bad token): a write
        # racing the refusal fails in gRPC's core and would surface as INTERNAL.
        await self._call.initial_metadata()
        if self._call.done():
            raise grpc.aio.AioRpcError(
                await self._call.code(),
                grpc.aio.Metadata(),
                await self._call.trailing_metadata() or grpc.aio.Metadata(),
                await self._call.details(),
            )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        error: grpc.RpcError | None = None
        try:
            async for frame in self._call:
                kind = frame.WhichOneof("kind")
                if kind == "reply":
                    future = self._pending.pop(frame.reply.request_id, None)
                    if future is not None and not future.done():
                        future.set_result(frame.reply)
                else:
                    self._on_frame(frame)
        except grpc.RpcError as exc:
            error = exc
        except asyncio.CancelledError:
            pass  # close() cancelled the reader; pending requests fail below
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error or ConnectionError("relay stream closed"))
            self._pending.clear()
            if self.closed is not None and not self.closed.done():
                self.closed.set_result(error)

    def _enqueue(self, frame: pb.ServerFrame) -> None:
        kind = frame.WhichOneof("kind")
        if kind == "deliveries":
            for item in frame.deliveries.items:
                self.deliveries.put_nowait(item)
        elif kind == "welcome":
            self.welcomes.put_nowait(frame.welcome)

    async def send(self, request: Request) -> asyncio.Future[pb.Reply]:
        """Writes ``request`` in a frame of its own and returns the future of the relay's
        Reply to it, whatever the Reply's code. The one place a request becomes a frame
        (:func:`client_frame`): the layers above (``Channel``, ``SvcClient``, ``RelayLink``)
        hand the message down as it is. Raises TypeError for a message that is not a
        request, and what the write raised (grpc's error on a broken stream); the future
        fails with the stream's error, or ConnectionError, if the stream ends first.

            >>> replied = await relay.send(pb.Subscribe(channel="acme/ns/svc", after_seq=0))
            >>> reply = await replied  # OK or not: the caller reads reply.code
            >>> reply.code, reply.head_seq
            (0, 12)
        """
        request_id = next(self._ids)
        future: asyncio.Future[pb.Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            # One write at a time, in call order (asyncio.Lock is FIFO): concurrent senders
            # keep the order in which they asked.
            async with self._write_lock:
                await self._call.write(client_frame(request, request_id))
        except BaseException:
            # The caller gets the write's error; a future nobody holds must not fail later
            # ("Future exception was never retrieved" once per lost write).
            self._pending.pop(request_id, None)
            future.cancel()
            raise
        return future

    async def request(
        self, request: Request, *, timeout: float = 30.0, check: bool = True
    ) -> pb.Reply:
        """``send`` and wait up to ``timeout`` for the Reply; RelayError for a non-OK code
        unless ``check`` is false."""
        reply = await asyncio.wait_for(await self.send(request), timeout)
        if check and reply.code != 0:
            raise RelayError(reply)
        return reply

    async def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._channel is not None and self._shared is None:
            await self._channel.close()
