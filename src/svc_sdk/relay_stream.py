"""One relay stream for the client's relay link, read by a thread of its own.

The stream is the native extension's (``svc_sdk._native.RelayStream``: tonic on a tokio
runtime). Its wake fd turns readable when frames arrive; the stream's reading thread
waits on it with the GIL released, takes everything that arrived in one
``drain_events()`` (decoded where it was received, no frame copied into Python),
settles the futures of Replies and hands every other frame to ``on_frame``. Any thread
writes: a request is encoded and queued on the stream from the calling thread.

No event loop: a program that only uses the blocking client imports no asyncio (and so
not ``ssl`` and OpenSSL either), which is a sixth of an idle agent's memory. The asyncio
client that tests and benchmarks use, :class:`svc_sdk.relay_client.RelayConnection`, reads
the same stream from a loop.

    >>> conn = StreamConnection(endpoint, token, b"agent-a", on_frame=print)
    >>> conn.open(timeout=5)
    >>> reply = conn.send(Refresh(token=token)).result(timeout=10)
"""

from __future__ import annotations

import concurrent.futures
import itertools
import select
import threading
from collections.abc import Callable

from svc_sdk._native import RelayStream
from svc_sdk.relay_frames import (
    Event,
    Reply,
    Request,
    StreamError,
    encode,
    event,
    open_channel,
    read_drained,
)

# How long the reading thread sleeps in one wait when nothing arrives: only how soon it
# sees a close() that raced its wait (close() ends the stream, which wakes it anyway).
_POLL_MS = 1000


class StreamConnection:
    """One relay stream with its own HTTP/2 connection. Thread-safe."""

    def __init__(
        self,
        endpoint: str,
        token: str,
        identity: bytes,
        *,
        on_frame: Callable[[Event], None],
        keepalive: float = 30.0,
        keepalive_timeout: float = 10.0,
    ) -> None:
        self.endpoint = endpoint
        self.identity = identity
        self._token = token
        self._keepalive = (keepalive, keepalive_timeout)
        self._on_frame = on_frame
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, concurrent.futures.Future[Reply]] = {}
        self._stream: RelayStream | None = None
        self._opened = False
        self._news = threading.Event()  # set once opened or ended: what open() waits for
        #: Set once the stream is over; :attr:`end` then says why.
        self.ended = threading.Event()
        #: None for a clean end or a local close, else the stream's error.
        self.end: StreamError | ConnectionError | None = None

    def open(self, timeout: float) -> None:
        """Opens the stream and waits until the relay accepts it: StreamError with the
        relay's status if it refuses (UNAUTHENTICATED for a bad token), or UNAVAILABLE if
        it cannot be reached; TimeoutError if neither comes within ``timeout``."""
        keepalive, keepalive_timeout = self._keepalive
        channel = open_channel(
            self.endpoint, keepalive=keepalive, keepalive_timeout=keepalive_timeout
        )
        stream = RelayStream(
            channel,
            [("authorization", f"Bearer {self._token}"), ("svc-identity", self.identity.hex())],
        )
        with self._lock:
            self._stream = stream
        threading.Thread(
            target=self._read, args=(stream,), name="svc-relay-read", daemon=True
        ).start()
        self._news.wait(timeout)
        if self.ended.is_set():
            self.close()
            raise self.end or ConnectionError("relay stream closed")
        if not self._opened:
            self.close()
            raise TimeoutError(f"relay {self.endpoint} did not accept the stream in time")

    def send(self, request: Request) -> concurrent.futures.Future[Reply]:
        """Writes ``request`` in a frame of its own from the calling thread and returns
        the future of the relay's Reply, whatever its code. Frames of one thread leave in
        its call order. TypeError for a message that is not a request, ValueError for a
        frame over the limit, ConnectionError once the stream has ended; the future fails
        with the stream's error, or ConnectionError, if it ends first. A caller that gives
        up on the Reply cancels the future, which forgets the request: a relay that never
        answers costs no memory per request given up."""
        request_id = next(self._ids)
        data = encode(request, request_id)
        future: concurrent.futures.Future[Reply] = concurrent.futures.Future()
        with self._lock:
            stream = self._stream
            if stream is None:
                raise ConnectionError("relay stream closed")
            # Registered before the write: the Reply may be read before write() returns.
            self._pending[request_id] = future
        if not stream.write(data):
            self._forget(request_id)
            raise ConnectionError("relay stream closed")
        future.add_done_callback(lambda done: self._forget_cancelled(done, request_id))
        return future

    @property
    def waiting(self) -> int:
        """How many requests wait for their Reply."""
        with self._lock:
            return len(self._pending)

    def _forget(self, request_id: int) -> None:
        with self._lock:
            self._pending.pop(request_id, None)

    def _forget_cancelled(self, future: concurrent.futures.Future[Reply], request_id: int) -> None:
        if future.cancelled():
            self._forget(request_id)

    def close(self) -> None:
        """Cancels the stream (idempotent); requests still waiting fail with
        ConnectionError."""
        self._finish(None)

    # -- the reading thread ------------------------------------------------------------

    def _read(self, stream: RelayStream) -> None:
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLIN)
        while True:
            with self._lock:
                if self._stream is not stream:
                    return  # closed
            opened, ended, events = stream.drain_events()
            over = read_drained(events, ended, self._dispatch, event)
            if over is not None:
                # Before open() saw the stream accepted, an end is a refusal: open() raises
                # it.
                self._finish(over.error)
                return
            if opened and not self._opened:
                self._opened = True
                self._news.set()
            poller.poll(_POLL_MS)

    def _dispatch(self, frame: Event | None) -> None:
        if isinstance(frame, Reply):
            with self._lock:
                future = self._pending.pop(frame.request_id, None)
            if future is not None:
                _settle(future, frame)
        elif frame is not None:  # None: a kind this client does not know
            self._on_frame(frame)

    def _finish(self, error: StreamError | None) -> None:
        """The stream is over: stop reading it, fail what waits on it, say why."""
        with self._lock:
            stream, self._stream = self._stream, None
            pending, self._pending = self._pending, {}
            if stream is None and self.ended.is_set():
                return
            self.end = error
        if stream is not None:
            stream.close()
        failure = error or ConnectionError("relay stream closed")
        for future in pending.values():
            _settle(future, failure)
        self.ended.set()
        self._news.set()


def _settle(future: concurrent.futures.Future[Reply], outcome: Reply | BaseException) -> None:
    """Settles a waiting request's future; one its caller cancelled meanwhile is left."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except concurrent.futures.InvalidStateError:
        pass
