"""One autorecovery instance (:class:`Autorecovery`): it campaigns in the election and, while
active, audits, replicates and clears (the steps are in :mod:`bookie.autorecovery`). It keeps
the figures its metrics report as it works."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import structlog

from bookie.autorecovery.config import AutorecoveryConfig
from bookie.autorecovery.records import (
    LEADER,
    UnderReplicated,
    list_under_replicated,
    under_replicated_key,
)
from bookie.client.ledger_client import LedgerClient
from bookie.client.ledger_metadata import LedgerMetadata, write_set_indexes
from bookie.client.placement import choose_replacement
from bookie.entries import AddEntry, entry_checksum
from magnetar.common.errors import (
    BadVersionError,
    LedgerError,
    LedgerNotFoundError,
    MagnetarError,
    MetadataError,
    NoSuchKeyError,
    NotEnoughBookiesError,
    SessionLostError,
)
from metadata import MetadataStore, layout
from metadata.coordination import LeaderElection, Session

log = structlog.get_logger("magnetar.autorecovery")

COPY_BATCH = 256


def lost_fragments(metadata: LedgerMetadata, lost: set[str]) -> list[int]:
    """Indexes of the segments that name a lost bookie and whose end is known."""
    found = []
    for index, segment in enumerate(metadata.segments):
        if lost & set(segment.bookies) and metadata.segment_end(index) is not None:
            found.append(index)
    return found


class Autorecovery:
    """One autorecovery instance; active while it leads the election."""

    def __init__(self, store: MetadataStore, config: AutorecoveryConfig) -> None:
        self.store = store
        self.config = config
        self.name = config.name
        self._missing_since: dict[str, float] = {}
        self._client: LedgerClient | None = None
        self._session: Session | None = None
        self._election: LeaderElection | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._last_error: str | None = None
        self.active = asyncio.Event()
        # what /metrics reports (bookie/autorecovery/metrics.py): plain numbers kept as the
        # work happens, so a scrape costs no metadata read
        self.copied_entries = 0
        self.replicated_fragments = 0
        self.replicated_ledgers = 0
        self.replication_failures: Counter[str] = Counter()
        """Ledgers whose replication failed in a pass, by reason (the next pass retries them)."""
        self.interruptions = 0
        self.lost_bookie_count = 0
        self.under_replicated_ledgers = 0
        """Records listed by the last audit, less those this instance has cleared since."""
        self.last_audit_at: float | None = None
        """Wall-clock time (s since the epoch) the last audit completed; None before the first."""

    async def start(self) -> Autorecovery:
        self._client = await LedgerClient.start(
            self.store, self.config.ledger, creator=f"autorecovery:{self.name}"
        )
        self._task = asyncio.create_task(self._run(), name="autorecovery")
        return self

    async def _run(self) -> None:
        while not self._stopping:
            try:
                self._session = await Session.start(
                    self.store, ttl_s=self.config.session_ttl_s, name=self.name
                )
                self._last_error = None
                self._election = LeaderElection(
                    self.store, self._session, LEADER, self.name.encode()
                )
                await self._election.campaign()
                log.info("autorecovery_active", name=self.name)
                self.active.set()
                while self._session.alive and self._election.is_leader and not self._stopping:
                    await self.run_once()
                    await asyncio.sleep(self.config.check_interval_s)
                if not self._stopping:
                    log.warning("autorecovery_leadership_lost", name=self.name)
                    self.interruptions += 1
            except (SessionLostError, MetadataError) as e:
                log.warning("autorecovery_interrupted", error=str(e))
                self._last_error = e.message
                self.interruptions += 1
                await asyncio.sleep(1.0)
            finally:
                self.active.clear()
                if self._session is not None:
                    with contextlib.suppress(MagnetarError):
                        await self._session.close()

    # --- state, for /health ---------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        """``(True, "active")`` or ``(True, "standby")`` while the instance runs under a live
        metadata session; otherwise ``(False, why)``. Reads only what the instance holds (no
        metadata request), so a probe may ask as often as it likes."""
        if self._stopping:
            return False, "stopping"
        task = self._task
        if task is None:
            return False, "starting"
        if task.done():
            error = None if task.cancelled() else task.exception()
            return False, f"the autorecovery loop ended: {error!r}"
        session = self._session
        if session is None or not session.alive:
            lost = session.lost_error if session is not None else None
            why = self._last_error or (lost.message if lost is not None else None)
            return False, f"no metadata session: {why or 'connecting to the metadata store'}"
        return True, "active" if self.is_active else "standby"

    @property
    def is_active(self) -> bool:
        """Whether this instance leads the election now and works under a live session."""
        session, election = self._session, self._election
        return (
            self.active.is_set()
            and not self._stopping
            and session is not None
            and session.alive
            and election is not None
            and election.is_leader
        )

    # --- one pass ---------------------------------------------------------------------------------

    async def run_once(self) -> None:
        """Audit, then replicate what is recorded (the active instance's loop body)."""
        available = await self._available()
        lost = await self.lost_bookies(available)
        if lost:
            await self.audit(lost)
        records = await list_under_replicated(self.store)
        self.lost_bookie_count = len(lost)
        self.under_replicated_ledgers = len(records)
        self.last_audit_at = time.time()
        for record in records:
            # what a record names stays lost while it is still away, even if this instance
            # only just started (and so has not yet watched it miss its grace period)
            still_lost = set(record.lost_bookies) - available
            try:
                await self.replicate(record.ledger_id, still_lost)
            except NotEnoughBookiesError as e:
                self.replication_failures["no_replacement"] += 1
                log.warning("autorecovery_no_replacement", ledger=record.ledger_id, error=e.message)
            except LedgerError as e:
                self.replication_failures["ledger_error"] += 1
                log.warning("autorecovery_ledger_failed", ledger=record.ledger_id, error=e.message)

    async def _available(self) -> set[str]:
        listing = await self.store.list(layout.BOOKIES_AVAILABLE)
        return {k.rsplit("/", 1)[1] for k in listing.keys()}  # noqa: SIM118 - Listing.keys()

    async def lost_bookies(self, available: set[str] | None = None) -> set[str]:
        """Known bookies missing for longer than the grace period."""
        cookies = await self.store.list(layout.BOOKIE_COOKIES)
        known = {k.rsplit("/", 1)[1] for k in cookies.keys()}  # noqa: SIM118 - Listing.keys()
        if available is None:
            available = await self._available()
        now = time.monotonic()
        for bookie in known - available:
            self._missing_since.setdefault(bookie, now)
        for bookie in list(self._missing_since):
            if bookie in available or bookie not in known:
                del self._missing_since[bookie]
        return {
            b
            for b, since in self._missing_since.items()
            if now - since >= self.config.lost_bookie_grace_s
        }

    async def audit(self, lost: set[str]) -> int:
        """Record every ledger with a fragment on a lost bookie; returns how many."""
        assert self._client is not None
        recorded = 0
        for ledger_id in await self._client.ledgers.ledger_ids():
            try:
                metadata = await self._client.ledgers.read(ledger_id)
            except LedgerNotFoundError:
                continue
            fragments = lost_fragments(metadata, lost)
            if not fragments:
                continue
            key = under_replicated_key(ledger_id)
            if await self.store.get(key) is None:
                record = UnderReplicated(
                    ledger_id,
                    tuple(sorted(lost & metadata.all_bookies())),
                    len(fragments),
                    int(time.time() * 1000),
                )
                with contextlib.suppress(MetadataError):
                    await self.store.create(key, record.to_bytes())
                    log.info("ledger_under_replicated", ledger=ledger_id, fragments=len(fragments))
            recorded += 1
        return recorded

    async def replicate(self, ledger_id: int, lost: set[str]) -> None:
        """Copy every lost fragment of one ledger, then clear its record."""
        assert self._client is not None
        client = self._client
        copied = False
        while True:
            try:
                metadata = await client.ledgers.read(ledger_id)
            except LedgerNotFoundError:
                await self.store.delete(under_replicated_key(ledger_id))  # deleted meanwhile
                self._cleared()
                return
            fragments = lost_fragments(metadata, lost)
            if not fragments:
                await self.store.delete(under_replicated_key(ledger_id))
                self._cleared()
                if copied:  # not a record cleared because its bookie came back
                    self.replicated_ledgers += 1
                log.info("ledger_replicated", ledger=ledger_id)
                return
            index = fragments[0]
            segment = metadata.segments[index]
            bookies = list(segment.bookies)
            missing = [b for b in bookies if b in lost]
            replacements = {}
            for bookie in missing:
                position = bookies.index(bookie)
                bookies[position] = choose_replacement(
                    client.view.candidates(),
                    bookies,
                    position,
                    metadata.write_quorum,
                    exclude=lost,
                )
                replacements[position] = bookies[position]
            await self._copy(metadata, index, replacements)
            try:
                await client.ledgers.write(metadata.replacing(index, bookies))
            except (BadVersionError, NoSuchKeyError):
                continue  # the ledger changed (closed, or its writer changed ensemble): redo
            self.replicated_fragments += 1
            copied = True
            log.info(
                "fragment_replicated",
                ledger=ledger_id,
                segment=index,
                replaced={segment.bookies[p]: b for p, b in replacements.items()},
            )

    def _cleared(self) -> None:
        self.under_replicated_ledgers = max(0, self.under_replicated_ledgers - 1)

    async def _copy(
        self, metadata: LedgerMetadata, index: int, replacements: dict[int, str]
    ) -> None:
        """Copy the fragment's entries that the replaced positions held to their replacements."""
        assert self._client is not None
        client = self._client
        segment = metadata.segments[index]
        end = metadata.segment_end(index)
        assert end is not None
        e, qw = metadata.ensemble_size, metadata.write_quorum
        for position, target in replacements.items():
            wanted = [
                entry_id
                for entry_id in range(segment.first_entry_id, end + 1)
                if position in write_set_indexes(entry_id, e, qw)
            ]
            for start in range(0, len(wanted), COPY_BATCH):
                batch = wanted[start : start + COPY_BATCH]
                entries = await self._read_from_survivors(metadata, index, position, batch)
                adds = [
                    AddEntry(metadata.ledger_id, entry_id, lac, payload, crc, recovery=True)
                    for entry_id, (lac, payload, crc) in entries.items()
                ]
                failures = await client.pool.client(target).add_entries(adds)
                if failures:
                    raise failures[0].error
                self.copied_entries += len(adds)

    async def _read_from_survivors(
        self, metadata: LedgerMetadata, index: int, lost_position: int, entry_ids: list[int]
    ) -> dict[int, tuple[int, bytes, int]]:
        assert self._client is not None
        segment = metadata.segments[index]
        e, qw = metadata.ensemble_size, metadata.write_quorum
        found: dict[int, tuple[int, bytes, int]] = {}
        survivors = sorted(
            {p for i in entry_ids for p in write_set_indexes(i, e, qw)} - {lost_position}
        )
        for position in survivors:
            wanted = [
                i for i in entry_ids if i not in found and position in write_set_indexes(i, e, qw)
            ]
            if not wanted:
                continue
            try:
                result = await self._client.pool.client(segment.bookies[position]).read_entries(
                    metadata.ledger_id, wanted[0], wanted[-1], entry_ids=wanted, max_bytes=1 << 30
                )
            except MagnetarError:
                continue
            for entry in result.entries:
                if (
                    entry_checksum(
                        metadata.ledger_id, entry.entry_id, entry.last_add_confirmed, entry.payload
                    )
                    == entry.crc32c
                ):
                    found[entry.entry_id] = (entry.last_add_confirmed, entry.payload, entry.crc32c)
        absent = [i for i in entry_ids if i not in found]
        if absent:
            raise LedgerError(
                f"entries {absent[:5]} of ledger {metadata.ledger_id} (segment {index}) are on no"
                " surviving replica: they cannot be re-replicated",
                context={"ledger": metadata.ledger_id, "entries": len(absent)},
            )
        return found

    async def close(self) -> None:
        """Stop; if this instance was active, another one takes over."""
        self._stopping = True
        if self._task is not None:
            # a cancellation that lands just as an inner wait_for finishes is lost on Python
            # 3.11, so cancel until the task has really ended (the flag ends its loops anyway)
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=1.0)
            with contextlib.suppress(asyncio.CancelledError):
                self._task.result()
        if self._client is not None:
            await self._client.close()
