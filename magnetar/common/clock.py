"""Time, as a collaborator: the :class:`Clock` protocol, the real clock and a manual one for tests.

Components that wait, time out, expire leases or stamp messages take a ``clock`` constructor
argument instead of calling :mod:`time` and :func:`asyncio.sleep` directly, so tests can drive
time by hand with :class:`ManualClock` and stay fast and deterministic. Code that takes a clock
must do its waiting through ``clock.sleep``: ``asyncio.timeout`` and ``asyncio.wait_for`` run on
the event loop's own clock and do not see manual time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock"]

_NS_PER_S = 1_000_000_000
_NS_PER_MS = 1_000_000


class Clock(Protocol):
    """Monotonic time for durations, wall-clock time for timestamps, and sleeping."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences are meaningful."""
        ...

    def time_ms(self) -> int:
        """Wall-clock milliseconds since the Unix epoch (may jump when the system clock is set)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` of this clock's monotonic time have passed."""
        ...


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.time_ns` and :func:`asyncio.sleep`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time_ms(self) -> int:
        return time.time_ns() // _NS_PER_MS

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


SYSTEM_CLOCK: Clock = SystemClock()
"""The process's real clock, the default wherever a clock is optional."""


class ManualClock:
    """A clock whose time moves only when a test calls :meth:`advance`.

    Time is kept in integer nanoseconds so many small advances add up exactly. The wall clock
    moves with the monotonic clock, and :meth:`set_time_ms` makes it jump (as NTP might) without
    moving monotonic time or waking sleepers.
    """

    def __init__(
        self,
        *,
        start_monotonic: float = 0.0,
        start_time_ms: int = 1_700_000_000_000,
        settle_yields: int = 10,
    ) -> None:
        """``settle_yields``: loop iterations :meth:`advance` gives woken tasks to run on."""
        self._now_ns = round(start_monotonic * _NS_PER_S)
        self._wall_ms_at_base = start_time_ms
        self._base_ns = self._now_ns
        self._settle_yields = settle_yields
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._abandoned = 0

    def monotonic(self) -> float:
        return self._now_ns / _NS_PER_S

    def time_ms(self) -> int:
        return self._wall_ms_at_base + (self._now_ns - self._base_ns) // _NS_PER_MS

    def set_time_ms(self, time_ms: int) -> None:
        """Set the wall clock to ``time_ms``; monotonic time and sleepers are unaffected."""
        self._wall_ms_at_base = time_ms
        self._base_ns = self._now_ns

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            # Like asyncio.sleep(0): still a point where other tasks get to run.
            await asyncio.sleep(0)
            return
        deadline_ns = self._now_ns + max(1, round(seconds * _NS_PER_S))
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline_ns, next(self._order), waiter))
        try:
            await waiter
        finally:
            if not waiter.done() or waiter.cancelled():
                waiter.cancel()
                self._forget_abandoned()

    def _forget_abandoned(self) -> None:
        # Cancelled sleeps (timeouts that did not fire) stay in the heap until their deadline;
        # compact now and then so a long test with many of them does not grow without bound.
        self._abandoned += 1
        if self._abandoned > 64 and self._abandoned * 2 > len(self._sleepers):
            self._sleepers = [entry for entry in self._sleepers if not entry[2].done()]
            heapq.heapify(self._sleepers)
            self._abandoned = 0

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking sleepers in deadline order.

        Time stops at each sleeper's deadline while that sleeper and whatever it wakes run, so
        a sleeper that sleeps again within the advanced span is woken again in this call.
        """
        if seconds < 0:
            raise ValueError(f"a clock cannot go back: advance({seconds!r})")
        target_ns = self._now_ns + round(seconds * _NS_PER_S)
        while self._sleepers and self._sleepers[0][0] <= target_ns:
            deadline_ns, _, waiter = heapq.heappop(self._sleepers)
            if waiter.done():
                continue
            self._now_ns = max(self._now_ns, deadline_ns)
            waiter.set_result(None)
            await self._settle()
        self._now_ns = target_ns
        await self._settle()

    async def _settle(self) -> None:
        for _ in range(self._settle_yields):
            await asyncio.sleep(0)

    @property
    def sleepers(self) -> int:
        """How many tasks are waiting in :meth:`sleep`."""
        return sum(1 for _, _, waiter in self._sleepers if not waiter.done())

    def next_deadline(self) -> float | None:
        """Monotonic time at which the next sleeper wakes, or ``None`` if nobody sleeps."""
        pending = [deadline for deadline, _, waiter in self._sleepers if not waiter.done()]
        return min(pending) / _NS_PER_S if pending else None
