"""Moving through a managed ledger's ledgers: next positions, locating, first positions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.managed_ledger import BEFORE_EVERYTHING, Position
from broker.managed_ledger.ledger_list import LedgerList, LedgerRecord


def ledgers(*entries: int) -> LedgerList:
    """Ledgers 10, 20, 30... with these entry counts (1 message per entry)."""
    records, offset = [], 0
    for i, count in enumerate(entries):
        records.append(LedgerRecord(10 * (i + 1), offset, 0, entries=count, messages=count))
        offset += count
    return LedgerList(records)


def test_next_position_runs_through_the_ledgers() -> None:
    lst = ledgers(2, 1, 0)
    walk = [BEFORE_EVERYTHING]
    for _ in range(5):
        walk.append(lst.next_position(walk[-1]))
    assert walk[1:] == [
        Position(10, 0),
        Position(10, 1),
        Position(20, 0),
        Position(30, 0),  # the last ledger is being written: its next entry
        Position(30, 1),
    ]
    # a position of a trimmed ledger continues in the first one after it
    assert lst.next_position(Position(5, 7)) == Position(10, 0)
    assert lst.next_position(Position(10, -1)) == Position(10, 0)


def test_locate_skips_past_ledger_ends_and_unknown_ledgers() -> None:
    lst = ledgers(2, 3, 0)
    assert lst.locate(Position(10, 5)) == (1, Position(20, 0))
    assert lst.locate(Position(15, 0)) == (1, Position(20, 0))
    assert lst.locate(Position(20, -1)) == (1, Position(20, 0))
    assert lst.locate(Position(30, 4)) == (2, Position(30, 4))
    assert lst.locate(Position(99, 0)) is None


def test_first_positions_and_offsets() -> None:
    assert ledgers(0).first_position() == Position(10, 0)
    lst = ledgers(2, 3, 0)
    assert lst.first_position() == Position(10, 0)
    assert lst.next_write_position() == Position(30, 0)
    assert lst.holding_offset(2) is lst[1]
    assert lst.holding_offset(5) is None
    assert lst.is_entry(Position(20, 2))
    assert not lst.is_entry(Position(20, 3))
    assert not lst.is_entry(Position(25, 0))


def test_ids_must_ascend() -> None:
    with pytest.raises(ValueError, match="ascending"):
        LedgerList([LedgerRecord(2, 0, 0), LedgerRecord(1, 0, 0)])


@given(st.lists(st.integers(1, 5), min_size=1, max_size=6), st.integers(0, 5))
def test_walking_visits_every_entry_once_in_order(sizes, tail) -> None:
    lst = ledgers(*sizes, tail)
    expected = [Position(10 * (i + 1), e) for i, n in enumerate([*sizes, tail]) for e in range(n)]
    walk, position = [], lst.first_position()
    while position <= expected[-1]:
        located = lst.locate(position)
        assert located is not None
        walk.append(located[1])
        position = lst.next_position(located[1])
    assert walk == expected
