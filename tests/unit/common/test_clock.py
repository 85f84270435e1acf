"""The real clock, and the manual clock tests drive time with."""

from __future__ import annotations

import asyncio
import time

import pytest

from magnetar.common.clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock


async def test_system_clock_reads_real_time_and_sleeps() -> None:
    clock: Clock = SYSTEM_CLOCK
    assert isinstance(clock, SystemClock)
    before = clock.monotonic()
    await clock.sleep(0.01)
    await clock.sleep(-1)
    assert clock.monotonic() >= before + 0.01
    # Same epoch and unit as time.time(); the minute of slack only guards against a slow CI.
    assert abs(clock.time_ms() - time.time() * 1000) < 60_000


def test_manual_clock_starts_where_told_and_moves_only_when_advanced() -> None:
    clock = ManualClock(start_monotonic=100.0, start_time_ms=1_000_000)
    assert clock.monotonic() == 100.0
    assert clock.time_ms() == 1_000_000
    assert clock.monotonic() == 100.0


async def test_advance_moves_monotonic_and_wall_time_together() -> None:
    clock = ManualClock(start_time_ms=5_000)
    for _ in range(1000):
        await clock.advance(0.001)
    # Integer nanoseconds inside: a thousand small steps add up exactly.
    assert clock.monotonic() == 1.0
    assert clock.time_ms() == 6_000


async def test_set_time_ms_jumps_the_wall_clock_only() -> None:
    clock = ManualClock(start_time_ms=5_000)
    woke = asyncio.Event()

    async def sleeper() -> None:
        await clock.sleep(1)
        woke.set()

    task = asyncio.create_task(sleeper())
    await asyncio.sleep(0)
    clock.set_time_ms(1_000)
    await asyncio.sleep(0)
    assert clock.time_ms() == 1_000
    assert clock.monotonic() == 0.0
    assert not woke.is_set()

    await clock.advance(1.5)
    assert clock.time_ms() == 2_500
    assert woke.is_set()
    await task


async def test_sleepers_wake_in_deadline_order_at_their_deadlines() -> None:
    clock = ManualClock()
    woken: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woken.append((name, clock.monotonic()))

    tasks = [
        asyncio.create_task(sleeper(name, seconds))
        for name, seconds in [("c", 3.0), ("a", 1.0), ("b", 2.0), ("a2", 1.0)]
    ]
    await asyncio.sleep(0)
    assert clock.sleepers == 4
    assert clock.next_deadline() == 1.0

    await clock.advance(0.5)
    assert woken == []

    await clock.advance(5)
    assert woken == [("a", 1.0), ("a2", 1.0), ("b", 2.0), ("c", 3.0)]
    assert clock.monotonic() == 5.5
    assert clock.sleepers == 0
    assert clock.next_deadline() is None
    await asyncio.gather(*tasks)


async def test_a_sleeper_wakes_exactly_at_its_deadline() -> None:
    clock = ManualClock()
    task = asyncio.create_task(clock.sleep(1))
    await asyncio.sleep(0)

    await clock.advance(0.999)
    assert not task.done()
    await clock.advance(0.001)
    assert task.done()


async def test_a_periodic_task_ticks_every_period_within_one_advance() -> None:
    clock = ManualClock()
    ticks: list[float] = []

    async def every_second() -> None:
        while True:
            await clock.sleep(1)
            ticks.append(clock.monotonic())

    task = asyncio.create_task(every_second())
    await asyncio.sleep(0)
    await clock.advance(3.5)
    assert ticks == [1.0, 2.0, 3.0]

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_work_triggered_by_a_woken_sleeper_has_run_when_advance_returns() -> None:
    clock = ManualClock()
    expired = asyncio.Event()
    handled: list[str] = []

    async def lease_timer() -> None:
        await clock.sleep(10)
        expired.set()

    async def on_expiry() -> None:
        await expired.wait()
        handled.append("session_lost")

    tasks = [asyncio.create_task(lease_timer()), asyncio.create_task(on_expiry())]
    await asyncio.sleep(0)
    await clock.advance(10)
    assert handled == ["session_lost"]
    await asyncio.gather(*tasks)


async def test_cancelled_sleepers_are_forgotten() -> None:
    clock = ManualClock()
    tasks = [asyncio.create_task(clock.sleep(5)) for _ in range(200)]
    keeper = asyncio.create_task(clock.sleep(7))
    await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert clock.sleepers == 1
    assert clock.next_deadline() == 7.0

    await clock.advance(7)
    assert keeper.done()
    assert all(task.cancelled() for task in tasks)


async def test_sleep_zero_returns_without_time_passing() -> None:
    clock = ManualClock()
    await clock.sleep(0)
    await clock.sleep(-3)
    assert clock.monotonic() == 0.0


async def test_time_never_goes_back() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError, match="cannot go back"):
        await clock.advance(-1)
