"""Fixtures shared by every test package."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from svc_sdk.mls import Engine

from .support import PostgresServer


@pytest.fixture
def make_engine(tmp_path: Path) -> Callable[[str], Engine]:
    """Creates an engine with its own data_dir under the test's temporary directory."""

    def make(name: str, **kwargs: int) -> Engine:
        return Engine(tmp_path / name, name.encode(), **kwargs)

    return make


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer | None]:
    try:
        server = PostgresServer()
    except FileNotFoundError:
        if os.environ.get("CI"):
            raise  # CI installs PostgreSQL; its absence there is a failure, not a skip
        yield None
        return
    server.start()
    try:
        yield server
    finally:
        server.stop()
