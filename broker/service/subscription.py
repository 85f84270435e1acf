"""Subscriptions and their consumers: reading entries for them, acks, redelivery.

A :class:`Subscription` is a cursor plus the consumers attached to it and one dispatch task. The
rules of who gets what live in :mod:`broker.service.dispatch` (no I/O); this module reads the
entries those rules ask for and turns their decisions into deliveries. The dispatcher reads only
while some consumer has permits (flow control counts messages; an entry of k messages uses k),
so a slow consumer holds back reads instead of filling memory; and it reads no new entries while
the cursor's acknowledgement holes are at ``max_inline_ack_ranges`` (the cursor persists every
range; this keeps that state small) or the subscription holds its unacknowledged limit.
Non-durable **readers** are exclusive subscriptions whose cursor is never persisted.

Entries held aside for delayed delivery are written to the subscription's delay index
(:mod:`broker.service.delay_index`) in sealed buckets by one task per subscription, and a new
owner loads those buckets before its first read, so that it need not read them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import TYPE_CHECKING

import structlog

from broker.managed_ledger import Entry, ManagedCursor, ManagedLedger, Position
from broker.service.delay_index import DelayIndex
from broker.service.dispatch import Dispatcher, Item, Plan, Slot
from broker.service.streams import (
    AckDone,
    ActiveChange,
    Closable,
    ConsumerEvent,
    Deliveries,
    DeliveryItem,
    OffsetStart,
    RequestFailed,
    SeekDone,
    Start,
    StreamClosed,
    SubscriptionType,
)
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    ConsumerBusyError,
    InvalidArgumentError,
    MagnetarError,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    ServiceNotReadyError,
)

if TYPE_CHECKING:
    from broker.service.topic import Topic

log = structlog.get_logger("magnetar.broker.subscription")

PartialAck = tuple[Position, tuple[int, ...], int]
"""(entry, acknowledged batch indexes, messages in the entry)."""


class ConsumerSession(Closable):
    """One consumer stream attached to a subscription."""

    def __init__(
        self,
        subscription: Subscription,
        name: str,
        address: str = "",
        priority_level: int = 0,
        *,
        whole_entries: bool = False,
    ) -> None:
        super().__init__()
        self.subscription = subscription
        self.name = name
        self.address = address
        self.priority_level = priority_level
        self.whole_entries = whole_entries
        self.slot = Slot(name, priority_level)
        """Replaced by the dispatcher's slot when the consumer is added."""
        self.events: asyncio.Queue[ConsumerEvent] = asyncio.Queue()
        self._confirming: set[asyncio.Task[None]] = set()
        """Acks waiting for their receipt until the cursor is persisted."""
        self.msgs_out = 0
        self.bytes_out = 0
        self.buffered_bytes = 0
        """Bytes of deliveries handed to this stream that its client has not taken yet."""
        self.grant = 0
        """Counts permit grants: a seek drops the permits, and the client grants anew."""

    def delivered(self, size: int) -> None:
        """Deliveries of ``size`` bytes are queued for the stream."""
        self.buffered_bytes += size
        if self.buffered_bytes >= self.subscription.topic.config.max_consumer_buffer_bytes:
            self.slot.backlogged = True

    def taken(self, size: int) -> None:
        """The client took ``size`` bytes of deliveries (the stream wrote them): below half
        the bound, the consumer gets deliveries again."""
        self.buffered_bytes = max(0, self.buffered_bytes - size)
        limit = self.subscription.topic.config.max_consumer_buffer_bytes
        if self.slot.backlogged and self.buffered_bytes < limit // 2:
            self.slot.backlogged = False
            self.subscription.wake()

    def still_unacked(self, deliveries: Deliveries) -> list[DeliveryItem]:
        """Of deliveries about to be written to the stream, those whose entry is not
        acknowledged now.

        Deliveries wait in :attr:`events` until the stream writes them, and an ack from another
        consumer (shared, key_shared: any consumer may acknowledge what another holds, and one
        that reconnects resends its unreceipted acks) can come in meanwhile. Such an entry is
        not written: once an ack is applied the broker writes no copy of its entry, so its
        receipt can only be overtaken by copies written before. The dropped messages' permits
        go back to the consumer (unless a seek dropped its permits since), and their bytes
        count as taken."""
        items = deliveries.items
        if not self.subscription.durable:
            return items  # a reader acknowledges nothing
        cursor = self.subscription.cursor
        kept = [item for item in items if not cursor.is_acked(item.position)]
        if len(kept) == len(items):
            return items
        dropped = [item for item in items if cursor.is_acked(item.position)]
        self.taken(sum(len(item.payload) for item in dropped))
        if deliveries.grant == self.grant:
            permits = sum(len(item.batch_indexes) or item.num_messages for item in dropped)
            self.subscription.flow(self, permits)
        return kept

    @property
    def permits(self) -> int:
        return self.slot.permits

    @property
    def unacked_messages(self) -> int:
        return self.slot.unacked_messages

    # --- requests from the client ---------------------------------------------------------------

    def flow(self, permits: int) -> None:
        self.subscription.flow(self, permits)

    def ack(
        self,
        positions: list[Position],
        *,
        cumulative: bool,
        request_id: int = 0,
        partial: list[PartialAck] | None = None,
        dead_lettered: int = 0,
    ) -> None:
        try:
            self.subscription.ack(self, positions, cumulative=cumulative, partial=partial or [])
        except MagnetarError as e:
            self.events.put_nowait(RequestFailed(request_id, e))
            return
        self.subscription.dead_lettered += dead_lettered
        if request_id:
            # a receipt says the ack is persisted: one confirmed only in memory could be lost
            # with this broker (magnetar verify --seed 2 --pace 0.3 --zombie-s 6 saw acks
            # confirmed before an etcd leader change stalled the persist, then redelivered)
            task = asyncio.create_task(
                self._confirm_when_persisted(request_id, self.subscription.cursor.changes)
            )
            self._confirming.add(task)
            task.add_done_callback(self._confirming.discard)

    async def _confirm_when_persisted(self, request_id: int, changes: int) -> None:
        cursor = self.subscription.cursor
        limit_s = max(10.0, 10 * cursor.persist_interval_s)
        try:
            await asyncio.wait_for(cursor.wait_persisted(changes), limit_s)
        except MagnetarError as e:
            self.events.put_nowait(RequestFailed(request_id, e))
        except TimeoutError:
            self.events.put_nowait(
                RequestFailed(
                    request_id,
                    ServiceNotReadyError(
                        f"the ack could not be persisted in {limit_s:g} s; it is sent again"
                        " when the consumer reconnects",
                        context={"subscription": self.subscription.name},
                    ),
                )
            )
        else:
            self.events.put_nowait(AckDone(request_id))

    def nack(self, positions: list[Position], delay_ms: int) -> None:
        self.subscription.nack(self, positions, delay_ms)

    def redeliver(self, positions: list[Position]) -> None:
        self.subscription.redeliver(self, positions)

    async def seek(self, start: Start, request_id: int) -> None:
        # a consumer of a partitioned topic seeks every partition to the same offset, and the
        # partitions hold different numbers of messages: past a partition's end means its end
        strict = not (
            isinstance(start, OffsetStart) and self.subscription.topic.name.partition >= 0
        )
        try:
            await self.subscription.seek(start, requester=self, strict=strict)
        except MagnetarError as e:
            self.events.put_nowait(RequestFailed(request_id, e))
            return
        self.slot.permits = 0
        self.grant += 1
        self.events.put_nowait(SeekDone(request_id))

    def detach(self) -> None:
        """The stream ended: leave the subscription."""
        self.subscription.remove_consumer(self)

    def close_with(self, reason: MagnetarError) -> None:
        if not self.is_closed:
            self.events.put_nowait(StreamClosed(reason))
        super().close_with(reason)


class Subscription:
    """A cursor, its consumers and the task that dispatches entries to them."""

    def __init__(
        self,
        topic: Topic,
        name: str,
        cursor: ManagedCursor,
        subscription_type: SubscriptionType,
        *,
        durable: bool,
        max_entries: int,
        max_bytes: int,
        max_unacked_per_consumer: int = 0,
        max_unacked_per_subscription: int = 0,
        max_replay_entries: int = 10_000,
        max_delayed_entries: int = 200_000,
        delayed_index_bucket_entries: int = 5_000,
        delayed_index_seal_ms: int = 5_000,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.topic = topic
        self.name = name
        self.cursor = cursor
        self.durable = durable
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._limits = (
            max_unacked_per_consumer,
            max_unacked_per_subscription,
            max_replay_entries,
            max_delayed_entries,
        )
        self._index_settings = (delayed_index_bucket_entries, delayed_index_seal_ms)
        self._index_loaded = not durable
        """The persisted delay index was loaded (a reader keeps none)."""
        self._index_task: asyncio.Task[None] | None = None
        self.delayed_entries_loaded = 0
        """Entries held aside from the delay index when it was last loaded."""
        self._clock = clock
        self.consumers: list[ConsumerSession] = []
        self._sessions: dict[int, ConsumerSession] = {}
        self.dispatcher = self._new_dispatcher(subscription_type)
        self._start_filter: tuple[Position, int] | None = None
        self._epoch = 0
        self._largest_batch = 0.0
        """Messages in the largest recent entry (0: none read yet), to turn permits into entries."""
        self._repositioned = cursor.read_position
        self._wake = asyncio.Event()
        self._entries_waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._timers: set[asyncio.TimerHandle] = set()
        self._due_timer: asyncio.TimerHandle | None = None
        self._counts_waiter: asyncio.Task[None] | None = None
        self._blocked_logged: str | None = None
        self.dead_lettered = 0
        self.msgs_out = 0
        self.bytes_out = 0
        """Messages and entry bytes dispatched to this subscription's consumers (the topic's
        counters add them up)."""
        if durable:
            cursor.record_subscription_type(int(subscription_type))

    def _new_dispatcher(self, subscription_type: SubscriptionType) -> Dispatcher:
        per_consumer, per_subscription, replay, delayed = self._limits
        return Dispatcher(
            subscription_type,
            partition=self.topic.name.partition,
            max_unacked_per_consumer=per_consumer,
            max_unacked_per_subscription=per_subscription,
            max_replay_entries=replay,
            track_unacked=self.durable,
            max_delayed_entries=delayed,
            redelivery_counts=self.cursor.redelivery_counts,
            delay_index=self._new_index(),
        )

    def _new_index(self) -> DelayIndex:
        bucket_entries, seal_ms = self._index_settings
        return DelayIndex(
            bucket_entries=bucket_entries if self.durable else 0, seal_after_ms=seal_ms
        )

    @property
    def type(self) -> SubscriptionType:
        return self.dispatcher.type

    @property
    def ml(self) -> ManagedLedger:
        return self.topic.ml

    @property
    def msgs_redelivered(self) -> int:
        return self.dispatcher.msgs_redelivered

    @property
    def blocked_reason(self) -> str | None:
        """Why no new entries are dispatched, if they are not (None: they are)."""
        if self.dispatcher.blocked:
            return "the subscription holds max_unacked_messages_per_subscription unacknowledged"
        if self.durable and self.cursor.ack_ranges_over_limit:
            return "the acknowledgement holes reached max_inline_ack_ranges"
        if self.dispatcher.delayed_full:
            return "the delayed entries held aside reached dispatch_max_delayed_entries"
        return None

    # --- consumers ------------------------------------------------------------------------------

    def change_type(self, subscription_type: SubscriptionType) -> None:
        """A subscription without consumers takes the type its next consumer asks for."""
        if self.consumers:
            raise ConsumerBusyError(f"subscription {self.name!r} has consumers attached")
        self.dispatcher = self._new_dispatcher(subscription_type)
        self.cursor.parked_entries = 0
        self._reposition(None)
        # the buckets written for the old type: held aside again (shared, key_shared) or
        # deleted (exclusive, failover) before the next read
        self._index_loaded = not self.durable
        if self.durable:
            self.cursor.record_subscription_type(int(subscription_type))

    def add_consumer(self, consumer: ConsumerSession) -> None:
        if self.consumers and self.type is SubscriptionType.EXCLUSIVE:
            raise ConsumerBusyError(
                f"subscription {self.name!r} on {self.topic.name} is exclusive and consumer"
                f" {self.consumers[0].name!r} is attached",
                context={"subscription": self.name, "topic": str(self.topic.name)},
            )
        slot, changes, rewind = self.dispatcher.add(
            consumer.name, consumer.priority_level, whole_entries=consumer.whole_entries
        )
        consumer.slot = slot
        self.consumers.append(consumer)
        self._sessions[slot.seq] = consumer
        self._after_change(changes, rewind)
        if self._task is None:
            self._task = asyncio.create_task(
                self._dispatch_loop(), name=f"dispatch:{self.topic.name}:{self.name}"
            )
        self.wake()

    def remove_consumer(self, consumer: ConsumerSession) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        self._sessions.pop(consumer.slot.seq, None)
        if self.topic.is_closing:
            # the partition is moving or closing: its cursor (and the redelivery counts in it)
            # is already persisted, and the next owner delivers again what the consumer held
            # with the counts as they were; raising them now would be lost or half-kept
            return
        changes, rewind = self.dispatcher.remove(consumer.slot)
        self._after_change(changes, rewind)
        if not self.durable and not self.consumers:
            self.topic.drop_subscription(self)
        self.wake()

    def _after_change(self, changes: list[tuple[Slot, bool]], rewind: bool) -> None:
        for slot, active in changes:
            session = self._sessions.get(slot.seq)
            if session is not None and not session.is_closed:
                session.events.put_nowait(ActiveChange(active))
                log.info(
                    "consumer_active_change",
                    topic=str(self.topic.name),
                    subscription=self.name,
                    consumer=session.name,
                    active=active,
                )
        if rewind:
            self._reposition(None)

    def set_start_filter(self, position: Position, first_batch_index: int) -> None:
        """The first entry delivered at ``position`` skips messages before this index."""
        if first_batch_index > 0:
            self._start_filter = (position, first_batch_index)

    def flow(self, consumer: ConsumerSession, permits: int) -> None:
        self.dispatcher.flow(consumer.slot, permits)
        self.wake()

    # --- acks and redelivery ----------------------------------------------------------------------

    def ack(
        self,
        consumer: ConsumerSession,
        positions: list[Position],
        *,
        cumulative: bool,
        partial: list[PartialAck],
    ) -> None:
        """Apply acknowledgements; an unknown position raises :class:`InvalidArgumentError`
        (with nothing of that request's whole-entry acks applied)."""
        dispatcher = self.dispatcher
        for position, indexes, batch_size in partial:
            self._check_partial(position, indexes, batch_size)
        if cumulative:
            if not positions:
                return
            if dispatcher.shares:
                raise InvalidArgumentError(
                    f"subscription {self.name!r} is {self.type.name.lower()}: cumulative"
                    " acknowledgement is for exclusive and failover subscriptions; acknowledge"
                    " messages one by one",
                    context={"subscription": self.name},
                )
            last = max(positions)
            self.cursor.ack_cumulative(last)
            dispatcher.acked_through(consumer.slot, last)
        elif positions:
            self.cursor.ack(positions)
            for position in positions:
                dispatcher.acked(consumer.slot, position)
        for position, indexes, batch_size in partial:
            complete = self.cursor.ack_indexes(position, indexes, batch_size)
            dispatcher.acked_partly(consumer.slot, position, frozenset(indexes), complete=complete)
        self.topic.cursor_moved()
        self.wake()

    def messages_in(self, position: Position) -> int | None:
        """How many messages the entry at ``position`` holds, when the subscription knows (a
        consumer holds the entry, or the cursor read it)."""
        known = next(
            (
                held.num_messages
                for slot in self.dispatcher.slots
                if (held := slot.unacked.get(position)) is not None
            ),
            None,
        )
        if known is None:
            known = self.cursor.messages_in(position)
        return known

    def _check_partial(self, position: Position, indexes: tuple[int, ...], batch_size: int) -> None:
        """Refuse a partial ack whose batch size or indexes do not fit the entry: the real
        message count when the subscription knows it (a consumer holds the entry, or the
        cursor read it), else the claimed one within ``max_messages_per_batch`` (the cursor
        persists a bit per message)."""
        known = self.messages_in(position)
        where = f"the entry at {tuple(position)}"
        if known is not None and batch_size != known:
            raise InvalidArgumentError(
                f"a partial ack says {where} holds {batch_size:,} messages; it holds {known:,}",
                context={"position": tuple(position), "batch_size": batch_size, "held": known},
            )
        limit = self.topic.config.max_messages_per_batch
        if not 1 <= batch_size <= limit:
            raise InvalidArgumentError(
                f"a partial ack says {where} holds {batch_size:,} messages; an entry holds 1"
                f" to {limit:,}",
                context={"position": tuple(position), "batch_size": batch_size},
            )
        wrong = next((i for i in indexes if not 0 <= i < batch_size), None)
        if wrong is not None:
            raise InvalidArgumentError(
                f"batch index {wrong:,} is not a message of {where}, which holds"
                f" {batch_size:,} (indexes 0 to {batch_size - 1:,})",
                context={"position": tuple(position), "batch_index": wrong},
            )

    def nack(self, consumer: ConsumerSession, positions: list[Position], delay_ms: int) -> None:
        held = [p for p in positions if p in consumer.slot.unacked]
        if not held:
            return
        if delay_ms <= 0:
            self._requeue(consumer, held)
            return
        # counted now, not when the delay ends: a handover in between keeps the count
        self.dispatcher.count_redeliveries(consumer.slot, held)
        loop = asyncio.get_running_loop()

        def due() -> None:
            self._timers.discard(handle)
            self._requeue(consumer, held)

        handle = loop.call_later(delay_ms / 1000, due)
        self._timers.add(handle)

    def redeliver(self, consumer: ConsumerSession, positions: list[Position]) -> None:
        self._requeue(consumer, positions or list(consumer.slot.unacked))

    def _requeue(self, consumer: ConsumerSession, positions: list[Position]) -> None:
        if consumer.slot.closed:
            return  # it left: what it held was requeued then
        self.dispatcher.requeue(consumer.slot, positions)
        self.wake()

    async def seek(
        self, start: Start, *, requester: ConsumerSession | None = None, strict: bool = True
    ) -> None:
        """Move the subscription to ``start``: everything before it counts as acknowledged,
        nothing after it does. Consumers other than ``requester`` are closed (they resubscribe
        and start afresh, as in Pulsar); an admin reset closes them all."""
        position, first_index = await self.topic.resolve_start(start, strict=strict)
        self.dispatcher.reset()
        self.cursor.parked_entries = 0
        for consumer in list(self.consumers):
            if consumer is not requester:
                consumer.close_with(
                    ServiceNotReadyError(
                        f"subscription {self.name!r} was reset to another position; resubscribe",
                        context={"subscription": self.name},
                    )
                )
        # a reader's cursor is reset too: its mark-delete (where it started, or what it read)
        # would otherwise hide the entries before it that the seek asks for
        await self.cursor.reset(position)
        self._reposition(position)
        self._start_filter = None
        self.set_start_filter(position, first_index)
        self.topic.cursor_moved()
        self.wake()

    def expire_before(self, position: Position) -> bool:
        """Message TTL: acknowledge every entry before ``position``; whether anything moved."""
        if not self.cursor.expire_before(position):
            return False
        self.dispatcher.forget_through(self.cursor.mark_delete)
        self.cursor.parked_entries = len(self.dispatcher.delayed)
        self.topic.cursor_moved()
        self.wake()
        return True

    def _reposition(self, position: Position | None) -> None:
        """Move the read position (None: back to the first unacknowledged entry) and make a
        dispatch read that is under way drop what it read."""
        self._epoch += 1
        if position is None:
            self.cursor.rewind()
        else:
            self.cursor.seek(position)
        self._repositioned = self.cursor.read_position

    # --- dispatch ---------------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()
        waiter = self._entries_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _dispatch_loop(self) -> None:
        while True:
            try:
                await self._dispatch_once()
            except asyncio.CancelledError:
                raise
            except ManagedLedgerFencedError as e:
                self.topic.fenced(e)
                return
            except ManagedLedgerError as e:
                if self.topic.is_closing:
                    return
                log.warning("dispatch_read_failed", topic=str(self.topic.name), error=e.message)
                await asyncio.sleep(0.5)
            except MagnetarError as e:
                log.warning("dispatch_failed", topic=str(self.topic.name), error=e.message)
                await asyncio.sleep(0.5)

    async def _dispatch_once(self) -> None:
        if not self._index_loaded:
            await self._load_delay_index()
        dispatcher = self.dispatcher
        # a raised redelivery count is durable before its entry goes out again, so that a new
        # owner after a crash carries on from it (one metadata write, group-committed). Shared
        # and key_shared redeliver from replay only: new entries go on meanwhile. Exclusive and
        # failover redeliver by rewinding: everything waits.
        counts_ready = self.cursor.counts_persisted
        if not counts_ready and not dispatcher.shares:
            await self.cursor.wait_counts_persisted()
            return
        now_ms = self._clock.time_ms()
        if dispatcher.delayed:
            if dispatcher.release_due(now_ms):
                self._wake.set()
                self.cursor.parked_entries = len(dispatcher.delayed)
            self._arm_due_timer(now_ms)
        if not dispatcher.can_dispatch():
            self._note_blocked()
            await self._sleep()
            return
        epoch = self._epoch
        candidates = dispatcher.replay_candidates(self._max_entries) if counts_ready else []
        if not counts_ready and dispatcher.replay:
            self._wake_when_counts_persisted()
        if candidates:
            items, entries = await self._read_replay(candidates)
        else:
            budget = dispatcher.fresh_budget()
            ceiling = self._hole_ceiling()
            if ceiling is not None and self.cursor.read_position > ceiling:
                budget = 0  # at the hole limit: only entries inside the holes may go out
            if budget <= 0:
                self._note_blocked()
                await self._sleep()
                return
            if not self.cursor.has_more:
                self._wake.clear()
                await self._wait_for_entries()
                return
            # permits count messages and an entry holds a batch: read only as many entries as
            # the permits cover at the largest recent batch size (one entry to learn it)
            largest = self._largest_batch
            wanted = budget // math.ceil(largest) if largest else 1
            read = await self.cursor.read(
                max_entries=max(1, min(wanted, self._max_entries)), max_bytes=self._max_bytes
            )
            if epoch != self._epoch:
                # a rewind or seek during the read moved the read position on past entries
                # that are now dropped: put it back where the rewind or seek wanted
                self.cursor.seek(self._repositioned)
                return
            if ceiling is not None and read and read[-1].position > ceiling:
                beyond = next(i for i, e in enumerate(read) if e.position > ceiling)
                self.cursor.seek(read[beyond].position)
                read = read[:beyond]
            entries = {entry.position: entry for entry in read}
            for entry in read:
                # learnt from every entry read, not only those delivered: entries held aside
                # (delayed) go out later, and a new owner re-reading many of them must not
                # read them one at a time
                self._largest_batch = max(float(entry.num_messages), self._largest_batch * 0.99)
            items = [item for item in map(self._fresh_item, read) if item is not None]
        if epoch != self._epoch or dispatcher is not self.dispatcher:
            return
        plan = dispatcher.assign(items, now_ms)
        if plan.seek_back is not None:
            self.cursor.seek(plan.seek_back)
        self._deliver(plan, entries)
        # the holes parked (delayed) entries leave do not count towards the hole limit
        self.cursor.parked_entries = len(dispatcher.delayed)
        if dispatcher.delayed:
            self._arm_due_timer(now_ms)
        if dispatcher.index.has_work:
            self._write_index_soon()

    # --- the delay index --------------------------------------------------------------------------

    async def _load_delay_index(self) -> None:
        """Hold aside what the persisted delay index holds (a new owner, or a type change), and
        make the cursor jump over those entries; for a type that delays nothing, delete it."""
        dispatcher = self.dispatcher
        buckets = await self.cursor.load_delay_index()
        if dispatcher is not self.dispatcher:
            return  # the type changed meanwhile: load for the new dispatcher
        held: list[Position] = []
        for name, entries in sorted(buckets.items()):
            if dispatcher.shares and dispatcher.index.enabled:
                waiting = [e for e in entries if not self.cursor.is_acked(e.position)]
                held += dispatcher.hold_indexed(name, waiting)
            else:
                dispatcher.index.undeleted.add(name)
        self._index_loaded = True
        self.delayed_entries_loaded = len(held)
        if held:
            self.cursor.skip_on_read(held)
            self.cursor.parked_entries = len(dispatcher.delayed)
        if buckets:
            log.info(
                "delay_index_loaded",
                topic=str(self.topic.name),
                subscription=self.name,
                buckets=len(buckets),
                entries=len(held),
            )
        if dispatcher.index.has_work:
            self._write_index_soon()

    def _write_index_soon(self) -> None:
        if self._index_task is None or self._index_task.done():
            self._index_task = asyncio.create_task(
                self._write_index(self.dispatcher), name=f"delay-index:{self.name}"
            )

    async def _write_index(self, dispatcher: Dispatcher) -> None:
        """Seal, write and delete buckets until nothing is left to do (one task at a time)."""
        index = dispatcher.index
        while dispatcher is self.dispatcher and index.has_work:
            now_ms = self._clock.time_ms()
            if index.seal_due(now_ms):
                index.seal(now_ms)
            try:
                if not await self._index_step(index):
                    due = index.next_seal_ms()
                    if due is None:
                        return
                    await self._clock.sleep(max(0, due - now_ms) / 1000)
            except ManagedLedgerFencedError:
                return  # the dispatch loop hears of it too
            except MagnetarError as e:
                if self.topic.is_closing:
                    return
                log.warning(
                    "delay_index_write_failed",
                    topic=str(self.topic.name),
                    subscription=self.name,
                    error=e.message,
                )
                await self._clock.sleep(1.0)

    async def _index_step(self, index: DelayIndex) -> bool:
        """Write one sealed bucket or delete one emptied bucket; whether there was one."""
        if index.undeleted:
            name = min(index.undeleted)
            await self.cursor.delete_delay_bucket(name)
            index.deleted(name)
            return True
        if index.unwritten:
            name, entries = next(iter(index.unwritten.items()))
            index.writing(name)
            ok = False
            try:
                await self.cursor.write_delay_bucket(name, entries)
                ok = True
            finally:
                index.written(name, ok=ok)
            return True
        return False

    async def persist(self) -> None:
        """After :meth:`stop`, on a graceful handover: write the delay index's open bucket and
        the cursor (errors leave the rest to be redelivered or read again: nothing is lost)."""
        if self.durable:
            await self._flush_index()
        with contextlib.suppress(MagnetarError):
            await self.cursor.flush()

    async def _flush_index(self) -> None:
        """On a graceful close: seal what is open and write everything, so the next owner reads
        none of it again (an error leaves the rest to be read again: nothing is lost)."""
        index = self.dispatcher.index
        if not self._index_loaded or not index.has_work:
            return
        index.seal(self._clock.time_ms())
        with contextlib.suppress(MagnetarError):
            while await self._index_step(index):
                pass

    def _wake_when_counts_persisted(self) -> None:
        if self._counts_waiter is not None and not self._counts_waiter.done():
            return

        async def wait() -> None:
            with contextlib.suppress(MagnetarError):  # fencing reaches the dispatch loop too
                await self.cursor.wait_counts_persisted()
            self.wake()

        self._counts_waiter = asyncio.create_task(wait(), name=f"counts:{self.name}")

    def _hole_ceiling(self) -> Position | None:
        """At the ack-hole limit: the highest acknowledged entry. Entries below it fill holes
        (each ack removes or shrinks one); entries above it could only add holes, so they wait.
        None: not at the limit."""
        if not self.durable or not self.cursor.ack_ranges_over_limit:
            return None
        ranges = self.cursor.ack_ranges
        return ranges[-1][1] if ranges else None

    async def _sleep(self) -> None:
        self._wake.clear()
        await self._wake.wait()

    def _note_blocked(self) -> None:
        reason = self.blocked_reason
        if reason != self._blocked_logged:
            self._blocked_logged = reason
            if reason is not None:
                log.warning(
                    "subscription_blocked",
                    topic=str(self.topic.name),
                    subscription=self.name,
                    reason=reason,
                )
            else:
                log.info(
                    "subscription_unblocked", topic=str(self.topic.name), subscription=self.name
                )

    def _arm_due_timer(self, now_ms: int) -> None:
        due = self.dispatcher.next_due_ms()
        if self._due_timer is not None:
            self._due_timer.cancel()
            self._due_timer = None
        if due is not None:
            self._due_timer = asyncio.get_running_loop().call_later(
                max(0, due - now_ms) / 1000, self.wake
            )

    def _fresh_item(self, entry: Entry) -> Item | None:
        if self.durable and self.cursor.is_acked(entry.position):
            return None  # acknowledged while a later part of the same read was under way
        if entry.position in self.dispatcher.delayed:
            return None  # held aside already (loaded from the delay index, or read before)
        indexes: frozenset[int] | None = None
        acked = self.cursor.acked_indexes(entry.position)
        first = 0
        if self._start_filter is not None and self._start_filter[0] == entry.position:
            first = self._start_filter[1]
            self._start_filter = None
        if acked or first:
            indexes = frozenset(range(first, entry.num_messages)) - acked
            if not indexes:
                return None
        return Item(
            entry.position,
            entry.num_messages,
            entry.key_hashes,
            indexes,
            fresh=True,
            deliver_at_ms=entry.deliver_at_ms,
        )

    async def _read_replay(
        self, positions: list[Position]
    ) -> tuple[list[Item], dict[Position, Entry]]:
        entries: dict[Position, Entry] = {}
        for position in positions:
            if self.cursor.is_acked(position):
                continue
            found = await self.ml.read(position, max_entries=1, max_bytes=1)
            if found and found[0].position == position:
                entries[position] = found[0]
        items: list[Item] = []
        for position, entry in entries.items():
            pending = self.dispatcher.replay.pop(position, None)
            if pending is None or self.cursor.is_acked(position):
                continue  # acknowledged while it was read
            indexes = pending.indexes
            acked = self.cursor.acked_indexes(position)
            if acked:
                indexes = (indexes or frozenset(range(entry.num_messages))) - acked
                if not indexes:
                    continue
            items.append(
                Item(
                    position,
                    entry.num_messages,
                    entry.key_hashes,
                    indexes,
                    fresh=False,
                    deliver_at_ms=entry.deliver_at_ms,
                )
            )
        return items, entries

    async def _wait_for_entries(self) -> None:
        # a plain future that both a new entry and wake() complete: no task per wait
        waiter = self._entries_waiter = self.ml.entries_waiter()
        try:
            await waiter
        finally:
            self._entries_waiter = None

    def _deliver(self, plan: Plan, entries: dict[Position, Entry]) -> None:
        batches: dict[int, list[DeliveryItem]] = {}
        for assignment in plan.assignments:
            entry = entries[assignment.position]
            session = self._sessions.get(assignment.slot.seq)
            if session is None:
                continue
            batches.setdefault(assignment.slot.seq, []).append(
                DeliveryItem(
                    entry.position,
                    entry.payload,
                    entry.num_messages,
                    assignment.redelivery_count,
                    tuple(sorted(assignment.indexes)) if assignment.indexes is not None else (),
                    entry.payload_format,
                )
            )
            # the largest recent batch, forgetting a one-off big batch slowly
            self._largest_batch = max(float(entry.num_messages), self._largest_batch * 0.99)
            session.msgs_out += assignment.count
            session.bytes_out += len(entry.payload)
            self.msgs_out += assignment.count
            self.bytes_out += len(entry.payload)
        for seq, items in batches.items():
            session = self._sessions[seq]
            session.events.put_nowait(Deliveries(items, session.grant))
            session.delivered(sum(len(item.payload) for item in items))

    # --- closing ----------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop dispatching (consumers stay attached until :meth:`close`)."""
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        if self._due_timer is not None:
            self._due_timer.cancel()
            self._due_timer = None
        if self._counts_waiter is not None:
            self._counts_waiter.cancel()
            self._counts_waiter = None
        if self._index_task is not None:
            self._index_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, MagnetarError):
                await self._index_task
            self._index_task = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def close(self, reason: MagnetarError) -> None:
        """Stop, tell the consumers why, and persist the cursor."""
        await self.stop()
        for consumer in list(self.consumers):
            consumer.close_with(reason)
        if self.durable:
            await self._flush_index()
        with contextlib.suppress(MagnetarError):
            await self.cursor.close()
