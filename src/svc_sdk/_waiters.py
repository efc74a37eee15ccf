"""Tasks on event loops that wait for what threads signal (svc_sdk.aio).

A blocking reader or sender waits on a ``threading.Condition``; a task cannot, without
blocking its loop. So it parks on a future of its own loop, registered beside the
condition, and whoever notifies the condition completes every parked future on its
loop (``call_soon_threadsafe``): the same moment a thread would be woken, and no
thread per waiting task.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only tasks park here: the blocking client never loads asyncio
    import asyncio

    Waiting = tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]


class AsyncWaiters:
    """The parked tasks of one condition. Every method but ``park`` is called with the
    condition's lock held."""

    def __init__(self, lock: threading.Condition) -> None:
        self._lock = lock
        self._waiting: list[Waiting] = []

    def add(self) -> Waiting:
        """Registers the running task's loop; hand the result to ``park``."""
        import asyncio  # a task is calling: asyncio is loaded already

        loop = asyncio.get_running_loop()
        waiting = (loop, loop.create_future())
        self._waiting.append(waiting)
        return waiting

    def wake_all(self) -> None:
        waiting, self._waiting = self._waiting, []
        for loop, future in waiting:
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                loop.call_soon_threadsafe(_wake, future)

    async def park(self, waiting: Waiting, timeout: float) -> None:
        """Waits until woken or ``timeout``. Not ``asyncio.wait_for``: on 3.11 it can
        swallow a cancellation that meets the wake-up, and a cancelled caller would
        drop what the next step takes for it."""
        loop, future = waiting
        timer = loop.call_later(timeout, _wake, future)
        try:
            await future
        finally:
            timer.cancel()
            with self._lock:
                if waiting in self._waiting:
                    self._waiting.remove(waiting)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
