"""What the managed ledger needs of the ledger client, written down as protocols.

The managed ledger is given a :class:`bookie.client.ledger_client.LedgerClient` and uses only
the methods and attributes below. Naming them here, instead of importing the client, keeps
the managed ledger independent of how the client reaches bookies (gRPC): the import-linter
contract "The managed ledger knows nothing of the broker's service or gRPC layers" holds for
the whole import graph, and a test may pass an in-memory ledger client that has this shape.
``tests/unit/broker/managed_ledger/test_ports.py`` checks that the real client fits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

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
