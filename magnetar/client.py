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
thread, and every sync method runs the asyncio method of the same name on it and waits for the
result. Settings, errors, messages and message ids are the asyncio client's. Sync objects are safe
to use from several threads. ``send_async`` callbacks and a consumer's ``on_active_change`` run
on the client's loop thread: they must return quickly and must not call blocking methods of the
same client (that would wait on the thread that is running them; it raises an error instead).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeVar

from magnetar.aio import admin as aio_admin
from magnetar.aio import client as aio_client
from magnetar.aio import consumer as aio_consumer
from magnetar.aio import producer as aio_producer
from magnetar.aio import reader as aio_reader
from magnetar.aio.config import ClientConfig, ConsumerConfig, ProducerConfig
from magnetar.aio.message import Message
from magnetar.aio.message_id import MessageId
from magnetar.aio.producer import SendCallback, SendReceipt
from magnetar.common.errors import ClientClosedError, ConsumerClosedError, InvalidArgumentError

__all__ = ["AdminClient", "Client", "Consumer", "Producer", "Reader"]

T = TypeVar("T")


class _SendArgs(NamedTuple):
    content: bytes
    callback: SendCallback | None
    properties: Mapping[str, str] | None
    partition_key: str | None
    event_timestamp: int | None
    deliver_after_ms: int | None
    deliver_at_ms: int | None


def _send_when_room(
    producer: aio_producer.Producer, args: _SendArgs
) -> Coroutine[Any, Any, asyncio.Future[MessageId]]:
    return producer.send_async_when_room(
        args.content,
        args.callback,
        args.properties,
        args.partition_key,
        args.event_timestamp,
        deliver_after_ms=args.deliver_after_ms,
        deliver_at_ms=args.deliver_at_ms,
    )


def _delivery_now(
    deliver_after_ms: int | None, deliver_at_ms: int | None
) -> tuple[int | None, int | None]:
    """A delay counts from the call, however long the message then waits for the client's
    thread or for room: it becomes a time here, in the caller's thread. Bad arguments go on
    as given, and the asyncio producer reports them as it does any bad message."""
    try:
        deliver_at = aio_producer.deliver_time_ms(deliver_after_ms, deliver_at_ms)
    except InvalidArgumentError:
        return deliver_after_ms, deliver_at_ms
    return None, deliver_at or None


class _LoopThread:
    """A private event loop running in a daemon thread; runs coroutines for callers."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._closed = False
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()

    def _main(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closed:
            coro.close()
            raise ClientClosedError("the client was closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (its exception is raised here)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "a blocking magnetar call was made on the client's own loop thread (from a"
                " send_async callback?); use the magnetar.aio client there, or hand the work to"
                " another thread"
            )
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # Ctrl-C while waiting: do not leave the operation running
            raise

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the loop soon, without waiting for it."""
        if self._closed:
            raise ClientClosedError("the client was closed")
        self.loop.call_soon_threadsafe(callback)

    def stop(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)


class Producer:
    """Publishes to one topic; see :class:`magnetar.aio.Producer` for the semantics."""

    def __init__(self, aio: aio_producer.Producer, runner: _LoopThread) -> None:
        self._aio = aio
        self._runner = runner
        self._room = threading.BoundedSemaphore(aio.config.max_pending_messages)
        # used on the loop thread only
        self._backlog: deque[tuple[_SendArgs, Callable[[asyncio.Future[MessageId]], None]]] = (
            deque()
        )
        self._drainer: asyncio.Future[None] | None = None

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
        return self._aio.pending_messages()

    def send(
        self,
        content: bytes,
        properties: Mapping[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
        *,
        deliver_after_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> MessageId:
        """Publish and wait until the broker stored the message durably; its id.

        ``deliver_after_ms`` (from now) or ``deliver_at_ms`` (ms since the epoch): delayed
        delivery, as :meth:`magnetar.aio.Producer.send` describes it."""
        deliver_after_ms, deliver_at_ms = _delivery_now(deliver_after_ms, deliver_at_ms)
        return self._runner.run(
            self._aio.send(
                content,
                properties,
                partition_key,
                event_timestamp,
                deliver_after_ms=deliver_after_ms,
                deliver_at_ms=deliver_at_ms,
            )
        )

    def send_many(
        self,
        contents: Sequence[bytes],
        properties: Mapping[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
        *,
        deliver_after_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> SendReceipt:
        """Publish a run of messages sharing key, properties and event time, in order on one
        partition, and wait until the broker stored them all durably: the fast way to send
        many (see :meth:`magnetar.aio.Producer.send_many_async`)."""
        deliver_after_ms, deliver_at_ms = _delivery_now(deliver_after_ms, deliver_at_ms)
        return self._runner.run(
            self._aio.send_many(
                contents,
                properties,
                partition_key,
                event_timestamp,
                deliver_after_ms=deliver_after_ms,
                deliver_at_ms=deliver_at_ms,
            )
        )

    def send_async(
        self,
        content: bytes,
        callback: SendCallback | None = None,
        properties: Mapping[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
        *,
        deliver_after_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> concurrent.futures.Future[MessageId]:
        """Queue a message; returns a future of its id, and calls ``callback(error,
        message_id)`` (on the client's thread) when the broker answered. When the pending
        queue is full this waits for room (``block_if_queue_full``, the default) or fails the
        future and the callback with :class:`ProducerQueueFullError`. ``deliver_after_ms`` /
        ``deliver_at_ms``: as for :meth:`send`.

        The message is handed to the client's thread without waiting for it there: the caller
        only waits when the pending queue is full.
        """
        deliver_after_ms, deliver_at_ms = _delivery_now(deliver_after_ms, deliver_at_ms)
        blocking = self._aio.config.block_if_queue_full
        if blocking:
            self._room.acquire()  # mirrors the pending queue: waits here, in the caller
        outer: concurrent.futures.Future[MessageId] = concurrent.futures.Future()

        def done(inner: asyncio.Future[MessageId]) -> None:
            if blocking:
                self._room.release()
            if inner.cancelled():
                outer.cancel()
            elif (error := inner.exception()) is not None:
                outer.set_exception(error)
            else:
                outer.set_result(inner.result())

        def hand_over() -> None:
            producer = self._aio
            if blocking and (self._backlog or not producer.has_room()):
                # sync send() calls fill the same queue: wait for room on the loop, in order
                self._backlog.append((args, done))
                if self._drainer is None or self._drainer.done():
                    self._drainer = asyncio.ensure_future(self._drain_backlog())
                return
            producer.send_async(
                args.content,
                args.callback,
                args.properties,
                args.partition_key,
                args.event_timestamp,
                deliver_after_ms=args.deliver_after_ms,
                deliver_at_ms=args.deliver_at_ms,
            ).add_done_callback(done)

        args = _SendArgs(
            content,
            callback,
            properties,
            partition_key,
            event_timestamp,
            deliver_after_ms,
            deliver_at_ms,
        )
        try:
            self._runner.call_soon(hand_over)
        except BaseException:
            if blocking:
                self._room.release()
            raise
        return outer

    async def _drain_backlog(self) -> None:
        """Hand the messages that found the pending queue full to the producer, in order, each
        once there is room (on the loop)."""
        while self._backlog:
            args, done = self._backlog[0]
            inner = await _send_when_room(self._aio, args)
            self._backlog.popleft()
            inner.add_done_callback(done)

    def flush(self) -> None:
        """Send every batched message now and wait until all sent so far are confirmed."""

        async def flush() -> None:
            while self._drainer is not None and not self._drainer.done():
                await asyncio.shield(self._drainer)  # messages still waiting for room
            await self._aio.flush()

        self._runner.run(flush())

    def close(self) -> None:
        """Flush, then close. Idempotent."""
        self._runner.run(self._aio.close())

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Consumer:
    """Receives from one topic on one subscription; see :class:`magnetar.aio.Consumer`."""

    def __init__(self, aio: aio_consumer.Consumer, runner: _LoopThread) -> None:
        self._aio = aio
        self._runner = runner

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

    def active_partitions(self) -> list[int]:
        """Failover: the partitions this consumer is the active consumer of (indexes; -1 for a
        non-partitioned topic)."""
        return self._aio.active_partitions()

    def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; :class:`ReceiveTimeoutError` when none comes in ``timeout_millis``
        (``None``: wait for ever)."""
        return self._runner.run(self._aio.receive(timeout_millis))

    def batch_receive(
        self, max_messages: int | None = None, timeout_millis: int | None = None
    ) -> list[Message]:
        """Up to ``max_messages`` messages, whatever arrived within ``timeout_millis``."""
        return self._runner.run(self._aio.batch_receive(max_messages, timeout_millis))

    def __iter__(self) -> Iterator[Message]:
        """Messages until the consumer is closed."""
        while True:
            try:
                yield self.receive()
            except ConsumerClosedError:
                return

    def acknowledge(self, message: Message | MessageId) -> None:
        self._runner.run(self._aio.acknowledge(message))

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        self._runner.run(self._aio.acknowledge_cumulative(message))

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        async def nack() -> None:
            self._aio.negative_acknowledge(message)

        self._runner.run(nack())

    def seek(
        self, target: MessageId | int | None = None, *, publish_time_ms: int | None = None
    ) -> None:
        """Move the subscription to a message id, an offset or ``publish_time_ms=``."""
        self._runner.run(self._aio.seek(target, publish_time_ms=publish_time_ms))

    def close(self) -> None:
        """Flush acknowledgements, then close. Idempotent."""
        self._runner.run(self._aio.close())

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Reader:
    """Reads one topic from a position; see :class:`magnetar.aio.Reader`."""

    def __init__(self, aio: aio_reader.Reader, runner: _LoopThread) -> None:
        self._aio = aio
        self._runner = runner

    def topic(self) -> str:
        return self._aio.topic()

    def read_next(self, timeout_millis: int | None = None) -> Message:
        return self._runner.run(self._aio.read_next(timeout_millis))

    def read_available(self, max_messages: int, timeout_millis: int | None = None) -> list[Message]:
        """See :meth:`magnetar.aio.Reader.read_available`."""
        return self._runner.run(self._aio.read_available(max_messages, timeout_millis))

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
        self._runner.run(self._aio.close())

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
        return Producer(aio, self._runner)

    def subscribe(
        self,
        topic: str,
        subscription_name: str,
        subscription_type: Literal["exclusive", "failover", "shared", "key_shared"] = "exclusive",
        *,
        config: ConsumerConfig | None = None,
        on_active_change: Callable[[str, bool], None] | None = None,
        **settings: Any,
    ) -> Consumer:
        """A consumer; see :meth:`magnetar.aio.Client.subscribe`. ``on_active_change``
        (failover: ``(partition_topic, is_active)``) runs on the client's thread: it must
        return quickly and must not call blocking methods of this client."""
        aio = self._runner.run(
            self._aio.subscribe(
                topic,
                subscription_name,
                subscription_type,
                config=config,
                on_active_change=on_active_change,
                **settings,
            )
        )
        return Consumer(aio, self._runner)

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
    ) -> Reader:
        aio = self._runner.run(
            self._aio.create_reader(
                topic,
                start_message_id,
                start_offset=start_offset,
                start_publish_time_ms=start_publish_time_ms,
                reader_name=reader_name,
                receiver_queue_size=receiver_queue_size,
                start_message_id_inclusive=start_message_id_inclusive,
            )
        )
        return Reader(aio, self._runner)

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
        Idempotent."""
        try:
            self._runner.run(self._aio.close())
        except ClientClosedError:
            return
        finally:
            self._runner.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
