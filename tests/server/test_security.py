"""Key lookup never depends on the key's characters; revocation reaches every process."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from ..support import RunningApi, free_port, run_api, wait_healthy
from .conftest import bearer, signup
from .test_accounts import assert_problem


@contextmanager
def statements(api: RunningApi) -> Iterator[list[tuple[str, Any]]]:
    engine = api.server.config.app.state.services.engine  # type: ignore[union-attr]
    seen: list[tuple[str, Any]] = []

    def record(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        seen.append((statement, params))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_lookup_is_by_digest_only(api: RunningApi, http: httpx.Client) -> None:
    key = signup(http)["api_key"]["key"]
    with statements(api) as seen:
        assert http.get("/v1/accounts/me", headers=bearer(key)).status_code == 200
    text = repr(seen)
    assert key not in text and key[8:30] not in text, "the key never reaches the database"
    assert hashlib.sha256(key.encode()).hexdigest() in text
    # A near miss differs completely in its digest, so an index lookup on the digest
    # gives an attacker no signal about how many characters were right.
    near_miss = key[:-7] + ("0" if key[-7] != "0" else "1") + key[-6:]
    with statements(api) as seen:
        assert_problem(http.get("/v1/accounts/me", headers=bearer(near_miss)), 401)
    assert seen == [], "a key with a bad checksum is rejected before any database work"


def test_wrong_key_with_valid_checksum_costs_one_indexed_lookup(
    api: RunningApi, http: httpx.Client
) -> None:
    from svc_server.services import api_keys

    signup(http)
    stranger = api_keys.generate().secret
    with statements(api) as seen:
        assert_problem(http.get("/v1/accounts/me", headers=bearer(stranger)), 401)
    lookups = [s for s, _ in seen if "api_keys" in s and s.lstrip().upper().startswith("SELECT")]
    assert len(lookups) == 1 and "key_hash" in lookups[0]


def test_revocation_reaches_another_api_process(api: RunningApi, http: httpx.Client) -> None:
    key = signup(http)["api_key"]
    spare = http.post("/v1/keys", headers=bearer(key["key"])).json()
    port = free_port()
    env = {**os.environ, "SVC_DATA_DIR": str(api.settings.data_dir)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "svc_cli",
            "api",
            "--port",
            str(port),
            "--database-url",
            api.settings.database_url,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    other = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(other, proc)
        assert httpx.get(f"{other}/v1/keys", headers=bearer(spare["key"])).status_code == 200
        assert http.delete(f"/v1/keys/{spare['id']}", headers=bearer(key["key"])).status_code == 204
        # The very next request on the other process already fails.
        assert_problem(httpx.get(f"{other}/v1/keys", headers=bearer(spare["key"])), 401)
        assert_problem(httpx.post(f"{other}/v1/tokens", headers=bearer(spare["key"])), 401)
        # Both processes sign with the same key, found in the shared database.
        jwks = [httpx.get(f"{u}/.well-known/jwks.json").json() for u in (api.url, other)]
        assert jwks[0] == jwks[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_migration_head_constant_matches_the_scripts() -> None:
    import tempfile

    from alembic.script import ScriptDirectory

    from svc_server.config import Settings
    from svc_server.db import migrate
    from svc_server.db.session import make_engine

    engine = make_engine(Settings(data_dir=tempfile.mkdtemp()))
    script = ScriptDirectory.from_config(migrate.alembic_config(engine))
    assert script.get_current_head() == migrate.HEAD
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.HEAD
    engine.dispose()


def test_signing_keys_made_before_purposes_stay_token_keys(make_settings: Any) -> None:
    """A database at 0003 with a signing key upgrades in place: the key keeps signing
    tokens, and a credential key of its own appears beside it."""
    from alembic import command
    from sqlalchemy import text

    from svc_server.db import migrate
    from svc_server.db.session import make_engine, make_sessionmaker, transaction
    from svc_server.services import signing

    engine = make_engine(make_settings())
    command.upgrade(migrate.alembic_config(engine), "0003")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO signing_keys (kid, algorithm, private_pem, public_jwk, created_at)"
                " VALUES ('old', 'EdDSA', 'pem', '{\"kid\": \"old\"}', CURRENT_TIMESTAMP)"
            )
        )
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.HEAD
    with transaction(make_sessionmaker(engine)) as session:
        assert signing.ensure_key(session, signing.TOKEN).kid == "old"
        assert signing.jwks(session, signing.TOKEN) == {"keys": [{"kid": "old"}]}
        credential = signing.ensure_key(session, signing.CREDENTIAL)
        assert credential.kid != "old" and credential.purpose == signing.CREDENTIAL
    engine.dispose()


@pytest.mark.parametrize("trusted", [False, True])
def test_forwarded_for_counts_only_from_a_trusted_proxy(make_settings: Any, trusted: bool) -> None:
    """A client that names another address in X-Forwarded-For is still counted under its
    own: it can neither dodge the failed-authentication limit nor lock a victim out. From
    a configured proxy (here loopback) the header is the client's address."""
    settings = make_settings(
        auth_failure_rate_limit="3/minute", trusted_proxies="127.0.0.1" if trusted else ""
    )
    with run_api(settings) as running, httpx.Client(base_url=running.url) as http:
        statuses = [
            http.get(
                "/v1/keys",
                headers={
                    "Authorization": "Bearer sk_live_" + "A" * 49,
                    "X-Forwarded-For": f"203.0.113.{i}",
                },
            ).status_code
            for i in range(5)
        ]
    # Untrusted: five failures from one peer, the limit of three applies. Trusted: five
    # different client addresses, one failure each.
    assert statuses == ([401] * 3 + [429] * 2 if not trusted else [401] * 5)
