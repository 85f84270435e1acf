"""A received message: its payload, key, properties and where it lives."""

from __future__ import annotations

from magnetar.aio.message_id import MessageId, make_message_id
from proto.format.v1 import entry_pb2

__all__ = ["EntryFacts", "Message", "received_monotonic", "stream_opened_monotonic"]


class EntryFacts:
    """What the messages of one delivered entry share: built once per entry, not per message."""

    __slots__ = (
        "batch_size",
        "entry",
        "entry_id",
        "first_offset",
        "ledger_id",
        "owner",
        "partition",
        "producer_name",
        "publish_time_ms",
        "received_monotonic",
        "redelivery_count",
        "sequence_id",
        "stream_opened_monotonic",
        "topic",
    )

    def __init__(
        self,
        *,
        ledger_id: int,
        entry_id: int,
        partition: int,
        batch_size: int,
        first_offset: int,
        publish_time_ms: int,
        redelivery_count: int,
        topic: str,
        producer_name: str,
        sequence_id: int,
        received_monotonic: float = 0.0,
        stream_opened_monotonic: float = 0.0,
        owner: object = None,
    ) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.entry = (ledger_id, entry_id)
        """``(ledger_id, entry_id)``, shared by the entry's messages."""
        self.owner = owner
        """The partition consumer that received the entry (acks of its messages go to it)."""
        self.partition = partition
        self.batch_size = batch_size
        self.first_offset = first_offset
        self.publish_time_ms = publish_time_ms
        self.redelivery_count = redelivery_count
        self.topic = topic
        self.producer_name = producer_name
        self.sequence_id = sequence_id
        """The producer's sequence id of the entry's first message."""
        self.received_monotonic = received_monotonic
        """When the client got the entry from the broker (``time.monotonic()``)."""
        self.stream_opened_monotonic = stream_opened_monotonic
        """When the consumer stream the entry came on was opened (``time.monotonic()``)."""


class Message:
    """One message as a consumer or reader receives it.

    Accessors are methods, as in the Pulsar client: ``msg.data()``, ``msg.message_id()``. A
    message is three references (its entry's shared facts, its batched message, its index);
    the id and the rest are worked out when asked for.
    """

    __slots__ = ("_entry", "_id", "_index", "_message")

    def __init__(self, entry: EntryFacts, message: entry_pb2.BatchedMessage, index: int) -> None:
        self._entry = entry
        self._message = message
        self._index = index
        self._id: MessageId | None = None

    def data(self) -> bytes:
        """The payload, as the producer sent it."""
        return self._message.value

    def size(self) -> int:
        """Bytes of the payload."""
        return len(self._message.value)

    def partition_key(self) -> str | None:
        """The key the producer routed the message by; None for a keyless message."""
        return self._message.partition_key if self._message.HasField("partition_key") else None

    def properties(self) -> dict[str, str]:
        properties = self._message.properties
        # most messages carry none: an empty protobuf map is cheaper to test than to copy
        return dict(properties) if properties else {}

    def message_id(self) -> MessageId:
        message_id = self._id
        if message_id is None:
            entry = self._entry
            message_id = self._id = make_message_id(
                (entry.ledger_id, entry.entry_id, self._index, entry.partition, entry.batch_size)
            )
        return message_id

    def offset(self) -> int:
        """The message's dense, per-partition offset (from 0, no gaps)."""
        return self._entry.first_offset + self._index

    def publish_timestamp(self) -> int:
        """When the broker stored the message (ms since the epoch, broker clock)."""
        return self._entry.publish_time_ms

    def event_timestamp(self) -> int:
        """The application's event time (ms since the epoch); 0 when the producer set none."""
        return self._message.event_time_ms

    def redelivery_count(self) -> int:
        """How often the broker delivered this message before (0 on first delivery)."""
        return self._entry.redelivery_count

    def topic_name(self) -> str:
        """The partition (``topic-partition-N``) or non-partitioned topic it came from."""
        return self._entry.topic

    def producer_name(self) -> str:
        return self._entry.producer_name

    def sequence_id(self) -> int:
        """The producer's sequence id for this message (what deduplication is keyed on)."""
        return self._entry.sequence_id + self._index

    def __repr__(self) -> str:
        return (
            f"Message(topic={self._entry.topic!r}, id={self.message_id()},"
            f" offset={self.offset()}, size={self.size()})"
        )


def received_monotonic(message: Message) -> float:
    """When the client got ``message`` from the broker, on ``time.monotonic()``: before the
    application received it, perhaps long before if it waited in the consumer's queue. For
    tools that reason about delivery times (``magnetar verify``), not part of the Pulsar-style
    API."""
    return message._entry.received_monotonic


def stream_opened_monotonic(message: Message) -> float:
    """When the consumer stream ``message`` came on was opened (the broker answered the
    subscribe), on ``time.monotonic()``. The broker sent the message on that stream at some
    time after this. For tools that reason about delivery times (``magnetar verify``), not part
    of the Pulsar-style API."""
    return message._entry.stream_opened_monotonic
