"""The HTTP/1.1 protocol the account API is served with: uvicorn's httptools protocol,
bounded against clients that send too much or too slowly.

uvicorn bounds neither the request head nor the time a client takes to send it: with
httptools (what ``http="auto"`` picks), a 128 MiB header was parsed in 16 s of
quadratic concatenation, and a client trickling one byte every few seconds kept its
connection forever. (h11's ``h11_max_incomplete_event_size`` applies only to the h11
protocol, answers 400 rather than 431, and h11 counts no header lines and times
nothing.) This subclass adds, per connection:

- a cap on the request head (request line and header fields, in bytes received): the
  parser is never fed more than that before the head is complete, so its cost stays
  linear and small whatever the client sends;
- a cap on the number of header fields;
- a deadline for the head (from the connection, or from a request's first byte, to
  the end of its headers) and one for the body (from the end of the headers to the
  end of the body).

These rejections happen below ASGI, before the application has seen the request. The
head limits answer 431, and a head that times out with part of a request received
answers 408, each as an RFC 9457 problem (``application/problem+json``, written here,
not by FastAPI) on a connection then closed. A connection idle before its first byte,
or a body that times out (the application is already reading it), is closed without an
answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config import Settings

PROBLEM_JSON = b"application/problem+json"

# After a rejection the connection reads and discards what the client is still sending,
# for at most this long and this much, so that a client that sends its whole request
# before reading sees the answer instead of a reset (lingering close).
LINGER_SECONDS = 1.0
LINGER_BYTES = 64 * 1024


@dataclass(frozen=True)
class HttpLimits:
    max_head_bytes: int
    max_header_count: int
    head_timeout: float
    body_timeout: float

    @classmethod
    def of(cls, settings: Settings) -> HttpLimits:
        return cls(
            settings.max_header_bytes,
            settings.max_header_count,
            settings.header_timeout_seconds,
            settings.body_timeout_seconds,
        )


class _Rejected(Exception):
    def __init__(self, status: int, slug: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.detail = detail


def problem_bytes(
    status: int, slug: str, detail: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> bytes:
    """A complete HTTP/1.1 response carrying an RFC 9457 problem, closing the connection;
    ``headers`` first (uvicorn's ``server`` and ``date``)."""
    body = json.dumps(
        {
            "type": f"urn:svc:problem:{slug}",
            "title": HTTPStatus(status).phrase,
            "status": status,
            "detail": detail,
        }
    ).encode()
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    lines += [name + b": " + value for name, value in headers]
    lines += [
        b"content-type: " + PROBLEM_JSON,
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head capped and both halves of a request
    timed. ``limits`` is set on the subclass ``bounded_protocol`` makes."""

    limits: HttpLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the next bytes belong to a request head
        self._head_bytes = 0  # bytes of the current head fed to the parser
        self._deadline: asyncio.TimerHandle | None = None
        self._lingering = -1  # bytes discarded since a rejection; -1: none yet

    # -- connection ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.head_timeout, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering >= 0:
            self._lingering += len(data)
            if self._lingering > LINGER_BYTES:
                self.transport.abort()
            return
        self._unset_keepalive_if_required()
        try:
            while data:
                if self._in_head:
                    # Never more than the cap into the parser before the head ends.
                    room = self.limits.max_head_bytes - self._head_bytes
                    piece, data = data[:room], data[room:]
                    self._head_bytes += len(piece)
                    self.parser.feed_data(piece)
                    if self._in_head and self._head_bytes >= self.limits.max_head_bytes:
                        raise _Rejected(
                            431,
                            "header-too-large",
                            f"request head exceeds {self.limits.max_head_bytes} bytes",
                        )
                else:
                    self.parser.feed_data(data)
                    data = b""
                if self.transport.is_closing():
                    return
            # Timers only for what this data left incomplete: a request that arrives
            # whole costs none.
            if self._deadline is None:
                if not self._in_head:
                    self._arm(self.limits.body_timeout, self._body_timed_out)
                elif self._head_bytes:
                    self._arm(self.limits.head_timeout, self._head_timed_out)
        except _Rejected as exc:
            self._reject(exc)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _Rejected):
                self._reject(exc.__context__)
            else:
                self._bad_request()
        except httptools.HttpParserError:
            self._bad_request()
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    # -- parser callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        # Per field, so that a head of thousands of tiny fields stops at the limit
        # rather than costing a callback for each up to the byte cap.
        if len(self.headers) >= self.limits.max_header_count:
            raise _Rejected(
                431,
                "too-many-headers",
                f"request has more than {self.limits.max_header_count} header fields",
            )
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        self._disarm()
        super().on_message_complete()

    # -- deadlines and rejections -------------------------------------------------------

    def _arm(self, seconds: float, then: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, then)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._head_bytes and self._idle():
            detail = f"request head not received within {self.limits.head_timeout:g} s"
            self._reject(_Rejected(408, "request-timeout", detail))
        else:
            self.transport.close()

    def _body_timed_out(self) -> None:
        # The application is reading the body; it sees a disconnect.
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def _idle(self) -> bool:
        """No response of an earlier (pipelined) request is being written."""
        return self.cycle is None or self.cycle.response_complete

    def _reject(self, exc: _Rejected) -> None:
        self._disarm()
        self.logger.info("request rejected: %s", exc.detail)
        if self.transport.is_closing():
            return
        if not self._idle():
            self.transport.close()
            return
        headers = self.server_state.default_headers
        self.transport.write(problem_bytes(exc.status, exc.slug, exc.detail, headers))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        # Answer, half-close, and discard what is still coming until the client closes.
        self.transport.write_eof()
        self._lingering = 0
        self._deadline = self.loop.call_later(LINGER_SECONDS, self.transport.abort)

    def _bad_request(self) -> None:
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)


def bounded_protocol(settings: Settings) -> type[asyncio.Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, with ``settings``' limits."""
    limits = HttpLimits.of(settings)
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), {"limits": limits})
