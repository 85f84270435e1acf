"""Producer deduplication: a resent batch is answered, not stored twice.

Each producer numbers its messages; a batch carries its first and last sequence id. The broker
keeps, per producer name, the highest last sequence id *pushed* (handed to the managed ledger)
and *persisted* (confirmed). A batch whose last sequence id is at or below the persisted mark
is a duplicate and gets a ``duplicate`` receipt; one at or below the pushed mark is waiting on
the first copy and is answered when that completes.

A Pulsar producer's chunked message is several entries (chunks) under one sequence id. As in
Pulsar, only its last chunk completes the message: it alone is checked against and moves the
marks, so the chunks before it are stored. Unlike Pulsar, a chunk that is already stored is not
stored again when a producer resends it (after a reconnection, chunks whose receipts it missed):
Pulsar's consumers drop a chunked message whose chunks come twice, so each producer's latest
chunked message keeps the positions of its chunks, rebuilt from the entries on failover too.

The persisted marks survive failover: every ``snapshot_interval`` entries the table is written
to ``/magnetar/dedup/<partition>`` with the position it covers, and a new owner loads it and
replays the entries after that position (each envelope names its producer and sequence ids).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from dataclasses import dataclass

import structlog

from broker.managed_ledger import AppendResult, ManagedLedger, Position
from broker.service.envelope import producer_of
from broker.service.records import (
    DeduplicationSnapshot,
    decode_dedup_snapshot,
    encode_dedup_snapshot,
)
from magnetar.common.errors import MagnetarError
from metadata import MetadataStore, layout

log = structlog.get_logger("magnetar.broker.dedup")

RECENT_RECEIPTS = 10_000
"""Receipts remembered so a duplicate can be answered with the original message id."""
RECENT_MESSAGES = 20_000
"""How far back a new owner replays to know the receipts of recent batches: twice a producer's
default ``max_pending_messages``, so that whatever a producer can resend after a failover is
known. Older resends (not possible with default settings) are answered with -1:-1, as Pulsar
answers every duplicate."""
RECENT_BYTES = 64 << 20
"""...but never more than about this many bytes of replay before the snapshot's position."""
REPLAY_BATCH = 500


@dataclass(frozen=True, slots=True)
class Stored:
    position: Position
    first_offset: int
    publish_time_ms: int


UNKNOWN = Stored(Position(-1, -1), -1, -1)
"""The answer to a duplicate whose original receipt is no longer remembered."""


@dataclass(slots=True)
class _ChunkedMessage:
    """A producer's latest chunked message: its chunks stored or being stored."""

    sequence_id: int
    chunks: dict[int, Stored | asyncio.Future[AppendResult]]


class Deduplication:
    """The deduplication table of one partition."""

    def __init__(
        self,
        store: MetadataStore,
        partition: str,
        ml: ManagedLedger,
        *,
        enabled: bool,
        snapshot_interval: int,
    ) -> None:
        self._store = store
        self._key = layout.dedup_snapshot(partition)
        self._ml = ml
        self.enabled = enabled
        self._interval = snapshot_interval
        self.persisted: dict[str, int] = {}
        self.pushed: dict[str, int] = {}
        self._inflight: dict[tuple[str, int], asyncio.Future[AppendResult]] = {}
        self._recent: OrderedDict[tuple[str, int], Stored] = OrderedDict()
        self._chunked: dict[str, _ChunkedMessage] = {}
        self._since_snapshot = 0
        self._last_position = Position(-1, -1)
        self._snapshotting: asyncio.Task[None] | None = None

    async def load(self) -> None:
        """Load the snapshot and replay the entries written after it."""
        if not self.enabled:
            return
        record = await self._store.get(self._key)
        start = self._ml.first_position
        if record is not None:
            snapshot = decode_dedup_snapshot(record.value)
            self.persisted.update(snapshot.last_sequence_ids)
            covered = Position(snapshot.ledger_id, snapshot.entry_id)
            if covered >= start:
                start = self._ml.next_position(covered)
        # the sequence marks need only the entries after the snapshot; the receipts of the
        # batches a producer may resend need the recent ones before it too
        marks_from = start
        start = min(start, await self._recent_start())
        replayed = 0
        before_marks = 0
        end = self._ml.last_confirmed
        while start <= end:
            if start < marks_from and before_marks > RECENT_BYTES:
                start = marks_from  # enough receipts: large messages fill the budget early
            entries = await self._ml.read(start, max_entries=REPLAY_BATCH, max_bytes=64 << 20)
            if not entries:
                break
            before_marks += sum(len(e.payload) for e in entries if e.position < marks_from)
            for entry in entries:
                with contextlib.suppress(MagnetarError):
                    produced = producer_of(entry.payload)
                    producer, last_sequence_id = produced.producer_name, produced.last_sequence_id
                    stored = Stored(entry.position, entry.first_offset, entry.publish_time_ms)
                    if produced.num_chunks > 1:
                        self._chunk_stored(producer, last_sequence_id, produced.chunk_id, stored)
                    if produced.completes_message:
                        if last_sequence_id > self.persisted.get(producer, -1):
                            self.persisted[producer] = last_sequence_id
                        self._remember(producer, last_sequence_id, stored)
                replayed += 1
            start = self._ml.next_position(entries[-1].position)
        self.pushed = dict(self.persisted)
        self._last_position = end
        log.info("dedup_loaded", key=self._key, producers=len(self.persisted), replayed=replayed)

    async def _recent_start(self) -> Position:
        """Where the last ``RECENT_MESSAGES`` messages begin (fewer when they are large)."""
        ml = self._ml
        stored = ml.confirmed_next_offset - ml.earliest_offset
        if stored <= 0:
            return ml.first_position
        average = max(1, ml.storage_size_bytes // stored)
        window = min(RECENT_MESSAGES, max(1, RECENT_BYTES // average))
        return await ml.position_for_offset(
            max(ml.earliest_offset, ml.confirmed_next_offset - window)
        )

    def _remember(self, producer: str, last_sequence_id: int, stored: Stored) -> None:
        self._recent[(producer, last_sequence_id)] = stored
        self._recent.move_to_end((producer, last_sequence_id))
        if len(self._recent) > RECENT_RECEIPTS:
            self._recent.popitem(last=False)

    def last_sequence_id(self, producer: str) -> int:
        return self.persisted.get(producer, -1)

    def duplicate_of(
        self, producer: str, last_sequence_id: int, *, chunk_id: int = 0, num_chunks: int = 0
    ) -> Stored | asyncio.Future[AppendResult] | None:
        """None if the batch (or chunk) is new; else what stored it (or the append still
        storing it)."""
        if not self.enabled:
            return None
        if num_chunks > 1:
            message = self._chunked.get(producer)
            if message is not None and message.sequence_id == last_sequence_id:
                known = message.chunks.get(chunk_id)
                if known is not None:
                    return known
            if chunk_id < num_chunks - 1:
                # a chunk before the last: new, unless its message was completed already
                if last_sequence_id > self.pushed.get(producer, -1):
                    return None
                return UNKNOWN
        if last_sequence_id > self.pushed.get(producer, -1):
            return None
        inflight = self._inflight.get((producer, last_sequence_id))
        if inflight is not None:
            return inflight
        return self._recent.get((producer, last_sequence_id), UNKNOWN)

    def pushing(
        self,
        producer: str,
        last_sequence_id: int,
        future: asyncio.Future[AppendResult],
        *,
        chunk_id: int = 0,
        num_chunks: int = 0,
    ) -> None:
        if not self.enabled:
            return
        if num_chunks > 1:
            self._chunk_stored(producer, last_sequence_id, chunk_id, future)
            if chunk_id < num_chunks - 1:
                return
        self.pushed[producer] = max(self.pushed.get(producer, -1), last_sequence_id)
        self._inflight[(producer, last_sequence_id)] = future

    def _chunk_stored(
        self,
        producer: str,
        sequence_id: int,
        chunk_id: int,
        stored: Stored | asyncio.Future[AppendResult],
    ) -> None:
        message = self._chunked.get(producer)
        if message is None or message.sequence_id != sequence_id:
            # a new chunked message: the producer is done with the one before (or gave it up)
            message = self._chunked[producer] = _ChunkedMessage(sequence_id, {})
        message.chunks[chunk_id] = stored

    def stored(
        self,
        producer: str,
        last_sequence_id: int,
        result: AppendResult,
        *,
        chunk_id: int = 0,
        num_chunks: int = 0,
    ) -> None:
        if not self.enabled:
            return
        stored = Stored(result.position, result.first_offset, result.publish_time_ms)
        if num_chunks > 1:
            message = self._chunked.get(producer)
            if message is not None and message.sequence_id == last_sequence_id:
                message.chunks[chunk_id] = stored
        if num_chunks <= 1 or chunk_id == num_chunks - 1:
            self._inflight.pop((producer, last_sequence_id), None)
            if last_sequence_id > self.persisted.get(producer, -1):
                self.persisted[producer] = last_sequence_id
            self._remember(producer, last_sequence_id, stored)
        self._last_position = max(self._last_position, result.position)
        self._since_snapshot += 1
        if self._since_snapshot >= self._interval and self._snapshotting is None:
            self._snapshotting = asyncio.create_task(self._snapshot_in_background())

    def failed(
        self, producer: str, last_sequence_id: int, *, chunk_id: int = 0, num_chunks: int = 0
    ) -> None:
        """The append failed: a resend must be stored, not dropped."""
        if not self.enabled:
            return
        if num_chunks > 1:
            message = self._chunked.get(producer)
            if message is not None and message.sequence_id == last_sequence_id:
                message.chunks.pop(chunk_id, None)
            if chunk_id < num_chunks - 1:
                return
        self._inflight.pop((producer, last_sequence_id), None)
        self.pushed[producer] = self.persisted.get(producer, -1)

    async def _snapshot_in_background(self) -> None:
        try:
            await self.snapshot()
        except MagnetarError as e:
            log.warning("dedup_snapshot_failed", key=self._key, error=e.message)
        finally:
            self._snapshotting = None

    async def snapshot(self) -> None:
        """Persist the table as of the last confirmed entry."""
        if not self.enabled or self._last_position < Position(0, 0):
            return
        self._since_snapshot = 0
        snapshot = DeduplicationSnapshot(
            self._last_position.ledger_id, self._last_position.entry_id, dict(self.persisted)
        )
        await self._store.put(self._key, encode_dedup_snapshot(snapshot))

    async def close(self) -> None:
        if self._snapshotting is not None:
            try:
                await self._snapshotting
            except Exception:
                log.exception("dedup_snapshot_crashed", key=self._key)
        with contextlib.suppress(MagnetarError):
            await self.snapshot()
