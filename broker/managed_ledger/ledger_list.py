"""A managed ledger's ledgers in order, and how positions move through them. No I/O.

Ledger ids grow (one cluster-wide counter), so the list is sorted by id. Every ledger holds at
least one entry except possibly the last, the one being written. A position is "in" a ledger
when its ledger id is listed and its entry id below the ledger's (confirmed) entry count; the
last ledger also owns the positions past its end, where the next entries will go.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import overload

from broker.managed_ledger.types import LedgerInfo, Position


@dataclass(slots=True)
class LedgerRecord:
    """One ledger of the list with its confirmed counts (they grow on the last one)."""

    ledger_id: int
    first_offset: int
    created_ms: int
    entries: int = 0
    size_bytes: int = 0
    messages: int = 0
    last_publish_time_ms: int = 0

    @classmethod
    def of(cls, info: LedgerInfo) -> LedgerRecord:
        return cls(
            ledger_id=info.ledger_id,
            first_offset=info.first_offset,
            created_ms=info.created_ms,
            entries=info.entries,
            size_bytes=info.size_bytes,
            messages=info.messages,
            last_publish_time_ms=info.last_publish_time_ms,
        )

    def info(self) -> LedgerInfo:
        return LedgerInfo(
            ledger_id=self.ledger_id,
            entries=self.entries,
            size_bytes=self.size_bytes,
            first_offset=self.first_offset,
            messages=self.messages,
            created_ms=self.created_ms,
            last_publish_time_ms=self.last_publish_time_ms,
        )

    @property
    def last_position(self) -> Position:
        """Its last entry (``(id, -1)`` while it has none)."""
        return Position(self.ledger_id, self.entries - 1)

    @property
    def end_offset(self) -> int:
        """One past the offset of its last message."""
        return self.first_offset + self.messages


class LedgerList(Sequence[LedgerRecord]):
    """The ledgers, oldest first (never empty once a managed ledger is open)."""

    __slots__ = ("_ids", "_records")

    def __init__(self, records: Iterable[LedgerRecord] = ()) -> None:
        self._records = list(records)
        self._ids = [record.ledger_id for record in self._records]
        if self._ids != sorted(set(self._ids)):
            raise ValueError(f"ledger ids must be distinct and ascending, got {self._ids}")

    @overload
    def __getitem__(self, i: int) -> LedgerRecord: ...

    @overload
    def __getitem__(self, i: slice) -> list[LedgerRecord]: ...

    def __getitem__(self, i: int | slice) -> LedgerRecord | list[LedgerRecord]:
        return self._records[i]

    def __len__(self) -> int:
        return len(self._records)

    def find(self, ledger_id: int) -> int | None:
        """The index of ledger ``ledger_id``, or ``None`` if it is not listed."""
        i = bisect.bisect_left(self._ids, ledger_id)
        return i if i < len(self._ids) and self._ids[i] == ledger_id else None

    def is_entry(self, position: Position) -> bool:
        i = self.find(position.ledger_id)
        return i is not None and 0 <= position.entry_id < self._records[i].entries

    def next_write_position(self) -> Position:
        """Where the next entry goes if the last ledger takes it."""
        last = self._records[-1]
        return Position(last.ledger_id, last.entries)

    def first_position(self) -> Position:
        """The first stored entry, or the next-to-write position if none is stored."""
        for record in self._records:
            if record.entries > 0:
                return Position(record.ledger_id, 0)
        return self.next_write_position()

    def next_position(self, position: Position) -> Position:
        """The position right after ``position``: into the next ledger at a ledger's end."""
        i = self.find(position.ledger_id)
        if i is None:
            # not listed (trimmed, or "before everything"): the first ledger after it
            j = bisect.bisect_right(self._ids, position.ledger_id)
            if j < len(self._ids):
                return Position(self._ids[j], 0)
            return Position(position.ledger_id, position.entry_id + 1)
        record = self._records[i]
        if i == len(self._records) - 1 or position.entry_id + 1 < record.entries:
            return Position(record.ledger_id, position.entry_id + 1)
        return Position(self._ids[i + 1], 0)

    def locate(self, position: Position) -> tuple[int, Position] | None:
        """The first stored entry at or after ``position`` (in the last ledger, possibly the
        next-to-write position or beyond) with its ledger's index; ``None`` if past them all."""
        while True:
            i = self.find(position.ledger_id)
            if i is None:
                i = bisect.bisect_right(self._ids, position.ledger_id)
                if i == len(self._ids):
                    return None
                position = Position(self._ids[i], 0)
            record = self._records[i]
            if position.entry_id < 0:
                position = Position(record.ledger_id, 0)
            if position.entry_id < record.entries or i == len(self._records) - 1:
                return i, position
            position = Position(self._ids[i + 1], 0)

    def holding_offset(self, offset: int) -> LedgerRecord | None:
        """The ledger whose (confirmed) messages include ``offset``."""
        for record in self._records:
            if record.entries and record.first_offset <= offset < record.end_offset:
                return record
        return None
