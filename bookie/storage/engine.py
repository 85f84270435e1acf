"""The bookie's storage engine: durable entries in segment files, an index, GC and compaction.

Layout of its directory::

    index.ckpt              the index as of some log position (written aside, then renamed)
    seg-0000000001.log      segment files: frames as described in bookie.storage.records

At open, the checkpoint is loaded and the log after its position is replayed. A torn or corrupt
record at the very end of the newest segment (a crash mid-write) is cut off. A damaged record
with valid records after it is kept in the index, so reading it reports corruption instead of
serving it or silently losing the entries that follow.

**Entries are write-once.** :meth:`StorageEngine.add_entries` stores an entry that is not
stored yet. An add of an entry that is stored (or on its way to the disk) succeeds only if it is
identical (same payload, same last-add-confirmed, same checksum): that is an idempotent retry,
and nothing is written again. Any other is refused with :class:`EntryExistsError`, whatever its
recovery flag, so no add ever changes what a reader was given (issue 23, finding 7). The one
exception is a stored copy whose bytes are damaged: a recovery add (ledger recovery,
autorecovery) may replace it, since no reader can be served the damaged one.

The engine knows nothing of gRPC or metadata; the service layer above it validates requests
(fencing, checksums, sizes, read-only mode) and calls :meth:`StorageEngine.add_entries` with
entries it accepted. Durability is reported by completing futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import structlog

from bookie.storage import records
from bookie.storage.config import StorageConfig
from bookie.storage.index import SEGMENT_SHIFT, Index, LedgerIndex, LogPosition, pack_location
from bookie.storage.journal import Journal, JournalStats, Segments, fsync_dir
from bookie.storage.records import FrameError, StoredRecord
from magnetar.common.errors import (
    CorruptionError,
    EntryExistsError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StorageClosedError,
    StorageError,
)
from magnetar.common.files import open_private, private_dir, write_private

log = structlog.get_logger("magnetar.bookie.storage")

CHECKPOINT = "index.ckpt"
DEFAULT_READ_BYTES = 4 * 1024 * 1024


class EntryToStore(NamedTuple):
    """An entry the service accepted, ready to store."""

    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    crc32c: int
    payload: bytes
    recovery: bool = False

    def same_as(self, last_add_confirmed: int, crc32c: int, payload: bytes) -> bool:
        """Whether a copy with these fields is this entry (an add of it is a retry)."""
        return (
            self.last_add_confirmed == last_add_confirmed
            and self.crc32c == crc32c
            and self.payload == payload
        )


_Key = tuple[int, int]
"""(ledger id, entry id)."""
_StoredCopy = tuple[int, StoredRecord | CorruptionError]
"""An entry's location when it was read, and what was read there."""


@dataclass(slots=True)
class _Decision:
    """What an add does with each of its entries."""

    outcomes: list[StorageError | None]
    """Per entry: None (stored, already or by this add) or why it is refused."""
    to_write: list[EntryToStore]
    waits: list[asyncio.Future[None]]
    """Writes in flight that this add's retries wait for."""


@dataclass(frozen=True, slots=True)
class LedgerState:
    """What the bookie knows of one ledger."""

    ledger_id: int
    fenced: bool
    last_add_confirmed: int
    last_entry_id: int
    entries: int
    stored_bytes: int


@dataclass(frozen=True, slots=True)
class GcResult:
    segments_deleted: int
    segments_compacted: int
    entries_moved: int
    bytes_freed: int


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    checkpoint_position: LogPosition | None
    records_replayed: int
    bytes_cut: int
    corrupt_records: int


class StorageEngine:
    """Entries on disk. Create with :meth:`open`; stop with :meth:`close`."""

    def __init__(self, directory: Path, config: StorageConfig) -> None:
        self.directory = directory
        self.config = config
        self.index = Index()
        self.segments = Segments(directory)
        self._journal: Journal | None = None
        self._since_checkpoint = 0
        self._checkpoint_wanted = asyncio.Event()
        self._checkpoint_lock = asyncio.Lock()
        self._gc_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._pending: dict[_Key, tuple[EntryToStore, asyncio.Future[None]]] = {}
        """Entries submitted and not durable yet (the journal's future of each)."""
        self.recovery: RecoveryReport | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    @classmethod
    async def open(cls, directory: Path, config: StorageConfig) -> StorageEngine:
        """Recover the directory's state and start writing after it."""
        engine = cls(directory, config)
        head = await asyncio.to_thread(engine._recover)
        engine._journal = Journal(engine.segments, config, head, on_batch=engine._after_batch)
        engine._journal.start()
        engine._tasks.append(asyncio.create_task(engine._checkpoint_loop(), name="checkpoints"))
        if config.gc_interval_s > 0:
            engine._tasks.append(asyncio.create_task(engine._gc_loop(), name="gc"))
        return engine

    async def close(self, *, checkpoint: bool = True) -> None:
        """Finish queued writes, checkpoint (unless told not to), and release the files.

        ``checkpoint=False`` leaves the directory as a crash after the last write would: the next
        open replays the log since the previous checkpoint.
        """
        if self._closed:
            return
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._journal is not None:
            if checkpoint:
                with contextlib.suppress(StorageClosedError):
                    await self.checkpoint()
            await self._journal.close()
        self._closed = True
        self.segments.close()

    @property
    def journal_stats(self) -> JournalStats | None:
        """Group-commit counters, while the engine is open."""
        return self._journal.stats if self._journal is not None and not self._closed else None

    @property
    def journal(self) -> Journal:
        if self._journal is None or self._closed:
            raise StorageClosedError("the storage engine is closed")
        return self._journal

    # --- writes ----------------------------------------------------------------------------------

    async def add_entries(self, entries: Sequence[EntryToStore]) -> list[StorageError | None]:
        """Store entries durably (one group commit), each at most once (see the module docstring).

        Returns one outcome per entry, in order, once every entry it accepted is on stable
        storage: None for an entry stored (now, or already identical), or the refusal
        (:class:`EntryExistsError`; :class:`CorruptionError` for a normal add over a damaged
        copy; :class:`LedgerFencedError` for a normal add to a fenced ledger, as the service
        checks first, since comparing stored copies may await). Raises a
        :class:`StorageError` if the journal could not write them.
        """
        stored: dict[_Key, _StoredCopy] = {}
        while True:
            decided = self._decide(entries, stored)
            if isinstance(decided, _Decision):
                break
            # adds of entries already stored (retries, or conflicts): read the stored copies
            # to compare the bytes, then decide again (the reads awaited; things moved on)
            stored.update(await self._read_stored(decided))
        # _decide ran with no await since, so no other add slipped in between it and this
        return await self._commit(decided)

    def try_add_entries(
        self, entries: Sequence[EntryToStore]
    ) -> asyncio.Future[list[StorageError | None]] | None:
        """:meth:`add_entries` without a task, when no stored copy must be read first (adds of
        new entries: every add but a retry or a conflict). None when one must: call
        :meth:`add_entries` then. The future completes as the coroutine would return, or
        fails with the :class:`StorageError` it would raise; cancelling it cancels no write."""
        decided = self._decide(entries, {})
        return self._commit(decided) if isinstance(decided, _Decision) else None

    def _commit(self, decided: _Decision) -> asyncio.Future[list[StorageError | None]]:
        """Submit what ``decided`` writes; a future of its outcomes once that and the writes it
        waits for are durable. Callbacks, not a gather of shields: a cancelled caller must not
        cancel a write that other adds wait for, and this runs once per add request."""
        waits = decided.waits
        if decided.to_write:
            waits.append(self._submit(decided.to_write))
        result: asyncio.Future[list[StorageError | None]] = (
            asyncio.get_running_loop().create_future()
        )
        unique = set(waits)
        if not unique:
            result.set_result(decided.outcomes)
            return result
        left = len(unique)

        def settled(write: asyncio.Future[None]) -> None:
            nonlocal left
            left -= 1
            if result.done():
                return
            if write.cancelled():
                result.set_exception(StorageClosedError("the storage engine was closed"))
            elif (error := write.exception()) is not None:
                result.set_exception(error)
            elif left == 0:
                result.set_result(decided.outcomes)

        for write in unique:
            write.add_done_callback(settled)
        return result

    def _decide(
        self, entries: Sequence[EntryToStore], stored: dict[_Key, _StoredCopy]
    ) -> _Decision | dict[_Key, int]:
        """What to do with each entry, or first the stored copies to read (key -> location)."""
        decision = _Decision([None] * len(entries), [], [])
        outcomes = decision.outcomes
        batch: dict[_Key, EntryToStore] = {}
        unread: dict[_Key, int] = {}
        pending = self._pending
        ledger: LedgerIndex | None = None
        for i, e in enumerate(entries):
            key = (e.ledger_id, e.entry_id)
            first = batch.get(key)
            if first is None and (in_flight := pending.get(key)) is not None:
                first = in_flight[0]
                decision.waits.append(in_flight[1])
            if first is not None:
                if not e.same_as(first.last_add_confirmed, first.crc32c, first.payload):
                    outcomes[i] = _conflict(e, "an add of it with other bytes is being stored")
                continue
            if ledger is None or ledger.ledger_id != e.ledger_id:
                ledger = self.index.ledger(e.ledger_id)
            if ledger is not None and ledger.fenced and not e.recovery:
                # the service checked this before, but reading stored copies awaited since:
                # a normal add is written before a fence record, or not at all
                outcomes[i] = _fenced(e)
                continue
            found = ledger.get(e.entry_id) if ledger is not None else None
            if found is not None:
                copy = stored.get(key)
                if copy is None or copy[0] != found[0]:
                    unread[key] = found[0]
                    continue
                outcomes[i] = _against_stored(e, copy[1])
                if outcomes[i] is not None or not isinstance(copy[1], CorruptionError):
                    continue
                log.warning("damaged_entry_replaced", ledger=e.ledger_id, entry=e.entry_id)
            batch[key] = e
            decision.to_write.append(e)
        return unread or decision

    def _submit(self, entries: list[EntryToStore]) -> asyncio.Future[None]:
        frames = [
            records.encode_entry(
                e.ledger_id,
                e.entry_id,
                e.last_add_confirmed,
                e.crc32c,
                e.payload,
                recovery=e.recovery,
            )
            for e in entries
        ]
        index = self.index
        pending = self._pending

        def on_durable(segment_id: int, offsets: list[int]) -> None:
            for entry, offset, frame in zip(entries, offsets, frames, strict=True):
                index.put_entry(
                    entry.ledger_id,
                    entry.entry_id,
                    entry.last_add_confirmed,
                    segment_id,
                    offset,
                    len(frame[0]) + len(frame[1]),
                )

        def settled(future: asyncio.Future[None]) -> None:
            if not future.cancelled():
                future.exception()  # retrieved: each waiter gets it from its own await
            for e in entries:
                key = (e.ledger_id, e.entry_id)
                if pending.get(key, (None, None))[1] is future:
                    del pending[key]

        future = self.journal.submit(frames, on_durable)
        for e in entries:
            pending[e.ledger_id, e.entry_id] = (e, future)
        future.add_done_callback(settled)
        return future

    async def _read_stored(self, wanted: dict[_Key, int]) -> dict[_Key, _StoredCopy]:
        """The stored copies of these entries, each read and checked, or why it is damaged."""
        copies: dict[_Key, _StoredCopy] = {}
        by_ledger: dict[int, list[int]] = {}
        for ledger_id, entry_id in sorted(wanted):
            by_ledger.setdefault(ledger_id, []).append(entry_id)
        for ledger_id, entry_ids in by_ledger.items():
            ledger = self.index.ledger(ledger_id)
            frames = [(e, ledger.get(e)) for e in entry_ids] if ledger is not None else []
            located = [(e, found[0], found[1]) for e, found in frames if found is not None]
            results = await self._read_located(ledger_id, located)
            for (entry_id, location, _), result in zip(located, results, strict=True):
                copies[ledger_id, entry_id] = (location, result)
        return copies

    async def _read_located(
        self, ledger_id: int, located: list[tuple[int, int, int]]
    ) -> list[StoredRecord | CorruptionError]:
        acquired = {}
        try:
            for _, location, _ in located:
                segment_id = location >> SEGMENT_SHIFT
                if segment_id not in acquired:
                    acquired[segment_id] = self.segments.acquire(segment_id)
            fds = {sid: seg.fd for sid, seg in acquired.items()}
            return await asyncio.to_thread(
                _read_frames, fds, located, ledger_id, stop_at_damage=False
            )
        finally:
            for segment in acquired.values():
                self.segments.release(segment)

    async def fence(self, ledger_id: int) -> LedgerState:
        """Fence a ledger durably; returns its state once the fence is on stable storage."""
        # The flag is set before the record is durable: adds arriving from now on are refused,
        # and those accepted earlier are ahead of the fence record in the log.
        self.index.fence(ledger_id)
        frame = records.encode_ledger_record(records.TYPE_FENCE, ledger_id)
        await self.journal.submit([frame])
        state = self.ledger_state(ledger_id)
        assert state is not None
        return state

    async def delete_ledger(self, ledger_id: int) -> bool:
        """Forget a ledger durably; returns whether it was stored here. Space returns at GC."""
        existed = self.index.delete(ledger_id)
        frame = records.encode_ledger_record(records.TYPE_DELETE, ledger_id)
        await self.journal.submit([frame])
        return existed

    # --- reads -----------------------------------------------------------------------------------

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        ledger = self.index.ledger(ledger_id)
        if ledger is None:
            return None
        return _state_of(ledger)

    def ledger_ids(self) -> list[int]:
        return sorted(self.index.ledgers)

    async def read_entries(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        max_bytes: int = 0,
        *,
        entry_ids: Sequence[int] | None = None,
    ) -> list[StoredRecord]:
        """Entries ``first..last`` (inclusive), stopping early at ``max_bytes`` or a missing one.

        With ``entry_ids``, exactly those entries instead, leaving out the ones not stored here.
        Raises NoSuchLedgerError if the ledger is not stored here, NoSuchEntryError if the first
        entry of a range is not, and CorruptionError if the first entry's bytes are damaged (a
        damaged later one ends the read early, so the next read reports it).
        """
        ledger = self.index.ledger(ledger_id)
        if ledger is None:
            raise NoSuchLedgerError(
                f"this bookie stores no entry of ledger {ledger_id}", context={"ledger": ledger_id}
            )
        budget = max_bytes or DEFAULT_READ_BYTES
        wanted: list[tuple[int, int, int]] = []
        total = 0
        listed = entry_ids is not None
        for entry_id in (
            entry_ids if entry_ids is not None else range(first_entry_id, last_entry_id + 1)
        ):
            found = ledger.get(entry_id)
            if found is None:
                if listed:
                    continue
                break
            wanted.append((entry_id, found[0], found[1]))
            total += found[1]
            if total >= budget:
                break
        if not wanted:
            if listed:
                return []
            raise NoSuchEntryError(
                f"this bookie does not store entry {first_entry_id} of ledger {ledger_id}",
                context={"ledger": ledger_id, "entry": first_entry_id},
            )
        acquired = {}
        try:
            for _, location, _ in wanted:
                segment_id = location >> SEGMENT_SHIFT
                if segment_id not in acquired:
                    acquired[segment_id] = self.segments.acquire(segment_id)
            fds = {sid: seg.fd for sid, seg in acquired.items()}
            results = await asyncio.to_thread(_read_frames, fds, wanted, ledger_id)
        finally:
            for segment in acquired.values():
                self.segments.release(segment)
        if isinstance(results[-1], CorruptionError):
            if len(results) == 1:
                raise results[-1]
            results.pop()
        return [r for r in results if isinstance(r, StoredRecord)]

    # --- checkpoints ---------------------------------------------------------------------------

    def _after_batch(self, size: int) -> None:
        self._since_checkpoint += size
        if self._since_checkpoint >= self.config.checkpoint_after_bytes:
            self._checkpoint_wanted.set()

    async def checkpoint(self) -> LogPosition:
        """Write the index as of now; returns the log position it covers."""
        async with self._checkpoint_lock:

            def snapshot() -> tuple[bytes, LogPosition]:
                position = self.journal.position
                return self.index.serialize(position), position

            data, position = await self.journal.at_boundary(snapshot)
            self._since_checkpoint = 0
            await asyncio.to_thread(self._write_checkpoint, data)
            return position

    def _write_checkpoint(self, data: bytes) -> None:
        tmp = self.directory / f"{CHECKPOINT}.tmp"
        write_private(tmp, data)
        os.replace(tmp, self.directory / CHECKPOINT)
        fsync_dir(self.directory)

    async def _checkpoint_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._checkpoint_wanted.wait(), self.config.checkpoint_interval_s
                )
            self._checkpoint_wanted.clear()
            try:
                await self.checkpoint()
            except StorageClosedError:
                return
            except Exception:
                log.exception("checkpoint_failed")

    # --- garbage collection --------------------------------------------------------------------

    async def collect_garbage(self) -> GcResult:
        """Delete sealed segments with no live entries; compact the mostly dead ones."""
        async with self._gc_lock:
            covered = await self.checkpoint()
            deleted = compacted = moved = freed = 0
            to_delete: list[int] = []
            for segment_id in self.segments.ids():
                if segment_id >= covered.segment_id:
                    break  # the head segment (and anything the checkpoint does not cover)
                size = self.segments.path(segment_id).stat().st_size
                live = self.index.live_bytes.get(segment_id, 0)
                if live <= 0:
                    to_delete.append(segment_id)
                elif size and live / size < self.config.gc_max_live_ratio:
                    moved += await self._compact(segment_id)
                    compacted += 1
                    to_delete.append(segment_id)
            if to_delete:
                # the moved entries must be in a checkpoint before their old copies go
                await self.checkpoint()
                for segment_id in to_delete:
                    freed += self.segments.delete(segment_id)
                    self.index.live_bytes.pop(segment_id, None)
                    deleted += 1
                fsync_dir(self.directory)
            result = GcResult(deleted, compacted, moved, freed)
            if deleted:
                log.info(
                    "gc_completed",
                    segments_deleted=deleted,
                    segments_compacted=compacted,
                    entries_moved=moved,
                    bytes_freed=freed,
                )
            return result

    async def _compact(self, segment_id: int) -> int:
        """Copy a segment's live entries to the head of the log; returns how many moved."""
        path = self.segments.path(segment_id)
        live = await asyncio.to_thread(self._live_frames, path, segment_id)
        if not live:
            return 0
        frames = [(frame,) for _, _, _, frame in live]
        index = self.index
        moved = 0

        def on_durable(new_segment: int, offsets: list[int]) -> None:
            nonlocal moved
            for (ledger_id, entry_id, old_location, _), offset in zip(live, offsets, strict=True):
                if index.move_entry(ledger_id, entry_id, old_location, new_segment, offset):
                    moved += 1

        await self.journal.submit(frames, on_durable)
        return moved

    def _live_frames(self, path: Path, segment_id: int) -> list[tuple[int, int, int, bytes]]:
        """(ledger, entry, location, frame bytes) of the entries in a segment the index uses."""
        found: list[tuple[int, int, int, bytes]] = []
        with open(path, "rb") as f, _mapped(f.fileno()) as data:
            offset = 0
            while offset < len(data):
                length = records.frame_length_at(data, offset)
                if length is None or offset + length > len(data):
                    break
                ids = records.peek_entry_ids(data[offset + records.FRAME.size : offset + length])
                if ids is not None:
                    location = pack_location(segment_id, offset)
                    ledger = self.index.ledger(ids[0])
                    current = ledger.get(ids[1]) if ledger else None
                    if current is not None and current[0] == location:
                        found.append(
                            (ids[0], ids[1], location, bytes(data[offset : offset + length]))
                        )
                offset += length
        return found

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.gc_interval_s)
            try:
                await self.collect_garbage()
            except StorageClosedError:
                return
            except Exception:
                log.exception("gc_failed")

    # --- disk ------------------------------------------------------------------------------------

    def disk_bytes(self) -> int:
        """Bytes of every file in the storage directory."""
        return sum(p.stat().st_size for p in self.directory.iterdir() if p.is_file())

    # --- recovery --------------------------------------------------------------------------------

    def _recover(self) -> LogPosition:
        private_dir(self.directory)
        for tmp in self.directory.glob("*.tmp"):
            tmp.unlink()
        checkpoint_path = self.directory / CHECKPOINT
        start = LogPosition(1, 0)
        checkpoint_position: LogPosition | None = None
        if checkpoint_path.exists():
            try:
                self.index, start = Index.deserialize(checkpoint_path.read_bytes())
            except ValueError as e:
                raise CorruptionError(
                    f"the index checkpoint {checkpoint_path} is damaged ({e}); it is written"
                    " aside and renamed, so this is not a torn write. The bookie does not start"
                    " on a damaged index: restore the file or rebuild this bookie's data from"
                    " its replicas.",
                    context={"path": str(checkpoint_path)},
                ) from e
            checkpoint_position = start
        segment_ids = [s for s in self.segments.ids() if s >= start.segment_id]
        replayed = cut = corrupt = 0
        for i, segment_id in enumerate(segment_ids):
            offset = start.offset if segment_id == start.segment_id else 0
            n, c, k = self._replay_segment(segment_id, offset, last=i == len(segment_ids) - 1)
            replayed, cut, corrupt = replayed + n, cut + c, corrupt + k
        if segment_ids:
            head_id = segment_ids[-1]
            head = LogPosition(head_id, self.segments.path(head_id).stat().st_size)
        else:
            head = LogPosition(max(start.segment_id, 1), 0)
            os.close(open_private(self.segments.path(head.segment_id), os.O_WRONLY | os.O_CREAT))
            fsync_dir(self.directory)
        self.recovery = RecoveryReport(checkpoint_position, replayed, cut, corrupt)
        log.info(
            "storage_recovered",
            path=str(self.directory),
            ledgers=len(self.index.ledgers),
            records_replayed=replayed,
            bytes_cut=cut,
            corrupt_records=corrupt,
            head_segment=head.segment_id,
        )
        return head

    def _replay_segment(self, segment_id: int, start: int, *, last: bool) -> tuple[int, int, int]:
        """Apply a segment's frames from ``start``; returns (replayed, bytes cut, corrupt)."""
        path = self.segments.path(segment_id)
        replayed = corrupt = 0
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= start:
                return 0, 0, 0
            with _mapped(f.fileno()) as data:
                offset = start
                while offset < size:
                    length = records.frame_length_at(data, offset)
                    problem: str | None = None
                    if length is None or offset + length > size:
                        problem = "a frame runs past the end of the segment"
                    else:
                        try:
                            record = records.decode_frame(data[offset : offset + length])
                            self._apply(record, segment_id, offset, length)
                            replayed += 1
                            offset += length
                            continue
                        except FrameError as e:
                            problem = str(e)
                    # A damaged frame whose length still leads to a good frame (or to the very end
                    # of a sealed segment) is bit rot inside the log: keep going past it.
                    next_ok = length is not None and (
                        _frame_ok_at(data, offset + length, size)
                        or (not last and offset + length == size)
                    )
                    if next_ok and length is not None:
                        self._index_damaged(data, segment_id, offset, length)
                        corrupt += 1
                        log.error(
                            "corrupt_record_found",
                            segment=segment_id,
                            offset=offset,
                            reason=problem,
                        )
                        offset += length
                        continue
                    if not last:
                        raise CorruptionError(
                            f"segment {path} is damaged at byte {offset} ({problem}) and the"
                            " rest of it cannot be read; the bookie does not start on it",
                            context={"path": str(path), "offset": offset},
                        )
                    break
            if offset < size:
                cut = size - offset
                log.warning("torn_tail_cut", segment=segment_id, offset=offset, bytes_cut=cut)
        if offset < size:
            with open(path, "r+b") as f:
                f.truncate(offset)
                os.fsync(f.fileno())
            return replayed, size - offset, corrupt
        return replayed, 0, corrupt

    def _apply(self, record: StoredRecord, segment_id: int, offset: int, length: int) -> None:
        if record.type == records.TYPE_ENTRY:
            self.index.put_entry(
                record.ledger_id,
                record.entry_id,
                record.last_add_confirmed,
                segment_id,
                offset,
                length,
            )
        elif record.type == records.TYPE_FENCE:
            self.index.fence(record.ledger_id)
        else:
            self.index.delete(record.ledger_id)

    def _index_damaged(
        self, data: mmap.mmap | bytes, segment_id: int, offset: int, length: int
    ) -> None:
        # index it where it lies: a read then checks the CRC and reports the damage
        ids = records.peek_entry_ids(data[offset + records.FRAME.size : offset + length])
        if ids is not None:
            self.index.put_entry(ids[0], ids[1], -1, segment_id, offset, length)


def _against_stored(
    entry: EntryToStore, copy: StoredRecord | CorruptionError
) -> StorageError | None:
    """Why an add of a stored entry is refused, or None (a retry, or a repair)."""
    if isinstance(copy, CorruptionError):
        if entry.recovery:
            return None  # a repair: the damaged copy is never served
        return CorruptionError(
            f"entry {entry.entry_id} of ledger {entry.ledger_id} is stored on this bookie"
            " but damaged; only a recovery add may replace it",
            context={"ledger": entry.ledger_id, "entry": entry.entry_id},
        )
    if entry.same_as(copy.last_add_confirmed, copy.crc32c, copy.payload):
        return None
    return _conflict(entry, "it is stored with other bytes")


def _fenced(entry: EntryToStore) -> LedgerFencedError:
    return LedgerFencedError(
        f"ledger {entry.ledger_id} is fenced on this bookie: another client is recovering it",
        context={"ledger": entry.ledger_id},
    )


def _conflict(entry: EntryToStore, why: str) -> EntryExistsError:
    return EntryExistsError(
        f"entry {entry.entry_id} of ledger {entry.ledger_id} already exists on this bookie and"
        f" entries are write-once: {why}. Only an identical add (same payload, same"
        " last_add_confirmed, same crc32c) is accepted again, as a retry",
        context={"ledger": entry.ledger_id, "entry": entry.entry_id},
    )


def _state_of(ledger: LedgerIndex) -> LedgerState:
    return LedgerState(
        ledger.ledger_id,
        ledger.fenced,
        ledger.lac,
        ledger.last_entry_id,
        ledger.entry_count,
        ledger.stored_bytes,
    )


@contextlib.contextmanager
def _mapped(fd: int) -> Iterator[mmap.mmap | bytes]:
    size = os.fstat(fd).st_size
    if size == 0:
        yield b""
        return
    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        yield mapped
    finally:
        mapped.close()


def _frame_ok_at(data: mmap.mmap | bytes, offset: int, size: int) -> bool:
    length = records.frame_length_at(data, offset)
    if length is None or offset + length > size:
        return False
    try:
        records.decode_frame(data[offset : offset + length])
    except FrameError:
        return False
    return True


def _read_frames(
    fds: dict[int, int],
    wanted: list[tuple[int, int, int]],
    ledger_id: int,
    *,
    stop_at_damage: bool = True,
) -> list[StoredRecord | CorruptionError]:
    """In a worker thread: read and check each frame; stop at the first damaged one (or with
    ``stop_at_damage=False`` report each damaged one in its place and go on)."""
    results: list[StoredRecord | CorruptionError] = []
    for entry_id, location, length in wanted:
        segment_id, offset = location >> SEGMENT_SHIFT, location & ((1 << SEGMENT_SHIFT) - 1)
        frame = os.pread(fds[segment_id], length, offset)
        problem = None
        try:
            record = records.decode_frame(frame)
        except FrameError as e:
            problem = str(e)
        else:
            if record.ledger_id != ledger_id or record.entry_id != entry_id:
                problem = f"the frame holds ledger {record.ledger_id} entry {record.entry_id}"
        if problem is not None:
            results.append(
                CorruptionError(
                    f"entry {entry_id} of ledger {ledger_id} is damaged on this bookie"
                    f" (segment {segment_id}, byte {offset}: {problem}); it is not served",
                    context={"ledger": ledger_id, "entry": entry_id, "segment": segment_id},
                )
            )
            if stop_at_damage:
                break
            continue
        results.append(record)
    return results
