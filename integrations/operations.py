"""The operations every integration exposes, defined once: name, description, argument
schema (pydantic, with descriptions a model can follow), what they do to the world
(:class:`Hints`), the schema of a structured result, and what they do. The LangChain
tools and the MCP tool server are both generated from :data:`OPERATIONS`, so their
names and arguments cannot drift apart.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from svc_sdk import Envelope, Protocol, SvcChannelManager
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


def _create(m: SvcChannelManager, a: ChannelArgs) -> Reply:
    m.create(a.channel)
    return Reply(f"created channel {a.channel}")


def _invite(m: SvcChannelManager, a: InviteArgs) -> Reply:
    return Reply(m.invite(a.channel, a.max_uses, a.ttl))


def _join(m: SvcChannelManager, a: JoinArgs) -> Reply:
    # The library returns at once for a channel the agent is in, without looking at the
    # token; saying "joined" then would confirm a token that may be bogus.
    if a.channel in m.list_channels():
        raise OperationError(f"already in channel {a.channel!r}; the invite token was not used")
    m.join_with_token(a.channel, a.token, a.timeout)
    return Reply(f"joined channel {a.channel}")


def _send(m: SvcChannelManager, a: SendArgs) -> Reply:
    m.send(a.channel, a.message)
    return Reply(f"sent to {a.channel}")


def _receive(m: SvcChannelManager, a: ReceiveArgs) -> Reply:
    received = [
        {"from": str(x.sender), "message": _text(x.data)}
        for x in m.receive_messages(a.channel, a.timeout)
    ]
    return Reply(json.dumps(received), Messages.model_validate({"messages": received}))


def _list(m: SvcChannelManager, a: NoArgs) -> Reply:
    channels = m.list_channels()
    return Reply(json.dumps(channels), Channels(channels=channels))


def _send_envelope(m: SvcChannelManager, a: SendEnvelopeArgs) -> Reply:
    envelope = Envelope(Protocol(a.protocol), a.content_type, a.message.encode(), a.metadata)
    m.send_envelope(a.channel, envelope)
    return Reply(f"sent an envelope ({a.protocol}, {a.content_type}) to {a.channel}")


def _receive_envelopes(m: SvcChannelManager, a: ReceiveArgs) -> Reply:
    received = [
        {
            "protocol": e.protocol.value,
            "content_type": e.content_type,
            "message": _text(e.payload),
            "metadata": e.metadata,
        }
        for e in m.receive_envelopes(a.channel, a.timeout)
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
    run: Callable[[SvcChannelManager, Any], Reply]
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
        """Validates ``arguments`` and runs. Whatever the caller got wrong (arguments, a
        channel name, an invite token, ...) raises OperationError with the message to
        show the model; anything else is a fault and propagates."""
        parsed = self.parse(arguments)
        try:
            return self.run(manager, parsed)
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
