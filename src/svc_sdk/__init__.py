"""svc: end-to-end encrypted (MLS) messaging for software agents.

>>> from svc_sdk import SvcChannelManager
>>> with SvcChannelManager("alice") as alice:          # doctest: +SKIP
...     alice.create("acme/support/triage")
...     token = alice.invite("acme/support/triage")   # hand to another agent

The MLS engine itself is :mod:`svc_sdk.mls`; the local test stack is
:class:`svc_sdk.testing.LocalStack`.
"""

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from svc_sdk._native import PQ_CIPHER_SUITE
from svc_sdk.agent_id import AgentId
from svc_sdk.aio import AsyncChannel, AsyncSvcChannelManager, AsyncSvcClient
from svc_sdk.audit import ChannelEvent, ChannelMember, ChannelSummary
from svc_sdk.channel import Channel, Message, MessageIterator
from svc_sdk.client import SvcClient
from svc_sdk.envelope import Envelope, Protocol
from svc_sdk.errors import (
    AccessError,
    AuthError,
    ChannelClosedError,
    ChannelNameError,
    InternalError,
    InviteError,
    MlsError,
    PolicyError,
    SvcError,
    TransportError,
)
from svc_sdk.health import ChannelHealth, ClientHealth
from svc_sdk.manager import SvcChannelManager

if TYPE_CHECKING:
    from svc_sdk.adapters.a2a import SvcA2AAdapter
    from svc_sdk.adapters.bridge import ProtocolBridge
    from svc_sdk.adapters.mcp import SvcTransport
    from svc_sdk.adapters.slim import SLIMAdapter

# Adapters load on first use: their optional dependencies (a2a-sdk, mcp) stay optional.
_ADAPTERS = {
    "SvcA2AAdapter": "svc_sdk.adapters.a2a",
    "SvcTransport": "svc_sdk.adapters.mcp",
    "SLIMAdapter": "svc_sdk.adapters.slim",
    "ProtocolBridge": "svc_sdk.adapters.bridge",
}


def __getattr__(name: str) -> Any:
    module = _ADAPTERS.get(name)
    if module is None:
        raise AttributeError(f"module 'svc_sdk' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_ADAPTERS])


try:
    __version__ = version("svc-sdk")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = [
    "PQ_CIPHER_SUITE",
    "AccessError",
    "AgentId",
    "AsyncChannel",
    "AsyncSvcChannelManager",
    "AsyncSvcClient",
    "AuthError",
    "Channel",
    "ChannelClosedError",
    "ChannelEvent",
    "ChannelHealth",
    "ChannelMember",
    "ChannelNameError",
    "ChannelSummary",
    "ClientHealth",
    "Envelope",
    "InternalError",
    "InviteError",
    "Message",
    "MessageIterator",
    "MlsError",
    "PolicyError",
    "Protocol",
    "ProtocolBridge",
    "SLIMAdapter",
    "SvcA2AAdapter",
    "SvcChannelManager",
    "SvcClient",
    "SvcError",
    "SvcTransport",
    "TransportError",
    "__version__",
]
