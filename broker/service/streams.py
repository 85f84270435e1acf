"""The domain side of producer and consumer streams: what a stream asks and what it is told.

The gRPC adapter turns protobuf messages into these and back; the service never sees ``_pb2``
classes of the wire protocol.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Literal

from broker.managed_ledger import Position
from magnetar.common.errors import MagnetarError


@dataclass(frozen=True, slots=True)
class Receipt:
    request_id: int
    sequence_id: int
    last_sequence_id: int
    position: Position
    first_offset: int
    publish_time_ms: int
    duplicate: bool = False


class SubscriptionType(enum.IntEnum):
    """Values match ``magnetar.common.v1.SubscriptionType``."""

    EXCLUSIVE = 1
    FAILOVER = 2
    SHARED = 3
    KEY_SHARED = 4


@dataclass(frozen=True, slots=True)
class MessageIdStart:
    ledger_id: int
    entry_id: int
    batch_index: int = -1


@dataclass(frozen=True, slots=True)
class OffsetStart:
    offset: int


@dataclass(frozen=True, slots=True)
class TimeStart:
    publish_time_ms: int


Start = Literal["earliest", "latest"] | MessageIdStart | OffsetStart | TimeStart


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    topic: str
    subscription: str
    subscription_type: SubscriptionType
    consumer_name: str
    start: Start
    durable: bool
    priority_level: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    whole_entries: bool = False
    """The consumer takes an entry whole or not at all: key_shared never splits an entry between
    consumers for it (Pulsar's clients, which do not acknowledge a part of a batch unless their
    batch-index acks are on, and whose key_shared brokers route an entry by its first key)."""


@dataclass(frozen=True, slots=True)
class DeliveryItem:
    position: Position
    payload: bytes
    num_messages: int
    redelivery_count: int = 0
    batch_indexes: tuple[int, ...] = ()
    payload_format: int = 0
    """``EntryEnvelope.format`` of ``payload``: what its batch holds."""


@dataclass(frozen=True, slots=True)
class Deliveries:
    items: list[DeliveryItem]
    grant: int = 0
    """The consumer's permit grant they were counted against (a seek starts a new one)."""


@dataclass(frozen=True, slots=True)
class AckDone:
    request_id: int


@dataclass(frozen=True, slots=True)
class SeekDone:
    request_id: int


@dataclass(frozen=True, slots=True)
class RequestFailed:
    request_id: int
    error: MagnetarError


@dataclass(frozen=True, slots=True)
class ActiveChange:
    active: bool


@dataclass(frozen=True, slots=True)
class StreamClosed:
    reason: MagnetarError
    end_of_topic: bool = False


@dataclass(frozen=True, slots=True)
class AuthChallenge:
    """The stream's credentials expired at ``expired_at_ms``: ask the client for fresh ones."""

    expired_at_ms: int


@dataclass(frozen=True, slots=True)
class ClientDone:
    """The client ended its side of the stream: the stream ends without another message."""


ConsumerEvent = (
    Deliveries
    | AckDone
    | SeekDone
    | RequestFailed
    | ActiveChange
    | StreamClosed
    | ClientDone
    | AuthChallenge
)


class Closable:
    """Something a broker may close under a client: it learns why through ``closed``."""

    def __init__(self) -> None:
        self.closed: asyncio.Future[MagnetarError] = asyncio.get_running_loop().create_future()

    def close_with(self, reason: MagnetarError) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)

    @property
    def is_closed(self) -> bool:
        return self.closed.done()
