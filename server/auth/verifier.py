"""Offline verification of relay tokens with the account API's public keys.

Fixed algorithm list (EdDSA), issuer, audience, expiry and the required claims are all
checked; the JWKS is cached and re-fetched when a token names an unknown ``kid`` — at most
once per ``min_refresh_seconds``, so a flood of forged kids cannot turn into a flood of
JWKS requests.

>>> verifier = TokenVerifier.from_url("http://127.0.0.1:8000/.well-known/jwks.json")
>>> claims = verifier.verify(token)  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt

ALGORITHMS = ["EdDSA"]
PLANS = frozenset({"free", "dev", "team", "enterprise"})
REQUIRED = ["exp", "iat", "sub", "iss", "aud", "jti"]

JwksSource = Callable[[], dict[str, Any]]


def jwks_from_url(url: str) -> JwksSource:
    """A JWK-set source that fetches ``url`` (a relay running apart from the API)."""

    def fetch() -> dict[str, Any]:
        import httpx  # only relays that fetch keys over HTTP need it

        response = httpx.get(url, timeout=5.0)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    return fetch


class InvalidToken(Exception):
    """The token is not acceptable; the message says why (never echoing the token)."""


@dataclass(frozen=True)
class Claims:
    account_id: uuid.UUID
    plan: str
    expires_at: float
    issued_at: float
    token_id: str


class TokenVerifier:
    def __init__(
        self,
        jwks_source: JwksSource,
        *,
        issuer: str = "svc-api",
        audience: str = "svc-relay",
        leeway_seconds: float = 30.0,
        min_refresh_seconds: float = 10.0,
        max_age_seconds: float = 300.0,
    ) -> None:
        self._source = jwks_source
        self._issuer = issuer
        self._audience = audience
        self._leeway = leeway_seconds
        self._min_refresh = min_refresh_seconds
        self._max_age = max_age_seconds
        self._keys: dict[str, Any] = {}
        self._fetched_at = float("-inf")
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> TokenVerifier:
        """A verifier that fetches the JWKS over HTTP from the account API."""
        return cls(jwks_from_url(url), **kwargs)

    def _refresh(self, force: bool) -> None:
        with self._lock:
            age = time.monotonic() - self._fetched_at
            if age < self._min_refresh or (not force and age < self._max_age):
                return
            try:
                jwks = self._source()
                keys = {}
                for entry in jwks.get("keys", []):
                    if entry.get("alg") in ALGORITHMS and "kid" in entry:
                        keys[entry["kid"]] = jwt.PyJWK(entry).key
            except Exception as exc:  # keep the last good keys if the API is unreachable
                self._fetched_at = time.monotonic()
                if not self._keys:
                    raise InvalidToken(f"cannot load verification keys: {exc}") from exc
                return
            self._keys = keys
            self._fetched_at = time.monotonic()

    def _key_for(self, kid: str) -> Any:
        self._refresh(force=False)
        key = self._keys.get(kid)
        if key is None:
            self._refresh(force=True)
            key = self._keys.get(kid)
        if key is None:
            raise InvalidToken("token signed by an unknown key")
        return key

    def verify(self, token: str) -> Claims:
        """The token's claims, or InvalidToken saying what is wrong."""
        if not isinstance(token, str) or not token or len(token) > 8192:
            raise InvalidToken("token missing or too long")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise InvalidToken("malformed token") from exc
        if header.get("alg") not in ALGORITHMS:
            raise InvalidToken(f"algorithm {header.get('alg')!r} not accepted")
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise InvalidToken("token has no key id")
        key = self._key_for(kid)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=ALGORITHMS,
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway,
                options={"require": REQUIRED},
            )
        except jwt.ExpiredSignatureError as exc:
            raise InvalidToken("token expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise InvalidToken("token is not for this audience") from exc
        except jwt.InvalidIssuerError as exc:
            raise InvalidToken("token has the wrong issuer") from exc
        except jwt.InvalidSignatureError as exc:
            raise InvalidToken("token signature is invalid") from exc
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"invalid token: {exc}") from exc
        plan = claims.get("plan")
        if plan not in PLANS:
            raise InvalidToken("token has no valid plan")
        try:
            account_id = uuid.UUID(str(claims["sub"]))
        except ValueError as exc:
            raise InvalidToken("token subject is not an account id") from exc
        return Claims(
            account_id=account_id,
            plan=plan,
            expires_at=float(claims["exp"]),
            issued_at=float(claims["iat"]),
            token_id=str(claims["jti"]),
        )
