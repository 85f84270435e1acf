"""A cursor's acknowledgement state against a set of acknowledged messages.

The real :class:`ManagedCursor` runs over :class:`FakeLedger`, which has exactly what a cursor
uses of its managed ledger: ledgers that grow and roll over (an empty ledger is replaced by the
next, as the managed ledger does), position arithmetic across ledger ends, the ackable check and
offset hints. The model is the set of acknowledged messages, ``(position, batch index)``.

Rules acknowledge entries one by one (also in requests that name a bad position, which must
change nothing), acknowledge some messages of a batch, acknowledge cumulatively, and persist and
reload the cursor the way the managed ledger does (``stored()`` -> ``encode_cursor`` ->
``decode_cursor`` -> a new cursor). After every step the cursor, and a cursor reloaded from its
persisted record, must show exactly the model's acknowledged messages, with mark-delete the last
entry of the fully acknowledged run from the start, every range persisted even beyond
``max_inline_ack_ranges`` (small here), and the managed ledger told whenever mark-delete moves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.managed_ledger import ManagedCursor, ManagedLedgerConfig, Position
from broker.managed_ledger.persistence import StoredCursor, decode_cursor, encode_cursor
from broker.managed_ledger.types import BEFORE_EVERYTHING, check_position
from magnetar.common.clock import ManualClock
from magnetar.common.errors import InvalidArgumentError

if TYPE_CHECKING:
    from broker.managed_ledger.ports import CursorHost

MAX_INLINE_ACK_RANGES = 3
FIRST_LEDGER = 10

Msg = tuple[Position, int]


class FakeLedger:
    """Some of what :class:`ManagedCursor` uses of its host (:class:`CursorHost`), over ledgers
    in memory."""

    name = "tenant/ns/topic-partition-0"

    def __init__(self) -> None:
        self.config = ManagedLedgerConfig(max_inline_ack_ranges=MAX_INLINE_ACK_RANGES)
        self.closed = False
        self.ledgers: list[tuple[int, list[int]]] = [(FIRST_LEDGER, [])]
        """(ledger id, messages in each entry), oldest first; the last one is being written."""
        self.moved: list[Position] = []
        """Mark-delete positions cursors reported (``cursor_moved``)."""

    # --- the layout ------------------------------------------------------------------------------

    def append(self, num_messages: int) -> Position:
        ledger_id, entries = self.ledgers[-1]
        entries.append(num_messages)
        return Position(ledger_id, len(entries) - 1)

    def roll(self, gap: int) -> None:
        """Start the next ledger; an empty one is replaced, as the managed ledger does."""
        ledger_id, entries = self.ledgers[-1]
        if not entries:
            self.ledgers.pop()
        self.ledgers.append((ledger_id + gap, []))

    @property
    def entries(self) -> list[tuple[Position, int, int]]:
        """Every entry: (position, messages, offset of its first message)."""
        found = []
        offset = 0
        for ledger_id, sizes in self.ledgers:
            for entry_id, n in enumerate(sizes):
                found.append((Position(ledger_id, entry_id), n, offset))
                offset += n
        return found

    def _find(self, ledger_id: int) -> int | None:
        return next((i for i, (lid, _) in enumerate(self.ledgers) if lid == ledger_id), None)

    # --- what the cursor calls -----------------------------------------------------------------

    def next_position(self, position: Position) -> Position:
        i = self._find(position.ledger_id)
        if i is None:
            later = [lid for lid, _ in self.ledgers if lid > position.ledger_id]
            if later:
                return Position(later[0], 0)
            return Position(position.ledger_id, position.entry_id + 1)
        ledger_id, sizes = self.ledgers[i]
        if i == len(self.ledgers) - 1 or position.entry_id + 1 < len(sizes):
            return Position(ledger_id, position.entry_id + 1)
        return Position(self.ledgers[i + 1][0], 0)

    @property
    def first_position(self) -> Position:
        for ledger_id, sizes in self.ledgers:
            if sizes:
                return Position(ledger_id, 0)
        ledger_id, sizes = self.ledgers[-1]
        return Position(ledger_id, len(sizes))

    @property
    def last_confirmed(self) -> Position:
        entries = self.entries
        return entries[-1][0] if entries else BEFORE_EVERYTHING

    @property
    def confirmed_next_offset(self) -> int:
        return sum(n for _, sizes in self.ledgers for n in sizes)

    def check_ackable(self, position: object) -> Position:
        checked = check_position(position)
        if checked > self.last_confirmed:
            raise InvalidArgumentError(f"{checked} is past the last confirmed entry")
        i = self._find(checked.ledger_id)
        is_entry = i is not None and 0 <= checked.entry_id < len(self.ledgers[i][1])
        if checked >= self.first_position and not is_entry:
            raise InvalidArgumentError(f"{checked} is not an entry")
        return checked

    def cursor_moved(self, mark_delete: Position, *, durable: bool) -> None:
        self.moved.append(mark_delete)

    def offset_hint(self, position: Position) -> int | None:
        """Known without a read: before everything, at the end, and at ledger ends (no cache)."""
        if position < self.first_position:
            return -1
        if position >= self.last_confirmed:
            return self.confirmed_next_offset - 1
        offset = -1
        for ledger_id, sizes in self.ledgers:
            if ledger_id == position.ledger_id:
                if position.entry_id < 0:
                    return offset
                if position.entry_id == len(sizes) - 1:
                    return offset + sum(sizes)
                return None
            offset += sum(sizes)
        return None


def open_cursor(ledger: FakeLedger, stored: StoredCursor | None = None) -> ManagedCursor:
    """A cursor from the start of the ledger, or from a persisted record as
    ``ManagedLedger._cursor_from`` builds it (non-durable, so that nothing is written)."""
    host = cast("CursorHost", ledger)
    if stored is None:
        stored = StoredCursor(mark_delete=Position(FIRST_LEDGER, -1), mark_delete_offset=-1)
    return ManagedCursor(
        host,
        "sub",
        durable=False,
        mark_delete=stored.mark_delete,
        mark_delete_offset=stored.mark_delete_offset,
        read_position=ledger.next_position(stored.mark_delete),
        ranges=stored.acked_ranges,
        batch_acks=stored.batch_acks,
        subscription_type=stored.subscription_type,
        clock=ManualClock(),
    )


def reload(ledger: FakeLedger, cursor: ManagedCursor) -> ManagedCursor:
    stored = cursor.stored()
    decoded = decode_cursor("sub", encode_cursor(stored))
    assert decoded == stored
    return open_cursor(ledger, decoded)


class CursorAckMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = FakeLedger()
        self.cursor = open_cursor(self.ledger)
        self.acked: set[Msg] = set()
        self.start = self.cursor.mark_delete
        self.last_mark_delete = self.cursor.mark_delete

    # --- the model ---------------------------------------------------------------------------

    @property
    def entries(self) -> list[tuple[Position, int, int]]:
        return self.ledger.entries

    def fully_acked(self, p: Position, n: int) -> bool:
        return all((p, i) in self.acked for i in range(n))

    def partly_acked(self, p: Position, n: int) -> frozenset[int]:
        indexes = frozenset(i for i in range(n) if (p, i) in self.acked)
        return frozenset() if len(indexes) == n else indexes

    def model_mark_delete(self) -> Position:
        mark = self.start
        for p, n, _ in self.entries:
            if not self.fully_acked(p, n):
                break
            mark = p
        return mark

    def model_offset(self, mark: Position) -> int:
        """Offset of the last message at or before ``mark``."""
        return max((first + n - 1 for p, n, first in self.entries if p <= mark), default=-1)

    def check(self, cursor: ManagedCursor, what: str) -> None:
        mark = self.model_mark_delete()
        assert cursor.mark_delete == mark, f"{what}: mark-delete {cursor.mark_delete}, not {mark}"
        assert -1 <= cursor.mark_delete_offset <= self.model_offset(mark), what
        in_ranges: set[Position] = set()
        previous: Position | None = None
        for start, end in cursor.ack_ranges:
            assert mark < start <= end, f"{what}: range {start}..{end} at mark-delete {mark}"
            if previous is not None:
                assert self.ledger.next_position(previous) < start, f"{what}: ranges touch"
            previous = end
            in_ranges |= {p for p, _, _ in self.entries if start <= p <= end}
        for p, n, _ in self.entries:
            whole = self.fully_acked(p, n)
            assert cursor.is_acked(p) == whole, f"{what}: {p} acked={cursor.is_acked(p)}"
            assert (p in in_ranges) == (whole and p > mark), f"{what}: {p} in ranges"
            partly = self.partly_acked(p, n)
            assert cursor.acked_indexes(p) == partly, f"{what}: {p} indexes"
        holes = len(cursor.ack_ranges)
        assert cursor.ack_hole_ranges == holes
        assert cursor.ack_ranges_over_limit == (holes >= MAX_INLINE_ACK_RANGES)
        stored = cursor.stored()
        assert list(stored.acked_ranges) == cursor.ack_ranges, f"{what}: ranges not all stored"
        expected_batches = tuple(
            (p, n, self.partly_acked(p, n))
            for p, n, _ in self.entries
            if self.partly_acked(p, n) and p > mark
        )
        assert stored.batch_acks == expected_batches, f"{what}: {stored.batch_acks}"

    # --- the layout ------------------------------------------------------------------------------

    # batches of one to a few messages, and some that need several 64-bit words when persisted
    @rule(
        sizes=st.lists(st.integers(1, 4) | st.sampled_from([64, 65, 129]), min_size=1, max_size=4)
    )
    def append(self, sizes: list[int]) -> None:
        for n in sizes:
            self.ledger.append(n)

    @rule(gap=st.integers(1, 3))
    def roll(self, gap: int) -> None:
        self.ledger.roll(gap)

    # --- acknowledgements ------------------------------------------------------------------------

    def positions(self) -> st.SearchStrategy[tuple[Position, int, int]]:
        return st.sampled_from(self.entries)

    @precondition(lambda self: self.entries)
    @rule(data=st.data(), count=st.integers(1, 3))
    def ack(self, data: st.DataObject, count: int) -> None:
        chosen = [data.draw(self.positions()) for _ in range(count)]
        self.cursor.ack([p for p, _, _ in chosen])
        self.acked |= {(p, i) for p, n, _ in chosen for i in range(n)}

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def ack_with_a_bad_position(self, data: st.DataObject) -> None:
        good = [p for p, _, _ in data.draw(st.lists(self.positions(), max_size=2))]
        last = self.ledger.last_confirmed
        bad = [Position(last.ledger_id, last.entry_id + 1)]  # past the last confirmed entry
        closed = [(lid, sizes) for lid, sizes in self.ledger.ledgers[:-1] if sizes]
        if closed:
            lid, sizes = data.draw(st.sampled_from(closed))
            bad.append(Position(lid, len(sizes)))  # after a closed ledger's end: no entry
        request = data.draw(st.permutations([*good, data.draw(st.sampled_from(bad))]))
        before = self.cursor.stored()
        with pytest.raises(InvalidArgumentError):
            self.cursor.ack(request)
        assert self.cursor.stored() == before

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def ack_indexes(self, data: st.DataObject) -> None:
        p, n, _ = data.draw(self.positions())
        if data.draw(st.booleans()):  # the rest of the batch
            indexes = {i for i in range(n) if (p, i) not in self.acked} or {0}
        else:
            indexes = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=6))
        complete = self.cursor.ack_indexes(p, sorted(indexes), n)
        self.acked |= {(p, i) for i in indexes}
        assert complete == self.fully_acked(p, n)

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def ack_indexes_outside_the_batch(self, data: st.DataObject) -> None:
        p, n, _ = data.draw(self.positions())
        before = self.cursor.stored()
        with pytest.raises(InvalidArgumentError):
            self.cursor.ack_indexes(p, [0, n], n)
        assert self.cursor.stored() == before

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def ack_cumulative(self, data: st.DataObject) -> None:
        p, _, _ = data.draw(self.positions())
        self.cursor.ack_cumulative(p)
        self.acked |= {(q, i) for q, n, _ in self.entries if q <= p for i in range(n)}

    @rule()
    def persist_and_reload(self) -> None:
        before = self.cursor
        self.cursor = reload(self.ledger, before)
        assert self.cursor.mark_delete == before.mark_delete
        assert self.cursor.ack_ranges == before.ack_ranges
        assert self.cursor.read_position == self.ledger.next_position(self.cursor.mark_delete)

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def cursor_matches_the_model(self) -> None:
        self.check(self.cursor, "cursor")

    @invariant()
    def reloaded_cursor_matches_the_model(self) -> None:
        self.check(reload(self.ledger, self.cursor), "reloaded")

    @invariant()
    def managed_ledger_told_of_moves(self) -> None:
        mark = self.cursor.mark_delete
        if mark != self.last_mark_delete:
            assert self.ledger.moved, f"mark-delete moved to {mark} and nobody was told"
            assert self.ledger.moved[-1] == mark
        self.last_mark_delete = mark


CursorAckMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_cursor_acks = CursorAckMachine.TestCase
