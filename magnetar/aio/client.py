"""The asyncio client: the entry point that creates producers, consumers and readers.

One :class:`Client` holds one connection pool (a gRPC channel per broker) for everything it
creates; closing it flushes and closes them all.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any, Literal

from magnetar.aio.admin import AdminClient
from magnetar.aio.auth import Authentication
from magnetar.aio.config import (
    ClientConfig,
    ConsumerConfig,
    ProducerConfig,
    build_config,
    client_config,
    replace_config,
)
from magnetar.aio.connection import ConnectionPool
from magnetar.aio.consumer import Consumer, MessageListener
from magnetar.aio.handoff import ThreadReceiveQueue
from magnetar.aio.message_id import MessageId
from magnetar.aio.names import parse_topic
from magnetar.aio.producer import Producer
from magnetar.aio.reader import Reader
from magnetar.common.errors import ClientClosedError, InvalidArgumentError

__all__ = ["Client"]


class Client:
    """A Magnetar client for asyncio.

    ``Client("magnetar://h1:6650,h2:6650", operation_timeout_s=30)`` or
    ``Client(ClientConfig(...))``; keyword settings are the fields of :class:`ClientConfig`.
    ``authentication`` is :class:`AuthenticationToken` or :class:`AuthenticationTLS` (with a
    ``magnetar+ssl://`` URL and ``tls_trust_certs_file_path``). Creating a client opens
    nothing: connections open on first use.
    """

    def __init__(
        self,
        service_url: str | ClientConfig,
        *,
        authentication: Authentication | None = None,
        **settings: Any,
    ) -> None:
        config = client_config(service_url, settings)
        self.config = config
        self._authentication = authentication
        self._pool = ConnectionPool(config, authentication)  # checks the service URL
        self._producers: set[Producer] = set()
        self._consumers: set[Consumer] = set()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client was closed")

    async def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        *,
        config: ProducerConfig | None = None,
        **settings: Any,
    ) -> Producer:
        """A producer on ``topic``, connected to every partition's owner.

        Settings are the fields of :class:`ProducerConfig` (``batching_max_messages``,
        ``batching_max_bytes``, ``batching_max_publish_delay_ms``, ``batching_self_clocking``,
        ``send_timeout_ms``, ``max_pending_messages``, ``compression`` ...), or a whole
        ``config``.
        """
        self._check_open()
        if config is None:
            config = build_config(ProducerConfig, {"producer_name": producer_name, **settings})
        elif producer_name is not None or settings:
            if producer_name is not None:
                settings["producer_name"] = producer_name
            config = replace_config(config, settings)
        producer = Producer(
            topic=parse_topic(topic),
            config=config,
            client_config=self.config,
            pool=self._pool,
            on_close=self._producers.discard,
        )
        await producer._start()
        self._producers.add(producer)
        return producer

    async def subscribe(
        self,
        topic: str,
        subscription_name: str,
        subscription_type: Literal["exclusive", "failover", "shared", "key_shared"] = "exclusive",
        *,
        config: ConsumerConfig | None = None,
        on_active_change: Callable[[str, bool], None] | None = None,
        message_listener: MessageListener[Consumer] | None = None,
        **settings: Any,
    ) -> Consumer:
        """A consumer of ``topic`` (every partition) on ``subscription_name``.

        Settings are the fields of :class:`ConsumerConfig` (``initial_position``,
        ``receiver_queue_size``, ``consumer_name``, ``negative_ack_redelivery_delay_ms``,
        ``ack_receipts``, ``ack_timeout_ms``, ``max_redelivery_count`` ...), or a whole
        ``config``. ``on_active_change(partition_topic, is_active)`` hears a failover
        consumer become, or stop being, a partition's active consumer (see
        :meth:`Consumer.active_partitions`); it runs on the event loop and must not block.

        ``message_listener(consumer, message)``: every message is handed to it, one at a time
        in the order they arrive, on a task of the event loop (a coroutine function is awaited
        before the next message); ``receive`` and ``batch_receive`` are then refused. It
        acknowledges as a receiver would. One that raises is logged and delivery goes on (the
        message stays unacknowledged and comes again); one that blocks holds up the event loop,
        so a blocking listener belongs to the sync client, which gives each its own thread.
        """
        consumer = await self._subscribe(
            topic,
            subscription_name,
            subscription_type,
            config=config,
            on_active_change=on_active_change,
            settings=settings,
        )
        if message_listener is not None:
            consumer.start_listener(message_listener, consumer)
        return consumer

    async def _subscribe(
        self,
        topic: str,
        subscription_name: str,
        subscription_type: Literal["exclusive", "failover", "shared", "key_shared"],
        *,
        config: ConsumerConfig | None,
        on_active_change: Callable[[str, bool], None] | None,
        settings: dict[str, Any],
        thread_queue: ThreadReceiveQueue | None = None,
    ) -> Consumer:
        self._check_open()
        if config is None:
            config = build_config(
                ConsumerConfig,
                {
                    "subscription_name": subscription_name,
                    "subscription_type": subscription_type,
                    **settings,
                },
            )
        elif settings:
            config = replace_config(config, settings)
        consumer = Consumer(
            topic=parse_topic(topic),
            config=config,
            client_config=self.config,
            pool=self._pool,
            on_close=self._consumers.discard,
            on_active_change=on_active_change,
            thread_queue=thread_queue,
        )
        await consumer._start()
        self._consumers.add(consumer)
        return consumer

    async def create_reader(
        self,
        topic: str,
        start_message_id: MessageId | Literal["earliest", "latest"] | None = None,
        *,
        start_offset: int | None = None,
        start_publish_time_ms: int | None = None,
        reader_name: str | None = None,
        receiver_queue_size: int = 1000,
        start_message_id_inclusive: bool = False,
        reader_listener: MessageListener[Reader] | None = None,
    ) -> Reader:
        """A reader of ``topic`` from exactly one of these starts:

        - ``start_message_id``: ``MessageId.earliest``/``"earliest"`` (the first stored
          message), ``"latest"`` (only messages published from now on), or a message id (the
          message after it, or that message itself with ``start_message_id_inclusive=True``;
          needs a non-partitioned topic or one partition, ``topic-partition-N``);
        - ``start_offset``: the first message at or after this offset, on every partition;
        - ``start_publish_time_ms``: the first message published at or after this time
          (milliseconds since the epoch), on every partition.

        ``reader_listener(reader, message)``: every message is handed to it, as
        ``message_listener`` does for :meth:`subscribe`.
        """
        reader = await self._create_reader(
            topic,
            start_message_id,
            start_offset=start_offset,
            start_publish_time_ms=start_publish_time_ms,
            reader_name=reader_name,
            receiver_queue_size=receiver_queue_size,
            start_message_id_inclusive=start_message_id_inclusive,
        )
        if reader_listener is not None:
            reader._consumer.start_listener(reader_listener, reader)
        return reader

    async def _create_reader(
        self,
        topic: str,
        start_message_id: MessageId | Literal["earliest", "latest"] | None,
        *,
        start_offset: int | None,
        start_publish_time_ms: int | None,
        reader_name: str | None,
        receiver_queue_size: int,
        start_message_id_inclusive: bool,
        thread_queue: ThreadReceiveQueue | None = None,
    ) -> Reader:
        self._check_open()
        given = [
            name
            for name, value in (
                ("start_message_id", start_message_id),
                ("start_offset", start_offset),
                ("start_publish_time_ms", start_publish_time_ms),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise InvalidArgumentError(
                "create_reader needs exactly one of start_message_id, start_offset and"
                f" start_publish_time_ms; got {given or 'none'}"
            )
        if start_offset is not None or start_publish_time_ms is not None:
            return await self._open_reader(
                topic,
                None,
                reader_name=reader_name,
                receiver_queue_size=receiver_queue_size,
                start_offset=start_offset,
                start_publish_time_ms=start_publish_time_ms,
                thread_queue=thread_queue,
            )
        if start_message_id == "earliest":
            start = MessageId.earliest
        elif start_message_id == "latest":
            start = MessageId.latest
        elif isinstance(start_message_id, MessageId):
            start = start_message_id
        else:
            raise InvalidArgumentError(
                f"start_message_id is a MessageId, 'earliest' or 'latest', got {start_message_id!r}"
            )
        return await self._open_reader(
            topic,
            start,
            reader_name=reader_name,
            receiver_queue_size=receiver_queue_size,
            start_inclusive=start_message_id_inclusive,
            thread_queue=thread_queue,
        )

    async def _open_reader(
        self,
        topic: str,
        start: MessageId | None,
        *,
        reader_name: str | None,
        receiver_queue_size: int,
        start_inclusive: bool = False,
        start_offset: int | None = None,
        start_publish_time_ms: int | None = None,
        thread_queue: ThreadReceiveQueue | None = None,
    ) -> Reader:
        if start_offset is not None and (isinstance(start_offset, bool) or start_offset < 0):
            raise InvalidArgumentError(f"start_offset is an offset >= 0, got {start_offset!r}")
        name = reader_name or f"reader-{uuid.uuid4().hex[:10]}"
        config = ConsumerConfig(
            subscription_name=name,
            subscription_type="exclusive",
            consumer_name=name,
            receiver_queue_size=receiver_queue_size,
            initial_position="earliest" if start is None or start.is_earliest() else "latest",
        )
        consumer = Consumer(
            topic=parse_topic(topic),
            config=config,
            client_config=self.config,
            pool=self._pool,
            durable=False,
            on_close=self._consumers.discard,
            thread_queue=thread_queue,
        )
        await consumer._start(
            start_offset if start is None else start,
            start_inclusive=start_inclusive,
            start_publish_time_ms=start_publish_time_ms,
        )
        self._consumers.add(consumer)
        return Reader(consumer)

    def admin(self) -> AdminClient:
        """An :class:`AdminClient` on the same service URL and settings (close it yourself)."""
        self._check_open()
        return AdminClient(self.config, authentication=self._authentication)

    async def get_topic_partitions(self, topic: str) -> list[str]:
        """The partitions of ``topic`` (the topic itself when it has none)."""
        self._check_open()
        name = parse_topic(topic)
        lookup = await self._pool.lookup_until_found(name.full, self.config.operation_timeout_s)
        return [owner.partition_topic for owner in lookup.owners]

    async def close(self) -> None:
        """Flush and close every producer, close every consumer and reader, then the
        connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(p.close() for p in list(self._producers)), return_exceptions=True)
        await asyncio.gather(*(c.close() for c in list(self._consumers)), return_exceptions=True)
        await self._pool.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
