"""The single writer of one ledger: pipelined adds, quorums, ensemble changes, close.

Entry ``i`` goes to the Qw bookies of its write set (positions ``i mod E`` onwards of the current
ensemble). It is confirmed, in order, once Qa of them have acknowledged it. Each entry carries the
writer's LAC at the time it was sent, so bookies learn how far the ledger is confirmed.

Sending is batched per bookie. Entries added in the same event-loop turn share one call to the
bookie's coalescing client, and calls are not awaited one after the other.

**Ensemble change.** When a bookie of the current ensemble fails (an error other than fencing,
or no answer within ``add_timeout_ms``), the writer picks a replacement and appends a segment
starting at LAC+1 that uses it. It stores that with a compare-and-swap on the ledger's metadata,
and re-sends the unconfirmed entries the failed bookie owed. The caller does not see an error.
While a change is in flight, completions pause, so that no entry is confirmed on the old
ensemble after the new segment claims it lives on the replacement. If the compare-and-swap finds
the ledger no longer open (another client is recovering it), or a bookie says the ledger is
fenced, every pending add fails with :class:`LedgerFencedError`: this writer has lost the
ledger.

**No replacement.** With ``under_striped_ledgers`` on (the default), a writer whose failed bookie
no writable bookie can replace does not wait: it completes what already has its Qa
acknowledgements, fails the other pending adds with :class:`NotEnoughBookiesError` (retriable),
and its owner calls :meth:`WriteHandle.close_confirmed` to close the ledger at its last
confirmed entry, then goes on in a new ledger over the bookies left (under-striped, see
:meth:`LedgerClient.create_ledger`). The failed adds were never confirmed, so nobody has read
them: they are written again in the new ledger, in order. A recovery handle (or the setting off)
waits ``ensemble_change_timeout_ms`` for a replacement instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import structlog

from bookie.client.ledger_metadata import LedgerMetadata, LedgerState
from bookie.client.placement import choose_replacement
from bookie.client.quorum import AckTracker
from bookie.entries import AddEntry, AddFailure, entry_checksum
from magnetar.common.errors import (
    BadVersionError,
    BookieUnavailableError,
    EnsembleUnrepairableError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerMetadataConflictError,
    MagnetarError,
    MetadataError,
    NoSuchKeyError,
    NotEnoughBookiesError,
)

if TYPE_CHECKING:
    from bookie.client.ledger_client import LedgerClient

log = structlog.get_logger("magnetar.ledger.write")

MAX_ENTRY_BYTES = 5 * 1024 * 1024


@dataclass(slots=True)
class _Entry:
    add: AddEntry
    future: asyncio.Future[int]


class _Outbox:
    """Entries waiting to go to one bookie; flushed as one call at the end of the loop turn."""

    __slots__ = ("bookie", "entry_ids", "handle", "scheduled")

    def __init__(self, handle: WriteHandle, bookie: str) -> None:
        self.handle = handle
        self.bookie = bookie
        self.entry_ids: list[int] = []
        self.scheduled = False

    def push(self, entry_id: int) -> None:
        self.entry_ids.append(entry_id)
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        entry_ids, self.entry_ids = self.entry_ids, []
        if entry_ids:
            self.handle._send(self.bookie, entry_ids)


class WriteHandle:
    """Writes one ledger. Obtain from :meth:`LedgerClient.create_ledger`."""

    def __init__(
        self,
        client: LedgerClient,
        metadata: LedgerMetadata,
        *,
        recovery: bool = False,
        last_add_confirmed: int = -1,
        length: int = 0,
    ) -> None:
        self._client = client
        self.metadata = metadata
        self._recovery = recovery
        self._tracker = AckTracker(metadata.ack_quorum, last_add_confirmed)
        self._next_entry_id = last_add_confirmed + 1
        self._entries: dict[int, _Entry] = {}
        self._pending_bytes = 0
        self._length = length
        self._outboxes: dict[str, _Outbox] = {}
        # failed bookies, with the address they had when they failed: one that comes back at
        # another address (restarted, data kept) may be chosen again
        self._failed: dict[str, str] = {}
        self._changing: asyncio.Task[None] | None = None
        self._error: MagnetarError | None = None
        self._closing = False
        self._closed = False
        self._space = asyncio.Event()
        self._sends: set[asyncio.Future[list[AddFailure]]] = set()
        """Adds sent to bookies and not answered yet (cancelled when the ledger closes)."""
        self.ensemble_changes = 0

    # --- state ------------------------------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._tracker.last_add_confirmed

    @property
    def length(self) -> int:
        """Payload bytes of the confirmed entries."""
        return self._length

    @property
    def pending(self) -> int:
        return len(self._entries)

    @property
    def closed(self) -> bool:
        return self._closed or self._error is not None

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing or self._closed:
            raise LedgerClosedError(
                f"ledger {self.ledger_id} is closed for writing", context={"ledger": self.ledger_id}
            )

    # --- adding ---------------------------------------------------------------------------------

    async def add(self, payload: bytes) -> int:
        """Add an entry and wait until it is confirmed; returns its entry id."""
        return await (await self.add_async(payload))

    async def add_async(self, payload: bytes) -> asyncio.Future[int]:
        """Queue an entry (waiting while this ledger's pending limits are reached); the returned
        future completes with its entry id once it is confirmed."""
        self._check_size(len(payload))
        self._check_writable()
        await self._wait_for_space(len(payload))
        self._check_writable()
        return self._add_now(payload)

    def add_nowait(self, payload: bytes) -> asyncio.Future[int] | None:
        """:meth:`add_async` without waiting: None (nothing queued) while this ledger's pending
        limits are reached, when the caller must await :meth:`add_async` instead. A writer
        that keeps up spends no task on an entry this way."""
        self._check_size(len(payload))
        self._check_writable()
        if self._entries and self._no_room_for(len(payload)):
            return None
        return self._add_now(payload)

    def _add_now(self, payload: bytes) -> asyncio.Future[int]:
        entry_id = self._next_entry_id
        self._next_entry_id += 1
        lac = self._tracker.last_add_confirmed
        add = AddEntry(
            self.ledger_id,
            entry_id,
            lac,
            payload,
            entry_checksum(self.ledger_id, entry_id, lac, payload),
            self._recovery,
        )
        return self._start(add)

    def recover_entry(
        self, entry_id: int, last_add_confirmed: int, payload: bytes, crc32c: int
    ) -> asyncio.Future[int]:
        """Recovery only: re-add an entry found on some replica, exactly as it was written."""
        if not self._recovery:
            raise LedgerClosedError("only a recovery handle re-adds entries")
        if entry_id != self._next_entry_id:
            raise ValueError(f"recovery re-adds entries in order: expected {self._next_entry_id}")
        self._check_writable()
        self._next_entry_id += 1
        return self._start(
            AddEntry(self.ledger_id, entry_id, last_add_confirmed, payload, crc32c, recovery=True)
        )

    def _check_size(self, size: int) -> None:
        if size > MAX_ENTRY_BYTES:
            raise EntryTooLargeError(
                f"an entry of {size:,} bytes is over the {MAX_ENTRY_BYTES:,}-byte limit",
                context={"size": size, "limit": MAX_ENTRY_BYTES},
            )

    async def _wait_for_space(self, size: int) -> None:
        while self._entries and self._no_room_for(size):
            self._space.clear()
            await self._space.wait()
            self._check_writable()

    def _no_room_for(self, size: int) -> bool:
        config = self._client.config
        return (
            len(self._entries) >= config.max_pending_adds
            or self._pending_bytes + size > config.max_pending_bytes
        )

    def _start(self, add: AddEntry) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        write_set = self.metadata.write_set(add.entry_id)
        self._tracker.track(add.entry_id, write_set)
        self._entries[add.entry_id] = _Entry(add, future)
        self._pending_bytes += len(add.payload)
        for bookie in write_set:
            if bookie not in self._failed:
                self._outbox(bookie).push(add.entry_id)
        return future

    def _outbox(self, bookie: str) -> _Outbox:
        outbox = self._outboxes.get(bookie)
        if outbox is None:
            outbox = self._outboxes[bookie] = _Outbox(self, bookie)
        return outbox

    def _send(self, bookie: str, entry_ids: list[int]) -> None:
        adds = [
            self._entries[e].add
            for e in entry_ids
            if e in self._entries and bookie in self._tracker.write_set(e)
        ]
        if not adds:
            return
        # a future and a timer, not a task per call: this runs for every entry on every bookie
        try:
            answer = self._client.pool.client(bookie).add_entries_nowait(adds)
        except MagnetarError as e:
            self._bookie_failed(bookie, e)
            return
        timeout = self._client.config.add_timeout_ms / 1000
        timer = asyncio.get_running_loop().call_later(timeout, answer.cancel)
        self._sends.add(answer)
        answer.add_done_callback(partial(self._answered, bookie, adds, timer, timeout))

    def _answered(
        self,
        bookie: str,
        adds: list[AddEntry],
        timer: asyncio.TimerHandle,
        timeout: float,
        answer: asyncio.Future[list[AddFailure]],
    ) -> None:
        timer.cancel()
        self._sends.discard(answer)
        if self._closed:
            return
        if answer.cancelled():
            self._bookie_failed(
                bookie, BookieUnavailableError(f"bookie {bookie} did not answer in {timeout:g} s")
            )
            return
        error = answer.exception()
        if error is not None:
            if not isinstance(error, MagnetarError):
                error = BookieUnavailableError(
                    f"adding to bookie {bookie} failed: {error!r}", context={"bookie": bookie}
                )
            self._bookie_failed(bookie, error)
            return
        refused = {f.entry_id: f.error for f in answer.result()}
        for add in adds:
            error = refused.get(add.entry_id)
            if error is None:
                self._acked(add.entry_id, bookie)
            elif isinstance(error, LedgerFencedError):
                self._fail(
                    LedgerFencedError(
                        f"ledger {self.ledger_id} was fenced (on bookie {bookie}): another client"
                        " is recovering it; this writer has lost it",
                        context={"ledger": self.ledger_id, "bookie": bookie},
                    )
                )
                return
            else:
                self._bookie_failed(bookie, error)

    def _acked(self, entry_id: int, bookie: str) -> None:
        if self._tracker.ack(entry_id, bookie) and (
            self._changing is None or self._changing.done()
        ):
            self._complete_in_order()

    def _complete_in_order(self) -> None:
        for entry_id in self._tracker.advance():
            entry = self._entries.pop(entry_id)
            size = len(entry.add.payload)
            self._pending_bytes -= size
            self._length += size
            if not entry.future.done():
                entry.future.set_result(entry_id)
        self._space.set()

    # --- ensemble changes ------------------------------------------------------------------------

    def _bookie_failed(self, bookie: str, error: MagnetarError) -> None:
        if self._error is not None or bookie in self._failed:
            return
        if bookie not in self.metadata.last_segment.bookies:
            return  # already replaced; a late answer from it
        log.warning(
            "ledger_bookie_failed", ledger=self.ledger_id, bookie=bookie, error=error.message
        )
        record = self._client.view.bookies.get(bookie)
        self._failed[bookie] = record.address if record else ""
        self._client.quarantine(bookie)
        if self._changing is None or self._changing.done():
            self._changing = asyncio.ensure_future(self._change_ensemble())

    def _still_failed(self) -> set[str]:
        still = set()
        for bookie, address in self._failed.items():
            record = self._client.view.bookies.get(bookie)
            if record is None or record.address == address or not record.writable:
                still.add(bookie)
        return still

    def _may_write(self, metadata: LedgerMetadata) -> bool:
        wanted = LedgerState.IN_RECOVERY if self._recovery else LedgerState.OPEN
        return metadata.state is wanted

    async def _change_ensemble(self) -> None:
        config = self._client.config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.ensemble_change_timeout_ms / 1000
        try:
            while self._error is None:
                last = self.metadata.last_segment
                failed = [b for b in last.bookies if b in self._failed]
                if not failed:
                    break
                first = max(self._tracker.last_add_confirmed + 1, last.first_entry_id)
                bookies = list(last.bookies)
                try:
                    for bookie in failed:
                        position = bookies.index(bookie)
                        bookies[position] = choose_replacement(
                            self._client.view.candidates(),
                            bookies,
                            position,
                            self.metadata.write_quorum,
                            exclude=self._still_failed() | self._client.unreachable(),
                        )
                except NotEnoughBookiesError as e:
                    if await self._client.release_answering(skip=frozenset(self._failed)):
                        continue  # a quarantined bookie answers: it may replace
                    if config.under_striped_ledgers and not self._recovery:
                        self._no_replacement(failed, e)
                        return
                    if loop.time() >= deadline:
                        self._fail(e)
                        return
                    await self._client.view.wait_change(1.0)
                    continue
                try:
                    stored = await self._client.ledgers.write(
                        self.metadata.with_segment(first, bookies)
                    )
                except (BadVersionError, NoSuchKeyError):
                    if not await self._rebase():
                        return
                    continue
                except MetadataError as e:
                    if loop.time() >= deadline:
                        self._fail(e)
                        return
                    await asyncio.sleep(0.2)
                    continue
                self._apply_change(
                    last.bookies, stored, first, [last.bookies.index(b) for b in failed]
                )
        finally:
            if self._error is None:
                self._complete_in_order()

    def _no_replacement(self, failed: list[str], error: NotEnoughBookiesError) -> None:
        """Stop writing: confirm what has its acks on the current ensemble, fail the rest."""
        self._complete_in_order()  # no new segment is coming: acks on this one stand
        writable = sorted(
            c.bookie_id
            for c in self._client.view.candidates()
            if c.writable and c.bookie_id not in self._client.unreachable()
        )
        self._fail(
            EnsembleUnrepairableError(
                f"ledger {self.ledger_id}: no writable bookie can replace {', '.join(failed)}"
                f" ({error.message}); writable now: {', '.join(writable) or 'none'}. The writer"
                f" stops at entry {self.last_add_confirmed} so that writing can go on in a new"
                " ledger",
                context={"ledger": self.ledger_id, "failed": ",".join(failed)},
            )
        )

    async def _rebase(self) -> bool:
        """The metadata changed under us: keep going on the stored version if we still own it."""
        try:
            current = await self._client.ledgers.read(self.ledger_id)
        except MagnetarError as e:
            self._fail(e)
            return False
        if not self._may_write(current):
            self._fail(
                LedgerFencedError(
                    f"ledger {self.ledger_id} is {current.state.name.lower()} in the metadata:"
                    " another client is recovering or closed it; this writer has lost it",
                    context={"ledger": self.ledger_id},
                )
            )
            return False
        if current.last_segment != self.metadata.last_segment:
            self._fail(
                LedgerMetadataConflictError(
                    f"ledger {self.ledger_id}'s current ensemble was changed by someone else",
                    context={"ledger": self.ledger_id},
                )
            )
            return False
        self.metadata = current  # e.g. autorecovery replaced a bookie of an older segment
        return True

    def _apply_change(
        self, old: tuple[str, ...], stored: LedgerMetadata, first: int, positions: list[int]
    ) -> None:
        self.metadata = stored
        self.ensemble_changes += 1
        new = stored.last_segment.bookies
        for position in positions:
            old_bookie, new_bookie = old[position], new[position]
            self._failed.pop(old_bookie, None)
            if old_bookie != new_bookie:
                resend = self._tracker.replace_bookie(first, old_bookie, new_bookie)
            else:  # it came back (restarted, data kept): send it what it has not acknowledged
                resend = [e for e in self._tracker.unacked_by(old_bookie) if e >= first]
            for entry_id in resend:
                self._outbox(new_bookie).push(entry_id)
        log.info(
            "ensemble_changed",
            ledger=self.ledger_id,
            first_entry=first,
            old=list(old),
            new=list(new),
        )

    # --- failing and closing ---------------------------------------------------------------------

    def _fail(self, error: MagnetarError) -> None:
        if self._error is not None:
            return
        self._error = error
        self._client.under_striped_open.discard(self.ledger_id)
        log.warning("ledger_writer_failed", ledger=self.ledger_id, error=error.message)
        for entry in self._entries.values():
            if not entry.future.done():
                entry.future.set_exception(error)
        self._entries.clear()
        self._outboxes.clear()  # see close()
        self._space.set()

    async def close(self) -> LedgerMetadata:
        """Wait for pending adds, then record the ledger's end (last entry, length) and close it.

        Raises the writer's error if it lost the ledger (fenced) before closing.
        """
        if self._closed:
            return self.metadata
        self._closing = True
        pending = [e.future for e in self._entries.values()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._changing is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._changing
        if self._error is not None:
            raise self._error
        lac = self._tracker.last_add_confirmed
        while True:
            closing = replace(
                self.metadata, state=LedgerState.CLOSED, last_entry_id=lac, length=self._length
            )
            try:
                self.metadata = await self._client.ledgers.write(closing)
                break
            except (BadVersionError, NoSuchKeyError):
                current = await self._client.ledgers.read(self.ledger_id)
                if current.closed and current.last_entry_id >= lac:
                    # recovered and closed by someone else, with everything we confirmed
                    self.metadata = current
                    break
                if (
                    not self._may_write(current)
                    or current.last_segment != self.metadata.last_segment
                ):
                    self._fail(
                        LedgerFencedError(
                            f"ledger {self.ledger_id} was taken over before it could be closed",
                            context={"ledger": self.ledger_id},
                        )
                    )
                    raise self._error from None  # type: ignore[misc]
                self.metadata = current
        self._closed = True
        self._client.under_striped_open.discard(self.ledger_id)
        for answer in list(self._sends):
            answer.cancel()
        # each outbox refers back to this handle: a cycle, which only the cyclic collector
        # would free, and the servers' tuning (magnetar/common/server/gc_tuning.py) runs it rarely
        self._outboxes.clear()
        log.info("ledger_closed", ledger=self.ledger_id, last_entry=lac, length=self._length)
        return self.metadata

    async def close_confirmed(self) -> LedgerMetadata:
        """After this writer failed without losing the ledger (a bookie with no replacement, a
        timeout): close the ledger at the last entry it confirmed, without recovery. Adds past
        that were never confirmed, so no reader has seen them; the closed end hides whatever
        copies of them bookies hold.

        Returns the closed metadata (another client's, if one recovered and closed the ledger
        first: its end is then at or past ours). Raises :class:`LedgerFencedError` if another
        client is recovering the ledger.
        """
        if self._closed:
            return self.metadata
        if self._error is None:
            self._fail(LedgerClosedError(f"ledger {self.ledger_id} is being closed"))
        self._closing = True
        if self._changing is not None and not self._changing.done():
            self._changing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._changing
        for answer in list(self._sends):
            answer.cancel()
        lac = self._tracker.last_add_confirmed
        metadata = self.metadata
        while True:
            if metadata.closed:
                if metadata.last_entry_id < lac:
                    raise LedgerFencedError(
                        f"ledger {self.ledger_id} was closed at entry {metadata.last_entry_id},"
                        f" before entry {lac} this writer confirmed",
                        context={"ledger": self.ledger_id},
                    )
                break
            if not self._may_write(metadata):
                raise LedgerFencedError(
                    f"ledger {self.ledger_id} is {metadata.state.name.lower()}: another client"
                    " is recovering it",
                    context={"ledger": self.ledger_id},
                )
            closing = replace(
                metadata, state=LedgerState.CLOSED, last_entry_id=lac, length=self._length
            )
            try:
                metadata = await self._client.ledgers.write(closing)
                break
            except (BadVersionError, NoSuchKeyError):
                metadata = await self._client.ledgers.read(self.ledger_id)
        self.metadata = metadata
        self._closed = True
        log.info(
            "ledger_closed_at_confirmed",
            ledger=self.ledger_id,
            last_entry=metadata.last_entry_id,
            length=metadata.length,
            error=self._error.message if self._error else None,
        )
        return metadata
