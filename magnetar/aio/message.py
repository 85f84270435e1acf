"""A received message: its payload, key, properties and where it lives."""

from __future__ import annotations

from magnetar.aio.message_id import MessageId
from proto.format.v1 import entry_pb2

__all__ = ["Message"]


class Message:
    """One message as a consumer or reader receives it.

    Accessors are methods, as in the Pulsar client: ``msg.data()``, ``msg.message_id()``.
    """

    __slots__ = (
        "_id",
        "_message",
        "_offset",
        "_producer_name",
        "_publish_time_ms",
        "_redelivery_count",
        "_sequence_id",
        "_topic",
    )

    def __init__(
        self,
        *,
        message: entry_pb2.BatchedMessage,
        message_id: MessageId,
        offset: int,
        publish_time_ms: int,
        redelivery_count: int,
        topic: str,
        producer_name: str,
        sequence_id: int,
    ) -> None:
        self._message = message
        self._id = message_id
        self._offset = offset
        self._publish_time_ms = publish_time_ms
        self._redelivery_count = redelivery_count
        self._topic = topic
        self._producer_name = producer_name
        self._sequence_id = sequence_id

    def data(self) -> bytes:
        """The payload, as the producer sent it."""
        return self._message.value

    def partition_key(self) -> str | None:
        """The key the producer routed the message by; None for a keyless message."""
        return self._message.partition_key if self._message.HasField("partition_key") else None

    def properties(self) -> dict[str, str]:
        return dict(self._message.properties)

    def message_id(self) -> MessageId:
        return self._id

    def offset(self) -> int:
        """The message's dense, per-partition offset (from 0, no gaps)."""
        return self._offset

    def publish_timestamp(self) -> int:
        """When the broker stored the message (ms since the epoch, broker clock)."""
        return self._publish_time_ms

    def event_timestamp(self) -> int:
        """The application's event time (ms since the epoch); 0 when the producer set none."""
        return self._message.event_time_ms

    def redelivery_count(self) -> int:
        """How often the broker delivered this message before (0 on first delivery)."""
        return self._redelivery_count

    def topic_name(self) -> str:
        """The partition (``topic-partition-N``) or non-partitioned topic it came from."""
        return self._topic

    def producer_name(self) -> str:
        return self._producer_name

    def sequence_id(self) -> int:
        """The producer's sequence id for this message (what deduplication is keyed on)."""
        return self._sequence_id

    def __repr__(self) -> str:
        return (
            f"Message(topic={self._topic!r}, id={self._id}, offset={self._offset},"
            f" size={len(self._message.value)})"
        )
