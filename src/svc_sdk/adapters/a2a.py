"""A2A over encrypted channels (docs/protocols.md; ``pip install 'svc-sdk[a2a]'``).

Each A2A context is a channel named ``org/a2a/{context_id}``; messages are real
``a2a.types.Message`` values in A2A's JSON form, in A2A envelopes.

>>> adapter = SvcA2AAdapter(manager, "planner")                  # doctest: +SKIP
>>> adapter.create_context("trip-42")
>>> adapter.send_message("trip-42", [{"type": "text", "text": "book a train"}])
>>> card = with_svc_extension(card, adapter)        # advertise it on the agent card
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from svc_sdk.adapters._reader import Readers
from svc_sdk.adapters.content import (
    A2A_MESSAGE_TYPE,
    a2a_message,
    a2a_to_dict,
    decode_a2a,
    encode_a2a,
)
from svc_sdk.envelope import Envelope, Protocol
from svc_sdk.extras import require
from svc_sdk.manager import SvcChannelManager
from svc_sdk.names import is_valid_channel_name

if TYPE_CHECKING:
    from a2a.types import AgentCard

#: The A2A extension URI under which agent cards advertise svc channels.
EXTENSION_URI = "https://svc.dev/a2a/extensions/encrypted-channels/v1"
#: The protocol binding of svc in an agent card's ``supported_interfaces``.
PROTOCOL_BINDING = "SVC"
CHANNEL_PREFIX = "org/a2a/"


def _is_a2a_message(envelope: Envelope) -> bool:
    return envelope.protocol is Protocol.A2A and envelope.content_type == A2A_MESSAGE_TYPE


class SvcA2AAdapter:
    """A2A messages in contexts that are encrypted channels."""

    def __init__(self, manager: SvcChannelManager, agent_id: str) -> None:
        require("a2a.types", "a2a", "SvcA2AAdapter")
        if not isinstance(agent_id, str) or not agent_id:
            raise ValueError("agent_id must be a non-empty str")
        self.manager = manager
        self.agent_id = agent_id
        self._readers = Readers(manager, _is_a2a_message)

    @staticmethod
    def channel_name(context_id: str) -> str:
        """The channel of an A2A context: ``org/a2a/{context_id}``."""
        return CHANNEL_PREFIX + context_id

    def create_context(self, context_id: str) -> None:
        """Creates the context's channel with this agent as its only member."""
        self.manager.create(self.channel_name(context_id))

    def join_context(self, context_id: str, welcome: bytes) -> None:
        """Joins a context with the MLS Welcome a member's ``add_member`` returned."""
        self.manager.join(self.channel_name(context_id), welcome)

    def send_message(
        self,
        context_id: str,
        parts: list[dict[str, Any]],
        *,
        role: str = "agent",
        task_id: str = "",
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Sends an A2A message to everyone in the context; returns its messageId.

        ``parts`` are dicts with ``type`` and a payload field: ``{"type": "text", "text":
        ...}``, ``{"type": "data", "data": {...}}``, or ``{"type": "file", "file":
        {"bytes": base64, "name": ..., "mimeType": ...}}`` (or ``"uri"`` for a link)."""
        message = a2a_message(
            parts, context_id=context_id, task_id=task_id, role=role, metadata=metadata
        )
        envelope = Envelope(Protocol.A2A, A2A_MESSAGE_TYPE, encode_a2a(message))
        self.manager.send_envelope(self.channel_name(context_id), envelope)
        return str(message.message_id)

    def receive_messages(self, context_id: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The context's A2A messages, oldest first, as dicts: messageId, contextId,
        role, parts (as sent), taskId/metadata when set, and ``sender``: the
        ``identity@account`` that the sender's verified credential names, which a member
        cannot forge, with ``sender_account`` and ``sender_identity`` apart. Waits up to ``timeout``
        only when none is buffered; a malformed A2A payload is skipped."""
        name = self.channel_name(context_id)
        out = []
        for message, envelope in self._readers[name].receive(timeout):
            try:
                fields = a2a_to_dict(decode_a2a(envelope.payload))
            except ValueError:
                continue
            fields["sender"] = str(message.sender)
            fields["sender_account"] = message.sender.account
            fields["sender_identity"] = message.sender.identity.decode(errors="replace")
            out.append(fields)
        return out

    def contexts(self) -> list[str]:
        """Ids of the A2A contexts this agent is in."""
        return sorted(
            name[len(CHANNEL_PREFIX) :]
            for name in self.manager.list_channels()
            if name.startswith(CHANNEL_PREFIX)
        )

    def agent_card_extension(self) -> dict[str, Any]:
        """Service metadata for an agent card, in the shape of an A2A ``AgentExtension``
        (``uri``, ``description``, ``required``, ``params``), so that
        ``AgentExtension(**adapter.agent_card_extension())`` works. ``params`` holds
        the agent id, the channel prefix, the active contexts and the relay address."""
        return {
            "uri": EXTENSION_URI,
            "description": "End-to-end encrypted (MLS) channels through an svc relay",
            "required": False,
            "params": {
                "agentId": self.agent_id,
                "identity": self.manager.identity.decode(errors="replace"),
                "channelPrefix": CHANNEL_PREFIX,
                "contexts": self.contexts(),
                "relay": self.manager.client.endpoint,
                "protocolBinding": PROTOCOL_BINDING,
            },
        }


def with_svc_extension(
    card: AgentCard, adapter: SvcA2AAdapter, *, channel: str | None = None
) -> AgentCard:
    """A copy of ``card`` that advertises svc: the adapter's extension under
    ``capabilities.extensions`` (replacing an earlier one), and an interface with
    protocol binding ``SVC`` and url ``svc:{channel}``, or ``svc:`` when each caller
    brings its own channel (what the A2A client transport of
    :mod:`svc_sdk.adapters.a2a_rpc` connects to). The SVC interface comes first, the
    card's other interfaces (JSON-RPC, ...) after it in their order: a client that
    has the svc transport prefers it, one without falls back to the next it knows."""
    types = require("a2a.types", "a2a", "with_svc_extension")
    if channel is not None and not is_valid_channel_name(channel):
        raise ValueError(f"invalid channel name: {channel!r}")
    out = types.AgentCard()
    out.CopyFrom(card)
    kept = [e for e in out.capabilities.extensions if e.uri != EXTENSION_URI]
    del out.capabilities.extensions[:]
    out.capabilities.extensions.extend(kept)
    out.capabilities.extensions.append(types.AgentExtension(**adapter.agent_card_extension()))
    others = [i for i in out.supported_interfaces if i.protocol_binding != PROTOCOL_BINDING]
    del out.supported_interfaces[:]
    # A2A clients take the first interface in the card's order that they support.
    out.supported_interfaces.append(
        types.AgentInterface(
            url=f"svc:{channel or ''}", protocol_binding=PROTOCOL_BINDING, protocol_version="1.0"
        )
    )
    out.supported_interfaces.extend(others)
    return out  # type: ignore[no-any-return]


def find_svc_extension(card: AgentCard) -> dict[str, Any] | None:
    """The svc extension's params from an agent card, or None if it has none."""
    json_format = require("google.protobuf.json_format", "a2a", "find_svc_extension")
    for extension in card.capabilities.extensions:
        if extension.uri == EXTENSION_URI:
            return json_format.MessageToDict(extension.params)  # type: ignore[no-any-return]
    return None
