"""Appending and reading back over real bookies: dense offsets, ledger boundaries, seeking."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from broker.managed_ledger import BEFORE_EVERYTHING, AppendResult, EntryCache, Position
from magnetar.common.clock import ManualClock
from magnetar.common.errors import ManagedLedgerClosedError
from magnetar.testing.eventually import eventually
from tests.broker.managed_ledger.conftest import (
    FAST,
    Env,
    append,
    append_all,
    body_of,
    builder,
)


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20], ids=["from-bookies", "from-cache"])
@pytest.mark.parametrize("ml_env", ["fake", "real"], indirect=True)
async def test_concurrent_appends_get_dense_offsets_in_call_order(
    ml_env: Env, cache_bytes: int
) -> None:
    factory = ml_env.factory(
        config=replace(FAST, max_entries_per_ledger=40), cache=EntryCache(cache_bytes)
    )
    ml = await factory.open("public/a/t")
    assert (ml.next_offset, ml.last_confirmed) == (0, BEFORE_EVERYTHING)
    completed: list[int] = []
    futures = []
    for i in range(200):
        future = append(ml, b"m%d" % i, num_messages=1 + i % 3)
        future.add_done_callback(lambda f: completed.append(f.result().first_offset))
        futures.append(future)
    results: list[AppendResult] = await asyncio.gather(*futures)

    expected = [sum(1 + j % 3 for j in range(i)) for i in range(200)]
    assert [r.first_offset for r in results] == expected
    assert completed == expected  # futures completed in call order
    assert ml.next_offset == expected[-1] + 1 + 199 % 3
    positions = [r.position for r in results]
    assert positions == sorted(positions)
    assert len({p.ledger_id for p in positions}) == 5  # 40 entries per ledger
    assert ml.last_confirmed == positions[-1]
    assert [r.publish_time_ms for r in results] == sorted(r.publish_time_ms for r in results)

    # read everything back, across the ledger boundaries, in small and large batches
    for max_entries in (7, 1000):
        start, read = ml.first_position, []
        while True:
            batch = await ml.read(start, max_entries=max_entries, max_bytes=1 << 20)
            if not batch:
                break
            read += batch
            start = ml.next_position(batch[-1].position)
        assert [e.position for e in read] == positions
        assert [body_of(e.payload) for e in read] == [b"m%d" % i for i in range(200)]
        assert [e.first_offset for e in read] == expected
        assert [e.num_messages for e in read] == [1 + i % 3 for i in range(200)]

    await eventually(
        lambda: len(ml.ledgers) == 6, interval_s=0.01
    )  # the full ledger rolls right away
    ledgers = ml.ledgers
    assert [lg.entries for lg in ledgers] == [40, 40, 40, 40, 40, 0]
    assert ledgers[1].first_offset == expected[40]
    assert sum(lg.messages for lg in ledgers) == ml.next_offset
    assert ml.storage_size_bytes == sum(len(e.payload) for e in read)
    assert (ml.entries_added, ml.messages_added) == (200, ml.next_offset)


@pytest.mark.parametrize("ml_env", ["real"], indirect=True)
async def test_appends_past_the_ledger_writers_window_wait_for_room_in_order(
    ml_env: Env,
) -> None:
    # appends that find room go to the ledger at once (no task each); the ones past the
    # writer's window of 3 wait for room, behind them, and every one lands in call order
    client = await ml_env.new_client(max_pending_adds=3)
    ml = await ml_env.factory(client).open("public/a/window")
    bodies = [b"w%d" % i for i in range(60)]
    results = await append_all(ml, bodies)
    assert [r.first_offset for r in results] == list(range(60))
    assert [r.position.entry_id for r in results] == list(range(60))
    read = await ml.read(ml.first_position, max_entries=100, max_bytes=1 << 20)
    assert [body_of(e.payload) for e in read] == bodies
    # and again after the window drained: a lone append goes straight through
    (last,) = await append_all(ml, [b"alone"])
    assert last.first_offset == 60


async def test_read_limits_and_clamping(ml_env: Env) -> None:
    ml = await ml_env.factory(config=replace(FAST, max_entries_per_ledger=10)).open("t")
    results = await append_all(ml, [bytes(100) for _ in range(25)])
    first = ml.first_position
    # max_bytes smaller than one entry: still one entry
    assert len(await ml.read(first, max_entries=10, max_bytes=1)) == 1
    # max_bytes stops after the entry that reaches it
    assert len(await ml.read(first, max_entries=10, max_bytes=250)) == 3
    # a start before the first stored entry reads from it
    assert (await ml.read(Position(0, 0), max_entries=1, max_bytes=1))[0].position == first
    # past the last confirmed entry: nothing
    after = ml.next_position(ml.last_confirmed)
    assert await ml.read(after, max_entries=10, max_bytes=1 << 20) == []
    # at a ledger's end, next_position goes into the next ledger
    end_of_first = results[9].position
    assert ml.next_position(end_of_first) == results[10].position
    assert ml.next_position(end_of_first) == Position(results[10].position.ledger_id, 0)
    # a position past a closed ledger's end is read as the next ledger's start
    beyond = Position(end_of_first.ledger_id, 50)
    assert (await ml.read(beyond, max_entries=1, max_bytes=1))[0].position == results[10].position


async def test_position_for_offset_and_publish_time(ml_env: Env) -> None:
    clock = ManualClock(start_time_ms=1_000_000)
    factory = ml_env.factory(config=replace(FAST, max_entries_per_ledger=8), clock=clock)
    ml = await factory.open("t")
    results = []
    for i in range(30):
        results.append(await append(ml, b"x", num_messages=3))
        if i % 2:
            await clock.advance(1.0)  # two entries per publish millisecond... per second
    by_offset = {r.first_offset + k: r.position for r in results for k in range(3)}
    for offset in (0, 1, 2, 3, 44, 45, 46, 89):
        assert await ml.position_for_offset(offset) == by_offset[offset]
    assert await ml.position_for_offset(90) == ml.next_position(ml.last_confirmed)
    assert await ml.position_for_offset(10**9) == ml.next_position(ml.last_confirmed)
    for r in (results[0], results[5], results[16], results[29]):
        found = await ml.position_for_publish_time(r.publish_time_ms)
        first_at_time = min(x.position for x in results if x.publish_time_ms >= r.publish_time_ms)
        assert found == first_at_time
    assert await ml.position_for_publish_time(0) == results[0].position
    assert await ml.position_for_publish_time(results[-1].publish_time_ms + 1) == ml.next_position(
        ml.last_confirmed
    )


async def test_wait_for_entries_wakes_on_append_and_fails_on_close(ml_env: Env) -> None:
    ml = await ml_env.factory().open("t")
    waiting = asyncio.ensure_future(ml.wait_for_entries(ml.last_confirmed))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    result = await append(ml, b"hello")
    await asyncio.wait_for(waiting, 5)
    assert ml.last_confirmed == result.position
    # already past: returns at once
    await asyncio.wait_for(ml.wait_for_entries(BEFORE_EVERYTHING), 1)
    waiting = asyncio.ensure_future(ml.wait_for_entries(ml.last_confirmed))
    await asyncio.sleep(0.01)
    await ml.close()
    with pytest.raises(ManagedLedgerClosedError):
        await waiting
    with pytest.raises(ManagedLedgerClosedError):
        ml.append(1, builder(1, b"late"))


async def test_an_entries_waiter_completes_on_append_or_by_its_owner_and_fails_on_close(
    ml_env: Env,
) -> None:
    ml = await ml_env.factory().open("t")
    waiter = ml.entries_waiter()
    await asyncio.sleep(0.05)
    assert not waiter.done()
    result = await append(ml, b"hello")
    await asyncio.wait_for(waiter, 5)
    assert ml.last_confirmed == result.position
    # a dispatcher woken for another reason completes (or cancels) its waiter itself; the
    # finished waiters it leaves behind are pruned, and later ones still wake on an append
    for i in range(200):
        abandoned = ml.entries_waiter()
        if i % 2:
            abandoned.set_result(None)
        else:
            abandoned.cancel()
    assert len(ml._waiters) < 100
    waiter = ml.entries_waiter()
    await append(ml, b"again")
    await asyncio.wait_for(waiter, 5)
    waiter = ml.entries_waiter()
    await ml.close()
    with pytest.raises(ManagedLedgerClosedError):
        await waiter
    with pytest.raises(ManagedLedgerClosedError):
        await ml.entries_waiter()  # closed already: failed from the start


async def test_close_waits_for_pending_appends_and_records_final_counts(ml_env: Env) -> None:
    factory = ml_env.factory()
    ml = await factory.open("t")
    futures = [append(ml, b"p%d" % i) for i in range(50)]
    await ml.close()
    assert all(f.done() and not f.exception() for f in futures)
    info = await factory.read_info("t")
    assert info.ledgers[-1].entries == 50
    assert info.next_offset == 50
    metadata = await ml_env.client.ledgers.read(info.ledgers[-1].ledger_id)
    assert metadata.closed
    assert metadata.last_entry_id == 49
    # reopened: the offsets go on, and the new owner starts a new ledger
    again = await factory.open("t")
    assert again is not ml
    assert again.next_offset == 50
    result = await append(again, b"more")
    assert result.first_offset == 50
    await eventually(lambda: again.last_confirmed == result.position, interval_s=0.01)


@pytest.mark.parametrize("ml_env", ["fake", "real"], indirect=True)
async def test_tailing_reads_without_a_cache_follow_the_ledger_being_written(ml_env: Env) -> None:
    factory = ml_env.factory(config=replace(FAST, max_entries_per_ledger=7), cache=EntryCache(0))
    ml = await factory.open("t")
    cursor = ml.open_non_durable_cursor("latest")
    for i in range(20):
        result = await append(ml, b"n%d" % i)
        entries = await cursor.read(max_entries=10, max_bytes=1 << 20)
        assert [e.position for e in entries] == [result.position]
        assert body_of(entries[0].payload) == b"n%d" % i
