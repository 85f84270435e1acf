"""A cursor: how far one subscription (or reader) has read and acknowledged a managed ledger.

A cursor has a **read position** (the next entry :meth:`ManagedCursor.read` returns) and an
acknowledgement state: a **mark-delete** position (everything at or before it is acknowledged)
plus individually acknowledged ranges above it (:class:`~.ack_ranges.AckRanges`). A durable
cursor persists the acknowledgement state, at most every ``cursor_persist_interval_ms``, on
:meth:`flush` and on close; an ack whose sender waits for its receipt (:meth:`wait_persisted`)
is persisted at once instead, one write at a time, each carrying every change made meanwhile
(group commit), so receipts come within a metadata write and the writes stay few. A new owner
of the managed ledger loads it and redelivers whatever was not acknowledged in what was
persisted.

**Complete ack state.** Every range is persisted, and so are the acknowledged messages of
partly acknowledged batch entries (:meth:`ManagedCursor.ack_indexes`), so a new owner redelivers
exactly what was not acknowledged in what was persisted, never an acknowledged message en masse
(Pulsar drops the ranges over its limit and redelivers them after a restart). What keeps the
record small is the subscription: at ``max_inline_ack_ranges`` ranges
(:attr:`ManagedCursor.ack_ranges_over_limit`, logged once) it stops dispatching new entries
until acknowledgements fill holes, and each ack can add at most one range.

**Redelivery counts** (:class:`~.redelivery_counts.RedeliveryCounts`) are part of the persisted
state: a raised count is a change like an ack, and :meth:`wait_counts_persisted` lets the
subscription hold a redelivery back until the count is written. Entries held aside on purpose
(delayed delivery; :attr:`ManagedCursor.parked_entries`) leave holes that do not count towards
``max_inline_ack_ranges``. The ranges are persisted packed (about 4 bytes each), so even
100,000 holes make a record well within a metadata write.

**Offsets.** ``mark_delete_offset`` is the offset of the last message covered by mark-delete.
The cursor learns entries' offsets from the entries it reads, and the managed ledger knows the
offsets at ledger ends and of cached entries. When mark-delete lands on an entry known in none
of those ways (a cumulative ack of an entry this cursor never read), the value is a lower bound
until the next flush, which reads that entry to make it exact. ``backlog_messages`` subtracts
the messages of individually acknowledged entries whose sizes the cursor knows (those it read
itself, up to :data:`MAX_TRACKED_ENTRIES` above mark-delete); others are counted as backlog.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from broker.managed_ledger.ack_ranges import AckRanges
from broker.managed_ledger.persistence import (
    StoredCursor,
    decode_delay_bucket,
    encode_cursor,
    encode_delay_bucket,
)
from broker.managed_ledger.redelivery_counts import RedeliveryCounts
from broker.managed_ledger.types import (
    DelayedEntry,
    Entry,
    Position,
    check_position,
)
from magnetar.common.clock import Clock
from magnetar.common.errors import (
    InvalidArgumentError,
    MagnetarError,
    ManagedLedgerFencedError,
)
from metadata import layout

if TYPE_CHECKING:
    from broker.managed_ledger.ports import CursorHost

log = structlog.get_logger("magnetar.managed_ledger.cursor")

MAX_TRACKED_ENTRIES = 100_000
"""Entries above mark-delete whose offsets a cursor remembers (for offsets and backlog)."""

_BUCKET_NAME = re.compile(r"[0-9a-z-]{1,64}")


@dataclass(slots=True)
class _Known:
    first_offset: int
    num_messages: int
    acked: bool = False


class ManagedCursor:
    """A read position and an acknowledgement state. Obtain from
    :meth:`ManagedLedger.open_cursor` (durable) or :meth:`ManagedLedger.open_non_durable_cursor`."""

    def __init__(
        self,
        host: CursorHost,
        name: str,
        *,
        durable: bool,
        mark_delete: Position,
        mark_delete_offset: int,
        read_position: Position,
        clock: Clock,
        ranges: Iterable[tuple[Position, Position]] = (),
        batch_acks: Iterable[tuple[Position, int, frozenset[int]]] = (),
        subscription_type: int = 0,
        redelivery_counts: Iterable[tuple[Position, int]] = (),
        version: int = 0,
        mark_delete_offset_exact: bool = True,
    ) -> None:
        self.name = name
        self.durable = durable
        self._host = host
        self._clock = clock
        self._acks = AckRanges(host.next_position, mark_delete, ranges)
        self._mark_delete_offset = mark_delete_offset
        # folding restored ranges into mark-delete moved it past the entry whose offset we know;
        # a cursor may also start from a lower bound, until an entry is read
        self._mark_delete_offset_exact = (
            mark_delete_offset_exact and self._acks.mark_delete == mark_delete
        )
        self._read_position = max(read_position, host.next_position(self._acks.mark_delete))
        self.version = version
        """Metadata version of the persisted cursor (0: not persisted)."""
        self._changes = 0
        self._persisted_changes = 0
        self._persist_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._last_persist = -math.inf
        self._last_persist_failed = False
        self._urgent = asyncio.Event()
        """Set when someone waits for a persist: cut the interval short."""
        self._persist_task: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        self._known: dict[Position, _Known] = {}
        self._known_order: list[Position] = []  # a heap, for forgetting what mark-delete passed
        self._acked_messages = 0
        self._over_limit_logged = False
        self._batch_acks: dict[Position, tuple[int, set[int]]] = {
            position: (size, set(indexes))
            for position, size, indexes in batch_acks
            if not self._acks.contains(position)
        }
        self._subscription_type = subscription_type
        self._counts_changed_at = 0
        """The change that last altered a redelivery count (see :meth:`wait_counts_persisted`)."""
        self.redelivery_counts = RedeliveryCounts(
            host.config.max_persisted_redelivery_counts,
            (
                (position, count)
                for position, count in redelivery_counts
                if not self._acks.contains(position)
            ),
            on_change=self._counts_changed,
        )
        """Redelivery counts of unacknowledged entries, persisted with the ack state; the
        subscription's dispatcher raises them."""
        self.parked_entries = 0
        """Unacknowledged entries the subscription holds back on purpose (delayed delivery):
        the holes they leave do not count towards ``max_inline_ack_ranges``."""
        self._skip: AckRanges | None = None
        """Entries :meth:`read` jumps over as over acknowledged ones (see :meth:`skip_on_read`)."""
        self._log = log.bind(managed_ledger=host.name, cursor=name)

    # --- state --------------------------------------------------------------------------------

    @property
    def mark_delete(self) -> Position:
        """Everything at or before this position is acknowledged."""
        return self._acks.mark_delete

    @property
    def mark_delete_offset(self) -> int:
        """Offset of the last message covered by mark-delete (-1: none); see the module doc."""
        return self._mark_delete_offset

    @property
    def read_position(self) -> Position:
        """The next entry :meth:`read` returns (acknowledged entries are skipped)."""
        return self._read_position

    @property
    def has_more(self) -> bool:
        """Whether confirmed entries exist at or after the read position."""
        return self._read_position <= self._host.last_confirmed

    @property
    def ack_hole_ranges(self) -> int:
        """Individually acknowledged ranges above mark-delete (the holes between them)."""
        return len(self._acks)

    @property
    def ack_ranges_over_limit(self) -> bool:
        """At ``max_inline_ack_ranges`` ranges or more, not counting one per parked (delayed)
        entry: the subscription dispatches no new entries until acknowledgements fill holes
        (every range is still persisted)."""
        return len(self._acks) - self.parked_entries >= self._host.config.max_inline_ack_ranges

    @property
    def ack_ranges(self) -> list[tuple[Position, Position]]:
        return self._acks.ranges

    @property
    def subscription_type(self) -> int:
        """The subscription type recorded with the cursor (0: none)."""
        return self._subscription_type

    def record_subscription_type(self, subscription_type: int) -> None:
        """Record the subscription's type with the cursor (persisted with its next change)."""
        if subscription_type != self._subscription_type:
            self._subscription_type = subscription_type
            self._changes += 1
            self._schedule_persist()

    def acked_indexes(self, position: Position) -> frozenset[int]:
        """Acknowledged messages of a partly acknowledged entry (empty: none, or the entry is
        acknowledged as a whole; see :meth:`is_acked`)."""
        found = self._batch_acks.get(position)
        return frozenset(found[1]) if found is not None else frozenset()

    @property
    def partly_acked_entries(self) -> int:
        return len(self._batch_acks)

    @property
    def backlog_messages(self) -> int:
        """Confirmed messages not acknowledged (best effort; see the module doc)."""
        unacked = self._host.confirmed_next_offset - (self._mark_delete_offset + 1)
        return max(0, unacked - self._acked_messages)

    @property
    def dirty(self) -> bool:
        """Changes not persisted yet."""
        return self._changes != self._persisted_changes

    def is_acked(self, position: Position) -> bool:
        return self._acks.contains(check_position(position))

    # --- reading ------------------------------------------------------------------------------

    async def read(self, *, max_entries: int, max_bytes: int) -> list[Entry]:
        """Entries from the read position on, skipping acknowledged ones; advances the read
        position past what was read, and only past that (a read that fails after some entries
        were found returns those). Limits as :meth:`ManagedLedger.read`."""
        found: list[Entry] = []
        size = 0
        while len(found) < max_entries and (size < max_bytes or not found):
            # jump over acknowledged ranges rather than read them (a new owner reading past
            # many holes, such as entries held for delayed delivery, reads mostly the holes)
            self._read_position = self._acks.first_unacked_from(self._read_position)
            run = max_entries - len(found)
            skip = self._skip
            if skip is not None:
                self._read_position, run = self._skipped_from(skip, run)
            if not self.has_more:
                break
            try:
                entries = await self._host.read(
                    self._read_position, max_entries=run, max_bytes=max(1, max_bytes - size)
                )
            except MagnetarError:
                if not found:
                    raise
                # what was read stands, and the read position is right after it: the run that
                # failed is read next time. Raising would drop what was read with the read
                # position already past it: entries no consumer would be given until a rewind
                break
            if not entries:
                break
            self._read_position = self._host.next_position(entries[-1].position)
            for entry in entries:
                if self._acks.contains(entry.position) or (
                    skip is not None and skip.contains(entry.position)
                ):
                    continue
                self._remember(entry)
                found.append(entry)
                size += len(entry.payload)
        return found

    def _skipped_from(self, skip: AckRanges, run: int) -> tuple[Position, int]:
        """The read position moved past entries to skip (and acknowledged ones after them),
        and how many entries to read from there before the next entry to skip."""
        position = self._read_position
        while True:
            moved = self._acks.first_unacked_from(skip.first_unacked_from(position))
            if moved == position:
                break
            position = moved
        following = skip.next_range_start(position)
        if following is None:
            self._skip = None  # read past every entry to skip
        elif following.ledger_id == position.ledger_id:
            run = max(1, min(run, following.entry_id - position.entry_id))
        return position, run

    def skip_on_read(self, positions: Iterable[Position]) -> None:
        """Make :meth:`read` jump over these entries as over acknowledged ones, without
        acknowledging them: a subscription that loaded entries from its delay index holds them
        aside already and must not read them again. Until the next :meth:`rewind` or
        :meth:`reset`.

        The entries to skip and the ranges acknowledged now are merged into one set of ranges,
        so that a read jumps over a long stretch of both (delayed entries between acknowledged
        ones, say) at once; an entry acknowledged later is jumped over by the acknowledgement
        state itself."""
        merged: list[list[Position]] = []
        singles = ((p, p) for p in positions if not self._acks.contains(p))
        for start, end in sorted([*singles, *self._acks.ranges]):
            last = merged[-1] if merged else None
            if last is not None and (
                start <= last[1]
                or (start.ledger_id == last[1].ledger_id and start.entry_id == last[1].entry_id + 1)
            ):
                last[1] = max(last[1], end)
            else:
                merged.append([start, end])
        self._skip = (
            AckRanges(
                self._host.next_position,
                self._acks.mark_delete,
                ((start, end) for start, end in merged),
            )
            if merged
            else None
        )

    def _remember(self, entry: Entry) -> None:
        if entry.position in self._known or len(self._known) >= MAX_TRACKED_ENTRIES:
            return
        self._known[entry.position] = _Known(entry.first_offset, entry.num_messages)
        heapq.heappush(self._known_order, entry.position)

    def messages_in(self, position: Position) -> int | None:
        """Messages in the entry at ``position``, if this cursor read it and remembers it."""
        known = self._known.get(position)
        return None if known is None else known.num_messages

    def rewind(self) -> None:
        """Read again from the first unacknowledged entry (redeliver what is not acked)."""
        self._read_position = self._host.next_position(self._acks.mark_delete)
        self._skip = None

    def seek(self, position: Position) -> None:
        """Move the read position only; acknowledgements stay."""
        self._read_position = check_position(position)

    async def reset(self, position: Position) -> None:
        """Start over at ``position``: everything before it counts as acknowledged, nothing after
        it does, reads go from there; persisted at once."""
        position = check_position(position)
        mark_delete, offset, read_position = await self._host.start_state(position)
        self._acks.reset(mark_delete)
        self._batch_acks.clear()
        self.redelivery_counts.clear()
        self._mark_delete_offset = offset
        self._mark_delete_offset_exact = True
        self._known.clear()
        self._known_order.clear()
        self._acked_messages = 0
        self._read_position = read_position
        self._skip = None
        self._changes += 1
        self._log.info("cursor_reset", mark_delete=tuple(mark_delete), offset=offset)
        await self.flush()
        await self.clear_delay_index()
        self._host.cursor_moved(mark_delete, durable=self.durable)

    # --- acknowledging ------------------------------------------------------------------------

    def ack(self, positions: Iterable[Position]) -> None:
        """Acknowledge entries individually; mark-delete advances over the contiguous ones.

        Entries at or before mark-delete are ignored. Raises :class:`InvalidArgumentError`,
        acknowledging nothing, if any position is not a confirmed entry.
        """
        if isinstance(positions, tuple) and len(positions) == 2 and isinstance(positions[0], int):
            raise InvalidArgumentError(
                f"ack() takes an iterable of positions, got the single position {positions!r}"
            )
        checked = [self._host.check_ackable(p) for p in positions]
        before = self._acks.mark_delete
        changed = False
        for position in checked:
            if position <= self._acks.mark_delete or position < self._host.first_position:
                continue
            if self._acks.add(position):
                changed = True
                self._batch_acks.pop(position, None)
                self.redelivery_counts.discard(position)
                known = self._known.get(position)
                if known is not None and not known.acked:
                    known.acked = True
                    self._acked_messages += known.num_messages
        if changed:
            self._changed(before)

    def ack_indexes(self, position: Position, indexes: Iterable[int], batch_size: int) -> bool:
        """Acknowledge some messages of an entry of ``batch_size`` messages; once all of them
        are, the entry is acknowledged as a whole. Returns whether the entry is now
        acknowledged. Raises :class:`InvalidArgumentError` for a position that is not a
        confirmed entry or indexes outside the batch."""
        checked = self._host.check_ackable(position)
        wanted = set(indexes)
        if batch_size < 1 or any(not 0 <= i < batch_size for i in wanted):
            raise InvalidArgumentError(
                f"batch indexes {sorted(wanted)} are not all within an entry of {batch_size}"
                f" messages at {tuple(checked)}",
                context={"position": tuple(checked), "batch_size": batch_size},
            )
        if self._acks.contains(checked) or checked < self._host.first_position:
            return True
        size, acked = self._batch_acks.get(checked, (batch_size, set()))
        acked |= wanted
        if len(acked) >= size:
            self._batch_acks.pop(checked, None)
            self.ack([checked])
            return True
        self._batch_acks[checked] = (size, acked)
        self._changes += 1
        self._schedule_persist()
        return False

    def ack_cumulative(self, position: Position) -> None:
        """Acknowledge every entry up to and including ``position``."""
        checked = self._host.check_ackable(position)
        before = self._acks.mark_delete
        if self._acks.ack_cumulative(checked):
            self._changed(before)

    def expire_before(self, position: Position) -> bool:
        """Acknowledge every entry before ``position`` (message TTL); whether mark-delete
        moved."""
        mark_delete, _, _ = self._host.start_hint(check_position(position))
        if mark_delete <= self._acks.mark_delete:
            return False
        self.ack_cumulative(mark_delete)
        return True

    def _changed(self, before: Position) -> None:
        mark_delete = self._acks.mark_delete
        if mark_delete != before:
            known = self._known.get(mark_delete)
            if known is not None:
                self._mark_delete_offset = known.first_offset + known.num_messages - 1
                self._mark_delete_offset_exact = True
            else:
                hint = self._host.offset_hint(mark_delete)
                if hint is not None:
                    self._mark_delete_offset = hint
                    self._mark_delete_offset_exact = True
                else:  # keep the old value: a lower bound until flush() reads the entry
                    self._mark_delete_offset_exact = False
            self._forget_through(mark_delete)
            self.redelivery_counts.forget_through(mark_delete)
            if self._batch_acks:
                for position in [p for p in self._batch_acks if p <= mark_delete]:
                    del self._batch_acks[position]
            if self._read_position <= mark_delete:
                self._read_position = self._host.next_position(mark_delete)
            self._host.cursor_moved(mark_delete, durable=self.durable)
        self._changes += 1
        if self.ack_ranges_over_limit and not self._over_limit_logged:
            self._over_limit_logged = True
            self._log.warning(
                "cursor_ack_ranges_over_limit",
                ranges=len(self._acks),
                limit=self._host.config.max_inline_ack_ranges,
            )
        elif not self.ack_ranges_over_limit:
            self._over_limit_logged = False
        self._schedule_persist()

    def _forget_through(self, mark_delete: Position) -> None:
        while self._known_order and self._known_order[0] <= mark_delete:
            position = heapq.heappop(self._known_order)
            known = self._known.pop(position, None)
            if known is not None and known.acked:
                self._acked_messages -= known.num_messages

    # --- persisting ---------------------------------------------------------------------------

    def stored(self) -> StoredCursor:
        """The state as persisted: every range and every partly acknowledged entry."""
        return StoredCursor(
            mark_delete=self._acks.mark_delete,
            mark_delete_offset=self._mark_delete_offset,
            acked_ranges=tuple(self._acks.ranges),
            last_active_ms=self._clock.time_ms(),
            batch_acks=tuple(
                (position, size, frozenset(acked))
                for position, (size, acked) in sorted(self._batch_acks.items())
            ),
            subscription_type=self._subscription_type,
            redelivery_counts=tuple(self.redelivery_counts.items()),
        )

    def _counts_changed(self, raised: bool) -> None:
        self._changes += 1
        if raised:  # a count that went away may come back after a crash: that is harmless
            self._counts_changed_at = self._changes
        self._schedule_persist()

    @property
    def counts_persisted(self) -> bool:
        """Every redelivery count change is persisted (always true for a non-durable cursor)."""
        return not self.durable or self._persisted_changes >= self._counts_changed_at

    async def wait_counts_persisted(self) -> None:
        """Return once every redelivery count change made so far is persisted (at once, as an
        ack receipt is): a subscription waits for this before it delivers again, so a new owner
        after a crash never hands out an entry with a count lower than one already used."""
        await self.wait_persisted(self._counts_changed_at)

    def _schedule_persist(self) -> None:
        if not self.durable or (self._persist_task is not None and not self._persist_task.done()):
            return
        self._persist_task = asyncio.ensure_future(self._persist_later())

    async def _persist_later(self) -> None:
        interval = self._host.config.cursor_persist_interval_ms / 1000
        delay = self._last_persist + interval - self._clock.monotonic()
        if delay > 0 and (self._last_persist_failed or not self._persist_waiters):
            # wait out the interval, unless a receipt waiter arrives (after a failed write,
            # waiters wait too: no tight retry loop against a metadata store in trouble)
            self._urgent.clear()
            sleeper = asyncio.ensure_future(self._clock.sleep(delay))
            woken = asyncio.ensure_future(self._urgent.wait())
            try:
                if self._last_persist_failed:
                    await sleeper
                else:
                    await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                woken.cancel()
        try:
            await self.flush()
            self._last_persist_failed = False
        except ManagedLedgerFencedError:
            return
        except MagnetarError as e:
            self._log.warning("cursor_persist_failed", error=e.message)
            self._last_persist = self._clock.monotonic()  # try again after an interval
            self._last_persist_failed = True
        self._persist_task = None
        if self.dirty and not self._host.closed:
            self._schedule_persist()

    @property
    def persist_interval_s(self) -> float:
        return self._host.config.cursor_persist_interval_ms / 1000

    @property
    def changes(self) -> int:
        """How many changes the cursor has had (a mark for :meth:`wait_persisted`)."""
        return self._changes

    async def wait_persisted(self, changes: int) -> None:
        """Return once the state after ``changes`` changes is persisted: at once (the next
        write, or the one after the write under way), or after ``cursor_persist_interval_ms``
        when the last write failed; raises :class:`ManagedLedgerFencedError` if another owner
        took over first."""
        if not self.durable or self._persisted_changes >= changes:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._persist_waiters.append((changes, waiter))
        self._urgent.set()
        self._schedule_persist()
        await waiter

    def _release_waiters(self, error: MagnetarError | None = None) -> None:
        waiting, self._persist_waiters = self._persist_waiters, []
        for changes, waiter in waiting:
            if waiter.done():
                continue
            if error is not None:
                waiter.set_exception(error)
                waiter.exception()  # a waiter that gave up must not warn
            elif changes <= self._persisted_changes:
                waiter.set_result(None)
            else:
                self._persist_waiters.append((changes, waiter))

    async def flush(self) -> None:
        """Persist now if anything changed (a lost compare-and-swap fences the managed ledger:
        :class:`ManagedLedgerFencedError`)."""
        if not self.durable:
            return
        async with self._flush_lock:
            if not self.dirty:
                return
            if not self._mark_delete_offset_exact:
                await self._resolve_mark_delete_offset()
            changes = self._changes
            stored = self.stored()
            try:
                self.version = await self._host.write_cursor(self.name, stored, self.version)
            except ManagedLedgerFencedError as e:
                self._release_waiters(e)
                raise
            self._persisted_changes = max(self._persisted_changes, changes)
            self._release_waiters()
            self._last_persist = self._clock.monotonic()
            self._log.debug(
                "cursor_persisted",
                mark_delete=tuple(stored.mark_delete),
                ranges=len(stored.acked_ranges),
                bytes=len(encode_cursor(stored)),
            )

    async def _resolve_mark_delete_offset(self) -> None:
        mark_delete = self._acks.mark_delete
        offset = await self._host.offset_through(mark_delete)
        if self._acks.mark_delete == mark_delete:
            self._mark_delete_offset = offset
            self._mark_delete_offset_exact = True

    # --- the subscription's delay index -------------------------------------------------------

    def _bucket_key(self, bucket: str) -> str:
        if not self.durable:
            raise InvalidArgumentError("a non-durable cursor has no delay index")
        if not isinstance(bucket, str) or not _BUCKET_NAME.fullmatch(bucket):
            raise InvalidArgumentError(
                f"invalid delay index bucket name {bucket!r}: 1 to 64 of 0-9, a-z and '-'",
                context={"bucket": repr(bucket)},
            )
        return layout.managed_ledger_delay_bucket(self._host.name, self.name, bucket)

    async def write_delay_bucket(self, bucket: str, entries: Sequence[DelayedEntry]) -> None:
        """Persist a sealed bucket of the subscription's delay index (fenced like the cursor)."""
        await self._host.write_guarded(self._bucket_key(bucket), encode_delay_bucket(entries))

    async def delete_delay_bucket(self, bucket: str) -> None:
        await self._host.write_guarded(self._bucket_key(bucket), None)

    async def load_delay_index(self) -> dict[str, tuple[DelayedEntry, ...]]:
        """The persisted buckets of the delay index, by name (what a new owner holds aside)."""
        if not self.durable:
            return {}
        prefix = layout.managed_ledger_delay_index(self._host.name, self.name)
        buckets: dict[str, tuple[DelayedEntry, ...]] = {}
        for key, value in await self._host.list_records(prefix):
            name = key[len(prefix) :]
            if "/" in name:
                continue
            buckets[name] = decode_delay_bucket(key, value)
        return buckets

    async def clear_delay_index(self) -> int:
        """Delete every bucket of the delay index; how many there were."""
        buckets = await self.delay_bucket_names()
        for name in buckets:
            await self.delete_delay_bucket(name)
        return len(buckets)

    async def delay_bucket_names(self) -> list[str]:
        if not self.durable:
            return []
        prefix = layout.managed_ledger_delay_index(self._host.name, self.name)
        names = [key[len(prefix) :] for key, _ in await self._host.list_records(prefix)]
        return [name for name in names if _BUCKET_NAME.fullmatch(name)]

    async def close(self) -> None:
        """Persist what changed; the cursor stays in its managed ledger."""
        self.cancel_persist()
        await self.flush()

    async def create_persisted(self) -> None:
        """Write the record of a new durable cursor (raises :class:`CursorAlreadyExistsError`
        if someone else created it meanwhile)."""
        self.version = await self._host.write_cursor(self.name, self.stored(), self.version)

    async def delete_persisted(self) -> None:
        """Persist nothing more and delete the record and the delay index (the managed ledger
        deletes this cursor)."""
        await self._stop()
        await self.clear_delay_index()
        self.version = await self._host.write_cursor(self.name, None, self.version)

    async def _stop(self) -> None:
        self.cancel_persist()
        async with self._flush_lock:
            pass  # let a flush in progress finish

    def cancel_persist(self) -> None:
        """Stop the background persist (the managed ledger is closing)."""
        if self._persist_task is not None and self._persist_task is not asyncio.current_task():
            self._persist_task.cancel()
        self._persist_task = None

    def __repr__(self) -> str:
        kind = "durable" if self.durable else "non-durable"
        return (
            f"ManagedCursor({self.name!r}, {kind}, mark_delete={tuple(self.mark_delete)},"
            f" read_position={tuple(self._read_position)}, holes={len(self._acks)})"
        )
