"""One real local stack (``svc up`` in a subprocess) per test module; each test uses its
own channel names and agent identities, so tests stay independent."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from svc_sdk.testing import LocalStack

_names = itertools.count()


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack() as running:
        yield running


@pytest.fixture
def channel_name() -> str:
    return f"acme/tests/ch{next(_names)}"


@pytest.fixture
def ids() -> Callable[[str], str]:
    """Unique agent identities for this test: ids("alice") -> "alice-<n>"."""
    n = next(_names)
    return lambda name: f"{name}-{n}"
