"""A low-level asyncio client of the relay protocol (proto/relay.proto): one stream,
request/reply matching by request_id, and every other frame handed to a callback, or put
in queues of deliveries and Welcomes for code that drives the protocol by hand.

The stream itself is the native extension's (``svc_sdk._native.RelayStream``: tonic on a
tokio runtime of its own). Requests and frames are the generated protobuf messages
(``svc_sdk.protocol``), as the relay's own code has them — agents speak the same bytes
through ``relay_frames``' native codec, without protobuf; the loop learns of arrivals
through the stream's wake fd (``add_reader``) and takes everything that arrived in one
call, so no Python thread stands between the socket and the loop.

Benchmarks and tests use it to drive the protocol by hand; ``SvcClient`` builds on
``relay_link`` instead.

A request is one of the generated messages a ``ClientFrame`` carries (:data:`Request`);
:meth:`RelayConnection.send` alone wraps it in a frame.

    >>> async with RelayConnection("127.0.0.1:50051", token, b"agent-a") as relay:
    ...     await relay.request(pb.CreateChannel(channel="acme/ns/svc"))
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from collections.abc import Callable
from typing import TypeAlias

from google.protobuf import message_factory

from svc_sdk._native import RelayChannel, RelayStream
from svc_sdk._relay_pb import relay_pb2 as pb

# The protocol's pieces, re-exported here where tests and benchmarks know them.
from svc_sdk.relay_frames import MAX_FRAME as MAX_FRAME
from svc_sdk.relay_frames import Code as Code
from svc_sdk.relay_frames import RelayError as RelayError
from svc_sdk.relay_frames import Reply, read_drained, within_limit
from svc_sdk.relay_frames import StreamError as StreamError
from svc_sdk.relay_frames import code_name as code_name
from svc_sdk.relay_frames import open_channel as open_channel
from svc_sdk.relay_frames import target_of as target_of

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

# A request's Reply, awaited on the loop (``send``) or by another thread (``send_threadsafe``).
_Waiting: TypeAlias = asyncio.Future[pb.Reply] | concurrent.futures.Future[pb.Reply]

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


def encode(request: Request, request_id: int) -> bytes:
    """``request`` framed and encoded; ValueError over :data:`MAX_FRAME`."""
    return within_limit(client_frame(request, request_id).SerializeToString())


def reply_of(reply: pb.Reply) -> Reply:
    """The generated message as the agents' ``Reply`` (which :class:`RelayError` carries),
    read field by field: the tuple has the proto's field names."""
    return Reply(*(getattr(reply, name) for name in Reply._fields))


class RelayConnection:
    """One relay stream. ``channel`` shares an HTTP/2 connection (:func:`open_channel`)
    among streams; without one the stream has its own, closed with it."""

    def __init__(
        self,
        endpoint: str,
        token: str,
        identity: bytes,
        *,
        keepalive: float = 30.0,
        keepalive_timeout: float = 10.0,
        channel: RelayChannel | None = None,
        on_frame: Callable[[pb.ServerFrame], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.target = target_of(endpoint)
        self.identity = identity
        self._token = token
        self._keepalive = (keepalive, keepalive_timeout)
        self._ids = itertools.count(1)
        # Futures of the loop (``send``) and of other threads (``send_threadsafe``), both
        # settled on the loop; a thread adds to it while the loop may be failing them all,
        # so the loop swaps the dict out instead of iterating it in place.
        self._pending: dict[int, _Waiting] = {}
        # Every frame but a Reply goes to ``on_frame`` (the client's RelayLink dispatches
        # them itself); without one, deliveries and Welcomes are queued here for tests and
        # benchmarks, and lag notices dropped (nothing of theirs resubscribes).
        if on_frame is None:
            self.deliveries: asyncio.Queue[pb.Delivery] = asyncio.Queue()
            self.welcomes: asyncio.Queue[pb.Welcome] = asyncio.Queue()
            on_frame = self._enqueue
        self._on_frame = on_frame
        #: Set when the stream ends: None for a clean end or a local close, else why.
        self.closed: asyncio.Future[StreamError | None] | None = None
        self._channel = channel
        self._stream: RelayStream | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opened: asyncio.Future[None] | None = None

    async def __aenter__(self) -> RelayConnection:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Opens the stream and waits until the relay accepts it; StreamError with the
        relay's status if it refuses (UNAUTHENTICATED for a bad token), or UNAVAILABLE if
        it cannot be reached."""
        self._loop = loop = asyncio.get_running_loop()
        self.closed = loop.create_future()
        self._opened = loop.create_future()
        channel = self._channel
        if channel is None:
            keepalive, timeout = self._keepalive
            channel = open_channel(self.endpoint, keepalive=keepalive, keepalive_timeout=timeout)
        self._stream = stream = RelayStream(
            channel,
            [("authorization", f"Bearer {self._token}"), ("svc-identity", self.identity.hex())],
        )
        loop.add_reader(stream.fileno(), self._readable)
        try:
            await self._opened
        except BaseException:
            await self.close()
            raise

    def _readable(self) -> None:
        stream = self._stream
        if stream is None:
            return
        opened, ended, frames = stream.drain()
        over = read_drained(frames, ended, self._dispatch, pb.ServerFrame.FromString)
        if over is not None:
            # Before open() saw the stream accepted, an end is a refusal: open() raises it.
            self._finish(over.error)
        elif opened and self._opened is not None and not self._opened.done():
            self._opened.set_result(None)

    def _dispatch(self, frame: pb.ServerFrame) -> None:
        if frame.WhichOneof("kind") == "reply":
            future = self._pending.pop(frame.reply.request_id, None)
            if future is not None and not future.done():
                _settle(future, frame.reply)
        else:
            self._on_frame(frame)

    def _finish(self, error: StreamError | None) -> None:
        """The stream is over: stop watching it, fail what waits on it, say why."""
        stream, self._stream = self._stream, None
        if stream is not None:
            assert self._loop is not None
            self._loop.remove_reader(stream.fileno())
            stream.close()
        failure = error or ConnectionError("relay stream closed")
        if self._opened is not None and not self._opened.done():
            self._opened.set_exception(failure)
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                _settle(future, failure)
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
        hand the message down as it is. Frames leave in call order. Raises TypeError for
        a message that is not a request, ValueError for a frame over :data:`MAX_FRAME`,
        and ConnectionError once the stream has ended;
        the future fails with the stream's error, or ConnectionError, if it ends first.

            >>> replied = await relay.send(pb.Subscribe(channel="acme/ns/svc", after_seq=0))
            >>> reply = await replied  # OK or not: the caller reads reply.code
            >>> reply.code, reply.head_seq
            (0, 12)
        """
        request_id = next(self._ids)
        data = encode(request, request_id)
        stream = self._stream
        if stream is None or not stream.write(data):
            raise ConnectionError("relay stream closed")
        future: asyncio.Future[pb.Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        future.add_done_callback(lambda done: self._forget_cancelled(done, request_id))
        return future

    def send_threadsafe(self, request: Request) -> concurrent.futures.Future[pb.Reply]:
        """``send`` for a caller in another thread: the frame is written from the calling
        thread at once, with no hop through the loop, and the returned future is settled
        by the loop when the Reply comes (or fails when the stream ends first). Frames of
        one thread leave in its call order. ConnectionError once the stream has ended.

            >>> reply = relay.send_threadsafe(pb.Publish(...)).result(timeout=30)
        """
        request_id = next(self._ids)
        data = encode(request, request_id)
        future: concurrent.futures.Future[pb.Reply] = concurrent.futures.Future()
        # Registered before the write: the Reply may be read before write() returns.
        self._pending[request_id] = future
        stream = self._stream
        if stream is None or not stream.write(data):
            self._pending.pop(request_id, None)
            raise ConnectionError("relay stream closed")
        future.add_done_callback(lambda done: self._forget_cancelled(done, request_id))
        return future

    @property
    def waiting(self) -> int:
        """How many requests wait for their Reply."""
        return len(self._pending)

    def _forget_cancelled(self, future: _Waiting, request_id: int) -> None:
        # A caller that gave up (a cancelled future, a request's timeout) forgets the
        # request: a relay that never answers costs no memory per request given up.
        if future.cancelled():
            self._pending.pop(request_id, None)

    async def request(
        self, request: Request, *, timeout: float = 30.0, check: bool = True
    ) -> pb.Reply:
        """``send`` and wait up to ``timeout`` for the Reply (TimeoutError, and the request
        is forgotten); RelayError for a non-OK code unless ``check`` is false."""
        reply = await asyncio.wait_for(await self.send(request), timeout)
        if check and reply.code != 0:
            raise RelayError(reply_of(reply))
        return reply

    async def close(self) -> None:
        """Cancels the stream (idempotent); requests still waiting fail with
        ConnectionError."""
        if self._stream is not None:
            self._finish(None)


def _settle(
    future: asyncio.Future[pb.Reply] | concurrent.futures.Future[pb.Reply],
    outcome: pb.Reply | BaseException,
) -> None:
    """Settles a waiting request's future; one its thread cancelled meanwhile is left."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except (asyncio.InvalidStateError, concurrent.futures.InvalidStateError):
        pass
