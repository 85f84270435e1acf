"""Consumers: one Consume stream per partition, merged into one bounded receive queue.

Each :class:`_PartitionConsumer` owns the stream to its partition's owner. Flow control counts
messages: after every (re)subscribe the broker holds no permits, the client grants the
partition's share of ``receiver_queue_size`` and grants more once the application has taken half
of it. Every message the broker sent gives its permit back when it leaves the client: taken by
the application, or dropped by the client (acknowledged already, before a seek target).

Acknowledgements go through :mod:`magnetar.aio.acks`: batch messages are tracked per entry and
the entry is acked once all its delivered messages are (with a partial ack when only some of the
entry's messages were delivered here); acks are gathered for ``ack_group_time_ms`` (or
``ack_group_max_ids`` entries) into one stream message, and flushed on close, together with
partial acks of entries the application acknowledged in part, so that a restart does not bring
those messages back.

Ack timeout (``ack_timeout_ms``): a message handed to the application and neither acknowledged
nor negatively acknowledged within it is asked back (``RedeliverUnacknowledged`` naming its
entry), checked every ``ack_timeout_tick_ms`` by one task per consumer.

Dead letters (``max_redelivery_count``): a message whose redelivery count is above it is not
handed to the application. The consumer publishes it to the dead-letter topic (its value, key,
event time and properties, plus ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID``) through a producer it
opens on first need, and acknowledges the original only once the broker confirmed that send. A
send that fails is logged and the original is negatively acknowledged, so that it comes again
and is tried again: a message is never acknowledged before its copy is stored.

Failover subscriptions: the broker tells each consumer when it becomes, or stops being, the
active consumer of a partition; :meth:`Consumer.active_partitions` says which partitions are
active and ``on_active_change`` hears each change. A partition whose stream ended is inactive
until the broker says otherwise on the new stream.

Failover: when the stream ends (``ConsumerClosed``, a transport error) the partition consumer
drops its queued but not yet received messages, looks the topic up again and resubscribes. A
durable subscription resumes from its cursor on the broker, so messages not acknowledged may come
again (at-least-once). A reader (non-durable) resubscribes at the entry of the last message it
handed out and skips everything up to that message. Acks waiting to be sent are sent on the new
stream before any permit, so the broker does not redeliver what was already acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import math
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from magnetar.aio.acks import AckGroup, BatchAckTracker, Entry, EntryAck, UnackedMessages
from magnetar.aio.codec import decode_entry
from magnetar.aio.config import ClientConfig, ConsumerConfig, ProducerConfig
from magnetar.aio.connection import ConnectionPool, PartitionOwner
from magnetar.aio.handoff import ThreadReceiveQueue
from magnetar.aio.message import EntryFacts, Message
from magnetar.aio.message_id import MessageId
from magnetar.aio.names import TopicName, parse_topic
from magnetar.aio.producer import Producer
from magnetar.aio.stream import PartitionStream
from magnetar.common.errors import (
    ClientConnectionError,
    ConsumerBusyError,
    ConsumerClosedError,
    CorruptionError,
    InvalidArgumentError,
    MagnetarError,
    OperationTimeoutError,
    ReceiveTimeoutError,
)
from magnetar.common.grpc_errors import error_from_detail
from magnetar.common.log import get_library_logger
from proto.broker.v1 import broker_pb2
from proto.common.v1 import types_pb2

if TYPE_CHECKING:
    from proto.broker.v1 import broker_pb2_grpc

__all__ = ["ActiveChangeCallback", "Consumer", "MessageListener", "start_position"]

log = get_library_logger("magnetar.aio.consumer", component="client")

_SUBSCRIPTION_TYPES = {
    "exclusive": types_pb2.SUBSCRIPTION_TYPE_EXCLUSIVE,
    "failover": types_pb2.SUBSCRIPTION_TYPE_FAILOVER,
    "shared": types_pb2.SUBSCRIPTION_TYPE_SHARED,
    "key_shared": types_pb2.SUBSCRIPTION_TYPE_KEY_SHARED,
}
_INITIAL_POSITIONS = {
    "latest": types_pb2.INITIAL_POSITION_LATEST,
    "earliest": types_pb2.INITIAL_POSITION_EARLIEST,
}
_WHOLE_ENTRY = 2**31
"""A batch index above any real one: a floor of ``(L, E, _WHOLE_ENTRY)`` skips all of entry E."""

Floor = tuple[int, int, int]
"""Messages whose ``(ledger_id, entry_id, batch_index)`` is below the floor are skipped."""

ActiveChangeCallback = Callable[[str, bool], None]
_Target = TypeVar("_Target")
MessageListener = Callable[[_Target, Message], "Awaitable[object] | object"]
"""``message_listener(consumer, message)`` (``reader_listener(reader, message)``): called for
every message, one at a time; may be a coroutine function."""
"""``on_active_change(partition_topic, is_active)``: a failover consumer became (or stopped
being) the active consumer of that partition."""

REAL_TOPIC_PROPERTY = "REAL_TOPIC"
"""Set on a dead-lettered message: the partition it came from."""
ORIGIN_MESSAGE_ID_PROPERTY = "ORIGIN_MESSAGE_ID"
"""Set on a dead-lettered message: ``str()`` of its original message id."""


def start_position(target: MessageId | int | None, publish_time_ms: int | None) -> Any:
    """The wire ``StartPosition`` for a message id (or sentinel), an offset or a publish time."""
    if publish_time_ms is not None:
        if target is not None:
            raise InvalidArgumentError("seek to a message id/offset or a publish time, not both")
        return types_pb2.StartPosition(publish_time_ms=publish_time_ms)
    if isinstance(target, MessageId):
        if target.is_earliest():
            return types_pb2.StartPosition(initial=types_pb2.INITIAL_POSITION_EARLIEST)
        if target.is_latest():
            return types_pb2.StartPosition(initial=types_pb2.INITIAL_POSITION_LATEST)
        return types_pb2.StartPosition(
            message_id=types_pb2.MessageId(
                ledger_id=target.ledger_id,
                entry_id=target.entry_id,
                batch_index=-1,
                partition=target.partition,
            )
        )
    if isinstance(target, int) and not isinstance(target, bool):
        if target < 0:
            raise InvalidArgumentError(f"an offset is >= 0, got {target}")
        return types_pb2.StartPosition(offset=target)
    raise InvalidArgumentError(
        f"seek needs a MessageId, an offset (int) or publish_time_ms=..., got {target!r}"
    )


def floor_of(target: MessageId, *, inclusive: bool) -> Floor | None:
    """The floor that starts delivery at ``target`` (inclusive) or just after it."""
    if target.is_earliest() or target.is_latest():
        return None
    if target.batch_index < 0:
        index = -1 if inclusive else _WHOLE_ENTRY
    else:
        index = target.batch_index if inclusive else target.batch_index + 1
    return (target.ledger_id, target.entry_id, index)


class _ReceiveQueue:
    """Messages of every partition in arrival order; bounded by the permits given out.

    Kept as the lists the deliveries came in (one per stream message), not message by message:
    a batch receive takes whole runs of them with a slice."""

    def __init__(self) -> None:
        self._runs: deque[tuple[_PartitionConsumer, list[Message]]] = deque()
        self._head = 0
        """Messages of the first run already taken."""
        self._count = 0
        self._nonempty = asyncio.Event()
        self._error: MagnetarError | None = None

    def __len__(self) -> int:
        return self._count

    def put(self, owner: _PartitionConsumer, messages: list[Message]) -> None:
        self._runs.append((owner, messages))
        self._count += len(messages)
        self._nonempty.set()

    def count_of(self, owner: _PartitionConsumer) -> int:
        """Queued messages of one partition."""
        count = sum(len(messages) for run_owner, messages in self._runs if run_owner is owner)
        return count - self._head if self._runs and self._runs[0][0] is owner else count

    def purge(self, owner: _PartitionConsumer) -> int:
        """Drop the messages of one partition; how many."""
        before = self._count
        if not before:
            return 0
        if self._runs[0][0] is owner:
            self._head = 0  # the partly taken run goes; the next one is whole
        self._runs = deque(run for run in self._runs if run[0] is not owner)
        self._count = sum(len(messages) for _owner, messages in self._runs) - self._head
        if not self._count and self._error is None:
            self._nonempty.clear()
        return before - self._count

    def fail(self, error: MagnetarError) -> None:
        """After what is queued, every get raises ``error``."""
        if self._error is None:
            self._error = error
        self._nonempty.set()

    def take(
        self, limit: int, max_bytes: int | None = None, *, at_least_one: bool = True
    ) -> tuple[_PartitionConsumer, list[Message], int]:
        """Up to ``limit`` queued messages of the first run (never mixing partitions), of at
        most ``max_bytes`` of payload (but the first one, ``at_least_one``), and their payload
        bytes (counted only with ``max_bytes``); the queue must not be empty."""
        owner, messages = self._runs[0]
        head = self._head
        end = min(len(messages), head + limit)
        used = 0
        if max_bytes is not None:
            for index in range(head, end):
                size = messages[index].size()
                if used + size > max_bytes and (index > head or not at_least_one):
                    end = index
                    break
                used += size
        taken = messages[head:end] if head or end < len(messages) else messages
        if end == len(messages):
            self._runs.popleft()
            self._head = 0
        else:
            self._head = end
        self._count -= end - head
        if not self._count and self._error is None:
            self._nonempty.clear()
        return owner, taken, used

    async def wait(self, timeout_s: float | None) -> None:
        """Until a message is queued (or the queue failed: :meth:`take` then raises)."""
        if self._count:
            return
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not self._count:
            if self._error is not None:
                raise self._error
            try:
                async with asyncio.timeout_at(deadline):
                    await self._nonempty.wait()
            except TimeoutError:
                raise ReceiveTimeoutError(
                    f"no message within {timeout_s * 1000:.0f} ms" if timeout_s else "no message",
                    context={"timeout_ms": round((timeout_s or 0) * 1000)},
                ) from None

    def take_one(self) -> tuple[_PartitionConsumer, Message]:
        """The first queued message and its partition; the queue must not be empty."""
        owner, messages = self._runs[0]
        head = self._head
        message = messages[head]
        head += 1
        if head == len(messages):
            self._runs.popleft()
            self._head = 0
        else:
            self._head = head
        self._count -= 1
        if not self._count and self._error is None:
            self._nonempty.clear()
        return owner, message

    def flush_taken(self) -> None:
        """Nothing to do: the asyncio consumer tells its partitions at once what was taken."""


@dataclass(slots=True, eq=False)
class _AckFlush:
    """Acks sent with request ids, waiting for their receipts (kept for resending)."""

    individual: list[EntryAck]
    cumulative: Entry | None
    waiters: list[asyncio.Future[None]]
    request_ids: set[int] = field(default_factory=set)


@dataclass(slots=True, eq=False)
class _SeekRequest:
    future: asyncio.Future[None]
    target: Any
    floor: Floor | None
    offset_floor: int | None


class _PartitionConsumer(PartitionStream):
    """One partition's subscription stream, resubscribed until closed or failed."""

    _role = "consumer"
    _busy_error = ConsumerBusyError
    _opened_kind = "subscribed"
    _open_request_name = "a subscribe"
    _open_verb = "answer the subscribe"
    _open_gerund = "subscribing"

    def __init__(
        self,
        consumer: Consumer,
        *,
        partition_topic: str,
        partition: int,
        queue_size: int,
    ) -> None:
        super().__init__(
            partition_topic=partition_topic,
            partition=partition,
            client_config=consumer.client_config,
            pool=consumer.pool,
            log=log.bind(topic=partition_topic, subscription=consumer.config.subscription_name),
        )
        self._consumer = consumer
        self._config = consumer.config
        self._queue = consumer.queue
        self._durable = consumer.durable
        self._queue_size = queue_size
        self._refill_at = max(1, queue_size // 2)
        self._consumed = 0
        """Permits given back by the application since the last Flow."""
        self._tracker = BatchAckTracker()
        self.discarded_corrupt_entries = 0
        """Entries that could not be decoded (corrupt, a zlib bomb): logged, acknowledged and
        never handed out."""
        self._unacked = UnackedMessages()
        """Messages handed out and not acknowledged (kept when ack_timeout_ms is on)."""
        self._track_unacked = consumer.durable and self._config.ack_timeout_ms > 0
        self._dead_letter_after = self._config.max_redelivery_count if consumer.durable else 0
        self._dead_lettering: set[tuple[int, int, int]] = set()
        """Messages on their way to the dead-letter topic: a redelivery of one is dropped."""
        self._generation = 0
        """Counts streams: permits of messages from an earlier stream are not given back."""
        self._opened_monotonic = 0.0
        """When the current stream was opened (``time.monotonic()``)."""
        self.active = False
        """Failover: the broker made this consumer the partition's active one."""
        self.flow_sent = False
        """A Flow was queued since the receive path last let the writer run."""
        self._acks = AckGroup()
        self._ack_timer: asyncio.TimerHandle | None = None
        self._ack_waiters: list[asyncio.Future[None]] = []
        self._unconfirmed: dict[int, _AckFlush] = {}
        self._requests: dict[int, _SeekRequest] = {}
        self._request_ids = consumer.request_ids
        self._outbox: deque[broker_pb2.ConsumeRequest] = deque()
        self._outbox_ready = asyncio.Event()
        self._outbox_empty = asyncio.Event()
        self._connected_event = asyncio.Event()
        self.end_of_topic = False
        # where (re)subscribing starts, and what the client skips
        self._start: Any = types_pb2.StartPosition(
            initial=_INITIAL_POSITIONS[self._config.initial_position]
        )
        self._floor: Floor | None = None
        self._offset_floor: int | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def set_start(self, start: Any, floor: Floor | None, offset_floor: int | None = None) -> None:
        self._start = start
        self._floor = floor
        self._offset_floor = offset_floor

    async def close(self, timeout_s: float) -> None:
        """Flush acks (waiting up to ``timeout_s`` for the broker to confirm), then close.

        Entries the application acknowledged in part are acked in part too: otherwise the
        broker, which only knows entries, would deliver those messages again after a restart.
        """
        if self._durable:
            for partial in self._tracker.partially_acked():
                self._acks.add_individual(partial)
        if self.connected and len(self._acks):
            waiter = self._ack_waiter()
            self._flush_acks(receipt=True)
            try:
                await asyncio.wait_for(waiter, timeout_s)
            except Exception as e:  # noqa: BLE001 - closing goes on; the unconfirmed acks are said
                # the broker may not have applied the last acks: they can be redelivered
                self._log.warning("consumer_close_acks_unconfirmed", error=repr(e))
        self._closing = True
        if self.connected:
            self._send(broker_pb2.ConsumeRequest(close=broker_pb2.ConsumerClose()))
            # let the writer put the close on the wire
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._outbox_empty.wait(), 1.0)
        if self._run_task is not None:
            self._run_task.cancel()
            await asyncio.gather(self._run_task, return_exceptions=True)
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        closed = ConsumerClosedError(f"the consumer on {self.partition_topic} was closed")
        self._fail_waiters(closed)

    def _on_failed(self, error: MagnetarError) -> None:
        self._fail_waiters(error)
        self._consumer.partition_failed(self, error)

    def _fail_waiters(self, error: MagnetarError) -> None:
        waiters = self._ack_waiters + [w for f in self._unconfirmed.values() for w in f.waiters]
        self._ack_waiters = []
        self._unconfirmed.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)
                waiter.exception()
        for request in self._requests.values():
            if not request.future.done():
                request.future.set_exception(error)
        self._requests.clear()

    # --- the application's side ------------------------------------------------------------

    @property
    def generation(self) -> int:
        """Counts this partition's streams (a message is from the stream it came on)."""
        return self._generation

    @property
    def unsent_permits(self) -> int:
        """Permits the application gave back that wait for the next Flow (sent at half the
        partition's share of the receive queue)."""
        return self._consumed

    def taken_one(self, message: Message) -> None:
        """:meth:`taken` of one message."""
        if self._durable and not self._track_unacked:
            self._credit(1)
        else:
            self.taken([message])

    def taken(self, messages: list[Message]) -> None:
        """The application received ``messages`` (in queue order): their permits come back."""
        if not self._durable:
            last = messages[-1].message_id()
            self._floor = (last.ledger_id, last.entry_id, last.batch_index + 1)
            self._offset_floor = None
        elif self._track_unacked:
            now = asyncio.get_running_loop().time()
            for message in messages:
                message_id = message.message_id()
                self._unacked.add(message_id.entry, message_id.batch_index, now)
        self._credit(len(messages))

    def _give_back(self, generation: int) -> None:
        """A message the application never saw is done with: its permit comes back, unless it
        came on an earlier stream (the new one was granted the whole queue)."""
        if generation == self._generation:
            self._credit(1)

    def _credit(self, permits: int) -> None:
        self._consumed += permits
        if self._consumed >= self._refill_at and self.connected:
            self._send(broker_pb2.ConsumeRequest(flow=broker_pb2.Flow(permits=self._consumed)))
            self._consumed = 0
            self.flow_sent = True

    def acknowledge(self, message_id: MessageId) -> asyncio.Future[None] | None:
        """:meth:`ack` of a message id."""
        return self.ack(message_id.entry, message_id.batch_index)

    def ack(self, entry: Entry, batch_index: int) -> asyncio.Future[None] | None:
        """Mark one message; a waiter when acks wait for receipts and an ack was queued.

        Without receipts, the ack of a message inside a batch waits (in the tracker) for the
        rest of its batch, and the entry is acknowledged whole. With receipts, a receipt means
        the ack is persisted, so the messages acknowledged so far go at once as a partial
        (batch-index) ack: otherwise a crash or failover before the batch completes would
        redeliver messages whose ack was confirmed."""
        if self._track_unacked:
            self._unacked.remove(entry, batch_index)
        ack = self._tracker.ack(entry, batch_index)
        if ack is None and self._config.ack_receipts:
            ack = self._tracker.acked_so_far(entry)
        if ack is None:
            return None
        self._acks.add_individual(ack)
        return self._queue_ack()

    def ack_cumulative(self, entry: Entry, batch_index: int) -> asyncio.Future[None] | None:
        """Mark every message up to this one; as :meth:`ack`, with receipts the part of its
        batch acknowledged so far goes at once as a partial ack beside the cumulative ack of
        the entries before it."""
        self._unacked.remove_up_to(entry, batch_index)
        cumulative = self._tracker.ack_cumulative(entry, batch_index)
        partial = None
        if self._config.ack_receipts and cumulative != entry:
            partial = self._tracker.acked_so_far(entry)
        if cumulative is None and partial is None:
            return None
        if cumulative is not None:
            self._acks.set_cumulative(cumulative)
        if partial is not None:
            self._acks.add_individual(partial)
        return self._queue_ack()

    def nack(self, entry: Entry, batch_index: int) -> None:
        """Ask for the message's entry again after the negative-ack delay."""
        self._unacked.remove(entry, batch_index)
        self._give_back_entry(entry)
        self._acks.add_nack(entry)
        self._queue_ack(waiter=False)

    def _give_back_entry(self, entry: Entry) -> None:
        """Before an entry is asked back (nack, ack timeout), tell the broker which of its
        messages were acknowledged already, so that its redelivery leaves them out."""
        so_far = self._tracker.acked_so_far(entry)
        if so_far is not None:
            self._acks.add_individual(so_far)

    def redeliver_unacknowledged(self, handed_out_before: float) -> None:
        """Ack timeout: ask back the entries of messages handed out at or before
        ``handed_out_before`` (loop time) and not acknowledged since."""
        entries = self._unacked.expired(handed_out_before)
        if not entries or not self.connected:
            # not connected: the broker redelivers every unacknowledged message on resubscribe
            return
        for entry in entries:
            self._give_back_entry(entry)
        self._flush_acks()  # on the wire before the redelivery request
        partition = self.partition
        self._send(
            broker_pb2.ConsumeRequest(
                redeliver=broker_pb2.RedeliverUnacknowledged(
                    message_ids=[_wire_id(e, partition) for e in entries]
                )
            )
        )
        self._log.info(
            "consumer_ack_timeout_redelivery",
            entries=len(entries),
            ack_timeout_ms=self._config.ack_timeout_ms,
        )

    # --- dead letters ----------------------------------------------------------------------

    def dead_lettered(self, message: Message, generation: int) -> None:
        """The dead-letter topic stored ``message``: acknowledge the original."""
        message_id = message.message_id()
        self._dead_lettering.discard((*message_id.entry, message_id.batch_index))
        ack = self._tracker.ack(message_id.entry, message_id.batch_index, dead_lettered=True)
        if ack is not None:
            self._acks.add_individual(ack)
            self._queue_ack(waiter=False)
        self._give_back(generation)

    def dead_letter_failed(self, message: Message, generation: int) -> None:
        """The copy was not stored: leave the original unacknowledged, and ask for it again
        (after the negative-ack delay) so that it is tried again."""
        message_id = message.message_id()
        self._dead_lettering.discard((*message_id.entry, message_id.batch_index))
        if not self._closing:
            self._give_back_entry(message_id.entry)
            self._acks.add_nack(message_id.entry)
            self._queue_ack(waiter=False)
        self._give_back(generation)

    def _ack_waiter(self) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ack_waiters.append(waiter)
        return waiter

    def _queue_ack(self, *, waiter: bool = True) -> asyncio.Future[None] | None:
        future = self._ack_waiter() if waiter and self._config.ack_receipts else None
        if len(self._acks) >= self._config.ack_group_max_ids:
            self._flush_acks()
        elif self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(
                self._config.ack_group_time_ms / 1000, self._flush_acks
            )
        return future

    def _flush_acks(self, *, receipt: bool = False) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if not self.connected:
            return  # kept; sent first thing after resubscribing
        individual, cumulative, nacks = self._acks.take()
        waiters, self._ack_waiters = self._ack_waiters, []
        want_receipt = receipt or self._config.ack_receipts
        flush = _AckFlush(individual, cumulative, waiters)
        partition = self.partition
        if individual:
            request_id = next(self._request_ids) if want_receipt else 0
            self._send(
                broker_pb2.ConsumeRequest(
                    ack=broker_pb2.Ack(
                        ack_type=broker_pb2.ACK_TYPE_INDIVIDUAL,
                        message_ids=[
                            _wire_id(a.entry, partition) for a in individual if not a.partial
                        ],
                        partial=[
                            broker_pb2.PartialAck(
                                message_id=_wire_id(a.entry, partition),
                                batch_indexes=a.batch_indexes,
                                batch_size=a.batch_size,
                            )
                            for a in individual
                            if a.partial
                        ],
                        request_id=request_id,
                        dead_lettered=sum(a.dead_lettered for a in individual),
                    )
                )
            )
            if request_id:
                flush.request_ids.add(request_id)
        if cumulative is not None:
            request_id = next(self._request_ids) if want_receipt else 0
            self._send(
                broker_pb2.ConsumeRequest(
                    ack=broker_pb2.Ack(
                        ack_type=broker_pb2.ACK_TYPE_CUMULATIVE,
                        message_ids=[_wire_id(cumulative, partition)],
                        request_id=request_id,
                    )
                )
            )
            if request_id:
                flush.request_ids.add(request_id)
        if nacks:
            self._send(
                broker_pb2.ConsumeRequest(
                    nack=broker_pb2.Nack(
                        message_ids=[_wire_id(e, partition) for e in nacks],
                        delay_ms=self._config.negative_ack_redelivery_delay_ms,
                    )
                )
            )
        if flush.request_ids:
            for request_id in flush.request_ids:
                self._unconfirmed[request_id] = flush
        else:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def seek(self, target: Any, floor: Floor | None, offset_floor: int | None) -> None:
        """Move the subscription (or reader) to ``target``; retried across reconnects."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._client_config.operation_timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    if self.error is not None:
                        raise self.error
                    await self._connected_event.wait()
                    self._flush_acks()  # acks made before the seek belong to the old position
                    request_id = next(self._request_ids)
                    request = _SeekRequest(loop.create_future(), target, floor, offset_floor)
                    self._requests[request_id] = request
                    self._send(
                        broker_pb2.ConsumeRequest(
                            seek=broker_pb2.Seek(request_id=request_id, target=target)
                        )
                    )
                    try:
                        await request.future
                    except ClientConnectionError:
                        continue  # the stream broke: seek again on the next one
                    return
        except TimeoutError:
            raise OperationTimeoutError(
                f"seek on {self.partition_topic} did not complete within"
                f" {self._client_config.operation_timeout_s} s (last problem: {self.last_error})"
            ) from None

    # --- the connection -------------------------------------------------------------------

    def _send(self, request: broker_pb2.ConsumeRequest) -> None:
        if self.connected:
            self._outbox.append(request)
            self._outbox_ready.set()
            self._outbox_empty.clear()

    def _ended(self) -> bool:
        if self.end_of_topic:
            self._log.info("consumer_end_of_topic")
        return self.end_of_topic

    def _closed(self, closed: broker_pb2.ConsumerClosed, address: str) -> MagnetarError:
        self.end_of_topic = closed.end_of_topic
        return super()._closed(closed, address)

    def _open_call(
        self,
        stub: broker_pb2_grpc.BrokerServiceAsyncStub,
        metadata: tuple[tuple[str, str], ...] | None,
    ) -> Any:
        return stub.Consume(metadata=metadata)

    def _send_control(self, token: str) -> None:
        self._send(broker_pb2.ConsumeRequest(auth=broker_pb2.AuthResponse(token=token)))

    def _open_request(self) -> broker_pb2.ConsumeRequest:
        start = self._start
        if not self._durable and self._floor is not None:
            ledger_id, entry_id, _ = self._floor
            start = types_pb2.StartPosition(
                message_id=types_pb2.MessageId(
                    ledger_id=ledger_id, entry_id=entry_id, batch_index=-1, partition=self.partition
                )
            )
        config = self._config
        return broker_pb2.ConsumeRequest(
            subscribe=broker_pb2.Subscribe(
                topic=self.partition_topic,
                subscription=config.subscription_name,
                subscription_type=_SUBSCRIPTION_TYPES[config.subscription_type],
                consumer_name=self._consumer.consumer_name(),
                priority_level=config.priority_level,
                start=start,
                durable=self._durable,
                max_redelivery_count=config.max_redelivery_count,
                dead_letter_topic=config.dead_letter_topic,
                properties=config.properties,
            )
        )

    def _on_opened(
        self,
        reply: broker_pb2.ConsumeResponse,
        owner: PartitionOwner,
    ) -> None:
        policy = reply.subscribed.max_redelivery_count
        if self._durable and self._config.max_redelivery_count == 0 and policy > 0:
            # the topic's max_redelivery_count policy applies when the consumer sets none
            self._dead_letter_after = policy
        self.connected = True
        self._opened_monotonic = time.monotonic()
        self._connected_event.set()
        self.broker = owner.address
        self._outbox.clear()
        self._consumed = 0
        self._generation += 1
        # acks that never reached the broker, or whose receipt never came, go first
        for flush in {id(f): f for f in self._unconfirmed.values()}.values():
            self._acks.extend(flush.individual, flush.cumulative)
            self._ack_waiters.extend(flush.waiters)
        self._unconfirmed.clear()
        if len(self._acks) or self._ack_waiters:
            self._flush_acks()
        self._send(broker_pb2.ConsumeRequest(flow=broker_pb2.Flow(permits=self._queue_size)))
        self._mark_opened()
        self._log.info("consumer_subscribed", broker=owner.address)

    def _on_disconnected(self) -> None:
        was_connected = self.connected
        self.connected = False
        self._connected_event.clear()
        self._outbox.clear()
        dropped = self._queue.purge(self)
        self._consumed = 0
        # whatever the application holds unacknowledged comes again on the new stream
        self._unacked.clear()
        self._set_active(active=False)
        broken = ClientConnectionError(f"the consumer stream of {self.partition_topic} ended")
        for request in self._requests.values():
            if not request.future.done():
                request.future.set_exception(broken)
                request.future.exception()
        self._requests.clear()
        if was_connected:
            self._log.info("consumer_disconnected", dropped_queued_messages=dropped)

    async def _write(self, call: Any) -> NoReturn:
        outbox = self._outbox
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while outbox:
                await call.write(outbox[0])
                outbox.popleft()
            self._outbox_empty.set()

    def _on_response(self, kind: str | None, response: broker_pb2.ConsumeResponse) -> None:
        if kind == "deliveries":
            self._on_deliveries(response.deliveries.deliveries)
        elif kind == "ack_receipt":
            self._on_ack_receipt(response.ack_receipt.request_id)
        elif kind == "seek_complete":
            self._on_seek_complete(response.seek_complete.request_id)
        elif kind == "error":
            self._on_error(response.error)
        elif kind == "active_change":
            self._set_active(response.active_change.is_active)

    def _set_active(self, active: bool) -> None:
        if active == self.active:
            return
        self.active = active
        if not active:
            self._unacked.clear()  # they go to the consumer that took over
            # and so do the queued ones: handing them to the application now would deliver
            # them after the new active consumer got (and maybe acknowledged) them
            dropped = self._queue.purge(self)
            if dropped and self.connected:
                self._credit(dropped)
        self._log.info("consumer_active_change", active=active)
        self._consumer.active_changed(self, active)

    def _on_deliveries(self, deliveries: Any) -> None:
        messages: list[Message] = []
        dead: list[Message] = []
        credit = 0
        tracker = self._tracker
        partition = self.partition
        topic = self.partition_topic
        received = time.monotonic()
        for delivery in deliveries:
            wire_id = delivery.message_id
            entry: Entry = (wire_id.ledger_id, wire_id.entry_id)
            try:
                decoded = decode_entry(delivery.entry)
            except CorruptionError as e:
                # nothing to hand over, and it can never be read: discard it, as Pulsar's
                # client does, so that it does not hold the subscription's backlog back
                self.discarded_corrupt_entries += 1
                self._log.warning("entry_discarded_corrupt", entry=entry, error=str(e))
                credit += len(delivery.batch_indexes) or max(wire_id.batch_size, 1)
                if self._durable:
                    self._acks.add_individual(EntryAck(entry))
                    self._queue_ack(waiter=False)
                continue
            batch = decoded.messages
            size = len(batch)
            if self._durable:
                indexes = tracker.delivered(entry, size, delivery.batch_indexes)
            else:  # a reader acknowledges nothing: nothing to track
                wanted = delivery.batch_indexes
                indexes = (
                    sorted(i for i in wanted if 0 <= i < size) if wanted else list(range(size))
                )
            credit += (len(delivery.batch_indexes) or size) - len(indexes)
            ledger_id, entry_id = entry
            first_offset = decoded.first_offset
            facts = EntryFacts(
                ledger_id=ledger_id,
                entry_id=entry_id,
                partition=partition,
                batch_size=size,
                first_offset=first_offset,
                publish_time_ms=decoded.publish_time_ms,
                redelivery_count=delivery.redelivery_count,
                topic=topic,
                producer_name=decoded.producer_name,
                sequence_id=decoded.sequence_id,
                received_monotonic=received,
                stream_opened_monotonic=self._opened_monotonic,
                owner=self,
            )
            to_dead_letter = 0 < self._dead_letter_after < delivery.redelivery_count
            if not to_dead_letter and self._floor is None and self._offset_floor is None:
                # the common case: every message goes to the application
                if len(indexes) == size:
                    messages.extend([Message(facts, m, i) for i, m in enumerate(batch)])
                else:
                    messages.extend([Message(facts, batch[i], i) for i in indexes])
                continue
            for index in indexes:
                offset = first_offset + index
                if not self._passes(ledger_id, entry_id, index, offset):
                    credit += 1
                    if self._durable and (ack := tracker.ack(entry, index)) is not None:
                        # skipped on purpose (before a seek target): consumed for the cursor
                        self._acks.add_individual(ack)
                        self._queue_ack(waiter=False)
                    continue
                if to_dead_letter:
                    key = (ledger_id, entry_id, index)
                    if key in self._dead_lettering:
                        credit += 1  # already on its way; that send acks or asks again
                        continue
                    self._dead_lettering.add(key)
                (dead if to_dead_letter else messages).append(Message(facts, batch[index], index))
        if messages:
            self._queue.put(self, messages)
        if dead:
            # their permits come back once each is dealt with: that bounds the sends in flight
            self._consumer.dead_letter(self, dead, self._generation)
        if credit:
            self._credit(credit)

    def _passes(self, ledger_id: int, entry_id: int, index: int, offset: int) -> bool:
        floor = self._floor
        if floor is not None and (ledger_id, entry_id, index) < floor:
            return False
        if self._offset_floor is not None and offset < self._offset_floor:
            return False
        if self._durable:
            # a durable subscription's floor only trims the first entry after a seek
            self._floor = None
            self._offset_floor = None
        return True

    def _on_ack_receipt(self, request_id: int) -> None:
        flush = self._unconfirmed.pop(request_id, None)
        if flush is None:
            return
        flush.request_ids.discard(request_id)
        if flush.request_ids:
            return
        for waiter in flush.waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _on_seek_complete(self, request_id: int) -> None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        dropped = self._queue.purge(self)
        self._tracker.clear()
        self._unacked.clear()
        self._floor = request.floor
        self._offset_floor = request.offset_floor
        if not self._durable:
            self._start = request.target
        # the broker holds no permits after a seek, as after a subscribe
        self._consumed = 0
        self._send(broker_pb2.ConsumeRequest(flow=broker_pb2.Flow(permits=self._queue_size)))
        self._log.info("consumer_seek_complete", dropped_queued_messages=dropped)
        if not request.future.done():
            request.future.set_result(None)

    def _on_error(self, wire: broker_pb2.ConsumeError) -> None:
        error = error_from_detail(wire.error)
        flush = self._unconfirmed.pop(wire.request_id, None)
        if flush is not None:
            for other in flush.request_ids:
                self._unconfirmed.pop(other, None)
            for waiter in flush.waiters:
                if not waiter.done():
                    waiter.set_exception(error)
                    waiter.exception()
            return
        request = self._requests.pop(wire.request_id, None)
        if request is not None:
            if not request.future.done():
                request.future.set_exception(error)
            return
        self._log.warning("consumer_request_failed", request_id=wire.request_id, error=repr(error))


def _wire_id(entry: Entry, partition: int) -> types_pb2.MessageId:
    return types_pb2.MessageId(
        ledger_id=entry[0], entry_id=entry[1], batch_index=-1, partition=partition
    )


class Consumer:
    """Receives from one topic (all its partitions) on one subscription.

    Create it with ``client.subscribe``; readers use the same machinery without a durable cursor.

    Dead letters: with ``max_redelivery_count`` N > 0, a message redelivered more than N times
    (``redelivery_count() > N``: it reached the application N + 1 times already) is not handed
    to the application again. The consumer publishes it to ``dead_letter_topic`` (default
    ``<topic>-DLQ``) with the same value, key, event time and properties, plus ``REAL_TOPIC``
    (the partition it came from) and ``ORIGIN_MESSAGE_ID`` (``str()`` of its id), through a
    producer of the same client opened on first need and closed with the consumer; once the
    broker confirmed that copy, it acknowledges the original. When the copy cannot be stored it
    logs why and negatively acknowledges the original, which comes again and is tried again.

    ``on_active_change(partition_topic, is_active)``: called (on the event loop; it must not
    block) each time a partition becomes active or inactive for this consumer, as
    :meth:`active_partitions` reports it: told by the broker on failover subscriptions, and
    inactive when the partition's stream ends (a reconnect, or close).
    """

    def __init__(
        self,
        *,
        topic: TopicName,
        config: ConsumerConfig,
        client_config: ClientConfig,
        pool: ConnectionPool,
        durable: bool = True,
        on_close: Callable[[Consumer], None] | None = None,
        on_active_change: ActiveChangeCallback | None = None,
        thread_queue: ThreadReceiveQueue | None = None,
    ) -> None:
        self._topic = topic
        self.config = config
        self.client_config = client_config
        self.pool = pool
        self.durable = durable
        self.queue: _ReceiveQueue | ThreadReceiveQueue = (
            thread_queue if thread_queue is not None else _ReceiveQueue()
        )
        """Received messages; a :class:`ThreadReceiveQueue` when the sync client reads them."""
        self._listener_task: asyncio.Task[None] | None = None
        self.request_ids = itertools.count(1)
        self._partitions: dict[int, _PartitionConsumer] = {}
        self._consumer_name = config.consumer_name or f"consumer-{uuid.uuid4().hex[:10]}"
        self._closed = False
        self._on_close = on_close
        self._on_active_change = on_active_change
        self._ack_timeout_task: asyncio.Task[None] | None = None
        # dead letters: the topic is checked now, the producer opened on first need
        self._dead_letter_topic: TopicName | None = None
        if durable and config.max_redelivery_count > 0:
            self._dead_letter_topic = parse_topic(config.dead_letter_topic or f"{topic.full}-DLQ")
        self._dead_letter_producer: asyncio.Task[Producer] | None = None
        self._dead_letter_tasks: set[asyncio.Task[None]] = set()

    # --- creation ----------------------------------------------------------------------------

    async def _start(
        self,
        start: MessageId | int | None = None,
        *,
        start_inclusive: bool = False,
        start_publish_time_ms: int | None = None,
    ) -> None:
        timeout_s = self.client_config.operation_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        targets = await self.pool.partitions_of(self._topic, timeout_s)
        try:
            await asyncio.wait_for(
                self._open_partitions(targets, start, start_inclusive, start_publish_time_ms),
                deadline - loop.time(),
            )
        except TimeoutError:
            last = next((p.last_error for p in self._partitions.values() if p.last_error), None)
            await self._abandon()
            raise OperationTimeoutError(
                f"could not subscribe to {self._topic} within {timeout_s} s (last problem: {last})",
                context={"topic": str(self._topic)},
            ) from None
        except BaseException:
            await self._abandon()
            raise
        if self.durable and self.config.ack_timeout_ms > 0:
            self._ack_timeout_task = asyncio.create_task(
                self._ack_timeout_loop(), name=f"consumer-ack-timeout:{self._topic}"
            )

    async def _open_partitions(
        self,
        targets: list[tuple[str, int]],
        start: MessageId | int | None,
        start_inclusive: bool,
        start_publish_time_ms: int | None,
    ) -> None:
        topic = self._topic
        if (
            isinstance(start, MessageId)
            and not (start.is_earliest() or start.is_latest())
            and len(targets) > 1
        ):
            raise InvalidArgumentError(
                f"{topic} has {len(targets)} partitions: start a reader of a partitioned topic"
                " at MessageId.earliest or MessageId.latest, or read one partition"
                " ('topic-partition-N') from a message id"
            )
        queue_size = max(1, math.ceil(self.config.receiver_queue_size / len(targets)))
        for partition_topic, partition in targets:
            partition_consumer = _PartitionConsumer(
                self,
                partition_topic=partition_topic,
                partition=partition,
                queue_size=queue_size,
            )
            if isinstance(start, MessageId):
                partition_consumer.set_start(
                    start_position(start, None), floor_of(start, inclusive=start_inclusive)
                )
            elif start is not None or start_publish_time_ms is not None:
                partition_consumer.set_start(
                    start_position(start, start_publish_time_ms),
                    None,
                    start if isinstance(start, int) else None,
                )
            self._partitions[partition] = partition_consumer
        await asyncio.gather(*(p.start() for p in self._partitions.values()))

    async def _abandon(self) -> None:
        self._closed = True
        await self._stop_background(0)
        await asyncio.gather(
            *(p.close(0) for p in self._partitions.values()), return_exceptions=True
        )
        await self._close_dead_letter_producer(0)

    # --- what users call ---------------------------------------------------------------------

    def topic(self) -> str:
        return self._topic.full

    def subscription_name(self) -> str:
        return self.config.subscription_name

    def consumer_name(self) -> str:
        return self._consumer_name

    def is_connected(self) -> bool:
        return not self._closed and all(p.connected for p in self._partitions.values())

    def has_reached_end_of_topic(self) -> bool:
        """The topic was terminated and every partition delivered its last message."""
        return bool(self._partitions) and all(p.end_of_topic for p in self._partitions.values())

    def discarded_corrupt_entries(self) -> int:
        """Entries delivered that could not be decoded (corrupt bytes, a batch inflating past
        its declared size): each was logged (``entry_discarded_corrupt``), acknowledged so that
        it does not hold the backlog back, and never handed out. Pulsar's client does the
        same with a corrupt message."""
        return sum(p.discarded_corrupt_entries for p in self._partitions.values())

    def active_partitions(self) -> list[int]:
        """Failover: the partitions (indexes; -1 for a non-partitioned topic) this consumer is
        the active consumer of, as the broker last said. Other subscription types are not told
        and list none."""
        return sorted(index for index, p in self._partitions.items() if p.active)

    def stream_states(self) -> list[dict[str, Any]]:
        """What each partition's stream holds now, for diagnosing a consumer that gets nothing:
        whether it is connected and to which broker, how many streams it has had, messages of
        it waiting in the receive queue, permits the application gave back that are not sent
        yet, and the last problem it met."""
        queue = self.queue
        return [
            {
                "partition": index,
                "connected": p.connected,
                "broker": p.broker,
                "streams": p.generation,
                "queued": queue.count_of(p) if isinstance(queue, _ReceiveQueue) else None,
                "permits_to_give_back": p.unsent_permits,
                "failed": repr(p.error) if p.error is not None else None,
                "last_problem": repr(p.last_error) if p.last_error is not None else None,
            }
            for index, p in sorted(self._partitions.items())
        ]

    async def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; :class:`ReceiveTimeoutError` when none comes in ``timeout_millis``."""
        if self._listener_task is not None:
            raise self._listener_refusal("receive")
        return await self._receive(timeout_millis)

    async def _receive(self, timeout_millis: int | None = None) -> Message:
        if self._closed:
            raise ConsumerClosedError(f"the consumer on {self._topic} is closed")
        queue = self._loop_queue()
        if not queue._count:
            await queue.wait(None if timeout_millis is None else timeout_millis / 1000)
        owner, message = queue.take_one()
        owner.taken_one(message)
        if owner.flow_sent:
            # A receive that finds messages queued never suspends, so a loop of them would
            # empty the queue before the writer put the Flow on the wire, and then wait a
            # whole round trip for more: let the writer run now.
            owner.flow_sent = False
            await asyncio.sleep(0)
        return message

    def _loop_queue(self) -> _ReceiveQueue:
        queue = self.queue
        if not isinstance(queue, _ReceiveQueue):
            raise InvalidArgumentError(
                "this consumer belongs to the sync client: receive through magnetar.Client"
            )
        return queue

    def _listener_refusal(self, call: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{call} is not allowed on a consumer with a message_listener: the listener gets"
            " every message",
            context={"topic": self._topic.full},
        )

    async def batch_receive(
        self, max_messages: int | None = None, timeout_millis: int | None = None
    ) -> list[Message]:
        """The messages that arrive until ``max_messages`` (default
        ``batch_receive_max_messages``) or ``batch_receive_max_bytes`` are reached, or
        ``timeout_millis`` (default ``batch_receive_timeout_ms``) has passed; possibly none.
        Messages already queued are returned at once."""
        if self._listener_task is not None:
            raise self._listener_refusal("batch_receive")
        if self._closed:
            raise ConsumerClosedError(f"the consumer on {self._topic} is closed")
        limit = self.config.batch_receive_max_messages if max_messages is None else max_messages
        if limit < 1:
            raise InvalidArgumentError(f"max_messages is at least 1, got {limit}")
        timeout_ms = (
            self.config.batch_receive_timeout_ms if timeout_millis is None else timeout_millis
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        max_bytes = self.config.batch_receive_max_bytes
        queue = self._loop_queue()
        messages: list[Message] = []
        size = 0
        while len(messages) < limit and size < max_bytes:
            try:
                await queue.wait(max(0.0, deadline - loop.time()))
            except ReceiveTimeoutError:
                break
            except MagnetarError:
                if messages:
                    break  # the error comes again on the next call, after these
                raise
            owner, run, run_size = queue.take(
                limit - len(messages), max_bytes - size, at_least_one=not messages
            )
            if not run:
                break
            owner.taken(run)
            messages.extend(run)
            size += run_size
        if any(p.flow_sent for p in self._partitions.values()):
            for partition in self._partitions.values():
                partition.flow_sent = False
            await asyncio.sleep(0)  # the Flow goes out before the caller works through these
        return messages

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except ConsumerClosedError:
            raise StopAsyncIteration from None

    async def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message. Returns once queued (acks are grouped), or once the broker
        confirmed when ``ack_receipts`` is on."""
        owner, entry, index = self.ack_target(message)
        waiter = owner.ack(entry, index)
        if waiter is not None:
            await self._wait_ack(waiter)

    async def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge this message and every earlier one of its partition."""
        self.check_cumulative_allowed()
        owner, entry, index = self.ack_target(message)
        waiter = owner.ack_cumulative(entry, index)
        if waiter is not None:
            await self._wait_ack(waiter)

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Ask for the message again after ``negative_ack_redelivery_delay_ms``."""
        owner, entry, index = self.ack_target(message)
        owner.nack(entry, index)

    def check_cumulative_allowed(self) -> None:
        """Raise when the subscription type does not allow cumulative acknowledgement."""
        if self.config.subscription_type in ("shared", "key_shared"):
            raise InvalidArgumentError(
                f"cumulative acknowledgement is not allowed on a {self.config.subscription_type}"
                " subscription (acknowledge messages individually)"
            )

    def ack_target(self, message: Message | MessageId) -> tuple[_PartitionConsumer, Entry, int]:
        """Where an (negative) acknowledgement of ``message`` goes: the partition consumer,
        the entry and the batch index; raises a clear error for a closed consumer or an id
        that names no stored message of this consumer's partitions. Safe from any thread (it
        only reads)."""
        if type(message) is Message:
            facts = message._entry
            owner = facts.owner
            if isinstance(owner, _PartitionConsumer) and owner._consumer is self:
                if self._closed:
                    raise ConsumerClosedError(f"the consumer on {self._topic} is closed")
                return owner, facts.entry, message._index
        message_id = self._ack_id_of(message)
        return self._partition_of(message_id), message_id.entry, message_id.batch_index

    async def seek(
        self, target: MessageId | int | None = None, *, publish_time_ms: int | None = None
    ) -> None:
        """Move the subscription: to a message id (that message comes next), an offset (the first
        message at or after it, on every partition) or ``publish_time_ms=`` (the first message
        published at or after it, on every partition). ``MessageId.earliest``/``latest`` apply
        to every partition; any other message id to its own partition only."""
        if self._closed:
            raise ConsumerClosedError(f"the consumer on {self._topic} is closed")
        position = start_position(target, publish_time_ms)
        partitions = list(self._partitions.values())
        floor: Floor | None = None
        offset_floor: int | None = None
        if isinstance(target, MessageId):
            floor = floor_of(target, inclusive=True)
            if floor is not None:
                partitions = [self._partition_of(target)]
        elif isinstance(target, int):
            offset_floor = target
        await asyncio.gather(*(p.seek(position, floor, offset_floor) for p in partitions))

    async def close(self) -> None:
        """Flush acknowledgements, then close every partition's stream. Idempotent.

        Messages on their way to the dead-letter topic get up to the close timeout to be stored
        and acknowledged; those that are not stay unacknowledged (they come again). A
        ``message_listener`` gets no message after this starts; one still running gets up to
        the close timeout to finish (its acknowledgement still counts), then is cancelled."""
        if self._closed:
            return
        self._closed = True
        if self._on_close is not None:
            self._on_close(self)
        timeout_s = min(self.client_config.operation_timeout_s, 5.0)
        await self._stop_listener(timeout_s)
        self.queue.flush_taken()
        await self._stop_background(timeout_s)
        await asyncio.gather(*(p.close(timeout_s) for p in self._partitions.values()))
        await self._close_dead_letter_producer(timeout_s)
        self.queue.fail(ConsumerClosedError(f"the consumer on {self._topic} was closed"))
        log.info("consumer_closed", topic=self._topic.full, subscription=self.subscription_name())

    # --- message listener --------------------------------------------------------------------

    def start_listener(self, listener: MessageListener[Any], target: object) -> None:
        """Hand every message to ``listener(target, message)`` from now on, one at a time in
        arrival order, on a task of the event loop (a coroutine listener is awaited before the
        next message). A listener that raises is logged and delivery goes on; its message is
        left unacknowledged, so it comes again (ack timeout, negative ack, reconnect)."""
        self._listener_task = asyncio.create_task(
            self._listen(listener, target), name=f"message-listener:{self._topic}"
        )

    async def _listen(self, listener: MessageListener[Any], target: object) -> None:
        while True:
            try:
                message = await self._receive()
            except ConsumerClosedError:
                return
            except MagnetarError as e:
                log.warning("message_listener_stopped", topic=self._topic.full, error=repr(e))
                return
            try:
                result = listener(target, message)
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "message_listener_failed",
                    topic=message.topic_name(),
                    message_id=str(message.message_id()),
                )

    async def _stop_listener(self, timeout_s: float) -> None:
        task = self._listener_task
        if task is None or task is asyncio.current_task():
            return  # closed from inside the listener: it ends once it returns
        # the listener may be in the middle of a message: let it finish, then stop it
        self.queue.fail(ConsumerClosedError(f"the consumer on {self._topic} was closed"))
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- internals -------------------------------------------------------------------------

    def partition_failed(self, partition: _PartitionConsumer, error: MagnetarError) -> None:
        log.warning("consumer_partition_failed", topic=partition.partition_topic, error=repr(error))
        self.queue.fail(error)

    def active_changed(self, partition: _PartitionConsumer, active: bool) -> None:
        callback = self._on_active_change
        if callback is None:
            return
        try:
            callback(partition.partition_topic, active)
        except Exception:  # an application callback must not break the stream's reader
            log.exception("active_change_callback_failed", topic=partition.partition_topic)

    async def _ack_timeout_loop(self) -> None:
        """Every ``ack_timeout_tick_ms``: ask back what was handed out ``ack_timeout_ms`` ago or
        more and is still unacknowledged."""
        timeout_s = self.config.ack_timeout_ms / 1000
        tick_s = self.config.ack_timeout_tick_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick_s)
            self.queue.flush_taken()  # what other threads took is tracked from now
            handed_out_before = loop.time() - timeout_s
            for partition in self._partitions.values():
                try:
                    partition.redeliver_unacknowledged(handed_out_before)
                except Exception:  # a bug must not stop the timer for every partition; logged
                    log.exception("ack_timeout_check_failed", topic=partition.partition_topic)

    def dead_letter(
        self, partition: _PartitionConsumer, messages: list[Message], generation: int
    ) -> None:
        """Move ``messages`` (over ``max_redelivery_count``) to the dead-letter topic, in the
        background: the stream's reader must not wait for another topic's broker."""
        if self._closed:
            return  # they stay unacknowledged, and come again
        task = asyncio.create_task(
            self._dead_letter(partition, messages, generation),
            name=f"consumer-dead-letter:{partition.partition_topic}",
        )
        self._dead_letter_tasks.add(task)
        task.add_done_callback(self._dead_letter_tasks.discard)

    async def _dead_letter(
        self, partition: _PartitionConsumer, messages: list[Message], generation: int
    ) -> None:
        try:
            producer = await self._dead_letter_producer_ready()
        except Exception as e:  # noqa: BLE001 - whatever it is, the messages must come again
            log.warning(
                "dead_letter_producer_failed",
                topic=partition.partition_topic,
                dead_letter_topic=str(self._dead_letter_topic),
                messages=len(messages),
                error=repr(e),
            )
            for message in messages:
                partition.dead_letter_failed(message, generation)
            return
        sends = []
        for message in messages:
            properties = message.properties()
            properties[REAL_TOPIC_PROPERTY] = partition.partition_topic
            properties[ORIGIN_MESSAGE_ID_PROPERTY] = str(message.message_id())
            sends.append(
                await producer.send_async_when_room(
                    message.data(),
                    properties=properties,
                    partition_key=message.partition_key(),
                    event_timestamp=message.event_timestamp() or None,
                )
            )
        results = await asyncio.gather(*sends, return_exceptions=True)
        stored = 0
        for message, result in zip(messages, results, strict=True):
            if isinstance(result, BaseException):
                log.warning(
                    "dead_letter_send_failed",
                    topic=partition.partition_topic,
                    message_id=str(message.message_id()),
                    dead_letter_topic=producer.topic(),
                    error=repr(result),
                )
                partition.dead_letter_failed(message, generation)
            else:
                stored += 1
                partition.dead_lettered(message, generation)
        if stored:
            log.info(
                "messages_dead_lettered",
                topic=partition.partition_topic,
                dead_letter_topic=producer.topic(),
                messages=stored,
                max_redelivery_count=self.config.max_redelivery_count,
            )

    async def _dead_letter_producer_ready(self) -> Producer:
        """The dead-letter producer, opened once for every partition; a failed open is tried
        again by the next message that needs it."""
        if self._closed:
            raise ConsumerClosedError(f"the consumer on {self._topic} is closing")
        opening = self._dead_letter_producer
        if opening is None or (
            opening.done() and (opening.cancelled() or opening.exception() is not None)
        ):
            opening = asyncio.create_task(self._open_dead_letter_producer())
            self._dead_letter_producer = opening
        return await asyncio.shield(opening)

    async def _open_dead_letter_producer(self) -> Producer:
        if self._dead_letter_topic is None:  # dead letters by the topic's policy
            self._dead_letter_topic = parse_topic(
                self.config.dead_letter_topic or f"{self._topic.full}-DLQ"
            )
        producer = Producer(
            topic=self._dead_letter_topic,
            config=ProducerConfig(),
            client_config=self.client_config,
            pool=self.pool,
        )
        await producer._start()
        log.info(
            "dead_letter_producer_opened",
            topic=self._topic.full,
            dead_letter_topic=producer.topic(),
        )
        return producer

    async def _stop_background(self, timeout_s: float) -> None:
        """Stop the ack-timeout timer; give dead-letter sends up to ``timeout_s`` to finish."""
        if self._ack_timeout_task is not None:
            self._ack_timeout_task.cancel()
            await asyncio.gather(self._ack_timeout_task, return_exceptions=True)
            self._ack_timeout_task = None
        tasks = list(self._dead_letter_tasks)
        if tasks and timeout_s > 0:
            await asyncio.wait(tasks, timeout=timeout_s)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _close_dead_letter_producer(self, timeout_s: float) -> None:
        """Close the dead-letter producer, waiting at most ``timeout_s`` for its receipts: what
        it still holds belongs to sends given up on, whose originals stay unacknowledged."""
        opening, self._dead_letter_producer = self._dead_letter_producer, None
        if opening is None:
            return
        if not opening.done():
            opening.cancel()
        results = await asyncio.gather(opening, return_exceptions=True)
        producer = results[0]
        if isinstance(producer, Producer):
            await producer._close(timeout_s)

    @staticmethod
    def _id_of(message: Message | MessageId) -> MessageId:
        if isinstance(message, Message):
            return message.message_id()
        if isinstance(message, MessageId):
            return message
        raise InvalidArgumentError(f"expected a Message or a MessageId, got {message!r}")

    def _ack_id_of(self, message: Message | MessageId) -> MessageId:
        """The id of a message to (negatively) acknowledge: one that names a stored message."""
        message_id = self._id_of(message)
        if message_id.ledger_id < 0 or message_id.entry_id < 0 or message_id.is_latest():
            raise InvalidArgumentError(
                f"message id {message_id} names no stored message (earliest, latest or"
                f" negative ids cannot be acknowledged) on {self._topic}",
                context={"message_id": str(message_id), "topic": self._topic.full},
            )
        return message_id

    def _partition_of(self, message_id: MessageId) -> _PartitionConsumer:
        if self._closed:
            raise ConsumerClosedError(f"the consumer on {self._topic} is closed")
        found = self._partitions.get(message_id.partition)
        if found is None and message_id.partition == -1 and len(self._partitions) == 1:
            # an id built without its partition, for a consumer of one partition
            found = next(iter(self._partitions.values()))
        if found is None:
            indexes = sorted(self._partitions)
            have = (
                "it is not partitioned"
                if indexes == [-1]
                else f"this consumer has partitions {', '.join(map(str, indexes))}"
            )
            raise InvalidArgumentError(
                f"message id {message_id} is from partition {message_id.partition}, which is not"
                f" a partition of {self._topic} that this consumer receives ({have})",
                context={"message_id": str(message_id), "topic": self._topic.full},
            )
        return found

    async def _wait_ack(self, waiter: asyncio.Future[None]) -> None:
        timeout_s = self.client_config.operation_timeout_s
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            raise OperationTimeoutError(
                f"the broker did not confirm an acknowledgement within {timeout_s} s"
            ) from None
