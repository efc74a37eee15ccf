"""The relay's transport: the native extension's HTTP/2 gRPC server (``RelayServer``,
native/src/transport/server.rs), driven from the relay's event loop.

The server takes connections, runs HTTP/2 and gRPC's framing and the health service on
threads of its own, and moves frames as bytes (read one at a time: ``frames``). One wake
fd serves every stream: when it is readable, :meth:`Transport._poll` takes all that
happened on any stream — new streams, frames, ends, room to write again — in one call,
and hands each stream's part to its :class:`ClientStream`, which :meth:`Relay.connect`
reads and writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, NoReturn

from svc_sdk.protocol import Code, RelayServer, ServerStream

from .frames import Frame, Received, parse_frame

if TYPE_CHECKING:
    from .service import Relay

log = logging.getLogger("svc_server.relay")

QUEUED, FULL, ENDED = 0, 1, 2  # what ServerStream.write did
# Frames one stream's reader handles before it lets the loop turn: one poll can hand over
# a megabyte of tiny frames, and other streams must not wait for all of them.
FAIR_SHARE = 64
OK = Code.OK
CANCELLED = Code.CANCELLED


class Aborted(Exception):
    """Raised by :meth:`ClientStream.abort` once the stream's status is set: it ends the
    handler, as ``context.abort`` does in grpc.aio."""


class ClientStream:
    """One client's stream, as :meth:`Relay.connect` uses it: its metadata, the frames it
    sends (:meth:`requests`), and the frames written to it. Lives on the relay's loop."""

    def __init__(self, stream: ServerStream) -> None:
        self._stream = stream
        self.id = stream.id
        self._frames: deque[Received] = deque()
        self._client_done = False
        self._ended: tuple[int, str] | None = None
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()

    def on_event(
        self,
        frames: Sequence[Received],
        client_done: bool,
        ended: tuple[int, str] | None,
        writable: bool,
    ) -> None:
        self._frames.extend(frames)
        self._client_done = self._client_done or client_done
        if ended is not None and self._ended is None:
            self._ended = ended
        if frames or client_done or ended is not None:
            self._readable.set()
        if writable or ended is not None:
            self._writable.set()

    # -- what Relay.connect calls ------------------------------------------------------

    def invocation_metadata(self) -> Sequence[tuple[str, str]]:
        return self._stream.metadata()

    async def send_initial_metadata(self, _metadata: Sequence[tuple[str, str]] = ()) -> None:
        """Accepts the stream: its response headers go out."""
        self._stream.accept()

    async def write(self, frame: bytes) -> None:
        """Writes an encoded ServerFrame, waiting while the client is not reading. Frames
        for a stream that is over are dropped: its reader ends the session."""
        while True:
            written = self._stream.write(frame)
            if written != FULL:
                return
            # Full: the extension reports room again with the next poll (same thread,
            # so no report can slip between the write and this clear).
            self._writable.clear()
            await self._writable.wait()

    async def abort(self, code: Code, details: str) -> NoReturn:
        self.finish(code, details)
        raise Aborted(details)

    async def requests(self) -> AsyncIterator[Frame | None]:
        """The client's frames, parsed (None for one that does not parse), until it closes
        its side; raises ConnectionError when the stream ends otherwise (cancelled,
        connection lost, a frame over the size limit)."""
        handled = 0
        while True:
            while self._frames:
                yield parse_frame(self._frames.popleft())
                handled += 1
                if handled % FAIR_SHARE == 0:
                    await asyncio.sleep(0)
            # Everything handed over is processed: the extension may read on.
            self._stream.release()
            if self._ended is not None and not self._client_done:
                raise ConnectionError(self._ended[1] or "stream ended")
            if self._client_done or self._ended is not None:
                return
            self._readable.clear()
            await self._readable.wait()

    def finish(self, code: Code, details: str) -> None:
        self._stream.finish(int(code), details)

    def finish_ok(self) -> None:
        """Ends the stream after the handler returned: OK, or the transport's own error
        status when it ended the stream (a frame over the size limit), which the client
        is owed."""
        code, details = self._ended or (OK, "")
        if code in (OK, CANCELLED):
            code, details = OK, ""
        self._stream.finish(code, details)


class Transport:
    """Serves :meth:`Relay.connect` on a :class:`RelayServer`."""

    def __init__(self, relay: Relay, server: RelayServer) -> None:
        self.relay = relay
        self.server = server
        self.port: int = server.port
        self._streams: dict[int, ClientStream] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.server.fileno(), self._poll)
        self.server.set_serving(True)

    async def stop(self, grace: float | None) -> None:
        """Refuses new streams and reports NOT_SERVING; gives the open streams ``grace``
        seconds, ends the rest with UNAVAILABLE, then closes every connection. Once."""
        if self._stopping:
            return
        self._stopping = True
        self.server.set_serving(False)
        self.server.stop(hard=False)  # no new connections; GOAWAY on the open ones
        if grace and self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)
        while self._tasks:  # each ends its stream with UNAVAILABLE (_serve)
            for task in list(self._tasks):
                task.cancel()
            await asyncio.wait(set(self._tasks))
        # Let the connections' threads write those statuses before the sockets close.
        await asyncio.sleep(0.05)
        self.server.stop(hard=True)
        if self._loop is not None:
            self._loop.remove_reader(self.server.fileno())
            self._loop = None

    def _poll(self) -> None:
        accepted, events = self.server.poll()
        for stream in accepted:
            if self._stopping:
                stream.finish(int(Code.UNAVAILABLE), "the relay is shutting down")
                continue
            client = ClientStream(stream)
            self._streams[client.id] = client
            task = asyncio.ensure_future(self._serve(client))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        for stream_id, frames, client_done, ended, writable in events:
            found = self._streams.get(stream_id)
            if found is not None:
                found.on_event(frames, client_done, ended, writable)

    async def _serve(self, client: ClientStream) -> None:
        try:
            await self.relay.connect(client.requests(), client)
        except Aborted:
            pass
        except asyncio.CancelledError:
            client.finish(Code.UNAVAILABLE, "the relay is shutting down")
            raise
        except Exception:
            log.exception("relay stream failed")
            client.finish(Code.INTERNAL, "internal error")
        else:
            client.finish_ok()
        finally:
            self._streams.pop(client.id, None)
