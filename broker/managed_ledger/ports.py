"""The managed ledger's ports, written down as protocols: what it needs of the ledger client,
and what a cursor needs of its managed ledger (:class:`CursorHost`).

The managed ledger is given a :class:`bookie.client.ledger_client.LedgerClient` and uses only
the methods and attributes below. Naming them here, instead of importing the client, keeps
the managed ledger independent of how the client reaches bookies (gRPC): the import-linter
contract "The managed ledger knows nothing of the broker's service or gRPC layers" holds for
the whole import graph, and a test may pass an in-memory ledger client that has this shape.
``tests/unit/broker/managed_ledger/test_ports.py`` checks that the real client fits.

A cursor is typed against :class:`CursorHost` rather than the managed ledger: it reads,
checks acks and writes its record through these public calls only, and the managed ledger
reaches into no cursor either, so the two can change apart. The same test file checks that
:class:`~broker.managed_ledger.managed_ledger.ManagedLedger` is a host.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.managed_ledger.config import ManagedLedgerConfig
    from broker.managed_ledger.persistence import StoredCursor
    from broker.managed_ledger.types import Entry, Position, StartAt

MAX_ENTRY_BYTES = 5 * 1024 * 1024
"""Largest entry the ledger client writes (``bookie.client.write_handle.MAX_ENTRY_BYTES``).

Checked before an entry takes offsets: refused later, it would leave a gap."""


class LedgerMetadataView(Protocol):
    """A ledger's metadata, as far as the managed ledger reads it."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def last_entry_id(self) -> int: ...

    @property
    def length(self) -> int:
        """Payload bytes; -1 if unknown (a recovered ledger)."""
        ...

    @property
    def closed(self) -> bool: ...

    @property
    def under_striped(self) -> bool:
        """Created on fewer bookies than its intended E (fewer were writable)."""
        ...

    @property
    def intended_ensemble_size(self) -> int: ...


class LedgerEntryView(Protocol):
    @property
    def ledger_id(self) -> int: ...

    @property
    def entry_id(self) -> int: ...

    @property
    def payload(self) -> bytes: ...


class LedgerReader(Protocol):
    """A read handle (``bookie.client.read_handle.ReadHandle``)."""

    last_add_confirmed: int
    """Entries up to this one may be read; the managed ledger raises it for the ledger it
    writes, whose confirmed end it knows before the bookies do."""

    @property
    def metadata(self) -> LedgerMetadataView: ...

    async def read(self, first_entry_id: int, last_entry_id: int) -> Sequence[LedgerEntryView]: ...


class LedgerWriter(Protocol):
    """A write handle (``bookie.client.write_handle.WriteHandle``)."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def metadata(self) -> LedgerMetadataView: ...

    async def add_async(self, payload: bytes) -> asyncio.Future[int]: ...

    def add_nowait(self, payload: bytes) -> asyncio.Future[int] | None:
        """``add_async`` without waiting: None, and nothing queued, while the writer's pending
        limits are reached (then await ``add_async``)."""
        ...

    async def close(self) -> LedgerMetadataView: ...

    async def close_confirmed(self) -> LedgerMetadataView:
        """After the writer failed without losing the ledger: close it at the last entry it
        confirmed (raises ``LedgerFencedError`` if another client is recovering it)."""
        ...


class LedgerClientApi(Protocol):
    """The ledger client (``bookie.client.ledger_client.LedgerClient``)."""

    async def create_ledger(
        self,
        *,
        ensemble_size: int | None = None,
        write_quorum: int | None = None,
        ack_quorum: int | None = None,
        custom: Mapping[str, bytes] | None = None,
    ) -> LedgerWriter: ...

    async def open_ledger(self, ledger_id: int, *, recovery: bool = True) -> LedgerReader: ...

    async def recover(self, ledger_id: int) -> LedgerMetadataView: ...

    async def delete_ledger(self, ledger_id: int) -> None: ...

    def writable_bookies(self) -> int:
        """Bookies a new ledger could be placed on now (writable, registered, reachable)."""
        ...


class CursorHost(Protocol):
    """What a cursor needs of the managed ledger it belongs to (the managed ledger is one)."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> ManagedLedgerConfig: ...

    @property
    def closed(self) -> bool: ...

    @property
    def first_position(self) -> Position: ...

    @property
    def last_confirmed(self) -> Position:
        """Readers never go past this entry."""
        ...

    @property
    def confirmed_next_offset(self) -> int: ...

    def next_position(self, position: Position) -> Position: ...

    async def read(self, start: Position, *, max_entries: int, max_bytes: int) -> list[Entry]: ...

    def check_ackable(self, position: object) -> Position:
        """``position`` as a Position, if it is a confirmed entry (or before the first stored
        one); else :class:`InvalidArgumentError`."""
        ...

    def start_hint(self, start: StartAt) -> tuple[Position, int | None, Position]:
        """Mark-delete, its offset (``None`` if unknown without a read) and read position of a
        cursor starting at ``start``."""
        ...

    async def start_state(self, start: StartAt) -> tuple[Position, int, Position]:
        """As :meth:`start_hint`, with the offset exact (read if needed)."""
        ...

    def offset_hint(self, position: Position) -> int | None:
        """The offset of the last message at or before ``position``, if known without a read."""
        ...

    async def offset_through(self, position: Position) -> int:
        """The offset of the last message at or before ``position`` (reads an entry if needed)."""
        ...

    def cursor_moved(self, mark_delete: Position, *, durable: bool) -> None:
        """A cursor's mark-delete moved (the oldest ledger may be free to trim)."""
        ...

    async def write_cursor(self, cursor: str, stored: StoredCursor | None, version: int) -> int:
        """Put (``stored``) or delete (``None``) cursor ``cursor``'s record, fenced, if it is
        still at ``version`` (0: absent); returns its new version (0: deleted)."""
        ...

    async def write_guarded(self, key: str, value: bytes | None) -> None:
        """Put or delete one of the managed ledger's records, fenced like a cursor."""
        ...

    async def list_records(self, prefix: str) -> list[tuple[str, bytes]]: ...
