"""Readers: read a topic from a chosen position, with no durable cursor on the broker.

A reader is a consumer on a non-durable, exclusive subscription of its own. It acknowledges
nothing; after a reconnect it starts again at the entry of the last message it handed out and
skips up to that message, so it neither loses nor repeats messages across broker failover.
"""

from __future__ import annotations

from magnetar.aio.consumer import Consumer
from magnetar.aio.message import Message
from magnetar.aio.message_id import MessageId
from magnetar.common.errors import ConsumerClosedError

__all__ = ["Reader"]


class Reader:
    """Reads one topic from a position. Create it with ``client.create_reader``."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def topic(self) -> str:
        return self._consumer.topic()

    async def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message; :class:`ReceiveTimeoutError` when none comes in ``timeout_millis``."""
        return await self._consumer.receive(timeout_millis)

    async def read_available(
        self, max_messages: int, timeout_millis: int | None = None
    ) -> list[Message]:
        """The next messages, up to ``max_messages``: waits (at most ``timeout_millis``, then
        :class:`ReceiveTimeoutError`) only for the first, then takes what is queued with it.
        For bulk readers: whole runs leave the queue at once, where :meth:`read_next` costs a
        call per message."""
        first = await self._consumer.receive(timeout_millis)
        if max_messages <= 1:
            return [first]
        rest = await self._consumer.batch_receive(max_messages - 1, timeout_millis=0)
        return [first, *rest]

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self._consumer.receive()
        except ConsumerClosedError:
            raise StopAsyncIteration from None

    async def seek(
        self, target: MessageId | int | None = None, *, publish_time_ms: int | None = None
    ) -> None:
        """Read from a message id (inclusive), an offset, or ``publish_time_ms=``."""
        await self._consumer.seek(target, publish_time_ms=publish_time_ms)

    def is_connected(self) -> bool:
        return self._consumer.is_connected()

    def has_reached_end_of_topic(self) -> bool:
        return self._consumer.has_reached_end_of_topic()

    async def close(self) -> None:
        await self._consumer.close()

    async def __aenter__(self) -> Reader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
