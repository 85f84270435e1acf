"""The synchronous client: ``magnetar.Client``, a thin facade over :mod:`magnetar.aio`.

::

    import magnetar

    with magnetar.Client("magnetar://localhost:6650") as client:
        producer = client.create_producer("my-topic")
        producer.send(b"hello", partition_key="k1")

        consumer = client.subscribe("my-topic", "my-sub", initial_position="earliest")
        msg = consumer.receive(timeout_millis=5000)
        consumer.acknowledge(msg)

There is one implementation: each sync client runs a private asyncio event loop in a daemon
thread (the client's thread), and the sync objects drive the asyncio ones there. Settings,
errors, messages and message ids are the asyncio client's. Sync objects are safe to use from
several threads.

Per-message calls do not cross to the client's thread one by one (a crossing costs tens of
microseconds):

- ``send_async`` (and ``send``) hand messages over in runs: the call appends the message under
  a lock and wakes the client's thread only when no wake-up is pending, and the loop adds the
  whole run to a batch at once. The pending queue (``max_pending_messages``) is counted here,
  in the caller: a producer that outruns the broker waits in ``send_async`` (or fails the
  message with :class:`ProducerQueueFullError` when ``block_if_queue_full`` is off).
- ``receive`` takes from a queue the calling thread reads directly; the permits of what was
  taken go back to the broker in groups.
- ``acknowledge``, ``acknowledge_cumulative`` and ``negative_acknowledge`` return at once:
  acks are grouped (``ack_group_time_ms``, ``ack_group_max_ids``) as the asyncio client groups
  them, so a crash before the group is flushed redelivers those messages (at-least-once; an
  ack the broker applied is never undone). With ``ack_receipts=True`` each acknowledgement
  waits until the broker confirmed it instead.

``send_async`` callbacks, a consumer's ``on_active_change`` and done-callbacks of send futures
run on the client's thread: they must return quickly, and a blocking call of the same client
made there raises RuntimeError instead of waiting for ever. ``message_listener`` and
``reader_listener`` run on a thread of their own per consumer or reader, where blocking is
allowed (it holds up that consumer only).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar, Unpack

from magnetar.aio import admin as aio_admin
from magnetar.aio import client as aio_client
from magnetar.aio import consumer as aio_consumer
from magnetar.aio import producer as aio_producer
from magnetar.aio import reader as aio_reader
from magnetar.aio.acks import Entry
from magnetar.aio.config import ClientConfig, ConsumerConfig, ProducerConfig
from magnetar.aio.handoff import (
    Handoff,
    SendFuture,
    ThreadReceiveQueue,
    mark_client_thread,
    refuse_wait_in_client_thread,
)
from magnetar.aio.message import Message
from magnetar.aio.message_id import MessageId, make_message_id
from magnetar.aio.producer import ManyCallback, SendCallback, SendReceipt
from magnetar.aio.send_options import NO_OPTIONS, SendFields, SendOptions, send_options
from magnetar.common.errors import (
    ClientClosedError,
    ConsumerClosedError,
    InvalidArgumentError,
    MagnetarError,
    ProducerClosedError,
)
from magnetar.common.log import get_library_logger

__all__ = ["AdminClient", "Client", "Consumer", "Producer", "Reader", "SendFuture"]

log = get_library_logger("magnetar.client", component="client")

T = TypeVar("T")


class _LoopThread:
    """A private event loop running in a daemon thread; runs coroutines for callers."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.closed = False
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()

    def _main(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        mark_client_thread()
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self.closed:
            coro.close()
            raise ClientClosedError("the client was closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (its exception is raised here)."""
        if threading.current_thread() is self._thread:
            coro.close()
            refuse_wait_in_client_thread("a blocking magnetar call")
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # Ctrl-C while waiting: do not leave the operation running
            raise

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the loop soon, without waiting for it."""
        if self.closed:
            raise ClientClosedError("the client was closed")
        try:
            self.loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop closed under us
            raise ClientClosedError("the client was closed") from None

    def stop(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)


# --- producer ----------------------------------------------------------------------------------


class _Run:
    """Consecutive ``send_async`` calls with the same options, handed to the loop together: the
    producer's :class:`~magnetar.aio.producer.RunSink` for them."""

    __slots__ = ("contents", "futures", "options", "producer")

    def __init__(self, producer: Producer, options: SendOptions) -> None:
        self.producer = producer
        self.options = options
        self.contents: list[bytes] = []
        self.futures: list[SendFuture] = []

    def add_to(self, aio: aio_producer.Producer) -> bool:
        return aio.try_add_run(self.contents, self.options, self)

    async def add_when_room(self, aio: aio_producer.Producer) -> None:
        await aio.add_run_when_room(self.contents, self.options, self)

    def confirmed(self, offset: int, count: int, where: tuple[int, int, int, int, int]) -> None:
        ledger_id, entry_id, first_index, batch_size, partition = where
        futures = self.futures
        shift = first_index - offset
        try:
            for index in range(offset, offset + count):
                futures[index].confirmed(
                    make_message_id((ledger_id, entry_id, index + shift, partition, batch_size))
                )
        finally:
            self.producer._settled(count)

    def failed(self, offset: int, count: int, error: MagnetarError) -> None:
        try:
            for future in self.futures[offset : offset + count]:
                future.failed(error)
        finally:
            self.producer._settled(count)


class _ManyRun:
    """One ``send_many``: a run whose outcome is a single :class:`SendReceipt`."""

    __slots__ = (
        "callback",
        "contents",
        "future",
        "options",
        "partition",
        "producer",
        "remaining",
        "segments",
    )

    def __init__(
        self,
        producer: Producer,
        contents: Sequence[bytes],
        options: SendOptions,
        callback: ManyCallback | None,
    ) -> None:
        self.producer = producer
        self.contents = contents
        self.options = options
        self.callback = callback
        self.future: concurrent.futures.Future[SendReceipt] = concurrent.futures.Future()
        self.remaining = len(contents)
        self.partition = -1
        self.segments: list[tuple[int, int, int, int, int]] = []

    def add_to(self, aio: aio_producer.Producer) -> bool:
        return aio.try_add_run(self.contents, self.options, self)

    async def add_when_room(self, aio: aio_producer.Producer) -> None:
        await aio.add_run_when_room(self.contents, self.options, self)

    def confirmed(self, offset: int, count: int, where: tuple[int, int, int, int, int]) -> None:
        del offset  # the receipt lists segments in the order they are confirmed: send order
        ledger_id, entry_id, first_index, batch_size, partition = where
        self.partition = partition
        self.segments.append((ledger_id, entry_id, first_index, count, batch_size))
        self.remaining -= count
        try:
            if not self.remaining and not self.future.done():
                receipt = SendReceipt(partition, self.segments)
                if self.callback is not None:
                    _call_send_callback(self.callback, None, receipt)
                self.future.set_result(receipt)
        finally:
            self.producer._settled(count)

    def failed(self, offset: int, count: int, error: MagnetarError) -> None:
        del offset
        try:
            if not self.future.done():
                if self.callback is not None:
                    _call_send_callback(self.callback, error, None)
                self.future.set_exception(error)
        finally:
            self.producer._settled(count)


def _call_send_callback(callback: Callable[..., object], *args: object) -> None:
    try:
        callback(*args)
    except Exception:  # an application callback must not break the producer
        log.exception("send_callback_failed")


def _content(content: object) -> bytes:
    if type(content) is bytes:
        return content
    if isinstance(content, bytearray | memoryview):
        return bytes(content)
    raise InvalidArgumentError(f"message content must be bytes, got {type(content).__name__}")


class Producer:
    """Publishes to one topic; see :class:`magnetar.aio.Producer` for the semantics.

    Every send takes the same keyword arguments (:class:`~magnetar.aio.SendFields`):
    ``properties``, ``partition_key``, ``event_timestamp``, ``deliver_after_ms``,
    ``deliver_at_ms``.
    """

    def __init__(self, aio: aio_producer.Producer, runner: _LoopThread) -> None:
        self._aio = aio
        self._runner = runner
        self._loop = runner.loop
        config = aio.config
        self._limit = config.max_pending_messages
        self._block = config.block_if_queue_full
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._room_waiters = 0
        self._held = 0
        """Messages handed over (or waiting to be) and not yet confirmed or failed."""
        self._runs: list[_Run | _ManyRun] = []
        self._tail: _Run | None = None
        self._scheduled = False
        self._closed = False
        # on the loop only: runs that found the pending queue full, added in order once it has
        # room (only when the asyncio producer is shared with other senders)
        self._backlog: deque[_Run | _ManyRun] = deque()
        self._drainer: asyncio.Task[None] | None = None

    def topic(self) -> str:
        return self._aio.topic()

    def producer_name(self) -> str:
        return self._aio.producer_name()

    @property
    def last_sequence_id(self) -> int:
        """See :attr:`magnetar.aio.Producer.last_sequence_id`."""
        return self._aio.last_sequence_id

    def is_connected(self) -> bool:
        return self._aio.is_connected()

    def pending_messages(self) -> int:
        """Messages sent and not yet confirmed or failed."""
        return self._held

    # --- sending -----------------------------------------------------------------------------

    def send_async(
        self,
        content: bytes,
        callback: SendCallback | None = None,
        **fields: Unpack[SendFields],
    ) -> SendFuture:
        """Queue a message; returns a :class:`SendFuture` of its id and calls
        ``callback(error, message_id)`` on the client's thread once the broker answered.

        Returns at once unless ``max_pending_messages`` are pending: then it waits for room
        (``block_if_queue_full``, the default) or fails the future and the callback with
        :class:`ProducerQueueFullError` at once, in this thread. A closed producer fails the
        same way with :class:`ProducerClosedError`. Bad arguments (content that is not bytes,
        a key that is not a str, both delays ...) raise :class:`InvalidArgumentError` here.
        """
        options = send_options(fields) if fields else NO_OPTIONS
        if type(content) is not bytes:
            content = _content(content)
        future = SendFuture(callback)
        with self._lock:
            error = None
            if self._held >= self._limit or self._closed:
                error = self._wait_for_room_locked(1)
            if error is None:
                self._held += 1
                run = self._tail
                if run is None or (run.options is not options and run.options != options):
                    run = self._tail = _Run(self, options)
                    self._runs.append(run)
                run.contents.append(content)
                run.futures.append(future)
                if self._scheduled:
                    return future
                self._scheduled = True
        if error is not None:
            future.failed(error)  # the callback runs here, in the caller's thread
        else:
            self._wake()
        return future

    def send(self, content: bytes, **fields: Unpack[SendFields]) -> MessageId:
        """Publish and wait until the broker stored the message durably; its id. Waits for room
        as :meth:`send_async` does; raises the send's error.

        ``deliver_after_ms`` (from now) or ``deliver_at_ms`` (ms since the epoch): delayed
        delivery, as :meth:`magnetar.aio.Producer.send` describes it."""
        refuse_wait_in_client_thread("send()")
        return self.send_async(content, **fields).result()

    def send_many_async(
        self,
        contents: Sequence[bytes],
        callback: ManyCallback | None = None,
        **fields: Unpack[SendFields],
    ) -> concurrent.futures.Future[SendReceipt]:
        """Queue a run of messages sharing key, properties, event time and delivery time, in
        order on one partition; the future gives a :class:`SendReceipt` once all are stored
        (see :meth:`magnetar.aio.Producer.send_many_async`). Waits for room for the whole run
        as :meth:`send_async` does for one message."""
        messages, error = aio_producer._many_contents(contents, self._limit)
        if error is not None:
            raise error
        options = send_options(fields) if fields else NO_OPTIONS
        run = _ManyRun(self, messages, options, callback)
        with self._lock:
            error = None
            if self._held + len(messages) > self._limit or self._closed:
                error = self._wait_for_room_locked(len(messages))
            if error is None:
                self._held += len(messages)
                self._runs.append(run)
                self._tail = None
                schedule = not self._scheduled
                self._scheduled = True
        if error is not None:
            run.failed(0, 0, error)
            return run.future
        if schedule:
            self._wake()
        return run.future

    def send_many(self, contents: Sequence[bytes], **fields: Unpack[SendFields]) -> SendReceipt:
        """Publish a run of messages sharing key, properties and event time, in order on one
        partition, and wait until the broker stored them all durably: the fast way to send
        many (see :meth:`magnetar.aio.Producer.send_many_async`)."""
        refuse_wait_in_client_thread("send_many()")
        return self.send_many_async(contents, **fields).result()

    def _wait_for_room_locked(self, count: int) -> MagnetarError | None:
        """Wait (lock held) until ``count`` more messages may be pending; the error that fails
        them instead (queue full without blocking, closed)."""
        while True:
            if self._closed:
                return ProducerClosedError(
                    f"the producer on {self._aio.topic()} is closed",
                    context={"topic": self._aio.topic()},
                )
            if self._held + count <= self._limit:
                return None
            if not self._block:
                return self._aio._queue_full()
            refuse_wait_in_client_thread("send_async() on a full pending queue")
            self._room_waiters += 1
            try:
                self._room.wait()
            finally:
                self._room_waiters -= 1

    def _wake(self) -> None:
        try:
            self._runner.call_soon(self._drain)
        except ClientClosedError:
            # the client closed between the check and now: fail what is not handed over
            self._fail_unsent(ClientClosedError("the client was closed"))

    def _fail_unsent(self, error: MagnetarError) -> None:
        with self._lock:
            runs, self._runs = self._runs, []
            self._tail = None
            self._scheduled = False
        for run in runs:
            count = len(run.contents)
            run.failed(0, count, error)

    def _settled(self, count: int) -> None:
        """``count`` messages were confirmed or failed (on the loop): their room is free."""
        with self._lock:
            self._held -= count
            if self._room_waiters:
                self._room.notify_all()

    def _drain(self) -> None:
        """Hand what the application sent to the asyncio producer (on the loop)."""
        with self._lock:
            runs, self._runs = self._runs, []
            self._tail = None
            self._scheduled = False
        aio = self._aio
        backlog = self._backlog
        for run in runs:
            if backlog or not run.add_to(aio):
                backlog.append(run)
        if backlog and (self._drainer is None or self._drainer.done()):
            self._drainer = asyncio.ensure_future(self._drain_backlog())

    async def _drain_backlog(self) -> None:
        backlog = self._backlog
        while backlog:
            await backlog[0].add_when_room(self._aio)
            backlog.popleft()

    async def _handed_over(self) -> None:
        """Until every message sent so far is in the asyncio producer (on the loop)."""
        self._drain()
        while self._drainer is not None and not self._drainer.done():
            await asyncio.shield(self._drainer)

    def flush(self) -> None:
        """Send every batched message now and wait until all sent so far are confirmed or
        failed (their futures and callbacks carry any error)."""

        async def flush() -> None:
            await self._handed_over()
            await self._aio.flush()

        self._runner.run(flush())

    def close(self) -> None:
        """Flush (waiting up to ``send_timeout_ms``), then close. Sends after this fail with
        :class:`ProducerClosedError`. Idempotent."""
        self._mark_closed()
        if self._runner.closed:
            return

        async def close() -> None:
            await self._handed_over()
            await self._aio.close()

        self._runner.run(close())

    def _mark_closed(self) -> None:
        with self._lock:
            self._closed = True
            self._room.notify_all()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --- consumer and reader -----------------------------------------------------------------------

_ACK, _CUMULATIVE, _NACK = 0, 1, 2
_AckItem = tuple[aio_consumer._PartitionConsumer, Entry, int, int]


class _Receiving:
    """What a sync consumer and a sync reader share: the queue the calling thread reads, and
    the listener thread."""

    _closed_error: type[MagnetarError] = ConsumerClosedError

    def __init__(
        self,
        aio: aio_consumer.Consumer,
        runner: _LoopThread,
        queue: ThreadReceiveQueue,
        listener: Callable[[Any, Message], object] | None,
        kind: str,
    ) -> None:
        self._aio_consumer = aio
        self._runner = runner
        self._queue = queue
        self._listener = listener
        self._listener_thread: threading.Thread | None = None
        if listener is not None:
            self._listener_thread = threading.Thread(
                target=self._listen,
                name=f"magnetar-{kind}-listener:{aio.topic()}",
                daemon=True,
            )
            self._listener_thread.start()

    def _check_receive(self) -> None:
        if self._listener is not None:
            raise InvalidArgumentError(
                "receiving is not allowed on a consumer or reader with a listener: the"
                " listener gets every message"
            )
        if self._aio_consumer._closed:
            raise ConsumerClosedError(f"the consumer on {self._aio_consumer.topic()} is closed")

    def _next(self, timeout_millis: int | None) -> Message:
        self._check_receive()
        return self._queue.take_one(None if timeout_millis is None else timeout_millis / 1000)

    def _listen(self) -> None:
        listener = self._listener
        assert listener is not None
        queue = self._queue
        while True:
            try:
                message = queue.take_one(None)
            except ConsumerClosedError:
                return
            except MagnetarError as e:
                log.warning(
                    "message_listener_stopped", topic=self._aio_consumer.topic(), error=repr(e)
                )
                return
            if self._aio_consumer._closed:
                return
            try:
                listener(self, message)
            except Exception:  # one bad message must not stop delivery of the others
                log.exception(
                    "message_listener_failed",
                    topic=message.topic_name(),
                    message_id=str(message.message_id()),
                )

    def _join_listener(self) -> None:
        thread = self._listener_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(1.0, self._aio_consumer.client_config.operation_timeout_s))


class Consumer(_Receiving):
    """Receives from one topic on one subscription; see :class:`magnetar.aio.Consumer`.

    ``receive`` reads the consumer's queue in the calling thread (several threads may receive
    at once: each message goes to one of them). Acknowledgements return at once and are sent
    in groups; with ``ack_receipts=True`` they wait for the broker's confirmation.
    """

    def __init__(
        self,
        aio: aio_consumer.Consumer,
        runner: _LoopThread,
        queue: ThreadReceiveQueue,
        listener: Callable[[Consumer, Message], object] | None = None,
    ) -> None:
        self._aio = aio
        self._receipts = aio.config.ack_receipts
        self._acks: Handoff[_AckItem] = Handoff(runner.loop, self._apply_acks)
        super().__init__(aio, runner, queue, listener, "consumer")

    def topic(self) -> str:
        return self._aio.topic()

    def subscription_name(self) -> str:
        return self._aio.subscription_name()

    def consumer_name(self) -> str:
        return self._aio.consumer_name()

    def is_connected(self) -> bool:
        return self._aio.is_connected()

    def has_reached_end_of_topic(self) -> bool:
        return self._aio.has_reached_end_of_topic()

    def discarded_corrupt_entries(self) -> int:
        """See :meth:`magnetar.aio.Consumer.discarded_corrupt_entries`."""
        return self._aio.discarded_corrupt_entries()

    def active_partitions(self) -> list[int]:
        """Failover: the partitions this consumer is the active consumer of (indexes; -1 for a
        non-partitioned topic)."""
        return self._aio.active_partitions()

    def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; :class:`ReceiveTimeoutError` when none comes in ``timeout_millis``
        (``None``: wait for ever). Not allowed with a ``message_listener``."""
        return self._next(timeout_millis)

    def batch_receive(
        self, max_messages: int | None = None, timeout_millis: int | None = None
    ) -> list[Message]:
        """The messages that arrive until ``max_messages`` (default
        ``batch_receive_max_messages``) or ``batch_receive_max_bytes`` are reached, or
        ``timeout_millis`` (default ``batch_receive_timeout_ms``) has passed; possibly none."""
        self._check_receive()
        config = self._aio.config
        limit = config.batch_receive_max_messages if max_messages is None else max_messages
        if limit < 1:
            raise InvalidArgumentError(f"max_messages is at least 1, got {limit}")
        timeout_ms = config.batch_receive_timeout_ms if timeout_millis is None else timeout_millis
        return self._queue.take(
            limit,
            timeout_ms / 1000,
            max_bytes=config.batch_receive_max_bytes,
            wait_for_more=True,
        )

    def __iter__(self) -> Iterator[Message]:
        """Messages until the consumer is closed."""
        while True:
            try:
                yield self.receive()
            except ConsumerClosedError:
                return

    def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message: returns once queued (acks are grouped), or once the broker
        confirmed it when ``ack_receipts`` is on."""
        if self._receipts:
            self._runner.run(self._aio.acknowledge(message))
            return
        owner, entry, index = self._aio.ack_target(message)
        self._hand_ack((owner, entry, index, _ACK))

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge this message and every earlier one of its partition (as
        :meth:`acknowledge` does: grouped, or confirmed with ``ack_receipts``)."""
        if self._receipts:
            self._runner.run(self._aio.acknowledge_cumulative(message))
            return
        self._aio.check_cumulative_allowed()
        owner, entry, index = self._aio.ack_target(message)
        self._hand_ack((owner, entry, index, _CUMULATIVE))

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Ask for the message again after ``negative_ack_redelivery_delay_ms``."""
        owner, entry, index = self._aio.ack_target(message)
        self._hand_ack((owner, entry, index, _NACK))

    def _hand_ack(self, item: _AckItem) -> None:
        try:
            self._acks.put(item)
        except RuntimeError:  # the client's loop is gone
            raise ClientClosedError("the client was closed") from None

    def _apply_acks(self, items: list[_AckItem]) -> None:
        """On the loop: what the application took first (so that acks find their messages
        tracked), then its acks in the order they were made."""
        self._queue.flush_taken()
        for owner, entry, index, kind in items:
            try:
                if kind == _ACK:
                    owner.ack(entry, index)
                elif kind == _CUMULATIVE:
                    owner.ack_cumulative(entry, index)
                else:
                    owner.nack(entry, index)
            except Exception:  # a bug must not lose the other acks of the group
                log.exception("acknowledgement_failed", entry=entry, batch_index=index)

    def seek(
        self, target: MessageId | int | None = None, *, publish_time_ms: int | None = None
    ) -> None:
        """Move the subscription to a message id, an offset or ``publish_time_ms=``."""

        async def seek() -> None:
            self._acks.drain()
            await self._aio.seek(target, publish_time_ms=publish_time_ms)

        self._runner.run(seek())

    def close(self) -> None:
        """Apply and flush the acknowledgements made so far, then close. A listener still
        handling a message finishes it first. Idempotent."""
        if self._runner.closed:
            return

        async def close() -> None:
            self._acks.drain()
            await self._aio.close()

        self._runner.run(close())
        self._join_listener()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Reader(_Receiving):
    """Reads one topic from a position; see :class:`magnetar.aio.Reader`."""

    def __init__(
        self,
        aio: aio_reader.Reader,
        runner: _LoopThread,
        queue: ThreadReceiveQueue,
        listener: Callable[[Reader, Message], object] | None = None,
    ) -> None:
        self._aio = aio
        super().__init__(aio._consumer, runner, queue, listener, "reader")

    def topic(self) -> str:
        return self._aio.topic()

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message; :class:`ReceiveTimeoutError` when none comes in
        ``timeout_millis``. Not allowed with a ``reader_listener``."""
        return self._next(timeout_millis)

    def read_available(self, max_messages: int, timeout_millis: int | None = None) -> list[Message]:
        """See :meth:`magnetar.aio.Reader.read_available`."""
        self._check_receive()
        if max_messages < 1:
            raise InvalidArgumentError(f"max_messages is at least 1, got {max_messages}")
        return self._queue.take(
            max_messages, None if timeout_millis is None else timeout_millis / 1000
        )

    def __iter__(self) -> Iterator[Message]:
        while True:
            try:
                yield self.read_next()
            except ConsumerClosedError:
                return

    def seek(
        self, target: MessageId | int | None = None, *, publish_time_ms: int | None = None
    ) -> None:
        self._runner.run(self._aio.seek(target, publish_time_ms=publish_time_ms))

    def is_connected(self) -> bool:
        return self._aio.is_connected()

    def has_reached_end_of_topic(self) -> bool:
        return self._aio.has_reached_end_of_topic()

    def close(self) -> None:
        if self._runner.closed:
            return
        self._runner.run(self._aio.close())
        self._join_listener()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AdminClient:
    """Administration of a cluster; see :class:`magnetar.aio.AdminClient` for each method.

    ``magnetar.AdminClient("magnetar://localhost:6650")``, or ``client.admin()``.
    """

    def __init__(
        self,
        service_url: str | ClientConfig,
        _runner: _LoopThread | None = None,
        **settings: Any,
    ) -> None:
        self._owns_runner = _runner is None
        self._runner = _runner or _LoopThread("magnetar-admin")
        try:
            self._aio = self._runner.run(_construct(aio_admin.AdminClient, service_url, settings))
        except BaseException:
            if self._owns_runner:
                self._runner.stop()
            raise

    def create_topic(
        self,
        topic: str,
        partitions: int = 0,
        *,
        policies: Mapping[str, Any] | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        return self._runner.run(
            self._aio.create_topic(topic, partitions, policies=policies, properties=properties)
        )

    def delete_topic(self, topic: str, *, force: bool = False) -> None:
        self._runner.run(self._aio.delete_topic(topic, force=force))

    def list_topics(self, namespace: str = "") -> list[dict[str, Any]]:
        return self._runner.run(self._aio.list_topics(namespace))

    def get_topic(self, topic: str) -> dict[str, Any]:
        return self._runner.run(self._aio.get_topic(topic))

    def get_partitions(self, topic: str) -> int:
        return self._runner.run(self._aio.get_partitions(topic))

    def update_partitions(self, topic: str, partitions: int) -> int:
        return self._runner.run(self._aio.update_partitions(topic, partitions))

    def topic_stats(self, topic: str, *, internal: bool = False) -> dict[str, Any]:
        return self._runner.run(self._aio.topic_stats(topic, internal=internal))

    def unload_topic(self, topic: str) -> None:
        self._runner.run(self._aio.unload_topic(topic))

    def list_subscriptions(self, topic: str) -> list[str]:
        return self._runner.run(self._aio.list_subscriptions(topic))

    def create_subscription(
        self,
        topic: str,
        subscription: str,
        start: MessageId | int | Literal["earliest", "latest"] = "latest",
        *,
        publish_time_ms: int | None = None,
    ) -> None:
        self._runner.run(
            self._aio.create_subscription(
                topic, subscription, start, publish_time_ms=publish_time_ms
            )
        )

    def delete_subscription(self, topic: str, subscription: str, *, force: bool = False) -> None:
        self._runner.run(self._aio.delete_subscription(topic, subscription, force=force))

    def reset_cursor(
        self,
        topic: str,
        subscription: str,
        target: MessageId | int | Literal["earliest", "latest"] | None = None,
        *,
        publish_time_ms: int | None = None,
    ) -> None:
        self._runner.run(
            self._aio.reset_cursor(topic, subscription, target, publish_time_ms=publish_time_ms)
        )

    def list_brokers(self) -> list[dict[str, Any]]:
        return self._runner.run(self._aio.list_brokers())

    def list_bookies(self) -> list[dict[str, Any]]:
        return self._runner.run(self._aio.list_bookies())

    def list_ownership(self, broker_id: str = "") -> list[dict[str, Any]]:
        return self._runner.run(self._aio.list_ownership(broker_id))

    def list_ledgers(self, topic: str = "") -> list[dict[str, Any]]:
        return self._runner.run(self._aio.list_ledgers(topic))

    def get_ledger(self, ledger_id: int) -> dict[str, Any]:
        return self._runner.run(self._aio.get_ledger(ledger_id))

    def create_tenant(self, tenant: str, admin_roles: Iterable[str] = ()) -> None:
        self._runner.run(self._aio.create_tenant(tenant, admin_roles))

    def update_tenant(self, tenant: str, admin_roles: Iterable[str]) -> None:
        self._runner.run(self._aio.update_tenant(tenant, admin_roles))

    def delete_tenant(self, tenant: str) -> None:
        self._runner.run(self._aio.delete_tenant(tenant))

    def list_tenants(self) -> list[str]:
        return self._runner.run(self._aio.list_tenants())

    def get_tenant(self, tenant: str) -> dict[str, Any]:
        return self._runner.run(self._aio.get_tenant(tenant))

    def create_namespace(self, namespace: str) -> None:
        self._runner.run(self._aio.create_namespace(namespace))

    def delete_namespace(self, namespace: str) -> None:
        self._runner.run(self._aio.delete_namespace(namespace))

    def list_namespaces(self, tenant: str) -> list[str]:
        return self._runner.run(self._aio.list_namespaces(tenant))

    def grant_permission(
        self, namespace: str, role: str, actions: Iterable[str] = ("produce", "consume")
    ) -> None:
        self._runner.run(self._aio.grant_permission(namespace, role, actions))

    def revoke_permission(self, namespace: str, role: str) -> None:
        self._runner.run(self._aio.revoke_permission(namespace, role))

    def permissions(self, namespace: str) -> dict[str, list[str]]:
        return self._runner.run(self._aio.permissions(namespace))

    def whoami(self) -> dict[str, Any]:
        return self._runner.run(self._aio.whoami())

    def close(self) -> None:
        """Close the connections (and the private thread, unless it is a client's)."""
        try:
            self._runner.run(self._aio.close())
        finally:
            if self._owns_runner:
                self._runner.stop()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _construct(cls: type[T], service_url: str | ClientConfig, settings: dict[str, Any]) -> T:
    # built on the loop thread: gRPC channels bind to the loop that creates them
    return cls(service_url, **settings)  # type: ignore[call-arg]


class Client:
    """A Magnetar client (``magnetar.Client("magnetar://localhost:6650")``).

    Keyword settings are the fields of :class:`magnetar.aio.ClientConfig`; producer, consumer
    and reader settings are those of :class:`ProducerConfig` and :class:`ConsumerConfig`.
    """

    def __init__(self, service_url: str | ClientConfig, **settings: Any) -> None:
        self._runner = _LoopThread("magnetar-client")
        try:
            self._aio: aio_client.Client = self._runner.run(
                _construct(aio_client.Client, service_url, settings)
            )
        except BaseException:
            self._runner.stop()
            raise
        self.config = self._aio.config
        self._producers: list[Producer] = []
        self._receivers: list[Consumer | Reader] = []

    def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        *,
        config: ProducerConfig | None = None,
        **settings: Any,
    ) -> Producer:
        aio = self._runner.run(
            self._aio.create_producer(topic, producer_name, config=config, **settings)
        )
        producer = Producer(aio, self._runner)
        self._producers.append(producer)
        return producer

    def subscribe(
        self,
        topic: str,
        subscription_name: str,
        subscription_type: Literal["exclusive", "failover", "shared", "key_shared"] = "exclusive",
        *,
        config: ConsumerConfig | None = None,
        on_active_change: Callable[[str, bool], None] | None = None,
        message_listener: Callable[[Consumer, Message], object] | None = None,
        **settings: Any,
    ) -> Consumer:
        """A consumer; see :meth:`magnetar.aio.Client.subscribe`. ``on_active_change``
        (failover: ``(partition_topic, is_active)``) runs on the client's thread: it must
        return quickly and must not call blocking methods of this client.

        ``message_listener(consumer, message)``: every message is handed to it, one at a time
        in arrival order, on a thread of this consumer's own (so a listener that blocks holds
        up this consumer only); ``receive`` and ``batch_receive`` are then refused. It
        acknowledges as a receiver would. A listener that raises is logged and delivery goes
        on; its message stays unacknowledged, so it comes again (ack timeout, negative
        acknowledgement, reconnect)."""
        queue = ThreadReceiveQueue(self._runner.loop)
        aio = self._runner.run(
            self._aio._subscribe(
                topic,
                subscription_name,
                subscription_type,
                config=config,
                on_active_change=on_active_change,
                settings=settings,
                thread_queue=queue,
            )
        )
        consumer = Consumer(aio, self._runner, queue, message_listener)
        self._receivers.append(consumer)
        return consumer

    def create_reader(
        self,
        topic: str,
        start_message_id: MessageId | Literal["earliest", "latest"] | None = None,
        *,
        start_offset: int | None = None,
        start_publish_time_ms: int | None = None,
        reader_name: str | None = None,
        receiver_queue_size: int = 1000,
        start_message_id_inclusive: bool = False,
        reader_listener: Callable[[Reader, Message], object] | None = None,
    ) -> Reader:
        """A reader; see :meth:`magnetar.aio.Client.create_reader`. ``reader_listener(reader,
        message)`` gets every message on a thread of its own, as ``message_listener`` does
        for :meth:`subscribe`."""
        queue = ThreadReceiveQueue(self._runner.loop)
        aio = self._runner.run(
            self._aio._create_reader(
                topic,
                start_message_id,
                start_offset=start_offset,
                start_publish_time_ms=start_publish_time_ms,
                reader_name=reader_name,
                receiver_queue_size=receiver_queue_size,
                start_message_id_inclusive=start_message_id_inclusive,
                thread_queue=queue,
            )
        )
        reader = Reader(aio, self._runner, queue, reader_listener)
        self._receivers.append(reader)
        return reader

    def get_topic_partitions(self, topic: str) -> list[str]:
        return self._runner.run(self._aio.get_topic_partitions(topic))

    def admin(self) -> AdminClient:
        """An admin client on the same service URL, sharing this client's thread."""
        return AdminClient(
            self.config,
            _runner=self._runner,
            authentication=self._aio._authentication,
        )

    def close(self) -> None:
        """Flush and close every producer, consumer and reader, then stop the client's thread.
        Sends after this fail with :class:`ProducerClosedError`; other calls raise
        :class:`ClientClosedError` or :class:`ConsumerClosedError`. Idempotent."""
        if self._runner.closed:
            return
        for producer in self._producers:
            producer._mark_closed()

        async def close() -> None:
            for producer in self._producers:
                await producer._handed_over()
            for receiver in self._receivers:
                if isinstance(receiver, Consumer):
                    receiver._acks.drain()
            await self._aio.close()

        try:
            self._runner.run(close())
        except ClientClosedError:
            return
        finally:
            self._runner.stop()
            for receiver in self._receivers:
                receiver._join_listener()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
