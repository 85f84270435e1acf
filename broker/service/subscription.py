"""Subscriptions and their consumers: which entries go to whom, permits, acks, redelivery.

A :class:`Subscription` is a cursor plus the consumers attached to it and one dispatch task.
The dispatcher reads from the cursor only while a consumer has permits (flow control counts
messages; an entry of k messages uses k), so a slow consumer holds back reads instead of
filling memory. This issue's types are **exclusive** (one consumer; a second is refused) and
non-durable **readers** (an exclusive subscription whose cursor is never persisted).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import structlog

from broker.managed_ledger import Entry, ManagedCursor, ManagedLedger, Position
from broker.service.streams import (
    AckDone,
    Closable,
    ConsumerEvent,
    Deliveries,
    DeliveryItem,
    RequestFailed,
    SeekDone,
    Start,
    StreamClosed,
    SubscriptionType,
)
from magnetar.common.errors import (
    ConsumerBusyError,
    MagnetarError,
    ManagedLedgerError,
    ManagedLedgerFencedError,
)

if TYPE_CHECKING:
    from broker.service.topic import Topic

log = structlog.get_logger("magnetar.broker.subscription")


class ConsumerSession(Closable):
    """One consumer stream attached to a subscription."""

    def __init__(self, subscription: Subscription, name: str, address: str = "") -> None:
        super().__init__()
        self.subscription = subscription
        self.name = name
        self.address = address
        self.permits = 0
        self.unacked: dict[Position, int] = {}
        self.events: asyncio.Queue[ConsumerEvent] = asyncio.Queue()
        self.msgs_out = 0
        self.bytes_out = 0

    # --- requests from the client ---------------------------------------------------------------

    def flow(self, permits: int) -> None:
        self.permits += permits
        self.subscription.wake()

    def ack(self, positions: list[Position], *, cumulative: bool, request_id: int = 0) -> None:
        try:
            self.subscription.ack(self, positions, cumulative=cumulative)
        except MagnetarError as e:
            self.events.put_nowait(RequestFailed(request_id, e))
            return
        if request_id:
            self.events.put_nowait(AckDone(request_id))

    def nack(self, positions: list[Position], delay_ms: int) -> None:
        self.subscription.nack(self, positions, delay_ms)

    def redeliver(self, positions: list[Position]) -> None:
        self.subscription.redeliver(self, positions)

    async def seek(self, start: Start, request_id: int) -> None:
        try:
            await self.subscription.seek(start)
        except MagnetarError as e:
            self.events.put_nowait(RequestFailed(request_id, e))
            return
        self.permits = 0
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
    ) -> None:
        self.topic = topic
        self.name = name
        self.cursor = cursor
        self.type = subscription_type
        self.durable = durable
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self.consumers: list[ConsumerSession] = []
        self.redelivery_counts: dict[Position, int] = {}
        self._replay: set[Position] = set()
        self._start_filter: tuple[Position, int] | None = None
        self._epoch = 0
        self._largest_batch = 0.0
        """Messages in the largest recent entry (0: none read yet), to turn permits into entries."""
        self._repositioned = cursor.read_position
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timers: set[asyncio.TimerHandle] = set()
        self.msgs_redelivered = 0

    @property
    def ml(self) -> ManagedLedger:
        return self.topic.ml

    # --- consumers ------------------------------------------------------------------------------

    def add_consumer(self, consumer: ConsumerSession) -> None:
        if self.consumers:
            raise ConsumerBusyError(
                f"subscription {self.name!r} on {self.topic.name} is exclusive and consumer"
                f" {self.consumers[0].name!r} is attached",
                context={"subscription": self.name, "topic": str(self.topic.name)},
            )
        self.consumers.append(consumer)
        if self._task is None:
            self._task = asyncio.create_task(
                self._dispatch_loop(), name=f"dispatch:{self.topic.name}:{self.name}"
            )
        self.wake()

    def remove_consumer(self, consumer: ConsumerSession) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        # what it held unacknowledged goes to the next consumer, counted as a redelivery
        for position in consumer.unacked:
            self.redelivery_counts[position] = self.redelivery_counts.get(position, 0) + 1
        self.msgs_redelivered += sum(consumer.unacked.values())
        consumer.unacked.clear()
        self._reposition(None)
        if not self.durable and not self.consumers:
            self.topic.drop_subscription(self)

    def set_start_filter(self, position: Position, first_batch_index: int) -> None:
        """The first entry delivered at ``position`` skips messages before this index."""
        if first_batch_index > 0:
            self._start_filter = (position, first_batch_index)

    # --- acks and redelivery ----------------------------------------------------------------------

    def ack(
        self, consumer: ConsumerSession, positions: list[Position], *, cumulative: bool
    ) -> None:
        if cumulative:
            if not positions:
                return
            last = max(positions)
            self.cursor.ack_cumulative(last)
            for position in [p for p in consumer.unacked if p <= last]:
                del consumer.unacked[position]
                self.redelivery_counts.pop(position, None)
                self._replay.discard(position)
        else:
            self.cursor.ack(positions)
            for position in positions:
                consumer.unacked.pop(position, None)
                self.redelivery_counts.pop(position, None)
                self._replay.discard(position)
        self.topic.cursor_moved()

    def nack(self, consumer: ConsumerSession, positions: list[Position], delay_ms: int) -> None:
        held = [p for p in positions if p in consumer.unacked]
        if not held:
            return
        loop = asyncio.get_running_loop()

        def due() -> None:
            self._timers.discard(handle)
            self._requeue(consumer, held)

        handle = loop.call_later(max(0, delay_ms) / 1000, due)
        self._timers.add(handle)

    def redeliver(self, consumer: ConsumerSession, positions: list[Position]) -> None:
        if not positions:
            positions = list(consumer.unacked)
        self._requeue(consumer, positions)

    def _requeue(self, consumer: ConsumerSession, positions: Iterable[Position]) -> None:
        for position in positions:
            if consumer.unacked.pop(position, None) is None or self.cursor.is_acked(position):
                continue
            self.redelivery_counts[position] = self.redelivery_counts.get(position, 0) + 1
            self._replay.add(position)
            self.msgs_redelivered += 1
        self.wake()

    async def seek(self, start: Start) -> None:
        position, first_index = await self.topic.resolve_start(start)
        self._replay.clear()
        self.redelivery_counts.clear()
        for consumer in self.consumers:
            consumer.unacked.clear()
        # a reader's cursor is reset too: its mark-delete (where it started, or what it read)
        # would otherwise hide the entries before it that the seek asks for
        await self.cursor.reset(position)
        self._reposition(position)
        self._start_filter = None
        self.set_start_filter(position, first_index)
        self.topic.cursor_moved()
        self.wake()

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

    def _ready_consumer(self) -> ConsumerSession | None:
        for consumer in self.consumers:
            if consumer.permits > 0 and not consumer.is_closed:
                return consumer
        return None

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
        consumer = self._ready_consumer()
        if consumer is None:
            self._wake.clear()
            await self._wake.wait()
            return
        epoch = self._epoch
        replay = False
        if self._replay:
            entries = await self._read_replay()
            replay = True
        elif self.cursor.has_more:
            # permits count messages and an entry holds a batch: read only as many entries as
            # the permits cover at the largest recent batch size (one entry to learn it), so a
            # consumer gets at most one batch more than its permits, never max_entries batches
            largest = self._largest_batch
            wanted = consumer.permits // math.ceil(largest) if largest else 1
            entries = await self.cursor.read(
                max_entries=max(1, min(wanted, self._max_entries)), max_bytes=self._max_bytes
            )
        else:
            self._wake.clear()
            await self._wait_for_entries()
            return
        if epoch != self._epoch:
            # a rewind or seek happened during the read, which moved the read position on
            # past entries that are now dropped: put it back where the rewind or seek wanted
            if not replay:
                self.cursor.seek(self._repositioned)
            return
        if consumer not in self.consumers or not entries:
            return
        # a read sized by an estimate may hold more than the permits cover: deliver what they
        # cover (at least one entry) and read the rest again later
        permits = consumer.permits
        take = 0
        while take < len(entries) and permits > 0:
            permits -= entries[take].num_messages
            take += 1
        take = max(take, 1)
        if take < len(entries):
            rest = entries[take:]
            if replay:
                self._replay.update(entry.position for entry in rest)
            else:
                self.cursor.seek(rest[0].position)
            entries = entries[:take]
        self._deliver(consumer, entries)

    async def _wait_for_entries(self) -> None:
        arrival = asyncio.ensure_future(self.ml.wait_for_entries(self.ml.last_confirmed))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({arrival, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (arrival, woken):
                if not task.done():
                    task.cancel()
            # both finished before returning: a task left pending is destroyed at shutdown
            await asyncio.gather(arrival, woken, return_exceptions=True)
        if arrival.done() and not arrival.cancelled() and arrival.exception() is not None:
            raise arrival.exception()  # type: ignore[misc]

    async def _read_replay(self) -> list[Entry]:
        wanted = sorted(self._replay)[: self._max_entries]
        self._replay.difference_update(wanted)
        entries: list[Entry] = []
        for position in wanted:
            if self.cursor.is_acked(position):
                continue
            found = await self.ml.read(position, max_entries=1, max_bytes=1)
            if found and found[0].position == position:
                entries.append(found[0])
        return entries

    def _deliver(self, consumer: ConsumerSession, entries: list[Entry]) -> None:
        items: list[DeliveryItem] = []
        for entry in entries:
            indexes: tuple[int, ...] = ()
            count = entry.num_messages
            if self._start_filter is not None and self._start_filter[0] == entry.position:
                first = self._start_filter[1]
                indexes = tuple(range(first, entry.num_messages))
                count = len(indexes)
                self._start_filter = None
            items.append(
                DeliveryItem(
                    entry.position,
                    entry.payload,
                    entry.num_messages,
                    self.redelivery_counts.get(entry.position, 0),
                    indexes,
                )
            )
            # the largest recent batch, forgetting a one-off big batch slowly
            self._largest_batch = max(float(entry.num_messages), self._largest_batch * 0.99)
            consumer.unacked[entry.position] = count
            consumer.permits -= count
            consumer.msgs_out += count
            consumer.bytes_out += len(entry.payload)
            self.topic.msgs_out += count
            self.topic.bytes_out += len(entry.payload)
        consumer.events.put_nowait(Deliveries(items))

    # --- closing ----------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop dispatching (consumers stay attached until :meth:`close`)."""
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
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
        with contextlib.suppress(MagnetarError):
            await self.cursor.close()
