"""Fixtures for the account API tests: each test gets a fresh database on SQLite and,
in a second run, on a real PostgreSQL server."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from svc_server.config import Settings

from ..support import PostgresServer, RunningApi, run_api

_counter = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'api.sqlite3'}"
    pg: PostgresServer | None = request.getfixturevalue("postgres")
    if pg is None:
        pytest.skip("no PostgreSQL server binaries on this machine")
    return pg.create_database(f"svc_test_{os.getpid()}_{next(_counter)}")


@pytest.fixture
def make_settings(tmp_path: Path, database_url: str) -> Any:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "data_dir": tmp_path / "server",
            "database_url": database_url,
            "signup_rate_limit": "1000/minute",
            "auth_failure_rate_limit": "1000/minute",
        }
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
def api(make_settings: Any) -> Iterator[RunningApi]:
    with run_api(make_settings()) as running:
        yield running


@pytest.fixture
def http(api: RunningApi) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=10) as client:
        yield client


def signup(http: httpx.Client, email: str = "ada@example.com", **extra: Any) -> dict[str, Any]:
    response = http.post("/v1/accounts", json={"email": email, **extra})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
