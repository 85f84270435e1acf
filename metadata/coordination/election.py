"""Leader election: many candidates, one leader, held by a lock bound to the leader's session.

A candidate campaigns by trying to take the lock at the election's key; if another session holds
it, the candidate watches that key from the revision it saw and tries again when it is deleted
(its holder resigned, or its session's lease expired). Leadership ends when the holder resigns,
closes its session, or loses it; :attr:`LeaderElection.lost` tells the holder.
"""

from __future__ import annotations

import asyncio

import structlog

from magnetar.common.errors import LockBusyError
from metadata.api import EventType, MetadataStore, Record, Watch
from metadata.coordination.lock import LockManager, ResourceLock
from metadata.coordination.session import Session
from metadata.keys import check_key

log = structlog.get_logger("magnetar.metadata.election")


class LeaderElection:
    """One candidate in the election at ``path``."""

    def __init__(self, store: MetadataStore, session: Session, path: str, value: bytes) -> None:
        self.store = store
        self.session = session
        self.path = check_key(path)
        self.value = value
        parent = path.rsplit("/", 1)[0] + "/"
        self._locks = LockManager(store, session, parent)
        self._lock: ResourceLock | None = None

    @property
    def is_leader(self) -> bool:
        return self._lock is not None and self._lock.held

    @property
    def lost(self) -> asyncio.Event:
        """Set when this candidate's leadership ends without it resigning."""
        assert self._lock is not None, "campaign() first"
        return self._lock.lost

    async def campaign(self) -> None:
        """Return once this candidate leads; raises SessionLostError if the session dies."""
        while True:
            self.session.check()
            try:
                self._lock = await self._locks.acquire(self.path, self.value)
            except LockBusyError:
                pass
            else:
                log.info("leadership_acquired", path=self.path, lease=self.session.lease_id)
                return
            holder = await self.store.get(self.path)
            if holder is None:
                continue
            await self._wait_for_vacancy(holder)

    async def _wait_for_vacancy(self, holder: Record) -> None:
        async with await self.store.watch(self.path, start_revision=holder.version + 1) as watch:
            deleted = asyncio.ensure_future(self._next_delete(watch))
            lost = asyncio.ensure_future(self.session.lost.wait())
            try:
                await asyncio.wait({deleted, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                deleted.cancel()
                lost.cancel()
            self.session.check()
            if deleted.done() and not deleted.cancelled():
                deleted.result()  # re-raise a watch failure

    async def _next_delete(self, watch: Watch) -> None:
        async for event in watch:
            # the watch is by prefix; other keys that merely start with our path do not count
            if event.key == self.path and event.type == EventType.DELETE:
                return

    async def leader(self) -> Record | None:
        """The current leader's record (its value names it), or None during a vacancy."""
        return await self.store.get(self.path)

    async def resign(self) -> None:
        """Step down (the next candidate takes over at once)."""
        if self._lock is not None:
            await self._lock.release()
            log.info("leadership_resigned", path=self.path)

    async def close(self) -> None:
        await self.resign()
        await self._locks.close(release=True)
