"""Redelivery counts kept with a cursor, and the packed form of a cursor's acked ranges."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.managed_ledger import Position, RedeliveryCounts
from broker.managed_ledger.ack_ranges import AckRanges
from broker.managed_ledger.persistence import (
    StoredCursor,
    decode_cursor,
    encode_cursor,
    pack_ranges,
    unpack_ranges,
)
from magnetar.common.errors import ManagedLedgerError
from proto.format.v1 import managed_ledger_pb2

P = Position


def test_counts_rise_go_with_acks_and_report_changes() -> None:
    changes: list[bool] = []
    counts = RedeliveryCounts(10, on_change=changes.append)
    assert counts.get(P(1, 0)) == 0
    assert counts.increment(P(1, 0)) == 1
    assert counts.increment(P(1, 0)) == 2
    counts.increment(P(1, 5))
    assert counts.items() == [(P(1, 0), 2), (P(1, 5), 1)]
    counts.discard(P(1, 0))
    counts.discard(P(1, 0))  # nothing left to discard: no change reported
    counts.forget_through(P(1, 4))  # nothing at or before it any more
    assert counts.items() == [(P(1, 5), 1)]
    counts.forget_through(P(1, 5))
    assert len(counts) == 0
    # raised counts are told apart from counts that went away
    assert changes == [True, True, True, False, False]


def test_counts_are_bounded_and_the_longest_kept_goes_first() -> None:
    counts = RedeliveryCounts(3)
    for entry in (9, 2, 5):
        counts.increment(P(1, entry))
    counts.increment(P(1, 9))  # raised again: still the first recorded
    counts.increment(P(1, 7))
    assert counts.items() == [(P(1, 2), 1), (P(1, 5), 1), (P(1, 7), 1)]
    assert counts.dropped == 1
    loaded = RedeliveryCounts(2, [(P(1, 1), 1), (P(1, 2), 0), (P(1, 3), 4), (P(1, 4), 2)])
    assert loaded.items() == [(P(1, 3), 4), (P(1, 4), 2)]  # zero counts are not kept
    assert loaded.dropped == 1
    with pytest.raises(ValueError, match=">= 1"):
        RedeliveryCounts(0)


positions = st.builds(P, st.integers(0, 5), st.integers(0, 300))


@given(st.sets(positions, max_size=60))
def test_packed_ranges_round_trip(points: set[Position]) -> None:
    ordered = sorted(points)
    ranges = [(ordered[i], ordered[i + 1]) for i in range(0, len(ordered) - 1, 2)]
    assert unpack_ranges("c", pack_ranges(ranges)) == tuple(ranges)


def test_the_cursor_record_keeps_counts_and_packs_many_ranges_small() -> None:
    ranges = tuple((P(3, 2 * i), P(3, 2 * i)) for i in range(100_000))  # every other entry
    cursor = StoredCursor(
        mark_delete=P(3, -1),
        mark_delete_offset=-1,
        acked_ranges=ranges,
        redelivery_counts=((P(3, 1), 2), (P(3, 3), 1)),
    )
    data = encode_cursor(cursor)
    assert decode_cursor("c", data) == cursor
    # 100,000 holes: about 5 bytes a range (the unpacked form took about 18), well under
    # etcd's 1.5 MiB request limit
    assert len(data) < 600_000
    # a record of format 1 (ranges unpacked) still reads
    old = managed_ledger_pb2.CursorInfo(format_version=1, mark_delete_offset=-1)
    old.mark_delete.ledger_id, old.mark_delete.entry_id = 3, -1
    old.acked_ranges.add().start.ledger_id = 3
    old.acked_ranges[0].end.ledger_id = 3
    assert decode_cursor("c", old.SerializeToString()).acked_ranges == ((P(3, 0), P(3, 0)),)
    bad = managed_ledger_pb2.CursorInfo(format_version=2, packed_acked_ranges=[0, 1, 0])
    with pytest.raises(ManagedLedgerError, match="not a multiple of 4"):
        decode_cursor("c", bad.SerializeToString())
    newer = managed_ledger_pb2.CursorInfo(format_version=3)
    with pytest.raises(ManagedLedgerError, match="format version 3; this broker reads up to 2"):
        decode_cursor("c", newer.SerializeToString())


def test_first_unacked_from_jumps_over_acked_ranges() -> None:
    def successor(p: Position) -> Position:
        return P(p.ledger_id + 1, 0) if p.entry_id >= 9 else P(p.ledger_id, p.entry_id + 1)

    acks = AckRanges(successor, P(1, 2), [(P(1, 5), P(1, 9)), (P(2, 0), P(2, 0))])
    # (1, 9) and (2, 0) are adjacent across the ledger end: one range
    assert acks.ranges == [(P(1, 5), P(2, 0))]
    assert acks.first_unacked_from(P(1, 0)) == P(1, 3)
    assert acks.first_unacked_from(P(1, 4)) == P(1, 4)
    assert acks.first_unacked_from(P(1, 6)) == P(2, 1)
    assert acks.first_unacked_from(P(2, 1)) == P(2, 1)
