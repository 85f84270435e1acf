"""The shared entry cache serves tailing reads and stays bounded; bad input gets clear errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.managed_ledger import EntryCache, Position
from magnetar.common.errors import (
    EntryTooLargeError,
    InvalidArgumentError,
    ManagedLedgerClosedError,
    ManagedLedgerError,
)
from tests.broker.managed_ledger.conftest import FAST, Env, append, append_all, builder


async def test_tailing_reads_come_from_the_cache(ml_env: Env) -> None:
    cache = EntryCache(1 << 20)
    factory = ml_env.factory(cache=cache)
    one, two = await factory.open("one"), await factory.open("two")
    cursor = await one.open_cursor("sub")
    for round_ in range(5):
        await append_all(one, [b"a%d" % i for i in range(10)])
        await append_all(two, [b"b%d" % i for i in range(10)])
        misses = cache.misses
        entries = await cursor.read(max_entries=100, max_bytes=1 << 20)
        assert len(entries) == 10, round_
        assert cache.misses == misses  # every one served from memory
    assert cache.hits >= 50
    assert len(cache) == 100  # both managed ledgers share it


async def test_the_cache_is_bounded_and_older_entries_come_from_the_bookies(ml_env: Env) -> None:
    cache = EntryCache(2_000)
    ml = await ml_env.factory(cache=cache).open("t")
    results = await append_all(ml, [bytes(180)] * 50)  # 200 bytes each with the header
    assert cache.size_bytes <= 2_000
    assert len(cache) == 10
    assert cache.evictions == 40
    assert cache.peek(results[-1].position) is not None
    assert cache.peek(results[0].position) is None
    misses = cache.misses
    entries = await ml.read(results[0].position, max_entries=50, max_bytes=1 << 20)
    assert [e.position for e in entries] == [r.position for r in results]
    assert cache.misses > misses
    assert len(cache) == 10  # reads of old entries do not push the tail out


async def test_bad_input_gets_clear_errors(ml_env: Env) -> None:
    factory = ml_env.factory()
    with pytest.raises(InvalidArgumentError, match="invalid managed ledger name"):
        await factory.open("/leading/slash")
    with pytest.raises(InvalidArgumentError, match="whitespace"):
        await factory.open("has space")
    ml = await factory.open("t", config=replace(FAST, max_entries_per_ledger=2))
    positions = [r.position for r in await append_all(ml, [b"x"] * 3)]
    with pytest.raises(InvalidArgumentError, match="max_entries must be an int >= 1"):
        await ml.read(ml.first_position, max_entries=0, max_bytes=10)
    with pytest.raises(InvalidArgumentError, match="max_bytes must be an int >= 1"):
        await ml.read(ml.first_position, max_entries=1, max_bytes=-1)
    with pytest.raises(InvalidArgumentError, match="Position"):
        await ml.read((1, "x"), max_entries=1, max_bytes=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="ids are >= -1"):
        ml.next_position(Position(-5, 0))
    with pytest.raises(InvalidArgumentError, match="an offset is an int >= 0"):
        await ml.position_for_offset(-1)
    with pytest.raises(InvalidArgumentError, match="at least one message"):
        ml.append(0, builder(0, b""))
    with pytest.raises(InvalidArgumentError, match="must return bytes"):
        ml.append(1, lambda offset, time_ms: "text")  # type: ignore[arg-type,return-value]
    with pytest.raises(EntryTooLargeError, match="over the"):
        ml.append(1, builder(1, bytes(6 * 1024 * 1024)))
    assert ml.next_offset == 3  # refused appends took no offsets
    with pytest.raises(InvalidArgumentError, match="invalid cursor name"):
        await ml.open_cursor("a/b")
    with pytest.raises(InvalidArgumentError, match="'earliest' or 'latest'"):
        await ml.open_cursor("c", start="middle")  # type: ignore[arg-type]
    cursor = await ml.open_cursor("c", start="earliest")
    with pytest.raises(InvalidArgumentError, match="past the last confirmed entry"):
        cursor.ack([ml.next_position(positions[-1])])
    with pytest.raises(InvalidArgumentError, match="is not an entry"):
        cursor.ack([Position(positions[0].ledger_id, positions[0].entry_id + 99), positions[0]])
    assert not cursor.is_acked(positions[0])  # a bad batch acknowledges nothing
    with pytest.raises(InvalidArgumentError, match="an iterable of positions"):
        cursor.ack(positions[0])  # type: ignore[arg-type]
    with pytest.raises(ManagedLedgerError, match="open on this broker"):
        await factory.delete("t")
    nothing = await factory.read_info("nothing")
    assert not nothing.exists
    assert (nothing.ledgers, nothing.cursors, nothing.next_offset) == ((), (), 0)
    await ml.close()
    with pytest.raises(ManagedLedgerClosedError):
        await ml.read(positions[0], max_entries=1, max_bytes=1)


async def test_delete_removes_ledgers_cursors_and_info(ml_env: Env) -> None:
    factory = ml_env.factory(config=replace(FAST, max_entries_per_ledger=4))
    ml = await factory.open("doomed")
    await ml.open_cursor("sub")
    await append_all(ml, [b"x"] * 10)
    ledger_ids = {lg.ledger_id for lg in ml.ledgers}
    await ml.close()
    await factory.delete("doomed")
    assert not await factory.exists("doomed")
    assert not ledger_ids & await ml_env.ledgers_in_metadata()
    assert not ledger_ids & await ml_env.ledgers_on_bookies()
    assert (await ml_env.store.list("/magnetar/managed-ledgers/doomed/")).records == ()
    await factory.delete("doomed")  # nothing left: nothing to do
    fresh = await factory.open("doomed")
    assert fresh.next_offset == 0
    assert (await append(fresh, b"again")).first_offset == 0
