"""The on-disk record format of segment files: pure encoding and decoding, no I/O.

Every record is a frame::

    [u32 body length][u32 CRC32C][body]

and the body starts with a type byte:

    ENTRY   1  [i64 ledger][i64 entry][i64 last_add_confirmed][u32 writer's crc32c][u8 flags]
               [payload]
    FENCE   2  [i64 ledger]
    DELETE  3  [i64 ledger]

All integers are little-endian. For FENCE and DELETE the frame CRC covers the whole body. For
ENTRY it covers the 30-byte header only, because the payload is already covered by the writer's
CRC in that header (over ledger, entry, LAC and payload), which the bookie checks before storing.
Checking both on read is as strong as one CRC over everything, and the write path makes one pass
over the payload instead of two. A frame's bytes do not depend on where it is stored, so
compaction moves frames verbatim.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

import google_crc32c

from bookie.entries import entry_checksum

FRAME = struct.Struct("<II")
ENTRY_HEADER = struct.Struct("<BqqqIB")
LEDGER_RECORD = struct.Struct("<Bq")

TYPE_ENTRY = 1
TYPE_FENCE = 2
TYPE_DELETE = 3

FLAG_RECOVERY = 1

MAX_FRAME_BODY = 1 << 31


Frame = tuple[bytes, ...]
"""A frame as the chunks that, written one after the other, make it (no copy to join them)."""


def encode_entry(
    ledger_id: int,
    entry_id: int,
    last_add_confirmed: int,
    crc32c: int,
    payload: bytes,
    *,
    recovery: bool = False,
) -> Frame:
    """One ENTRY frame, as (frame header + entry header, payload)."""
    header = ENTRY_HEADER.pack(
        TYPE_ENTRY,
        ledger_id,
        entry_id,
        last_add_confirmed,
        crc32c,
        FLAG_RECOVERY if recovery else 0,
    )
    return FRAME.pack(len(header) + len(payload), google_crc32c.value(header)) + header, payload


def encode_ledger_record(record_type: int, ledger_id: int) -> Frame:
    """A FENCE or DELETE frame."""
    body = LEDGER_RECORD.pack(record_type, ledger_id)
    return (FRAME.pack(len(body), google_crc32c.value(body)) + body,)


def frame_size(frame: Frame) -> int:
    return sum(len(chunk) for chunk in frame)


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A decoded frame."""

    type: int
    ledger_id: int
    entry_id: int = -1
    last_add_confirmed: int = -1
    crc32c: int = 0
    payload: bytes = b""
    recovery: bool = False


class FrameError(Exception):
    """A frame whose bytes are not what was written (torn, truncated or damaged)."""


def frame_length_at(data: bytes | mmap.mmap, offset: int) -> int | None:
    """Total length of the frame at ``offset`` per its header, or None if no header fits."""
    if len(data) - offset < FRAME.size:
        return None
    body_length = FRAME.unpack_from(data, offset)[0]
    return int(FRAME.size + body_length)


def decode_frame(frame: bytes) -> StoredRecord:
    """Check and decode one complete frame; raises FrameError if its bytes are not intact."""
    if len(frame) < FRAME.size:
        raise FrameError("the frame header is cut short")
    body_length, crc = FRAME.unpack_from(frame, 0)
    if body_length > MAX_FRAME_BODY or FRAME.size + body_length > len(frame):
        raise FrameError(f"the frame says {body_length} body bytes but fewer are there")
    if body_length == 0:
        raise FrameError("empty frame body")
    record_type = frame[FRAME.size]
    if record_type == TYPE_ENTRY:
        if body_length < ENTRY_HEADER.size:
            raise FrameError("an entry record is shorter than its header")
        header_end = FRAME.size + ENTRY_HEADER.size
        if google_crc32c.value(frame[FRAME.size : header_end]) != crc:
            raise FrameError("the entry header's CRC32C does not match its bytes")
        _, ledger, entry, lac, entry_crc, flags = ENTRY_HEADER.unpack_from(frame, FRAME.size)
        payload = frame[header_end : FRAME.size + body_length]
        if entry_checksum(ledger, entry, lac, payload) != entry_crc:
            raise FrameError("the entry's payload does not match its CRC32C")
        return StoredRecord(
            TYPE_ENTRY, ledger, entry, lac, entry_crc, payload, bool(flags & FLAG_RECOVERY)
        )
    body = frame[FRAME.size : FRAME.size + body_length]
    if google_crc32c.value(body) != crc:
        raise FrameError("the frame's CRC32C does not match its bytes")
    if record_type in (TYPE_FENCE, TYPE_DELETE):
        if body_length != LEDGER_RECORD.size:
            raise FrameError("a ledger record has the wrong size")
        return StoredRecord(record_type, LEDGER_RECORD.unpack_from(body, 0)[1])
    raise FrameError(f"unknown record type {record_type}")


def peek_entry_ids(body: bytes) -> tuple[int, int] | None:
    """(ledger, entry) from a possibly damaged ENTRY body, if its header looks sane."""
    if len(body) >= ENTRY_HEADER.size and body[0] == TYPE_ENTRY:
        _, ledger, entry, _, _, _ = ENTRY_HEADER.unpack_from(body, 0)
        if ledger >= 0 and entry >= 0:
            return int(ledger), int(entry)
    return None
