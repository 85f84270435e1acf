"""What the bookie protocol moves, as plain domain types, shared by the service and the client.

Also the entry checksum the protocol defines: the writer's CRC32C over the 24-byte little-endian
header ``(ledger_id, entry_id, last_add_confirmed)`` followed by the payload. Writers compute it,
bookies check it before storing, readers check it again.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import google_crc32c

from magnetar.common.errors import MagnetarError

_CHECKSUM_HEADER = struct.Struct("<qqq")

NO_ENTRY = -1
"""The id of "no entry" (the LAC of an empty ledger)."""


def entry_checksum(ledger_id: int, entry_id: int, last_add_confirmed: int, payload: bytes) -> int:
    """The writer's CRC32C of an entry."""
    header = _CHECKSUM_HEADER.pack(ledger_id, entry_id, last_add_confirmed)
    return int(google_crc32c.extend(google_crc32c.value(header), payload))


class AddEntry(NamedTuple):
    """One entry to add to a bookie."""

    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    payload: bytes
    crc32c: int
    recovery: bool = False


class AddFailure(NamedTuple):
    """An entry a bookie did not store, and why."""

    ledger_id: int
    entry_id: int
    error: MagnetarError


class ReadEntry(NamedTuple):
    """An entry as a bookie stores it."""

    entry_id: int
    last_add_confirmed: int
    payload: bytes
    crc32c: int


class ReadResult(NamedTuple):
    """A range of entries of one ledger, with what the bookie knows of the ledger."""

    ledger_id: int
    entries: list[ReadEntry]
    last_add_confirmed: int
    fenced: bool


class LacResult(NamedTuple):
    ledger_id: int
    last_add_confirmed: int
    fenced: bool
    entry: ReadEntry | None


class FenceResult(NamedTuple):
    ledger_id: int
    last_add_confirmed: int
    last_entry_id: int
