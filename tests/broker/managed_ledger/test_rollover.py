"""Rolling over to a new ledger by entries, by size and by age, and never before the minimum age."""

from __future__ import annotations

from dataclasses import replace

from bookie.client.ledger_metadata import LedgerState
from magnetar.common.clock import ManualClock
from magnetar.testing.eventually import eventually
from tests.broker.managed_ledger.conftest import (
    FAST,
    Env,
    append,
    append_all,
)


async def closed_in_metadata(env: Env, ledger_id: int) -> bool:
    return (await env.client.ledgers.read(ledger_id)).state is LedgerState.CLOSED


async def test_roll_by_entries(ml_env: Env) -> None:
    ml = await ml_env.factory(config=replace(FAST, max_entries_per_ledger=10)).open("t")
    results = await append_all(ml, [b"e"] * 35)
    await eventually(lambda: len(ml.ledgers) == 4, interval_s=0.01)
    assert [lg.entries for lg in ml.ledgers] == [10, 10, 10, 5]
    assert [r.position.entry_id for r in results[:12]] == [*range(10), 0, 1]
    for ledger in ml.ledgers[:-1]:
        assert await closed_in_metadata(ml_env, ledger.ledger_id)
    assert not await closed_in_metadata(ml_env, ml.ledgers[-1].ledger_id)
    # the info records the final counts of the rolled ledgers
    info = await ml_env.factories[0].read_info("t")
    assert [lg.entries for lg in info.ledgers[:3]] == [10, 10, 10]
    assert [lg.first_offset for lg in info.ledgers] == [0, 10, 20, 30]


async def test_roll_by_size(ml_env: Env) -> None:
    config = replace(FAST, max_ledger_size_bytes=1000)
    ml = await ml_env.factory(config=config).open("t")
    await append_all(ml, [bytes(300 - 20)] * 9)  # 300 bytes each with the 20-byte header
    await eventually(lambda: len(ml.ledgers) == 3, interval_s=0.01)
    # a ledger rolls once it reaches the limit: the 4th entry takes it to 1200 bytes
    assert [lg.entries for lg in ml.ledgers] == [4, 4, 1]
    assert [lg.size_bytes for lg in ml.ledgers] == [1200, 1200, 300]


async def test_roll_by_age_waits_for_the_minimum_age_and_needs_entries(ml_env: Env) -> None:
    clock = ManualClock()
    config = replace(
        FAST,
        max_entries_per_ledger=5,
        max_ledger_age_ms=60_000,
        min_ledger_age_ms=10_000,
        trim_interval_ms=1_000,
    )
    ml = await ml_env.factory(config=config, clock=clock).open("t")
    # an empty ledger never rolls for age
    await clock.advance(120)
    assert len(ml.ledgers) == 1
    first = ml.ledgers[0].ledger_id

    # over the entry limit, but younger than the minimum age: one ledger takes them all
    ml2 = await ml_env.factory(config=config, clock=clock).open("u")
    await append_all(ml2, [b"x"] * 12)
    assert [lg.entries for lg in ml2.ledgers] == [12]
    await clock.advance(9)
    assert len(ml2.ledgers) == 1
    # at the minimum age the periodic check rolls it (the entry limit was passed long ago)
    await clock.advance(1)
    await eventually(lambda: len(ml2.ledgers) == 2, interval_s=0.01)
    assert [lg.entries for lg in ml2.ledgers] == [12, 0]

    # one entry in a ledger of managed ledger "t": rolled once it is max_ledger_age_ms old
    await append(ml, b"y")
    assert ml.ledgers[0].ledger_id == first  # created 120 s ago, but it was empty until now
    await clock.advance(1)
    await eventually(lambda: len(ml.ledgers) == 2, interval_s=0.01)
    assert [lg.entries for lg in ml.ledgers] == [1, 0]
    second = ml.ledgers[1]
    await append(ml, b"z")
    # the second ledger's age counts from its creation: when the roll ran, at 130 s or 131 s
    await clock.advance((second.created_ms + 59_000 - clock.time_ms()) / 1000)
    assert len(ml.ledgers) == 2
    await clock.advance(1)
    await eventually(lambda: len(ml.ledgers) == 3, interval_s=0.01)
    assert ml.ledgers[1].ledger_id == second.ledger_id
    assert [lg.entries for lg in ml.ledgers] == [1, 1, 0]


async def test_appends_during_a_roll_go_to_the_new_ledger_in_order(ml_env: Env) -> None:
    ml = await ml_env.factory(config=replace(FAST, max_entries_per_ledger=3)).open("t")
    futures = [append(ml, b"%d" % i) for i in range(3)]
    await futures[-1]
    # the roll started as the third entry was sent; these queue behind it
    later = [append(ml, b"%d" % i) for i in range(3, 9)]
    results = [await f for f in futures + later]
    assert [r.first_offset for r in results] == list(range(9))
    assert len({r.position.ledger_id for r in results}) == 3
    positions = [r.position for r in results]
    assert positions == sorted(positions)
