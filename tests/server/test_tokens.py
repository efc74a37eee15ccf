"""POST /v1/tokens, the JWKS, rotation, and the relay's TokenVerifier."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from svc_server.auth import InvalidToken, TokenVerifier
from svc_server.db.session import make_engine, make_sessionmaker, transaction
from svc_server.services import signing

from ..support import RunningApi, run_api
from .conftest import bearer, signup
from .test_accounts import assert_problem


def verifier(api: RunningApi, **kwargs: Any) -> TokenVerifier:
    return TokenVerifier.from_url(f"{api.url}/.well-known/jwks.json", **kwargs)


def test_token_claims(api: RunningApi, http: httpx.Client) -> None:
    body = signup(http)
    response = http.post("/v1/tokens", headers=bearer(body["api_key"]["key"]))
    assert response.status_code == 200
    data = response.json()
    header = jwt.get_unverified_header(data["token"])
    assert header["alg"] == "EdDSA" and header["kid"]
    claims = jwt.decode(data["token"], options={"verify_signature": False})
    assert claims["sub"] == body["account"]["id"]
    assert (claims["plan"], claims["iss"], claims["aud"]) == ("free", "svc-api", "svc-relay")
    assert claims["exp"] - claims["iat"] == 900
    assert abs(claims["iat"] - time.time()) < 60
    assert datetime.fromisoformat(data["expires_at"]) == datetime.fromtimestamp(claims["exp"], UTC)
    other = http.post("/v1/tokens", headers=bearer(body["api_key"]["key"])).json()["token"]
    assert jwt.decode(other, options={"verify_signature": False})["jti"] != claims["jti"]
    verified = verifier(api).verify(data["token"])
    assert (str(verified.account_id), verified.plan) == (body["account"]["id"], "free")


def test_token_requires_a_valid_key(http: httpx.Client) -> None:
    assert_problem(http.post("/v1/tokens"), 401)
    assert_problem(http.post("/v1/tokens", headers=bearer("sk_live_nope")), 401)


def test_lifetime_is_configurable(make_settings: Any) -> None:
    with (
        run_api(make_settings(token_ttl_seconds=120)) as api,
        httpx.Client(base_url=api.url) as http,
    ):
        key = signup(http)["api_key"]["key"]
        token = http.post("/v1/tokens", headers=bearer(key)).json()["token"]
        claims = jwt.decode(token, options={"verify_signature": False})
        assert claims["exp"] - claims["iat"] == 120


def test_token_outlives_revoked_key(api: RunningApi, http: httpx.Client) -> None:
    key = signup(http)["api_key"]
    token = http.post("/v1/tokens", headers=bearer(key["key"])).json()["token"]
    second = http.post("/v1/keys", headers=bearer(key["key"])).json()
    assert http.delete(f"/v1/keys/{key['id']}", headers=bearer(second["key"])).status_code == 204
    assert_problem(http.post("/v1/tokens", headers=bearer(key["key"])), 401)
    assert verifier(api).verify(token).plan == "free", "issued tokens stay valid until they expire"


def test_signing_key_persists_across_restart(make_settings: Any) -> None:
    settings = make_settings()
    kids = []
    for _ in range(2):
        with run_api(settings) as api:
            kids.append(httpx.get(f"{api.url}/.well-known/jwks.json").json()["keys"][0]["kid"])
    assert kids[0] == kids[1]


def test_rotation_keeps_old_tokens_valid_until_they_expire(
    api: RunningApi, http: httpx.Client
) -> None:
    key = signup(http)["api_key"]["key"]
    old = http.post("/v1/tokens", headers=bearer(key)).json()["token"]
    engine = make_engine(api.settings)
    sessions = make_sessionmaker(engine)
    with transaction(sessions) as session:
        new_kid = signing.rotate(session, api.settings.token_ttl_seconds).kid
    api.server.config.app.state.services.signer.invalidate()  # type: ignore[union-attr]
    new = http.post("/v1/tokens", headers=bearer(key)).json()["token"]
    assert jwt.get_unverified_header(new)["kid"] == new_kid != jwt.get_unverified_header(old)["kid"]
    check = verifier(api)
    assert check.verify(old).plan == check.verify(new).plan == "free"
    jwks = httpx.get(f"{api.url}/.well-known/jwks.json").json()
    assert len(jwks["keys"]) == 2
    # Once the retired key's tokens have all expired, it leaves the JWKS.
    with transaction(sessions) as session:
        for k in session.query(signing.SigningKey).filter(
            signing.SigningKey.retired_at.is_not(None)
        ):
            k.verify_until = datetime.now(UTC) - timedelta(seconds=1)
    engine.dispose()
    assert [k["kid"] for k in httpx.get(f"{api.url}/.well-known/jwks.json").json()["keys"]] == [
        new_kid
    ]
    with pytest.raises(InvalidToken, match="unknown key"):
        verifier(api).verify(old)


def _forge(claims: dict[str, Any], kid: str, key: Any = None, alg: str = "EdDSA") -> str:
    key = key if key is not None else Ed25519PrivateKey.generate()
    return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})


def _claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {
        "sub": str(uuid.uuid4()),
        "plan": "free",
        "iss": "svc-api",
        "aud": "svc-relay",
        "iat": now,
        "exp": now + 300,
        "jti": "x",
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def _real_signer(api: RunningApi) -> signing.ActiveSigner:
    return api.server.config.app.state.services.signer.get()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"exp": -3600}, "expired"),
        ({"aud": "someone-else"}, "audience"),
        ({"iss": "evil"}, "issuer"),
        ({"plan": "platinum"}, "plan"),
        ({"sub": "not-a-uuid"}, "subject"),
        ({"jti": None}, "jti"),
    ],
)
def test_verifier_rejects_bad_claims(
    api: RunningApi, overrides: dict[str, Any], message: str
) -> None:
    # Claims made now, not at collection: a slow suite must not expire them first.
    if "exp" in overrides:
        overrides = {"exp": int(time.time()) + overrides["exp"]}
    signer = _real_signer(api)
    token = _forge(_claims(**overrides), signer.kid, signer.private_key)
    with pytest.raises(InvalidToken, match=message):
        verifier(api, leeway_seconds=0).verify(token)


def test_verifier_rejects_forgeries(api: RunningApi) -> None:
    check = verifier(api)
    kid = _real_signer(api).kid
    with pytest.raises(InvalidToken, match="signature"):
        check.verify(_forge(_claims(), kid))  # right kid, wrong key
    with pytest.raises(InvalidToken, match="not accepted"):
        check.verify(jwt.encode(_claims(), "s" * 32, algorithm="HS256", headers={"kid": kid}))
    unsigned = jwt.encode(_claims(), None, algorithm="none", headers={"kid": kid})  # type: ignore[arg-type]
    with pytest.raises(InvalidToken, match="not accepted"):
        check.verify(unsigned)
    with pytest.raises(InvalidToken, match="unknown key"):
        check.verify(_forge(_claims(), "no-such-kid"))
    for garbage in ("", "abc", "a.b.c", "x" * 10_000):
        with pytest.raises(InvalidToken):
            check.verify(garbage)


def test_unknown_kid_refetches_at_most_once_per_interval(api: RunningApi) -> None:
    calls = []

    def source() -> dict[str, Any]:
        calls.append(1)
        data: dict[str, Any] = httpx.get(f"{api.url}/.well-known/jwks.json").json()
        return data

    check = TokenVerifier(source, min_refresh_seconds=3600)
    for _ in range(20):
        with pytest.raises(InvalidToken):
            check.verify(_forge(_claims(), f"kid-{uuid.uuid4()}"))
    assert len(calls) == 1
