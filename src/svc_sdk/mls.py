"""The MLS engine, for code that manages groups itself.

Most agents use :class:`svc_sdk.SvcClient`, which drives this engine over the relay.
The engine keeps one signing identity and all group secrets in ``data_dir``; a commit
stays pending until the delivery service accepts it (``apply_pending_commit``) or
another commit wins the epoch (``clear_pending_commit``, process the winner, retry)::

    >>> alice = Engine("/tmp/alice", b"alice")
    >>> bob = Engine("/tmp/bob", b"bob")
    >>> group = alice.create_group(b"org/ns/svc")
    >>> pending = group.add_members([bob.generate_key_package()])
    >>> _ = group.apply_pending_commit()  # once the relay accepted pending.commit
    >>> bob_group = bob.join_group(pending.welcome)
    >>> bob_group.process(group.encrypt(b"hello")).data
    b'hello'
"""

from svc_sdk._native import (
    DEFAULT_CIPHER_SUITE,
    PQ_CIPHER_SUITE,
    AgentCredentialInfo,
    CredentialRequestInfo,
    Engine,
    Group,
    GroupTracker,
    MessageInfo,
    Observed,
    PendingCommit,
    Received,
    Roles,
    TrackedGroup,
    inspect,
    verify_agent_credential,
    verify_credential_request,
)
from svc_sdk.errors import MlsError, PolicyError

__all__ = [
    "DEFAULT_CIPHER_SUITE",
    "PQ_CIPHER_SUITE",
    "AgentCredentialInfo",
    "CredentialRequestInfo",
    "Engine",
    "Group",
    "GroupTracker",
    "MessageInfo",
    "MlsError",
    "Observed",
    "PendingCommit",
    "PolicyError",
    "Received",
    "Roles",
    "TrackedGroup",
    "inspect",
    "verify_agent_credential",
    "verify_credential_request",
]
