"""Who owns a key package: the account and identity its agent credential names, once the
credential checks out against the account API's credential keys.

The account API asks before it accepts a key package with an invite redemption (it must
be the caller's own agent), the relay before it routes a Welcome (only to the verified
owner of a key package the Welcome is addressed to).
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from svc_sdk.protocol import CREDENTIAL_TYPE, MlsError, inspect, verify_agent_credential

from .verifier import JwksSource, jwks_from_url


class KeyPackageError(ValueError):
    """Not a key package of a verified agent; the message says why."""


@dataclass(frozen=True)
class KeyPackageOwner:
    account: uuid.UUID
    identity: bytes
    #: The KeyPackageRef: what a Welcome names the key package by.
    reference: bytes

    @property
    def member_id(self) -> bytes:
        """``account (16 bytes) || identity``: how groups and the relay name the agent."""
        return self.account.bytes + self.identity


def anchors_from_jwks(jwks: dict[str, Any]) -> dict[str, bytes]:
    """kid -> raw Ed25519 public key, from the credential keys' JWK set."""
    out = {}
    for key in jwks.get("keys", []):
        if key.get("kty") == "OKP" and key.get("crv") == "Ed25519" and "kid" in key:
            x = str(key["x"])
            out[str(key["kid"])] = base64.urlsafe_b64decode(x + "=" * (-len(x) % 4))
    return out


class CredentialKeys:
    """The account API's credential keys, cached; fetched again at most every
    ``min_refresh`` seconds when a credential names a key not seen yet (a rotation)."""

    def __init__(self, source: JwksSource, *, min_refresh: float = 10.0) -> None:
        self._source = source
        self._min_refresh = min_refresh
        self._anchors: dict[str, bytes] = {}
        self._fetched_at = float("-inf")
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> CredentialKeys:
        return cls(jwks_from_url(url))

    def anchors(self, refresh: bool = False) -> dict[str, bytes]:
        with self._lock:
            stale = time.monotonic() - self._fetched_at >= self._min_refresh
            if (refresh and stale) or not self._anchors:
                try:
                    self._anchors = anchors_from_jwks(self._source())
                except Exception as exc:  # keep the last good keys if the API is unreachable
                    if not self._anchors:
                        raise KeyPackageError(f"cannot load credential keys: {exc}") from exc
                finally:
                    self._fetched_at = time.monotonic()
            return self._anchors

    def owner(self, key_package: bytes, now: int | None = None) -> KeyPackageOwner:
        """The verified owner of ``key_package``, or KeyPackageError saying what is wrong
        (not a key package, not an agent credential, unknown issuer, forged, for another
        key, expired)."""
        try:
            info = inspect(key_package)
        except MlsError as exc:
            raise KeyPackageError(str(exc)) from None
        if info.wire_format != "key_package":
            raise KeyPackageError(f"expected an MLS key package, got a {info.wire_format}")
        if info.credential_type != CREDENTIAL_TYPE:
            raise KeyPackageError(
                f"key package credential type {info.credential_type:#06x} is not an svc agent "
                f"credential ({CREDENTIAL_TYPE:#06x}); get one from the account API"
            )
        assert info.credential is not None and info.key_package_ref is not None
        when = int(time.time()) if now is None else now
        try:
            cred = self._verify(info.credential, info.signature_key, when, refresh=False)
        except MlsError as exc:
            if "unknown key" not in str(exc):
                raise KeyPackageError(str(exc)) from None
            try:
                cred = self._verify(info.credential, info.signature_key, when, refresh=True)
            except MlsError as again:
                raise KeyPackageError(str(again)) from None
        return KeyPackageOwner(uuid.UUID(bytes=cred.account), cred.identity, info.key_package_ref)

    def _verify(self, credential: bytes, key: bytes | None, now: int, refresh: bool) -> Any:
        return verify_agent_credential(credential, self.anchors(refresh), key, now)
