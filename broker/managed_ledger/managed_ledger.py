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
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from broker.managed_ledger.cache import EntryCache
from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.cursor import ManagedCursor
from broker.managed_ledger.ledger_list import LedgerList, LedgerRecord
from broker.managed_ledger.persistence import (
    StoredCursor,
    StoredInfo,
    check_cursor_name,
    decode_cursor,
    decode_info,
    encode_cursor,
    encode_info,
)
from broker.managed_ledger.ports import (
    MAX_ENTRY_BYTES,
    LedgerClientApi,
    LedgerMetadataView,
    LedgerReader,
    LedgerWriter,
)
from broker.managed_ledger.rollover import RolloverPolicy, RollReason
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
from magnetar.common.clock import Clock
from magnetar.common.errors import (
    BadVersionError,
    CursorAlreadyExistsError,
    CursorNotFoundError,
    EnsembleUnrepairableError,
    EntryTooLargeError,
    InternalError,
    InvalidArgumentError,
    KeyExistsError,
    LedgerFencedError,
    LedgerNotFoundError,
    MagnetarError,
    ManagedLedgerClosedError,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    ManagedLedgerTerminatedError,
    NoSuchKeyError,
)
from metadata import layout
from metadata.api import Compare, DeleteOp, MetadataStore, PutOp

if TYPE_CHECKING:
    from broker.managed_ledger.types import EntryMeta

log = structlog.get_logger("magnetar.managed_ledger")

_T = TypeVar("_T")

LEDGER_PROPERTY = "managed-ledger"
"""Custom metadata key on every ledger a managed ledger creates: its name (finds orphans)."""

_RETRY_FIRST_S = 0.1
_RETRY_MAX_S = 5.0
_PRUNE_WAITERS_AT = 64
"""Entry waiters that were completed by their owner pile up until the next entry; past this
many the finished ones are dropped when another is added."""


class _State(enum.Enum):
    WRITING = "writing"  # a current ledger takes adds
    SWITCHING = "switching"  # closing / recovering the current ledger, starting the next
    FENCED = "fenced"  # another owner took over
    CLOSED = "closed"


class _Stop(Exception):  # noqa: N818 - internal control flow, never escapes
    """The managed ledger was fenced or closed while a background step was retrying."""


@dataclass(slots=True, eq=False)
class _Append:
    """An entry from append() until its future completes."""

    first_offset: int
    num_messages: int
    publish_time_ms: int
    payload: bytes
    future: asyncio.Future[AppendResult]
    key_hashes: tuple[int, ...] = ()
    deliver_at_ms: int = 0
    payload_format: int = 0
    ledger_id: int = -1  # -1: not sent to a ledger (yet, or again after a failure)
    entry_id: int = -1
    confirmed: bool = False


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
        self._store = store
        self._client = ledger_client
        self._codec = codec
        self._cache = cache
        self._clock = clock
        self._info_key = layout.managed_ledger_info(name)
        self._info = info
        self._info_version = info_version
        self._ledgers = LedgerList(ledgers)
        self._handle = handle
        self._policy = RolloverPolicy.from_config(config)
        self._on_close = on_close
        self._log = log.bind(managed_ledger=name)

        self._state = _State.WRITING
        self._closing = False
        self._pending: deque[_Append] = deque()
        self._unsent: deque[_Append] = deque()
        self._pending_bytes = 0
        self._next_offset = next_offset
        self._confirmed_next_offset = next_offset
        self._last_publish_ms = last_publish_time_ms
        self._last_confirmed = last_confirmed
        self._sent_entries = 0  # adds handed to the current ledger's writer
        self._sent_bytes = 0

        self.entries_added = 0
        """Entries confirmed since this instance opened (for rates)."""
        self.bytes_added = 0
        """Payload bytes confirmed since this instance opened."""
        self.messages_added = 0
        """Messages confirmed since this instance opened."""
        self.fenced = asyncio.Event()
        """Set when another owner took this managed ledger; every append fails from then on."""
        self.write_problem: MagnetarError | None = None
        """Why appends wait now: the last error of a switch step being retried (None: none)."""
        self.write_problem_since_ms = 0
        """When the current write problem began (clock ms; 0 with none)."""
        self.on_write_problem: Callable[[MagnetarError | None], None] | None = None
        """Called with each new write problem, and with None once writes go on again."""

        self._cursors: dict[str, ManagedCursor] = {}
        self._creating_cursors: dict[str, asyncio.Future[ManagedCursor]] = {}
        self._meta_lock = asyncio.Lock()
        self._trim_lock = asyncio.Lock()
        self._read_handles: dict[int, LedgerReader] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pump: asyncio.Task[None] | None = None
        self._switch: asyncio.Task[None] | None = None
        self._trimmer: asyncio.Task[None] | None = None
        self._trim_again = False
        self._periodic: asyncio.Task[None] | None = None
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
        info, version = await _read_or_create_info(store, name, key)
        ledgers = [LedgerRecord.of(info_ledger) for info_ledger in info.ledgers]
        dropped: LedgerRecord | None = None
        next_offset = 0
        readers: dict[int, LedgerReader] = {}
        if ledgers:
            last = ledgers[-1]
            reader = await _recover_last(ledger_client, codec, name, last)
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

        handle = await _create_ledger(ledger_client, config, name)
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
            await _delete_quietly(ledger_client, handle.ledger_id, name)
            raise ManagedLedgerFencedError(
                f"managed ledger {name!r} was opened by another owner at the same time",
                context={"name": name},
            ) from None
        except MagnetarError:
            # maybe stored, maybe not: an empty listed ledger that is gone is dropped at the
            # next open, so deleting it is safe either way
            await _delete_quietly(ledger_client, handle.ledger_id, name)
            raise
        if dropped is not None:
            await _delete_quietly(ledger_client, dropped.ledger_id, name)

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
        ml._read_handles.update(readers)
        await ml._load_cursors()
        ml._periodic = ml._spawn(ml._run_periodic(), "periodic")
        ml._log.info(
            "managed_ledger_opened",
            ledgers=len(ledgers),
            current_ledger=handle.ledger_id,
            next_offset=next_offset,
            cursors=len(ml._cursors),
        )
        return ml

    async def _load_cursors(self) -> None:
        prefix = layout.managed_ledger_cursors(self.name)
        listing = await self._store.list(prefix)
        for record in listing.records:
            cursor_name = record.key[len(prefix) :]
            if "/" in cursor_name:
                continue  # a key of another managed ledger whose name extends ours
            stored = decode_cursor(cursor_name, record.value)
            self._cursors[cursor_name] = self._cursor_from(cursor_name, stored, record.version)

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
        return self._next_offset

    @property
    def confirmed_next_offset(self) -> int:
        """One past the offset of the last confirmed message."""
        return self._confirmed_next_offset

    @property
    def earliest_offset(self) -> int:
        """The first offset still stored (equals ``next_offset`` when nothing is stored)."""
        return self._ledgers[0].first_offset if self._ledgers else self._next_offset

    @property
    def last_confirmed(self) -> Position:
        """The last appended and confirmed entry (``Position(-1, -1)`` if none ever was)."""
        return self._last_confirmed

    @property
    def first_position(self) -> Position:
        """The first stored entry, or the position the next entry will get if none is."""
        return self._ledgers.first_position()

    @property
    def ledgers(self) -> list[LedgerInfo]:
        """The ledgers, oldest first; the last one is being written (confirmed counts)."""
        return [ledger.info() for ledger in self._ledgers]

    @property
    def storage_size_bytes(self) -> int:
        return sum(ledger.size_bytes for ledger in self._ledgers)

    @property
    def pending_appends(self) -> int:
        """Appends not confirmed yet."""
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        """Payload bytes of the appends not confirmed yet."""
        return self._pending_bytes

    @property
    def terminated(self) -> bool:
        return self._info.terminated

    @property
    def closed(self) -> bool:
        return self._state is _State.CLOSED

    @property
    def closing(self) -> bool:
        """True from the moment a close begins (it may still be flushing), and once closed."""
        return self._closing or self.closed

    @property
    def cursors(self) -> dict[str, ManagedCursor]:
        """The durable cursors, by name."""
        return dict(self._cursors)

    def _next_write_position(self) -> Position:
        return self._ledgers.next_write_position()

    def _index(self, ledger_id: int) -> int | None:
        return self._ledgers.find(ledger_id)

    def next_position(self, position: Position) -> Position:
        """The position right after ``position``: into the next ledger at a ledger's end."""
        return self._ledgers.next_position(check_position(position))

    def _normalize(self, position: Position) -> tuple[int, Position] | None:
        return self._ledgers.locate(position)

    def _is_entry(self, position: Position) -> bool:
        return self._ledgers.is_entry(position)

    def _check_readable(self) -> None:
        if self._state is _State.CLOSED:
            raise ManagedLedgerClosedError(
                f"managed ledger {self.name!r} is closed", context={"name": self.name}
            )

    def _check_usable(self) -> None:
        self._check_readable()
        if self._state is _State.FENCED:
            raise self._fenced_error()

    def _fenced_error(self) -> ManagedLedgerFencedError:
        return ManagedLedgerFencedError(
            f"managed ledger {self.name!r} was taken over by another owner; this instance may"
            " no longer write it",
            context={"name": self.name},
        )

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
        describe of the payload;
        given here, the cached entry carries them without the payload being parsed again.

        ``build(first_offset, publish_time_ms)`` is called right away, with the offset of the
        entry's first message and its publish time, and returns the payload. Raises
        :class:`ManagedLedgerFencedError`, :class:`ManagedLedgerClosedError` or
        :class:`ManagedLedgerTerminatedError` if the entry cannot be taken at all.
        """
        self._check_usable()
        if self._closing:
            raise ManagedLedgerClosedError(
                f"managed ledger {self.name!r} is closing", context={"name": self.name}
            )
        if self._info.terminated:
            raise ManagedLedgerTerminatedError(
                f"managed ledger {self.name!r} is terminated and takes no more entries",
                context={"name": self.name},
            )
        if not isinstance(num_messages, int) or isinstance(num_messages, bool) or num_messages < 1:
            raise InvalidArgumentError(
                f"an entry holds at least one message, got num_messages={num_messages!r}",
                context={"num_messages": repr(num_messages)},
            )
        first_offset = self._next_offset
        publish_time_ms = max(self._clock.time_ms(), self._last_publish_ms)
        payload = build(first_offset, publish_time_ms)
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise InvalidArgumentError(
                f"the entry builder must return bytes, got {type(payload).__name__}"
            )
        payload = bytes(payload)
        if len(payload) > MAX_ENTRY_BYTES:
            raise EntryTooLargeError(
                f"an entry of {len(payload):,} bytes is over the {MAX_ENTRY_BYTES:,}-byte limit",
                context={"size": len(payload), "limit": MAX_ENTRY_BYTES},
            )
        self._next_offset += num_messages
        self._last_publish_ms = publish_time_ms
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        append = _Append(
            first_offset,
            num_messages,
            publish_time_ms,
            payload,
            future,
            key_hashes,
            deliver_at_ms,
            payload_format,
        )
        self._pending.append(append)
        self._unsent.append(append)
        self._pending_bytes += len(payload)
        self._kick()
        return future

    def _kick(self) -> None:
        if (
            self._state is _State.WRITING
            and self._unsent
            and (self._pump is None or self._pump.done())
        ):
            self._pump = self._spawn(self._run_pump(), "pump")

    def _roll_reason(self) -> RollReason | None:
        return self._policy.reason(
            entries=self._sent_entries,
            size_bytes=self._sent_bytes,
            age_ms=self._clock.time_ms() - self._ledgers[-1].created_ms,
        )

    async def _run_pump(self) -> None:
        """Hand queued entries, in order, to the current ledger; roll first when it is due."""
        while self._unsent and self._state is _State.WRITING:
            reason = self._roll_reason()
            if reason is not None:
                self._start_switch(reason.value)
                return
            handle = self._handle
            append = self._unsent[0]
            try:
                confirmed = await handle.add_async(append.payload)
            except MagnetarError as e:
                self._writer_failed(handle, e)
                return
            if self._state is not _State.WRITING or not self._unsent:
                return  # fenced or closed meanwhile; the entry's fate no longer matters
            self._unsent.popleft()
            append.ledger_id = handle.ledger_id
            append.entry_id = self._sent_entries
            self._sent_entries += 1
            self._sent_bytes += len(append.payload)
            confirmed.add_done_callback(functools.partial(self._add_done, handle, append))
        if self._state is _State.WRITING and not self._closing and self._sent_entries > 0:
            # full: roll now rather than make the next append wait for it
            reason = self._roll_reason()
            if reason is not None:
                self._start_switch(reason.value)

    def _add_done(self, handle: LedgerWriter, append: _Append, done: asyncio.Future[int]) -> None:
        if done.cancelled():
            self._writer_failed(
                handle, ManagedLedgerError(f"an add to ledger {handle.ledger_id} was cancelled")
            )
            return
        error = done.exception()
        if error is not None:
            self._writer_failed(
                handle,
                error if isinstance(error, MagnetarError) else InternalError(repr(error)),
            )
            return
        if append.ledger_id != handle.ledger_id or append.future.done():
            return
        if done.result() != append.entry_id:
            self._writer_failed(
                handle,
                InternalError(
                    f"ledger {handle.ledger_id} gave entry id {done.result()} to an add this"
                    f" managed ledger numbered {append.entry_id}"
                ),
            )
            return
        append.confirmed = True
        self._complete_confirmed()

    def _complete_confirmed(self) -> None:
        """Complete, in order, the appends at the head of the queue that are confirmed."""
        advanced = False
        while self._pending and self._pending[0].confirmed:
            append = self._pending.popleft()
            size = len(append.payload)
            ledger = self._ledger_of(append.ledger_id)
            ledger.entries = max(ledger.entries, append.entry_id + 1)
            ledger.size_bytes += size
            ledger.messages += append.num_messages
            ledger.last_publish_time_ms = append.publish_time_ms
            position = Position(append.ledger_id, append.entry_id)
            self._last_confirmed = position
            self._confirmed_next_offset = append.first_offset + append.num_messages
            self._pending_bytes -= size
            self.entries_added += 1
            self.bytes_added += size
            self.messages_added += append.num_messages
            self._cache.put(
                Entry(
                    position,
                    append.payload,
                    append.first_offset,
                    append.num_messages,
                    append.publish_time_ms,
                    append.key_hashes,
                    append.deliver_at_ms,
                    append.payload_format,
                )
            )
            advanced = True
            if not append.future.done():
                append.future.set_result(
                    AppendResult(position, append.first_offset, append.publish_time_ms)
                )
        if advanced:
            self._wake_waiters(None)

    def _ledger_of(self, ledger_id: int) -> LedgerRecord:
        i = self._index(ledger_id)
        if i is None:
            raise InternalError(f"ledger {ledger_id} is not in managed ledger {self.name!r}")
        return self._ledgers[i]

    # --- switching ledgers --------------------------------------------------------------------

    def _writer_failed(self, handle: LedgerWriter, error: MagnetarError) -> None:
        if self._state in (_State.FENCED, _State.CLOSED) or handle is not self._handle:
            return
        if isinstance(error, LedgerFencedError):
            self._fence(f"ledger {handle.ledger_id} was fenced: {error.message}")
            return
        if self._state is _State.WRITING:
            self._log.warning(
                "managed_ledger_write_failed", ledger=handle.ledger_id, error=error.message
            )
            self._start_switch("write_failure")
        # already switching: closing the handle reports the same failure

    def _start_switch(self, reason: str) -> None:
        self._state = _State.SWITCHING
        self._switch = self._spawn(self._run_switch(reason), "switch")

    async def _run_switch(self, reason: str) -> None:
        old = self._handle
        try:
            try:
                await old.close()
            except LedgerFencedError as e:
                self._fence(f"ledger {old.ledger_id} was fenced: {e.message}")
                return
            except MagnetarError as e:
                await self._recover_failed(old, e)
            await self._start_next_ledger(reason)
        except _Stop:
            self._fail_pending(self._stopped_error())
        except Exception as e:  # noqa: BLE001 - logged; the instance is given up
            # a bug: give up this instance (the broker reopens it, as a new owner would)
            self._log.exception("managed_ledger_switch_failed", error=repr(e))
            self._finish_close()

    async def _recover_failed(self, old: LedgerWriter, error: MagnetarError) -> None:
        """The writer of ``old`` failed: close the ledger where the writer confirmed it (or
        recover it to find its real end), complete what is in it, queue the rest again for
        the next ledger."""
        metadata: LedgerMetadataView | None = None
        if isinstance(error, EnsembleUnrepairableError):
            # the writer stopped with the ledger still its own: no fencing or re-adding needed
            try:
                metadata = await old.close_confirmed()
            except LedgerFencedError as e:
                self._fence(f"ledger {old.ledger_id} was fenced: {e.message}")
                raise _Stop from None
            except MagnetarError as e:
                error = e
        if metadata is None:
            self._log.warning(
                "managed_ledger_recovering", ledger=old.ledger_id, error=error.message
            )
            metadata = await self._retrying(
                "recover_ledger", functools.partial(self._client.recover, old.ledger_id)
            )
        last = metadata.last_entry_id
        again: list[_Append] = []
        for append in self._pending:
            if append.ledger_id != old.ledger_id or append.confirmed:
                continue
            if append.entry_id <= last:
                append.confirmed = True  # in the log: recovery closed the ledger with it
            else:
                append.ledger_id = append.entry_id = -1
                again.append(append)
        self._unsent.extendleft(reversed(again))
        self._complete_confirmed()
        self._log.info(
            "managed_ledger_recovered_ledger",
            ledger=old.ledger_id,
            last_entry=last,
            requeued=len(again),
        )

    async def _start_next_ledger(self, reason: str) -> None:
        old = self._ledgers[-1]
        handle = await self._retrying(
            "create_ledger", functools.partial(_create_ledger, self._client, self.config, self.name)
        )
        new = LedgerRecord(handle.ledger_id, self._confirmed_next_offset, self._clock.time_ms())
        dropped = old if old.entries == 0 else None

        def switch(ledgers: list[LedgerRecord]) -> list[LedgerRecord]:
            return [ledger for ledger in ledgers if ledger is not dropped] + [new]

        try:
            await self._retrying("update_info", functools.partial(self._update_info, switch))
        except _Stop:
            await _delete_quietly(self._client, handle.ledger_id, self.name)
            raise
        self._handle = handle
        self._sent_entries = 0
        self._sent_bytes = 0
        self._state = _State.WRITING
        self._set_write_problem(None)
        self._log.info(
            "ledger_rolled",
            reason=reason,
            closed_ledger=old.ledger_id,
            entries=old.entries,
            ledger=handle.ledger_id,
            first_offset=new.first_offset,
        )
        if dropped is not None:
            self._spawn(_delete_quietly(self._client, dropped.ledger_id, self.name), "delete")
        self._kick()
        self._request_trim()

    async def _retrying(self, what: str, step: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``step`` until it works; stop (``_Stop``) once fenced, or closing after a failure."""
        delay = _RETRY_FIRST_S
        while True:
            if self._state in (_State.FENCED, _State.CLOSED):
                raise _Stop
            try:
                return await step()
            except ManagedLedgerFencedError:
                raise _Stop from None
            except MagnetarError as e:
                if self._closing:
                    self._log.warning("managed_ledger_gave_up", step=what, error=e.message)
                    raise _Stop from None
                self._log.warning(
                    "managed_ledger_retrying", step=what, error=e.message, delay_s=delay
                )
                self._set_write_problem(e)
            await self._clock.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)

    def _set_write_problem(self, problem: MagnetarError | None) -> None:
        previous = self.write_problem
        if previous is None:
            if problem is None:
                return
            self.write_problem_since_ms = self._clock.time_ms()
        elif problem is None:
            self.write_problem_since_ms = 0
            self._log.info("managed_ledger_writing_again", problem=previous.message)
        self.write_problem = problem
        if previous is not None and problem is not None and previous.message == problem.message:
            return  # the same problem, retried: nothing new to tell
        if self.on_write_problem is not None:
            self.on_write_problem(problem)

    def _stopped_error(self) -> ManagedLedgerError:
        if self._state is _State.FENCED:
            return self._fenced_error()
        return ManagedLedgerClosedError(
            f"managed ledger {self.name!r} was closed before the entry could be written",
            context={"name": self.name},
        )

    def _fail_pending(self, error: ManagedLedgerError) -> None:
        for append in self._pending:
            if not append.future.done():
                append.future.set_exception(error)
        self._pending.clear()
        self._unsent.clear()
        self._pending_bytes = 0

    def _fence(self, reason: str) -> None:
        if self._state in (_State.FENCED, _State.CLOSED):
            return
        self._state = _State.FENCED
        self.fenced.set()
        self._log.warning("managed_ledger_fenced", reason=reason)
        error = self._fenced_error()
        self._fail_pending(error)
        self._wake_waiters(error)

    # --- metadata writes ------------------------------------------------------------------------

    def _stored_info(self, ledgers: Sequence[LedgerRecord]) -> StoredInfo:
        return StoredInfo(
            ledgers=tuple(ledger.info() for ledger in ledgers),
            terminated=self._info.terminated,
            terminated_position=self._info.terminated_position,
            properties=self._info.properties,
        )

    async def _update_info(
        self, change: Callable[[list[LedgerRecord]], list[LedgerRecord]]
    ) -> None:
        """Compare-and-swap the info with the ledger list ``change`` makes of the current one."""
        async with self._meta_lock:
            if self._state is _State.FENCED:
                raise self._fenced_error()
            ledgers = change(list(self._ledgers))
            info = self._stored_info(ledgers)
            value = encode_info(info)
            try:
                version = await self._store.put(
                    self._info_key, value, expected_version=self._info_version
                )
            except (BadVersionError, NoSuchKeyError):
                record = await self._store.get(self._info_key)
                if record is None or record.value != value:
                    self._fence("the info changed under this owner")
                    raise self._fenced_error() from None
                version = record.version  # our write went through; its answer was lost
            self._info_version = version
            self._info = info
            self._ledgers = LedgerList(ledgers)

    async def _write_cursor(self, cursor: ManagedCursor, stored: StoredCursor | None) -> None:
        """Put (``stored``) or delete (``None``) a cursor, if the info and the cursor are still
        the versions this owner knows; a lost comparison fences the managed ledger."""
        key = layout.managed_ledger_cursor(self.name, cursor.name)
        value = encode_cursor(stored) if stored is not None else None
        async with self._meta_lock:
            self._check_usable()
            compares = [
                Compare(self._info_key, self._info_version),
                Compare(key, cursor.version) if cursor.version else Compare.absent(key),
            ]
            op = PutOp(key, value) if value is not None else DeleteOp(key)
            try:
                result = await self._store.txn(compares, [op])
            except BadVersionError as e:
                record = await self._store.get(key)
                info = await self._store.get(self._info_key)
                info_ours = info is not None and info.version == self._info_version
                if info_ours and value is not None and record is not None and record.value == value:
                    cursor.version = record.version  # our write went through; answer lost
                    return
                if info_ours and value is None and record is None:
                    cursor.version = 0
                    return
                if info_ours and cursor.version == 0 and e.context.get("key") == key:
                    raise CursorAlreadyExistsError(
                        f"cursor {cursor.name!r} of {self.name!r} was created by someone else",
                        context={"name": self.name, "cursor": cursor.name},
                    ) from None
                self._fence(f"cursor {cursor.name!r} or the info changed under this owner")
                raise self._fenced_error() from None
            cursor.version = result.versions.get(key, 0)

    # --- reading ------------------------------------------------------------------------------

    async def read(self, start: Position, *, max_entries: int, max_bytes: int) -> list[Entry]:
        """Entries from ``start`` (inclusive) on, across ledgers, never past ``last_confirmed``.

        At most ``max_entries`` entries, and no more once ``max_bytes`` are reached, but at least
        one entry if any is available. A start before ``first_position`` reads from there.
        """
        start = check_position(start, "start")
        _check_limit("max_entries", max_entries)
        _check_limit("max_bytes", max_bytes)
        self._check_readable()
        found: list[Entry] = []
        size = 0
        position = max(start, self.first_position)
        while len(found) < max_entries and size < max_bytes:
            located = self._normalize(position)
            if located is None:
                break
            i, position = located
            if position > self._last_confirmed:
                break
            ledger = self._ledgers[i]
            last = ledger.entries - 1
            if position.ledger_id == self._last_confirmed.ledger_id:
                last = min(last, self._last_confirmed.entry_id)
            count = min(max_entries - len(found), last - position.entry_id + 1)
            batch = await self._read_ledger(ledger, position.entry_id, count, max_bytes - size)
            if not batch:
                break
            for entry in batch:
                found.append(entry)
                size += len(entry.payload)
                if size >= max_bytes:
                    break
            position = self.next_position(found[-1].position)
        return found

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
        reader = None if fresh else self._read_handles.get(ledger_id)
        if reader is None:
            reader = await self._client.open_ledger(ledger_id, recovery=False)
            self._read_handles[ledger_id] = reader
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
                f"entry {tuple(position)} of {self.name!r} could not be described: {e!r}",
                context={"name": self.name, "position": tuple(position)},
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

    async def _read_one(self, position: Position) -> Entry:
        i = self._index(position.ledger_id)
        if i is None or not self._is_entry(position):
            raise InternalError(f"{tuple(position)} is not an entry of {self.name!r}")
        entries = await self._read_ledger(self._ledgers[i], position.entry_id, 1, 1)
        return entries[0]

    async def wait_for_entries(self, after: Position) -> None:
        """Return once ``last_confirmed`` is past ``after``; raises if the managed ledger is
        closed or fenced first."""
        after = check_position(after, "after")
        while self._last_confirmed <= after:
            self._check_usable()
            if self._closing:
                raise ManagedLedgerClosedError(
                    f"managed ledger {self.name!r} is closing", context={"name": self.name}
                )
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
            self._check_usable()
            if self._closing:
                raise ManagedLedgerClosedError(
                    f"managed ledger {self.name!r} is closing", context={"name": self.name}
                )
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

    # --- finding positions ----------------------------------------------------------------------

    async def position_for_offset(self, offset: int) -> Position:
        """The entry holding message ``offset``; the next-to-write position for offsets not
        written yet, ``first_position`` for offsets no longer stored."""
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidArgumentError(
                f"an offset is an int >= 0, got {offset!r}", context={"offset": repr(offset)}
            )
        self._check_readable()
        if offset >= self._confirmed_next_offset:
            return self._next_write_position()
        if offset < self.earliest_offset:
            return self.first_position
        ledger = self._ledgers.holding_offset(offset)
        if ledger is None:
            return self.first_position
        ledger_id = ledger.ledger_id
        lo, hi = 0, ledger.entries - 1
        while lo < hi:  # the last entry whose first offset is <= offset
            mid = (lo + hi + 1) // 2
            entry = await self._read_one(Position(ledger_id, mid))
            if entry.first_offset <= offset:
                lo = mid
            else:
                hi = mid - 1
        return Position(ledger_id, lo)

    async def position_for_publish_time(self, time_ms: int) -> Position:
        """The first entry published at or after ``time_ms`` (the next-to-write position if
        none is)."""
        if not isinstance(time_ms, int) or isinstance(time_ms, bool):
            raise InvalidArgumentError(
                f"a publish time is an int of ms since the epoch, got {time_ms!r}",
                context={"time_ms": repr(time_ms)},
            )
        self._check_readable()
        for ledger in list(self._ledgers):
            if ledger.entries == 0 or ledger.last_publish_time_ms < time_ms:
                continue
            ledger_id = ledger.ledger_id
            lo, hi = 0, ledger.entries - 1
            while lo < hi:  # publish times never decrease: the first one >= time_ms
                mid = (lo + hi) // 2
                entry = await self._read_one(Position(ledger_id, mid))
                if entry.publish_time_ms >= time_ms:
                    hi = mid
                else:
                    lo = mid + 1
            return Position(ledger_id, lo)
        return self._next_write_position()

    def _offset_hint(self, position: Position) -> int | None:
        """The offset of the last message at or before ``position``, if known without a read."""
        if position < self.first_position:
            return self.earliest_offset - 1
        if position >= self._last_confirmed:
            return self._confirmed_next_offset - 1
        i = self._index(position.ledger_id)
        if i is not None:
            ledger = self._ledgers[i]
            if position.entry_id < 0:
                return ledger.first_offset - 1
            if position.entry_id == ledger.entries - 1:
                return ledger.first_offset + ledger.messages - 1
        entry = self._cache.peek(position)
        return entry.last_offset if entry is not None else None

    async def _offset_through(self, position: Position) -> int:
        """The offset of the last message at or before ``position`` (reads an entry if needed)."""
        hint = self._offset_hint(position)
        if hint is not None:
            return hint
        if self._is_entry(position):
            return (await self._read_one(position)).last_offset
        located = self._normalize(position)
        if located is None:
            return self._confirmed_next_offset - 1
        i, at = located
        ledger = self._ledgers[i]
        if at.entry_id >= ledger.entries:
            return ledger.first_offset + ledger.messages - 1
        return (await self._read_one(at)).first_offset - 1

    def _start_for(self, start: StartAt) -> tuple[Position, int | None, Position]:
        """Mark-delete, its offset (if known without a read) and the read position of a cursor
        that starts at ``start``."""
        if start == "latest":
            mark_delete = self._last_confirmed
            return mark_delete, self._confirmed_next_offset - 1, self.next_position(mark_delete)
        first = self.first_position
        if start == "earliest":
            position = first
        elif isinstance(start, tuple):
            position = check_position(start, "start")
        else:
            raise InvalidArgumentError(
                f"a cursor starts at a Position, 'earliest' or 'latest', got {start!r}",
                context={"start": repr(start)},
            )
        if position <= first:
            return Position(first.ledger_id, first.entry_id - 1), self.earliest_offset - 1, first
        if position > self._last_confirmed:
            mark_delete = self._last_confirmed
            return mark_delete, self._confirmed_next_offset - 1, self.next_position(mark_delete)
        located = self._normalize(position)
        assert located is not None  # position <= last_confirmed, which is in a ledger
        _, position = located
        mark_delete = Position(position.ledger_id, position.entry_id - 1)
        return mark_delete, self._offset_hint(mark_delete), position

    async def _start_state(self, start: StartAt) -> tuple[Position, int, Position]:
        mark_delete, offset, read_position = self._start_for(start)
        if offset is None:
            offset = await self._offset_through(mark_delete)
        return mark_delete, offset, read_position

    def _offset_floor(self, position: Position) -> int:
        """A lower bound of the offset of the last message at or before ``position``."""
        i = self._index(position.ledger_id)
        return (self._ledgers[i].first_offset if i is not None else self.earliest_offset) - 1

    def _check_ackable(self, position: object) -> Position:
        self._check_readable()
        checked = check_position(position)
        if checked > self._last_confirmed:
            raise InvalidArgumentError(
                f"position {tuple(checked)} is past the last confirmed entry"
                f" {tuple(self._last_confirmed)} of {self.name!r}",
                context={"name": self.name, "position": tuple(checked)},
            )
        if checked >= self.first_position and not self._is_entry(checked):
            raise InvalidArgumentError(
                f"position {tuple(checked)} is not an entry of {self.name!r}",
                context={"name": self.name, "position": tuple(checked)},
            )
        return checked

    # --- cursors ------------------------------------------------------------------------------

    async def open_cursor(self, name: str, *, start: StartAt = "latest") -> ManagedCursor:
        """The durable cursor ``name``: an existing one keeps its state (``start`` is ignored);
        a new one starts at ``start`` and is persisted before this returns."""
        check_cursor_name(name)
        self._check_usable()
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
        mark_delete, offset, read_position = await self._start_state(start)
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
            await self._write_cursor(cursor, cursor.stored())
        except CursorAlreadyExistsError:
            record = await self._store.get(layout.managed_ledger_cursor(self.name, name))
            if record is None:
                raise
            cursor = self._cursor_from(name, decode_cursor(name, record.value), record.version)
        self._cursors[name] = cursor
        self._log.info("cursor_created", cursor=name, mark_delete=tuple(cursor.mark_delete))
        return cursor

    def open_non_durable_cursor(self, start: StartAt) -> ManagedCursor:
        """A reader's cursor: nothing persisted, holds no data back from trimming."""
        self._check_readable()
        mark_delete, offset, read_position = self._start_for(start)
        cursor = ManagedCursor(
            self,
            "",
            durable=False,
            mark_delete=mark_delete,
            mark_delete_offset=offset if offset is not None else self._offset_floor(mark_delete),
            read_position=read_position,
            clock=self._clock,
        )
        if offset is None:
            cursor._mark_delete_offset_exact = False  # a lower bound until an entry is read
        return cursor

    async def delete_cursor(self, name: str) -> None:
        """Delete durable cursor ``name`` and its persisted state."""
        check_cursor_name(name)
        self._check_usable()
        cursor = self._cursors.get(name)
        if cursor is None:
            raise CursorNotFoundError(
                f"managed ledger {self.name!r} has no cursor {name!r}",
                context={"name": self.name, "cursor": name},
            )
        await cursor._stop()
        await self._write_cursor(cursor, None)
        self._cursors.pop(name, None)
        self._log.info("cursor_deleted", cursor=name)
        self._request_trim()

    def _cursor_moved(self, cursor: ManagedCursor, mark_delete: Position) -> None:
        """A durable cursor's mark-delete moved: trim if that may free the oldest ledger."""
        if not cursor.durable or len(self._ledgers) < 2:
            return
        if mark_delete >= self._ledgers[0].last_position:
            self._request_trim()

    # --- trimming -----------------------------------------------------------------------------

    def _trimmable(self, ledgers: Sequence[LedgerRecord]) -> int:
        """How many of the oldest ledgers every durable cursor passed and retention lets go."""
        marks = [cursor.mark_delete for cursor in self._cursors.values()]
        slowest = min(marks) if marks else None
        consumed: list[LedgerRecord] = []
        for ledger in ledgers[:-1]:  # never the current ledger
            if slowest is not None and slowest < ledger.last_position:
                break
            consumed.append(ledger)
        retention_ms = self.config.retention_time_ms
        retention_bytes = self.config.retention_size_bytes
        now = self._clock.time_ms()
        kept_bytes = sum(ledger.size_bytes for ledger in consumed)
        count = 0
        for ledger in consumed:
            published = ledger.last_publish_time_ms or ledger.created_ms
            expired = retention_ms >= 0 and now - published >= retention_ms
            over_size = retention_bytes >= 0 and kept_bytes > retention_bytes
            if not (expired or over_size):
                break
            count += 1
            kept_bytes -= ledger.size_bytes
        return count

    async def trim(self) -> int:
        """Delete the oldest ledgers that every durable cursor has passed and that retention no
        longer keeps: info first (compare-and-swap), then the ledgers on the bookies. Never the
        current ledger. Returns how many were deleted."""
        self._check_usable()
        if self._trimmable(self._ledgers) == 0:
            return 0
        async with self._trim_lock:
            deleted: list[LedgerRecord] = []

            def drop(ledgers: list[LedgerRecord]) -> list[LedgerRecord]:
                count = self._trimmable(ledgers)
                deleted[:] = ledgers[:count]
                return ledgers[count:]

            await self._update_info(drop)
            for ledger in deleted:
                self._cache.invalidate_ledger(ledger.ledger_id)
                self._read_handles.pop(ledger.ledger_id, None)
                await _delete_quietly(self._client, ledger.ledger_id, self.name)
            if deleted:
                self._log.info(
                    "ledgers_trimmed",
                    ledgers=[ledger.ledger_id for ledger in deleted],
                    earliest_offset=self.earliest_offset,
                )
            return len(deleted)

    def _request_trim(self) -> None:
        """Trim soon, in the background; requests while one runs make it run once more."""
        if self._state is not _State.WRITING and self._state is not _State.SWITCHING:
            return
        if self._trimmer is not None and not self._trimmer.done():
            self._trim_again = True
            return
        self._trimmer = self._spawn(self._background_trim(), "trim")

    async def _background_trim(self) -> None:
        while True:
            self._trim_again = False
            try:
                await self.trim()
            except MagnetarError as e:
                self._log.info("trim_failed", error=e.message)
                return
            if not self._trim_again:
                return

    def _restripe_due(self) -> bool:
        """The current ledger is under-striped and its full E of bookies is writable again:
        roll early, so that the load spreads over all of them again."""
        metadata = self._handle.metadata
        return (
            metadata.under_striped
            and self._client.writable_bookies() >= metadata.intended_ensemble_size
        )

    async def _run_periodic(self) -> None:
        """Roll a ledger that got too old while idle, or an under-striped one once E bookies
        are writable again, and trim, every ``trim_interval_ms``."""
        interval = self.config.trim_interval_ms / 1000
        while self._state is not _State.CLOSED and self._state is not _State.FENCED:
            await self._clock.sleep(interval)
            if (
                self._state is _State.WRITING
                and not self._closing
                and (self._pump is None or self._pump.done())
                and self._sent_entries > 0
            ):
                reason = self._roll_reason()
                if reason is not None:
                    self._start_switch(reason.value)
                elif self._restripe_due():
                    self._start_switch("restripe")
            if self._state is _State.WRITING or self._state is _State.SWITCHING:
                try:
                    await self.trim()
                except MagnetarError as e:
                    self._log.info("trim_failed", error=e.message)

    # --- closing ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Flush the cursors, wait for pending appends, close the current ledger and record its
        final counts in the info. Safe to call more than once, and after fencing."""
        if self._state is _State.CLOSED:
            return
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._close())
        # not shielded: a caller that gives up (a forced close with a timeout) stops the
        # closing, and nothing more is sent to the bookies; the next owner recovers the ledger
        await self._close_task

    async def _close(self) -> None:
        self._closing = True
        try:
            if self._state is not _State.FENCED:
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
        while self._pending and self._state in (_State.WRITING, _State.SWITCHING):
            await asyncio.gather(self._pending[-1].future, return_exceptions=True)
        if self._switch is not None and not self._switch.done():
            await asyncio.gather(self._switch, return_exceptions=True)
        if self._state is not _State.WRITING:
            return
        handle = self._handle
        try:
            await handle.close()
        except LedgerFencedError as e:
            self._fence(f"ledger {handle.ledger_id} was fenced: {e.message}")
            return
        except MagnetarError as e:
            # the next owner recovers the ledger and learns its end
            self._log.warning("ledger_close_failed", ledger=handle.ledger_id, error=e.message)
            return
        try:
            await self._update_info(lambda ledgers: ledgers)  # the current ledger's final counts
        except ManagedLedgerFencedError:
            return
        except MagnetarError as e:
            self._log.warning("managed_ledger_info_not_updated", error=e.message)

    def _finish_close(self) -> None:
        if self._state is _State.CLOSED:
            return
        was_fenced = self._state is _State.FENCED
        self._state = _State.CLOSED
        error = (
            self._fenced_error()
            if was_fenced
            else ManagedLedgerClosedError(
                f"managed ledger {self.name!r} was closed", context={"name": self.name}
            )
        )
        self._fail_pending(error)
        self._wake_waiters(error)
        for cursor in self._cursors.values():
            cursor._cancel_persist()
        # each cursor refers back to this ledger: a cycle that only the cyclic collector would
        # free, and the servers' tuning (magnetar/common/gc_tuning.py) runs it rarely
        self._cursors.clear()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        self._read_handles.clear()
        if self._on_close is not None:
            self._on_close(self)
        self._log.info("managed_ledger_closed", fenced=was_fenced)

    # --- helpers ------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, _T], what: str) -> asyncio.Task[_T]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._task_done, what))
        return task

    def _task_done(self, what: str, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        # an ended task is let go of: one that ended with an error (a cancelled one keeps its
        # CancelledError) holds its frames, and so this ledger, through the traceback; kept
        # here too, it would make a cycle that only the cyclic collector frees, which the
        # servers' tuning (magnetar/common/gc_tuning.py) runs too rarely for the memory of a
        # closed ledger to come back
        if self._pump is task:
            self._pump = None
        if self._switch is task:
            self._switch = None
        if self._trimmer is task:
            self._trimmer = None
        if self._periodic is task:
            self._periodic = None
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._log.error("managed_ledger_task_failed", task=what, error=repr(error))


# --- opening helpers ----------------------------------------------------------------------------


async def _read_or_create_info(store: MetadataStore, name: str, key: str) -> tuple[StoredInfo, int]:
    while True:
        record = await store.get(key)
        if record is not None:
            return decode_info(name, record.value), record.version
        info = StoredInfo()
        with contextlib.suppress(KeyExistsError):  # else created by someone else meanwhile
            return info, await store.create(key, encode_info(info))


async def _recover_last(
    client: LedgerClientApi, codec: EntryCodec, name: str, last: LedgerRecord
) -> LedgerReader | None:
    """Recover (fence and close) the last ledger and update its counts from its real end.

    Returns its read handle, or ``None`` if it holds no entry.
    """
    try:
        reader = await client.open_ledger(last.ledger_id, recovery=True)
    except LedgerNotFoundError:
        if last.entries == 0:
            return None  # created, listed, never written, and since deleted
        raise ManagedLedgerError(
            f"ledger {last.ledger_id} of managed ledger {name!r} holds {last.entries} entries"
            " in the info but has no metadata: its data is lost",
            context={"name": name, "ledger": last.ledger_id},
        ) from None
    last_entry_id = reader.last_add_confirmed
    if last_entry_id < 0:
        return None
    (entry,) = await reader.read(last_entry_id, last_entry_id)
    meta = codec.describe(entry.payload)
    entries = last_entry_id + 1
    if reader.metadata.length >= 0:
        size = reader.metadata.length
    elif last.entries == entries and last.size_bytes > 0:
        size = last.size_bytes
    else:
        # recovery records no length: estimate from the last entry (see docs/managed-ledger.md)
        size = len(entry.payload) * entries
    last.entries = entries
    last.size_bytes = size
    last.messages = meta.first_offset + meta.num_messages - last.first_offset
    last.last_publish_time_ms = meta.publish_time_ms
    log.info(
        "managed_ledger_last_ledger_recovered",
        managed_ledger=name,
        ledger=last.ledger_id,
        entries=entries,
        next_offset=meta.first_offset + meta.num_messages,
    )
    return reader


async def _create_ledger(
    client: LedgerClientApi, config: ManagedLedgerConfig, name: str
) -> LedgerWriter:
    return await client.create_ledger(
        ensemble_size=config.ensemble_size,
        write_quorum=config.write_quorum,
        ack_quorum=config.ack_quorum,
        custom={LEDGER_PROPERTY: name.encode()},
    )


async def _delete_quietly(client: LedgerClientApi, ledger_id: int, name: str) -> None:
    try:
        await client.delete_ledger(ledger_id)
    except LedgerNotFoundError:
        pass
    except MagnetarError as e:
        log.warning("ledger_delete_failed", managed_ledger=name, ledger=ledger_id, error=e.message)


def _check_limit(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgumentError(
            f"{name} must be an int >= 1, got {value!r}", context={name: repr(value)}
        )
