"""Exchanging an API key for a short-lived JWT (docs/api.md, Tokens)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import jwt

from ..config import Settings
from .api_keys import AccountRecord
from .signing import ALGORITHM, ActiveSigner


@dataclass(frozen=True)
class IssuedToken:
    token: str
    expires_at: datetime


def issue(
    signer: ActiveSigner, account: AccountRecord, settings: Settings, now: float
) -> IssuedToken:
    """Signs a token for ``account`` valid for ``settings.token_ttl_seconds`` from ``now``."""
    iat = int(now)
    exp = iat + settings.token_ttl_seconds
    claims = {
        "sub": str(account.id),
        "plan": account.plan,
        "iss": settings.issuer,
        "aud": settings.audience,
        "iat": iat,
        "exp": exp,
        "jti": uuid.uuid4().hex,
    }
    token = jwt.encode(claims, signer.private_key, algorithm=ALGORITHM, headers={"kid": signer.kid})
    return IssuedToken(token=token, expires_at=datetime.fromtimestamp(exp, UTC))
