"""The index from (ledger, entry) to where the entry's frame is stored, and its checkpoint.

Per ledger, locations live in two typed arrays indexed by entry id (12 bytes per entry: a packed
``segment << 40 | offset`` and the frame length), because a bookie's ledgers are mostly dense runs
of entries. An entry id far beyond a ledger's array goes to a small dict instead, so a wild id
cannot allocate gigabytes. The index also counts, per segment, the bytes it still references
(live bytes): garbage collection deletes segments with none and compacts mostly dead ones.

A checkpoint is the whole index plus the log position it covers, in one checksummed file written
aside and renamed into place; at restart only the log after that position is replayed.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import google_crc32c

SEGMENT_SHIFT = 40
OFFSET_MASK = (1 << SEGMENT_SHIFT) - 1
NO_LOCATION = -1
SPARSE_GAP = 1 << 20
"""Entries more than this far past a ledger's array are kept in a dict instead."""

_MAGIC = b"MGIDX001"
_HEADER = struct.Struct("<8sqqq")  # magic, segment, offset, ledger count
_LEDGER = struct.Struct("<qBqqq")  # ledger id, flags, lac, array length, sparse count
_SPARSE = struct.Struct("<qqI")  # entry, location, length
_FOOTER = struct.Struct("<I")
_FLAG_FENCED = 1


def pack_location(segment_id: int, offset: int) -> int:
    return (segment_id << SEGMENT_SHIFT) | offset


def unpack_location(location: int) -> tuple[int, int]:
    return location >> SEGMENT_SHIFT, location & OFFSET_MASK


@dataclass(frozen=True, slots=True)
class LogPosition:
    """A point in the log: the segment and the byte offset in it."""

    segment_id: int
    offset: int


class LedgerIndex:
    """Where each stored entry of one ledger is, plus its fence flag and LAC."""

    __slots__ = (
        "entry_count",
        "fenced",
        "lac",
        "last_entry_id",
        "ledger_id",
        "lengths",
        "locations",
        "sparse",
        "stored_bytes",
    )

    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        self.locations = array("q")
        self.lengths = array("I")
        self.sparse: dict[int, tuple[int, int]] = {}
        self.fenced = False
        self.lac = -1
        self.last_entry_id = -1
        self.entry_count = 0
        self.stored_bytes = 0

    def get(self, entry_id: int) -> tuple[int, int] | None:
        """(location, frame length) of an entry, or None."""
        if 0 <= entry_id < len(self.locations):
            location = self.locations[entry_id]
            return None if location == NO_LOCATION else (location, self.lengths[entry_id])
        return self.sparse.get(entry_id)

    def put(self, entry_id: int, location: int, length: int) -> tuple[int, int] | None:
        """Record an entry's location; returns the location it replaces, if any."""
        size = len(self.locations)
        if entry_id < size:
            old_location = self.locations[entry_id]
            old = None if old_location == NO_LOCATION else (old_location, self.lengths[entry_id])
            self.locations[entry_id] = location
            self.lengths[entry_id] = length
        elif entry_id - size < SPARSE_GAP:
            grow = entry_id + 1 - size
            self.locations.extend(array("q", [NO_LOCATION]) * grow)
            self.lengths.extend(array("I", [0]) * grow)
            self.locations[entry_id] = location
            self.lengths[entry_id] = length
            old = self.sparse.pop(entry_id, None)
        else:
            old = self.sparse.get(entry_id)
            self.sparse[entry_id] = (location, length)
        if old is None:
            self.entry_count += 1
            self.stored_bytes += length
        else:
            self.stored_bytes += length - old[1]
        self.last_entry_id = max(self.last_entry_id, entry_id)
        return old

    def items(self) -> Iterator[tuple[int, int, int]]:
        """(entry id, location, length) of every stored entry, in entry order."""
        for entry_id, location in enumerate(self.locations):
            if location != NO_LOCATION:
                yield entry_id, location, self.lengths[entry_id]
        for entry_id in sorted(self.sparse):
            location, length = self.sparse[entry_id]
            yield entry_id, location, length


class Index:
    """Every ledger this bookie stores, and the live bytes of each segment."""

    def __init__(self) -> None:
        self.ledgers: dict[int, LedgerIndex] = {}
        self.live_bytes: dict[int, int] = {}

    def ledger(self, ledger_id: int) -> LedgerIndex | None:
        return self.ledgers.get(ledger_id)

    def ledger_for_write(self, ledger_id: int) -> LedgerIndex:
        found = self.ledgers.get(ledger_id)
        if found is None:
            found = self.ledgers[ledger_id] = LedgerIndex(ledger_id)
        return found

    def put_entry(  # noqa: PLR0917 - positional on purpose: called once per stored entry
        self, ledger_id: int, entry_id: int, lac: int, segment_id: int, offset: int, length: int
    ) -> None:
        ledger = self.ledger_for_write(ledger_id)
        old = ledger.put(entry_id, pack_location(segment_id, offset), length)
        live = self.live_bytes
        live[segment_id] = live.get(segment_id, 0) + length
        if old is not None:
            old_segment = old[0] >> SEGMENT_SHIFT
            live[old_segment] = live.get(old_segment, 0) - old[1]
        ledger.lac = max(ledger.lac, lac)

    def move_entry(
        self, ledger_id: int, entry_id: int, old_location: int, segment_id: int, offset: int
    ) -> bool:
        """Point an entry at its compacted copy, unless it changed (deleted or re-added)."""
        ledger = self.ledgers.get(ledger_id)
        current = ledger.get(entry_id) if ledger else None
        if ledger is None or current is None or current[0] != old_location:
            return False
        length = current[1]
        ledger.put(entry_id, pack_location(segment_id, offset), length)
        old_segment = old_location >> SEGMENT_SHIFT
        self.live_bytes[old_segment] = self.live_bytes.get(old_segment, 0) - length
        self.live_bytes[segment_id] = self.live_bytes.get(segment_id, 0) + length
        return True

    def fence(self, ledger_id: int) -> LedgerIndex:
        ledger = self.ledger_for_write(ledger_id)
        ledger.fenced = True
        return ledger

    def delete(self, ledger_id: int) -> bool:
        ledger = self.ledgers.pop(ledger_id, None)
        if ledger is None:
            return False
        for _, location, length in ledger.items():
            segment = location >> SEGMENT_SHIFT
            self.live_bytes[segment] = self.live_bytes.get(segment, 0) - length
        return True

    # --- checkpoint --------------------------------------------------------------------------

    def serialize(self, position: LogPosition) -> bytes:
        """The checkpoint of this index covering the log up to ``position``."""
        parts = [_HEADER.pack(_MAGIC, position.segment_id, position.offset, len(self.ledgers))]
        for ledger in self.ledgers.values():
            parts.append(
                _LEDGER.pack(
                    ledger.ledger_id,
                    _FLAG_FENCED if ledger.fenced else 0,
                    ledger.lac,
                    len(ledger.locations),
                    len(ledger.sparse),
                )
            )
            parts.append(ledger.locations.tobytes())
            parts.append(ledger.lengths.tobytes())
            parts.extend(
                _SPARSE.pack(entry, location, length)
                for entry, (location, length) in ledger.sparse.items()
            )
        body = b"".join(parts)
        return body + _FOOTER.pack(google_crc32c.value(body))

    @classmethod
    def deserialize(cls, data: bytes) -> tuple[Index, LogPosition]:
        """Rebuild an index from a checkpoint; raises ValueError if it is damaged."""
        if len(data) < _HEADER.size + _FOOTER.size:
            raise ValueError("the checkpoint is shorter than its header")
        body, footer = data[: -_FOOTER.size], data[-_FOOTER.size :]
        if google_crc32c.value(body) != _FOOTER.unpack(footer)[0]:
            raise ValueError("the checkpoint's CRC32C does not match its bytes")
        magic, segment_id, offset, ledger_count = _HEADER.unpack_from(body, 0)
        if magic != _MAGIC:
            raise ValueError(f"not an index checkpoint (magic {magic!r})")
        index = cls()
        pos = _HEADER.size
        for _ in range(ledger_count):
            ledger_id, flags, lac, size, sparse_count = _LEDGER.unpack_from(body, pos)
            pos += _LEDGER.size
            ledger = LedgerIndex(ledger_id)
            ledger.fenced = bool(flags & _FLAG_FENCED)
            ledger.lac = lac
            ledger.locations.frombytes(body[pos : pos + 8 * size])
            pos += 8 * size
            ledger.lengths.frombytes(body[pos : pos + 4 * size])
            pos += 4 * size
            for _ in range(sparse_count):
                entry, location, length = _SPARSE.unpack_from(body, pos)
                pos += _SPARSE.size
                ledger.sparse[entry] = (location, length)
            for entry_id, location, length in ledger.items():
                ledger.entry_count += 1
                ledger.stored_bytes += length
                ledger.last_entry_id = max(ledger.last_entry_id, entry_id)
                segment = location >> SEGMENT_SHIFT
                index.live_bytes[segment] = index.live_bytes.get(segment, 0) + length
            index.ledgers[ledger_id] = ledger
        if pos != len(body):
            raise ValueError("the checkpoint has trailing bytes")
        return index, LogPosition(segment_id, offset)
