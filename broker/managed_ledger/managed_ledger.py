"""One partition's log: an ordered list of ledgers, written by one owner, read by cursors.

**Writing.** :meth:`ManagedLedger.append` gives each entry the next dense offsets and a publish
time synchronously, queues it, and returns a future. A single pump task hands queued entries, in
order, to the current ledger's write handle, which pipelines them to the bookies. Futures
complete in call order once the entry is confirmed. ``last_confirmed`` moves with them, and
readers never go past it.

**Switching ledgers.** A *roll* (limits of :mod:`.rollover` reached) and a *write failure* run
the same sequence, while appends keep queueing:

1. close the current ledger. Closing waits for its pending adds, so the ledger's end is known
   and every entry in it is confirmed;
2. if that failed because the writer lost a bookie that nothing could replace: close the
   ledger at the last entry the writer confirmed (``close_confirmed``, one metadata write). If
   it failed otherwise (or that close failed): recover the ledger (fence, re-add, close) to
   learn its real last entry. Queued entries at or below it are in the log and complete
   successfully. Those above it go back to the head of the queue unchanged, same bytes and same
   offsets, for the next ledger. Nothing confirmed is lost and nothing is written twice;
3. create a new ledger and compare-and-swap the info (the ledger list) with the version this
   owner last wrote. Only then does the pump send to the new ledger.

Waiting for the old ledger before writing the new one costs one round trip per roll. In return,
a failure of the old ledger can never leave entries of the new ledger ahead of entries that
still need a home.

**Write problems.** While a step of the switch keeps failing (no ledger can be created: fewer
writable bookies than Qw, say), the managed ledger retries it with backoff and keeps the error
as :attr:`ManagedLedger.write_problem`, from when it began, until a new ledger takes writes
again; ``on_write_problem`` hears each change, so the broker can tell producers why their
entries wait.

**Ownership.** A lost compare-and-swap on the info or a cursor, or a bookie answering "fenced",
means another broker opened this managed ledger. It is *fenced* then: ``fenced`` is set, every
queued append fails with :class:`ManagedLedgerFencedError`, and so do later ones. Cursor writes
compare the info's version too, so an old owner cannot overwrite a cursor after a new owner
took over, even before the new owner first writes that cursor.

**Layout.** :class:`ManagedLedger` is the facade: it opens, owns the cursors, closes, and hands
each call to the collaborator whose job it is: :class:`~.writing.Writer` (the queue, the pump,
switching ledgers), :class:`~.metadata_writes.MetadataWrites` (the info, cursor and guarded
compare-and-swaps), :class:`~.reading.EntryReader` (entries from the cache or the bookies),
:class:`~.seeking.Seeker` (positions by offset and time, where cursors start) and
:class:`~.retention.Retention` (trimming and the periodic task). Writer, reader, seeker and
retention import none of one another: they share the :class:`~.state.Lifecycle` and
:class:`~.state.LogState` the facade gives them, write metadata through ``MetadataWrites``, and
reach one another only through callbacks the facade wires (and lets go of at close). A cursor
sees its managed ledger as a :class:`~.ports.CursorHost` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable

import structlog

from broker.managed_ledger.cache import EntryCache
from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.cursor import ManagedCursor
from broker.managed_ledger.ledger_list import LedgerList, LedgerRecord
from broker.managed_ledger.ledger_ops import (
    LEDGER_PROPERTY,
    create_ledger,
    delete_quietly,
    recover_last,
)
from broker.managed_ledger.metadata_writes import MetadataWrites, read_or_create_info
from broker.managed_ledger.persistence import (
    StoredCursor,
    StoredInfo,
    check_cursor_name,
    encode_info,
)
from broker.managed_ledger.ports import LedgerClientApi, LedgerReader, LedgerWriter
from broker.managed_ledger.reading import EntryReader
from broker.managed_ledger.retention import Retention
from broker.managed_ledger.seeking import Seeker
from broker.managed_ledger.state import Lifecycle, LogState, State
from broker.managed_ledger.types import (
    BEFORE_EVERYTHING,
    AppendResult,
    Entry,
    EntryCodec,
    LedgerInfo,
    Position,
    StartAt,
    check_position,
)
from broker.managed_ledger.writing import Writer
from magnetar.common.clock import Clock
from magnetar.common.errors import (
    BadVersionError,
    CursorAlreadyExistsError,
    CursorNotFoundError,
    MagnetarError,
    ManagedLedgerClosedError,
    ManagedLedgerFencedError,
    NoSuchKeyError,
)
from metadata import layout
from metadata.api import MetadataStore

log = structlog.get_logger("magnetar.managed_ledger")

__all__ = ["LEDGER_PROPERTY", "ManagedLedger"]

_PRUNE_WAITERS_AT = 64
"""Entry waiters that were completed by their owner pile up until the next entry; past this
many the finished ones are dropped when another is added."""


class ManagedLedger:
    """A partition's log. Obtain one from :meth:`ManagedLedgerFactory.open`."""

    def __init__(
        self,
        name: str,
        *,
        store: MetadataStore,
        ledger_client: LedgerClientApi,
        codec: EntryCodec,
        config: ManagedLedgerConfig,
        cache: EntryCache,
        clock: Clock,
        info: StoredInfo,
        info_version: int,
        ledgers: list[LedgerRecord],
        handle: LedgerWriter,
        next_offset: int,
        last_publish_time_ms: int,
        last_confirmed: Position,
        on_close: Callable[[ManagedLedger], None] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self._clock = clock
        self._on_close = on_close
        self._log = log.bind(managed_ledger=name)

        self._life = Lifecycle(name, self._log)
        self._life.on_fenced = self._fenced
        self._log_state = LogState(LedgerList(ledgers), last_confirmed, next_offset)
        self._metadata = MetadataWrites(
            name,
            store=store,
            life=self._life,
            log_state=self._log_state,
            info=info,
            info_version=info_version,
        )
        self._reader = EntryReader(
            name,
            life=self._life,
            log_state=self._log_state,
            client=ledger_client,
            codec=codec,
            cache=cache,
        )
        self._seeker = Seeker(
            name,
            life=self._life,
            log_state=self._log_state,
            cache=cache,
            read_one=self._reader.read_one,
        )
        self._writer = Writer(
            name,
            config=config,
            life=self._life,
            log_state=self._log_state,
            metadata=self._metadata,
            client=ledger_client,
            cache=cache,
            clock=clock,
            handle=handle,
            next_offset=next_offset,
            last_publish_time_ms=last_publish_time_ms,
            on_confirmed=functools.partial(self._wake_waiters, None),
            on_new_ledger=self._request_trim,
            on_broken=self._finish_close,
        )
        self._retention = Retention(
            name,
            config=config,
            life=self._life,
            log_state=self._log_state,
            metadata=self._metadata,
            client=ledger_client,
            cache=cache,
            clock=clock,
            marks=self._cursor_marks,
            deleted=self._reader.forget,
            periodically=self._writer.roll_if_due,
        )

        self.fenced = self._life.fenced
        """Set when another owner took this managed ledger; every append fails from then on."""
        self._cursors: dict[str, ManagedCursor] = {}
        self._creating_cursors: dict[str, asyncio.Future[ManagedCursor]] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._close_task: asyncio.Task[None] | None = None

    # --- opening ------------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        name: str,
        *,
        store: MetadataStore,
        ledger_client: LedgerClientApi,
        codec: EntryCodec,
        config: ManagedLedgerConfig,
        cache: EntryCache,
        clock: Clock,
        on_close: Callable[[ManagedLedger], None] | None = None,
    ) -> ManagedLedger:
        """Take ownership: recover the last ledger, start a new one, CAS the info, load cursors.

        A lost compare-and-swap means another broker opened it at the same time: that one
        owns it, and this raises :class:`ManagedLedgerFencedError`.
        """
        key = layout.managed_ledger_info(name)
        info, version = await read_or_create_info(store, name)
        ledgers = [LedgerRecord.of(info_ledger) for info_ledger in info.ledgers]
        dropped: LedgerRecord | None = None
        next_offset = 0
        readers: dict[int, LedgerReader] = {}
        if ledgers:
            last = ledgers[-1]
            reader = await recover_last(ledger_client, codec, name, last)
            next_offset = last.first_offset + last.messages
            if reader is None:
                dropped = ledgers.pop()  # empty: nothing to keep, the new ledger replaces it
            else:
                readers[last.ledger_id] = reader
        last_confirmed = next(
            (ledger.last_position for ledger in reversed(ledgers) if ledger.entries > 0),
            BEFORE_EVERYTHING,
        )
        last_publish = max((ledger.last_publish_time_ms for ledger in ledgers), default=0)

        handle = await create_ledger(ledger_client, config, name)
        ledgers.append(LedgerRecord(handle.ledger_id, next_offset, clock.time_ms()))
        new_info = StoredInfo(
            ledgers=tuple(ledger.info() for ledger in ledgers),
            terminated=info.terminated,
            terminated_position=info.terminated_position,
            properties=info.properties,
        )
        try:
            version = await store.put(key, encode_info(new_info), expected_version=version)
        except (BadVersionError, NoSuchKeyError):
            await delete_quietly(ledger_client, handle.ledger_id, name)
            raise ManagedLedgerFencedError(
                f"managed ledger {name!r} was opened by another owner at the same time",
                context={"name": name},
            ) from None
        except MagnetarError:
            # maybe stored, maybe not: an empty listed ledger that is gone is dropped at the
            # next open, so deleting it is safe either way
            await delete_quietly(ledger_client, handle.ledger_id, name)
            raise
        if dropped is not None:
            await delete_quietly(ledger_client, dropped.ledger_id, name)

        ml = cls(
            name,
            store=store,
            ledger_client=ledger_client,
            codec=codec,
            config=config,
            cache=cache,
            clock=clock,
            info=new_info,
            info_version=version,
            ledgers=ledgers,
            handle=handle,
            next_offset=next_offset,
            last_publish_time_ms=last_publish,
            last_confirmed=last_confirmed,
            on_close=on_close,
        )
        for ledger_id, reader in readers.items():
            ml._reader.keep_handle(ledger_id, reader)
        await ml._load_cursors()
        ml._retention.start()
        ml._log.info(
            "managed_ledger_opened",
            ledgers=len(ledgers),
            current_ledger=handle.ledger_id,
            next_offset=next_offset,
            cursors=len(ml._cursors),
        )
        return ml

    async def _load_cursors(self) -> None:
        for cursor_name, stored, version in await self._metadata.load_cursors():
            self._cursors[cursor_name] = self._cursor_from(cursor_name, stored, version)

    def _cursor_from(self, name: str, stored: StoredCursor, version: int) -> ManagedCursor:
        return ManagedCursor(
            self,
            name,
            durable=True,
            mark_delete=stored.mark_delete,
            mark_delete_offset=stored.mark_delete_offset,
            read_position=self.next_position(stored.mark_delete),
            ranges=stored.acked_ranges,
            batch_acks=stored.batch_acks,
            subscription_type=stored.subscription_type,
            redelivery_counts=stored.redelivery_counts,
            version=version,
            clock=self._clock,
        )

    # --- state --------------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset the next appended message gets (dense from 0, never reused)."""
        return self._writer.next_offset

    @property
    def confirmed_next_offset(self) -> int:
        """One past the offset of the last confirmed message."""
        return self._log_state.confirmed_next_offset

    @property
    def earliest_offset(self) -> int:
        """The first offset still stored (equals ``next_offset`` when nothing is stored)."""
        ledgers = self._log_state.ledgers
        return ledgers[0].first_offset if ledgers else self._writer.next_offset

    @property
    def last_confirmed(self) -> Position:
        """The last appended and confirmed entry (``Position(-1, -1)`` if none ever was)."""
        return self._log_state.last_confirmed

    @property
    def first_position(self) -> Position:
        """The first stored entry, or the position the next entry will get if none is."""
        return self._log_state.ledgers.first_position()

    @property
    def ledgers(self) -> list[LedgerInfo]:
        """The ledgers, oldest first; the last one is being written (confirmed counts)."""
        return [ledger.info() for ledger in self._log_state.ledgers]

    @property
    def storage_size_bytes(self) -> int:
        return sum(ledger.size_bytes for ledger in self._log_state.ledgers)

    @property
    def pending_appends(self) -> int:
        """Appends not confirmed yet."""
        return self._writer.pending_appends

    @property
    def pending_bytes(self) -> int:
        """Payload bytes of the appends not confirmed yet."""
        return self._writer.pending_bytes

    @property
    def terminated(self) -> bool:
        return self._metadata.info.terminated

    @property
    def closed(self) -> bool:
        return self._life.state is State.CLOSED

    @property
    def closing(self) -> bool:
        """True from the moment a close begins (it may still be flushing), and once closed."""
        return self._life.closing or self.closed

    @property
    def cursors(self) -> dict[str, ManagedCursor]:
        """The durable cursors, by name."""
        return dict(self._cursors)

    @property
    def entries_added(self) -> int:
        """Entries confirmed since this instance opened (for rates)."""
        return self._writer.entries_added

    @property
    def bytes_added(self) -> int:
        """Payload bytes confirmed since this instance opened."""
        return self._writer.bytes_added

    @property
    def messages_added(self) -> int:
        """Messages confirmed since this instance opened."""
        return self._writer.messages_added

    @property
    def write_problem(self) -> MagnetarError | None:
        """Why appends wait now: the last error of a switch step being retried (None: none)."""
        return self._writer.write_problem

    @property
    def write_problem_since_ms(self) -> int:
        """When the current write problem began (clock ms; 0 with none)."""
        return self._writer.write_problem_since_ms

    @property
    def on_write_problem(self) -> Callable[[MagnetarError | None], None] | None:
        """Called with each new write problem, and with None once writes go on again."""
        return self._writer.on_write_problem

    @on_write_problem.setter
    def on_write_problem(self, callback: Callable[[MagnetarError | None], None] | None) -> None:
        self._writer.on_write_problem = callback

    def next_position(self, position: Position) -> Position:
        """The position right after ``position``: into the next ledger at a ledger's end."""
        return self._log_state.ledgers.next_position(check_position(position))

    # --- appending ----------------------------------------------------------------------------

    def append(
        self,
        num_messages: int,
        build: Callable[[int, int], bytes],
        *,
        key_hashes: tuple[int, ...] = (),
        deliver_at_ms: int = 0,
        payload_format: int = 0,
    ) -> asyncio.Future[AppendResult]:
        """Append one entry of ``num_messages`` messages; the future completes once it is
        confirmed, in call order.

        ``key_hashes``, ``deliver_at_ms`` and ``payload_format`` are what the codec would
        describe of the payload; given here, the cached entry carries them without the payload
        being parsed again.

        ``build(first_offset, publish_time_ms)`` is called right away, with the offset of the
        entry's first message and its publish time, and returns the payload. Raises
        :class:`ManagedLedgerFencedError`, :class:`ManagedLedgerClosedError` or
        :class:`ManagedLedgerTerminatedError` if the entry cannot be taken at all.
        """
        return self._writer.append(
            num_messages,
            build,
            key_hashes=key_hashes,
            deliver_at_ms=deliver_at_ms,
            payload_format=payload_format,
        )

    # --- metadata writes ----------------------------------------------------------------------

    async def write_guarded(self, key: str, value: bytes | None) -> None:
        """Put (``value``) or delete (``None``) a record of this managed ledger that no other
        record's version guards (a bucket of a cursor's delay index), if the info is still the
        version this owner knows: a zombie owner writes nothing. A lost comparison fences the
        managed ledger."""
        await self._metadata.write_guarded(key, value)

    async def list_records(self, prefix: str) -> list[tuple[str, bytes]]:
        """Records under ``prefix`` (one of this managed ledger's): key and value, in key order."""
        return await self._metadata.list_records(prefix)

    async def write_cursor(self, cursor: str, stored: StoredCursor | None, version: int) -> int:
        """Put (``stored``) or delete (``None``) cursor ``cursor``'s record, if the info and the
        record are still the versions this owner knows (``version`` 0: absent); returns the
        record's new version (0: deleted). A lost comparison fences the managed ledger."""
        return await self._metadata.write_cursor(cursor, stored, version)

    # --- reading ------------------------------------------------------------------------------

    async def read(self, start: Position, *, max_entries: int, max_bytes: int) -> list[Entry]:
        """Entries from ``start`` (inclusive) on, across ledgers, never past ``last_confirmed``.

        At most ``max_entries`` entries, and no more once ``max_bytes`` are reached, but at least
        one entry if any is available. A start before ``first_position`` reads from there.
        """
        return await self._reader.read(start, max_entries=max_entries, max_bytes=max_bytes)

    async def wait_for_entries(self, after: Position) -> None:
        """Return once ``last_confirmed`` is past ``after``; raises if the managed ledger is
        closed or fenced first."""
        after = check_position(after, "after")
        while self._log_state.last_confirmed <= after:
            self._life.check_usable()
            self._life.check_not_closing()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def entries_waiter(self) -> asyncio.Future[None]:
        """A future that completes once an entry past the current ``last_confirmed`` is
        confirmed, or fails if the managed ledger is closed or fenced first.

        The cheap form of :meth:`wait_for_entries` for a dispatch loop: no task, and the caller
        may complete or cancel the future itself to stop waiting early.
        """
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            self._life.check_usable()
            self._life.check_not_closing()
        except MagnetarError as e:
            waiter.set_exception(e)
            return waiter
        if len(self._waiters) >= _PRUNE_WAITERS_AT:
            self._waiters = [w for w in self._waiters if not w.done()]
        self._waiters.append(waiter)
        return waiter

    def _wake_waiters(self, error: MagnetarError | None) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                if error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(error)

    # --- finding positions --------------------------------------------------------------------

    async def position_for_offset(self, offset: int) -> Position:
        """The entry holding message ``offset``; the next-to-write position for offsets not
        written yet, ``first_position`` for offsets no longer stored."""
        return await self._seeker.position_for_offset(offset)

    async def position_for_publish_time(self, time_ms: int) -> Position:
        """The first entry published at or after ``time_ms`` (the next-to-write position if
        none is)."""
        return await self._seeker.position_for_publish_time(time_ms)

    def offset_hint(self, position: Position) -> int | None:
        """The offset of the last message at or before ``position``, if known without a read."""
        return self._seeker.offset_hint(position)

    async def offset_through(self, position: Position) -> int:
        """The offset of the last message at or before ``position`` (reads an entry if needed)."""
        return await self._seeker.offset_through(position)

    def start_hint(self, start: StartAt) -> tuple[Position, int | None, Position]:
        """Mark-delete, its offset (if known without a read) and the read position of a cursor
        that starts at ``start``."""
        return self._seeker.start_hint(start)

    async def start_state(self, start: StartAt) -> tuple[Position, int, Position]:
        """As :meth:`start_hint`, with the offset exact (read if needed)."""
        return await self._seeker.start_state(start)

    def check_ackable(self, position: object) -> Position:
        """``position`` as a Position, if it is a confirmed entry (or before the first stored
        one); else :class:`InvalidArgumentError`."""
        return self._seeker.check_ackable(position)

    # --- cursors ------------------------------------------------------------------------------

    async def open_cursor(self, name: str, *, start: StartAt = "latest") -> ManagedCursor:
        """The durable cursor ``name``: an existing one keeps its state (``start`` is ignored);
        a new one starts at ``start`` and is persisted before this returns."""
        check_cursor_name(name)
        self._life.check_usable()
        existing = self._cursors.get(name)
        if existing is not None:
            return existing
        creating = self._creating_cursors.get(name)
        if creating is not None:
            return await asyncio.shield(creating)
        future: asyncio.Future[ManagedCursor] = asyncio.get_running_loop().create_future()
        self._creating_cursors[name] = future
        try:
            cursor = await self._create_cursor(name, start)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as e:
            future.set_exception(e)
            future.exception()  # retrieved: only waiters that exist care
            raise
        else:
            future.set_result(cursor)
        finally:
            self._creating_cursors.pop(name, None)
        return cursor

    async def _create_cursor(self, name: str, start: StartAt) -> ManagedCursor:
        mark_delete, offset, read_position = await self._seeker.start_state(start)
        cursor = ManagedCursor(
            self,
            name,
            durable=True,
            mark_delete=mark_delete,
            mark_delete_offset=offset,
            read_position=read_position,
            clock=self._clock,
        )
        try:
            await cursor.create_persisted()
        except CursorAlreadyExistsError:
            found = await self._metadata.read_cursor(name)
            if found is None:
                raise
            cursor = self._cursor_from(name, *found)
        self._cursors[name] = cursor
        self._log.info("cursor_created", cursor=name, mark_delete=tuple(cursor.mark_delete))
        return cursor

    def open_non_durable_cursor(self, start: StartAt) -> ManagedCursor:
        """A reader's cursor: nothing persisted, holds no data back from trimming."""
        self._life.check_readable()
        mark_delete, offset, read_position = self._seeker.start_hint(start)
        return ManagedCursor(
            self,
            "",
            durable=False,
            mark_delete=mark_delete,
            mark_delete_offset=(
                offset if offset is not None else self._seeker.offset_floor(mark_delete)
            ),
            mark_delete_offset_exact=offset is not None,  # else a lower bound until a read
            read_position=read_position,
            clock=self._clock,
        )

    async def delete_cursor(self, name: str) -> None:
        """Delete durable cursor ``name`` and its persisted state."""
        check_cursor_name(name)
        self._life.check_usable()
        cursor = self._cursors.get(name)
        if cursor is None:
            raise CursorNotFoundError(
                f"managed ledger {self.name!r} has no cursor {name!r}",
                context={"name": self.name, "cursor": name},
            )
        await cursor.delete_persisted()
        self._cursors.pop(name, None)
        self._log.info("cursor_deleted", cursor=name)
        self._request_trim()

    def cursor_moved(self, mark_delete: Position, *, durable: bool) -> None:
        """A cursor's mark-delete moved: trim if that may free the oldest ledger."""
        self._retention.cursor_moved(mark_delete, durable=durable)

    def _cursor_marks(self) -> list[Position]:
        return [cursor.mark_delete for cursor in self._cursors.values()]

    # --- trimming -----------------------------------------------------------------------------

    async def trim(self) -> int:
        """Delete the oldest ledgers that every durable cursor has passed and that retention no
        longer keeps: info first (compare-and-swap), then the ledgers on the bookies. Never the
        current ledger. Returns how many were deleted."""
        return await self._retention.trim()

    def _request_trim(self) -> None:
        self._retention.request_trim()

    # --- fencing and closing ------------------------------------------------------------------

    def _fenced(self, error: ManagedLedgerFencedError) -> None:
        self._writer.fail_pending(error)
        self._wake_waiters(error)

    async def close(self) -> None:
        """Flush the cursors, wait for pending appends, close the current ledger and record its
        final counts in the info. Safe to call more than once, and after fencing."""
        if self._life.state is State.CLOSED:
            return
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._close())
        # not shielded: a caller that gives up (a forced close with a timeout) stops the
        # closing, and nothing more is sent to the bookies; the next owner recovers the ledger
        await self._close_task

    async def _close(self) -> None:
        self._life.closing = True
        try:
            if self._life.state is not State.FENCED:
                await self._close_gracefully()
        finally:
            self._finish_close()

    async def _close_gracefully(self) -> None:
        for cursor in list(self._cursors.values()):
            try:
                await cursor.flush()
            except ManagedLedgerFencedError:
                return
            except MagnetarError as e:
                self._log.warning("cursor_flush_failed", cursor=cursor.name, error=e.message)
        await self._writer.finish()

    def _finish_close(self) -> None:
        if self._life.state is State.CLOSED:
            return
        was_fenced = self._life.state is State.FENCED
        self._life.state = State.CLOSED
        error = (
            self._life.fenced_error()
            if was_fenced
            else ManagedLedgerClosedError(
                f"managed ledger {self.name!r} was closed", context={"name": self.name}
            )
        )
        self._writer.fail_pending(error)
        self._wake_waiters(error)
        for cursor in self._cursors.values():
            cursor.cancel_persist()
        # each cursor refers back to this ledger, and so do the callbacks the collaborators
        # were given: cycles that only the cyclic collector would free, and the servers' tuning
        # (magnetar/common/server/gc_tuning.py) runs it rarely
        self._cursors.clear()
        self._life.on_fenced = None
        self._writer.detach()
        self._retention.detach()
        self._life.cancel_tasks()
        self._reader.clear()
        if self._on_close is not None:
            self._on_close(self)
        self._log.info("managed_ledger_closed", fenced=was_fenced)
