"""Reading a managed ledger's entries: from the entry cache, or from the bookies through one
read handle per ledger, never past the confirmed end."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from broker.managed_ledger.cache import EntryCache
from broker.managed_ledger.ledger_list import LedgerRecord
from broker.managed_ledger.ports import LedgerClientApi, LedgerReader
from broker.managed_ledger.state import Lifecycle, LogState
from broker.managed_ledger.types import Entry, EntryCodec, Position, check_position
from magnetar.common.errors import (
    InternalError,
    InvalidArgumentError,
    MagnetarError,
    ManagedLedgerError,
)

if TYPE_CHECKING:
    from broker.managed_ledger.types import EntryMeta

log = structlog.get_logger("magnetar.managed_ledger")


class EntryReader:
    """Reads entries of one managed ledger."""

    def __init__(
        self,
        name: str,
        *,
        life: Lifecycle,
        log_state: LogState,
        client: LedgerClientApi,
        codec: EntryCodec,
        cache: EntryCache,
    ) -> None:
        self._name = name
        self._life = life
        self._log_state = log_state
        self._client = client
        self._codec = codec
        self._cache = cache
        self._handles: dict[int, LedgerReader] = {}
        self._log = log.bind(managed_ledger=name)

    def keep_handle(self, ledger_id: int, reader: LedgerReader) -> None:
        """Read ``ledger_id`` through ``reader`` (one opened already, by recovery say)."""
        self._handles[ledger_id] = reader

    def forget(self, ledger_id: int) -> None:
        """Let the handle of a deleted ledger go."""
        self._handles.pop(ledger_id, None)

    def clear(self) -> None:
        self._handles.clear()

    async def read(self, start: Position, *, max_entries: int, max_bytes: int) -> list[Entry]:
        """Entries from ``start`` (inclusive) on, across ledgers, never past the last confirmed
        entry (see :meth:`ManagedLedger.read`)."""
        start = check_position(start, "start")
        _check_limit("max_entries", max_entries)
        _check_limit("max_bytes", max_bytes)
        self._life.check_readable()
        found: list[Entry] = []
        size = 0
        position = max(start, self._log_state.ledgers.first_position())
        while len(found) < max_entries and size < max_bytes:
            ledgers = self._log_state.ledgers
            located = ledgers.locate(position)
            if located is None:
                break
            i, position = located
            last_confirmed = self._log_state.last_confirmed
            if position > last_confirmed:
                break
            ledger = ledgers[i]
            last = ledger.entries - 1
            if position.ledger_id == last_confirmed.ledger_id:
                last = min(last, last_confirmed.entry_id)
            count = min(max_entries - len(found), last - position.entry_id + 1)
            batch = await self._read_ledger(ledger, position.entry_id, count, max_bytes - size)
            if not batch:
                break
            for entry in batch:
                found.append(entry)
                size += len(entry.payload)
                if size >= max_bytes:
                    break
            position = self._log_state.ledgers.next_position(found[-1].position)
        return found

    async def read_one(self, position: Position) -> Entry:
        """The entry at ``position`` (it must be one)."""
        ledgers = self._log_state.ledgers
        i = ledgers.find(position.ledger_id)
        if i is None or not ledgers.is_entry(position):
            raise InternalError(f"{tuple(position)} is not an entry of {self._name!r}")
        entries = await self._read_ledger(ledgers[i], position.entry_id, 1, 1)
        return entries[0]

    async def _read_ledger(
        self, ledger: LedgerRecord, first: int, count: int, budget: int
    ) -> list[Entry]:
        """Up to ``count`` entries of ``ledger`` from ``first``: a run from the cache, or a run
        read from the bookies (sized to ``budget`` by the ledger's average entry)."""
        ledger_id = ledger.ledger_id
        cached: list[Entry] = []
        size = 0
        for entry_id in range(first, first + count):
            entry = self._cache.get(Position(ledger_id, entry_id))
            if entry is None:
                break
            cached.append(entry)
            size += len(entry.payload)
            if size >= budget:
                break
        if cached:
            return cached
        average = ledger.size_bytes // ledger.entries if ledger.entries and ledger.size_bytes else 0
        if average > 0:
            count = min(count, max(1, budget // average + 1))
        last = first + count - 1
        reader = await self._reader(ledger, fresh=False)
        try:
            read = await reader.read(first, last)
        except MagnetarError as e:
            if isinstance(e, InvalidArgumentError):
                raise
            # its ensemble may have changed since the handle was opened: once more, fresh
            self._log.info("ledger_read_retried", ledger=ledger.ledger_id, error=e.message)
            reader = await self._reader(ledger, fresh=True)
            read = await reader.read(first, last)
        return [self._describe(Position(e.ledger_id, e.entry_id), e.payload) for e in read]

    async def _reader(self, ledger: LedgerRecord, *, fresh: bool) -> LedgerReader:
        """A read handle (opened without recovery, kept per ledger)."""
        ledger_id = ledger.ledger_id
        reader = None if fresh else self._handles.get(ledger_id)
        if reader is None:
            reader = await self._client.open_ledger(ledger_id, recovery=False)
            self._handles[ledger_id] = reader
        if not reader.metadata.closed and reader.last_add_confirmed < ledger.entries - 1:
            # the ledger this instance writes: it knows the confirmed end before the bookies
            reader.last_add_confirmed = ledger.entries - 1
        return reader

    def _describe(self, position: Position, payload: bytes) -> Entry:
        try:
            meta: EntryMeta = self._codec.describe(payload)
        except MagnetarError:
            raise
        except Exception as e:  # a codec bug must name the entry it choked on
            raise ManagedLedgerError(
                f"entry {tuple(position)} of {self._name!r} could not be described: {e!r}",
                context={"name": self._name, "position": tuple(position)},
            ) from e
        return Entry(
            position,
            payload,
            meta.first_offset,
            meta.num_messages,
            meta.publish_time_ms,
            meta.key_hashes,
            meta.deliver_at_ms,
            meta.payload_format,
        )


def _check_limit(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgumentError(
            f"{name} must be an int >= 1, got {value!r}", context={name: repr(value)}
        )
