"""Ack ranges against a plain set model, over ledgers of random sizes."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.managed_ledger import BEFORE_EVERYTHING, AckRanges, Position


class Layout:
    """Ledgers with fixed entry counts; the last one is open (its successor runs on)."""

    def __init__(self, sizes: list[int]) -> None:
        self.ids = [10 * (i + 1) for i in range(len(sizes))]
        self.sizes = dict(zip(self.ids, sizes, strict=True))
        self.positions = [Position(lid, e) for lid in self.ids for e in range(self.sizes[lid])]

    def successor(self, p: Position) -> Position:
        if p.ledger_id not in self.sizes:
            later = [lid for lid in self.ids if lid > p.ledger_id]
            return Position(later[0], 0) if later else Position(p.ledger_id, p.entry_id + 1)
        i = self.ids.index(p.ledger_id)
        if i == len(self.ids) - 1 or p.entry_id + 1 < self.sizes[p.ledger_id]:
            return Position(p.ledger_id, p.entry_id + 1)
        return Position(self.ids[i + 1], 0)


def model_mark_delete(layout: Layout, acked: set[Position], start: Position) -> Position:
    """The last position of the longest fully acked run right after ``start``."""
    mark = start
    for p in layout.positions:
        if p <= start:
            continue
        if p not in acked:
            break
        mark = p
    return mark


def check_invariants(ranges: AckRanges, layout: Layout, acked: set[Position], start: Position):
    mark = model_mark_delete(layout, acked, start)
    assert ranges.mark_delete == mark
    covered = set()
    previous_end = None
    for s, e in ranges.ranges:
        assert mark < s <= e
        if previous_end is not None:
            assert previous_end < s
            assert layout.successor(previous_end) != s  # adjacent ranges are merged
        previous_end = e
        i = bisect.bisect_left(layout.positions, s)
        while i < len(layout.positions) and layout.positions[i] <= e:
            covered.add(layout.positions[i])
            i += 1
    assert layout.successor(mark) not in {s for s, _ in ranges.ranges}
    assert covered == {p for p in acked if p > mark}
    for p in layout.positions:
        assert ranges.contains(p) == (p <= mark or p in acked)


sizes = st.lists(st.integers(1, 6), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(sizes, st.data())
def test_individual_acks_match_the_model(ledger_sizes, data) -> None:
    layout = Layout(ledger_sizes)
    order = data.draw(st.permutations(layout.positions))
    count = data.draw(st.integers(0, len(order)))
    ranges = AckRanges(layout.successor)
    acked: set[Position] = set()
    for p in order[:count]:
        assert ranges.add(p) == (p not in acked)
        acked.add(p)
        check_invariants(ranges, layout, acked, BEFORE_EVERYTHING)
    # adding again changes nothing
    for p in order[:count]:
        assert not ranges.add(p)


@settings(max_examples=300, deadline=None)
@given(sizes, st.data())
def test_cumulative_acks_mixed_with_individual_ones(ledger_sizes, data) -> None:
    layout = Layout(ledger_sizes)
    ranges = AckRanges(layout.successor)
    acked: set[Position] = set()
    steps = data.draw(
        st.lists(st.tuples(st.booleans(), st.sampled_from(layout.positions)), max_size=20)
    )
    for cumulative, p in steps:
        if cumulative:
            ranges.ack_cumulative(p)
            acked.update(q for q in layout.positions if q <= p)
        else:
            ranges.add(p)
            acked.add(p)
        check_invariants(ranges, layout, acked, BEFORE_EVERYTHING)


@settings(max_examples=200, deadline=None)
@given(sizes, st.data())
def test_restored_ranges_are_normalised(ledger_sizes, data) -> None:
    layout = Layout(ledger_sizes)
    acked = set(data.draw(st.sets(st.sampled_from(layout.positions))))
    # persisted as single-entry ranges in random order, some duplicated: loading merges them
    persisted = [(p, p) for p in acked] + [(p, p) for p in list(acked)[:2]]
    persisted = data.draw(st.permutations(persisted))
    ranges = AckRanges(layout.successor, BEFORE_EVERYTHING, persisted)
    check_invariants(ranges, layout, acked, BEFORE_EVERYTHING)


def test_mark_delete_moves_across_a_ledger_end() -> None:
    layout = Layout([3, 2])
    ranges = AckRanges(layout.successor, Position(10, -1))
    ranges.add(Position(20, 0))
    assert ranges.mark_delete == Position(10, -1)
    assert len(ranges) == 1
    for e in (1, 0, 2):
        ranges.add(Position(10, e))
    assert ranges.mark_delete == Position(20, 0)
    assert len(ranges) == 0


def test_cumulative_ack_inside_a_range_takes_the_whole_range() -> None:
    layout = Layout([10])
    ranges = AckRanges(layout.successor)
    for e in (3, 4, 5, 8):
        ranges.add(Position(10, e))
    assert ranges.ranges == [
        (Position(10, 3), Position(10, 5)),
        (Position(10, 8), Position(10, 8)),
    ]
    assert ranges.ack_cumulative(Position(10, 4))
    assert ranges.mark_delete == Position(10, 5)
    assert ranges.ranges == [(Position(10, 8), Position(10, 8))]
    assert not ranges.ack_cumulative(Position(10, 1))  # behind mark-delete: nothing to do
    ranges.reset(Position(10, 0))
    assert ranges.mark_delete == Position(10, 0)
    assert ranges.ranges == []
    assert not ranges.contains(Position(10, 8))


def test_a_range_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(ValueError, match="ends before it starts"):
        AckRanges(Layout([5]).successor, BEFORE_EVERYTHING, [(Position(10, 3), Position(10, 1))])
