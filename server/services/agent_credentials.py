"""Issuing agent credentials: the account API vouches that an MLS signature key belongs
to an agent identity of an account (docs/security.md, "Agent credentials").

The agent proves it holds the key by signing the request with it; the credential is
signed with the API's credential key (``signing.CREDENTIAL``), whose public half every
member and the relay fetch to verify credentials offline.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from svc_sdk.protocol import (
    CREDENTIAL_LABEL,
    MAX_IDENTITY,
    REQUEST_LABEL,
    CredentialContent,
    CredentialRequest,
)

from .signing import ActiveSigner

# MLS cipher suites whose signature keys we accept, and those keys' sizes: suite 1 is
# Ed25519 (raw 32-byte keys), suite 2 ECDSA P-256 (uncompressed points, 65 bytes).
KEY_SIZES = {1: 32, 2: 65}
# How far a request's issued_at may be from the API's clock: a captured request is
# useless after this (and only ever re-binds the same key to the same identity).
MAX_REQUEST_AGE = 300


class CredentialRequestError(ValueError):
    """The request is not one the API signs; the message says why."""


@dataclass(frozen=True)
class Issued:
    credential: bytes
    content: CredentialContent


def check_request(request: CredentialRequest, proof: bytes, account: uuid.UUID, now: int) -> None:
    """Raises CredentialRequestError unless ``request`` is for ``account``, well formed,
    fresh, and signed (``proof``) by the signature key it names."""
    if request.account != account.bytes:
        raise PermissionError("the request names another account than the API key's")
    if not 0 < len(request.identity) <= MAX_IDENTITY:
        raise CredentialRequestError(f"identity must be 1 to {MAX_IDENTITY} bytes")
    size = KEY_SIZES.get(request.cipher_suite)
    if size is None:
        raise CredentialRequestError(
            f"cipher suite {request.cipher_suite} is not supported; supported: 1, 2"
        )
    if len(request.signature_key) != size:
        raise CredentialRequestError(
            f"signature_key must be {size} bytes for cipher suite {request.cipher_suite}"
        )
    if abs(now - request.issued_at) > MAX_REQUEST_AGE:
        raise CredentialRequestError(
            f"issued_at is more than {MAX_REQUEST_AGE} s from the API's clock; sign a fresh request"
        )
    signed = REQUEST_LABEL + request.encode()
    try:
        if request.cipher_suite == 1:
            Ed25519PublicKey.from_public_bytes(request.signature_key).verify(proof, signed)
        else:
            key = ec.EllipticCurvePublicKey.from_encoded_point(
                ec.SECP256R1(), request.signature_key
            )
            key.verify(proof, signed, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise CredentialRequestError(
            "proof of possession failed: the request is not signed by signature_key"
        ) from None


def issue(signer: ActiveSigner, request: CredentialRequest, now: int, ttl: int) -> Issued:
    """A credential for a checked request, valid from now for ``ttl`` seconds."""
    content = CredentialContent(
        issuer=signer.kid,
        account=request.account,
        identity=request.identity,
        cipher_suite=request.cipher_suite,
        signature_key=request.signature_key,
        not_before=now,
        not_after=now + ttl,
    )
    signature = signer.private_key.sign(CREDENTIAL_LABEL + content.encode())
    return Issued(credential=content.signed(signature), content=content)
