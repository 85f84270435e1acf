"""A byte budget for the entries one add stream or connection has in flight.

Both of the bookie's data adapters (gRPC and framed) stop reading a client's adds while the
bytes it has in flight would pass the budget, so back-pressure reaches the client (through
gRPC's flow control, or TCP's window) instead of memory growing here.
"""

from __future__ import annotations

import asyncio


class InflightBytes:
    """A byte budget: acquire waits while the bytes in flight would pass the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._released = asyncio.Event()

    async def acquire(self, size: int) -> None:
        # a request larger than the whole budget still goes through, alone
        while self.used and self.used + size > self.limit:
            self._released.clear()
            await self._released.wait()
        self.used += size

    def release(self, size: int) -> None:
        self.used -= size
        self._released.set()
