"""Fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from svc_sdk.mls import Engine

from .support import PostgresServer, RedisServer, optional_server


@pytest.fixture
def make_engine(tmp_path: Path) -> Callable[[str], Engine]:
    """Creates an engine with its own data_dir under the test's temporary directory."""

    def make(name: str, **kwargs: int) -> Engine:
        return Engine(tmp_path / name, name.encode(), **kwargs)

    return make


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer | None]:
    with optional_server(PostgresServer, "postgresql") as server:
        yield server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | None]:
    with optional_server(RedisServer, "redis-server") as server:
        yield server
