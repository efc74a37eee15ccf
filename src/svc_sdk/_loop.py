"""The event loop implementation: uvloop where it is installed (Linux and macOS, a
dependency there), else asyncio's own. uvloop takes about a tenth of a millisecond off
every relay round trip (docs/performance.md); ``SVC_EVENT_LOOP=asyncio`` opts out."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _uvloop() -> Any:
    if os.environ.get("SVC_EVENT_LOOP", "").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def new_event_loop() -> asyncio.AbstractEventLoop:
    uvloop = _uvloop()
    loop: asyncio.AbstractEventLoop = (
        uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
    )
    return loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the chosen loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
