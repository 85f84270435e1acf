"""The in-process metadata store core shared by the memory and embedded backends.

One writer task applies every change in order. It takes the waiting requests as a batch and
evaluates each against the committed state plus the changes earlier in the batch (an overlay).
It hands the batch's log records to the journal, which for the embedded store is one write and
one fdatasync. Only then does it commit the overlay, record the change events and wake watchers.
Readers and watchers therefore never see a change that is not yet durable. Concurrent writers share
an fdatasync (group commit) and a compare-and-swap is decided against everything committed
before it.

Leases live here too: a lease expires when its last keepalive is older than its TTL (by the
injected clock); expiry is a revoke, which deletes the lease's keys in one revision.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    LeaseNotFoundError,
    MetadataError,
    MetadataStoreClosedError,
    WatchCompactedError,
)
from metadata.api import (
    ABSENT,
    NO_LEASE,
    Compare,
    EventType,
    Lease,
    Listing,
    MetadataStore,
    PutOp,
    Record,
    TxnOp,
    TxnResult,
    Watch,
    WatchEvent,
    compare_failed,
)
from metadata.config import MetadataStoreConfig

# --- log operations: what the journal persists, and what replay applies ------------------------


@dataclass(frozen=True, slots=True)
class LogPut:
    key: str
    value: bytes
    lease_id: int


@dataclass(frozen=True, slots=True)
class LogDelete:
    key: str


@dataclass(frozen=True, slots=True)
class LogLeaseGrant:
    lease_id: int
    ttl_s: int


@dataclass(frozen=True, slots=True)
class LogLeaseRevoke:
    lease_id: int


LogOp = LogPut | LogDelete | LogLeaseGrant | LogLeaseRevoke


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One committed request: its ops, and the store revision after it."""

    revision: int
    ops: tuple[LogOp, ...]


class Journal(Protocol):
    """Where committed records go before they become visible (the embedded store's log)."""

    async def append(self, records: Sequence[LogRecord]) -> None:
        """Make ``records`` durable; return only once they are."""

    async def after_commit(self, core: LocalCore) -> None:
        """Called by the writer between batches (snapshots happen here)."""


# --- state ----------------------------------------------------------------------------------


@dataclass(slots=True)
class StoredKey:
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int

    def record(self, key: str) -> Record:
        return Record(key, self.value, self.mod_revision, self.create_revision, self.lease_id)


@dataclass(slots=True)
class StoredLease:
    lease_id: int
    ttl_s: int
    deadline: float
    keys: set[str] = field(default_factory=set)


# --- requests the writer serializes -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _TxnRequest:
    compares: Sequence[Compare]
    ops: Sequence[TxnOp]


@dataclass(frozen=True, slots=True)
class _GrantRequest:
    ttl_s: int


@dataclass(frozen=True, slots=True)
class _RevokeRequest:
    lease_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _BarrierRequest:
    """Run ``action`` in the writer once everything submitted before it is committed."""

    action: Callable[[LocalCore], Awaitable[None]]


_Request = _TxnRequest | _GrantRequest | _RevokeRequest | _BarrierRequest


class _Overlay:
    """The committed state as changed by the requests already prepared in this batch."""

    def __init__(self, core: LocalCore) -> None:
        self.core = core
        self.kvs: dict[str, StoredKey | None] = {}
        self.leases: dict[int, StoredLease | None] = {}
        self.revision = core.revision
        self.last_lease_id = core.last_lease_id

    def kv(self, key: str) -> StoredKey | None:
        if key in self.kvs:
            return self.kvs[key]
        return self.core.kvs.get(key)

    def lease(self, lease_id: int) -> StoredLease | None:
        if lease_id in self.leases:
            return self.leases[lease_id]
        return self.core.leases.get(lease_id)

    def lease_keys(self, lease_id: int) -> list[str]:
        committed = self.core.leases.get(lease_id)
        candidates = set(committed.keys) if committed else set()
        candidates.update(k for k, kv in self.kvs.items() if kv and kv.lease_id == lease_id)
        return sorted(k for k in candidates if (kv := self.kv(k)) and kv.lease_id == lease_id)


class LocalCore:
    """Keys, leases, revision and change history of an in-process store."""

    def __init__(
        self,
        config: MetadataStoreConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        journal: Journal | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.journal = journal
        self.kvs: dict[str, StoredKey] = {}
        self.sorted_keys: list[str] = []
        self.leases: dict[int, StoredLease] = {}
        self.revision = 0
        self.last_lease_id = 0
        # change history for watches: parallel lists, oldest first
        self._hist_revisions: list[int] = []
        self._hist_events: list[tuple[WatchEvent, ...]] = []
        self._hist_event_count = 0
        self.history_floor = 1
        """The oldest revision a watch may start from."""
        self._changed: asyncio.Future[None] | None = None
        # None is the stop sentinel: the writer finishes what is queued before it, then ends
        self._queue: asyncio.Queue[tuple[_Request, asyncio.Future[object]] | None] = asyncio.Queue(
            maxsize=10_000
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._lease_wakeup = asyncio.Event()
        self.closed = False
        self.failure: BaseException | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._writer(), name="metadata-writer"))
        self._tasks.append(asyncio.create_task(self._expire_leases(), name="metadata-leases"))

    async def stop(self) -> None:
        """Refuse new requests, let the writer finish the ones already queued, then stop."""
        self.closed = True
        writer = self._tasks[0] if self._tasks else None
        for task in self._tasks[1:]:
            task.cancel()
        for task in self._tasks[1:]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if writer is not None and not writer.done():
            await self._queue.put(None)
            with contextlib.suppress(asyncio.CancelledError, MetadataError):
                await writer
        self._fail_queued(MetadataStoreClosedError("the metadata store was closed"))
        self._notify()

    def _fail_queued(self, error: MetadataError) -> None:
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None and not item[1].done():
                item[1].set_exception(error)

    # --- reads ----------------------------------------------------------------------------

    def get(self, key: str) -> Record | None:
        kv = self.kvs.get(key)
        return kv.record(key) if kv else None

    def list_prefix(self, prefix: str) -> Listing:
        start = bisect.bisect_left(self.sorted_keys, prefix)
        records = []
        for key in self.sorted_keys[start:]:
            if not key.startswith(prefix):
                break
            records.append(self.kvs[key].record(key))
        return Listing(tuple(records), self.revision)

    # --- writes (through the writer task) ------------------------------------------------

    async def submit(self, request: _Request) -> object:
        if self.failure is not None:
            raise MetadataError(f"the metadata store failed: {self.failure}") from self.failure
        if self.closed:
            raise MetadataStoreClosedError("the metadata store is closed")
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        await self._queue.put((request, fut))
        return await fut

    async def txn(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult:
        result = await self.submit(_TxnRequest(compares, ops))
        assert isinstance(result, TxnResult)
        return result

    async def grant_lease(self, ttl_s: int) -> Lease:
        result = await self.submit(_GrantRequest(ttl_s))
        assert isinstance(result, Lease)
        return result

    async def revoke_leases(self, lease_ids: Iterable[int]) -> None:
        await self.submit(_RevokeRequest(tuple(lease_ids)))

    async def submit_barrier(self, action: Callable[[LocalCore], Awaitable[None]]) -> None:
        await self.submit(_BarrierRequest(action))

    def keepalive(self, lease_id: int) -> int:
        lease = self.leases.get(lease_id)
        now = self.clock.monotonic()
        if lease is None or lease.deadline <= now:
            raise LeaseNotFoundError(
                f"lease {lease_id} is not known (expired or revoked)", context={"lease": lease_id}
            )
        lease.deadline = now + lease.ttl_s
        return lease.ttl_s

    async def _writer(self) -> None:
        try:
            stopping = False
            while not stopping:
                first = await self._queue.get()
                if first is None:
                    return
                batch = [first]
                while not self._queue.empty() and len(batch) < 1024:
                    item = self._queue.get_nowait()
                    if item is None:
                        stopping = True
                        break
                    batch.append(item)
                # a barrier runs alone, after the requests queued before it are committed
                pending: list[tuple[_Request, asyncio.Future[object]]] = []
                for request, fut in batch:
                    if isinstance(request, _BarrierRequest):
                        if pending:
                            await self._process(pending)
                            pending = []
                        await self._run_barrier(request, fut)
                    else:
                        pending.append((request, fut))
                if pending:
                    await self._process(pending)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            # A journal that cannot write leaves nothing safe to do: fail every caller from now on.
            self.failure = e
            self._fail_queued(MetadataError(f"the metadata store failed: {e}"))
            raise

    async def _run_barrier(self, request: _BarrierRequest, fut: asyncio.Future[object]) -> None:
        try:
            await request.action(self)
        except MetadataError as e:
            if not fut.done():
                fut.set_exception(e)
            return
        if not fut.done():
            fut.set_result(None)

    async def _process(self, batch: list[tuple[_Request, asyncio.Future[object]]]) -> None:
        overlay = _Overlay(self)
        records: list[LogRecord] = []
        changes: list[tuple[int, tuple[WatchEvent, ...]]] = []
        outcomes: list[tuple[asyncio.Future[object], object, bool]] = []
        for request, fut in batch:
            try:
                result, record, events = self._prepare(overlay, request)
            except MetadataError as e:
                outcomes.append((fut, e, False))
                continue
            if record is not None:
                records.append(record)
            if events:
                changes.append((overlay.revision, events))
            outcomes.append((fut, result, True))
        if records and self.journal is not None:
            try:
                await self.journal.append(records)
            except BaseException as e:
                for fut, _, _ in outcomes:
                    if not fut.done():
                        fut.set_exception(MetadataError(f"metadata journal write failed: {e}"))
                raise
        self._commit(overlay, changes)
        for fut, value, ok in outcomes:
            if fut.done():  # the caller was cancelled; the change stands regardless
                continue
            if ok:
                fut.set_result(value)
            else:
                assert isinstance(value, BaseException)
                fut.set_exception(value)
        if self.journal is not None:
            await self.journal.after_commit(self)

    def _prepare(
        self, ov: _Overlay, request: _Request
    ) -> tuple[object, LogRecord | None, tuple[WatchEvent, ...]]:
        if isinstance(request, _GrantRequest):
            ov.last_lease_id += 1
            lease = StoredLease(ov.last_lease_id, request.ttl_s, 0.0)
            ov.leases[lease.lease_id] = lease
            op = LogLeaseGrant(lease.lease_id, request.ttl_s)
            return Lease(lease.lease_id, request.ttl_s), LogRecord(ov.revision, (op,)), ()
        assert not isinstance(request, _BarrierRequest), "barriers run alone"
        if isinstance(request, _RevokeRequest):
            ops: list[LogOp] = []
            deletes: list[str] = []
            for lease_id in request.lease_ids:
                if ov.lease(lease_id) is None:
                    continue
                for key in ov.lease_keys(lease_id):
                    deletes.append(key)
                    ops.append(LogDelete(key))
                ov.leases[lease_id] = None
                ops.append(LogLeaseRevoke(lease_id))
            if not ops:
                return None, None, ()
            events = self._apply_deletes(ov, deletes)
            return None, LogRecord(ov.revision, tuple(ops)), events
        return self._prepare_txn(ov, request)

    def _prepare_txn(
        self, ov: _Overlay, request: _TxnRequest
    ) -> tuple[TxnResult, LogRecord | None, tuple[WatchEvent, ...]]:
        for cmp in request.compares:
            kv = ov.kv(cmp.key)
            actual = kv.mod_revision if kv else ABSENT
            if actual != cmp.version:
                raise compare_failed(cmp.key, cmp.version, actual)
        for op in request.ops:
            if isinstance(op, PutOp) and op.lease_id != NO_LEASE and ov.lease(op.lease_id) is None:
                raise LeaseNotFoundError(
                    f"cannot bind metadata key {op.key!r} to lease {op.lease_id}: the lease is"
                    " not known (expired or revoked)",
                    context={"key": op.key, "lease": op.lease_id},
                )
        changing = [op for op in request.ops if isinstance(op, PutOp) or ov.kv(op.key) is not None]
        if not changing:
            return TxnResult(ov.revision, {}, frozenset()), None, ()
        revision = ov.revision + 1
        events: list[WatchEvent] = []
        log_ops: list[LogOp] = []
        versions: dict[str, int] = {}
        deleted: set[str] = set()
        for op in changing:
            old = ov.kv(op.key)
            if isinstance(op, PutOp):
                value = bytes(op.value)
                ov.kvs[op.key] = StoredKey(
                    value,
                    old.create_revision if old else revision,
                    revision,
                    old.version + 1 if old else 1,
                    op.lease_id,
                )
                versions[op.key] = revision
                events.append(WatchEvent(EventType.PUT, op.key, value, revision, op.lease_id))
                log_ops.append(LogPut(op.key, value, op.lease_id))
            else:
                ov.kvs[op.key] = None
                deleted.add(op.key)
                events.append(WatchEvent(EventType.DELETE, op.key, b"", revision))
                log_ops.append(LogDelete(op.key))
        ov.revision = revision
        result = TxnResult(revision, versions, frozenset(deleted))
        return result, LogRecord(revision, tuple(log_ops)), tuple(events)

    @staticmethod
    def _apply_deletes(ov: _Overlay, keys: list[str]) -> tuple[WatchEvent, ...]:
        if not keys:
            return ()
        ov.revision += 1
        for key in keys:
            ov.kvs[key] = None
        return tuple(WatchEvent(EventType.DELETE, k, b"", ov.revision) for k in keys)

    def _commit(self, ov: _Overlay, changes: list[tuple[int, tuple[WatchEvent, ...]]]) -> None:
        now = self.clock.monotonic()
        for lease_id, new_lease in ov.leases.items():
            if new_lease is None:
                self.leases.pop(lease_id, None)
            else:
                new_lease.deadline = now + new_lease.ttl_s
                self.leases[lease_id] = new_lease
        for key, kv in ov.kvs.items():
            self._set_key(key, kv)
        self.revision = ov.revision
        self.last_lease_id = ov.last_lease_id
        for revision, events in changes:
            self._record_history(revision, events)
        if ov.leases:
            self._lease_wakeup.set()
        if changes:
            self._notify()

    def _set_key(self, key: str, kv: StoredKey | None) -> None:
        old = self.kvs.get(key)
        if old is not None and old.lease_id != NO_LEASE:
            lease = self.leases.get(old.lease_id)
            if lease is not None:
                lease.keys.discard(key)
        if kv is None:
            if old is not None:
                del self.kvs[key]
                index = bisect.bisect_left(self.sorted_keys, key)
                del self.sorted_keys[index]
            return
        if old is None:
            bisect.insort(self.sorted_keys, key)
        self.kvs[key] = kv
        if kv.lease_id != NO_LEASE:
            lease = self.leases.get(kv.lease_id)
            if lease is not None:
                lease.keys.add(key)

    # --- replay (embedded store recovery) ------------------------------------------------

    def replay(self, record: LogRecord) -> None:
        """Apply a record read back from the journal, as the writer once committed it."""
        events: list[WatchEvent] = []
        changed_revision = record.revision
        for op in record.ops:
            if isinstance(op, LogPut):
                old = self.kvs.get(op.key)
                kv = StoredKey(
                    op.value,
                    old.create_revision if old else changed_revision,
                    changed_revision,
                    old.version + 1 if old else 1,
                    op.lease_id,
                )
                self._set_key(op.key, kv)
                events.append(
                    WatchEvent(EventType.PUT, op.key, op.value, changed_revision, op.lease_id)
                )
            elif isinstance(op, LogDelete):
                if op.key in self.kvs:
                    self._set_key(op.key, None)
                    events.append(WatchEvent(EventType.DELETE, op.key, b"", changed_revision))
            elif isinstance(op, LogLeaseGrant):
                self.leases[op.lease_id] = StoredLease(
                    op.lease_id, op.ttl_s, self.clock.monotonic() + op.ttl_s
                )
                self.last_lease_id = max(self.last_lease_id, op.lease_id)
            else:
                self.leases.pop(op.lease_id, None)
        self.revision = max(self.revision, record.revision)
        if events:
            self._record_history(record.revision, tuple(events))

    def load(
        self,
        kvs: Iterable[tuple[str, StoredKey]],
        leases: Iterable[tuple[int, int]],
        revision: int,
        last_lease_id: int,
    ) -> None:
        """Install a snapshot: the state as of ``revision``; history starts after it."""
        now = self.clock.monotonic()
        self.leases = {lid: StoredLease(lid, ttl, now + ttl) for lid, ttl in leases}
        self.kvs = {}
        for key, kv in kvs:
            self.kvs[key] = kv
            if kv.lease_id and kv.lease_id in self.leases:
                self.leases[kv.lease_id].keys.add(key)
        self.sorted_keys = sorted(self.kvs)
        self.revision = revision
        self.last_lease_id = last_lease_id
        self.history_floor = revision + 1

    # --- history and watches ----------------------------------------------------------------

    def _record_history(self, revision: int, events: tuple[WatchEvent, ...]) -> None:
        self._hist_revisions.append(revision)
        self._hist_events.append(events)
        self._hist_event_count += len(events)
        limit = self.config.watch_history_events
        if self._hist_event_count > limit * 2:
            # trim in bulk (amortised) down to the configured number of events
            drop = 0
            while self._hist_event_count > limit:
                self._hist_event_count -= len(self._hist_events[drop])
                drop += 1
            del self._hist_revisions[:drop]
            del self._hist_events[:drop]
            self.history_floor = self._hist_revisions[0] if self._hist_revisions else revision + 1

    def events_since(self, revision: int, prefix: str) -> list[WatchEvent]:
        """Every recorded event under ``prefix`` with revision >= ``revision``."""
        start = bisect.bisect_left(self._hist_revisions, revision)
        return [
            e for events in self._hist_events[start:] for e in events if e.key.startswith(prefix)
        ]

    def changed(self) -> asyncio.Future[None]:
        """A future completed at the next commit that changes keys (or at close)."""
        if self._changed is None or self._changed.done():
            self._changed = asyncio.get_running_loop().create_future()
        return self._changed

    def _notify(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    # --- lease expiry -----------------------------------------------------------------------

    async def _expire_leases(self) -> None:
        while True:
            self._lease_wakeup.clear()
            now = self.clock.monotonic()
            expired = [lid for lid, lease in self.leases.items() if lease.deadline <= now]
            if expired:
                try:
                    await self.revoke_leases(expired)
                except MetadataError:
                    return  # the store failed or closed; callers see that on their next request
                continue
            next_deadline = min((lease.deadline for lease in self.leases.values()), default=None)
            sleep_s = 1.0 if next_deadline is None else max(0.0, next_deadline - now) + 0.001
            sleeper = asyncio.ensure_future(self.clock.sleep(min(sleep_s, 1.0)))
            waker = asyncio.ensure_future(self._lease_wakeup.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waker.cancel()


class LocalWatch(Watch):
    """A watch over a :class:`LocalCore`'s history: pull-based, so a slow reader never blocks
    writers; if it falls behind the kept history it fails with WatchCompactedError."""

    def __init__(self, core: LocalCore, prefix: str, start_revision: int) -> None:
        self._core = core
        self.prefix = prefix
        self.start_revision = start_revision
        self._next = start_revision
        self._buffer: deque[WatchEvent] = deque()
        self._closed = False
        self._close_requested: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def __anext__(self) -> WatchEvent:
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._buffer:
                return self._buffer.popleft()
            core = self._core
            if core.closed:
                raise MetadataStoreClosedError("the metadata store was closed under this watch")
            if self._next < core.history_floor:
                raise WatchCompactedError(
                    f"watch on {self.prefix!r} needs revision {self._next}, but the store keeps"
                    f" history only from revision {core.history_floor}; list again and watch"
                    " from the listing's revision",
                    context={"revision": self._next, "oldest_kept": core.history_floor},
                )
            if core.revision >= self._next:
                self._buffer.extend(core.events_since(self._next, self.prefix))
                self._next = core.revision + 1
                continue
            changed = core.changed()
            await asyncio.wait(
                {changed, self._close_requested}, return_when=asyncio.FIRST_COMPLETED
            )

    async def close(self) -> None:
        self._closed = True
        if not self._close_requested.done():
            self._close_requested.set_result(None)


class LocalMetadataStore(MetadataStore):
    """A :class:`MetadataStore` over a :class:`LocalCore` (memory and embedded backends)."""

    def __init__(self, config: MetadataStoreConfig, core: LocalCore) -> None:
        super().__init__(config)
        self._core = core

    @property
    def core(self) -> LocalCore:
        return self._core

    async def _do_get(self, key: str) -> Record | None:
        return self._core.get(key)

    async def _do_list(self, prefix: str) -> Listing:
        return self._core.list_prefix(prefix)

    async def _do_txn(self, compares: Sequence[Compare], ops: Sequence[TxnOp]) -> TxnResult:
        return await self._core.txn(compares, ops)

    async def _do_watch(self, prefix: str, start_revision: int | None) -> Watch:
        start = self._core.revision + 1 if start_revision is None else start_revision
        if start < self._core.history_floor:
            raise WatchCompactedError(
                f"cannot watch {prefix!r} from revision {start}: the store keeps history only"
                f" from revision {self._core.history_floor}; list again and watch from the"
                " listing's revision",
                context={"revision": start, "oldest_kept": self._core.history_floor},
            )
        return LocalWatch(self._core, prefix, start)

    async def _do_grant_lease(self, ttl_s: int) -> Lease:
        return await self._core.grant_lease(ttl_s)

    async def _do_keepalive(self, lease_id: int) -> int:
        return self._core.keepalive(lease_id)

    async def _do_revoke_lease(self, lease_id: int) -> None:
        await self._core.revoke_leases([lease_id])

    async def _do_close(self) -> None:
        await self._core.stop()
