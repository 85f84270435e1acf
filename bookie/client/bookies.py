"""The ledger client's view of the bookies: who is registered, where, in what state.

Bookies publish themselves under ``/magnetar/bookies/available/<id>`` (lease-bound). The view
lists that prefix once and then watches it, so it always knows each live bookie's current
address (a bookie keeps its id across restarts and address changes), its state, zone and disk
figures. The pool hands out one :class:`BookieClient` per bookie, connected to the data address
the bookie registered (its framed data protocol) and re-created when that address changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from bookie.client.bookie_client import BookieClient, BookieCredentials
from bookie.client.placement import BookieCandidate
from magnetar.common.errors import BookieUnavailableError
from metadata import MetadataStore, layout
from metadata.coordination.view import PrefixView
from proto.common.v1 import types_pb2
from proto.format.v1 import cluster_pb2

log = structlog.get_logger("magnetar.ledger.bookies")


@dataclass(frozen=True, slots=True)
class BookieRecord:
    bookie_id: str
    address: str
    writable: bool
    zone: str | None
    free_bytes: int
    total_bytes: int
    ledger_count: int
    start_time_ms: int = 0
    data_address: str = ""
    """host:port of its data protocol, where the ledger client connects."""

    @classmethod
    def from_bytes(cls, data: bytes) -> BookieRecord:
        message = cluster_pb2.BookieRegistration.FromString(data)
        return cls(
            bookie_id=message.bookie_id,
            address=message.address,
            writable=message.state == types_pb2.BOOKIE_STATE_WRITABLE,
            zone=message.labels.get("zone") or None,
            free_bytes=message.free_disk_bytes,
            total_bytes=message.total_disk_bytes,
            ledger_count=message.ledger_count,
            start_time_ms=message.start_time_ms,
            data_address=message.data_address,
        )


class BookieView:
    """Live bookies, kept current by a watch on the registration prefix."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.bookies: dict[str, BookieRecord] = {}
        self._registrations = PrefixView(store, layout.BOOKIES_AVAILABLE, name="bookies")
        self._registrations.on_change(self._rebuild)

    async def start(self) -> None:
        await self._registrations.start()
        self._rebuild()

    def _rebuild(self) -> None:
        bookies: dict[str, BookieRecord] = {}
        for value in self._registrations.values.values():
            try:
                record = BookieRecord.from_bytes(value)
            except Exception:  # noqa: BLE001 - one bad record must not blind the client to others
                log.warning("bookie_registration_unreadable")
                continue
            bookies[record.bookie_id] = record
        self.bookies = bookies

    def on_change(self, listener: Callable[[], None]) -> None:
        self._registrations.on_change(listener)

    async def wait_change(self, timeout_s: float) -> None:
        await self._registrations.wait_change(timeout_s)

    def candidates(self, extra_load: dict[str, int] | None = None) -> list[BookieCandidate]:
        extra = extra_load or {}
        return [
            BookieCandidate(
                r.bookie_id,
                r.free_bytes,
                r.total_bytes,
                r.ledger_count + extra.get(r.bookie_id, 0),
                r.zone,
                r.writable,
            )
            for r in self.bookies.values()
        ]

    async def close(self) -> None:
        await self._registrations.close()


class BookiePool:
    """One :class:`BookieClient` per live bookie, following address changes."""

    def __init__(
        self,
        view: BookieView,
        *,
        timeout_s: float,
        credentials: BookieCredentials | None = None,
    ) -> None:
        self.view = view
        self.timeout_s = timeout_s
        self.credentials = credentials
        self._clients: dict[str, BookieClient] = {}
        self._closing: set[asyncio.Future[None]] = set()

    def client(self, bookie_id: str) -> BookieClient:
        """The client for ``bookie_id``; raises BookieUnavailableError if it is not registered."""
        record = self.view.bookies.get(bookie_id)
        existing = self._clients.get(bookie_id)
        if record is None:
            if existing is not None:
                return existing  # it may be briefly unregistered (a lease renewal race)
            raise BookieUnavailableError(
                f"bookie {bookie_id} is not registered (down, or never started)",
                context={"bookie": bookie_id},
            )
        if existing is not None and existing.address == record.data_address:
            return existing
        if not record.data_address:
            raise BookieUnavailableError(
                f"bookie {bookie_id} registered no data address: it runs a version older than"
                " the bookie data protocol (docs/protocol.md); upgrade it",
                context={"bookie": bookie_id},
            )
        if existing is not None:
            self._closing.add(asyncio.ensure_future(existing.close()))
        client = BookieClient(
            record.data_address, timeout_s=self.timeout_s, credentials=self.credentials
        )
        self._clients[bookie_id] = client
        return client

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        for closing in self._closing:
            await closing
