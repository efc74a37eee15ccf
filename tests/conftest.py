"""Fixtures shared by every test package."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from svc_sdk.mls import Engine
from svc_sdk.relay_link import RelayLink
from svc_sdk.testing import LocalIssuer, LocalStack

from .support import PostgresServer, RedisCluster, RedisServer, optional_server

# One issuer for the session, as one account API is for a deployment.
ISSUER = LocalIssuer()


@pytest.fixture
def issuer() -> LocalIssuer:
    return ISSUER


@pytest.fixture
def make_engine(tmp_path: Path) -> Callable[[str], Engine]:
    """Creates an engine with its own data_dir under the test's temporary directory, with
    a credential from the session's issuer (of account ``ISSUER.account``)."""

    def make(name: str, **kwargs: Any) -> Engine:
        return ISSUER.certify(Engine(tmp_path / name, name.encode(), **kwargs))

    return make


def member_id(name: str) -> bytes:
    """How groups name a ``make_engine`` agent: the issuer's account, then the identity."""
    return ISSUER.account.bytes + name.encode()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer | None]:
    with optional_server(PostgresServer, "postgresql") as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster | None]:
    """Three primaries with a replica each; tests that fail a primary over leave the
    cluster healthy (and the roles swapped) for the next."""
    with optional_server(RedisCluster, "redis-server") as server:
        yield server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | None]:
    with optional_server(RedisServer, "redis-server") as server:
        yield server


# One real local stack (``svc up`` in a subprocess) per test module; each test uses its
# own channel names and agent identities, so tests stay independent.
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


# Every relay link a test opened, and which test: one left open outlives its stack and
# keeps reconnecting to nothing for the rest of the session, on the io thread every other
# test shares. A session that passed fails if any is still open once every fixture has
# closed.
_opened_by: weakref.WeakKeyDictionary[RelayLink, str] = weakref.WeakKeyDictionary()
_running = ["collection"]
_start = RelayLink.start


def _recorded_start(self: RelayLink, timeout: float) -> None:
    _opened_by[self] = _running[0]
    _start(self, timeout)


RelayLink.start = _recorded_start  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _running[0] = item.nodeid
    return (yield)


@pytest.hookimpl(trylast=True)  # after the runner's, which tears down what -x left set up
def pytest_sessionfinish(session: pytest.Session) -> None:
    left = sorted({test for link, test in list(_opened_by.items()) if not link._closing})
    if not left:
        return
    session.config.get_terminal_writer().line(
        "\nrelay links left open (their clients were never closed), opened by: " + ", ".join(left),
        red=True,
    )
    if session.exitstatus == pytest.ExitCode.OK:  # an interrupted run keeps its status
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
