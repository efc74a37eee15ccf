from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from svc_sdk import SvcChannelManager
from svc_sdk.testing import LocalStack

T = TypeVar("T")


def members(stack: LocalStack, channel: str, *names: str) -> list[SvcChannelManager]:
    """Managers for ``names``, all in ``channel``: the first creates it, the others join
    with an invite token."""
    first, *rest = (stack.manager(name) for name in names)
    first.create(channel)
    for manager in rest:
        manager.join_with_token(channel, first.invite(channel), timeout=20.0)
    return [first, *rest]


def collect(receive: Callable[[], list[T]], n: int, timeout: float = 20.0) -> list[T]:
    """Calls ``receive`` until it has returned ``n`` items in total."""
    out: list[T] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out.extend(receive())
    assert len(out) == n, f"got {len(out)} of {n}: {out[-3:]}"
    return out
