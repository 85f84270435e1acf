"""A prefix of the store kept in memory: every key under it, current through a watch.

:class:`PrefixView` reads the prefix once, then follows a watch from the revision of that read.
When the watch breaks (the history it needs was compacted, or the store was unreachable and came
back: aetcd's watches must be re-created after an etcd restart) it reads the prefix again and
watches from there, so the view never misses a change for long and never goes stale for good.
Listeners hear every change (``on_change``); :meth:`PrefixView.wait_change` waits for one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from magnetar.common.errors import MetadataError, WatchCompactedError
from metadata.api import EventType, MetadataStore, Watch

__all__ = ["PrefixView"]

log = structlog.get_logger("magnetar.metadata.view")

RETRY_S = 0.5


class PrefixView:
    """Every ``key -> value`` under ``prefix``, kept current. Start with :meth:`start`."""

    def __init__(self, store: MetadataStore, prefix: str, *, name: str) -> None:
        self.store = store
        self.prefix = prefix
        self.name = name
        self.values: dict[str, bytes] = {}
        """Key (without the prefix) -> value."""
        self.revision = 0
        """The store revision the view is known to be current at."""
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []

    async def start(self) -> None:
        """Read the prefix and start following it; raises if the store cannot be read now."""
        await self._load()
        watch = await self.store.watch(self.prefix, start_revision=self.revision + 1)
        self._task = asyncio.create_task(self._follow(watch), name=f"view:{self.name}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (on the event loop; it must not block) after every change."""
        self._listeners.append(listener)

    async def wait_change(self, timeout_s: float) -> None:
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

    async def refresh(self) -> None:
        """Read the prefix again now (after a write of this process, so that it is seen before
        the watch reports it)."""
        await self._load()
        self._notify()

    async def _load(self) -> None:
        listing = await self.store.list(self.prefix)
        start = len(self.prefix)
        self.values = {record.key[start:]: record.value for record in listing.records}
        self.revision = max(self.revision, listing.revision)

    async def _follow(self, watch: Watch) -> None:
        current = watch
        start = len(self.prefix)
        while True:
            try:
                async with current:
                    async for event in current:
                        key = event.key[start:]
                        if event.type == EventType.PUT:
                            self.values[key] = event.value
                        else:
                            self.values.pop(key, None)
                        self.revision = max(self.revision, event.revision)
                        self._notify()
            except WatchCompactedError:
                pass
            except MetadataError as e:
                if self.store.closed:
                    return
                log.info("view_watch_retry", view=self.name, error=str(e))
                await asyncio.sleep(RETRY_S)
            else:
                return  # the watch was closed: the view is closing
            while True:
                try:
                    await self._load()
                    current = await self.store.watch(self.prefix, start_revision=self.revision + 1)
                    self._notify()
                    break
                except MetadataError:
                    if self.store.closed:
                        return
                    await asyncio.sleep(RETRY_S)

    def _notify(self) -> None:
        self._changed.set()
        for listener in self._listeners:
            listener()
