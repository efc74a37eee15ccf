"""Admissions: a redeemed invite's agent is added once. Its join request is spent when
the add commit is accepted, so a removal that lands before the admissions look again
does not bring the agent back with the same key package."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from svc_sdk._admissions import Admissions
from svc_sdk.errors import AccessError, InternalError, TransportError

BOB = (b"bob", b"bob's key package")


class _Group:
    def __init__(self) -> None:
        self.roster = {b"alice"}
        self.added: list[bytes] = []

    def members(self) -> list[bytes]:
        return sorted(self.roster)

    def add_members(self, key_packages: list[bytes]) -> object:
        self.added += key_packages
        return object()


class _Commits:
    """Accepts each commit; between two, the owner removes whoever was added (as
    ``remove_member`` on another thread may)."""

    busy = False

    def __init__(self, group: _Group) -> None:
        self.group = group

    def commit(self, make: Any) -> object | None:
        if len(self.group.added) >= 3:
            return None  # enough to tell
        pending = make()
        if pending is not None:
            self.group.roster.add(BOB[0])  # accepted: bob is in
            self.group.roster.discard(BOB[0])  # and removed at once
        return pending


class _Channel:
    name = "acme/tests/admissions"
    _closed = None

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._group = _Group()
        self._commits = _Commits(self._group)

    def _is_admin(self) -> bool:
        return True  # alice, the owner


def test_a_removed_agent_is_not_added_again_from_its_spent_join_request() -> None:
    channel = _Channel()
    admissions = Admissions(channel)  # type: ignore[arg-type]
    admissions.join_requests.append(BOB)
    admissions.do_work()
    assert channel._group.added == [BOB[1]]
    assert admissions.join_requests == []


class _Refusing(_Commits):
    """The relay refuses the commit adding ``refused`` (its invite ended, or its key
    package was used before) and accepts the others."""

    def __init__(self, group: _Group, refused: bytes, error: Exception) -> None:
        super().__init__(group)
        self.refused = refused
        self.error = error
        self.attempts = 0

    def commit(self, make: Any) -> object | None:
        pending = make()
        if pending is None:
            return None
        self.attempts += 1
        if self.group.added[-1] == self.refused:
            raise self.error
        self.group.roster.add(b"carol")
        return pending


CAROL = (b"carol", b"carol's key package")


@pytest.mark.parametrize(
    "error",
    [
        AccessError("channel 'acme/tests/admissions': handshake refused: no longer valid"),
        InternalError("relay rejected a request (INVALID_ARGUMENT): key package used before"),
    ],
)
def test_a_join_request_the_relay_refuses_is_dropped_not_retried(error: Exception) -> None:
    channel = _Channel()
    commits = channel._commits = _Refusing(channel._group, BOB[1], error)
    admissions = Admissions(channel)  # type: ignore[arg-type]
    admissions.join_requests += [BOB, CAROL]
    admissions.do_work()
    assert channel._group.added == [BOB[1], CAROL[1]], "the refusal holds up nobody else"
    assert admissions.join_requests == []
    assert not admissions.has_work()
    admissions.do_work()
    assert commits.attempts == 2, "a refused join request is not tried again"


def test_a_transport_failure_keeps_the_join_request() -> None:
    channel = _Channel()
    channel._commits = _Refusing(channel._group, BOB[1], TransportError("relay went away"))
    admissions = Admissions(channel)  # type: ignore[arg-type]
    admissions.join_requests.append(BOB)
    admissions.do_work()
    assert admissions.join_requests == [BOB]
