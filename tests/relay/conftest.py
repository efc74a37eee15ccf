"""Relay test fixtures: a real stack (account API + relay) on free loopback ports, with
the channel log in SQLite or in a real redis-server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from svc_sdk.relay_client import RelayConnection
from svc_server.config import Settings
from svc_server.stack import Stack, start_stack, stop_stack

from ..support import RedisCluster, RedisServer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sqlite", "redis", "redis-cluster"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param in ("redis", "redis-cluster"):
        fixture = "redis_server" if request.param == "redis" else "redis_cluster"
        server: RedisServer | RedisCluster | None = request.getfixturevalue(fixture)
        if server is None:
            pytest.skip("no redis-server on this machine")
        server.flush()
        return server.url
    return ""


@pytest.fixture
def make_relay_settings(tmp_path: Path, backend: str) -> Any:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "data_dir": tmp_path / "server",
            "redis_url": backend,
            "signup_rate_limit": "10000/minute",
            "auth_failure_rate_limit": "10000/minute",
        }
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
async def stack(make_relay_settings: Any) -> AsyncIterator[Stack]:
    running = await start_stack(make_relay_settings(), api_port=0, relay_port=0)
    try:
        yield running
    finally:
        await stop_stack(running)


@dataclass
class Account:
    api_url: str
    key: str
    account_id: str

    async def token(self) -> str:
        async with httpx.AsyncClient(base_url=self.api_url) as http:
            response = await http.post(
                "/v1/tokens", headers={"Authorization": f"Bearer {self.key}"}
            )
            response.raise_for_status()
            token: str = response.json()["token"]
            return token


async def new_account(api_url: str, email: str) -> Account:
    async with httpx.AsyncClient(base_url=api_url) as http:
        response = await http.post("/v1/accounts", json={"email": email})
        response.raise_for_status()
        body = response.json()
        return Account(api_url, body["api_key"]["key"], body["account"]["id"])


@pytest.fixture
async def account(stack: Stack) -> Account:
    return await new_account(stack.api_url, "owner@example.com")


async def connect(stack: Stack, account: Account, identity: bytes) -> RelayConnection:
    conn = RelayConnection(stack.relay_url, await account.token(), identity)
    await conn.open()
    return conn
