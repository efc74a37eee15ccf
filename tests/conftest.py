"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from svc_sdk.mls import Engine


@pytest.fixture
def make_engine(tmp_path: Path) -> Callable[[str], Engine]:
    """Creates an engine with its own data_dir under the test's temporary directory."""

    def make(name: str, **kwargs: int) -> Engine:
        return Engine(tmp_path / name, name.encode(), **kwargs)

    return make
