"""A local write that fails on the receiving agent (disk full, I/O error) loses nothing:
the reading call says so, and the same messages arrive once storage works again.

Faults are injected at the two write sites of the receive path — the inbox write
(LocalState.advance) and the engine's state write (Group.save) — failing chosen calls."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import pytest

from svc_sdk import Channel, InternalError
from svc_sdk.testing import LocalStack

from .helpers import pair


class FailingGroup:
    """The channel's engine group, with chosen calls of ``save`` failing as a full disk
    makes them fail."""

    def __init__(self, inner: Any, fail: set[int]) -> None:
        self._inner, self._fail, self.calls = inner, fail, 0

    def save(self) -> None:
        self.calls += 1
        if self.calls in self._fail:
            raise InternalError("storage failure: database or disk is full (injected)")
        self._inner.save()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def failing_inbox(client: Any, fail: set[int]) -> None:
    real = client.state.advance
    calls = [0]

    def advance(*args: Any) -> None:
        calls[0] += 1
        if calls[0] in fail:
            raise sqlite3.OperationalError("database or disk is full (injected)")
        real(*args)

    client.state.advance = advance


def read_all(channel: Channel, n: int) -> tuple[list[bytes], int]:
    """Reads ``n`` messages, retrying after storage faults; returns them and the faults."""
    got: list[bytes] = []
    faults = 0
    for _ in range(200):
        if len(got) >= n:
            break
        try:
            got.extend(m.data for m in channel.next_messages(timeout=2) or [])
        except InternalError as exc:
            assert "nothing is lost" in str(exc) and str(exc).startswith("runtime error: ")
            faults += 1
    return got, faults


@pytest.mark.parametrize(
    ("inbox_fails", "save_fails"),
    [({1}, set()), ({2, 3}, set()), (set(), {1}), (set(), {2}), ({1}, {2, 4})],
)
def test_failed_writes_on_the_receiving_side_lose_nothing(
    stack: LocalStack, channel_name: str, ids: Any, inbox_fails: set[int], save_fails: set[int]
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        failing_inbox(cb, inbox_fails)
        chan_b._group = FailingGroup(chan_b._group, save_fails)  # type: ignore[assignment]
        sent = [f"m{i}".encode() for i in range(60)]
        faults = 0
        for start in range(0, 60, 10):
            chan_a.send_batch(sent[start : start + 10])
            time.sleep(0.2)  # delivered, waiting: the next call stores them in the inbox
            try:
                chan_b.members()  # processes what arrived, as any call does
            except InternalError as exc:
                assert "nothing is lost" in str(exc) and str(exc).startswith("runtime error: ")
                faults += 1
        got, more = read_all(chan_b, 60)
        assert got == sent, "every message exactly once, in order"
        assert faults + more >= 1, "the calling code learned of the fault"
        # Nothing left behind: a later message arrives, and only it.
        chan_a.send(b"after")
        assert read_all(chan_b, 1)[0] == [b"after"]
