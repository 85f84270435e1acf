"""The entry index: memory that grows with the entries stored, and its checkpoint."""

from __future__ import annotations

import struct
import tracemalloc
from array import array

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.storage import index as index_module
from bookie.storage.index import NO_LOCATION, Index, LedgerIndex, LogPosition, pack_location

MIB = 1024 * 1024


def test_sparse_entry_ids_cost_their_entries_not_their_range() -> None:
    """Issue 23, finding 9: nine one-byte adds 2^20 ids apart grew the index by ~100 MiB."""
    index = Index()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(9):  # ids 0, 2^20, 2^21 + 2^20, ...
            index.put_entry(1, k << 20, -1, 1, 100 * k, 40)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    print(f"nine entries 2^20 apart: the index allocated {grown:,} bytes")
    assert grown < MIB  # the old index allocated ~100 MiB here
    assert index.memory_bytes() < 9 * 1024
    ledger = index.ledger(1)
    assert ledger is not None
    assert [entry for entry, _, _ in ledger.items()] == [k << 20 for k in range(9)]
    assert ledger.get(5 << 20) == (pack_location(1, 500), 40)
    assert ledger.get((5 << 20) + 1) is None
    assert ledger.last_entry_id == 8 << 20


@pytest.mark.parametrize("stride", [1, 3, 1 << 10, 1 << 20, 1 << 40])
def test_accounted_memory_is_proportional_to_entries_whatever_the_ids(stride: int) -> None:
    per_entry = []
    for count in (1_000, 4_000):
        ledger = LedgerIndex(1)
        for i in range(count):
            ledger.put(i * stride, pack_location(1, i), 50)
        assert ledger.entry_count == count
        per_entry.append(ledger.memory_bytes() / count)
    # the same cost per entry at 1,000 and 4,000 entries, and a small one
    assert per_entry[1] <= per_entry[0] * 1.1
    assert per_entry[1] <= 200
    if stride == 1:
        assert per_entry[1] <= 16  # dense ids: 12 bytes of arrays each, plus a little


def test_a_page_turns_dense_once_it_holds_enough_entries() -> None:
    ledger = LedgerIndex(7)
    dense_at, page_size = index_module.DENSE_AT, index_module.PAGE_SIZE
    for i in range(dense_at - 1):
        ledger.put(2 * i, pack_location(3, i), 10 + i)
    assert not ledger.dense
    ledger.put(page_size - 1, pack_location(3, 999), 5)  # the page's last slot
    assert list(ledger.dense) == [0]
    assert not ledger.sparse
    assert ledger.get(page_size - 1) == (pack_location(3, 999), 5)
    assert [e for e, _, _ in ledger.items()] == [
        *(2 * i for i in range(dense_at - 1)),
        page_size - 1,
    ]
    assert ledger.entry_count == dense_at
    # a later copy of an entry (compaction, a repair) supersedes the earlier one
    assert ledger.put(0, pack_location(4, 0), 10) == (pack_location(3, 0), 10)
    assert ledger.entry_count == dense_at


def test_checkpoint_round_trip_keeps_dense_sparse_and_flags() -> None:
    index = Index()
    for i in range(1000):
        index.put_entry(1, i, i - 1, 1 + i // 500, 100 * i, 90)
    for k in range(5):
        index.put_entry(2, k << 30, -1, 3, 10 * k, 33)
    index.fence(2)
    index.fence(3)  # fenced before any entry
    restored, position = Index.deserialize(index.serialize(LogPosition(4, 1234)))
    assert position == LogPosition(4, 1234)
    for ledger_id in (1, 2, 3):
        a, b = index.ledger(ledger_id), restored.ledger(ledger_id)
        assert a is not None
        assert b is not None
        assert list(a.items()) == list(b.items())
        assert (a.fenced, a.lac, a.last_entry_id, a.entry_count, a.stored_bytes) == (
            b.fenced,
            b.lac,
            b.last_entry_id,
            b.entry_count,
            b.stored_bytes,
        )
    assert restored.live_bytes == index.live_bytes
    assert restored.memory_bytes() == index.memory_bytes()


def _v1_checkpoint(position: LogPosition) -> bytes:
    """A checkpoint as bookies wrote them before issue 23: one array from entry 0, a dict."""
    locations = array("q", [pack_location(1, 10 * i) for i in range(5)])
    locations[2] = NO_LOCATION
    lengths = array("I", [20] * 5)
    parts = [
        struct.pack("<8sqqq", b"MGIDX001", position.segment_id, position.offset, 1),
        struct.pack("<qBqqq", 9, 1, 3, len(locations), 1),
        locations.tobytes(),
        lengths.tobytes(),
        struct.pack("<qqI", 10**9, pack_location(2, 0), 21),
    ]
    body = b"".join(parts)
    return body + struct.pack("<I", google_crc32c.value(body))


def test_a_checkpoint_of_the_previous_format_still_loads() -> None:
    index, position = Index.deserialize(_v1_checkpoint(LogPosition(2, 77)))
    assert position == LogPosition(2, 77)
    ledger = index.ledger(9)
    assert ledger is not None
    assert ledger.fenced
    assert ledger.lac == 3
    assert [(e, length) for e, _, length in ledger.items()] == [
        (0, 20),
        (1, 20),
        (3, 20),
        (4, 20),
        (10**9, 21),
    ]
    assert index.live_bytes == {1: 80, 2: 21}


def test_a_damaged_or_truncated_checkpoint_is_refused() -> None:
    index = Index()
    index.put_entry(1, 0, -1, 1, 0, 10)
    data = index.serialize(LogPosition(1, 10))
    damaged = bytearray(data)
    damaged[20] ^= 1
    with pytest.raises(ValueError, match="CRC32C"):
        Index.deserialize(bytes(damaged))
    body = data[:-4]
    header = struct.pack("<8sqqq", b"MGIDX002", 1, 10, 2)  # says two ledgers, holds one
    cut = header + body[len(header) :]
    with pytest.raises(ValueError, match="ends inside a ledger"):
        Index.deserialize(cut + struct.pack("<I", google_crc32c.value(cut)))


entry_ids = st.one_of(
    st.integers(0, 3 * 256),  # dense runs over a few pages
    st.integers(0, 1 << 62),  # wild ids
)


@settings(max_examples=200)
@given(st.lists(st.tuples(entry_ids, st.integers(1, 1 << 20)), max_size=400))
def test_the_index_behaves_as_a_map_and_survives_its_checkpoint(
    puts: list[tuple[int, int]],
) -> None:
    index = Index()
    model: dict[int, tuple[int, int]] = {}
    for n, (entry_id, length) in enumerate(puts):
        location = pack_location(1 + n % 3, n)
        index.put_entry(5, entry_id, -1, 1 + n % 3, n, length)
        model[entry_id] = (location, length)
    ledger = index.ledger(5)
    if not puts:
        assert ledger is None
        return
    assert ledger is not None
    assert [(e, loc, length) for e, loc, length in ledger.items()] == [
        (e, *model[e]) for e in sorted(model)
    ]
    for entry_id, found in model.items():
        assert ledger.get(entry_id) == found
        assert ledger.get(entry_id + 1) == model.get(entry_id + 1)
    assert ledger.entry_count == len(model)
    assert ledger.stored_bytes == sum(length for _, length in model.values())
    assert ledger.last_entry_id == max(model)
    live: dict[int, int] = {}
    for location, length in model.values():
        live[location >> 40] = live.get(location >> 40, 0) + length
    assert {s: b for s, b in index.live_bytes.items() if b} == live
    # memory: a dense page holds at least DENSE_AT entries; the others take a map slot each
    assert len(ledger.dense) * index_module.DENSE_AT <= len(model)
    restored, _ = Index.deserialize(index.serialize(LogPosition(1, 0)))
    restored_ledger = restored.ledger(5)
    assert restored_ledger is not None
    assert list(restored_ledger.items()) == list(ledger.items())
