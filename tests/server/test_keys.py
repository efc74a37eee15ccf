"""POST/GET/DELETE /v1/keys through real HTTP."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import httpx
from sqlalchemy import create_engine, select, text

from svc_server.db.models import ApiKey

from ..support import RunningApi, run_api
from .conftest import bearer, signup
from .test_accounts import ISO_UTC, assert_problem


def test_create_key_defaults_and_names(http: httpx.Client) -> None:
    key = signup(http)["api_key"]["key"]
    created = http.post("/v1/keys", headers=bearer(key))
    assert created.status_code == 201
    assert created.json()["name"] == "default"
    assert set(created.json()) == {"id", "key_prefix", "name", "key"}
    named = http.post("/v1/keys", headers=bearer(key), json={"name": "ci"})
    assert named.status_code == 201 and named.json()["name"] == "ci"
    assert named.json()["key"] != created.json()["key"]
    for bad in ({"name": ""}, {"name": "x" * 101}, {"name": 3}, {"other": 1}):
        assert_problem(http.post("/v1/keys", headers=bearer(key), json=bad), 422)


def test_list_shows_active_keys_newest_first(http: httpx.Client) -> None:
    first = signup(http)["api_key"]
    second = http.post("/v1/keys", headers=bearer(first["key"]), json={"name": "second"}).json()
    third = http.post("/v1/keys", headers=bearer(first["key"]), json={"name": "third"}).json()
    listed = http.get("/v1/keys", headers=bearer(first["key"]))
    assert listed.status_code == 200
    keys = listed.json()["keys"]
    assert [k["id"] for k in keys] == [third["id"], second["id"], first["id"]]
    for k in keys:
        assert set(k) == {"id", "key_prefix", "name", "last_used_at", "created_at"}
        assert ISO_UTC.match(k["created_at"])
    by_id = {k["id"]: k for k in keys}
    assert ISO_UTC.match(by_id[first["id"]]["last_used_at"]), "the key that was used"
    assert by_id[second["id"]]["last_used_at"] is None, "null until used"
    http.get("/v1/keys", headers=bearer(second["key"]))
    again = {k["id"]: k for k in http.get("/v1/keys", headers=bearer(first["key"])).json()["keys"]}
    assert again[second["id"]]["last_used_at"] is not None


def test_revoke_is_soft_and_immediate_everywhere(api: RunningApi, http: httpx.Client) -> None:
    first = signup(http)["api_key"]
    doomed = http.post("/v1/keys", headers=bearer(first["key"]), json={"name": "doomed"}).json()
    token_before = http.post("/v1/tokens", headers=bearer(doomed["key"]))
    assert token_before.status_code == 200
    assert http.delete(f"/v1/keys/{doomed['id']}", headers=bearer(first["key"])).status_code == 204
    for method, path in (
        ("GET", "/v1/accounts/me"),
        ("GET", "/v1/keys"),
        ("POST", "/v1/keys"),
        ("POST", "/v1/tokens"),
    ):
        response = http.request(method, path, headers=bearer(doomed["key"]))
        assert_problem(response, 401)
        assert response.headers["www-authenticate"].startswith("Bearer")
    ids = [k["id"] for k in http.get("/v1/keys", headers=bearer(first["key"])).json()["keys"]]
    assert doomed["id"] not in ids
    # Soft delete: the record is kept with revoked_at.
    engine = create_engine(api.settings.database_url)
    with engine.connect() as conn:
        row = conn.execute(
            select(ApiKey.revoked_at).where(ApiKey.id == uuid.UUID(doomed["id"]))
        ).one()
    engine.dispose()
    assert row.revoked_at is not None
    # Revoking again, unknown ids and non-UUIDs are all 404.
    for key_id in (doomed["id"], str(uuid.uuid4()), "not-a-uuid", "1"):
        assert_problem(http.delete(f"/v1/keys/{key_id}", headers=bearer(first["key"])), 404)


def test_accounts_are_isolated(http: httpx.Client) -> None:
    alice = signup(http, "alice@example.com")["api_key"]
    bob = signup(http, "bob@example.com")["api_key"]
    # Bob cannot see or revoke Alice's key; it keeps working.
    bob_keys = http.get("/v1/keys", headers=bearer(bob["key"])).json()["keys"]
    assert [k["id"] for k in bob_keys] == [bob["id"]]
    assert_problem(http.delete(f"/v1/keys/{alice['id']}", headers=bearer(bob["key"])), 404)
    assert (
        http.get("/v1/accounts/me", headers=bearer(alice["key"])).json()["email"]
        == "alice@example.com"
    )
    assert (
        http.get("/v1/accounts/me", headers=bearer(bob["key"])).json()["email"] == "bob@example.com"
    )


def test_only_a_digest_is_stored(api: RunningApi, http: httpx.Client) -> None:
    key = signup(http)["api_key"]["key"]
    engine = create_engine(api.settings.database_url)
    with engine.connect() as conn:
        stored = conn.execute(select(ApiKey.key_hash)).scalar_one()
        tables = [
            r[0]
            for r in conn.execute(
                text("SELECT 'accounts' UNION SELECT 'api_keys' UNION SELECT 'signing_keys'")
            )
        ]
        dump = " ".join(
            str(row) for table in tables for row in conn.execute(text(f"SELECT * FROM {table}"))
        )
    engine.dispose()
    assert stored == hashlib.sha256(key.encode()).hexdigest()
    body = key.removeprefix("sk_live_")
    assert body not in dump and body[8:20] not in dump


def test_malformed_authorization(http: httpx.Client) -> None:
    key = signup(http)["api_key"]["key"]
    typo = key[:-1] + ("A" if key[-1] != "A" else "B")
    for header in (
        "Basic abc",
        "Bearer",
        "Token abc",
        key,
        f"Bearer {typo}",
        f"Bearer {key}x",
        "Bearer sk_live_short",
    ):
        response = http.get("/v1/keys", headers={"Authorization": header})
        body = assert_problem(response, 401)
        assert key not in response.text and typo not in body.get("detail", "")


def test_auth_failures_are_rate_limited(make_settings: Any) -> None:
    with (
        run_api(make_settings(auth_failure_rate_limit="3/minute")) as api,
        httpx.Client(base_url=api.url) as http,
    ):
        key = signup(http)["api_key"]["key"]
        for _ in range(3):
            assert_problem(http.get("/v1/keys", headers=bearer("sk_live_" + "0" * 49)), 401)
        blocked = http.get("/v1/keys", headers=bearer(key))
        assert_problem(blocked, 429)
        assert int(blocked.headers["retry-after"]) >= 1


def test_last_used_is_written_at_most_once_per_interval(make_settings: Any) -> None:
    with (
        run_api(make_settings(last_used_write_interval_seconds=3600)) as api,
        httpx.Client(base_url=api.url) as http,
    ):
        key = signup(http)["api_key"]
        first = http.get("/v1/keys", headers=bearer(key["key"])).json()["keys"][0]["last_used_at"]
        for _ in range(3):
            http.get("/v1/accounts/me", headers=bearer(key["key"]))
        later = http.get("/v1/keys", headers=bearer(key["key"])).json()["keys"][0]["last_used_at"]
        assert first is not None and later == first
