"""Ledger metadata as a domain value, and its home in the metadata store.

A ledger's metadata says who may write it (its state), where each entry lives (its ensembles,
each from a first entry id on), and how many replicas count (E, Qw, Qa). It changes only by
compare-and-swap on the store's version, so a writer that was fenced, an ensemble change that
raced a recovery, or two recoverers closing at once, each find out instead of overwriting.
"""

from __future__ import annotations

import bisect
import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from magnetar.common.errors import InvalidArgumentError, LedgerNotFoundError
from metadata import MetadataStore, layout
from metadata.coordination import IdAllocator
from proto.format.v1 import ledger_pb2

_FORMAT_VERSION = 1

INTENDED_ENSEMBLE_PROPERTY = "intended-ensemble-size"
"""Custom property of an under-striped ledger: the E it was meant to have (decimal), when fewer
writable bookies than that existed at its creation. Its ``ensemble_size`` is the E it got."""


class LedgerState(enum.Enum):
    OPEN = ledger_pb2.LEDGER_STATE_OPEN
    IN_RECOVERY = ledger_pb2.LEDGER_STATE_IN_RECOVERY
    CLOSED = ledger_pb2.LEDGER_STATE_CLOSED


@dataclass(frozen=True, slots=True)
class Segment:
    """The ensemble that stores entries from ``first_entry_id`` until the next segment."""

    first_entry_id: int
    bookies: tuple[str, ...]


def write_set_indexes(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """Positions in the ensemble that store ``entry_id``: Qw of them, from ``entry_id mod E``."""
    start = entry_id % ensemble_size
    return tuple((start + k) % ensemble_size for k in range(write_quorum))


def check_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    if not ensemble_size >= write_quorum >= ack_quorum >= 1:
        raise InvalidArgumentError(
            f"a ledger needs ensemble >= write quorum >= ack quorum >= 1, got"
            f" E{ensemble_size}/Qw{write_quorum}/Qa{ack_quorum}",
            context={"E": ensemble_size, "Qw": write_quorum, "Qa": ack_quorum},
        )


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    """One ledger's metadata, as stored at ``/magnetar/ledgers/<id>`` (version 0: not stored)."""

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: LedgerState
    segments: tuple[Segment, ...]
    last_entry_id: int = -1
    length: int = 0
    created_ms: int = 0
    creator: str = ""
    custom: Mapping[str, bytes] = field(default_factory=dict)
    version: int = 0

    @property
    def closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def intended_ensemble_size(self) -> int:
        """The E this ledger was meant to have: more than ``ensemble_size`` if under-striped."""
        raw = self.custom.get(INTENDED_ENSEMBLE_PROPERTY)
        try:
            return max(self.ensemble_size, int(raw)) if raw else self.ensemble_size
        except ValueError:
            return self.ensemble_size

    @property
    def under_striped(self) -> bool:
        """Created on fewer bookies than intended (still Qw copies of each entry, Qa acks)."""
        return self.intended_ensemble_size > self.ensemble_size

    @property
    def last_segment(self) -> Segment:
        return self.segments[-1]

    def segment_index(self, entry_id: int) -> int:
        firsts = [s.first_entry_id for s in self.segments]
        return max(0, bisect.bisect_right(firsts, entry_id) - 1)

    def segment_for(self, entry_id: int) -> Segment:
        return self.segments[self.segment_index(entry_id)]

    def segment_end(self, index: int) -> int | None:
        """Last entry id of segment ``index``, or None if it is the open end of the ledger."""
        if index + 1 < len(self.segments):
            return self.segments[index + 1].first_entry_id - 1
        return self.last_entry_id if self.closed else None

    def write_set(self, entry_id: int) -> tuple[str, ...]:
        """The bookies that store ``entry_id``, in write-set order."""
        bookies = self.segment_for(entry_id).bookies
        return tuple(
            bookies[i] for i in write_set_indexes(entry_id, self.ensemble_size, self.write_quorum)
        )

    def all_bookies(self) -> set[str]:
        return {b for s in self.segments for b in s.bookies}

    def with_segment(self, first_entry_id: int, bookies: Sequence[str]) -> LedgerMetadata:
        """A new ensemble from ``first_entry_id`` on (replacing a segment that starts there)."""
        kept = tuple(s for s in self.segments if s.first_entry_id < first_entry_id)
        return replace(self, segments=(*kept, Segment(first_entry_id, tuple(bookies))))

    def replacing(self, segment_index: int, bookies: Sequence[str]) -> LedgerMetadata:
        """The same segments, with segment ``segment_index`` stored on ``bookies`` instead."""
        segments = list(self.segments)
        segments[segment_index] = Segment(segments[segment_index].first_entry_id, tuple(bookies))
        return replace(self, segments=tuple(segments))

    # --- wire form -----------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        message = ledger_pb2.LedgerMetadata(
            format_version=_FORMAT_VERSION,
            ensemble_size=self.ensemble_size,
            write_quorum_size=self.write_quorum,
            ack_quorum_size=self.ack_quorum,
            state=self.state.value,
            last_entry_id=self.last_entry_id,
            length=self.length,
            checksum_type=ledger_pb2.CHECKSUM_TYPE_CRC32C,
            created_ms=self.created_ms,
            custom_metadata=dict(self.custom),
            creator=self.creator,
        )
        for segment in self.segments:
            message.ensembles.add(
                first_entry_id=segment.first_entry_id, bookie_ids=list(segment.bookies)
            )
        return message.SerializeToString()

    @classmethod
    def from_bytes(cls, ledger_id: int, data: bytes, version: int) -> LedgerMetadata:
        message = ledger_pb2.LedgerMetadata.FromString(data)
        return cls(
            ledger_id=ledger_id,
            ensemble_size=message.ensemble_size,
            write_quorum=message.write_quorum_size,
            ack_quorum=message.ack_quorum_size,
            state=LedgerState(message.state),
            segments=tuple(
                Segment(e.first_entry_id, tuple(e.bookie_ids)) for e in message.ensembles
            ),
            last_entry_id=message.last_entry_id,
            length=message.length,
            created_ms=message.created_ms,
            creator=message.creator,
            custom=dict(message.custom_metadata),
            version=version,
        )


class LedgerMetadataStore:
    """Ledger metadata in the metadata store: create, read, compare-and-swap, delete."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self._ids = IdAllocator(store, layout.LEDGER_ID_COUNTER)

    async def create(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Sequence[str],
        *,
        creator: str = "",
        custom: Mapping[str, bytes] | None = None,
    ) -> LedgerMetadata:
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        ledger_id = await self._ids.next_id()
        metadata = LedgerMetadata(
            ledger_id=ledger_id,
            ensemble_size=ensemble_size,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            state=LedgerState.OPEN,
            segments=(Segment(0, tuple(bookies)),),
            created_ms=int(time.time() * 1000),
            creator=creator,
            custom=dict(custom or {}),
        )
        version = await self.store.create(layout.ledger(ledger_id), metadata.to_bytes())
        return replace(metadata, version=version)

    async def read(self, ledger_id: int) -> LedgerMetadata:
        record = await self.store.get(layout.ledger(ledger_id))
        if record is None:
            raise LedgerNotFoundError(
                f"ledger {ledger_id} does not exist (no metadata)", context={"ledger": ledger_id}
            )
        return LedgerMetadata.from_bytes(ledger_id, record.value, record.version)

    async def write(self, metadata: LedgerMetadata) -> LedgerMetadata:
        """Store ``metadata`` if the stored version is still ``metadata.version`` (else
        BadVersionError / NoSuchKeyError); returns it with its new version."""
        version = await self.store.put(
            layout.ledger(metadata.ledger_id),
            metadata.to_bytes(),
            expected_version=metadata.version,
        )
        return replace(metadata, version=version)

    async def delete(self, metadata: LedgerMetadata) -> None:
        await self.store.delete(
            layout.ledger(metadata.ledger_id), expected_version=metadata.version
        )

    async def ledger_ids(self) -> list[int]:
        listing = await self.store.list(layout.LEDGERS)
        return [int(record.key.rsplit("/", 1)[1]) for record in listing.records]
