"""The delay index's bookkeeping and its bucket format (no I/O)."""

from __future__ import annotations

import pytest

from broker.managed_ledger import DelayedEntry, Position
from broker.managed_ledger.persistence import decode_delay_bucket, encode_delay_bucket
from broker.service.delay_index import MAX_BUCKET_BYTES, DelayIndex
from broker.service.dispatch import Dispatcher, Item
from broker.service.streams import SubscriptionType
from magnetar.common.errors import ManagedLedgerError
from proto.format.v1 import managed_ledger_pb2

HOUR_MS = 3_600_000


def entry(n: int, at: int = HOUR_MS, hashes: tuple[int, ...] = ()) -> DelayedEntry:
    return DelayedEntry(Position(3 + n // 10, n % 10), at + n, 1 + n % 3, hashes)


def test_the_bucket_format_round_trips_out_of_order_entries_across_ledgers() -> None:
    entries = [entry(15, hashes=(1, 2)), entry(2, at=5), entry(3, hashes=(0xFFFFFFFF,)), entry(40)]
    data = encode_delay_bucket(entries)
    assert decode_delay_bucket("k", data) == tuple(sorted(entries, key=lambda e: e.position))
    assert len(data) < 60  # deltas, not full positions and times


def test_a_bad_bucket_names_its_key_and_what_is_wrong() -> None:
    with pytest.raises(ManagedLedgerError, match="bucket 'k1' cannot be decoded"):
        decode_delay_bucket("k1", b"\xff\xff\xff")
    torn = managed_ledger_pb2.DelayBucket.FromString(encode_delay_bucket([entry(1), entry(2)]))
    del torn.deliver_at_ms[-1]
    with pytest.raises(ManagedLedgerError, match="'k2' is inconsistent: 2 entries"):
        decode_delay_bucket("k2", torn.SerializeToString())
    newer = managed_ledger_pb2.DelayBucket(format_version=9)
    with pytest.raises(ManagedLedgerError, match="format version 9"):
        decode_delay_bucket("k3", newer.SerializeToString())


def test_a_bucket_is_sealed_by_count_by_time_or_by_size() -> None:
    index = DelayIndex(bucket_entries=3, seal_after_ms=1_000)
    index.add(entry(1), now_ms=0)
    index.add(entry(2), now_ms=10)
    assert not index.seal_due(999)
    assert index.next_seal_ms() == 1_000
    assert index.seal_due(1_000)
    index.add(entry(3), now_ms=20)
    assert index.seal_due(21)
    name = index.seal(21)
    assert name is not None
    assert index.unwritten[name] == (entry(1), entry(2), entry(3))
    assert index.buckets == 1
    assert index.open_entries == 0
    assert index.next_seal_ms() is None
    big = DelayIndex(bucket_entries=1_000_000, seal_after_ms=10**9)
    n = 0
    while not big.seal_due(0):
        big.add(entry(n, hashes=tuple(range(1_000))), now_ms=0)
        n += 1
    assert n == -(-MAX_BUCKET_BYTES // (16 + 5_000))


def test_buckets_are_deleted_once_nothing_in_them_waits() -> None:
    index = DelayIndex(bucket_entries=2, seal_after_ms=1_000)
    for n in (1, 2):
        index.add(entry(n), now_ms=0)
    first = index.seal(0)
    for n in (3, 4):
        index.add(entry(n), now_ms=0)
    second = index.seal(0)
    assert first is not None
    assert second is not None
    # the first is written; the second empties before its write: never written, nothing to delete
    index.writing(first)
    index.written(first, ok=True)
    for n in (3, 4):
        index.released(entry(n).position)
    assert second not in index.unwritten
    assert not index.undeleted
    index.released(entry(1).position)
    assert not index.undeleted
    index.released(entry(2).position)
    assert index.undeleted == {first}
    index.deleted(first)
    assert not index.has_work
    assert index.buckets == 0


def test_a_bucket_emptied_while_its_write_is_under_way_is_deleted_after_it() -> None:
    index = DelayIndex(bucket_entries=1, seal_after_ms=1_000)
    index.add(entry(1), now_ms=0)
    name = index.seal(0)
    assert name is not None
    index.writing(name)
    index.released(entry(1).position)
    index.written(name, ok=False)  # failed, or its answer was lost: delete it anyway
    assert index.undeleted == {name}
    assert not index.unwritten


def test_a_failed_write_is_tried_again_and_open_entries_leave_quietly() -> None:
    index = DelayIndex(bucket_entries=5, seal_after_ms=1_000)
    index.add(entry(1), now_ms=0)
    index.add(entry(2), now_ms=0)
    index.released(entry(2).position)  # due (or acked) before any seal
    name = index.seal(0)
    assert name is not None
    index.writing(name)
    index.written(name, ok=False)
    assert index.unwritten[name] == (entry(1),)


def test_loaded_buckets_count_only_what_waits_and_empty_ones_go() -> None:
    index = DelayIndex()
    index.loaded("b1", [entry(1).position, entry(2).position])
    index.loaded("b2", [])
    assert index.buckets == 1
    assert index.undeleted == {"b2"}
    index.released(entry(1).position)
    index.released(entry(2).position)
    assert index.undeleted == {"b1", "b2"}
    index.clear()
    assert not index.has_work


def test_the_dispatcher_reports_every_entry_entering_and_leaving_delayed() -> None:
    index = DelayIndex(bucket_entries=100, seal_after_ms=10**9)
    dispatcher = Dispatcher(SubscriptionType.SHARED, delay_index=index)
    dispatcher.add("c")
    later = [Item(Position(1, i), 1, deliver_at_ms=HOUR_MS + i) for i in range(3)]
    plan = dispatcher.assign(later, now_ms=0)
    assert not plan.assignments
    assert index.open_entries == 3
    dispatcher.assign(later[:1], now_ms=0)  # read again: waits once
    assert index.open_entries == 3
    name = index.seal(0)
    assert name is not None
    index.writing(name)
    index.written(name, ok=True)
    held = dispatcher.hold_indexed("old", [entry(50), DelayedEntry(Position(1, 0), 5, 1)])
    assert held == [entry(50).position]  # (1, 0) waits already
    dispatcher.acked(dispatcher.slots[0], Position(1, 1))
    assert dispatcher.release_due(HOUR_MS + 2) == 2  # (1, 0) and (1, 2)
    assert index.undeleted == {name}
    dispatcher.forget_through(Position(9, 0))
    assert index.undeleted == {name, "old"}
    dispatcher.reset()
    assert not index.has_work
