"""The operations every integration exposes, defined once: name, description, argument
schema (pydantic, with descriptions a model can follow), what they do to the world
(:class:`Hints`), the schema of a structured result, and what they do. The LangChain
tools and the MCP tool server are both generated from :data:`OPERATIONS`, so their
names and arguments cannot drift apart.

Each operation is written once, as a coroutine over an :class:`Agent`, and runs two
ways: :meth:`Operation.areply` awaits it on the caller's event loop over an
:class:`~svc_sdk.AsyncSvcChannelManager`, so sending and receiving take no worker thread
(membership changes run in the worker thread aio gives them); :meth:`Operation.reply`
runs the same coroutine to completion at once over a blocking ``SvcChannelManager``
(:class:`Blocking`, whose methods never suspend). Parsing, error mapping and the reply
text are therefore shared by both.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from svc_sdk import AsyncSvcChannelManager, Envelope, SvcChannelManager
from svc_sdk import Protocol as EnvelopeProtocol
from svc_sdk.channel import Message
from svc_sdk.names import PATTERN

CHANNEL_HELP = (
    "Channel name: three parts org/namespace/service, each 1-64 characters of "
    "A-Z a-z 0-9 . _ - (for example acme/support/triage)."
)


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChannelArgs(_Args):
    channel: str = Field(description=CHANNEL_HELP, json_schema_extra={"pattern": PATTERN})


class InviteArgs(ChannelArgs):
    max_uses: int = Field(1, ge=1, le=1000, description="How many agents may join with it.")
    ttl: int = Field(3600, ge=60, le=30 * 86400, description="Seconds until the token expires.")


class JoinArgs(ChannelArgs):
    token: str = Field(description="The invite token (starts with svc_inv_).")
    timeout: float = Field(
        60.0, gt=0, le=600, description="Seconds to wait for a member to add this agent."
    )


class SendArgs(ChannelArgs):
    message: str = Field(description="The text to encrypt and send to every member.")


class ReceiveArgs(ChannelArgs):
    timeout: float = Field(
        5.0, ge=0, le=300, description="Seconds to wait when no message is waiting."
    )


class NoArgs(_Args):
    pass


# -- structured results ------------------------------------------------------------------


class ReceivedMessage(BaseModel):
    sender: str = Field(
        alias="from", description="The sender as identity@account, from its verified credential."
    )
    message: str = Field(description="The text; base64: and the bytes when not UTF-8.")


class Messages(BaseModel):
    messages: list[ReceivedMessage] = Field(description="Oldest first.")


class Channels(BaseModel):
    channels: list[str] = Field(description="Names of the channels this agent is in.")


class ReceivedEnvelope(BaseModel):
    protocol: Literal["raw", "a2a", "mcp", "slim"]
    content_type: str
    message: str = Field(description="The payload; base64: and the bytes when not UTF-8.")
    metadata: dict[str, Any] | None


class Envelopes(BaseModel):
    envelopes: list[ReceivedEnvelope] = Field(description="Oldest first.")


class SendEnvelopeArgs(ChannelArgs):
    protocol: Literal["raw", "a2a", "mcp", "slim"] = Field(
        "raw", description="Protocol tag of the envelope."
    )
    content_type: str = Field("text/plain", description="MIME type of the message.")
    message: str = Field(description="The payload, as text.")
    metadata: dict[str, Any] | None = Field(None, description="Optional key-value metadata.")


class Agent(Protocol):
    """What the operations call: the methods :class:`~svc_sdk.AsyncSvcChannelManager`
    has, awaitable, and :class:`Blocking` mirrors over a blocking manager."""

    def list_channels(self) -> list[str]: ...

    async def create(self, channel_name: str) -> None: ...

    async def invite(self, channel_name: str, max_uses: int = 1, ttl: int = 3600) -> str: ...

    async def join_with_token(
        self, channel_name: str, token: str, timeout: float = 60.0
    ) -> None: ...

    async def send(self, channel_name: str, message: str | bytes) -> None: ...

    async def send_envelope(self, channel_name: str, envelope: Envelope) -> None: ...

    async def receive_messages(self, channel_name: str, timeout: float = 5.0) -> list[Message]: ...

    async def receive_envelopes(
        self, channel_name: str, timeout: float = 5.0
    ) -> list[Envelope]: ...


class Blocking:
    """An :class:`Agent` over a blocking ``SvcChannelManager``: each coroutine method
    makes the blocking call and returns without suspending, so :func:`run_blocking`
    finishes an operation in the calling thread."""

    def __init__(self, manager: SvcChannelManager) -> None:
        self.manager = manager

    def list_channels(self) -> list[str]:
        return self.manager.list_channels()

    async def create(self, channel_name: str) -> None:
        self.manager.create(channel_name)

    async def invite(self, channel_name: str, max_uses: int = 1, ttl: int = 3600) -> str:
        return self.manager.invite(channel_name, max_uses, ttl)

    async def join_with_token(self, channel_name: str, token: str, timeout: float = 60.0) -> None:
        self.manager.join_with_token(channel_name, token, timeout)

    async def send(self, channel_name: str, message: str | bytes) -> None:
        self.manager.send(channel_name, message)

    async def send_envelope(self, channel_name: str, envelope: Envelope) -> None:
        self.manager.send_envelope(channel_name, envelope)

    async def receive_messages(self, channel_name: str, timeout: float = 5.0) -> list[Message]:
        return self.manager.receive_messages(channel_name, timeout)

    async def receive_envelopes(self, channel_name: str, timeout: float = 5.0) -> list[Envelope]:
        return self.manager.receive_envelopes(channel_name, timeout)


T = TypeVar("T")


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine that never suspends (an operation over :class:`Blocking`) to
    its end in this thread, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coroutine.close()
    raise AssertionError("an operation over a blocking manager suspended")


async def _create(m: Agent, a: ChannelArgs) -> Reply:
    await m.create(a.channel)
    return Reply(f"created channel {a.channel}")


async def _invite(m: Agent, a: InviteArgs) -> Reply:
    return Reply(await m.invite(a.channel, a.max_uses, a.ttl))


async def _join(m: Agent, a: JoinArgs) -> Reply:
    # The library returns at once for a channel the agent is in, without looking at the
    # token; saying "joined" then would confirm a token that may be bogus.
    if a.channel in m.list_channels():
        raise OperationError(f"already in channel {a.channel!r}; the invite token was not used")
    await m.join_with_token(a.channel, a.token, a.timeout)
    return Reply(f"joined channel {a.channel}")


async def _send(m: Agent, a: SendArgs) -> Reply:
    await m.send(a.channel, a.message)
    return Reply(f"sent to {a.channel}")


async def _receive(m: Agent, a: ReceiveArgs) -> Reply:
    received = [
        {"from": str(x.sender), "message": _text(x.data)}
        for x in await m.receive_messages(a.channel, a.timeout)
    ]
    return Reply(json.dumps(received), Messages.model_validate({"messages": received}))


async def _list(m: Agent, a: NoArgs) -> Reply:
    channels = m.list_channels()
    return Reply(json.dumps(channels), Channels(channels=channels))


async def _send_envelope(m: Agent, a: SendEnvelopeArgs) -> Reply:
    envelope = Envelope(
        EnvelopeProtocol(a.protocol), a.content_type, a.message.encode(), a.metadata
    )
    await m.send_envelope(a.channel, envelope)
    return Reply(f"sent an envelope ({a.protocol}, {a.content_type}) to {a.channel}")


async def _receive_envelopes(m: Agent, a: ReceiveArgs) -> Reply:
    received = [
        {
            "protocol": e.protocol.value,
            "content_type": e.content_type,
            "message": _text(e.payload),
            "metadata": e.metadata,
        }
        for e in await m.receive_envelopes(a.channel, a.timeout)
    ]
    return Reply(json.dumps(received), Envelopes.model_validate({"envelopes": received}))


def _text(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


class OperationError(Exception):
    """A call that failed for a reason its caller can act on; the message says which."""


@dataclass(frozen=True)
class Reply:
    """What an operation returns: the text a model reads and, for operations with an
    ``output`` model, the same result as that model (MCP's structured content)."""

    text: str
    data: BaseModel | None = None


@dataclass(frozen=True)
class Hints:
    """What an operation does to the world, for hosts deciding what to run unasked (MCP
    tool annotations). Receiving is not read-only: it takes the messages off the agent's
    inbox, so a second call does not return them again; nor destructive, since what it
    takes is in its result."""

    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = True  # other agents, through the relay


@dataclass(frozen=True)
class Operation:
    name: str
    description: str
    args: type[_Args]
    run: Callable[[Agent, Any], Coroutine[Any, Any, Reply]]
    hints: Hints
    output: type[BaseModel] | None = None

    def __call__(self, manager: SvcChannelManager, arguments: dict[str, Any]) -> str:
        """The text of :meth:`reply`."""
        return self.reply(manager, arguments).text

    def parse(self, arguments: dict[str, Any]) -> _Args:
        """The arguments, validated; OperationError naming each wrong one."""
        try:
            return self.args.model_validate(arguments)
        except ValidationError as exc:
            raise OperationError(f"invalid arguments: {describe(exc)}") from exc

    def reply(self, manager: SvcChannelManager, arguments: dict[str, Any]) -> Reply:
        """Validates ``arguments`` and runs, blocking the calling thread. Whatever the
        caller got wrong (arguments, a channel name, an invite token, ...) raises
        OperationError with the message to show the model; anything else is a fault
        and propagates."""
        parsed = self.parse(arguments)
        with _library_errors():
            return run_blocking(self.run(Blocking(manager), parsed))

    async def areply(self, manager: AsyncSvcChannelManager, arguments: dict[str, Any]) -> Reply:
        """:meth:`reply` on the caller's event loop: sending and receiving take no worker
        thread; membership changes run in aio's. A cancelled receive loses no message."""
        parsed = self.parse(arguments)
        with _library_errors():
            return await self.run(manager, parsed)


@contextmanager
def _library_errors() -> Iterator[None]:
    try:
        yield
    except (RuntimeError, ValueError, TypeError) as exc:
        # RuntimeError: every library error (SvcError, MlsError included).
        raise OperationError(str(exc)) from exc


def describe(exc: Exception) -> str:
    """A validation error on one line, as a model reads it best: each wrong argument and
    what is wrong with it, without pydantic's headers and documentation links."""
    if not isinstance(exc, ValidationError):
        return " ".join(str(exc).split())
    problems = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "arguments"
        what = str(error["msg"])
        if error["type"] not in ("missing", "extra_forbidden"):
            given = repr(error["input"])
            what += f" (got {given[:60] + '...' if len(given) > 60 else given})"
        problems.append(" ".join(f"{where}: {what}".split()))
    return "; ".join(problems)


_ADDS = Hints()  # adds to the world (a channel, a message, a token), nothing removed
_ADDS_ONCE = Hints(idempotent=True)  # the same call again changes nothing more
_TAKES = Hints()  # takes messages off the inbox (see Hints)


OPERATIONS = [
    Operation(
        "svc_create_channel",
        "Create an end-to-end encrypted channel; this agent becomes its first member.",
        ChannelArgs,
        _create,
        _ADDS_ONCE,
    ),
    Operation(
        "svc_invite",
        "Create an invite token for a channel this agent is in. Give the token to "
        "another agent so it can join with svc_join.",
        InviteArgs,
        _invite,
        _ADDS,
    ),
    Operation(
        "svc_join",
        "Join a channel with an invite token another agent gave you.",
        JoinArgs,
        _join,
        _ADDS_ONCE,
    ),
    Operation(
        "svc_send",
        "Send an encrypted text message to every member of a channel.",
        SendArgs,
        _send,
        _ADDS,
    ),
    Operation(
        "svc_receive",
        "Receive the messages waiting on a channel (JSON list of {from, message}); "
        "waits up to timeout seconds when none is waiting.",
        ReceiveArgs,
        _receive,
        _TAKES,
        Messages,
    ),
    Operation(
        "svc_list_channels",
        "List the channels this agent is in (JSON list of names).",
        NoArgs,
        _list,
        Hints(read_only=True, idempotent=True, open_world=False),
        Channels,
    ),
    Operation(
        "svc_send_envelope",
        "Send a protocol-tagged message (raw, a2a, mcp or slim) with a content type.",
        SendEnvelopeArgs,
        _send_envelope,
        _ADDS,
    ),
    Operation(
        "svc_receive_envelopes",
        "Receive waiting messages as envelopes (JSON list of {protocol, content_type, "
        "message, metadata}); waits up to timeout seconds when none is waiting.",
        ReceiveArgs,
        _receive_envelopes,
        _TAKES,
        Envelopes,
    ),
]
