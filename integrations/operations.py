"""The operations every integration exposes, defined once: name, description, argument
schema (pydantic, with descriptions a model can follow) and what they do. The LangChain
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


class SendEnvelopeArgs(ChannelArgs):
    protocol: Literal["raw", "a2a", "mcp", "slim"] = Field(
        "raw", description="Protocol tag of the envelope."
    )
    content_type: str = Field("text/plain", description="MIME type of the message.")
    message: str = Field(description="The payload, as text.")
    metadata: dict[str, Any] | None = Field(None, description="Optional key-value metadata.")


def _create(m: SvcChannelManager, a: ChannelArgs) -> str:
    m.create(a.channel)
    return f"created channel {a.channel}"


def _invite(m: SvcChannelManager, a: InviteArgs) -> str:
    return m.invite(a.channel, a.max_uses, a.ttl)


def _join(m: SvcChannelManager, a: JoinArgs) -> str:
    m.join_with_token(a.channel, a.token, a.timeout)
    return f"joined channel {a.channel}"


def _send(m: SvcChannelManager, a: SendArgs) -> str:
    m.send(a.channel, a.message)
    return f"sent to {a.channel}"


def _receive(m: SvcChannelManager, a: ReceiveArgs) -> str:
    messages = m.receive_messages(a.channel, a.timeout)
    return json.dumps(
        [{"from": x.sender.decode(errors="replace"), "message": _text(x.data)} for x in messages]
    )


def _list(m: SvcChannelManager, a: NoArgs) -> str:
    return json.dumps(m.list_channels())


def _send_envelope(m: SvcChannelManager, a: SendEnvelopeArgs) -> str:
    envelope = Envelope(Protocol(a.protocol), a.content_type, a.message.encode(), a.metadata)
    m.send_envelope(a.channel, envelope)
    return f"sent a {a.protocol} envelope to {a.channel}"


def _receive_envelopes(m: SvcChannelManager, a: ReceiveArgs) -> str:
    return json.dumps(
        [
            {
                "protocol": e.protocol.value,
                "content_type": e.content_type,
                "message": _text(e.payload),
                "metadata": e.metadata,
            }
            for e in m.receive_envelopes(a.channel, a.timeout)
        ]
    )


def _text(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


class OperationError(Exception):
    """A call that failed for a reason its caller can act on; the message says which."""


@dataclass(frozen=True)
class Operation:
    name: str
    description: str
    args: type[_Args]
    run: Callable[[SvcChannelManager, Any], str]

    def __call__(self, manager: SvcChannelManager, arguments: dict[str, Any]) -> str:
        """Validates ``arguments`` and runs. Whatever the caller got wrong (arguments, a
        channel name, an invite token, ...) raises OperationError with the message to
        show the model; anything else is a fault and propagates."""
        try:
            return self.run(manager, self.args.model_validate(arguments))
        except ValidationError as exc:
            raise OperationError(f"invalid arguments: {exc}") from exc
        except (RuntimeError, ValueError, TypeError) as exc:
            # RuntimeError covers the library's errors (SvcError) and MlsError.
            raise OperationError(str(exc)) from exc


OPERATIONS = [
    Operation(
        "svc_create_channel",
        "Create an end-to-end encrypted channel; this agent becomes its first member.",
        ChannelArgs,
        _create,
    ),
    Operation(
        "svc_invite",
        "Create an invite token for a channel this agent is in. Give the token to "
        "another agent so it can join with svc_join.",
        InviteArgs,
        _invite,
    ),
    Operation(
        "svc_join",
        "Join a channel with an invite token another agent gave you.",
        JoinArgs,
        _join,
    ),
    Operation(
        "svc_send",
        "Send an encrypted text message to every member of a channel.",
        SendArgs,
        _send,
    ),
    Operation(
        "svc_receive",
        "Receive the messages waiting on a channel (JSON list of {from, message}); "
        "waits up to timeout seconds when none is waiting.",
        ReceiveArgs,
        _receive,
    ),
    Operation(
        "svc_list_channels",
        "List the channels this agent is in (JSON list of names).",
        NoArgs,
        _list,
    ),
    Operation(
        "svc_send_envelope",
        "Send a protocol-tagged message (raw, a2a, mcp or slim) with a content type.",
        SendEnvelopeArgs,
        _send_envelope,
    ),
    Operation(
        "svc_receive_envelopes",
        "Receive waiting messages as envelopes (JSON list of {protocol, content_type, "
        "message, metadata}); waits up to timeout seconds when none is waiting.",
        ReceiveArgs,
        _receive_envelopes,
    ),
]
