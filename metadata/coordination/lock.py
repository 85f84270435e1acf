"""Resource locks: a key bound to a session's lease, held by exactly one session at a time.

This is the basis of partition ownership. A lock is held while its key exists *and* carries the
holder's lease; that is the whole truth, checked the same way at acquire time and by the
manager's watch. One :class:`LockManager` watches its whole prefix once (a broker may hold
thousands of locks), and marks a lock lost when its key is deleted, taken over by another
lease, or when the session is lost. Holders react through :attr:`ResourceLock.lost`.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from magnetar.common.errors import (
    BadVersionError,
    KeyExistsError,
    LockBusyError,
    MetadataError,
    NoSuchKeyError,
    SessionLostError,
    WatchCompactedError,
)
from metadata.api import EventType, MetadataStore, Watch, WatchEvent
from metadata.coordination.session import Session
from metadata.keys import check_key, check_prefix

log = structlog.get_logger("magnetar.metadata.lock")


class ResourceLock:
    """A held lock. ``lost`` is set when it is no longer held (never cleared)."""

    def __init__(self, manager: LockManager, path: str, value: bytes, version: int) -> None:
        self._manager = manager
        self.path = path
        self.value = value
        self.version = version
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self._released = False

    @property
    def held(self) -> bool:
        return not self.lost.is_set() and not self._released

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set() or self._released:
            return
        self.lost_reason = reason
        self.lost.set()
        self._manager._forget(self)
        log.warning("lock_lost", path=self.path, reason=reason)

    async def update(self, value: bytes) -> None:
        """Replace the lock's value (compare-and-swap on the version this holder wrote)."""
        self._check_held()
        try:
            self.version = await self._manager.store.put(
                self.path,
                value,
                expected_version=self.version,
                lease_id=self._manager.session.lease_id,
            )
        except (BadVersionError, NoSuchKeyError):
            self._mark_lost("the lock's key was changed or deleted by someone else")
            raise
        self.value = value

    async def release(self) -> None:
        """Give the lock up (deletes the key if this holder still has it)."""
        if self._released:
            return
        was_held = self.held
        self._released = True
        self._manager._forget(self)
        if was_held:
            with contextlib.suppress(BadVersionError, NoSuchKeyError):
                await self._manager.store.delete(self.path, expected_version=self.version)
            log.info("lock_released", path=self.path)

    def _check_held(self) -> None:
        if not self.held:
            raise LockBusyError(
                f"lock {self.path!r} is not held any more: {self.lost_reason or 'released'}",
                context={"path": self.path},
            )


class LockManager:
    """Acquires locks under one prefix for one session and watches them all."""

    def __init__(self, store: MetadataStore, session: Session, prefix: str) -> None:
        self.store = store
        self.session = session
        self.prefix = check_prefix(prefix if prefix.endswith("/") else prefix + "/")
        self._locks: dict[str, ResourceLock] = {}
        self._watch_task: asyncio.Task[None] | None = None
        self._start_lock = asyncio.Lock()
        self._closed = False
        session.on_lost(self._on_session_lost)

    async def start(self) -> LockManager:
        """Begin watching the prefix (acquire does this on first use)."""
        async with self._start_lock:
            if self._watch_task is None:
                revision = await self._resync()
                watch = await self.store.watch(self.prefix, start_revision=revision + 1)
                self._watch_task = asyncio.create_task(
                    self._watch_loop(watch), name=f"lock-watch:{self.prefix}"
                )
        return self

    @property
    def locks(self) -> dict[str, ResourceLock]:
        return dict(self._locks)

    async def acquire(self, path: str, value: bytes) -> ResourceLock:
        """Take the lock at ``path`` now, or raise :class:`LockBusyError` naming the holder."""
        check_key(path)
        if not path.startswith(self.prefix):
            raise LockBusyError(f"lock {path!r} is outside this manager's prefix {self.prefix!r}")
        self.session.check()
        await self.start()
        existing = self._locks.get(path)
        if existing is not None and existing.held:
            return existing
        lease_id = self.session.lease_id
        for _attempt in range(5):
            try:
                version = await self.store.create(path, value, lease_id=lease_id)
            except KeyExistsError:
                record = await self.store.get(path)
                if record is None:
                    continue  # released in between: try again
                if record.lease_id != lease_id:
                    raise LockBusyError(
                        f"lock {path!r} is held by another session (lease {record.lease_id});"
                        f" holder says: {record.value[:200]!r}",
                        context={"path": path, "holder_lease": record.lease_id},
                    ) from None
                # our own session already holds it (an earlier holder object was dropped)
                try:
                    version = await self.store.put(
                        path, value, expected_version=record.version, lease_id=lease_id
                    )
                except (BadVersionError, NoSuchKeyError):
                    continue
            lock = ResourceLock(self, path, value, version)
            self._locks[path] = lock
            # From here the watch keeps the lock honest; one read covers what it may have seen
            # before the lock was registered.
            record = await self.store.get(path)
            if record is None or record.lease_id != lease_id:
                lock._mark_lost("the lock's key changed right after it was taken")
                continue
            if not self.session.alive:
                lock._mark_lost("the session was lost")
                self.session.check()
            log.info("lock_acquired", path=path, version=version)
            return lock
        raise LockBusyError(f"lock {path!r} kept changing hands; try again", context={"path": path})

    def _forget(self, lock: ResourceLock) -> None:
        if self._locks.get(lock.path) is lock:
            del self._locks[lock.path]

    def _on_session_lost(self, error: SessionLostError) -> None:
        for lock in list(self._locks.values()):
            lock._mark_lost(str(error))

    def _apply(self, event: WatchEvent) -> None:
        lock = self._locks.get(event.key)
        if lock is None:
            return
        if event.type == EventType.DELETE:
            lock._mark_lost("the lock's key was deleted")
        elif event.lease_id != self.session.lease_id:
            lock._mark_lost(f"the lock was taken by another session (lease {event.lease_id})")
        else:
            lock.version = max(lock.version, event.revision)

    async def _resync(self) -> int:
        """Check every held lock against a fresh listing; returns the listing's revision."""
        listing = await self.store.list(self.prefix)
        present = {r.key: r for r in listing.records}
        for path, lock in list(self._locks.items()):
            record = present.get(path)
            if record is None:
                lock._mark_lost("the lock's key was deleted")
            elif record.lease_id != self.session.lease_id:
                lock._mark_lost(f"the lock was taken by another session (lease {record.lease_id})")
        return listing.revision

    async def _watch_loop(self, first_watch: Watch) -> None:
        watch: Watch | None = first_watch
        while not self._closed:
            try:
                if watch is None:
                    # start over from a fresh listing
                    revision = await self._resync()
                    watch = await self.store.watch(self.prefix, start_revision=revision + 1)
                async with watch:
                    async for event in watch:
                        self._apply(event)
            except WatchCompactedError:
                pass
            except MetadataError as e:
                if self.store.closed:
                    return
                log.info("lock_watch_retry", prefix=self.prefix, error=str(e))
                await asyncio.sleep(0.5)
            else:
                return  # the watch was closed: the manager is closing
            watch = None

    async def close(self, *, release: bool = True) -> None:
        self._closed = True
        if release:
            for lock in list(self._locks.values()):
                with contextlib.suppress(MetadataError):
                    await lock.release()
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
