"""Producers: batching, routing, back-pressure, and a per-partition stream that survives failover.

A :class:`Producer` routes each message to a partition (:mod:`magnetar.aio.routing`) and hands it
to that partition's :class:`_PartitionProducer`, which owns one Produce stream on the partition's
owner. Messages gather in a batch until it is full or ``batching_max_publish_delay_ms`` passed;
a sealed batch gets sequence ids and a request id and stays *pending* until the broker's receipt
says it is durable. The stream's sender writes every batch ready at that moment in one stream
message.

Self-clocking (``batching_self_clocking``, on by default), as Nagle's algorithm: a batch that was
sealed before it was full is *small*, and at most one small batch per partition is in flight (sealed
and not yet confirmed or failed). With none in flight, what the current loop iteration added goes
out at once (sealed with ``call_soon``, so a burst from one coroutine still shares a batch). While
one is in flight, messages gather until its receipt, until the batch is full (a full batch always
goes), or until ``batching_max_publish_delay_ms`` after the first of them, whichever comes first:
batches grow under load and vanish when idle. Off: every batch waits out the delay unless it fills.

Failover: when the stream ends (``ProducerClosed``: the partition moved or the broker stops; a
transport error: the broker died), the partition producer looks the topic up again, reopens on
the new owner with the same producer name, and resends every pending batch in order with the
same sequence ids; the broker stores each (producer name, sequence id) once and answers resends
of stored batches with duplicate receipts. Attempts back off from ``initial_backoff_ms`` to
``max_backoff_ms``. A batch still unconfirmed ``send_timeout_ms`` after its first message was
sent fails with :class:`OperationTimeoutError`; an error the broker calls final (no such topic,
a bad name, a producer of that name already connected at first open) fails the partition.

Bounds: at most ``max_pending_messages`` messages are pending over all partitions; ``send()``
waits for room and ``send_async()`` fails at once with :class:`ProducerQueueFullError`.

Each batch carries what the broker routes and schedules on without opening it: the hashes of its
messages' keys (key_shared subscriptions) and its delivery time. Delayed delivery
(``deliver_after_ms`` / ``deliver_at_ms``) is per batch, so a message whose delivery time differs
from that of the batch being filled seals it and starts the next one; ``deliver_after_ms`` is
turned into a time with this process's wall clock when the message is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeAlias, TypeVar, Unpack

from magnetar.aio.codec import BatchBuilder, SealedBatch, encode_extras, message_size
from magnetar.aio.config import ClientConfig, ProducerConfig
from magnetar.aio.connection import ConnectionPool, is_transient
from magnetar.aio.message_id import MessageId
from magnetar.aio.names import TopicName
from magnetar.aio.routing import PartitionRouter
from magnetar.aio.send_options import (
    NO_OPTIONS,
    SendFields,
    SendOptions,
    deliver_time_ms,
    send_options,
)
from magnetar.aio.stream import PartitionStream
from magnetar.common.errors import (
    InvalidArgumentError,
    MagnetarError,
    MessageTooLargeError,
    OperationTimeoutError,
    ProducerBusyError,
    ProducerClosedError,
    ProducerQueueFullError,
)
from magnetar.common.grpc_errors import error_from_detail
from magnetar.common.log import get_library_logger
from proto.broker.v1 import broker_pb2

if TYPE_CHECKING:
    from magnetar.aio.connection import PartitionOwner
    from proto.broker.v1 import broker_pb2_grpc

__all__ = [
    "ManyCallback",
    "Producer",
    "RunSink",
    "SendCallback",
    "SendReceipt",
    "deliver_time_ms",
]

log = get_library_logger("magnetar.aio.producer", component="client")

SendCallback = Callable[[MagnetarError | None, MessageId | None], None]
"""``callback(error, message_id)``: exactly one of the two is None."""

ManyCallback = Callable[[MagnetarError | None, "SendReceipt | None"], None]
"""``callback(error, receipt)`` of :meth:`Producer.send_many_async`: exactly one is None."""

_T = TypeVar("_T")
_Single = tuple["asyncio.Future[MessageId]", SendCallback | None]
_Handle: TypeAlias = "_Single | _ManySend | _RunPart"
_Future = asyncio.Future
_PLAIN_OVERHEAD = message_size(b"", None, None)
"""What a message adds to its batch beyond its value when it has nothing else."""
_new_message_id: Any = tuple.__new__
"""``make_message_id`` inlined: a receipt makes one id per ``send_async``."""
_DEFAULT_MAX_MESSAGE_BYTES = 5 * 1024 * 1024
_ENVELOPE_ROOM_BYTES = 1024
"""Kept free under the broker's max_message_bytes for the entry envelope around a batch."""


def _run_callback(
    callback: Callable[[MagnetarError | None, _T | None], None],
    error: MagnetarError | None,
    result: _T | None,
) -> None:
    """Call a send callback (``send_async``'s or ``send_many_async``'s) with its outcome."""
    try:
        callback(error, result)
    except Exception:  # an application callback must not break the producer
        log.exception("send_callback_failed")


def _fail_handle(handle: _Handle, error: MagnetarError, count: int = 1) -> None:
    if not isinstance(handle, tuple):
        handle.fail(error, count)
        return
    future, callback = handle
    if callback is not None:
        _run_callback(callback, error, None)
    if not future.done():
        future.set_exception(error)
        if callback is not None:
            future.exception()  # the callback reported it: no "never retrieved" warning


def _fail_parts(parts: list[tuple[_Handle, int]], error: MagnetarError) -> int:
    """Fail every handle of ``parts``; how many messages they held."""
    count = 0
    for handle, size in parts:
        _fail_handle(handle, error, size)
        count += size
    return count


class SendReceipt:
    """What the broker confirmed for one :meth:`Producer.send_many`: its messages, stored in
    order on one partition, possibly over several entries (a run longer than a batch is split).

    Message ids are built when asked for: :meth:`message_ids` for all, or the first and last.
    """

    __slots__ = ("_count", "_partition", "_segments")

    def __init__(self, partition: int, segments: list[tuple[int, int, int, int, int]]) -> None:
        self._partition = partition
        self._segments = segments
        """``(ledger_id, entry_id, first_batch_index, count, batch_size)`` in send order."""
        self._count = sum(segment[3] for segment in segments)

    def __len__(self) -> int:
        return self._count

    @property
    def partition(self) -> int:
        """The partition index the messages went to (-1 for a non-partitioned topic)."""
        return self._partition

    def message_ids(self) -> list[MessageId]:
        """The id of every message, in the order they were given."""
        partition = self._partition
        return [
            MessageId(ledger_id, entry_id, index, partition, batch_size)
            for ledger_id, entry_id, first, count, batch_size in self._segments
            for index in range(first, first + count)
        ]

    def first_message_id(self) -> MessageId:
        ledger_id, entry_id, first, _count, batch_size = self._segments[0]
        return MessageId(ledger_id, entry_id, first, self._partition, batch_size)

    def last_message_id(self) -> MessageId:
        ledger_id, entry_id, first, count, batch_size = self._segments[-1]
        return MessageId(ledger_id, entry_id, first + count - 1, self._partition, batch_size)

    def __repr__(self) -> str:
        if not self._segments:
            return "SendReceipt(0 messages)"
        return (
            f"SendReceipt({self._count} messages, {self.first_message_id()} .."
            f" {self.last_message_id()})"
        )


class _ManySend:
    """The handle of one ``send_many``: completes once every message of it is confirmed, or
    fails with the first error any of its batches meets."""

    __slots__ = ("callback", "future", "partition", "remaining", "segments")

    def __init__(
        self,
        future: asyncio.Future[SendReceipt],
        callback: ManyCallback | None,
        count: int,
        partition: int,
    ) -> None:
        self.future = future
        self.callback = callback
        self.remaining = count
        self.partition = partition
        self.segments: list[tuple[int, int, int, int, int]] = []

    def confirmed(
        self, ledger_id: int, entry_id: int, first_index: int, count: int, batch_size: int
    ) -> None:
        self.segments.append((ledger_id, entry_id, first_index, count, batch_size))
        self.remaining -= count
        if self.remaining or self.future.done():
            return
        receipt = SendReceipt(self.partition, self.segments)
        if self.callback is not None:
            _run_callback(self.callback, None, receipt)
        self.future.set_result(receipt)

    def fail(self, error: MagnetarError, count: int = 0) -> None:
        del count  # the whole run fails with its first error
        if self.future.done():
            return
        if self.callback is not None:
            _run_callback(self.callback, error, None)
        self.future.set_exception(error)
        if self.callback is not None:
            self.future.exception()

    def part(self, offset: int) -> _ManySend:
        """The handle of the run's messages from ``offset`` on (one for all of them)."""
        del offset
        return self


class RunSink(Protocol):
    """What hears the outcome of a run of messages handed over with
    :meth:`Producer.try_add_run`, each message on its own (on the event loop): the messages
    ``offset .. offset + count - 1`` of the run were stored as ``first_index ..`` of entry
    ``(ledger_id, entry_id)`` (a batch of ``batch_size``) on ``partition`` (``where`` is
    those five, in that order), or failed."""

    def confirmed(self, offset: int, count: int, where: tuple[int, int, int, int, int]) -> None: ...

    def failed(self, offset: int, count: int, error: MagnetarError) -> None: ...


class _RunSend:
    """A run of messages whose outcomes go one by one to a :class:`RunSink` (the sync
    client's ``send_async`` calls, handed to the loop together)."""

    __slots__ = ("base", "partition", "sink")

    def __init__(self, sink: RunSink, base: int = 0) -> None:
        self.sink = sink
        self.base = base
        """Where these messages start in the run the sink knows (a run split in pieces)."""
        self.partition = -1

    def part(self, offset: int) -> _RunPart:
        return _RunPart(self, self.base + offset)

    def fail(self, error: MagnetarError, count: int) -> None:
        """The run failed before any of it was added to a batch."""
        _RunPart(self, self.base).fail(error, count)


class _RunPart:
    """The messages of a run that went into one batch, from ``offset`` on."""

    __slots__ = ("offset", "run")

    def __init__(self, run: _RunSend, offset: int) -> None:
        self.run = run
        self.offset = offset

    def confirmed(
        self, ledger_id: int, entry_id: int, first_index: int, count: int, batch_size: int
    ) -> None:
        run = self.run
        try:
            run.sink.confirmed(
                self.offset, count, (ledger_id, entry_id, first_index, batch_size, run.partition)
            )
        except Exception:  # the sink calls application callbacks: they must not break us
            log.exception("send_callback_failed")

    def fail(self, error: MagnetarError, count: int) -> None:
        try:
            self.run.sink.failed(self.offset, count, error)
        except Exception:
            log.exception("send_callback_failed")


class _Capacity:
    """The producer's bound on pending messages, shared by its partitions; waiters are FIFO
    (a waiter for many slots holds back those behind it until its slots are free)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: deque[tuple[asyncio.Future[None], int]] = deque()

    def has_room(self) -> bool:
        return self.used < self.limit and not self._waiters

    def try_acquire(self, count: int = 1) -> bool:
        if self.used + count <= self.limit and not self._waiters:
            self.used += count
            return True
        return False

    async def acquire(self, count: int = 1) -> None:
        """Wait for ``count`` slots (at most ``limit``: the caller checks)."""
        if self.try_acquire(count):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((waiter, count))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(count)  # the slots were handed over just as we were cancelled
            else:
                self._grant()  # it may have held back smaller waiters behind it
            raise

    def release(self, count: int) -> None:
        self.used -= count
        if self._waiters:
            self._grant()

    def _grant(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter, count = waiters[0]
            if waiter.done():  # cancelled
                waiters.popleft()
                continue
            if self.used + count > self.limit:
                break
            waiters.popleft()
            self.used += count  # the slots pass to the waiter
            waiter.set_result(None)

    def fail_waiters(self, error: MagnetarError) -> None:
        while self._waiters:
            waiter, _count = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)


@dataclass(slots=True, eq=False)
class _PendingBatch:
    request_id: int
    batch: SealedBatch[_Handle]
    deadline: float
    """Monotonic time after which its messages fail with a timeout."""
    done: bool = False

    def to_wire(self) -> broker_pb2.ProduceBatch:
        batch = self.batch
        return broker_pb2.ProduceBatch(
            request_id=self.request_id,
            sequence_id=batch.sequence_id,
            last_sequence_id=batch.last_sequence_id,
            num_messages=batch.num_messages,
            batch=batch.payload,
            compression=batch.compression,  # type: ignore[arg-type]
            uncompressed_size=batch.uncompressed_size,
            key_hashes=batch.key_hashes,
            deliver_at_ms=batch.deliver_at_ms,
        )


class _PartitionProducer(PartitionStream):
    """One partition's batches and its Produce stream, reconnected until closed or failed."""

    _role = "producer"
    _busy_error = ProducerBusyError
    _opened_kind = "opened"
    _open_request_name = "a producer open"
    _open_verb = "open the producer"
    _open_gerund = "opening it"

    def __init__(
        self,
        producer: Producer,
        *,
        partition_topic: str,
        partition: int,
        producer_name: str | None,
    ) -> None:
        super().__init__(
            partition_topic=partition_topic,
            partition=partition,
            client_config=producer.client_config,
            pool=producer.pool,
            log=log.bind(topic=partition_topic),
        )
        self._producer = producer
        self._config = producer.config
        self.producer_name = producer_name
        self._builder: BatchBuilder[_Handle] = BatchBuilder(
            max_messages=self._config.batching_max_messages,
            max_bytes=self._config.batching_max_bytes,
            compression=self._config.compression,
        )
        self._seal_timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._self_clocking = (
            self._config.batching_self_clocking and self._config.batching_max_publish_delay_ms > 0
        )
        self._small_request_id = 0
        """The request id of the last batch sealed before it was full: one is in flight while
        this id is pending (request ids start at 1)."""
        self._pending: dict[int, _PendingBatch] = {}
        """Sealed, not yet confirmed, in sequence order (request ids grow with it)."""
        self._unsent: deque[_PendingBatch] = deque()
        """Pending batches not yet written on the current stream."""
        self._control: deque[broker_pb2.ProduceRequest] = deque()
        """Answers to auth challenges, written before any batch."""
        self._wake_sender = asyncio.Event()
        self._drain_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._next_sequence_id = self._config.initial_sequence_id + 1
        self.max_message_bytes = _DEFAULT_MAX_MESSAGE_BYTES
        self.plain_limit = _DEFAULT_MAX_MESSAGE_BYTES - _ENVELOPE_ROOM_BYTES
        """The largest message (value plus overhead) send_async's short path takes."""
        self._expiry_task: asyncio.Task[None] | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> asyncio.Future[None]:
        """Start connecting; the future completes when the first open succeeded (or failed)."""
        opened = super().start()
        if self._config.send_timeout_ms > 0:
            self._expiry_task = asyncio.create_task(
                self._expire_loop(), name=f"producer-expiry:{self.partition_topic}"
            )
        return opened

    async def close(self, timeout_s: float) -> None:
        """Send what is batched, wait up to ``timeout_s`` for receipts, then close the stream."""
        self.seal()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), timeout_s)
        self._closing = True
        call = self._call
        if call is not None and self.connected:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    call.write(broker_pb2.ProduceRequest(close=broker_pb2.ProducerClose())), 1.0
                )
                await asyncio.wait_for(call.done_writing(), 1.0)
        await self._stop_tasks()
        self._fail_everything(
            ProducerClosedError(
                f"the producer on {self.partition_topic} was closed before the broker confirmed"
                " this message",
                context={"topic": self.partition_topic},
            )
        )

    async def _stop_tasks(self) -> None:
        tasks = [t for t in (self._run_task, self._expiry_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._seal_timer is not None:
            self._seal_timer.cancel()
            self._seal_timer = None

    def _on_failed(self, error: MagnetarError) -> None:
        # the partition takes no more messages (error is set) and fails what it holds
        self._fail_everything(error)

    def _fail_everything(self, error: MagnetarError) -> None:
        if self._seal_timer is not None:
            self._seal_timer.cancel()
            self._seal_timer = None
        parts: list[tuple[_Handle, int]] = []
        for op in self._pending.values():
            op.done = True
            parts.extend(op.batch.parts)
        parts.extend(self._builder.take_parts())
        self._pending.clear()
        self._unsent.clear()
        self._producer.capacity.release(_fail_parts(parts, error))
        self._check_drained()

    # --- messages --------------------------------------------------------------------------

    def add(
        self,
        content: bytes,
        handle: _Handle,
        *,
        partition_key: str | None,
        properties: Mapping[str, str] | None,
        event_time_ms: int,
        size: int,
        deliver_at_ms: int,
    ) -> None:
        builder = self._builder
        if not builder.has_room_for(size):
            self.seal(full=True)
        elif len(builder) and builder.deliver_at_ms != deliver_at_ms:
            self.seal()  # a batch has one delivery time
        builder.add(
            content,
            handle,
            partition_key=partition_key,
            properties=properties,
            event_time_ms=event_time_ms,
            size=size,
            now=time.monotonic(),
            deliver_at_ms=deliver_at_ms,
        )
        if builder.is_full():
            self.seal(full=True)
        elif len(builder) == 1:
            self._arm_seal_timer()

    def add_plain(self, content: bytes, handle: _Handle, size: int) -> None:
        """:meth:`add` of a message with nothing but its value (the per-message fast path)."""
        builder = self._builder
        count = builder._count
        if count:
            full = count >= builder.max_messages or builder._bytes + size > builder.max_bytes
            if full or builder._deliver_at_ms:
                self.seal(full)
                count = 0
        builder.add_plain(content, handle, size)
        if count + 1 >= builder.max_messages or builder._bytes >= builder.max_bytes:
            self.seal(full=True)
        elif not count:
            self._arm_seal_timer()

    def add_many(
        self,
        contents: Sequence[bytes],
        handle: _ManySend | _RunSend,
        *,
        partition_key: str | None,
        properties: Mapping[str, str] | None,
        event_time_ms: int,
        extras: bytes,
        overhead: int,
        deliver_at_ms: int,
    ) -> None:
        """Add a run of messages sharing their fields: into the open batch while it has room,
        then into as many new batches as they need (a batch is sealed when full)."""
        builder = self._builder
        if len(builder) and builder.deliver_at_ms != deliver_at_ms:
            self.seal()
        start, total = 0, len(contents)
        now = time.monotonic()
        while start < total:
            was_empty = not len(builder)
            taken = builder.add_many(
                contents,
                start,
                handle.part(start),
                partition_key=partition_key,
                properties=properties,
                event_time_ms=event_time_ms,
                extras=extras,
                overhead=overhead,
                now=now,
                deliver_at_ms=deliver_at_ms,
            )
            start += taken
            if start < total or builder.is_full():
                self.seal(full=True)
            elif was_empty:
                self._arm_seal_timer()

    def _arm_seal_timer(self) -> None:
        """Schedule the sealing of the batch its first message just opened: once the current
        loop iteration has added what it will (no delay, or self-clocking with no small batch
        in flight), else ``batching_max_publish_delay_ms`` from now at the latest."""
        loop = asyncio.get_running_loop()
        delay_s = self._config.batching_max_publish_delay_ms / 1000
        if delay_s > 0 and not (
            self._self_clocking and self._small_request_id not in self._pending
        ):
            self._seal_timer = loop.call_later(delay_s, self.seal)
        else:
            self._seal_timer = loop.call_soon(self.seal)

    def _clock_out(self) -> None:
        """Self-clocking: the small batch in flight is confirmed (or failed), so the batch
        gathering behind it goes once the current loop iteration has added what it will (the
        senders its receipts woke may add more first)."""
        if not self._self_clocking or self._small_request_id in self._pending:
            return
        if not len(self._builder):
            return
        timer = self._seal_timer
        if timer is not None:
            if not isinstance(timer, asyncio.TimerHandle):
                return  # a call_soon seal is already due
            timer.cancel()
        self._seal_timer = asyncio.get_running_loop().call_soon(self.seal)

    def seal(self, full: bool = False) -> None:
        """Close the current batch and queue it for the stream; ``full``: it was sealed because
        it had no room left (not small, for self-clocking)."""
        if self._seal_timer is not None:
            self._seal_timer.cancel()
            self._seal_timer = None
        if not len(self._builder):
            return
        batch = self._builder.seal(self._next_sequence_id)
        self._next_sequence_id = batch.last_sequence_id + 1
        timeout_ms = self._config.send_timeout_ms
        deadline = batch.first_added_at + timeout_ms / 1000 if timeout_ms > 0 else math.inf
        op = _PendingBatch(next(self._producer.request_ids), batch, deadline)
        self._pending[op.request_id] = op
        if not full:
            self._small_request_id = op.request_id
        if self.connected:
            self._unsent.append(op)
            self._wake_sender.set()
        self._producer.batch_sealed(self.partition)

    async def flush(self) -> None:
        """Wait until every message sent so far is confirmed or failed."""
        self.seal()
        if not self._pending:
            return
        last_request_id = next(reversed(self._pending))
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append((last_request_id, waiter))
        await waiter

    def _check_drained(self) -> None:
        if not self._drain_waiters:
            return
        oldest = next(iter(self._pending), None)
        still: list[tuple[int, asyncio.Future[None]]] = []
        for request_id, waiter in self._drain_waiters:
            if oldest is None or oldest > request_id:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                still.append((request_id, waiter))
        self._drain_waiters = still

    @property
    def pending_messages(self) -> int:
        return len(self._builder) + sum(op.batch.num_messages for op in self._pending.values())

    # --- the connection -------------------------------------------------------------------

    def _reconnect_context(self) -> dict[str, object]:
        return {"pending_batches": len(self._pending)}

    def _open_call(
        self,
        stub: broker_pb2_grpc.BrokerServiceAsyncStub,
        metadata: tuple[tuple[str, str], ...] | None,
    ) -> Any:
        return stub.Produce(metadata=metadata)

    def _send_control(self, token: str) -> None:
        if self.connected:
            self._control.append(
                broker_pb2.ProduceRequest(auth=broker_pb2.AuthResponse(token=token))
            )
            self._wake_sender.set()

    def _open_request(self) -> broker_pb2.ProduceRequest:
        return broker_pb2.ProduceRequest(
            open=broker_pb2.ProducerOpen(
                topic=self.partition_topic,
                producer_name=self.producer_name or "",
                properties=self._config.properties,
            )
        )

    def _on_opened(self, reply: broker_pb2.ProduceResponse, owner: PartitionOwner) -> None:
        opened = reply.opened
        self.producer_name = opened.producer_name or self.producer_name
        if opened.max_message_bytes:
            self.max_message_bytes = opened.max_message_bytes
            self.plain_limit = opened.max_message_bytes - _ENVELOPE_ROOM_BYTES
        self._builder.max_bytes = max(
            1,
            min(self._config.batching_max_bytes, self.max_message_bytes - _ENVELOPE_ROOM_BYTES),
        )
        if opened.max_messages_per_batch:
            # a broker refuses a batch of more messages than it says
            self._builder.max_messages = min(
                self._config.batching_max_messages, opened.max_messages_per_batch
            )
        resent = len(self._pending)
        if not self._ever_opened:
            # a producer name used before (a restarted application) continues its sequence
            self._next_sequence_id = max(self._next_sequence_id, opened.last_sequence_id + 1)
        self._mark_opened()
        self.broker = owner.address
        self._unsent = deque(self._pending.values())
        self.connected = True
        self._wake_sender.set()
        self._log.info(
            "producer_connected",
            broker=owner.address,
            producer_name=self.producer_name,
            last_sequence_id=opened.last_sequence_id,
            resending_batches=resent,
        )

    def _on_disconnected(self) -> None:
        self.connected = False
        self._unsent.clear()
        self._control.clear()

    async def _write(self, call: Any) -> NoReturn:
        limit = self._config.max_request_bytes
        unsent = self._unsent
        control = self._control
        while True:
            await self._wake_sender.wait()
            self._wake_sender.clear()
            while control:
                await call.write(control.popleft())
            while unsent:
                batches: list[broker_pb2.ProduceBatch] = []
                size = 0
                while unsent:
                    op = unsent[0]
                    if op.done:
                        unsent.popleft()
                        continue
                    if batches and size + len(op.batch.payload) > limit:
                        break
                    unsent.popleft()
                    batches.append(op.to_wire())
                    size += len(op.batch.payload)
                if batches:
                    await call.write(
                        broker_pb2.ProduceRequest(send=broker_pb2.ProduceSend(batches=batches))
                    )

    @property
    def last_sequence_id(self) -> int:
        """The highest sequence id given out here, or stored under this name at opening."""
        return self._next_sequence_id - 1

    def _on_response(
        self, kind: str | None, response: broker_pb2.ProduceResponse
    ) -> MagnetarError | None:
        if kind == "receipts":
            self._on_receipts(response.receipts.receipts)
        elif kind == "error":
            return self._on_produce_error(response.error)
        elif kind == "stalled":
            self._on_stalled(response.stalled)
        return None

    def _on_stalled(self, stalled: broker_pb2.ProduceStalled) -> None:
        """The broker cannot store this partition's entries now (or can again). Nothing is
        failed: the batches stay queued; a send that times out names this problem."""
        if stalled.HasField("problem"):
            self.last_error = error_from_detail(stalled.problem)
            self._log.warning("producer_partition_stalled", problem=self.last_error.message)
        else:
            self._log.info("producer_partition_writing_again")

    def _on_receipts(self, receipts: Any) -> None:
        confirmed = 0
        partition = self.partition
        for receipt in receipts:
            op = self._pending.pop(receipt.request_id, None)
            if op is None:
                continue  # timed out already, or a late receipt of a previous stream
            op.done = True
            ledger_id = receipt.message_id.ledger_id
            entry_id = receipt.message_id.entry_id
            batch = op.batch
            size = batch.num_messages
            index = 0
            for handle, count in batch.parts:
                if not isinstance(handle, tuple):
                    handle.confirmed(ledger_id, entry_id, index, count, size)
                else:
                    # a send_async: the per-message path, kept to what it must do
                    future, callback = handle
                    message_id = _new_message_id(
                        MessageId, (ledger_id, entry_id, index, partition, size)
                    )
                    if callback is not None:
                        try:
                            callback(None, message_id)
                        except Exception:  # an application callback must not break the producer
                            log.exception("send_callback_failed")
                    if not future.done():
                        future.set_result(message_id)
                index += count
            confirmed += size
        if confirmed:
            self._producer.capacity.release(confirmed)
            self._check_drained()
            self._clock_out()

    def _on_produce_error(self, wire: broker_pb2.ProduceError) -> MagnetarError | None:
        """A batch was refused. A final error fails its messages and the stream goes on; a
        retriable one ends this stream so that the batch is resent in order after reconnecting."""
        op = self._pending.get(wire.request_id)
        if op is None:
            return None
        error = error_from_detail(wire.error)
        if is_transient(error):
            return error
        del self._pending[wire.request_id]
        op.done = True
        self._producer.capacity.release(_fail_parts(list(op.batch.parts), error))
        self._check_drained()
        self._clock_out()
        return None

    async def _expire_loop(self) -> None:
        timeout_s = self._config.send_timeout_ms / 1000
        period_s = min(0.1, timeout_s / 4)
        while True:
            await asyncio.sleep(period_s)
            now = time.monotonic()
            expired: list[_PendingBatch] = []
            for op in self._pending.values():
                if op.deadline > now:
                    break  # batches are sealed in order, so deadlines only grow
                expired.append(op)
            if not expired:
                continue
            state = f"connected to {self.broker}" if self.connected else "not connected"
            error = OperationTimeoutError(
                f"not confirmed within send_timeout_ms={self._config.send_timeout_ms} on"
                f" {self.partition_topic} ({state}; last problem: {self.last_error})",
                context={"topic": self.partition_topic, "timeout_ms": self._config.send_timeout_ms},
            )
            failed = 0
            for op in expired:
                del self._pending[op.request_id]
                op.done = True
                failed += _fail_parts(list(op.batch.parts), error)
            self._log.warning("producer_send_timeout", messages=failed)
            self._producer.capacity.release(failed)
            self._check_drained()
            self._clock_out()


class Producer:
    """Publishes to one topic (all its partitions). Create it with ``client.create_producer``."""

    def __init__(
        self,
        *,
        topic: TopicName,
        config: ProducerConfig,
        client_config: ClientConfig,
        pool: ConnectionPool,
        on_close: Callable[[Producer], None] | None = None,
    ) -> None:
        self._topic = topic
        self.config = config
        self.client_config = client_config
        self.pool = pool
        self.capacity = _Capacity(config.max_pending_messages)
        self.request_ids = itertools.count(1)
        self._partitions: list[_PartitionProducer] = []
        self._router = PartitionRouter(1)
        self._closed = False
        self._on_close = on_close
        self._loop = asyncio.get_running_loop()

    # --- creation ----------------------------------------------------------------------------

    async def _start(self) -> None:
        timeout_s = self.client_config.operation_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        targets = await self.pool.partitions_of(self._topic, timeout_s)
        try:
            await asyncio.wait_for(self._open_partitions(targets), deadline - loop.time())
        except TimeoutError:
            last = next((p.last_error for p in self._partitions if p.last_error), None)
            await self._abandon()
            raise OperationTimeoutError(
                f"could not open a producer on {self._topic} within {timeout_s} s"
                f" (last problem: {last})",
                context={"topic": str(self._topic)},
            ) from None
        except BaseException:
            await self._abandon()
            raise

    async def _open_partitions(self, targets: list[tuple[str, int]]) -> None:
        self._router = PartitionRouter(len(targets))
        self._partitions = [
            _PartitionProducer(
                self,
                partition_topic=partition_topic,
                partition=partition,
                producer_name=self.config.producer_name,
            )
            for partition_topic, partition in targets
        ]
        first, *rest = self._partitions
        await first.start()
        # every partition uses the name the broker gave the first one (dedup is by name)
        for partition_producer in rest:
            partition_producer.producer_name = first.producer_name
        await asyncio.gather(*(p.start() for p in rest))

    async def _abandon(self) -> None:
        self._closed = True
        await asyncio.gather(*(p.close(0) for p in self._partitions), return_exceptions=True)

    # --- what users call ---------------------------------------------------------------------

    def topic(self) -> str:
        return self._topic.full

    def producer_name(self) -> str:
        """The name the producer publishes under (given, or assigned by the broker)."""
        return next((p.producer_name for p in self._partitions if p.producer_name), None) or ""

    @property
    def last_sequence_id(self) -> int:
        """The highest sequence id this producer has given out, or that the broker had stored
        under its name when it opened (the highest over partitions); ``initial_sequence_id``
        (default -1) if neither."""
        return max(p.last_sequence_id for p in self._partitions)

    def is_connected(self) -> bool:
        return not self._closed and all(p.connected for p in self._partitions)

    def pending_messages(self) -> int:
        """Messages sent and not yet confirmed or failed."""
        return self.capacity.used

    def has_room(self) -> bool:
        """Whether :meth:`send_async` would take a message now (the pending queue is not full
        and no ``send`` waits for room)."""
        capacity = self.capacity
        return capacity.used < capacity.limit and not capacity._waiters

    def send_async(
        self,
        content: bytes,
        callback: SendCallback | None = None,
        **fields: Unpack[SendFields],
    ) -> asyncio.Future[MessageId]:
        """Queue a message; the future gives its id once the broker stored it durably.

        Never waits: when ``max_pending_messages`` are pending the future fails with
        :class:`ProducerQueueFullError` (``send`` waits for room instead). ``callback(error,
        message_id)`` is called too, when given. The keyword arguments are
        :class:`~magnetar.aio.send_options.SendFields`: ``properties``, ``partition_key``,
        ``event_timestamp``, ``deliver_after_ms``, ``deliver_at_ms`` (see :meth:`send`).
        """
        if not fields and type(content) is bytes and not self._closed:
            # the common case, kept short: no options, bytes, room
            capacity = self.capacity
            if capacity.used < capacity.limit and not capacity._waiters:
                partition = self._partitions[self._router.keyless]
                size = len(content) + _PLAIN_OVERHEAD
                if partition.error is None and size <= partition.plain_limit:
                    capacity.used += 1
                    future: asyncio.Future[MessageId] = _Future(loop=self._loop)
                    partition.add_plain(content, (future, callback), size)
                    return future
        options, error = self._options(fields)
        if error is None and not self.capacity.try_acquire():
            error = self._queue_full()
        return self._queue(error, content, callback, options)

    async def send_async_when_room(
        self,
        content: bytes,
        callback: SendCallback | None = None,
        **fields: Unpack[SendFields],
    ) -> asyncio.Future[MessageId]:
        """:meth:`send_async` that first waits for room in the pending queue when
        ``block_if_queue_full`` is on. A delay (``deliver_after_ms``) counts from the call, not
        from when room was found."""
        if not self.config.block_if_queue_full:
            return self.send_async(content, callback, **fields)
        options, error = self._options(fields)
        if error is None:
            await self.capacity.acquire()
            error = self._unusable()
            if error is not None:
                self.capacity.release(1)
        return self._queue(error, content, callback, options)

    async def send(self, content: bytes, **fields: Unpack[SendFields]) -> MessageId:
        """Publish a message and wait until the broker stored it durably; its id.

        Waits for room while ``max_pending_messages`` are pending (back-pressure).

        Keyword arguments: ``properties`` (str -> str), ``partition_key`` (routing, and order per
        key on key_shared subscriptions), ``event_timestamp`` (ms since the epoch), and delayed
        delivery: ``deliver_after_ms`` (from now, by this process's wall clock) or
        ``deliver_at_ms`` (ms since the epoch), not both; the broker holds the message until then
        on shared and key_shared subscriptions (exclusive and failover ones get it at once). 0 or
        None: at once.
        """
        queued = await self.send_async_when_room(content, None, **fields)
        return await queued

    def send_many_async(
        self,
        contents: Sequence[bytes],
        callback: ManyCallback | None = None,
        **fields: Unpack[SendFields],
    ) -> asyncio.Future[SendReceipt]:
        """Queue a run of messages that share key, properties, event time and delivery time;
        one future for the whole run, giving a :class:`SendReceipt` once every message of it is
        stored durably.

        The fast way to publish many messages: no future, callback or message id per message
        (build the ids from the receipt when needed). The run goes to one partition, in order,
        packed into as few batches as the batching limits allow. Never waits: fails at once with
        :class:`ProducerQueueFullError` unless ``max_pending_messages`` has room for the whole
        run. If a batch of the run fails, the future fails with that error; the run's other
        batches still go their way (with deduplication on, sending the run again is safe).
        """
        messages, options, error = self._check_many(contents, fields)
        if error is None and not self.capacity.try_acquire(len(messages)):
            error = self._queue_full()
        return self._queue_many(error, messages, callback, options)

    async def send_many(
        self, contents: Sequence[bytes], **fields: Unpack[SendFields]
    ) -> SendReceipt:
        """:meth:`send_many_async`, waiting for room for the run when ``block_if_queue_full``
        is on (as :meth:`send` does for one message), then for its receipt."""
        return await (await self.send_many_async_when_room(contents, None, **fields))

    async def send_many_async_when_room(
        self,
        contents: Sequence[bytes],
        callback: ManyCallback | None = None,
        **fields: Unpack[SendFields],
    ) -> asyncio.Future[SendReceipt]:
        """:meth:`send_many_async` that first waits for room for the whole run when
        ``block_if_queue_full`` is on."""
        if not self.config.block_if_queue_full:
            return self.send_many_async(contents, callback, **fields)
        messages, options, error = self._check_many(contents, fields)
        if error is None:
            await self.capacity.acquire(len(messages))
            error = self._unusable()
            if error is not None:
                self.capacity.release(len(messages))
        return self._queue_many(error, messages, callback, options)

    def try_add_run(self, contents: Sequence[bytes], options: SendOptions, sink: RunSink) -> bool:
        """Add a run of messages sharing ``options`` (checked already), each told its outcome
        through ``sink``, if the pending queue has room for all of them now; False (and nothing
        done) if not. No future or callback per message: this is how the sync client hands a
        run of ``send_async`` calls to the loop in one go."""
        count = len(contents)
        error = self._unusable()
        if error is None and not self.capacity.try_acquire(count):
            if count <= self.config.max_pending_messages and self.config.block_if_queue_full:
                return False
            error = self._queue_full()
        run = _RunSend(sink)
        if error is not None:
            run.fail(error, count)
        else:
            self._add_many(contents, run, options)
        return True

    async def add_run_when_room(
        self, contents: Sequence[bytes], options: SendOptions, sink: RunSink
    ) -> None:
        """:meth:`try_add_run`, waiting for room for the run first (``block_if_queue_full``)."""
        count = len(contents)
        run = _RunSend(sink)
        error = self._unusable()
        if error is None and count > self.config.max_pending_messages:
            error = self._queue_full()
        if error is None:
            await self.capacity.acquire(count)
            error = self._unusable()
            if error is not None:
                self.capacity.release(count)
        if error is not None:
            run.fail(error, count)
        else:
            self._add_many(contents, run, options)

    def _options(self, fields: SendFields) -> tuple[SendOptions, MagnetarError | None]:
        """The checked options of a send call, or why it cannot be sent now."""
        error = self._unusable()
        if error is not None:
            return NO_OPTIONS, error
        try:
            return send_options(fields), None
        except MagnetarError as e:
            return NO_OPTIONS, e

    def _check_many(
        self, contents: Sequence[bytes], fields: SendFields
    ) -> tuple[Sequence[bytes], SendOptions, MagnetarError | None]:
        """A run's messages as bytes, its options, and why it cannot be sent (or None)."""
        messages, error = _many_contents(contents, self.config.max_pending_messages)
        options = NO_OPTIONS
        if error is None:
            options, error = self._options(fields)
        return messages, options, error

    def _queue(
        self,
        error: MagnetarError | None,
        content: bytes,
        callback: SendCallback | None,
        options: SendOptions,
    ) -> asyncio.Future[MessageId]:
        """A message's future: failed with ``error``, or the message added (its pending slot
        already taken)."""
        future: asyncio.Future[MessageId] = _Future(loop=self._loop)
        handle: _Handle = (future, callback)
        if error is not None:
            _fail_handle(handle, error)
        else:
            self._add(content, handle, options)
        return future

    def _queue_many(
        self,
        error: MagnetarError | None,
        contents: Sequence[bytes],
        callback: ManyCallback | None,
        options: SendOptions,
    ) -> asyncio.Future[SendReceipt]:
        future: asyncio.Future[SendReceipt] = asyncio.get_running_loop().create_future()
        handle = _ManySend(future, callback, len(contents), -1)
        if error is not None:
            handle.fail(error)
        else:
            self._add_many(contents, handle, options)
        return future

    async def flush(self) -> None:
        """Send every batched message now and wait until all sent so far are confirmed or
        failed (their own futures carry any error)."""
        await asyncio.gather(*(p.flush() for p in self._partitions))

    async def close(self) -> None:
        """Flush (waiting at most ``send_timeout_ms``, or the operation timeout when sends
        never time out), then close every partition's stream. Idempotent."""
        send_timeout_s = self.config.send_timeout_ms / 1000
        await self._close(send_timeout_s or self.client_config.operation_timeout_s)

    async def _close(self, timeout_s: float) -> None:
        """:meth:`close`, waiting at most ``timeout_s`` for what is pending (a consumer's
        dead-letter producer closes within the consumer's own close timeout)."""
        if self._closed:
            return
        self._closed = True
        if self._on_close is not None:
            self._on_close(self)
        await asyncio.gather(*(p.close(timeout_s) for p in self._partitions))
        self.capacity.fail_waiters(ProducerClosedError(f"the producer on {self._topic} was closed"))
        log.info("producer_closed", topic=self._topic.full, producer_name=self.producer_name())

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- internals -------------------------------------------------------------------------

    def batch_sealed(self, partition: int) -> None:
        self._router.batch_sealed(max(partition, 0))

    def _queue_full(self) -> ProducerQueueFullError:
        return ProducerQueueFullError(
            f"{self.config.max_pending_messages} messages are pending on {self._topic}"
            " (max_pending_messages): wait for their receipts, raise the limit, or set"
            " block_if_queue_full=True to make send() wait for room",
            context={"max_pending_messages": self.config.max_pending_messages},
        )

    def _unusable(self) -> MagnetarError | None:
        if self._closed:
            return ProducerClosedError(
                f"the producer on {self._topic} is closed", context={"topic": str(self._topic)}
            )
        return None

    def _add(self, content: bytes, handle: _Handle, options: SendOptions) -> None:
        given: object = content
        if not isinstance(given, bytes):
            if not isinstance(given, bytearray | memoryview):
                self.capacity.release(1)
                _fail_handle(
                    handle,
                    InvalidArgumentError(
                        f"message content must be bytes, got {type(given).__name__}"
                    ),
                )
                return
            content = bytes(given)
        partition_key = options.partition_key
        properties = options.properties
        partition = self._partitions[self._router.partition_for(partition_key)]
        error = partition.error
        size = message_size(content, partition_key, properties)
        if error is None and size > partition.max_message_bytes - _ENVELOPE_ROOM_BYTES:
            error = MessageTooLargeError(
                f"a message of about {size} bytes is over the broker's limit of"
                f" {partition.max_message_bytes} bytes per entry on {partition.partition_topic}",
                context={"size": size, "max_message_bytes": partition.max_message_bytes},
            )
        if error is not None:
            self.capacity.release(1)
            _fail_handle(handle, error)
            return
        partition.add(
            content,
            handle,
            partition_key=partition_key,
            properties=properties,
            event_time_ms=options.event_timestamp or 0,
            size=size,
            deliver_at_ms=options.deliver_at_ms,
        )

    def _add_run_in_pieces(
        self, contents: Sequence[bytes], run: _RunSend, options: SendOptions, max_bytes: int
    ) -> None:
        """Add a run some of whose messages are over the broker's limit: each of those fails
        alone, the others go in order as shorter runs."""
        overhead = message_size(b"", options.partition_key, options.properties)
        start = 0
        for index in range(len(contents) + 1):
            if index < len(contents) and _fits(contents[index], overhead, max_bytes):
                continue
            if start < index:
                self._add_many(contents[start:index], _RunSend(run.sink, run.base + start), options)
            if index < len(contents):
                size = len(contents[index]) + overhead
                self.capacity.release(1)
                _RunSend(run.sink, run.base + index).fail(
                    MessageTooLargeError(
                        f"a message of about {size} bytes is over the broker's limit of"
                        f" {max_bytes} bytes per entry on {self._topic}",
                        context={"size": size, "max_message_bytes": max_bytes},
                    ),
                    1,
                )
            start = index + 1

    def _add_many(
        self, contents: Sequence[bytes], handle: _ManySend | _RunSend, options: SendOptions
    ) -> None:
        count = len(contents)
        partition_key = options.partition_key
        properties = options.properties
        partition = self._partitions[self._router.partition_for(partition_key)]
        handle.partition = partition.partition
        error = partition.error
        overhead = message_size(b"", partition_key, properties)
        largest = max(map(len, contents)) + overhead
        if error is None and largest > partition.max_message_bytes - _ENVELOPE_ROOM_BYTES:
            error = MessageTooLargeError(
                f"a message of about {largest} bytes is over the broker's limit of"
                f" {partition.max_message_bytes} bytes per entry on {partition.partition_topic}",
                context={"size": largest, "max_message_bytes": partition.max_message_bytes},
            )
        if isinstance(error, MessageTooLargeError) and isinstance(handle, _RunSend):
            # separate send_async calls: only the messages that are too large fail
            self._add_run_in_pieces(contents, handle, options, partition.max_message_bytes)
            return
        if error is not None:
            self.capacity.release(count)
            handle.fail(error, count)
            return
        event_time_ms = options.event_timestamp or 0
        partition.add_many(
            contents,
            handle,
            partition_key=partition_key,
            properties=properties,
            event_time_ms=event_time_ms,
            extras=encode_extras(partition_key, properties, event_time_ms),
            overhead=overhead,
            deliver_at_ms=options.deliver_at_ms,
        )


def _fits(content: bytes, overhead: int, max_message_bytes: int) -> bool:
    return len(content) + overhead <= max_message_bytes - _ENVELOPE_ROOM_BYTES


def _many_contents(contents: object, limit: int) -> tuple[Sequence[bytes], MagnetarError | None]:
    """``send_many``'s messages as a sequence of bytes, or why they cannot be sent."""
    if isinstance(contents, bytes | bytearray | memoryview | str) or not isinstance(
        contents, Sequence
    ):
        return (), InvalidArgumentError(
            f"send_many takes a sequence of messages (bytes), got {type(contents).__name__}"
        )
    if not contents:
        return (), InvalidArgumentError("send_many needs at least one message")
    if len(contents) > limit:
        return (), InvalidArgumentError(
            f"send_many got {len(contents)} messages, more than max_pending_messages={limit}"
            " can hold: send them in smaller runs",
            context={"messages": len(contents), "max_pending_messages": limit},
        )
    if all(type(c) is bytes for c in contents):
        return contents, None
    converted: list[bytes] = []
    for index, content in enumerate(contents):
        if isinstance(content, bytes | bytearray | memoryview):
            converted.append(bytes(content))
        else:
            return (), InvalidArgumentError(
                f"message content must be bytes, got {type(content).__name__} at index {index}"
            )
    return converted, None
