"""What streams may have waiting to be stored: publishes, bounded in number and bytes per
stream, and in bytes for the whole relay."""

from __future__ import annotations

import asyncio

# Publishes of one stream waiting to be stored, and their bytes (see InFlight).
MAX_IN_FLIGHT = 1024
MAX_IN_FLIGHT_BYTES = 16 * 1024 * 1024
# And of all streams together (see Budget).
MAX_RELAY_IN_FLIGHT_BYTES = 256 * 1024 * 1024


class Budget:
    """Bytes of publishes in flight in all of one relay's streams, against ``size``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.bytes = 0
        self._room = asyncio.Event()
        self._room.set()

    def full(self) -> bool:
        if self.bytes >= self.size:
            self._room.clear()
            return True
        return False

    async def wait(self) -> None:
        await self._room.wait()

    def release(self, size: int) -> None:
        self.bytes -= size
        if self.bytes < self.size:
            self._room.set()


class InFlight:
    """Publishes of one stream that wait to be stored. :meth:`acquire` waits while
    ``count`` of them, or ``size`` bytes, are in flight, or the relay's ``budget`` is
    spent and the stream has one in flight already; the stream then stops reading frames,
    and gRPC flow control pushes back on the client. The bytes are what keep streams of
    large messages from holding thousands of them in the relay's memory while the log is
    slower than the clients. One publish may take a stream past its bound, and a stream
    with none in flight may always have one, so a publish larger than the bound still
    goes through and every stream makes progress; the log takes appends in order anyway,
    so a stream that waits for the budget waits for no more than it would in the log's
    queue.

        >>> limit = InFlight(count=1024, size=16 * 1024 * 1024, budget=relay_budget)
        >>> await limit.acquire(len(frame_bytes))  # before the append
        >>> limit.release(len(frame_bytes))  # once it is stored, or failed
    """

    def __init__(self, count: int, size: int, budget: Budget) -> None:
        self.count = count
        self.size = size
        self.budget = budget
        self.publishes = 0
        self.bytes = 0
        self._room = asyncio.Event()
        self._room.set()

    async def acquire(self, size: int) -> None:
        while True:
            if self.publishes >= self.count or self.bytes >= self.size:
                self._room.clear()
                await self._room.wait()
            elif self.publishes and self.budget.full():
                await self.budget.wait()
            else:
                break
        self.publishes += 1
        self.bytes += size
        self.budget.bytes += size

    def release(self, size: int) -> None:
        self.publishes -= 1
        self.bytes -= size
        self.budget.release(size)
        if self.publishes < self.count and self.bytes < self.size:
            self._room.set()
