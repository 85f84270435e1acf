"""The bookie service: what a bookie does with requests, above its storage engine.

- **Adds** are checked (ids, last-add-confirmed, size, checksum, fencing, read-only mode), and the
  accepted ones are stored as one group. Each refused entry gets its own error; the rest of the
  request goes ahead. An entry's last-add-confirmed must be below its own id (-1: none yet): a
  writer cannot have confirmed an entry it has not sent, and a bookie that believed it would
  lead a recovery to close the ledger past its end (issue 23, finding 8).
- **Entries are write-once** (enforced by the storage engine): an add of a stored entry succeeds
  only when identical, as a retry; any other, recovery adds included, is refused with
  ``EntryExistsError``.
- **Fencing**: a fenced ledger refuses normal adds and accepts recovery adds. The check and the
  submission to the journal happen with no ``await`` in between, so an add either precedes a
  fence in the log (and the fence's answer counts it) or is refused.
- **LAC**: the ledger's last add confirmed, as last reported by its writer (piggy-backed on adds).
  Readers long-poll for it to advance.
- **Read-only mode**: when disk usage passes ``readonly_disk_usage`` adds are refused, except
  recovery adds that close ledgers. Reads, fencing, deletes and compaction go on, so the bookie
  can dig itself out, and it turns writable again below ``writable_disk_usage``.

No gRPC here: the adapter in :mod:`bookie.grpc` converts the wire messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import structlog

from bookie.entries import (
    NO_ENTRY,
    AddEntry,
    AddFailure,
    FenceResult,
    LacResult,
    ReadEntry,
    ReadResult,
    entry_checksum,
)
from bookie.service.config import BookieConfig
from bookie.service.metrics import BookieMetrics
from bookie.storage.engine import EntryToStore, StorageEngine
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    BookieReadOnlyError,
    ChecksumMismatchError,
    EntryExistsError,
    EntryTooLargeError,
    InvalidArgumentError,
    LedgerFencedError,
    MagnetarError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StorageError,
)

log = structlog.get_logger("magnetar.bookie")

MAX_LAC_WAIT_MS = 60_000
MAX_LISTED_ENTRIES = 100_000
CONFLICT_LOG_INTERVAL_S = 1.0
"""At most one log line a second for adds refused as write-once conflicts (a metric counts all)."""


class DiskUsage(NamedTuple):
    total_bytes: int
    free_bytes: int

    @property
    def used_fraction(self) -> float:
        return 1.0 - self.free_bytes / self.total_bytes if self.total_bytes else 0.0


DiskProbe = Callable[[], DiskUsage]


def disk_probe_for(path: Path) -> DiskProbe:
    """The file system's real usage at ``path``."""

    def probe() -> DiskUsage:
        usage = shutil.disk_usage(path)
        return DiskUsage(usage.total, usage.free)

    return probe


@dataclass(frozen=True, slots=True)
class BookieStatus:
    """Identity, state and disk figures (what registration publishes and GetBookieInfo says)."""

    bookie_id: str
    address: str
    read_only: bool
    total_disk_bytes: int
    free_disk_bytes: int
    ledger_count: int
    labels: dict[str, str]


class Bookie:
    """One bookie's service over its storage engine."""

    def __init__(
        self,
        config: BookieConfig,
        storage: StorageEngine,
        *,
        bookie_id: str,
        address: str = "",
        disk_probe: DiskProbe | None = None,
        metrics: BookieMetrics | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.storage = storage
        self.bookie_id = bookie_id
        self.address = address
        self.metrics = metrics or BookieMetrics(bookie_id)
        self._disk_probe = disk_probe or disk_probe_for(storage.directory)
        self._clock = clock
        self._disk = self._disk_probe()
        self.read_only = self._disk.used_fraction >= config.readonly_disk_usage
        self._lac_waiters: dict[int, list[tuple[int, asyncio.Future[None]]]] = {}
        self._state_listeners: list[Callable[[], None]] = []
        self._conflict_logged_at = -CONFLICT_LOG_INTERVAL_S
        self._conflicts_unlogged = 0
        self._monitor: asyncio.Task[None] | None = None
        self.metrics.set_state(self.read_only)
        self.metrics.set_disk(self._disk.total_bytes, self._disk.free_bytes)
        self.metrics.bind_storage(storage)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._monitor = asyncio.create_task(self._watch_disk(), name="bookie-disk-monitor")

    async def stop(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        for waiters in self._lac_waiters.values():
            for _, future in waiters:
                if not future.done():
                    future.set_result(None)
        self._lac_waiters.clear()

    def on_state_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the bookie turns read-only or writable."""
        self._state_listeners.append(listener)

    def status(self) -> BookieStatus:
        labels = {"zone": self.config.zone} if self.config.zone else {}
        return BookieStatus(
            self.bookie_id,
            self.address,
            self.read_only,
            self._disk.total_bytes,
            self._disk.free_bytes,
            len(self.storage.index.ledgers),
            labels,
        )

    # --- read-only mode --------------------------------------------------------------------------

    def check_disk(self) -> None:
        """Read disk usage and switch between writable and read-only (with hysteresis)."""
        self._disk = self._disk_probe()
        used = self._disk.used_fraction
        self.metrics.set_disk(self._disk.total_bytes, self._disk.free_bytes)
        if not self.read_only and used >= self.config.readonly_disk_usage:
            self._set_read_only(read_only=True, used=used)
        elif self.read_only and used < self.config.writable_disk_usage:
            self._set_read_only(read_only=False, used=used)

    def _set_read_only(self, *, read_only: bool, used: float) -> None:
        self.read_only = read_only
        self.metrics.set_state(read_only)
        log.warning(
            "bookie_read_only" if read_only else "bookie_writable",
            disk_used=round(used, 4),
            readonly_at=self.config.readonly_disk_usage,
            writable_below=self.config.writable_disk_usage,
        )
        for listener in self._state_listeners:
            try:
                listener()
            except Exception:
                log.exception("state_listener_failed")

    async def _watch_disk(self) -> None:
        while True:
            await self._clock.sleep(self.config.disk_check_interval_s)
            try:
                self.check_disk()
            except OSError as e:
                log.warning("disk_check_failed", error=str(e))

    # --- adds ------------------------------------------------------------------------------------

    def _refusal(self, add: AddEntry) -> MagnetarError | None:
        if add.ledger_id < 0 or add.entry_id < 0:
            return InvalidArgumentError(
                f"ledger and entry ids are >= 0, got ledger {add.ledger_id} entry {add.entry_id}"
            )
        if not NO_ENTRY <= add.last_add_confirmed < add.entry_id:
            return InvalidArgumentError(
                f"entry {add.entry_id} of ledger {add.ledger_id} carries last_add_confirmed"
                f" {add.last_add_confirmed}; it must be below the entry's own id, from"
                f" {NO_ENTRY} (nothing confirmed yet) to {add.entry_id - 1}",
                context={
                    "ledger": add.ledger_id,
                    "entry": add.entry_id,
                    "last_add_confirmed": add.last_add_confirmed,
                },
            )
        if self.read_only and not add.recovery:
            return BookieReadOnlyError(
                f"bookie {self.bookie_id} is read-only: its disk is over"
                f" {self.config.readonly_disk_usage:.0%} full",
                context={"bookie": self.bookie_id},
            )
        size = len(add.payload)
        if size > self.config.storage.max_entry_bytes:
            return EntryTooLargeError(
                f"entry {add.entry_id} of ledger {add.ledger_id} is {size:,} bytes; this bookie"
                f" accepts at most {self.config.storage.max_entry_bytes:,}",
                context={"size": size, "limit": self.config.storage.max_entry_bytes},
            )
        if (
            entry_checksum(add.ledger_id, add.entry_id, add.last_add_confirmed, add.payload)
            != add.crc32c
        ):
            return ChecksumMismatchError(
                f"entry {add.entry_id} of ledger {add.ledger_id}: its CRC32C does not match its"
                " bytes (damaged in transit, or computed over something else)",
                context={"ledger": add.ledger_id, "entry": add.entry_id},
            )
        ledger = self.storage.index.ledger(add.ledger_id)
        if ledger is not None and ledger.fenced and not add.recovery:
            return LedgerFencedError(
                f"ledger {add.ledger_id} is fenced on bookie {self.bookie_id}: another client is"
                " recovering it",
                context={"ledger": add.ledger_id},
            )
        return None

    async def add_entries(self, adds: Sequence[AddEntry]) -> list[AddFailure]:
        """Store what can be stored, as one group; returns the entries refused and why."""
        return await self.add_entries_nowait(adds)

    def add_entries_nowait(self, adds: Sequence[AddEntry]) -> asyncio.Future[list[AddFailure]]:
        """:meth:`add_entries` as a future, without a task per call (the data port calls this
        once per add request): the checks and the submission to the journal happen now, with no
        ``await`` in between (see fencing above), and the future completes once the group is
        durable. Cancelling it only gives up the answer: the entries are stored."""
        failures: list[AddFailure] = []
        accepted: list[EntryToStore] = []
        for add in adds:
            refusal = self._refusal(add)
            if refusal is not None:
                failures.append(AddFailure(add.ledger_id, add.entry_id, refusal))
                continue
            accepted.append(
                EntryToStore(
                    add.ledger_id,
                    add.entry_id,
                    add.last_add_confirmed,
                    add.crc32c,
                    add.payload,
                    add.recovery,
                )
            )
        result: asyncio.Future[list[AddFailure]] = asyncio.get_running_loop().create_future()
        if not accepted:
            self.metrics.add_refused(len(failures))
            result.set_result(failures)
            return result
        started = self._clock.monotonic()
        try:
            storing = self.storage.try_add_entries(accepted)
        except StorageError as e:
            result.set_result(self._not_stored(accepted, failures, e))
            return result
        if storing is None:
            # a retry or a conflict: stored copies are read and compared first (rare)
            storing = asyncio.ensure_future(self.storage.add_entries(accepted))
        storing.add_done_callback(
            functools.partial(self._stored, accepted, failures, started, result)
        )
        return result

    def _not_stored(
        self, accepted: list[EntryToStore], failures: list[AddFailure], error: StorageError
    ) -> list[AddFailure]:
        failures.extend(AddFailure(a.ledger_id, a.entry_id, error) for a in accepted)
        self.metrics.add_refused(len(failures))
        return failures

    def _stored(
        self,
        accepted: list[EntryToStore],
        failures: list[AddFailure],
        started: float,
        result: asyncio.Future[list[AddFailure]],
        storing: asyncio.Future[list[StorageError | None]],
    ) -> None:
        if storing.cancelled():
            if not result.done():
                result.cancel()
            return
        error = storing.exception()
        if error is not None:
            if isinstance(error, StorageError):
                failures = self._not_stored(accepted, failures, error)
                if not result.done():
                    result.set_result(failures)
            elif not result.done():
                result.set_exception(error)
            return
        stored: list[EntryToStore] = []
        for entry, outcome in zip(accepted, storing.result(), strict=True):
            if outcome is None:
                stored.append(entry)
            else:
                failures.append(AddFailure(entry.ledger_id, entry.entry_id, outcome))
                if isinstance(outcome, EntryExistsError):
                    self._conflict_refused(entry)
        if failures:
            self.metrics.add_refused(len(failures))
        self.metrics.added(
            len(stored), sum(len(a.payload) for a in stored), self._clock.monotonic() - started
        )
        self._wake_lac_waiters({a.ledger_id for a in stored})
        if not result.done():
            result.set_result(failures)

    def _conflict_refused(self, add: EntryToStore) -> None:
        """Count an add that tried to change a stored entry; log it, at most once a second."""
        self.metrics.add_conflicting(1)
        now = self._clock.monotonic()
        if now - self._conflict_logged_at < CONFLICT_LOG_INTERVAL_S:
            self._conflicts_unlogged += 1
            return
        log.warning(
            "add_conflicting_refused",
            ledger=add.ledger_id,
            entry=add.entry_id,
            recovery=add.recovery,
            unlogged_since_last=self._conflicts_unlogged,
        )
        self._conflict_logged_at = now
        self._conflicts_unlogged = 0

    # --- reads -----------------------------------------------------------------------------------

    async def read_entries(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        max_bytes: int = 0,
        *,
        entry_ids: Sequence[int] | None = None,
    ) -> ReadResult:
        """A range of entries, or with ``entry_ids`` those entries that this bookie holds."""
        if entry_ids:
            if len(entry_ids) > MAX_LISTED_ENTRIES:
                raise InvalidArgumentError(
                    f"a read may list at most {MAX_LISTED_ENTRIES:,} entries, got"
                    f" {len(entry_ids):,}"
                )
            if entry_ids[0] < 0 or any(b <= a for a, b in itertools.pairwise(entry_ids)):
                raise InvalidArgumentError("listed entry ids must be >= 0 and ascending")
        elif first_entry_id < 0 or last_entry_id < first_entry_id:
            raise InvalidArgumentError(
                f"a read needs 0 <= first_entry_id <= last_entry_id, got {first_entry_id}"
                f"..{last_entry_id}"
            )
        started = self._clock.monotonic()
        stored = await self.storage.read_entries(
            ledger_id, first_entry_id, last_entry_id, max_bytes, entry_ids=entry_ids or None
        )
        self.metrics.read(len(stored), self._clock.monotonic() - started)
        state = self.storage.ledger_state(ledger_id)
        entries = [ReadEntry(r.entry_id, r.last_add_confirmed, r.payload, r.crc32c) for r in stored]
        return ReadResult(
            ledger_id,
            entries,
            state.last_add_confirmed if state else NO_ENTRY,
            bool(state and state.fenced),
        )

    async def read_lac(
        self, ledger_id: int, previous_lac: int, timeout_ms: int = 0, include_entry: bool = False
    ) -> LacResult:
        """The ledger's LAC; with ``timeout_ms`` waits for it to pass ``previous_lac``."""
        if timeout_ms < 0 or timeout_ms > MAX_LAC_WAIT_MS:
            raise InvalidArgumentError(
                f"a LAC long-poll waits 0 to {MAX_LAC_WAIT_MS} ms, got {timeout_ms}"
            )
        state = self.storage.ledger_state(ledger_id)
        lac = state.last_add_confirmed if state else NO_ENTRY
        fenced = bool(state and state.fenced)
        if lac <= previous_lac and not fenced and timeout_ms > 0:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiters = self._lac_waiters.setdefault(ledger_id, [])
            waiters.append((previous_lac, future))
            try:
                await asyncio.wait_for(future, timeout_ms / 1000)
            except TimeoutError:
                pass
            finally:
                with contextlib.suppress(ValueError):
                    waiters.remove((previous_lac, future))
                if not waiters:
                    self._lac_waiters.pop(ledger_id, None)
            state = self.storage.ledger_state(ledger_id)
            lac = state.last_add_confirmed if state else NO_ENTRY
            fenced = bool(state and state.fenced)
        entry = None
        if include_entry and lac > NO_ENTRY:
            with contextlib.suppress(NoSuchEntryError, NoSuchLedgerError):
                read = await self.storage.read_entries(ledger_id, lac, lac)
                record = read[0]
                entry = ReadEntry(
                    record.entry_id, record.last_add_confirmed, record.payload, record.crc32c
                )
        return LacResult(ledger_id, lac, fenced, entry)

    def _wake_lac_waiters(self, ledger_ids: set[int]) -> None:
        for ledger_id in ledger_ids:
            waiters = self._lac_waiters.get(ledger_id)
            if not waiters:
                continue
            state = self.storage.ledger_state(ledger_id)
            if state is None:
                continue
            for previous, future in waiters:
                if (state.last_add_confirmed > previous or state.fenced) and not future.done():
                    future.set_result(None)

    # --- ledgers ---------------------------------------------------------------------------------

    async def fence(self, ledger_id: int) -> FenceResult:
        if ledger_id < 0:
            raise InvalidArgumentError(f"ledger ids are >= 0, got {ledger_id}")
        state = await self.storage.fence(ledger_id)
        log.info(
            "ledger_fenced",
            ledger=ledger_id,
            lac=state.last_add_confirmed,
            last_entry=state.last_entry_id,
        )
        self._wake_lac_waiters({ledger_id})
        return FenceResult(ledger_id, state.last_add_confirmed, state.last_entry_id)

    async def delete_ledger(self, ledger_id: int) -> None:
        if ledger_id < 0:
            raise InvalidArgumentError(f"ledger ids are >= 0, got {ledger_id}")
        existed = await self.storage.delete_ledger(ledger_id)
        log.info("ledger_deleted", ledger=ledger_id, existed=existed)
        for _, future in self._lac_waiters.pop(ledger_id, []):
            if not future.done():
                future.set_result(None)

    def list_ledgers(self, after_ledger_id: int, limit: int) -> tuple[list[int], bool]:
        ids = [i for i in self.storage.ledger_ids() if i > after_ledger_id]
        return ids[:limit], len(ids) > limit
