"""What an application polls to learn, without reading a log, that its agent is stuck.

A failed local write (disk full, I/O error, a read-only remount) never loses a message:
the channel keeps what it received, still encrypted, and processes it again once
storage works (see :mod:`svc_sdk._deliveries`). The reading call raises the fault as an
:class:`~svc_sdk.InternalError`; a health check shows it standing until it clears::

    health = client.health()
    if not health.ok:
        for channel in health.channels:
            if channel.storage_error:
                alert(f"{channel.name}: {channel.storage_error} since {channel.failing_since}")
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChannelHealth:
    """One channel's state, as of the call."""

    name: str
    #: The standing storage fault (``runtime error: …``), or None while storing works.
    storage_error: str | None
    #: When that fault was first met (``time.time()``), or None.
    failing_since: float | None
    #: Deliveries received but not processed yet: waiting for a reader, or for storage.
    backlog: int
    #: Decrypted messages waiting for a reader.
    unread: int
    #: Why the channel closed (removed, the client closed), or None while it is open.
    closed: str | None

    @property
    def ok(self) -> bool:
        """Open, and storing what it receives."""
        return self.storage_error is None and self.closed is None


@dataclass(frozen=True)
class ClientHealth:
    """The client's state, as of the call: its relay link and every channel it is in."""

    #: Whether the relay link is up (it reconnects by itself; sends wait for it).
    connected: bool
    #: The relay endpoint in use, or the last one tried.
    relay: str
    channels: tuple[ChannelHealth, ...]

    @property
    def ok(self) -> bool:
        """Connected, and every channel storing what it receives."""
        return self.connected and all(c.storage_error is None for c in self.channels)

    @property
    def storage_errors(self) -> dict[str, str]:
        """Each channel with a standing storage fault, and the fault."""
        return {c.name: c.storage_error for c in self.channels if c.storage_error is not None}
