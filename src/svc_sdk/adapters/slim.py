"""SLIM-style publish/subscribe over encrypted channels (docs/protocols.md, SLIM).

>>> slim = SLIMAdapter(manager)                                  # doctest: +SKIP
>>> slim.publish("acme/telemetry/gpu", b'{"util": 0.93}', content_type="application/json")
>>> slim.receive("acme/telemetry/gpu", timeout=5.0)
[b'{"util": 0.93}']
"""

from __future__ import annotations

from typing import Any

from svc_sdk.adapters._reader import Readers
from svc_sdk.envelope import Envelope, Protocol
from svc_sdk.manager import SvcChannelManager


def _is_slim(envelope: Envelope) -> bool:
    return envelope.protocol is Protocol.SLIM


class SLIMAdapter:
    """Publishes and receives SLIM-tagged envelopes. Messages of other protocols on the
    same channel are left buffered for their own readers."""

    def __init__(self, manager: SvcChannelManager) -> None:
        self.manager = manager
        self._readers = Readers(manager, _is_slim)

    def publish(
        self,
        destination: str,
        payload: bytes | str,
        content_type: str = "application/octet-stream",
        *,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Encrypts and sends ``payload`` (str is UTF-8) to every member of ``destination``."""
        data = payload.encode() if isinstance(payload, str) else payload
        envelope = Envelope(Protocol.SLIM, content_type, data, metadata)
        self.manager.send_envelope(destination, envelope)

    def subscribe(self, channel: str) -> None:
        """Checks that this agent is in ``channel`` (create, join or join_with_token it
        first). Its manager already listens there and buffers what arrives, so every
        SLIM message from the agent's joining on is there for ``receive``."""
        self.manager._channel(channel)

    def receive(self, channel: str, timeout: float = 5.0) -> list[bytes]:
        """Payloads of the SLIM messages buffered on ``channel``, oldest first; waits up to
        ``timeout`` only when none is buffered."""
        return [envelope.payload for envelope in self.receive_envelopes(channel, timeout)]

    def receive_envelopes(self, channel: str, timeout: float = 5.0) -> list[Envelope]:
        """Like ``receive``, keeping each message's content type and metadata."""
        return [envelope for _, envelope in self._readers[channel].receive(timeout)]
