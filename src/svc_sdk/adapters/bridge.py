"""``ProtocolBridge`` (docs/protocols.md): forwards one protocol's messages from one channel to
another, translated (the mapping is in :mod:`svc_sdk.adapters.content` and
docs/protocols.md).

>>> bridge = ProtocolBridge(manager)                            # doctest: +SKIP
>>> bridge.bridge("acme/a2a/support", "acme/mcp/tools", Protocol.A2A, Protocol.MCP)
>>> bridge.stop()
"""

from __future__ import annotations

import logging
import threading
import time

from svc_sdk.adapters import content
from svc_sdk.adapters._reader import EnvelopeReader
from svc_sdk.envelope import Envelope, Protocol
from svc_sdk.errors import ChannelClosedError, MlsError, TransportError
from svc_sdk.manager import SvcChannelManager

log = logging.getLogger("svc_sdk.bridge")

POLL = 0.2  # how often a bridge thread looks at the stop flag: stop() takes at most this


class ProtocolBridge:
    """Bridges run one thread each until :meth:`stop`. A malformed message is logged
    and skipped; messages of other protocols are left on the source channel."""

    def __init__(self, manager: SvcChannelManager) -> None:
        self.manager = manager
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: Messages forwarded and skipped, by bridge name ("source->target").
        self.forwarded: dict[str, int] = {}
        self.skipped: dict[str, int] = {}

    def bridge(
        self,
        source: str,
        target: str,
        source_protocol: Protocol,
        target_protocol: Protocol,
    ) -> None:
        """Starts forwarding ``source_protocol`` messages from channel ``source`` to
        channel ``target`` as ``target_protocol`` messages."""
        for protocol in (source_protocol, target_protocol):
            if protocol not in content.READERS:
                raise ValueError(f"the bridge translates A2A, MCP and SLIM, not {protocol!r}")
        if source_protocol is target_protocol:
            raise ValueError("source_protocol and target_protocol are the same")
        if source == target:
            raise ValueError("source and target are the same channel")
        for channel in (source, target):
            self.manager._channel(channel)  # raises unless this agent is in it
        if self._stop.is_set():
            raise ChannelClosedError("this bridge was stopped")
        name = f"{source}->{target}"
        self.forwarded.setdefault(name, 0)
        self.skipped.setdefault(name, 0)

        def wanted(envelope: Envelope) -> bool:
            return content.carries(source_protocol, envelope)

        reader = EnvelopeReader(self.manager, source, wanted)
        thread = threading.Thread(
            target=self._run,
            args=(reader, target, target_protocol, name),
            name=f"svc-bridge-{name}",
            daemon=True,
        )
        self._threads.append(thread)
        thread.start()

    def _run(self, reader: EnvelopeReader, target: str, protocol: Protocol, name: str) -> None:
        while not self._stop.is_set():
            try:
                items = reader.receive(POLL)
            except ChannelClosedError as exc:
                log.warning("bridge %s ends: %s", name, exc)
                return
            except Exception:  # a bridge outlives one bad moment of its channel
                log.exception("bridge %s: receive failed", name)
                self._stop.wait(POLL)
                continue
            for message, envelope in items:
                try:
                    translated = content.translate(envelope, protocol)
                except Exception as exc:  # hostile input must not end the bridge
                    self.skipped[name] += 1
                    log.warning("bridge %s: skipped seq %d: %s", name, message.seq, exc)
                    continue
                try:
                    self._forward(target, translated, name)
                except ChannelClosedError as exc:
                    log.warning("bridge %s ends: %s", name, exc)
                    return

    def _forward(self, target: str, envelope: Envelope, name: str) -> None:
        while not self._stop.is_set():
            try:
                self.manager.send_envelope(target, envelope)
            except TransportError as exc:  # the client reconnects: retry, keeping the order
                log.warning("bridge %s: send failed (%s), retrying", name, exc)
                self._stop.wait(POLL)
                continue
            except (ValueError, TypeError, MlsError) as exc:  # this message cannot go
                self.skipped[name] += 1
                log.warning("bridge %s: translated message not sent: %s", name, exc)
                return
            self.forwarded[name] += 1
            return

    def stop(self) -> None:
        """Stops every bridge thread (within a second). Idempotent."""
        self._stop.set()
        deadline = time.monotonic() + 1.0
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
