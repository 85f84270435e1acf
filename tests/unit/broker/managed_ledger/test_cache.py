"""The entry cache: LRU by payload bytes, shared by managed ledgers, invalidated per ledger."""

from __future__ import annotations

import pytest

from broker.managed_ledger import Entry, EntryCache, Position
from magnetar.common.errors import InvalidArgumentError


def entry(ledger_id: int, entry_id: int, size: int) -> Entry:
    return Entry(Position(ledger_id, entry_id), b"x" * size, entry_id, 1, 0)


def test_bounded_in_bytes_and_least_recently_used_goes_first() -> None:
    cache = EntryCache(300)
    for i in range(3):
        cache.put(entry(1, i, 100))
    assert cache.size_bytes == 300
    assert cache.get(Position(1, 0)) is not None  # now the most recently used
    cache.put(entry(1, 3, 100))
    assert cache.size_bytes == 300
    assert cache.evictions == 1
    assert cache.get(Position(1, 1)) is None  # the least recently used went
    assert cache.get(Position(1, 0)) is not None
    assert (cache.hits, cache.misses) == (2, 1)


def test_an_entry_bigger_than_the_cache_is_not_kept() -> None:
    cache = EntryCache(50)
    cache.put(entry(1, 0, 51))
    assert len(cache) == 0
    assert cache.size_bytes == 0


def test_zero_bytes_disables_it() -> None:
    cache = EntryCache(0)
    cache.put(entry(1, 0, 1))
    assert cache.get(Position(1, 0)) is None


def test_invalidating_a_ledger_drops_only_its_entries() -> None:
    cache = EntryCache(10_000)
    for i in range(5):
        cache.put(entry(1, i, 10))
        cache.put(entry(2, i, 10))
    cache.invalidate_ledger(1)
    assert cache.size_bytes == 50
    assert cache.peek(Position(1, 0)) is None
    assert cache.peek(Position(2, 4)) is not None


def test_replacing_an_entry_keeps_the_size_right() -> None:
    cache = EntryCache(1000)
    cache.put(entry(1, 0, 10))
    cache.put(entry(1, 0, 30))
    assert cache.size_bytes == 30


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="bytes >= 0"):
        EntryCache(-1)
