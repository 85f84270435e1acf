"""Opens, deletes and describes managed ledgers; one factory per broker.

The factory holds what every managed ledger of a broker shares: the metadata store, the ledger
client, the entry codec, the entry cache and the clock. Opening a managed ledger takes ownership
of it (see :meth:`ManagedLedger.open`); the broker decides *when* it may do that, through its own
ownership records, and the managed ledger's compare-and-swaps and the bookies' fencing make sure
that an old owner that has not noticed yet cannot write anything that counts.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from broker.managed_ledger.cache import EntryCache
from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.managed_ledger import ManagedLedger
from broker.managed_ledger.persistence import check_name, decode_info
from broker.managed_ledger.ports import LedgerClientApi
from broker.managed_ledger.types import EntryCodec, ManagedLedgerSnapshot
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    LedgerNotFoundError,
    MagnetarError,
    ManagedLedgerClosedError,
    ManagedLedgerError,
)
from metadata import layout
from metadata.api import MetadataStore

log = structlog.get_logger("magnetar.managed_ledger.factory")

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
"""Size of the entry cache a factory makes for itself when none is given."""


class ManagedLedgerFactory:
    """The broker's door to its managed ledgers."""

    def __init__(
        self,
        store: MetadataStore,
        ledger_client: LedgerClientApi,
        *,
        codec: EntryCodec,
        config: ManagedLedgerConfig | None = None,
        cache: EntryCache | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.ledger_client = ledger_client
        self.codec = codec
        self.config = config or ManagedLedgerConfig()
        self.cache = cache if cache is not None else EntryCache(DEFAULT_CACHE_BYTES)
        self.clock = clock
        self._open: dict[str, ManagedLedger] = {}
        self._opening: dict[str, asyncio.Task[ManagedLedger]] = {}
        self._closed = False

    @property
    def managed_ledgers(self) -> dict[str, ManagedLedger]:
        """The managed ledgers open here, by name."""
        return dict(self._open)

    async def open(self, name: str, *, config: ManagedLedgerConfig | None = None) -> ManagedLedger:
        """Open (creating if needed) managed ledger ``name`` and become its owner.

        Returns the instance already open here, unless it was fenced or is closing or closed:
        one still closing would close under its new user, so the close is waited for and a new
        instance opened. Raises :class:`ManagedLedgerFencedError` if another owner opened it
        at the same time.
        """
        check_name(name)
        self._check_open()
        existing = self._open.get(name)
        if existing is not None and not existing.closing and not existing.fenced.is_set():
            return existing
        opening = self._opening.get(name)
        if opening is None:
            opening = asyncio.ensure_future(self._do_open(name, config or self.config))
            self._opening[name] = opening
            opening.add_done_callback(lambda _: self._opening.pop(name, None))
        return await asyncio.shield(opening)

    async def _do_open(self, name: str, config: ManagedLedgerConfig) -> ManagedLedger:
        stale = self._open.pop(name, None)
        if stale is not None:
            # its close (perhaps already under way, perhaps given up by a forced close) ends
            # one way or another before the new instance starts; how is not this open's
            # business, since opening recovers whatever the old instance left behind
            closing = asyncio.ensure_future(stale.close())
            await asyncio.wait({closing})
            if not closing.cancelled() and (error := closing.exception()) is not None:
                log.info("stale_managed_ledger_close_failed", managed_ledger=name, error=str(error))
        ml = await ManagedLedger.open(
            name,
            store=self.store,
            ledger_client=self.ledger_client,
            codec=self.codec,
            config=config,
            cache=self.cache,
            clock=self.clock,
            on_close=self._forget,
        )
        self._open[name] = ml
        return ml

    def _forget(self, ml: ManagedLedger) -> None:
        if self._open.get(ml.name) is ml:
            del self._open[ml.name]

    async def exists(self, name: str) -> bool:
        check_name(name)
        return await self.store.get(layout.managed_ledger_info(name)) is not None

    async def read_info(self, name: str) -> ManagedLedgerSnapshot:
        """Ledgers and cursor names of ``name`` as persisted (for a managed ledger not open
        here); ``exists`` is false, and the rest empty, if there is no such managed ledger."""
        check_name(name)
        record = await self.store.get(layout.managed_ledger_info(name))
        if record is None:
            return ManagedLedgerSnapshot(name=name, ledgers=(), cursors=(), exists=False)
        info = decode_info(name, record.value)
        prefix = layout.managed_ledger_cursors(name)
        listing = await self.store.list(prefix)
        cursors = tuple(
            key[len(prefix) :]
            for key in listing.keys()  # noqa: SIM118 - Listing is not a dict
            if "/" not in key[len(prefix) :]
        )
        return ManagedLedgerSnapshot(
            name=name, ledgers=info.ledgers, cursors=cursors, terminated=info.terminated
        )

    async def delete(self, name: str) -> None:
        """Delete managed ledger ``name``: every ledger (bookies and metadata), its cursors and
        its info. It must not be open here; deleting one that does not exist does nothing."""
        check_name(name)
        self._check_open()
        open_here = self._open.get(name)
        if (open_here is not None and not open_here.closed) or name in self._opening:
            raise ManagedLedgerError(
                f"managed ledger {name!r} is open on this broker; close it before deleting it",
                context={"name": name},
            )
        key = layout.managed_ledger_info(name)
        record = await self.store.get(key)
        if record is None:
            return
        info = decode_info(name, record.value)
        for ledger in info.ledgers:
            # its entries leave this broker's cache now, not when newer ones push them out
            self.cache.invalidate_ledger(ledger.ledger_id)
            with contextlib.suppress(LedgerNotFoundError):
                await self.ledger_client.delete_ledger(ledger.ledger_id)
        prefix = layout.managed_ledger_cursors(name)
        listing = await self.store.list(prefix)
        for cursor in listing.records:
            if "/" not in cursor.key[len(prefix) :]:
                await self.store.delete(cursor.key)
        prefix = layout.managed_ledger_delay_indexes(name)
        listing = await self.store.list(prefix)
        for bucket in listing.records:
            if bucket.key[len(prefix) :].count("/") == 1:  # <cursor>/<bucket>, not another ML's
                await self.store.delete(bucket.key)
        await self.store.delete(key)
        log.info("managed_ledger_deleted", managed_ledger=name, ledgers=len(info.ledgers))

    async def close(self) -> None:
        """Close every managed ledger open here; the factory opens no more."""
        self._closed = True
        for opening in list(self._opening.values()):
            await asyncio.gather(opening, return_exceptions=True)
        results = await asyncio.gather(
            *(ml.close() for ml in list(self._open.values())), return_exceptions=True
        )
        for result in results:
            if isinstance(result, MagnetarError):
                log.warning("managed_ledger_close_failed", error=result.message)
        self._open.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise ManagedLedgerClosedError("the managed ledger factory is closed")
