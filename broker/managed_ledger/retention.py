"""Retention: trimming the oldest ledgers every durable cursor passed and retention lets go,
and the periodic task that trims and rolls an idle ledger."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import structlog

from broker.managed_ledger.cache import EntryCache
from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.ledger_list import LedgerRecord
from broker.managed_ledger.ledger_ops import delete_quietly
from broker.managed_ledger.metadata_writes import MetadataWrites
from broker.managed_ledger.ports import LedgerClientApi
from broker.managed_ledger.state import Lifecycle, LogState
from broker.managed_ledger.types import Position
from magnetar.common.clock import Clock
from magnetar.common.errors import MagnetarError

log = structlog.get_logger("magnetar.managed_ledger")


class Retention:
    """Trims one managed ledger, on request and every ``trim_interval_ms``."""

    def __init__(
        self,
        name: str,
        *,
        config: ManagedLedgerConfig,
        life: Lifecycle,
        log_state: LogState,
        metadata: MetadataWrites,
        client: LedgerClientApi,
        cache: EntryCache,
        clock: Clock,
        marks: Callable[[], Iterable[Position]],
        deleted: Callable[[int], None],
        periodically: Callable[[], None],
    ) -> None:
        """``marks``: the mark-delete of every durable cursor; ``deleted``: a ledger was
        trimmed; ``periodically``: called every ``trim_interval_ms`` before trimming."""
        self._name = name
        self._config = config
        self._life = life
        self._log_state = log_state
        self._metadata = metadata
        self._client = client
        self._cache = cache
        self._clock = clock
        self._marks = marks
        self._deleted = deleted
        self._periodically = periodically
        self._lock = asyncio.Lock()
        self._trimmer: asyncio.Task[None] | None = None
        self._trim_again = False
        self._periodic: asyncio.Task[None] | None = None
        self._log = log.bind(managed_ledger=name)

    def detach(self) -> None:
        """Let go of the callbacks: they refer back to the managed ledger, a reference cycle
        that only the cyclic collector would free (the managed ledger is closed, and trims
        no more)."""
        self._marks = _no_marks
        self._deleted = _forget_nothing
        self._periodically = _do_nothing

    def _forget_task(self, task: asyncio.Task[Any]) -> None:
        # see Writer._forget_task: an ended task is let go of
        if self._trimmer is task:
            self._trimmer = None
        if self._periodic is task:
            self._periodic = None

    def start(self) -> None:
        """Start the periodic task."""
        self._periodic = self._life.spawn(self._run_periodic(), "periodic")
        self._periodic.add_done_callback(self._forget_task)

    def _trimmable(self, ledgers: Sequence[LedgerRecord]) -> int:
        """How many of the oldest ledgers every durable cursor passed and retention lets go."""
        marks = list(self._marks())
        slowest = min(marks) if marks else None
        consumed: list[LedgerRecord] = []
        for ledger in ledgers[:-1]:  # never the current ledger
            if slowest is not None and slowest < ledger.last_position:
                break
            consumed.append(ledger)
        retention_ms = self._config.retention_time_ms
        retention_bytes = self._config.retention_size_bytes
        now = self._clock.time_ms()
        kept_bytes = sum(ledger.size_bytes for ledger in consumed)
        count = 0
        for ledger in consumed:
            published = ledger.last_publish_time_ms or ledger.created_ms
            expired = retention_ms >= 0 and now - published >= retention_ms
            over_size = retention_bytes >= 0 and kept_bytes > retention_bytes
            if not (expired or over_size):
                break
            count += 1
            kept_bytes -= ledger.size_bytes
        return count

    async def trim(self) -> int:
        """See :meth:`ManagedLedger.trim`."""
        self._life.check_usable()
        if self._trimmable(self._log_state.ledgers) == 0:
            return 0
        async with self._lock:
            deleted: list[LedgerRecord] = []

            def drop(ledgers: list[LedgerRecord]) -> list[LedgerRecord]:
                count = self._trimmable(ledgers)
                deleted[:] = ledgers[:count]
                return ledgers[count:]

            await self._metadata.update_info(drop)
            for ledger in deleted:
                self._cache.invalidate_ledger(ledger.ledger_id)
                self._deleted(ledger.ledger_id)
                await delete_quietly(self._client, ledger.ledger_id, self._name)
            if deleted:
                self._log.info(
                    "ledgers_trimmed",
                    ledgers=[ledger.ledger_id for ledger in deleted],
                    # never empty: the current ledger is never trimmed
                    earliest_offset=self._log_state.ledgers[0].first_offset,
                )
            return len(deleted)

    def cursor_moved(self, mark_delete: Position, *, durable: bool) -> None:
        """A cursor's mark-delete moved: trim if that may free the oldest ledger."""
        ledgers = self._log_state.ledgers
        if not durable or len(ledgers) < 2:
            return
        if mark_delete >= ledgers[0].last_position:
            self.request_trim()

    def request_trim(self) -> None:
        """Trim soon, in the background; requests while one runs make it run once more."""
        if not self._life.live:
            return
        if self._trimmer is not None and not self._trimmer.done():
            self._trim_again = True
            return
        self._trimmer = self._life.spawn(self._background_trim(), "trim")
        self._trimmer.add_done_callback(self._forget_task)

    async def _background_trim(self) -> None:
        while True:
            self._trim_again = False
            try:
                await self.trim()
            except MagnetarError as e:
                self._log.info("trim_failed", error=e.message)
                return
            if not self._trim_again:
                return

    async def _run_periodic(self) -> None:
        interval = self._config.trim_interval_ms / 1000
        while not self._life.stopped:
            await self._clock.sleep(interval)
            self._periodically()
            if self._life.live:
                try:
                    await self.trim()
                except MagnetarError as e:
                    self._log.info("trim_failed", error=e.message)


def _no_marks() -> Iterable[Position]:
    return ()


def _forget_nothing(ledger_id: int) -> None:
    pass


def _do_nothing() -> None:
    pass
