"""The ledger client: create, write, open (with recovery), read and delete replicated ledgers.

This is how brokers, and autorecovery, use the bookie tier::

    client = await LedgerClient.start(store)
    ledger = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    entry_id = await ledger.add(b"payload")
    await ledger.close()
    reader = await client.open_ledger(ledger.ledger_id)   # recovers it if it was left open
    entries = await reader.read(0, reader.last_add_confirmed)

**Recovery open** (the new owner of a partition takes the previous owner's last ledger) runs:

1. mark the metadata IN_RECOVERY (compare-and-swap), so the old writer's next ensemble change
   fails;
2. fence the last ensemble until every write quorum has ``Qw - Qa + 1`` fenced bookies
   (:func:`bookie.client.quorum.fencing_complete`), so the old writer can no longer confirm
   anything. One bookie down is fine as long as that still holds;
3. take the highest LAC the fenced bookies report **that a replica backs**: the entry at that LAC
   must be found (:func:`bookie.client.quorum.entry_fate`). A LAC whose entry is absent from its
   replicas was never confirmed, whatever a bookie was told (issue 23, finding 8: a LAC of 2^40
   closed a ledger at 2^40, and its topic could never be opened again). It is reported loudly
   (the ``ledger_recovery_lac_unbacked`` error event, the ``unbacked_lac_recoveries`` counter,
   and the ``recovery-unbacked-lac`` property of the closed ledger, which ``magnetar cluster
   ledger`` shows), and the next lower LAC is tried, down to the start of the last ensemble;
4. read forward from there, entry by entry, deciding each one's fate (found / absent / unknown).
   Found entries are re-added to their write set with the recovery flag (bookies store each
   entry once, so a replica that holds it only confirms it), replacing unreachable bookies
   through a normal ensemble change, up to the first absent one;
5. close the ledger with a compare-and-swap at the last recovered entry.

Two clients may recover the same ledger at once. Both fence, both re-add the same entries
(byte-identical copies), and the first close wins. The other finds the ledger closed and adopts
that end, so every reader sees one sequence of entries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import structlog

from bookie.client.bookie_client import BookieCredentials
from bookie.client.bookies import BookiePool, BookieView
from bookie.client.config import LedgerClientConfig
from bookie.client.ledger_metadata import (
    INTENDED_ENSEMBLE_PROPERTY,
    LedgerMetadata,
    LedgerMetadataStore,
    LedgerState,
    check_quorums,
    write_set_indexes,
)
from bookie.client.placement import choose_ensemble
from bookie.client.quorum import EntryFate, entry_fate, fencing_complete, fencing_impossible
from bookie.client.read_handle import ReadHandle
from bookie.client.write_handle import WriteHandle
from bookie.entries import ReadEntry, entry_checksum
from magnetar.common.errors import (
    BadVersionError,
    LedgerRecoveryError,
    MagnetarError,
    NoSuchEntryError,
    NoSuchKeyError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
)
from metadata import MetadataStore

log = structlog.get_logger("magnetar.ledger")

UNBACKED_LAC_PROPERTY = "recovery-unbacked-lac"
"""Custom property of a ledger that recovery closed below a LAC that no replica backs."""


@dataclass(frozen=True, slots=True)
class UnbackedLac:
    """A last-add-confirmed some bookies reported whose entry no replica holds."""

    last_add_confirmed: int
    bookies: tuple[str, ...]


class LedgerClient:
    """Creates and opens ledgers over the bookies registered in ``store``."""

    def __init__(
        self,
        store: MetadataStore,
        config: LedgerClientConfig,
        view: BookieView,
        *,
        creator: str = "",
    ) -> None:
        self.store = store
        self.config = config
        self.view = view
        self.pool = BookiePool(
            view,
            timeout_s=config.read_timeout_ms / 1000,
            credentials=BookieCredentials.from_config(config),
        )
        self.ledgers = LedgerMetadataStore(store)
        self.creator = creator
        self._placed: dict[str, int] = {}
        self.recoveries = 0
        """Ledgers this client recovered and closed (metrics)."""
        self.unbacked_lac_recoveries = 0
        """Recoveries that found a LAC no replica backs and closed below it (metrics)."""
        self.under_striped_created = 0
        """Ledgers created on fewer than their intended E bookies (metrics)."""
        self.under_striped_open: set[int] = set()
        """Under-striped ledgers this client is writing now (metrics)."""
        # bookie -> (quarantined until, on the monotonic clock; its registration's start time)
        self._quarantine: dict[str, tuple[float, int]] = {}

    @classmethod
    async def start(
        cls,
        store: MetadataStore,
        config: LedgerClientConfig | None = None,
        *,
        creator: str = "",
    ) -> LedgerClient:
        view = BookieView(store)
        await view.start()
        return cls(store, config or LedgerClientConfig(), view, creator=creator)

    async def close(self) -> None:
        await self.view.close()
        await self.pool.close()

    # --- unreachable bookies ------------------------------------------------------------------

    def quarantine(self, bookie_id: str) -> None:
        """An add to ``bookie_id`` failed: keep it out of new ensembles for
        ``bookie_quarantine_ms``, or until it registers again (a restart)."""
        record = self.view.bookies.get(bookie_id)
        until = time.monotonic() + self.config.bookie_quarantine_ms / 1000
        self._quarantine[bookie_id] = (until, record.start_time_ms if record else 0)

    def unreachable(self) -> set[str]:
        """The quarantined bookies (see :meth:`quarantine`)."""
        now = time.monotonic()
        for bookie_id, (until, started) in list(self._quarantine.items()):
            record = self.view.bookies.get(bookie_id)
            if now >= until or (record is not None and record.start_time_ms != started):
                del self._quarantine[bookie_id]
        return set(self._quarantine)

    async def release_answering(self, *, skip: set[str] | frozenset[str] = frozenset()) -> bool:
        """Probe the quarantined bookies that are still registered (but those in ``skip``):
        the ones that answer leave quarantine. Returns whether any did.

        Called only when quarantine leaves too few bookies: a connection blip to a live bookie
        must not keep it out when it is needed (on a busy machine a first connection can time
        out), while a crashed bookie whose registration has not expired yet stays out."""
        suspects = [b for b in self.unreachable() if b in self.view.bookies and b not in skip]
        if not suspects:
            return False
        timeout_s = min(2.0, self.config.read_timeout_ms / 1000)

        async def probe(bookie_id: str) -> bool:
            try:
                await asyncio.wait_for(self.pool.client(bookie_id).info(), timeout_s)
            except (MagnetarError, TimeoutError):
                return False
            self._quarantine.pop(bookie_id, None)
            log.info("bookie_quarantine_lifted", bookie=bookie_id, reason="answered a probe")
            return True

        return any(await asyncio.gather(*(probe(b) for b in suspects)))

    def writable_bookies(self) -> int:
        """Bookies a new ledger could be placed on now: registered, writable, not quarantined."""
        down = self.unreachable()
        return sum(1 for c in self.view.candidates() if c.writable and c.bookie_id not in down)

    # --- creating and writing -----------------------------------------------------------------

    async def create_ledger(
        self,
        *,
        ensemble_size: int | None = None,
        write_quorum: int | None = None,
        ack_quorum: int | None = None,
        custom: Mapping[str, bytes] | None = None,
    ) -> WriteHandle:
        """A new, open ledger on E writable bookies; returns its write handle.

        With fewer than E writable (and reachable) bookies and ``under_striped_ledgers`` on,
        the ledger goes on as many as there are, down to Qw, and records the E it was meant
        to have (:attr:`LedgerMetadata.under_striped`). Below that, NotEnoughBookiesError
        names every bookie that cannot be used and why."""
        e = ensemble_size or self.config.ensemble_size
        qw = write_quorum or min(self.config.write_quorum, e)
        qa = ack_quorum or min(self.config.ack_quorum, qw)
        check_quorums(e, qw, qa)
        minimum = qw if self.config.under_striped_ledgers else None
        try:
            bookies = choose_ensemble(
                self.view.candidates(self._placed),
                e,
                qw,
                exclude=self.unreachable(),
                min_ensemble_size=minimum,
            )
        except NotEnoughBookiesError:
            if not await self.release_answering():
                raise
            bookies = choose_ensemble(
                self.view.candidates(self._placed),
                e,
                qw,
                exclude=self.unreachable(),
                min_ensemble_size=minimum,
            )
        for bookie in bookies:
            self._placed[bookie] = self._placed.get(bookie, 0) + 1
        properties = dict(custom or {})
        if len(bookies) < e:
            properties[INTENDED_ENSEMBLE_PROPERTY] = str(e).encode()
        metadata = await self.ledgers.create(
            len(bookies), qw, qa, bookies, creator=self.creator, custom=properties
        )
        if metadata.under_striped:
            self.under_striped_created += 1
            self.under_striped_open.add(metadata.ledger_id)
            log.warning(
                "ledger_created_under_striped",
                ledger=metadata.ledger_id,
                ensemble=bookies,
                quorums=(len(bookies), qw, qa),
                intended_ensemble_size=e,
                unreachable=sorted(self.unreachable()),
            )
        else:
            log.info(
                "ledger_created", ledger=metadata.ledger_id, ensemble=bookies, quorums=(e, qw, qa)
            )
        return WriteHandle(self, metadata)

    # --- opening and reading ------------------------------------------------------------------

    async def open_ledger(self, ledger_id: int, *, recovery: bool = True) -> ReadHandle:
        """A read handle. With ``recovery`` (the default) an open ledger is first fenced and
        closed, so its end is final; without it, an open ledger is read up to the LAC its
        bookies report."""
        metadata = await self.ledgers.read(ledger_id)
        if metadata.closed:
            return ReadHandle(self, metadata, metadata.last_entry_id)
        if recovery:
            metadata = await self.recover(ledger_id)
            return ReadHandle(self, metadata, metadata.last_entry_id)
        handle = ReadHandle(self, metadata, metadata.last_segment.first_entry_id - 1)
        await handle.refresh_lac()
        return handle

    async def recover(self, ledger_id: int) -> LedgerMetadata:
        """Fence, recover and close a ledger (see the module docstring); returns its metadata."""
        metadata = await self._mark_in_recovery(ledger_id)
        if metadata.closed:
            return metadata
        claims = await self._fence(metadata)
        lac, unbacked = await self._backed_lac(metadata, claims)
        writer = WriteHandle(self, metadata, recovery=True, last_add_confirmed=lac, length=-1)
        entry_id = lac + 1
        try:
            while True:
                # read from the fenced ensemble: if re-adding needs an ensemble change, the
                # replacement holds nothing of the entries still to recover
                fates = await self._recovery_read(metadata, entry_id)
                ended = False
                for fate, found in fates:
                    if fate is EntryFate.UNKNOWN:
                        raise LedgerRecoveryError(
                            f"cannot tell whether entry {entry_id} of ledger {ledger_id} exists:"
                            " too few of its replicas answered; try again when more are up",
                            context={"ledger": ledger_id, "entry": entry_id},
                        )
                    if fate is EntryFate.ABSENT:
                        ended = True
                        break
                    assert found is not None
                    writer.recover_entry(
                        entry_id, found.last_add_confirmed, found.payload, found.crc32c
                    )
                    entry_id += 1
                if ended:
                    break
            last_entry_id = entry_id - 1
            closed = await self._close_recovered(writer, last_entry_id, unbacked)
        except MagnetarError:
            writer._fail(LedgerRecoveryError(f"recovery of ledger {ledger_id} stopped"))
            raise
        self.recoveries += 1
        if unbacked:
            self.unbacked_lac_recoveries += 1
        log.info(
            "ledger_recovered",
            ledger=ledger_id,
            lac_at_fence=lac,
            last_entry=closed.last_entry_id,
            re_added=closed.last_entry_id - lac,
            unbacked_lac=unbacked[0].last_add_confirmed if unbacked else None,
        )
        return closed

    async def _backed_lac(
        self, metadata: LedgerMetadata, claims: Mapping[str, int]
    ) -> tuple[int, list[UnbackedLac]]:
        """The highest LAC the fenced bookies report whose entry a replica holds (or the end of
        the previous ensemble), and the higher ones that no replica backs."""
        floor = metadata.last_segment.first_entry_id - 1
        unbacked: list[UnbackedLac] = []
        for lac in sorted({c for c in claims.values() if c > floor}, reverse=True):
            ((fate, _),) = await self._recovery_read(metadata, lac, count=1)
            reporters = tuple(sorted(b for b, c in claims.items() if c == lac))
            if fate is EntryFate.FOUND:
                return lac, unbacked
            if fate is EntryFate.UNKNOWN:
                raise LedgerRecoveryError(
                    f"cannot tell whether entry {lac} of ledger {metadata.ledger_id}, the last"
                    f" add confirmed that bookies {list(reporters)} report, exists: too few of"
                    " its replicas answered; try again when more are up",
                    context={"ledger": metadata.ledger_id, "entry": lac},
                )
            unbacked.append(UnbackedLac(lac, reporters))
            log.error(
                "ledger_recovery_lac_unbacked",
                ledger=metadata.ledger_id,
                claimed_lac=lac,
                bookies=list(reporters),
                replicas=list(metadata.write_set(lac)),
                detail="no replica holds the entry at this last add confirmed, so it was never"
                " confirmed; recovery goes by what the replicas hold, and the closed ledger"
                f" carries the {UNBACKED_LAC_PROPERTY} property",
            )
        return floor, unbacked

    async def _mark_in_recovery(self, ledger_id: int) -> LedgerMetadata:
        while True:
            metadata = await self.ledgers.read(ledger_id)
            if metadata.state is not LedgerState.OPEN:
                return metadata  # closed, or another client is recovering it too
            try:
                return await self.ledgers.write(replace(metadata, state=LedgerState.IN_RECOVERY))
            except (BadVersionError, NoSuchKeyError):
                continue

    async def _fence(self, metadata: LedgerMetadata) -> dict[str, int]:
        """Fence the last ensemble; returns the LAC each fenced bookie reports."""
        segment = metadata.last_segment
        e, qw, qa = metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum

        async def fence(position: int) -> tuple[int, int | MagnetarError]:
            try:
                client = self.pool.client(segment.bookies[position])
                result = await asyncio.wait_for(
                    client.fence(metadata.ledger_id), self.config.read_timeout_ms / 1000
                )
            except (MagnetarError, TimeoutError) as error:
                return position, error if isinstance(error, MagnetarError) else LedgerRecoveryError(
                    f"bookie {segment.bookies[position]} did not answer the fence"
                )
            return position, result.last_add_confirmed

        answers = await asyncio.gather(*(fence(p) for p in range(e)))
        fenced = {p for p, r in answers if isinstance(r, int)}
        failed = {p for p, r in answers if not isinstance(r, int)}
        if not fencing_complete(e, qw, qa, fenced):
            down = [segment.bookies[p] for p in sorted(failed)]
            verdict = (
                "can never complete" if fencing_impossible(e, qw, qa, failed) else "is incomplete"
            )
            raise LedgerRecoveryError(
                f"fencing ledger {metadata.ledger_id} {verdict}: bookies {down} did not answer,"
                f" and each write quorum of E{e}/Qw{qw}/Qa{qa} needs {qw - qa + 1} fenced"
                " member(s)",
                context={"ledger": metadata.ledger_id, "down": ",".join(down)},
            )
        return {segment.bookies[p]: r for p, r in answers if isinstance(r, int)}

    async def _recovery_read(
        self, metadata: LedgerMetadata, first: int, count: int = 0
    ) -> list[tuple[EntryFate, ReadEntry | None]]:
        """Fates of entries ``first``, ``first+1``... (``count``, or a batch), from all their
        replicas, up to the first that is not found."""
        batch = list(range(first, first + (count or self.config.recovery_read_batch)))
        segment = metadata.last_segment
        e, qw = metadata.ensemble_size, metadata.write_quorum
        asked: dict[str, list[int]] = {}
        for entry_id in batch:
            for position in write_set_indexes(entry_id, e, qw):
                asked.setdefault(segment.bookies[position], []).append(entry_id)

        async def read(bookie: str, ids: list[int]) -> tuple[str, dict[int, ReadEntry] | None]:
            try:
                client = self.pool.client(bookie)
                result = await client.read_entries(
                    metadata.ledger_id,
                    ids[0],
                    ids[-1],
                    entry_ids=ids,
                    max_bytes=1 << 30,
                    timeout_s=self.config.read_timeout_ms / 1000,
                )
            except (NoSuchLedgerError, NoSuchEntryError):
                return bookie, {}
            except (MagnetarError, TimeoutError):
                return bookie, None
            return bookie, {entry.entry_id: entry for entry in result.entries}

        answers = dict(await asyncio.gather(*(read(b, ids) for b, ids in asked.items())))
        fates: list[tuple[EntryFate, ReadEntry | None]] = []
        for entry_id in batch:
            replicas = [segment.bookies[p] for p in write_set_indexes(entry_id, e, qw)]
            found: ReadEntry | None = None
            not_held = 0
            for bookie in replicas:
                held = answers.get(bookie)
                if held is None:
                    continue
                entry = held.get(entry_id)
                if entry is None:
                    not_held += 1
                elif (
                    found is None
                    and entry_checksum(
                        metadata.ledger_id, entry_id, entry.last_add_confirmed, entry.payload
                    )
                    == entry.crc32c
                ):
                    found = entry
            fate = entry_fate(qw, metadata.ack_quorum, found=found is not None, not_held=not_held)
            fates.append((fate, found))
            if fate is not EntryFate.FOUND:
                break
        return fates

    async def _close_recovered(
        self, writer: WriteHandle, last_entry_id: int, unbacked: list[UnbackedLac]
    ) -> LedgerMetadata:
        pending = [e.future for e in writer._entries.values()]
        if pending:
            await asyncio.gather(*pending)
        if writer._changing is not None:
            await writer._changing
        while True:
            custom = dict(writer.metadata.custom)
            if unbacked:
                claimed = unbacked[0]
                custom[UNBACKED_LAC_PROPERTY] = (
                    f"{claimed.last_add_confirmed} reported by {','.join(claimed.bookies)};"
                    f" no replica held entry {claimed.last_add_confirmed}, closed at"
                    f" {last_entry_id}"
                ).encode()
            closing = replace(
                writer.metadata,
                state=LedgerState.CLOSED,
                last_entry_id=last_entry_id,
                length=-1,
                custom=custom,
            )
            try:
                return await self.ledgers.write(closing)
            except (BadVersionError, NoSuchKeyError):
                current = await self.ledgers.read(writer.ledger_id)
                if current.closed:
                    return current  # a racing recovery closed it first: its end stands
                writer.metadata = current

    # --- deleting -----------------------------------------------------------------------------

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger's entries on every bookie that may hold some, then its metadata."""
        metadata = await self.ledgers.read(ledger_id)

        async def delete_on(bookie: str) -> str | None:
            try:
                await self.pool.client(bookie).delete_ledger(ledger_id)
            except MagnetarError as e:
                return f"{bookie}: {e.message}"
            return None

        problems = [
            p for p in await asyncio.gather(*(delete_on(b) for b in metadata.all_bookies())) if p
        ]
        if problems:
            # the entries stay on those bookies as garbage: no process removes ledgers whose
            # metadata is gone yet (see docs/ledgers.md)
            log.warning("ledger_delete_incomplete", ledger=ledger_id, unreachable=problems)
        await self.ledgers.delete(metadata)
        log.info("ledger_deleted", ledger=ledger_id)
