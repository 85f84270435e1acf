"""The asyncio client: the entry point that creates producers, consumers and readers.

One :class:`Client` holds one connection pool (a gRPC channel per broker) for everything it
creates; closing it flushes and closes them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any, Literal, TypeVar

from magnetar.aio.config import ClientConfig, ConsumerConfig, ProducerConfig
from magnetar.aio.connection import ConnectionPool
from magnetar.aio.consumer import Consumer
from magnetar.aio.message_id import MessageId
from magnetar.aio.names import parse_topic
from magnetar.aio.producer import Producer
from magnetar.aio.reader import Reader
from magnetar.common.config import config_error
from magnetar.common.errors import ClientClosedError, InvalidArgumentError

__all__ = ["Client"]

_C = TypeVar("_C")


def _check_names(cls: type, settings: dict[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    for name, value in settings.items():
        if name not in known:
            raise config_error(name, value, f"is not a setting of {cls.__name__}")


def _build(cls: type[_C], settings: dict[str, Any]) -> _C:
    _check_names(cls, settings)
    return cls(**settings)


def _replace(config: _C, settings: dict[str, Any]) -> _C:
    _check_names(type(config), settings)
    return dataclasses.replace(config, **settings)  # type: ignore[type-var]


class Client:
    """A Magnetar client for asyncio.

    ``Client("magnetar://h1:6650,h2:6650", operation_timeout_s=30)`` or
    ``Client(ClientConfig(...))``; keyword settings are the fields of :class:`ClientConfig`.
    Creating a client opens nothing: connections open on first use.
    """

    def __init__(self, service_url: str | ClientConfig, **settings: Any) -> None:
        if isinstance(service_url, ClientConfig):
            config = _replace(service_url, settings) if settings else service_url
        else:
            config = _build(ClientConfig, {"service_url": service_url, **settings})
        self.config = config
        self._pool = ConnectionPool(config)  # checks the service URL
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
        ``batching_max_bytes``, ``batching_max_publish_delay_ms``, ``send_timeout_ms``,
        ``max_pending_messages``, ``compression`` ...), or a whole ``config``.
        """
        self._check_open()
        if config is None:
            config = _build(ProducerConfig, {"producer_name": producer_name, **settings})
        elif producer_name is not None or settings:
            if producer_name is not None:
                settings["producer_name"] = producer_name
            config = _replace(config, settings)
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
        **settings: Any,
    ) -> Consumer:
        """A consumer of ``topic`` (every partition) on ``subscription_name``.

        Settings are the fields of :class:`ConsumerConfig` (``initial_position``,
        ``receiver_queue_size``, ``consumer_name``, ``negative_ack_redelivery_delay_ms``,
        ``ack_receipts`` ...), or a whole ``config``.
        """
        self._check_open()
        if config is None:
            config = _build(
                ConsumerConfig,
                {
                    "subscription_name": subscription_name,
                    "subscription_type": subscription_type,
                    **settings,
                },
            )
        elif settings:
            config = _replace(config, settings)
        consumer = Consumer(
            topic=parse_topic(topic),
            config=config,
            client_config=self.config,
            pool=self._pool,
            on_close=self._consumers.discard,
        )
        await consumer._start()
        self._consumers.add(consumer)
        return consumer

    async def create_reader(
        self,
        topic: str,
        start_message_id: MessageId | Literal["earliest", "latest"],
        *,
        reader_name: str | None = None,
        receiver_queue_size: int = 1000,
        start_message_id_inclusive: bool = False,
    ) -> Reader:
        """A reader of ``topic`` from ``start_message_id``.

        ``MessageId.earliest``/``"earliest"``: from the first stored message; ``latest``: only
        messages published from now on; a message id: the message after it (or that message
        itself with ``start_message_id_inclusive=True``). A message id start needs a
        non-partitioned topic or one partition (``topic-partition-N``).
        """
        self._check_open()
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
        name = reader_name or f"reader-{uuid.uuid4().hex[:10]}"
        config = ConsumerConfig(
            subscription_name=name,
            subscription_type="exclusive",
            consumer_name=name,
            receiver_queue_size=receiver_queue_size,
            initial_position="earliest" if start.is_earliest() else "latest",
        )
        consumer = Consumer(
            topic=parse_topic(topic),
            config=config,
            client_config=self.config,
            pool=self._pool,
            durable=False,
            on_close=self._consumers.discard,
        )
        await consumer._start(start, start_inclusive=start_message_id_inclusive)
        self._consumers.add(consumer)
        return Reader(consumer)

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
