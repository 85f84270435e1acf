"""The index from (ledger, entry) to where the entry's frame is stored, and its checkpoint.

Per ledger, locations live in **pages** of :data:`PAGE_SIZE` consecutive entry ids. A page that
holds many entries is dense: two typed arrays (12 bytes per id: a packed ``segment << 40 |
offset`` and the frame length), because a bookie's ledgers are mostly dense runs of entries. A
page that holds few is a small dict, and it turns dense once it holds :data:`DENSE_AT` entries.
So memory grows with the entries stored, never with the range of their ids: nine one-byte
entries with ids 2^20 apart cost nine dict slots, where one array per ledger from id 0 cost
~100 MiB (issue 23, finding 9). :meth:`Index.memory_bytes` accounts for it.

The index also counts, per segment, the bytes it still references (live bytes): garbage
collection deletes segments with none and compacts mostly dead ones.

The index itself does not refuse a second location for an entry: replaying the log, a later
frame of the same entry (a compaction's copy, a recovery's repair of a damaged one) supersedes
the earlier. Entries are write-once at the add path (:meth:`StorageEngine.add_entries`), which
never writes a second, different copy.

A checkpoint is the whole index plus the log position it covers, in one checksummed file written
aside and renamed into place; at restart only the log after that position is replayed.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import google_crc32c

SEGMENT_SHIFT = 40
OFFSET_MASK = (1 << SEGMENT_SHIFT) - 1
NO_LOCATION = -1

PAGE_BITS = 8
PAGE_SIZE = 1 << PAGE_BITS
"""Entry ids per page: a dense page costs 3 KiB, so a short ledger does not pay for a big one."""
PAGE_MASK = PAGE_SIZE - 1
DENSE_AT = PAGE_SIZE // 8
"""A sparse page with this many entries turns dense; from there a dense page costs no more than
its entries would as dict slots (at most 96 bytes of arrays per entry)."""

DENSE_PAGE_BYTES = PAGE_SIZE * 12 + 256
"""Accounted memory of a dense page: its arrays plus the objects around them."""
SPARSE_ENTRY_BYTES = 160
"""Accounted memory of an entry in a sparse page (a dict slot, a tuple and two ints)."""

_MAGIC_V1 = b"MGIDX001"
_MAGIC = b"MGIDX002"
_HEADER = struct.Struct("<8sqqq")  # magic, segment, offset, ledger count
_LEDGER = struct.Struct("<qBqqq")  # ledger id, flags, lac, dense pages (v1: array length), sparse
_PAGE = struct.Struct("<q")  # page number, then PAGE_SIZE locations and PAGE_SIZE lengths
_SPARSE = struct.Struct("<qqI")  # entry, location, length
_FOOTER = struct.Struct("<I")
_FLAG_FENCED = 1

_EMPTY_LOCATIONS = array("q", [NO_LOCATION]) * PAGE_SIZE
_EMPTY_LENGTHS = array("I", [0]) * PAGE_SIZE

if TYPE_CHECKING:
    DensePage: TypeAlias = tuple[array[int], array[int]]
    """A dense page: its locations ("q") and frame lengths ("I"), by slot."""


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
        "dense",
        "entry_count",
        "fenced",
        "lac",
        "last_entry_id",
        "ledger_id",
        "sparse",
        "stored_bytes",
    )

    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        self.dense: dict[int, DensePage] = {}
        """Dense pages by page number: (locations, lengths), NO_LOCATION where none is stored."""
        self.sparse: dict[int, dict[int, tuple[int, int]]] = {}
        """Sparse pages by page number: entry id -> (location, frame length)."""
        self.fenced = False
        self.lac = -1
        self.last_entry_id = -1
        self.entry_count = 0
        self.stored_bytes = 0

    def get(self, entry_id: int) -> tuple[int, int] | None:
        """(location, frame length) of an entry, or None."""
        page = self.dense.get(entry_id >> PAGE_BITS)
        if page is not None:
            slot = entry_id & PAGE_MASK
            location = page[0][slot]
            return None if location == NO_LOCATION else (location, page[1][slot])
        small = self.sparse.get(entry_id >> PAGE_BITS)
        return None if small is None else small.get(entry_id)

    def put(self, entry_id: int, location: int, length: int) -> tuple[int, int] | None:
        """Record an entry's location; returns the location it supersedes, if any."""
        page_number = entry_id >> PAGE_BITS
        page = self.dense.get(page_number)
        old: tuple[int, int] | None
        if page is not None:
            slot = entry_id & PAGE_MASK
            locations, lengths = page
            old_location = locations[slot]
            old = None if old_location == NO_LOCATION else (old_location, lengths[slot])
            locations[slot] = location
            lengths[slot] = length
        else:
            small = self.sparse.get(page_number)
            if small is None:
                small = self.sparse[page_number] = {}
            old = small.get(entry_id)
            small[entry_id] = (location, length)
            if len(small) >= DENSE_AT:
                self._make_dense(page_number, small)
        if old is None:
            self.entry_count += 1
            self.stored_bytes += length
            self.last_entry_id = max(self.last_entry_id, entry_id)
        else:
            self.stored_bytes += length - old[1]
        return old

    def _make_dense(self, page_number: int, small: dict[int, tuple[int, int]]) -> None:
        locations = array("q", _EMPTY_LOCATIONS)
        lengths = array("I", _EMPTY_LENGTHS)
        for entry_id, (location, length) in small.items():
            locations[entry_id & PAGE_MASK] = location
            lengths[entry_id & PAGE_MASK] = length
        del self.sparse[page_number]
        self.dense[page_number] = (locations, lengths)

    def items(self) -> Iterator[tuple[int, int, int]]:
        """(entry id, location, length) of every stored entry, in entry order."""
        for page_number in sorted(self.dense.keys() | self.sparse.keys()):
            page = self.dense.get(page_number)
            if page is not None:
                base = page_number << PAGE_BITS
                locations, lengths = page
                for slot, location in enumerate(locations):
                    if location != NO_LOCATION:
                        yield base + slot, location, lengths[slot]
            else:
                small = self.sparse[page_number]
                for entry_id in sorted(small):
                    location, length = small[entry_id]
                    yield entry_id, location, length

    def memory_bytes(self) -> int:
        """Accounted memory of this ledger's locations (an estimate of what they allocate)."""
        sparse_entries = sum(len(small) for small in self.sparse.values())
        return len(self.dense) * DENSE_PAGE_BYTES + sparse_entries * SPARSE_ENTRY_BYTES


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
        """Point an entry at its compacted copy, unless it changed (deleted or repaired)."""
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

    def memory_bytes(self) -> int:
        """Accounted memory of every ledger's locations (see :meth:`LedgerIndex.memory_bytes`)."""
        return sum(ledger.memory_bytes() for ledger in self.ledgers.values())

    # --- checkpoint --------------------------------------------------------------------------

    def serialize(self, position: LogPosition) -> bytes:
        """The checkpoint of this index covering the log up to ``position``."""
        parts = [_HEADER.pack(_MAGIC, position.segment_id, position.offset, len(self.ledgers))]
        for ledger in self.ledgers.values():
            sparse = [
                (entry, location, length)
                for small in ledger.sparse.values()
                for entry, (location, length) in small.items()
            ]
            parts.append(
                _LEDGER.pack(
                    ledger.ledger_id,
                    _FLAG_FENCED if ledger.fenced else 0,
                    ledger.lac,
                    len(ledger.dense),
                    len(sparse),
                )
            )
            for page_number, (locations, lengths) in ledger.dense.items():
                parts += (_PAGE.pack(page_number), locations.tobytes(), lengths.tobytes())
            parts.extend(_SPARSE.pack(*item) for item in sparse)
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
        if magic not in {_MAGIC, _MAGIC_V1}:
            raise ValueError(f"not an index checkpoint (magic {magic!r})")
        read_ledger = _read_ledger if magic == _MAGIC else _read_ledger_v1
        index = cls()
        pos = _HEADER.size
        for _ in range(ledger_count):
            try:
                ledger, pos = read_ledger(body, pos)
            except struct.error as e:
                raise ValueError(f"the checkpoint ends inside a ledger ({e})") from e
            for _, location, length in ledger.items():
                segment = location >> SEGMENT_SHIFT
                index.live_bytes[segment] = index.live_bytes.get(segment, 0) + length
            index.ledgers[ledger.ledger_id] = ledger
        if pos != len(body):
            raise ValueError("the checkpoint has trailing bytes")
        return index, LogPosition(segment_id, offset)


def _read_ledger(body: bytes, pos: int) -> tuple[LedgerIndex, int]:
    ledger_id, flags, lac, page_count, sparse_count = _LEDGER.unpack_from(body, pos)
    pos += _LEDGER.size
    ledger = LedgerIndex(ledger_id)
    ledger.fenced = bool(flags & _FLAG_FENCED)
    ledger.lac = lac
    for _ in range(page_count):
        (page_number,) = _PAGE.unpack_from(body, pos)
        pos += _PAGE.size
        locations, lengths = array("q"), array("I")
        locations.frombytes(body[pos : pos + 8 * PAGE_SIZE])
        pos += 8 * PAGE_SIZE
        lengths.frombytes(body[pos : pos + 4 * PAGE_SIZE])
        pos += 4 * PAGE_SIZE
        if len(locations) != PAGE_SIZE or len(lengths) != PAGE_SIZE:
            raise ValueError("the checkpoint ends inside a page")
        ledger.dense[page_number] = (locations, lengths)
    for _ in range(sparse_count):
        entry, location, length = _SPARSE.unpack_from(body, pos)
        pos += _SPARSE.size
        ledger.sparse.setdefault(entry >> PAGE_BITS, {})[entry] = (location, length)
    for entry_id, _, length in ledger.items():
        ledger.entry_count += 1
        ledger.stored_bytes += length
        ledger.last_entry_id = max(ledger.last_entry_id, entry_id)
    return ledger, pos


def _read_ledger_v1(body: bytes, pos: int) -> tuple[LedgerIndex, int]:
    """A ledger as checkpoints before issue 23 wrote it: one array from entry 0, and a dict."""
    ledger_id, flags, lac, size, sparse_count = _LEDGER.unpack_from(body, pos)
    pos += _LEDGER.size
    ledger = LedgerIndex(ledger_id)
    ledger.fenced = bool(flags & _FLAG_FENCED)
    ledger.lac = lac
    locations, lengths = array("q"), array("I")
    locations.frombytes(body[pos : pos + 8 * size])
    pos += 8 * size
    lengths.frombytes(body[pos : pos + 4 * size])
    pos += 4 * size
    if len(locations) != size or len(lengths) != size:
        raise ValueError("the checkpoint ends inside a ledger's array")
    for entry_id, location in enumerate(locations):
        if location != NO_LOCATION:
            ledger.put(entry_id, location, lengths[entry_id])
    for _ in range(sparse_count):
        entry, location, length = _SPARSE.unpack_from(body, pos)
        pos += _SPARSE.size
        ledger.put(entry, location, length)
    return ledger, pos
