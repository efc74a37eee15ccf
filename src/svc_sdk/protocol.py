"""What the client library and the servers (``svc_server``: account API and relay) share:
the relay's wire messages, channel names, agent ids, the agent credential's wire format,
the MLS engine calls the servers make, the relay's native gRPC server and the codec of its
hot path (a Publish decoded, a Reply and a delivery encoded), and the event loop both run
on.

The servers import this module and nothing else of ``svc_sdk``; ``tests/test_layout.py``
holds them to it. Everything here is a stable name for something defined in the library
(most of it private), so the library may move its internals without touching the servers,
and whoever changes one of these definitions knows the other side depends on it
(docs/architecture.md, "What the client and the servers share").

>>> from svc_sdk.protocol import relay_pb2 as pb, is_valid_channel_name
>>> pb.Subscribe(channel="acme/ns/svc", after_seq=0).channel
'acme/ns/svc'
>>> is_valid_channel_name("acme/ns/svc")
True
"""

from __future__ import annotations

from svc_sdk._codes import Code
from svc_sdk._loop import new_event_loop
from svc_sdk._loop import run as run_event_loop
from svc_sdk._native import (
    MAX_DECODED_PUBLISH,
    GroupTracker,
    Observed,
    ReceivedFrame,
    RelayServer,
    Roles,
    ServerStream,
    TrackedGroup,
    decode_publish,
    encode_delivery,
    encode_reply,
    inspect,
    verify_agent_credential,
)
from svc_sdk._relay_pb import relay_pb2
from svc_sdk.agent_credential import (
    CREDENTIAL_LABEL,
    CREDENTIAL_TYPE,
    MAX_IDENTITY,
    REQUEST_LABEL,
    CredentialContent,
    CredentialRequest,
)
from svc_sdk.agent_id import AgentId
from svc_sdk.errors import MlsError, PolicyError
from svc_sdk.names import PATTERN as CHANNEL_PATTERN
from svc_sdk.names import is_valid_channel_name

__all__ = [
    "CHANNEL_PATTERN",
    "CREDENTIAL_LABEL",
    "CREDENTIAL_TYPE",
    "MAX_DECODED_PUBLISH",
    "MAX_IDENTITY",
    "REQUEST_LABEL",
    "AgentId",
    "Code",
    "CredentialContent",
    "CredentialRequest",
    "GroupTracker",
    "MlsError",
    "Observed",
    "PolicyError",
    "ReceivedFrame",
    "RelayServer",
    "Roles",
    "ServerStream",
    "TrackedGroup",
    "decode_publish",
    "encode_delivery",
    "encode_reply",
    "inspect",
    "is_valid_channel_name",
    "new_event_loop",
    "relay_pb2",
    "run_event_loop",
    "verify_agent_credential",
]
