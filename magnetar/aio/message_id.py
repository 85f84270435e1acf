"""Message ids: where a message lives in its partition, as applications see and store them.

A message id is ``(ledger_id, entry_id, batch_index)`` plus the partition. Ids of one partition
are totally ordered in the order the partition stores the messages; ids of different partitions
are not comparable in any meaningful way (ledger ids are unique cluster-wide, so they never
collide, but their order says nothing about time). ``batch_size`` travels with an id a consumer
hands out, so that acknowledging by id alone still lets the client track partial batch acks; it
takes no part in comparisons or hashing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from google.protobuf.message import DecodeError

from magnetar.common.errors import InvalidArgumentError
from proto.common.v1 import types_pb2

__all__ = ["MessageId"]

_INT64_MAX = 2**63 - 1


@dataclass(frozen=True, order=True, slots=True)
class MessageId:
    """The id of one message: the entry holding its batch, and its index in that batch.

    ``MessageId.earliest`` and ``MessageId.latest`` are sentinels for readers and seeks: before
    the first and after the last message of a partition.
    """

    ledger_id: int
    entry_id: int
    batch_index: int = -1
    """Index in the batch; -1 addresses the whole entry."""
    partition: int = -1
    """Partition index; -1 for a non-partitioned topic."""
    batch_size: int = field(default=0, compare=False)
    """Messages in the batch when known (0: unknown); not part of equality or order."""

    earliest: ClassVar[MessageId]
    latest: ClassVar[MessageId]

    def serialize(self) -> bytes:
        """Bytes that :meth:`deserialize` turns back into an equal id (the wire ``MessageId``)."""
        return types_pb2.MessageId(
            ledger_id=self.ledger_id,
            entry_id=self.entry_id,
            batch_index=self.batch_index,
            partition=self.partition,
            batch_size=self.batch_size,
        ).SerializeToString()

    @classmethod
    def deserialize(cls, data: bytes) -> MessageId:
        try:
            wire = types_pb2.MessageId.FromString(data)
        except DecodeError as e:
            raise InvalidArgumentError(f"not a serialized message id: {e}") from None
        return cls(wire.ledger_id, wire.entry_id, wire.batch_index, wire.partition, wire.batch_size)

    @property
    def entry(self) -> tuple[int, int]:
        """``(ledger_id, entry_id)``: the entry holding the message."""
        return (self.ledger_id, self.entry_id)

    def is_earliest(self) -> bool:
        return (self.ledger_id, self.entry_id) == (-1, -1)

    def is_latest(self) -> bool:
        return (self.ledger_id, self.entry_id) == (_INT64_MAX, _INT64_MAX)

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}:{self.batch_index}:{self.partition}"


MessageId.earliest = MessageId(-1, -1, -1, -1)
MessageId.latest = MessageId(_INT64_MAX, _INT64_MAX, -1, -1)
