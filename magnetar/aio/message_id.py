"""Message ids: where a message lives in its partition, as applications see and store them.

A message id is ``(ledger_id, entry_id, batch_index)`` plus the partition. Ids of one partition
are totally ordered in the order the partition stores the messages; ids of different partitions
are not comparable in any meaningful way (ledger ids are unique cluster-wide, so they never
collide, but their order says nothing about time). ``batch_size`` travels with an id a consumer
hands out, so that acknowledging by id alone still lets the client track partial batch acks; it
takes no part in comparisons or hashing.
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar

from google.protobuf.message import DecodeError

from magnetar.common.errors import InvalidArgumentError
from proto.common.v1 import types_pb2

__all__ = ["MessageId"]

_INT64_MAX = 2**63 - 1


class MessageId(tuple[int, int, int, int, int]):
    """The id of one message: the entry holding its batch, and its index in that batch.

    ``MessageId(ledger_id, entry_id, batch_index=-1, partition=-1, batch_size=0)``; immutable
    and hashable. Equality, hashing and order use the first four fields (``batch_size`` is
    carried along, not compared). ``MessageId.earliest`` and ``MessageId.latest`` are
    sentinels for readers and seeks: before the first and after the last message of a
    partition.

    (A tuple underneath: the client builds one per message it confirms or hands out, and a
    tuple is several times cheaper to make than a frozen dataclass.)
    """

    __slots__ = ()

    if TYPE_CHECKING:  # read-only fields, as the type checker sees them

        @property
        def ledger_id(self) -> int: ...
        @property
        def entry_id(self) -> int: ...
        @property
        def batch_index(self) -> int:
            """Index in the batch; -1 addresses the whole entry."""

        @property
        def partition(self) -> int:
            """Partition index; -1 for a non-partitioned topic."""

        @property
        def batch_size(self) -> int:
            """Messages in the batch when known (0: unknown); not part of equality or order."""

    else:  # C-level getters
        ledger_id = property(itemgetter(0))
        entry_id = property(itemgetter(1))
        batch_index = property(itemgetter(2), doc="Index in the batch; -1: the whole entry.")
        partition = property(itemgetter(3), doc="Partition index; -1: not partitioned.")
        batch_size = property(
            itemgetter(4), doc="Messages in the batch when known (0: unknown); not compared."
        )

    earliest: ClassVar[MessageId]
    latest: ClassVar[MessageId]

    def __new__(
        cls,
        ledger_id: int,
        entry_id: int,
        batch_index: int = -1,
        partition: int = -1,
        batch_size: int = 0,
    ) -> MessageId:
        return tuple.__new__(cls, (ledger_id, entry_id, batch_index, partition, batch_size))

    def __getnewargs__(self) -> tuple[int, int, int, int, int]:
        return (self[0], self[1], self[2], self[3], self[4])

    # Only ids compare with ids. A plain tuple is not an id: == is False and ordering raises,
    # rather than letting tuple comparison look at batch_size.

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessageId):
            return self[:4] == other[:4]
        return False if isinstance(other, tuple) else NotImplemented

    def __ne__(self, other: object) -> bool:
        if isinstance(other, MessageId):
            return self[:4] != other[:4]
        return True if isinstance(other, tuple) else NotImplemented

    def __hash__(self) -> int:
        return hash(self[:4])

    def __lt__(self, other: Any) -> bool:
        return self[:4] < _key_of(other)

    def __le__(self, other: Any) -> bool:
        return self[:4] <= _key_of(other)

    def __gt__(self, other: Any) -> bool:
        return self[:4] > _key_of(other)

    def __ge__(self, other: Any) -> bool:
        return self[:4] >= _key_of(other)

    def serialize(self) -> bytes:
        """Bytes that :meth:`deserialize` turns back into an equal id (the wire ``MessageId``)."""
        return types_pb2.MessageId(
            ledger_id=self[0],
            entry_id=self[1],
            batch_index=self[2],
            partition=self[3],
            batch_size=self[4],
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
        return (self[0], self[1])

    def is_earliest(self) -> bool:
        return self[0] == -1 and self[1] == -1

    def is_latest(self) -> bool:
        return self[0] == _INT64_MAX and self[1] == _INT64_MAX

    def __str__(self) -> str:
        return f"{self[0]}:{self[1]}:{self[2]}:{self[3]}"

    def __repr__(self) -> str:
        return (
            f"MessageId(ledger_id={self[0]}, entry_id={self[1]}, batch_index={self[2]},"
            f" partition={self[3]}, batch_size={self[4]})"
        )


def _key_of(other: object) -> tuple[int, ...]:
    if isinstance(other, MessageId):
        return other[:4]
    raise TypeError(f"a MessageId compares only with a MessageId, not {type(other).__name__}")


def make_message_id(fields: tuple[int, int, int, int, int]) -> MessageId:
    """``MessageId(*fields)`` without the keyword handling: the client's hot paths."""
    message_id: MessageId = _tuple_new(MessageId, fields)
    return message_id


_tuple_new: Any = tuple.__new__


MessageId.earliest = MessageId(-1, -1, -1, -1)
MessageId.latest = MessageId(_INT64_MAX, _INT64_MAX, -1, -1)
