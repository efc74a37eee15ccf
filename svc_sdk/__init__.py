"""svc: end-to-end encrypted (MLS) messaging for software agents.

>>> from svc_sdk import SvcChannelManager
>>> with SvcChannelManager("alice") as alice:          # doctest: +SKIP
...     alice.create("acme/support/triage")
...     token = alice.invite("acme/support/triage")   # hand to another agent

The MLS engine itself is :mod:`svc_sdk.mls`; the local test stack is
:class:`svc_sdk.testing.LocalStack`.
"""

from importlib.metadata import PackageNotFoundError, version

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
    SvcError,
    TransportError,
)
from svc_sdk.manager import SvcChannelManager

try:
    __version__ = version("svc-sdk")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = [
    "AccessError",
    "AuthError",
    "Channel",
    "ChannelClosedError",
    "ChannelNameError",
    "Envelope",
    "InternalError",
    "InviteError",
    "Message",
    "MessageIterator",
    "MlsError",
    "Protocol",
    "SvcChannelManager",
    "SvcClient",
    "SvcError",
    "TransportError",
    "__version__",
]
