"""How many times each unacknowledged entry of a cursor was taken back to be delivered again.

A subscription's dispatcher raises an entry's count when it takes the entry back from a
consumer (negative ack, ack timeout, the consumer leaving); the count travels with every later
delivery as ``redelivery_count``, and a consumer with ``max_redelivery_count`` dead-letters on
it. The counts belong to the cursor and are persisted with its acknowledgement state
(``CursorInfo.redelivery_counts``), so the partition's next owner carries on from them.

Bounded: at most ``limit`` entries are tracked; beyond it the entry whose count was first
recorded longest ago is forgotten (``dropped`` counts them). Entries leave when they are
acknowledged, so only entries with a pending redelivery cost anything.

No I/O, no clock: :class:`~.cursor.ManagedCursor` persists it, and is told of every change
through ``on_change(raised)`` (``raised``: a count went up, not just away). A bound method is
held weakly: the cursor owns its counts, and a strong reference back would make a cycle that
keeps a closed cursor (and its managed ledger) until a full collection, which the servers'
collector tuning almost never runs (``tests/broker/test_topic_memory.py``).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable, Iterator

from broker.managed_ledger.types import Position


class RedeliveryCounts:
    """Redelivery counts of unacknowledged entries (see the module doc)."""

    __slots__ = ("_counts", "_on_change", "dropped", "limit")

    def __init__(
        self,
        limit: int,
        counts: Iterable[tuple[Position, int]] = (),
        *,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"a redelivery count limit is >= 1, got {limit}")
        self.limit = limit
        self._counts: dict[Position, int] = {}
        self._on_change: Callable[[], Callable[[bool], None] | None] | None = None
        if inspect.ismethod(on_change):
            self._on_change = weakref.WeakMethod(on_change)
        elif on_change is not None:
            self._on_change = lambda: on_change
        self.dropped = 0
        """Counts forgotten because ``limit`` entries were tracked (since this owner loaded)."""
        for position, count in counts:
            if count > 0:
                self._counts[position] = count
        self._trim()

    def get(self, position: Position) -> int:
        """The entry's count (0: never taken back, or forgotten)."""
        return self._counts.get(position, 0)

    def increment(self, position: Position) -> int:
        """Raise the entry's count by one; the new count."""
        count = self._counts.get(position, 0) + 1
        self._counts[position] = count
        self._trim()
        self._changed(raised=True)
        return count

    def discard(self, position: Position) -> None:
        """The entry is acknowledged (or dead-lettered): forget its count."""
        if self._counts.pop(position, None) is not None:
            self._changed()

    def forget_through(self, position: Position) -> None:
        """Everything up to ``position`` is acknowledged."""
        gone = [p for p in self._counts if p <= position]
        for p in gone:
            del self._counts[p]
        if gone:
            self._changed()

    def clear(self) -> None:
        if self._counts:
            self._counts.clear()
            self._changed()

    def items(self) -> list[tuple[Position, int]]:
        """Every tracked count, in position order (the persisted form)."""
        return sorted(self._counts.items())

    def __len__(self) -> int:
        return len(self._counts)

    def __iter__(self) -> Iterator[Position]:
        return iter(self._counts)

    def __contains__(self, position: object) -> bool:
        return position in self._counts

    def _trim(self) -> None:
        while len(self._counts) > self.limit:
            # a dict keeps insertion order: the first key was recorded longest ago
            del self._counts[next(iter(self._counts))]
            self.dropped += 1

    def _changed(self, *, raised: bool = False) -> None:
        listener = self._on_change() if self._on_change is not None else None
        if listener is not None:
            listener(raised)
