"""Cursors: reading, individual and cumulative acks, persistence and reload, repositioning."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from broker.managed_ledger import DelayedEntry, ManagedLedger, Position
from broker.managed_ledger.persistence import decode_cursor
from magnetar.common.clock import ManualClock
from magnetar.common.errors import (
    CursorNotFoundError,
    InvalidArgumentError,
    ManagedLedgerFencedError,
)
from magnetar.testing.eventually import eventually
from metadata import layout
from tests.broker.managed_ledger.conftest import (
    FAST,
    Env,
    append_all,
    body_of,
)

SMALL_LEDGERS = replace(FAST, max_entries_per_ledger=5)


async def written(ml: ManagedLedger, count: int, num_messages: int = 2) -> list[Position]:
    results = await append_all(ml, [b"m%d" % i for i in range(count)], num_messages)
    return [r.position for r in results]


async def stored_cursor(env: Env, ml: str, name: str):
    record = await env.store.get(layout.managed_ledger_cursor(ml, name))
    assert record is not None
    return decode_cursor(name, record.value)


async def test_read_ack_and_mark_delete_across_ledger_ends(ml_env: Env) -> None:
    ml = await ml_env.factory(config=SMALL_LEDGERS).open("t")
    cursor = await ml.open_cursor("sub", start="earliest")
    positions = await written(ml, 12)  # ledgers of 5, 5, 2 entries
    more_before_reading = cursor.has_more
    assert more_before_reading
    assert cursor.backlog_messages == 24

    entries = await cursor.read(max_entries=100, max_bytes=1 << 20)
    assert [e.position for e in entries] == positions
    assert not cursor.has_more
    assert cursor.read_position == ml.next_position(positions[-1])

    # holes: ack 1..6 individually (entry 0 still missing), across the first ledger's end
    cursor.ack(positions[1:7])
    assert cursor.mark_delete < positions[0]
    assert cursor.ack_hole_ranges == 1
    assert cursor.is_acked(positions[5])
    assert not cursor.is_acked(positions[0])
    assert cursor.backlog_messages == 24 - 12
    cursor.ack([positions[0]])  # fills the hole: mark-delete jumps into the second ledger
    assert cursor.mark_delete == positions[6]
    assert positions[6].ledger_id != positions[0].ledger_id
    assert cursor.mark_delete_offset == 13
    assert cursor.ack_hole_ranges == 0
    assert cursor.backlog_messages == 10

    cursor.ack_cumulative(positions[9])  # the last entry of the second ledger
    assert cursor.mark_delete == positions[9]
    assert cursor.mark_delete_offset == 19
    cursor.ack([positions[10], positions[4]])  # the first is next; the second is old news
    assert cursor.mark_delete == positions[10]
    assert cursor.backlog_messages == 2


async def test_state_persists_and_a_new_owner_reloads_it(ml_env: Env) -> None:
    config = replace(SMALL_LEDGERS, max_inline_ack_ranges=2)
    ml = await ml_env.factory(config=config).open("t")
    cursor = await ml.open_cursor("sub", start="earliest")
    positions = await written(ml, 14)
    await cursor.read(max_entries=100, max_bytes=1 << 20)
    cursor.ack_cumulative(positions[2])
    cursor.ack([positions[4], positions[6], positions[7], positions[10], positions[12]])
    assert cursor.ack_hole_ranges == 4
    assert cursor.ack_ranges_over_limit  # four ranges, past the limit of two
    # one of the two messages of entry 13 is acknowledged: persisted too
    assert not cursor.ack_indexes(positions[13], [1], 2)
    assert cursor.acked_indexes(positions[13]) == {1}
    cursor.record_subscription_type(3)
    await cursor.flush()
    stored = await stored_cursor(ml_env, "t", "sub")
    assert stored.mark_delete == positions[2]
    assert stored.mark_delete_offset == 5
    # every range is persisted, over the limit or not: the limit only stops new dispatches
    assert list(stored.acked_ranges) == [
        (positions[4], positions[4]),
        (positions[6], positions[7]),
        (positions[10], positions[10]),
        (positions[12], positions[12]),
    ]
    assert stored.batch_acks == ((positions[13], 2, frozenset({1})),)
    assert stored.subscription_type == 3
    await ml.close()

    new = await ml_env.factory(await ml_env.new_client(), config=config).open("t")
    reloaded = new.cursors["sub"]
    assert reloaded.mark_delete == positions[2]
    assert reloaded.mark_delete_offset == 5
    assert reloaded.read_position == positions[3]
    assert reloaded.subscription_type == 3
    assert reloaded.acked_indexes(positions[13]) == {1}
    entries = await reloaded.read(max_entries=100, max_bytes=1 << 20)
    # nothing acknowledged comes back: only the holes (and the partly acked entry 13)
    assert [e.position for e in entries] == [positions[i] for i in (3, 5, 8, 9, 11, 13)]
    # the other message of entry 13 completes it
    assert reloaded.ack_indexes(positions[13], [0], 2)
    assert reloaded.is_acked(positions[13])
    assert reloaded.acked_indexes(positions[13]) == frozenset()
    assert await new.open_cursor("sub", start="latest") is reloaded  # existing: start ignored


async def test_persisting_is_rate_limited_and_flushed_on_close(ml_env: Env) -> None:
    clock = ManualClock()
    config = replace(FAST, cursor_persist_interval_ms=1000)
    factory = ml_env.factory(config=config, clock=clock)
    ml = await factory.open("t")
    cursor = await ml.open_cursor("sub", start="earliest")
    positions = await written(ml, 10)

    cursor.ack([positions[0]])
    await clock.advance(0)  # the first change after a quiet spell is written at once
    for _ in range(20):
        await clock.advance(0)
    assert (await stored_cursor(ml_env, "t", "sub")).mark_delete == positions[0]
    version = cursor.version
    for p in positions[1:6]:
        cursor.ack([p])
        await clock.advance(0.1)
    # within the interval: nothing more was written
    assert cursor.version == version
    dirty_within_the_interval = cursor.dirty
    assert dirty_within_the_interval
    await clock.advance(0.6)
    for _ in range(20):
        await clock.advance(0)
    stored = await stored_cursor(ml_env, "t", "sub")
    assert stored.mark_delete == positions[5]
    assert cursor.version != version
    assert not cursor.dirty

    cursor.ack([positions[6]])
    await ml.close()  # persisted on close, without waiting for the interval
    assert (await stored_cursor(ml_env, "t", "sub")).mark_delete == positions[6]


async def test_a_receipt_waiter_is_persisted_at_once_with_what_came_meanwhile(
    ml_env: Env,
) -> None:
    """Acks a client waits a receipt for do not wait out the interval: a client acknowledging
    one message at a time with receipts would otherwise get one ack a second. Acks made while a
    write is under way share the next write."""
    clock = ManualClock()
    config = replace(FAST, cursor_persist_interval_ms=1000)
    ml = await ml_env.factory(config=config, clock=clock).open("t")
    cursor = await ml.open_cursor("sub", start="earliest")
    positions = await written(ml, 10)
    cursor.ack([positions[0]])
    await cursor.wait_persisted(cursor.changes)  # the first write of a quiet spell
    written_once = cursor.version
    cursor.ack([positions[1]])  # no waiter: waits for the interval
    for _ in range(20):
        await clock.advance(0)
    assert cursor.version == written_once
    for p in positions[2:5]:
        cursor.ack([p])
    # the manual clock never moves: this returns only if no interval is waited out
    await asyncio.wait_for(cursor.wait_persisted(cursor.changes), 5)
    assert (await stored_cursor(ml_env, "t", "sub")).mark_delete == positions[4]
    assert not cursor.dirty


async def test_reset_seek_and_rewind(ml_env: Env) -> None:
    ml = await ml_env.factory(config=SMALL_LEDGERS).open("t")
    cursor = await ml.open_cursor("sub", start="earliest")
    positions = await written(ml, 12)
    await cursor.read(max_entries=4, max_bytes=1 << 20)
    assert cursor.read_position == positions[4]

    cursor.rewind()  # nothing acked: back to the start
    assert cursor.read_position == positions[0]
    cursor.ack_cumulative(positions[1])
    cursor.ack([positions[3]])
    cursor.rewind()
    assert cursor.read_position == positions[2]
    assert [e.position for e in await cursor.read(max_entries=2, max_bytes=1 << 20)] == [
        positions[2],
        positions[4],  # 3 was acked
    ]

    cursor.seek(positions[8])  # read position only
    assert cursor.mark_delete == positions[1]
    assert (await cursor.read(max_entries=1, max_bytes=1))[0].position == positions[8]

    await cursor.reset(positions[6])  # everything before 6 acked, nothing after; persisted now
    assert cursor.mark_delete == Position(positions[6].ledger_id, positions[6].entry_id - 1)
    assert cursor.mark_delete_offset == 11
    assert cursor.read_position == positions[6]
    assert not cursor.is_acked(positions[6])
    assert cursor.ack_hole_ranges == 0
    assert (await stored_cursor(ml_env, "t", "sub")).mark_delete == cursor.mark_delete
    await cursor.reset(positions[0])
    assert cursor.backlog_messages == 24
    assert [e.position for e in await cursor.read(max_entries=100, max_bytes=1 << 30)] == positions


async def test_start_positions(ml_env: Env) -> None:
    ml = await ml_env.factory(config=SMALL_LEDGERS).open("t")
    positions = await written(ml, 8)
    latest = await ml.open_cursor("latest")
    assert latest.mark_delete == positions[-1]
    assert latest.backlog_messages == 0
    assert not latest.has_more
    earliest = await ml.open_cursor("earliest", start="earliest")
    assert earliest.backlog_messages == 16
    at = await ml.open_cursor("at", start=positions[6])
    assert at.read_position == positions[6]
    assert at.mark_delete_offset == 11
    assert at.backlog_messages == 4
    later = await written(ml, 1)
    assert [e.position for e in await latest.read(max_entries=10, max_bytes=1 << 20)] == later


async def test_a_non_durable_cursor_holds_nothing_back(ml_env: Env) -> None:
    config = replace(SMALL_LEDGERS, retention_time_ms=0, retention_size_bytes=0)
    ml = await ml_env.factory(config=config).open("t")
    reader = ml.open_non_durable_cursor("earliest")
    assert not reader.durable
    assert ml.cursors == {}
    positions = await written(ml, 12)
    # no durable cursor: everything but the current ledger counts as consumed, and goes
    await eventually(lambda: ml.first_position == positions[10], interval_s=0.01)
    assert len(ml.ledgers) == 1
    # the reader goes on from what is still stored
    rest = await reader.read(max_entries=100, max_bytes=1 << 20)
    assert [e.position for e in rest] == positions[10:]
    reader.ack([positions[10]])
    await reader.flush()  # nothing to persist
    assert (await ml_env.store.list(layout.managed_ledger_cursors("t"))).records == ()


async def test_delete_cursor(ml_env: Env) -> None:
    ml = await ml_env.factory().open("t")
    await ml.open_cursor("sub")
    await ml.delete_cursor("sub")
    assert "sub" not in ml.cursors
    assert await ml_env.store.get(layout.managed_ledger_cursor("t", "sub")) is None
    with pytest.raises(CursorNotFoundError, match="has no cursor 'sub'"):
        await ml.delete_cursor("sub")


async def test_reading_skips_acked_entries_and_payloads_are_intact(ml_env: Env) -> None:
    ml = await ml_env.factory(config=SMALL_LEDGERS).open("t")
    cursor = await ml.open_cursor("sub", start="earliest")
    positions = await written(ml, 10)
    cursor.ack(positions[0:4])
    cursor.ack(positions[5:9])
    entries = await cursor.read(max_entries=100, max_bytes=1 << 20)
    assert [body_of(e.payload) for e in entries] == [b"m4", b"m9"]


async def test_redelivery_counts_persist_with_the_cursor_and_a_new_owner_continues(
    ml_env: Env,
) -> None:
    config = replace(SMALL_LEDGERS, max_inline_ack_ranges=2)
    ml = await ml_env.factory(config=config).open("t")
    cursor = await ml.open_cursor("sub", start="earliest")
    positions = await written(ml, 8)
    await cursor.read(max_entries=100, max_bytes=1 << 20)
    cursor.redelivery_counts.increment(positions[1])
    cursor.redelivery_counts.increment(positions[1])
    cursor.redelivery_counts.increment(positions[6])
    persisted_before = cursor.counts_persisted
    assert not persisted_before
    await asyncio.wait_for(cursor.wait_counts_persisted(), 5)  # at once, not after an interval
    assert cursor.counts_persisted
    stored = await stored_cursor(ml_env, "t", "sub")
    assert stored.redelivery_counts == ((positions[1], 2), (positions[6], 1))
    cursor.ack([positions[6]])  # acknowledged: its count goes
    cursor.ack([positions[2], positions[4]])
    # three ranges, over the limit of two, but two entries are parked (delayed): they
    # leave holes on purpose, and those do not count
    assert cursor.ack_hole_ranges == 3
    over_before = cursor.ack_ranges_over_limit
    assert over_before
    cursor.parked_entries = 2
    assert not cursor.ack_ranges_over_limit
    await ml.close()

    new = await ml_env.factory(await ml_env.new_client(), config=config).open("t")
    reloaded = new.cursors["sub"]
    assert reloaded.redelivery_counts.items() == [(positions[1], 2)]
    assert reloaded.redelivery_counts.increment(positions[1]) == 3
    # reading after the reload skips the acknowledged ranges
    entries = await reloaded.read(max_entries=100, max_bytes=1 << 20)
    assert [e.position for e in entries] == [positions[i] for i in (0, 1, 3, 5, 7)]
    reloaded.ack_cumulative(positions[2])
    assert reloaded.redelivery_counts.items() == []


async def test_a_cursor_jumps_over_entries_to_skip_without_reading_them(ml_env: Env) -> None:
    """A subscription that loaded its delay index holds those entries aside already: its
    cursor reads around them (not reading them from the bookies at all), across ledger ends
    and acknowledged ranges, and a rewind forgets the skip."""
    ml = await ml_env.factory(config=SMALL_LEDGERS).open("t")
    cursor = await ml.open_cursor("sub", start="earliest")
    positions = await written(ml, 14)  # ledgers of 5, 5, 4 entries
    read_from_ml: list[Position] = []
    real_read = ml.read

    async def spy(start: Position, *, max_entries: int, max_bytes: int):
        entries = await real_read(start, max_entries=max_entries, max_bytes=max_bytes)
        read_from_ml.extend(e.position for e in entries)
        return entries

    ml.read = spy  # type: ignore[method-assign]
    skipped = {positions[i] for i in (0, 2, 3, 4, 5, 9, 13)}  # 4..5 spans a ledger end
    cursor.ack([positions[7]])
    cursor.skip_on_read(skipped)
    got = []
    while cursor.has_more:
        got += [e.position for e in await cursor.read(max_entries=3, max_bytes=1 << 20)]
    expected = [p for i, p in enumerate(positions) if p not in skipped and i != 7]
    assert got == expected
    assert not skipped & set(read_from_ml)
    # a rewind (a type change: everything is read again) forgets what to skip
    cursor.rewind()
    again = await cursor.read(max_entries=100, max_bytes=1 << 20)
    assert {e.position for e in again} >= skipped


async def test_delay_index_buckets_persist_reload_and_fence(ml_env: Env) -> None:
    """Buckets are records of the cursor: written and deleted only by the current owner, read
    back by the next, and gone with a reset, the cursor or the managed ledger."""
    old = await ml_env.factory().open("t")
    positions = [r.position for r in await append_all(old, [b"x"] * 4, 3)]
    cursor = await old.open_cursor("sub", start="earliest")
    bucket = (
        DelayedEntry(positions[1], 1_900_000_000_000, 3, (7,)),
        DelayedEntry(positions[0], 1_900_000_000_500, 3, (1, 2, 3)),
        DelayedEntry(positions[3], 1_800_000_000_000, 1),
    )
    await cursor.write_delay_bucket("0001-a", bucket)
    await cursor.write_delay_bucket("0002-b", bucket[2:])
    with pytest.raises(InvalidArgumentError, match="bucket name"):
        await cursor.write_delay_bucket("../info", bucket)
    assert await cursor.load_delay_index() == {
        "0001-a": tuple(sorted(bucket, key=lambda e: e.position)),
        "0002-b": bucket[2:],
    }
    await cursor.delete_delay_bucket("0002-b")
    factory = ml_env.factory(await ml_env.new_client())
    new = await factory.open("t")
    assert list(await new.cursors["sub"].load_delay_index()) == ["0001-a"]
    with pytest.raises(ManagedLedgerFencedError):
        await cursor.write_delay_bucket("0003-c", bucket)
    assert list(await new.cursors["sub"].load_delay_index()) == ["0001-a"]
    await new.cursors["sub"].reset(positions[2])
    assert await new.cursors["sub"].load_delay_index() == {}
    await new.cursors["sub"].write_delay_bucket("0004-d", bucket)
    await new.delete_cursor("sub")
    assert not (await ml_env.store.list(layout.managed_ledger_delay_indexes("t"))).records
    other = await new.open_cursor("other", start="earliest")
    await other.write_delay_bucket("0005-e", bucket)
    await new.close()
    await factory.delete("t")
    assert not (await ml_env.store.list(layout.managed_ledger_delay_indexes("t"))).records
