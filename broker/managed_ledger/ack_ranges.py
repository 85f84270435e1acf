"""A cursor's acknowledgement state: a mark-delete position plus individually acked ranges.

Everything at or before ``mark_delete`` is acknowledged. Above it, acknowledged entries form
sorted, disjoint, inclusive ranges ``[start, end]``. Two ranges whose ends touch (the entry
after one range's end is the next range's start) are merged, and a range that starts right
after ``mark_delete`` is folded into it, so ``mark_delete`` advances as soon as the hole below
it is filled.

"The entry after" depends on where ledgers end, which only the managed ledger knows, so the
class takes a ``successor`` function. Adjacency is decided when an entry is added: the only
successor that ever changes is that of the last entry of the ledger being written, which moves
into the next ledger when it is created, and nothing can have been added there before then.

No I/O, no clock: this is the part of a cursor that is worth testing exhaustively.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

from broker.managed_ledger.types import BEFORE_EVERYTHING, Position

Successor = Callable[[Position], Position]


class AckRanges:
    """Mark-delete position and the individually acknowledged ranges above it."""

    __slots__ = ("_ends", "_mark_delete", "_starts", "_successor")

    def __init__(
        self,
        successor: Successor,
        mark_delete: Position = BEFORE_EVERYTHING,
        ranges: Iterable[tuple[Position, Position]] = (),
    ) -> None:
        self._successor = successor
        self._mark_delete = mark_delete
        self._starts: list[Position] = []
        self._ends: list[Position] = []
        for start, end in sorted(ranges):
            if end < start:
                raise ValueError(f"an acked range ends before it starts: {start}..{end}")
            self._add_range(start, end)
        self._advance()

    # --- reading ---------------------------------------------------------------------------

    @property
    def mark_delete(self) -> Position:
        return self._mark_delete

    @property
    def ranges(self) -> list[tuple[Position, Position]]:
        """The acked ranges above mark-delete, in order, disjoint and not adjacent."""
        return list(zip(self._starts, self._ends, strict=True))

    def __len__(self) -> int:
        """Number of ranges, i.e. of holes between mark-delete and the highest acked entry."""
        return len(self._starts)

    def contains(self, position: Position) -> bool:
        """Whether ``position`` is acknowledged."""
        if position <= self._mark_delete:
            return True
        i = bisect.bisect_right(self._starts, position) - 1
        return i >= 0 and position <= self._ends[i]

    def first_unacked_from(self, position: Position) -> Position:
        """``position``, or the entry after the acknowledged range it falls in (the entry after
        mark-delete if it is at or before it)."""
        if position <= self._mark_delete:
            return self._successor(self._mark_delete)
        i = bisect.bisect_right(self._starts, position) - 1
        if i >= 0 and position <= self._ends[i]:
            return self._successor(self._ends[i])
        return position

    def next_range_start(self, position: Position) -> Position | None:
        """The start of the first range after ``position`` (None: none)."""
        i = bisect.bisect_right(self._starts, position)
        return self._starts[i] if i < len(self._starts) else None

    # --- changing --------------------------------------------------------------------------

    def add(self, position: Position) -> bool:
        """Acknowledge one entry; returns whether that changed anything."""
        if self.contains(position):
            return False
        i = bisect.bisect_right(self._starts, position)
        if i > 0 and self._successor(self._ends[i - 1]) == position:
            i -= 1
            self._ends[i] = position
        else:
            self._starts.insert(i, position)
            self._ends.insert(i, position)
        self._merge_right(i)
        self._advance()
        return True

    def ack_cumulative(self, position: Position) -> bool:
        """Acknowledge everything up to and including ``position``; whether that changed
        anything."""
        if position <= self._mark_delete:
            return False
        # ranges that end at or before the position are covered; one that spans it extends it
        i = bisect.bisect_right(self._ends, position)
        del self._starts[:i], self._ends[:i]
        self._mark_delete = position
        if self._starts and self._starts[0] <= position:
            self._mark_delete = self._ends[0]
            del self._starts[0], self._ends[0]
        self._advance()
        return True

    def reset(self, mark_delete: Position) -> None:
        """Forget every ack: everything at or before ``mark_delete`` counts as acknowledged."""
        self._mark_delete = mark_delete
        self._starts.clear()
        self._ends.clear()

    # --- internals -------------------------------------------------------------------------

    def _add_range(self, start: Position, end: Position) -> None:
        """Restore a range (loading persisted state): merged with overlapping or adjacent ones."""
        if end <= self._mark_delete:
            return
        i = bisect.bisect_right(self._starts, start)
        if i > 0 and (self._ends[i - 1] >= start or self._successor(self._ends[i - 1]) == start):
            i -= 1
            self._ends[i] = max(self._ends[i], end)
        else:
            self._starts.insert(i, start)
            self._ends.insert(i, end)
        self._merge_right(i)

    def _merge_right(self, i: int) -> None:
        while i + 1 < len(self._starts) and (
            self._starts[i + 1] <= self._ends[i]
            or self._successor(self._ends[i]) == self._starts[i + 1]
        ):
            self._ends[i] = max(self._ends[i], self._ends[i + 1])
            del self._starts[i + 1], self._ends[i + 1]

    def _advance(self) -> None:
        while self._starts and (
            self._starts[0] <= self._mark_delete
            or self._successor(self._mark_delete) == self._starts[0]
        ):
            self._mark_delete = max(self._mark_delete, self._ends[0])
            del self._starts[0], self._ends[0]
