"""Trimming: consumed ledgers go from the info and the bookies, unless retention keeps them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.managed_ledger import ManagedLedger, Position
from magnetar.common.clock import ManualClock
from magnetar.testing.eventually import eventually
from tests.broker.managed_ledger.conftest import FAST, Env, append_all

TRIMMING = replace(FAST, max_entries_per_ledger=5, retention_time_ms=0, retention_size_bytes=0)


async def gone_from_bookies(env: Env, ledger_id: int) -> None:
    """The bookies are told after the info changed: wait for them to have deleted it."""

    async def gone() -> bool:
        return ledger_id not in await env.ledgers_on_bookies()

    await eventually(gone, interval_s=0.01)


async def gone_from_metadata(env: Env, ledger_id: int) -> None:
    """A trimmed ledger's own metadata is deleted after the managed ledger's info changed (and
    the in-memory list with it): wait for it."""

    async def gone() -> bool:
        return ledger_id not in await env.ledgers_in_metadata()

    await eventually(gone, interval_s=0.01)


async def written(ml: ManagedLedger, count: int, size: int = 80) -> list[Position]:
    results = await append_all(ml, [bytes(size - 20)] * count)  # 20-byte header: `size` each
    return [r.position for r in results]


@pytest.mark.parametrize("ml_env", ["fake", "real"], indirect=True)
async def test_consumed_ledgers_are_deleted_from_metadata_and_bookies(ml_env: Env) -> None:
    factory = ml_env.factory(config=TRIMMING)
    ml = await factory.open("t")
    cursor = await ml.open_cursor("sub", start="earliest")
    positions = await written(ml, 12)  # ledgers of 5, 5, 2
    await eventually(lambda: len(ml.ledgers) == 3, interval_s=0.01)
    first, second, current = (lg.ledger_id for lg in ml.ledgers)
    assert {first, second, current} <= await ml_env.ledgers_in_metadata()
    assert {first, second} <= await ml_env.ledgers_on_bookies()

    cursor.ack_cumulative(positions[3])  # not the whole first ledger: nothing goes
    assert await ml.trim() == 0
    cursor.ack_cumulative(positions[4])  # the first ledger's last entry: it goes (debounced)
    await eventually(lambda: ml.ledgers[0].ledger_id == second, interval_s=0.01)
    assert ml.earliest_offset == 5
    assert ml.first_position == positions[5]
    await gone_from_metadata(ml_env, first)
    await gone_from_bookies(ml_env, first)
    info = await factory.read_info("t")
    assert [lg.ledger_id for lg in info.ledgers] == [second, current]

    # everything consumed: all but the current ledger goes, the current one never does
    cursor.ack_cumulative(positions[-1])
    await eventually(lambda: len(ml.ledgers) == 1, interval_s=0.01)
    assert ml.ledgers[0].ledger_id == current
    assert await ml.trim() == 0
    await gone_from_bookies(ml_env, second)
    assert current in await ml_env.ledgers_on_bookies()
    # a read from before the first stored entry starts at it
    read = await ml.read(positions[0], max_entries=10, max_bytes=1 << 20)
    assert [e.position for e in read] == positions[10:]


async def test_the_slowest_cursor_keeps_its_ledgers(ml_env: Env) -> None:
    ml = await ml_env.factory(config=TRIMMING).open("t")
    fast = await ml.open_cursor("fast", start="earliest")
    slow = await ml.open_cursor("slow", start="earliest")
    positions = await written(ml, 16)
    await eventually(lambda: len(ml.ledgers) == 4, interval_s=0.01)
    fast.ack_cumulative(positions[-1])
    slow.ack_cumulative(positions[7])  # inside the second ledger
    assert await ml.trim() == 1
    assert ml.first_position == positions[5]
    # deleting the slow cursor releases what it held
    await ml.delete_cursor("slow")
    await eventually(lambda: len(ml.ledgers) == 1, interval_s=0.01)


async def test_retention_by_time_keeps_consumed_ledgers_until_they_are_old(ml_env: Env) -> None:
    clock = ManualClock()
    config = replace(
        TRIMMING,
        retention_time_ms=60_000,
        retention_size_bytes=-1,
        trim_interval_ms=3_600_000,  # this test calls trim() itself
    )
    ml = await ml_env.factory(config=config, clock=clock).open("t")
    await written(ml, 5)
    await clock.advance(30)
    await written(ml, 5)
    await eventually(lambda: len(ml.ledgers) == 3, interval_s=0.01)
    # no durable cursor: all consumed, but younger than the retention time
    assert await ml.trim() == 0
    await clock.advance(30)  # the first ledger's last entry is now 60 s old
    assert await ml.trim() == 1
    await clock.advance(30)
    assert await ml.trim() == 1
    assert len(ml.ledgers) == 1  # the current ledger stays


async def test_retention_by_size_keeps_the_newest_consumed_bytes(ml_env: Env) -> None:
    config = replace(TRIMMING, retention_time_ms=-1, retention_size_bytes=900)
    ml = await ml_env.factory(config=config).open("t")
    cursor = await ml.open_cursor("sub", start="earliest")
    positions = await written(ml, 20, size=100)  # four full ledgers of 500 bytes
    await eventually(lambda: len(ml.ledgers) == 5, interval_s=0.01)
    assert await ml.trim() == 0  # nothing consumed yet
    cursor.ack_cumulative(positions[-1])
    # the oldest consumed ledgers go while the consumed bytes left exceed the limit:
    # 2000 -> 1500 -> 1000 -> 500
    await eventually(lambda: len(ml.ledgers) == 2, interval_s=0.01)
    assert [lg.size_bytes for lg in ml.ledgers] == [500, 0]
    assert ml.first_position == positions[15]


async def test_retention_forever_keeps_everything(ml_env: Env) -> None:
    config = replace(TRIMMING, retention_time_ms=-1, retention_size_bytes=-1)
    ml = await ml_env.factory(config=config).open("t")
    await written(ml, 12)
    await eventually(lambda: len(ml.ledgers) == 3, interval_s=0.01)
    assert await ml.trim() == 0
    assert len(ml.ledgers) == 3


async def test_the_periodic_check_trims_what_retention_let_go(ml_env: Env) -> None:
    clock = ManualClock()
    config = replace(
        TRIMMING, retention_time_ms=60_000, retention_size_bytes=-1, trim_interval_ms=5_000
    )
    ml = await ml_env.factory(config=config, clock=clock).open("t")
    await written(ml, 10)
    await eventually(lambda: len(ml.ledgers) == 3, interval_s=0.01)
    first = ml.ledgers[0].ledger_id
    await clock.advance(55)
    assert len(ml.ledgers) == 3
    await clock.advance(5)
    await eventually(lambda: len(ml.ledgers) == 1, interval_s=0.01)
    await gone_from_bookies(ml_env, first)
