"""Writing a managed ledger: the append queue, the pump, and switching ledgers (roll, write
failure, recovery), with the write problem while a switch step keeps failing.

See the module doc of :mod:`broker.managed_ledger.managed_ledger` for the sequence; this module
is its code. The writer owns the queue and the current ledger's write handle, moves the
confirmed end (:class:`LogState`) and the confirmed counts of the last ledger, and puts confirmed
entries in the cache.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from broker.managed_ledger.cache import EntryCache
from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.ledger_list import LedgerRecord
from broker.managed_ledger.ledger_ops import create_ledger, delete_quietly
from broker.managed_ledger.metadata_writes import MetadataWrites
from broker.managed_ledger.ports import (
    MAX_ENTRY_BYTES,
    LedgerClientApi,
    LedgerMetadataView,
    LedgerWriter,
)
from broker.managed_ledger.rollover import RolloverPolicy, RollReason
from broker.managed_ledger.state import Lifecycle, LogState, State
from broker.managed_ledger.types import AppendResult, Entry, Position
from magnetar.common.clock import Clock
from magnetar.common.errors import (
    EnsembleUnrepairableError,
    EntryTooLargeError,
    InternalError,
    InvalidArgumentError,
    LedgerFencedError,
    MagnetarError,
    ManagedLedgerClosedError,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    ManagedLedgerTerminatedError,
)

log = structlog.get_logger("magnetar.managed_ledger")

_T = TypeVar("_T")

_RETRY_FIRST_S = 0.1
_RETRY_MAX_S = 5.0


def _nothing() -> None:
    pass


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


class Writer:
    """Appends to one managed ledger, in order, through its current ledger."""

    def __init__(
        self,
        name: str,
        *,
        config: ManagedLedgerConfig,
        life: Lifecycle,
        log_state: LogState,
        metadata: MetadataWrites,
        client: LedgerClientApi,
        cache: EntryCache,
        clock: Clock,
        handle: LedgerWriter,
        next_offset: int,
        last_publish_time_ms: int,
        on_confirmed: Callable[[], None],
        on_new_ledger: Callable[[], None],
        on_broken: Callable[[], None],
    ) -> None:
        """``on_confirmed``: entries were confirmed; ``on_new_ledger``: a new ledger takes
        writes (the old one may be trimmed); ``on_broken``: a bug stopped a switch, give the
        instance up."""
        self._name = name
        self._config = config
        self._life = life
        self._log_state = log_state
        self._metadata = metadata
        self._client = client
        self._cache = cache
        self._clock = clock
        self._handle = handle
        self._policy = RolloverPolicy.from_config(config)
        self._on_confirmed = on_confirmed
        self._on_new_ledger = on_new_ledger
        self._on_broken = on_broken
        self._log = log.bind(managed_ledger=name)

        self._pending: deque[_Append] = deque()
        self._unsent: deque[_Append] = deque()
        self._pending_bytes = 0
        self._next_offset = next_offset
        self._last_publish_ms = last_publish_time_ms
        self._sent_entries = 0  # adds handed to the current ledger's writer
        self._sent_bytes = 0
        self._pump: asyncio.Task[None] | None = None
        self._switch: asyncio.Task[None] | None = None

        self.entries_added = 0
        self.bytes_added = 0
        self.messages_added = 0
        self.write_problem: MagnetarError | None = None
        self.write_problem_since_ms = 0
        self.on_write_problem: Callable[[MagnetarError | None], None] | None = None

    # --- state --------------------------------------------------------------------------------

    @property
    def handle(self) -> LedgerWriter:
        """The current ledger's write handle."""
        return self._handle

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def pending_appends(self) -> int:
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        task = self._life.spawn(coro, what)
        task.add_done_callback(self._forget_task)
        return task

    def _forget_task(self, task: asyncio.Task[Any]) -> None:
        # an ended task is let go of: one that ended with an error (a cancelled one keeps its
        # CancelledError) holds its frames, and so the managed ledger, through the traceback;
        # kept here too, it would make a cycle that only the cyclic collector frees, which the
        # servers' tuning (magnetar/common/server/gc_tuning.py) runs too rarely for the memory of a
        # closed ledger to come back
        if self._pump is task:
            self._pump = None
        if self._switch is task:
            self._switch = None

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
        """See :meth:`ManagedLedger.append`."""
        self._life.check_usable()
        self._life.check_not_closing()
        if self._metadata.info.terminated:
            raise ManagedLedgerTerminatedError(
                f"managed ledger {self._name!r} is terminated and takes no more entries",
                context={"name": self._name},
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
            self._life.state is State.WRITING
            and self._unsent
            and (self._pump is None or self._pump.done())
            and not self._hand_over()
        ):
            # the ledger's pending window is full: a pump waits for room
            self._pump = self._spawn(self._run_pump(), "pump")

    def _roll_reason(self) -> RollReason | None:
        return self._policy.reason(
            entries=self._sent_entries,
            size_bytes=self._sent_bytes,
            age_ms=self._clock.time_ms() - self._log_state.ledgers[-1].created_ms,
        )

    def _hand_over(self) -> bool:
        """Hand queued entries, in order, to the current ledger as far as it takes them without
        waiting, rolling first when it is due. False when an entry is left that must wait for
        room (the pump's job); True when nothing is left for a pump (all handed over, or a
        switch or failure took over). An entry that finds room costs no task."""
        while self._unsent and self._life.state is State.WRITING:
            reason = self._roll_reason()
            if reason is not None:
                self._start_switch(reason.value)
                return True
            handle = self._handle
            try:
                confirmed = handle.add_nowait(self._unsent[0].payload)
            except MagnetarError as e:
                self._writer_failed(handle, e)
                return True
            if confirmed is None:
                return False
            self._sent(handle, confirmed)
        self._roll_if_full()
        return True

    async def _run_pump(self) -> None:
        """Hand queued entries, in order, to the current ledger, waiting for room in it."""
        while not self._hand_over():
            handle = self._handle
            try:
                confirmed = await handle.add_async(self._unsent[0].payload)
            except MagnetarError as e:
                self._writer_failed(handle, e)
                return
            if self._life.state is not State.WRITING or not self._unsent:
                return  # fenced or closed meanwhile; the entry's fate no longer matters
            self._sent(handle, confirmed)

    def _sent(self, handle: LedgerWriter, confirmed: asyncio.Future[int]) -> None:
        """The head of the unsent queue was handed to ``handle``."""
        append = self._unsent.popleft()
        append.ledger_id = handle.ledger_id
        append.entry_id = self._sent_entries
        self._sent_entries += 1
        self._sent_bytes += len(append.payload)
        confirmed.add_done_callback(functools.partial(self._add_done, handle, append))

    def _roll_if_full(self) -> None:
        if self._life.state is State.WRITING and not self._life.closing and self._sent_entries > 0:
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
            self._log_state.last_confirmed = position
            self._log_state.confirmed_next_offset = append.first_offset + append.num_messages
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
            self._on_confirmed()

    def _ledger_of(self, ledger_id: int) -> LedgerRecord:
        ledgers = self._log_state.ledgers
        i = ledgers.find(ledger_id)
        if i is None:
            raise InternalError(f"ledger {ledger_id} is not in managed ledger {self._name!r}")
        return ledgers[i]

    # --- switching ledgers --------------------------------------------------------------------

    def _writer_failed(self, handle: LedgerWriter, error: MagnetarError) -> None:
        if self._life.stopped or handle is not self._handle:
            return
        if isinstance(error, LedgerFencedError):
            self._life.fence(f"ledger {handle.ledger_id} was fenced: {error.message}")
            return
        if self._life.state is State.WRITING:
            self._log.warning(
                "managed_ledger_write_failed", ledger=handle.ledger_id, error=error.message
            )
            self._start_switch("write_failure")
        # already switching: closing the handle reports the same failure

    def roll_if_due(self) -> None:
        """Roll a ledger that got too old while idle, or an under-striped one once E bookies
        are writable again (called every ``trim_interval_ms``)."""
        if (
            self._life.state is State.WRITING
            and not self._life.closing
            and (self._pump is None or self._pump.done())
            and self._sent_entries > 0
        ):
            reason = self._roll_reason()
            if reason is not None:
                self._start_switch(reason.value)
            elif self._restripe_due():
                self._start_switch("restripe")

    def _restripe_due(self) -> bool:
        """The current ledger is under-striped and its full E of bookies is writable again:
        roll early, so that the load spreads over all of them again."""
        metadata = self._handle.metadata
        return (
            metadata.under_striped
            and self._client.writable_bookies() >= metadata.intended_ensemble_size
        )

    def _start_switch(self, reason: str) -> None:
        self._life.state = State.SWITCHING
        self._switch = self._spawn(self._run_switch(reason), "switch")

    async def _run_switch(self, reason: str) -> None:
        old = self._handle
        try:
            try:
                await old.close()
            except LedgerFencedError as e:
                self._life.fence(f"ledger {old.ledger_id} was fenced: {e.message}")
                return
            except MagnetarError as e:
                await self._recover_failed(old, e)
            await self._start_next_ledger(reason)
        except _Stop:
            self.fail_pending(self._stopped_error())
        except Exception as e:  # noqa: BLE001 - logged; the instance is given up
            # a bug: give up this instance (the broker reopens it, as a new owner would)
            self._log.exception("managed_ledger_switch_failed", error=repr(e))
            self._on_broken()

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
                self._life.fence(f"ledger {old.ledger_id} was fenced: {e.message}")
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
        old = self._log_state.ledgers[-1]
        handle = await self._retrying(
            "create_ledger",
            functools.partial(create_ledger, self._client, self._config, self._name),
        )
        new = LedgerRecord(
            handle.ledger_id, self._log_state.confirmed_next_offset, self._clock.time_ms()
        )
        dropped = old if old.entries == 0 else None

        def switch(ledgers: list[LedgerRecord]) -> list[LedgerRecord]:
            return [ledger for ledger in ledgers if ledger is not dropped] + [new]

        try:
            await self._retrying(
                "update_info", functools.partial(self._metadata.update_info, switch)
            )
        except _Stop:
            await delete_quietly(self._client, handle.ledger_id, self._name)
            raise
        self._handle = handle
        self._sent_entries = 0
        self._sent_bytes = 0
        self._life.state = State.WRITING
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
            self._life.spawn(delete_quietly(self._client, dropped.ledger_id, self._name), "delete")
        self._kick()
        self._on_new_ledger()

    async def _retrying(self, what: str, step: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``step`` until it works; stop (``_Stop``) once fenced, or closing after a failure."""
        delay = _RETRY_FIRST_S
        while True:
            if self._life.stopped:
                raise _Stop
            try:
                return await step()
            except ManagedLedgerFencedError:
                raise _Stop from None
            except MagnetarError as e:
                if self._life.closing:
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
        if self._life.state is State.FENCED:
            return self._life.fenced_error()
        return ManagedLedgerClosedError(
            f"managed ledger {self._name!r} was closed before the entry could be written",
            context={"name": self._name},
        )

    def fail_pending(self, error: ManagedLedgerError) -> None:
        """Fail every append not confirmed yet (fenced or closed)."""
        for append in self._pending:
            if not append.future.done():
                append.future.set_exception(error)
        self._pending.clear()
        self._unsent.clear()
        self._pending_bytes = 0

    # --- closing ------------------------------------------------------------------------------

    def detach(self) -> None:
        """Let go of the callbacks: they refer back to the managed ledger, a reference cycle
        that only the cyclic collector would free (the managed ledger is closed)."""
        self._on_confirmed = self._on_new_ledger = self._on_broken = _nothing

    async def finish(self) -> None:
        """Wait for the pending appends and a switch under way, close the current ledger and
        record its final counts in the info (a graceful close; failures are logged, the next
        owner recovers the ledger)."""
        while self._pending and self._life.live:
            await asyncio.gather(self._pending[-1].future, return_exceptions=True)
        if self._switch is not None and not self._switch.done():
            await asyncio.gather(self._switch, return_exceptions=True)
        if self._life.state is not State.WRITING:
            return
        handle = self._handle
        try:
            await handle.close()
        except LedgerFencedError as e:
            self._life.fence(f"ledger {handle.ledger_id} was fenced: {e.message}")
            return
        except MagnetarError as e:
            # the next owner recovers the ledger and learns its end
            self._log.warning("ledger_close_failed", ledger=handle.ledger_id, error=e.message)
            return
        try:
            await self._metadata.update_info(lambda ledgers: ledgers)  # final counts
        except ManagedLedgerFencedError:
            return
        except MagnetarError as e:
            self._log.warning("managed_ledger_info_not_updated", error=e.message)
