"""The relay protocol as the client writes it (proto/relay.proto): the requests a
``ClientFrame`` carries, their encoding, where a relay address points, and the errors of
a Reply or a stream. No event loop and no thread here: the client's relay link
(``relay_link.py``, threads) and the asyncio client (``relay_client.py``) both build on it.

    >>> client_frame(pb.Unsubscribe(channel="acme/ns/svc"), 7).request_id
    7
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from google.protobuf import message_factory

from svc_sdk import credentials
from svc_sdk._codes import Code as Code  # re-exported: the name callers know
from svc_sdk._native import RelayChannel
from svc_sdk._relay_pb import relay_pb2 as pb

log = logging.getLogger("svc_sdk.relay")

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
    """``http://host:port`` or ``host:port`` → ``host:port``."""
    for scheme in ("http://", "grpc://", "https://", "grpcs://"):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme) :].rstrip("/")
    return endpoint.rstrip("/")


def is_tls(endpoint: str) -> bool:
    return endpoint.startswith(("https://", "grpcs://"))


#: The largest frame the client writes; the native stream refuses more (MAX_SEND in
#: native/src/transport/), and so does the relay.
MAX_FRAME = 16 * 1024 * 1024


def encode(request: Request, request_id: int) -> bytes:
    """``request`` framed and encoded; ValueError over :data:`MAX_FRAME`."""
    data: bytes = client_frame(request, request_id).SerializeToString()
    if len(data) > MAX_FRAME:
        # Refused here, not by the stream: a frame over the limit would end the stream,
        # and the request would fail again on every reconnect.
        raise ValueError(f"relay frame of {len(data):,} bytes is over the {MAX_FRAME:,} limit")
    return data


def code_name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return str(code)


def open_channel(
    endpoint: str,
    *,
    keepalive: float = 30.0,
    keepalive_timeout: float = 10.0,
) -> RelayChannel:
    """An HTTP/2 connection to the relay, made on first use: TLS for ``https://`` (roots
    from SVC_TLS_CA_FILE, else the system's), plaintext for ``http://`` and bare
    ``host:port``. Several :class:`RelayConnection` may share one."""
    ca = credentials.tls_ca_file() if is_tls(endpoint) else None
    return RelayChannel(
        endpoint,
        Path(ca).read_bytes() if ca else None,
        keepalive=keepalive,
        keepalive_timeout=keepalive_timeout,
    )


class RelayError(Exception):
    """A Reply with a non-OK code."""

    def __init__(self, reply: pb.Reply) -> None:
        super().__init__(f"{code_name(reply.code)}: {reply.message}")
        self.reply = reply
        self.code = reply.code


class StreamError(ConnectionError):
    """The relay refused or ended the stream with a non-OK gRPC status, or the connection
    under it failed (UNAVAILABLE)."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(f"{code_name(code)}: {details}")
        self.status = Code(code) if code in Code._value2member_map_ else Code.UNKNOWN
        self.details = details


class Ended:
    """What :func:`read_drained` found: the stream is over, with ``error`` None for a
    clean end (or a local close), else why."""

    __slots__ = ("error",)

    def __init__(self, error: StreamError | None) -> None:
        self.error = error


def read_drained(
    frames: list[bytes],
    ended: tuple[int, str] | None,
    dispatch: Callable[[pb.ServerFrame], None],
) -> Ended | None:
    """One ``RelayStream.drain()``'s frames and end, read: each frame parsed and handed to
    ``dispatch`` in order. :class:`Ended` if the stream is over — it ended, or a frame could
    not be read or dispatched (that ends it, as INTERNAL) — else None."""
    try:
        for data in frames:
            dispatch(pb.ServerFrame.FromString(data))
    except Exception as exc:
        log.warning("relay stream dropped: %s: %s", type(exc).__name__, exc)
        return Ended(StreamError(Code.INTERNAL, f"unreadable frame: {exc}"))
    if ended is None:
        return None
    code, details = ended
    return Ended(StreamError(code, details) if code != Code.OK else None)
