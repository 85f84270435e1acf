"""The broker's entry cache: recently appended entries, shared by every managed ledger.

Consumers that keep up read what producers just wrote. Those reads should come from memory,
not from the bookies, so each managed ledger puts every entry it appends here once the entry
is confirmed. Reads of older entries, from the bookies, are not put in: a consumer catching up
on a large backlog would otherwise evict the tail that every up-to-date consumer needs.

One cache per broker, bounded in payload bytes, least recently used out first. Ledger ids are
unique in the cluster, so a position is a key without naming the managed ledger.
"""

from __future__ import annotations

from collections import OrderedDict

from broker.managed_ledger.types import Entry, Position
from magnetar.common.errors import InvalidArgumentError


class EntryCache:
    """A least-recently-used map from position to entry, bounded by payload bytes."""

    def __init__(self, max_bytes: int) -> None:
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidArgumentError(
                f"the entry cache size is a number of bytes >= 0 (0: no cache), got {max_bytes!r}"
            )
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._entries: OrderedDict[Position, Entry] = OrderedDict()
        self._by_ledger: dict[int, set[int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, position: Position) -> Entry | None:
        entry = self._entries.get(position)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(position)
        return entry

    def peek(self, position: Position) -> Entry | None:
        """The entry if cached, without counting a hit or refreshing it."""
        return self._entries.get(position)

    def put(self, entry: Entry) -> None:
        size = len(entry.payload)
        if size > self.max_bytes:
            return
        old = self._entries.pop(entry.position, None)
        if old is not None:
            self.size_bytes -= len(old.payload)
        self._entries[entry.position] = entry
        self._by_ledger.setdefault(entry.position.ledger_id, set()).add(entry.position.entry_id)
        self.size_bytes += size
        while self.size_bytes > self.max_bytes:
            position, evicted = self._entries.popitem(last=False)
            self._forget(position)
            self.size_bytes -= len(evicted.payload)
            self.evictions += 1

    def invalidate_ledger(self, ledger_id: int) -> None:
        """Drop every entry of ``ledger_id`` (it was trimmed or deleted)."""
        for entry_id in self._by_ledger.pop(ledger_id, set()):
            entry = self._entries.pop(Position(ledger_id, entry_id), None)
            if entry is not None:
                self.size_bytes -= len(entry.payload)

    def _forget(self, position: Position) -> None:
        ids = self._by_ledger.get(position.ledger_id)
        if ids is not None:
            ids.discard(position.entry_id)
            if not ids:
                del self._by_ledger[position.ledger_id]
