"""The agent credential: what the account API signs to bind an agent's MLS signature key
to its account and identity, in the wire format both sides share (docs/security.md,
"Agent credentials").

The encoding is MLS's own (RFC 9420 §2.1): ``opaque x<V>`` is a variable-length integer
length then the bytes, integers are big-endian. The engine decodes and verifies the same
bytes in Rust; this module is what the account API uses to build them.

>>> content = CredentialContent(
...     issuer="k1", account=bytes(16), identity=b"alice", cipher_suite=1,
...     signature_key=bytes(32), not_before=0, not_after=60)
>>> content.encode()[:4].hex()
'026b3110'
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

#: The credential type in MLS leaves (RFC 9420 private-use range).
CREDENTIAL_TYPE = 0xF5C1
#: What the issuer signs: this label, then the encoded content.
CREDENTIAL_LABEL = b"svc agent credential v1\x00"
#: What the agent signs with its MLS key to prove it holds it: this label, then the
#: encoded request.
REQUEST_LABEL = b"svc credential request v1\x00"

MAX_IDENTITY = 1024
_VARINT_MAX = (1 << 30) - 1


def opaque(data: bytes) -> bytes:
    """``opaque data<V>``: the length as an MLS variable-length integer, then the bytes."""
    n = len(data)
    if n < 1 << 6:
        prefix = struct.pack(">B", n)
    elif n < 1 << 14:
        prefix = struct.pack(">H", 0x4000 | n)
    elif n <= _VARINT_MAX:
        prefix = struct.pack(">I", 0x8000_0000 | n)
    else:
        raise ValueError(f"{n} bytes is too long for an MLS vector")
    return prefix + data


@dataclass(frozen=True)
class CredentialContent:
    """What a credential asserts, signed by the issuer key named ``issuer``."""

    issuer: str
    account: bytes
    identity: bytes
    cipher_suite: int
    signature_key: bytes
    not_before: int
    not_after: int

    def encode(self) -> bytes:
        return b"".join(
            (
                opaque(self.issuer.encode("ascii")),
                opaque(self.account),
                opaque(self.identity),
                struct.pack(">H", self.cipher_suite),
                opaque(self.signature_key),
                struct.pack(">QQ", self.not_before, self.not_after),
            )
        )

    def signed(self, signature: bytes) -> bytes:
        """The credential: the content, then the issuer's signature over
        ``CREDENTIAL_LABEL + content``."""
        return self.encode() + opaque(signature)


@dataclass(frozen=True)
class CredentialRequest:
    """What an agent signs with its MLS signature key when it asks for a credential."""

    account: bytes
    identity: bytes
    cipher_suite: int
    signature_key: bytes
    issued_at: int

    def encode(self) -> bytes:
        return b"".join(
            (
                opaque(self.account),
                opaque(self.identity),
                struct.pack(">H", self.cipher_suite),
                opaque(self.signature_key),
                struct.pack(">Q", self.issued_at),
            )
        )
