"""The API's signing keys, one series per purpose: relay JWTs (``TOKEN``) and agent
credentials (``CREDENTIAL``). Generated on first use, stored in the database so every API
process signs with the same key, rotated without invalidating what was issued."""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ..db.models import SigningKey, utcnow
from ..db.session import transaction

ALGORITHM = "EdDSA"
TOKEN = "token"  # noqa: S105 - a key purpose, not a secret
CREDENTIAL = "credential"


def _new_key(now: datetime, purpose: str) -> SigningKey:
    private = Ed25519PrivateKey.generate()
    kid = f"{now:%Y%m%d}-{secrets.token_hex(4)}"
    jwk: dict[str, Any] = json.loads(OKPAlgorithm.to_jwk(private.public_key()))
    jwk.update({"kid": kid, "alg": ALGORITHM, "use": "sig"})
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    if purpose == CREDENTIAL:
        jwk["use"] = "svc-agent-credential"
        kid = f"c{kid}"  # never the kid of a token key: a verifier cannot mix them up
        jwk["kid"] = kid
    return SigningKey(
        kid=kid,
        purpose=purpose,
        algorithm=ALGORITHM,
        private_pem=pem,
        public_jwk=json.dumps(jwk),
        created_at=now,
    )


def _active(session: Session, purpose: str) -> SigningKey | None:
    return session.scalars(
        select(SigningKey)
        .where(SigningKey.retired_at.is_(None), SigningKey.purpose == purpose)
        .order_by(SigningKey.created_at.desc())
    ).first()


def ensure_key(session: Session, purpose: str = TOKEN) -> SigningKey:
    """The active signing key for ``purpose``, created if the database has none."""
    key = _active(session, purpose)
    if key is None:
        key = _new_key(utcnow(), purpose)
        session.add(key)
        session.flush()
    return key


def rotate(session: Session, token_ttl_seconds: int, purpose: str = TOKEN) -> SigningKey:
    """Retires the active key for ``purpose`` and creates a new one. A retired token key
    keeps verifying until every token it signed has expired (plus a minute of clock
    skew); a retired credential key stays published (``jwks``)."""
    now = utcnow()
    active = select(SigningKey).where(
        SigningKey.retired_at.is_(None), SigningKey.purpose == purpose
    )
    for old in session.scalars(active):
        old.retired_at = now
        if purpose == TOKEN:
            old.verify_until = now + timedelta(seconds=token_ttl_seconds + 60)
    key = _new_key(now, purpose)
    session.add(key)
    session.flush()
    return key


def jwks(session: Session, purpose: str = TOKEN) -> dict[str, list[dict[str, Any]]]:
    """Every public key for ``purpose`` that may still verify: the active one and
    retired ones. Retired token keys drop out once their tokens have expired; retired
    credential keys stay, because members re-verify every leaf of a group's tree when
    someone joins, old credentials included."""
    now = utcnow()
    keys = session.scalars(
        select(SigningKey)
        .where(SigningKey.purpose == purpose)
        .order_by(SigningKey.created_at.desc())
    )
    return {
        "keys": [
            json.loads(k.public_jwk) for k in keys if k.verify_until is None or k.verify_until > now
        ]
    }


@dataclass(frozen=True)
class ActiveSigner:
    kid: str
    private_key: Ed25519PrivateKey


class SignerCache:
    """The active signing key, loaded once and re-read at most every ``refresh`` seconds
    so a rotation by another process is picked up without a database read per token."""

    def __init__(
        self, sessions: sessionmaker[Session], refresh: float = 30.0, purpose: str = TOKEN
    ) -> None:
        self._sessions = sessions
        self._purpose = purpose
        self._refresh = refresh
        self._lock = threading.Lock()
        self._signer: ActiveSigner | None = None
        self._loaded_at = 0.0

    def get(self) -> ActiveSigner:
        signer = self._signer
        if signer is not None and time.monotonic() - self._loaded_at < self._refresh:
            return signer
        with self._lock:
            if self._signer is None or time.monotonic() - self._loaded_at >= self._refresh:
                self._signer = self._load()
                self._loaded_at = time.monotonic()
            return self._signer

    def invalidate(self) -> None:
        with self._lock:
            self._loaded_at = 0.0

    def _load(self) -> ActiveSigner:
        with transaction(self._sessions) as session:
            key = ensure_key(session, self._purpose)
            kid, pem = key.kid, key.private_pem
        private = serialization.load_pem_private_key(pem.encode(), password=None)
        if not isinstance(private, Ed25519PrivateKey):
            raise RuntimeError(f"signing key {kid} is not an Ed25519 key")
        return ActiveSigner(kid=kid, private_key=private)
