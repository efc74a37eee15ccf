r"""The relay protocol as the client writes it (proto/relay.proto): the requests a
``ClientFrame`` carries and the events a ``ServerFrame`` brings, their encoding, where a
relay address points, and the errors of a Reply or a stream. No event loop and no
thread here: the client's relay link (``relay_link.py``, threads) builds on it.

Frames are encoded and decoded by the native extension (``native/src/frames.rs``, prost
over the proto's field numbers), so an agent loads no protobuf runtime (~5 MiB of its
memory); the relay parses the same bytes with the generated module (``svc_sdk.protocol``).

    >>> Unsubscribe(channel="acme/ns/svc").encode(7)
    b'\x08\x07"\r\n\x0bacme/ns/svc'
    >>> decode(b"\x0a\x04\x08\x07\x20\x0c")  # a ServerFrame: the Reply to request 7
    Reply(request_id=7, code=0, message='', seq=12, epoch=0, head_seq=0, cipher_suite=0)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias, TypeVar

from svc_sdk import _native, credentials
from svc_sdk._codes import Code as Code  # re-exported: the name callers know
from svc_sdk._native import RelayChannel

log = logging.getLogger("svc_sdk.relay")


# -- requests: ClientFrame's kind oneof ------------------------------------------------


class CreateChannel(NamedTuple):
    """Creates ``channel`` from its owner's GroupInfo; without one, asks for the
    channel's head (``head_seq``, ``epoch``)."""

    channel: str
    group_info: bytes = b""

    def encode(self, request_id: int) -> bytes:
        return _native.encode_create(request_id, self.channel, self.group_info)


class Subscribe(NamedTuple):
    """Deliveries of ``channel`` after ``after_seq``, numbered ``subscription``."""

    channel: str
    after_seq: int = 0
    subscription: int = 0

    def encode(self, request_id: int) -> bytes:
        return _native.encode_subscribe(request_id, self.channel, self.after_seq, self.subscription)


class Unsubscribe(NamedTuple):
    channel: str

    def encode(self, request_id: int) -> bytes:
        return _native.encode_unsubscribe(request_id, self.channel)


class Publish(NamedTuple):
    """MLS messages stored in this order; ``message_id``: none, or one id per message."""

    channel: str
    message: Sequence[bytes]
    message_id: Sequence[bytes] = ()

    def encode(self, request_id: int) -> bytes:
        return _native.encode_publish(request_id, self.channel, self.message, self.message_id)


class Commit(NamedTuple):
    """A commit for ``epoch``, with the Welcome of the members it adds."""

    channel: str
    epoch: int
    commit: bytes
    welcome: bytes = b""

    def encode(self, request_id: int) -> bytes:
        return _native.encode_commit(
            request_id, self.channel, self.epoch, self.commit, self.welcome
        )


class Refresh(NamedTuple):
    """Replaces the stream's token."""

    token: str

    def encode(self, request_id: int) -> bytes:
        return _native.encode_refresh(request_id, self.token)


class JoinRequest(NamedTuple):
    """Posts an invite redemption's key package (``join_id``) to ``channel``."""

    channel: str
    join_id: str

    def encode(self, request_id: int) -> bytes:
        return _native.encode_join(request_id, self.channel, self.join_id)


#: What a client asks the relay: one of the messages of ``ClientFrame``'s ``kind`` oneof.
Request: TypeAlias = (
    CreateChannel | Subscribe | Unsubscribe | Publish | Commit | Refresh | JoinRequest
)
_REQUESTS = (CreateChannel, Subscribe, Unsubscribe, Publish, Commit, Refresh, JoinRequest)


# -- events: ServerFrame's kind oneof --------------------------------------------------


class Reply(NamedTuple):
    """The answer to request ``request_id``: ``code`` 0 (OK) or a google.rpc.Code."""

    request_id: int = 0
    code: int = 0
    message: str = ""
    seq: int = 0
    epoch: int = 0
    head_seq: int = 0
    cipher_suite: int = 0


class Delivery(NamedTuple):
    """One stored message of a channel, as a subscription delivers it."""

    channel: str
    seq: int
    message: bytes
    sender: bytes
    handshake: bool
    epoch: int
    subscription: int


class Deliveries(NamedTuple):
    items: list[Delivery]


class Welcome(NamedTuple):
    """This agent was added to ``channel`` by the commit at ``seq``."""

    channel: str
    welcome: bytes
    seq: int
    epoch: int


class Lagged(NamedTuple):
    """A subscription fell too far behind the live stream: resubscribe from the cursor."""

    channel: str


#: What the relay sends: one of the messages of ``ServerFrame``'s ``kind`` oneof.
Event: TypeAlias = Reply | Deliveries | Welcome | Lagged


#: The kind ``RelayStream.drain_events()`` gives a frame that is not a ServerFrame.
MALFORMED = _native.MALFORMED_FRAME


def decode(data: bytes) -> Event | None:
    """The event an encoded ``ServerFrame`` carries; None for a kind this client does
    not know (a newer relay's). ValueError for bytes that are not a ServerFrame."""
    return event(_native.decode_server_frame(data))


def event(decoded: tuple[int, Any]) -> Event | None:
    """The event of one ``(kind, fields)`` pair, as ``_native.decode_server_frame`` and
    ``RelayStream.drain_events()`` give them; None for a kind this client does not know.
    ValueError for the pair ``drain_events()`` gives a malformed frame."""
    kind, fields = decoded
    if kind == 1:
        return Reply._make(fields)
    if kind == 2:
        return Deliveries([Delivery._make(item) for item in fields])
    if kind == 3:
        return Welcome._make(fields)
    if kind == 4:
        return Lagged._make(fields)
    if kind == MALFORMED:
        raise ValueError(fields)
    return None


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
    """``request`` framed and encoded; TypeError for what is not a request, ValueError
    over :data:`MAX_FRAME`."""
    if not isinstance(request, _REQUESTS):
        raise TypeError(
            f"not a relay request: {type(request).__name__} (expected one of "
            f"{', '.join(t.__name__ for t in _REQUESTS)})"
        )
    return within_limit(request.encode(request_id))


def within_limit(data: bytes) -> bytes:
    """An encoded ClientFrame, refused (ValueError) over :data:`MAX_FRAME`."""
    if len(data) > MAX_FRAME:
        # Refused here, not by the stream: a frame over the limit would end the stream,
        # and the request would fail again on every reconnect.
        raise ValueError(f"relay frame of {len(data):,} bytes is over the {MAX_FRAME:,} limit")
    return data


# Codes of a request refused for now, not for good: the relay's store did not answer
# (UNAVAILABLE), or the account spent its budget of refused requests
# (RESOURCE_EXHAUSTED). The client sends such a request again, after a backoff.
RETRY_LATER = frozenset({Code.UNAVAILABLE, Code.RESOURCE_EXHAUSTED})


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

    def __init__(self, reply: Reply) -> None:
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


_Frame = TypeVar("_Frame")
_Parsed = TypeVar("_Parsed")


def read_drained(
    frames: list[_Frame],
    ended: tuple[int, str] | None,
    dispatch: Callable[[_Parsed], None],
    parse: Callable[[_Frame], _Parsed],
) -> Ended | None:
    """One ``RelayStream.drain()``'s frames (or ``drain_events()``'s events) and end,
    read: each parsed and handed to ``dispatch`` in order. :class:`Ended` if the stream
    is over — it ended, or a frame could not be read or dispatched (that ends it, as
    INTERNAL) — else None."""
    try:
        for data in frames:
            dispatch(parse(data))
    except Exception as exc:
        log.warning("relay stream dropped: %s: %s", type(exc).__name__, exc)
        return Ended(StreamError(Code.INTERNAL, f"unreadable frame: {exc}"))
    if ended is None:
        return None
    code, details = ended
    return Ended(StreamError(code, details) if code != Code.OK else None)
