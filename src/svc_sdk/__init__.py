"""svc: end-to-end encrypted (MLS) messaging for software agents.

>>> from svc_sdk import SvcChannelManager
>>> with SvcChannelManager("alice") as alice:          # doctest: +SKIP
...     alice.create("acme/support/triage")
...     token = alice.invite("acme/support/triage")   # hand to another agent

The MLS engine itself is :mod:`svc_sdk.mls`; the local test stack is
:class:`svc_sdk.testing.LocalStack`.

Every name below loads its module on first use, so importing one part of the package
costs only that part: the servers import :mod:`svc_sdk.protocol` without the client
(httpx, the relay link, the asyncio API), and the adapters' optional dependencies
(a2a-sdk, mcp) stay optional.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from svc_sdk._native import PQ_CIPHER_SUITE
    from svc_sdk.adapters.a2a import SvcA2AAdapter
    from svc_sdk.adapters.bridge import ProtocolBridge
    from svc_sdk.adapters.mcp import SvcTransport
    from svc_sdk.adapters.slim import SLIMAdapter
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

    __version__: str

# Public name -> the module that defines it.
_MODULES = {
    "PQ_CIPHER_SUITE": "svc_sdk._native",
    "AgentId": "svc_sdk.agent_id",
    "AsyncChannel": "svc_sdk.aio",
    "AsyncSvcChannelManager": "svc_sdk.aio",
    "AsyncSvcClient": "svc_sdk.aio",
    "ChannelEvent": "svc_sdk.audit",
    "ChannelMember": "svc_sdk.audit",
    "ChannelSummary": "svc_sdk.audit",
    "Channel": "svc_sdk.channel",
    "Message": "svc_sdk.channel",
    "MessageIterator": "svc_sdk.channel",
    "SvcClient": "svc_sdk.client",
    "Envelope": "svc_sdk.envelope",
    "Protocol": "svc_sdk.envelope",
    "AccessError": "svc_sdk.errors",
    "AuthError": "svc_sdk.errors",
    "ChannelClosedError": "svc_sdk.errors",
    "ChannelNameError": "svc_sdk.errors",
    "InternalError": "svc_sdk.errors",
    "InviteError": "svc_sdk.errors",
    "MlsError": "svc_sdk.errors",
    "PolicyError": "svc_sdk.errors",
    "SvcError": "svc_sdk.errors",
    "TransportError": "svc_sdk.errors",
    "ChannelHealth": "svc_sdk.health",
    "ClientHealth": "svc_sdk.health",
    "SvcChannelManager": "svc_sdk.manager",
    "SvcA2AAdapter": "svc_sdk.adapters.a2a",
    "SvcTransport": "svc_sdk.adapters.mcp",
    "SLIMAdapter": "svc_sdk.adapters.slim",
    "ProtocolBridge": "svc_sdk.adapters.bridge",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        return _version()
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'svc_sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULES, "__version__"})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("svc-sdk")
    except PackageNotFoundError:  # running from a source tree without an install
        return "0.0.0"


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
