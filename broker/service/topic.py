"""One owned partition: its managed ledger, producers, subscriptions and deduplication table.

A :class:`Topic` exists on a broker only while the broker owns the partition. Producing hands
each batch to the managed ledger (one batch, one entry, never unpacked) and answers with a
receipt once the entry is confirmed. Bytes in flight to the bookies are bounded per partition:
a producer stream past the bound stops being read, so gRPC flow control slows the client
(back-pressure) instead of the broker's memory growing.

Producers attach in one of Pulsar's access modes (:class:`AccessMode`): Shared (any number, the
only mode of Magnetar's own clients), Exclusive (alone, or refused), WaitForExclusive (queued until
the topic is free) and ExclusiveWithFencing (takes the topic, closing the others). Each grant of
exclusive access raises the partition's topic epoch; a producer that comes back with an older
epoch was replaced meanwhile and is fenced. Both live in this broker's memory only.

Closing is how ownership ends. A graceful close (unload, handover, shutdown) stops taking new
batches, lets the ones in flight finish, persists cursors and the deduplication table and closes
the current ledger; a forced close (session lost, fenced by a new owner) drops everything at
once. Either way producers and consumers are told why and look the topic up again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import structlog

from broker.managed_ledger import AppendResult, ManagedCursor, ManagedLedger, Position
from broker.service.dedup import Deduplication, Stored
from broker.service.envelope import IncomingBatch, build_envelope
from broker.service.streams import (
    Closable,
    MessageIdStart,
    OffsetStart,
    Receipt,
    Start,
    SubscribeRequest,
    SubscriptionType,
    TimeStart,
)
from broker.service.subscription import ConsumerSession, Subscription
from broker.service.validation import BatchLimits, check_batch
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    IncompatibleSubscriptionError,
    InvalidArgumentError,
    MagnetarError,
    ManagedLedgerFencedError,
    ProducerBusyError,
    ProducerFencedError,
    ServiceNotReadyError,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
    TopicNotOwnedError,
)
from magnetar.common.names import TopicName

if TYPE_CHECKING:
    from broker.service.config import BrokerConfig

log = structlog.get_logger("magnetar.broker.topic")

_reader_ids = itertools.count(1)


class TopicState(enum.Enum):
    ACTIVE = "active"
    CLOSING = "closing"
    CLOSED = "closed"


class AccessMode(enum.Enum):
    """How a producer shares its partition (Pulsar's ``ProducerAccessMode``)."""

    SHARED = "shared"
    """With any other shared producer; refused while an exclusive one holds the topic."""
    EXCLUSIVE = "exclusive"
    """Alone: refused (:class:`ProducerFencedError`) if any other producer is attached."""
    WAIT_FOR_EXCLUSIVE = "wait_for_exclusive"
    """Alone: queued until every other producer has left, then granted."""
    EXCLUSIVE_WITH_FENCING = "exclusive_with_fencing"
    """Alone: the other producers (and those waiting) are closed, fenced."""


class ProducerSession(Closable):
    """One producer stream on a partition."""

    def __init__(
        self,
        topic: Topic,
        name: str,
        address: str = "",
        access_mode: AccessMode = AccessMode.SHARED,
        topic_epoch: int | None = None,
    ) -> None:
        super().__init__()
        self.topic = topic
        self.name = name
        self.address = address
        self.access_mode = access_mode
        self.topic_epoch = topic_epoch
        """The epoch the producer came with, then the one it was granted (None: none yet)."""
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done once the producer may send: at once, or for a queued WaitForExclusive producer
        when it gets the topic; failed with the reason if it never does (fenced, moved)."""
        self.ready.add_done_callback(_retrieve)
        self.msgs_in = 0
        self.bytes_in = 0
        self.last_sequence_id = topic.dedup.last_sequence_id(name)
        self.problems: deque[MagnetarError | None] = deque(maxlen=8)
        """Write problems of the partition to tell this producer (None: writing again); the
        latest is always last."""
        self.on_problem: Callable[[], None] | None = None

    def tell_problem(self, problem: MagnetarError | None) -> None:
        self.problems.append(problem)
        if self.on_problem is not None:
            self.on_problem()


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a failed ``ready`` as seen: nobody may be waiting on it any more."""
    if not future.cancelled():
        future.exception()


class Topic:
    """A partition this broker owns."""

    def __init__(
        self,
        name: TopicName,
        ml: ManagedLedger,
        dedup: Deduplication,
        config: BrokerConfig,
        *,
        on_fenced: Callable[[Topic, MagnetarError], None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.name = name
        self.ml = ml
        self.dedup = dedup
        self.config = config
        self._on_fenced = on_fenced
        self._clock = clock
        self.state = TopicState.ACTIVE
        self.producers: dict[str, ProducerSession] = {}
        self.exclusive_producer: ProducerSession | None = None
        self.waiting_producers: deque[ProducerSession] = deque()
        """WaitForExclusive producers queued for the topic, first come first served."""
        self.topic_epoch: int | None = None
        """Raised at each grant of exclusive access (None until the first): in memory only, so
        a new owner starts without one and takes the epoch of the first exclusive producer."""
        self.subscriptions: dict[str, Subscription] = {}
        self.pending_bytes = 0
        self._pending: set[asyncio.Future[AppendResult]] = set()
        self._space = asyncio.Event()
        self._space.set()
        self.msgs_in = 0
        self.bytes_in = 0
        self._gone_out = (0, 0)
        """Messages and bytes dispatched by subscriptions no longer here (dropped or deleted)."""
        self.acquired_ms = clock.time_ms()
        self._trim_task: asyncio.Task[None] | None = None
        self._ttl_task: asyncio.Task[None] | None = None
        self.message_ttl_ms = 0
        self.max_redelivery_count = 0
        """The topic's policy (0: none), told to consumers that set none of their own."""
        self._batch_limits = BatchLimits(
            max_message_bytes=config.max_message_bytes, max_messages=config.max_messages_per_batch
        )
        ml.on_write_problem = self._write_problem_changed
        self._fence_watch: asyncio.Task[None] | None = asyncio.create_task(
            self._watch_fenced(), name=f"fenced:{name}"
        )
        self.closed = asyncio.Event()
        """Set once :meth:`close` begins: whatever watches the partition for this broker can
        stop (and let go of it, so that a deleted or moved topic's memory is freed)."""

    @property
    def is_closing(self) -> bool:
        return self.state is not TopicState.ACTIVE

    def _check_active(self) -> None:
        if self.state is not TopicState.ACTIVE:
            raise ServiceNotReadyError(
                f"partition {self.name} is moving to another broker; look it up again",
                context={"topic": str(self.name)},
            )

    # --- producers --------------------------------------------------------------------------------

    def add_producer(
        self,
        name: str,
        address: str = "",
        *,
        access_mode: AccessMode = AccessMode.SHARED,
        topic_epoch: int | None = None,
    ) -> ProducerSession:
        """Attach a producer, by Pulsar's rules for its access mode.

        Raises :class:`ProducerBusyError` (a producer of that name, or a shared producer while
        an exclusive one holds the topic or waits for it) or :class:`ProducerFencedError` (an
        exclusive producer while others are attached, or one whose ``topic_epoch`` is older
        than the topic's: another took the topic meanwhile). A WaitForExclusive producer that
        must wait is returned queued: its ``ready`` completes when it gets the topic.
        """
        self._check_active()
        if name in self.producers or any(w.name == name for w in self.waiting_producers):
            raise ProducerBusyError(
                f"a producer named {name!r} is already connected to {self.name}",
                context={"producer": name, "topic": str(self.name)},
            )
        holder = self.exclusive_producer
        if access_mode is AccessMode.SHARED:
            if holder is not None or self.waiting_producers:
                who = holder.name if holder is not None else self.waiting_producers[0].name
                raise ProducerBusyError(
                    f"topic {self.name} has an exclusive producer ({who!r}): no other producer"
                    " may attach until it leaves",
                    context={"producer": name, "topic": str(self.name), "exclusive": who},
                )
            producer = ProducerSession(self, name, address, access_mode, self.topic_epoch)
            self._attach(producer)
            return producer
        producer = ProducerSession(self, name, address, access_mode, topic_epoch)
        if access_mode is AccessMode.EXCLUSIVE_WITH_FENCING:
            self._fence_others(name)
        elif holder is not None or self.waiting_producers or self.producers:
            if access_mode is AccessMode.WAIT_FOR_EXCLUSIVE:
                self.waiting_producers.append(producer)
                log.info("producer_waiting_for_exclusive", topic=str(self.name), producer=name)
                return producer
            raise ProducerFencedError(
                f"topic {self.name} has "
                + (
                    f"an exclusive producer ({holder.name!r})"
                    if holder is not None
                    else f"{len(self.producers) + len(self.waiting_producers)} other producer(s)"
                )
                + ": an Exclusive producer must be alone (WaitForExclusive waits for it)",
                context={"producer": name, "topic": str(self.name)},
            )
        self._grant(producer)
        return producer

    def _check_epoch(self, producer: ProducerSession) -> None:
        epoch = producer.topic_epoch
        if epoch is not None and self.topic_epoch is not None and epoch < self.topic_epoch:
            raise ProducerFencedError(
                f"producer {producer.name!r} was replaced on {self.name}: it comes with topic"
                f" epoch {epoch}, and another exclusive producer took epoch {self.topic_epoch}",
                context={"producer": producer.name, "topic": str(self.name)},
            )

    def _grant(self, producer: ProducerSession) -> None:
        """Give ``producer`` exclusive access: its own epoch back (a reconnection), else the
        next one."""
        self._check_epoch(producer)
        if producer.topic_epoch is None:
            producer.topic_epoch = (self.topic_epoch if self.topic_epoch is not None else -1) + 1
        self.topic_epoch = producer.topic_epoch
        self.exclusive_producer = producer
        self._attach(producer)
        log.info(
            "exclusive_producer_granted",
            topic=str(self.name),
            producer=producer.name,
            topic_epoch=self.topic_epoch,
            mode=producer.access_mode.value,
        )

    def _attach(self, producer: ProducerSession) -> None:
        producer.last_sequence_id = self.dedup.last_sequence_id(producer.name)
        if self.ml.write_problem is not None:
            producer.tell_problem(self.ml.write_problem)
        self.producers[producer.name] = producer
        if not producer.ready.done():
            producer.ready.set_result(None)

    def _fence_others(self, name: str) -> None:
        """ExclusiveWithFencing: close every other producer, attached or waiting."""
        while self.waiting_producers:
            waiting = self.waiting_producers.popleft()
            self._refuse(waiting, ProducerFencedError(f"producer {name!r} fenced it out"))
        for other in list(self.producers.values()):
            del self.producers[other.name]
            error = ProducerFencedError(
                f"producer {name!r} took {self.name} exclusively (ExclusiveWithFencing)",
                context={"producer": other.name, "topic": str(self.name)},
            )
            log.info("producer_fenced", topic=str(self.name), producer=other.name, by=name)
            other.close_with(error)
        self.exclusive_producer = None

    @staticmethod
    def _refuse(producer: ProducerSession, error: MagnetarError) -> None:
        if not producer.ready.done():
            producer.ready.set_exception(error)
        producer.close_with(error)

    def _promote_waiting(self) -> None:
        """The topic has no producer left: the first WaitForExclusive producer gets it."""
        while self.waiting_producers and not self.producers and self.state is TopicState.ACTIVE:
            waiting = self.waiting_producers.popleft()
            try:
                self._grant(waiting)
            except ProducerFencedError as e:
                self._refuse(waiting, e)

    def _write_problem_changed(self, problem: MagnetarError | None) -> None:
        """The managed ledger cannot store entries now (or can again): tell every producer, so
        that a send that times out names the cause."""
        if problem is not None:
            log.warning("partition_cannot_write", topic=str(self.name), problem=problem.message)
        else:
            log.info("partition_writing_again", topic=str(self.name))
        for producer in self.producers.values():
            producer.tell_problem(problem)

    def remove_producer(self, producer: ProducerSession) -> None:
        if producer in self.waiting_producers:
            self.waiting_producers.remove(producer)
            if not producer.ready.done():
                producer.ready.cancel()
            return
        if self.producers.get(producer.name) is producer:
            del self.producers[producer.name]
        if self.exclusive_producer is producer:
            self.exclusive_producer = None
        self._promote_waiting()

    async def wait_for_space(self) -> None:
        """Wait while the partition's bytes in flight are at their bound (back-pressure)."""
        while self.pending_bytes >= self.config.max_pending_bytes_per_partition:
            self._space.clear()
            await self._space.wait()

    def publish(self, producer: ProducerSession, batch: IncomingBatch) -> asyncio.Future[Receipt]:
        """Store one batch as one entry; the future completes with its receipt once confirmed.

        Raises (for this batch only) on a bad batch (:func:`check_batch` opens and checks it
        first: nothing of a bad batch is stored); raises :class:`ServiceNotReadyError` or
        :class:`TopicNotOwnedError` when the partition is moving, and the caller then ends the
        stream so that the client resends elsewhere.
        """
        self._check_active()
        check_batch(batch, self._batch_limits)
        size = len(batch.batch)
        loop = asyncio.get_running_loop()
        receipt: asyncio.Future[Receipt] = loop.create_future()
        chunk = {"chunk_id": batch.chunk_id, "num_chunks": batch.num_chunks}
        duplicate = self.dedup.duplicate_of(producer.name, batch.last_sequence_id, **chunk)
        if isinstance(duplicate, Stored):
            receipt.set_result(self._receipt(batch, duplicate, duplicate=True))
            return receipt
        if duplicate is not None:
            duplicate.add_done_callback(lambda f: self._answer_duplicate(f, batch, receipt))
            return receipt
        try:
            appended = self.ml.append(
                batch.num_messages,
                lambda first_offset, publish_time_ms: build_envelope(
                    producer.name, batch, first_offset, publish_time_ms
                ),
                key_hashes=batch.key_hashes,
                deliver_at_ms=batch.deliver_at_ms,
                payload_format=batch.format,
            )
        except ManagedLedgerFencedError as e:
            self.fenced(e)
            raise TopicNotOwnedError(
                f"partition {self.name} was taken over by another broker",
                context={"topic": str(self.name)},
            ) from e
        self.dedup.pushing(producer.name, batch.last_sequence_id, appended, **chunk)
        self.pending_bytes += size
        self._pending.add(appended)

        def done(f: asyncio.Future[AppendResult]) -> None:
            self._pending.discard(f)
            self.pending_bytes -= size
            self._space.set()
            if f.cancelled():
                self.dedup.failed(producer.name, batch.last_sequence_id, **chunk)
                receipt.cancel()
                return
            error = f.exception()
            if error is not None:
                self.dedup.failed(producer.name, batch.last_sequence_id, **chunk)
                if isinstance(error, ManagedLedgerFencedError):
                    self.fenced(error)
                receipt.set_exception(error)
                return
            result = f.result()
            self.dedup.stored(producer.name, batch.last_sequence_id, result, **chunk)
            self.msgs_in += batch.num_messages
            self.bytes_in += size
            producer.msgs_in += batch.num_messages
            producer.bytes_in += size
            if batch.completes_message:
                producer.last_sequence_id = max(producer.last_sequence_id, batch.last_sequence_id)
            if not receipt.done():
                receipt.set_result(
                    self._receipt(
                        batch,
                        Stored(result.position, result.first_offset, result.publish_time_ms),
                    )
                )

        appended.add_done_callback(done)
        return receipt

    def _answer_duplicate(
        self,
        first: asyncio.Future[AppendResult],
        batch: IncomingBatch,
        receipt: asyncio.Future[Receipt],
    ) -> None:
        if receipt.done():
            return
        if first.cancelled() or first.exception() is not None:
            receipt.set_exception(
                ServiceNotReadyError(
                    f"the first copy of sequence id {batch.last_sequence_id} failed; resend it",
                    context={"topic": str(self.name)},
                )
            )
            return
        result = first.result()
        stored = Stored(result.position, result.first_offset, result.publish_time_ms)
        receipt.set_result(self._receipt(batch, stored, duplicate=True))

    @staticmethod
    def _receipt(batch: IncomingBatch, stored: Stored, *, duplicate: bool = False) -> Receipt:
        return Receipt(
            batch.request_id,
            batch.sequence_id,
            batch.last_sequence_id,
            stored.position,
            stored.first_offset,
            stored.publish_time_ms,
            duplicate,
        )

    # --- subscriptions ----------------------------------------------------------------------------

    def _incompatible(
        self, request: SubscribeRequest, existing: SubscriptionType
    ) -> IncompatibleSubscriptionError:
        have, want = existing.name.lower(), request.subscription_type.name.lower()
        return IncompatibleSubscriptionError(
            f"subscription {request.subscription!r} on {self.name} is {have}, not {want}:"
            f" subscribe with subscription_type={have!r}, or use another subscription name",
            context={"subscription": request.subscription, "type": have, "requested": want},
        )

    async def subscribe(self, request: SubscribeRequest, address: str = "") -> ConsumerSession:
        self._check_active()
        existing = self.subscriptions.get(request.subscription) if request.durable else None
        if (
            existing is not None
            and existing.consumers
            and existing.type is not request.subscription_type
        ):
            raise self._incompatible(request, existing.type)
        position, first_index = await self.resolve_start(request.start)
        self._check_active()
        if request.durable:
            if not request.subscription:
                raise InvalidArgumentError("a durable subscription needs a name")
            subscription = self.subscriptions.get(request.subscription)
            if subscription is None:
                existed = request.subscription in self.ml.cursors
                cursor = await self.ml.open_cursor(request.subscription, start=position)
                self._check_active()
                subscription = self.subscriptions.get(request.subscription)
                if subscription is None:
                    subscription = self._new_subscription(
                        request.subscription, cursor, request.subscription_type, durable=True
                    )
                    if not existed:
                        subscription.set_start_filter(position, first_index)
            if subscription.type is not request.subscription_type:
                if subscription.consumers:
                    raise self._incompatible(request, subscription.type)
                # no consumer is attached: the subscription takes the new type (as in Pulsar)
                log.info(
                    "subscription_type_changed",
                    topic=str(self.name),
                    subscription=subscription.name,
                    type=request.subscription_type.name.lower(),
                )
                subscription.change_type(request.subscription_type)
        else:
            name = request.subscription or f"reader-{next(_reader_ids)}"
            name = f"{name}-{next(_reader_ids)}" if name in self.subscriptions else name
            cursor = self.ml.open_non_durable_cursor(position)
            subscription = self._new_subscription(
                name, cursor, request.subscription_type, durable=False
            )
            subscription.set_start_filter(position, first_index)
        consumer = ConsumerSession(
            subscription,
            request.consumer_name,
            address,
            request.priority_level,
            whole_entries=request.whole_entries,
        )
        try:
            subscription.add_consumer(consumer)
        except MagnetarError:
            if not subscription.durable:
                self.drop_subscription(subscription)
            raise
        return consumer

    def _new_subscription(
        self, name: str, cursor: ManagedCursor, sub_type: SubscriptionType, *, durable: bool
    ) -> Subscription:
        config = self.config
        subscription = Subscription(
            self,
            name,
            cursor,
            sub_type,
            durable=durable,
            max_entries=config.dispatch_max_entries,
            max_bytes=config.dispatch_max_bytes,
            max_unacked_per_consumer=config.max_unacked_messages_per_consumer,
            max_unacked_per_subscription=config.max_unacked_messages_per_subscription,
            max_replay_entries=config.dispatch_max_replay_entries,
            max_delayed_entries=config.dispatch_max_delayed_entries,
            delayed_index_bucket_entries=config.dispatch_delayed_index_bucket_entries,
            delayed_index_seal_ms=config.dispatch_delayed_index_seal_ms,
            clock=self._clock,
        )
        self.subscriptions[name] = subscription
        return subscription

    @property
    def msgs_out(self) -> int:
        """Messages dispatched to consumers: each subscription counts its own."""
        return self._gone_out[0] + sum(s.msgs_out for s in self.subscriptions.values())

    @property
    def bytes_out(self) -> int:
        """Entry bytes dispatched to consumers."""
        return self._gone_out[1] + sum(s.bytes_out for s in self.subscriptions.values())

    def _forget(self, subscription: Subscription) -> None:
        """Drop a subscription, keeping what it dispatched in the topic's counters."""
        del self.subscriptions[subscription.name]
        msgs, size = self._gone_out
        self._gone_out = (msgs + subscription.msgs_out, size + subscription.bytes_out)

    def drop_subscription(self, subscription: Subscription) -> None:
        if self.subscriptions.get(subscription.name) is subscription:
            self._forget(subscription)
            asyncio.get_running_loop().create_task(
                subscription.close(ServiceNotReadyError("the subscription was closed"))
            )

    async def delete_subscription(self, name: str, *, force: bool) -> None:
        self._check_active()
        subscription = self.subscriptions.get(name)
        if subscription is None and name not in self.ml.cursors:
            raise SubscriptionNotFoundError(
                f"topic {self.name} has no subscription {name!r}",
                context={"topic": str(self.name), "subscription": name},
            )
        if subscription is not None:
            if subscription.consumers and not force:
                raise SubscriptionBusyError(
                    f"subscription {name!r} has {len(subscription.consumers)} consumer(s)"
                    " attached; disconnect them or force the delete"
                )
            self._forget(subscription)
            await subscription.close(SubscriptionNotFoundError("the subscription was deleted"))
        await self.ml.delete_cursor(name)
        self.cursor_moved()

    async def resolve_start(self, start: Start, *, strict: bool = False) -> tuple[Position, int]:
        """Where a subscription or seek starts: a position and the first batch index there.

        ``strict`` (seek and reset): a message id or offset past the end of the partition is an
        error rather than "the end"."""
        if start == "earliest":
            return self.ml.first_position, 0
        end = self.ml.next_position(self.ml.last_confirmed)
        if start == "latest":
            return end, 0
        if isinstance(start, MessageIdStart):
            if start.ledger_id < 0 or start.entry_id < 0:
                raise InvalidArgumentError(
                    f"a start message id needs ledger and entry ids >= 0, got"
                    f" ({start.ledger_id}, {start.entry_id})"
                )
            position = Position(start.ledger_id, start.entry_id)
            if strict and position > end:
                raise InvalidArgumentError(
                    f"message id ({start.ledger_id}, {start.entry_id}) is past the end of"
                    f" {self.name}: the last stored entry is {tuple(self.ml.last_confirmed)};"
                    " seek to 'latest' to skip everything",
                    context={"topic": str(self.name), "message_id": tuple(position)},
                )
            first = max(0, start.batch_index)
            if first > 0 and position <= self.ml.last_confirmed:
                entries = await self.ml.read(position, max_entries=1, max_bytes=1)
                if entries and entries[0].position == position:
                    held = entries[0].num_messages
                    if first >= held:
                        raise InvalidArgumentError(
                            f"batch index {first:,} is not a message of the entry at"
                            f" ({start.ledger_id}, {start.entry_id}), which holds {held:,}"
                            f" (indexes 0 to {held - 1:,})",
                            context={"message_id": tuple(position), "batch_index": first},
                        )
            return position, first
        if isinstance(start, OffsetStart):
            if start.offset < 0:
                raise InvalidArgumentError(f"an offset is >= 0, got {start.offset}")
            if strict and start.offset > self.ml.confirmed_next_offset:
                raise InvalidArgumentError(
                    f"offset {start.offset} is past the end of {self.name}: the next message"
                    f" gets offset {self.ml.confirmed_next_offset}",
                    context={"topic": str(self.name), "offset": start.offset},
                )
            position = await self.ml.position_for_offset(start.offset)
            first = 0
            if position <= self.ml.last_confirmed:
                entries = await self.ml.read(position, max_entries=1, max_bytes=1)
                if entries and entries[0].position == position:
                    first = max(0, start.offset - entries[0].first_offset)
            return position, first
        if isinstance(start, TimeStart):
            return await self.ml.position_for_publish_time(start.publish_time_ms), 0
        raise InvalidArgumentError(f"unknown start position {start!r}")

    # --- message TTL -------------------------------------------------------------------------

    def set_message_ttl(self, ttl_ms: int) -> None:
        """Acknowledge, for every durable subscription, messages older than ``ttl_ms`` (0:
        never), checking every quarter of the TTL (between 0.1 s and 60 s)."""
        self.message_ttl_ms = ttl_ms
        if self._ttl_task is not None:
            self._ttl_task.cancel()
            self._ttl_task = None
        if ttl_ms > 0:
            self._ttl_task = asyncio.get_running_loop().create_task(
                self._expire_loop(ttl_ms), name=f"ttl:{self.name}"
            )

    async def _expire_loop(self, ttl_ms: int) -> None:
        interval = min(60.0, max(0.1, ttl_ms / 4000))
        while self.state is TopicState.ACTIVE:
            try:
                await self.expire_messages(ttl_ms)
            except MagnetarError as e:
                log.info("message_ttl_failed", topic=str(self.name), error=e.message)
            await asyncio.sleep(interval)

    async def expire_messages(self, ttl_ms: int) -> int:
        """Acknowledge entries published more than ``ttl_ms`` ago; subscriptions that moved."""
        cutoff = self._clock.time_ms() - ttl_ms
        boundary = await self.ml.position_for_publish_time(cutoff)
        moved = 0
        for subscription in list(self.subscriptions.values()):
            if subscription.durable and subscription.expire_before(boundary):
                moved += 1
        for name, cursor in self.ml.cursors.items():
            if name not in self.subscriptions and cursor.expire_before(boundary):
                moved += 1
                self.cursor_moved()
        if moved:
            log.info("messages_expired", topic=str(self.name), subscriptions=moved)
        return moved

    def cursor_moved(self) -> None:
        """Acks moved a cursor: trim soon (debounced) what every cursor has passed."""
        if self._trim_task is None and self.state is TopicState.ACTIVE:
            self._trim_task = asyncio.get_running_loop().create_task(self._trim_soon())

    async def _trim_soon(self) -> None:
        try:
            await asyncio.sleep(1.0)
            if self.state is TopicState.ACTIVE:
                await self.ml.trim()
        except MagnetarError as e:
            log.info("trim_failed", topic=str(self.name), error=e.message)
        finally:
            self._trim_task = None

    # --- ownership ending -------------------------------------------------------------------------

    async def _watch_fenced(self) -> None:
        await self.ml.fenced.wait()
        self.fenced(
            ManagedLedgerFencedError(f"partition {self.name} was taken over by another owner")
        )

    def fenced(self, error: MagnetarError) -> None:
        """Another owner took the partition: stop serving it now."""
        if self.state is TopicState.ACTIVE:
            log.warning("topic_fenced", topic=str(self.name), error=error.message)
            self._on_fenced(self, error)

    async def close(
        self,
        reason: MagnetarError,
        *,
        graceful: bool,
        release: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Stop serving the partition.

        Graceful: refuse new batches, let those in flight finish, persist cursors and the
        deduplication table, close the current ledger, then ``release`` ownership, and only
        then tell producers and consumers (who look the partition up again and find it free).
        Forced: tell them at once and drop everything.
        """
        if self.state is not TopicState.ACTIVE:
            return
        self.state = TopicState.CLOSING
        self.closed.set()
        # cancelled and let go of: a cancelled task keeps its CancelledError, whose traceback
        # holds the task's frames and so this topic; kept here too, they would make a cycle
        # that only the cyclic collector frees, which the servers' tuning (magnetar/common/
        # gc_tuning.py) runs too rarely for a deleted topic's memory to come back
        for task in (self._trim_task, self._ttl_task, self._fence_watch):
            if task is not None:
                task.cancel()
        self._trim_task = self._ttl_task = self._fence_watch = None
        if graceful:
            if self._pending:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.gather(*list(self._pending), return_exceptions=True),
                        self.config.unload_timeout_ms / 1000,
                    )
            for subscription in list(self.subscriptions.values()):
                await subscription.stop()
                await subscription.persist()
            with contextlib.suppress(MagnetarError):
                await self.dedup.close()
            try:
                await self.ml.close()
            except MagnetarError as e:
                log.warning("topic_close_failed", topic=str(self.name), error=e.message)
            if release is not None:
                await release()
            self._notify(reason)
            for subscription in list(self.subscriptions.values()):
                await subscription.close(reason)
        else:
            self._notify(reason)
            for subscription in list(self.subscriptions.values()):
                await subscription.stop()
                for consumer in list(subscription.consumers):
                    consumer.close_with(reason)
            # nothing more may reach the bookies from here; release what the ledger holds
            with contextlib.suppress(MagnetarError, TimeoutError):
                await asyncio.wait_for(self.ml.close(), 2.0)
            if release is not None:
                with contextlib.suppress(MagnetarError):
                    await release()
        self.state = TopicState.CLOSED
        # each subscription refers back to this topic, and so does the ledger's write-problem
        # listener: let go of them (see the tasks above)
        for subscription in list(self.subscriptions.values()):
            self._forget(subscription)
        self.ml.on_write_problem = None
        log.info("topic_closed", topic=str(self.name), graceful=graceful, reason=reason.message)

    def _notify(self, reason: MagnetarError) -> None:
        while self.waiting_producers:
            self._refuse(self.waiting_producers.popleft(), reason)
        for producer in list(self.producers.values()):
            producer.close_with(reason)
        for subscription in self.subscriptions.values():
            for consumer in list(subscription.consumers):
                consumer.close_with(reason)
