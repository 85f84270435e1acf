"""The client's codec: message batches out, stored entries in. Pure: no I/O, no asyncio.

A producer packs the messages of one partition into a :class:`BatchBuilder`; sealing it gives the
bytes of one ``magnetar.format.v1.MessageBatch`` (optionally zlib-compressed), which the broker
stores as one entry wrapped in an ``EntryEnvelope`` and never unpacks. What the broker must know
of the messages without unpacking them travels beside the bytes: their key hashes (key_shared
routing, :mod:`magnetar.common.keys`) and the time before which they must not be delivered (one
per batch: a message with another delivery time starts a new batch). A consumer turns each
delivered envelope back into its messages with :func:`decode_entry`.

Batching is the client's main lever on throughput: every gRPC stream message costs about 0.2 ms
of Python time on each side, so one entry carries up to ``batching_max_messages`` messages.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import DecodeError

from magnetar.aio.config import CompressionName
from magnetar.common.errors import CorruptionError, InvalidArgumentError
from magnetar.common.keys import batch_key_hashes
from proto.common.v1 import types_pb2
from proto.format.v1 import entry_pb2

__all__ = [
    "BatchBuilder",
    "DecodedEntry",
    "SealedBatch",
    "compress",
    "decode_entry",
    "decompress",
    "message_size",
]

H = TypeVar("H")

COMPRESSION_TYPES: Mapping[str, int] = {
    "none": types_pb2.COMPRESSION_TYPE_NONE,
    "zlib": types_pb2.COMPRESSION_TYPE_ZLIB,
}
_PER_MESSAGE_OVERHEAD = 16
"""Bytes a batched message costs beyond its value, key and properties (tags and lengths)."""


def message_size(
    content: bytes, partition_key: str | None, properties: Mapping[str, str] | None
) -> int:
    """What one message adds to its batch, closely enough for batch limits and size checks."""
    size = len(content) + _PER_MESSAGE_OVERHEAD
    if partition_key is not None:
        size += len(partition_key)
    if properties:
        size += sum(len(k) + len(v) + 8 for k, v in properties.items())
    return size


def compress(raw: bytes, compression: int) -> bytes:
    if compression == types_pb2.COMPRESSION_TYPE_ZLIB:
        return zlib.compress(raw)
    return raw


def decompress(data: bytes, compression: int, uncompressed_size: int = 0) -> bytes:
    if compression in (types_pb2.COMPRESSION_TYPE_NONE, types_pb2.COMPRESSION_TYPE_UNSPECIFIED):
        return data
    if compression == types_pb2.COMPRESSION_TYPE_ZLIB:
        try:
            return zlib.decompress(data, bufsize=max(uncompressed_size, zlib.DEF_BUF_SIZE))
        except zlib.error as e:
            raise CorruptionError(f"a zlib batch does not decompress: {e}") from None
    raise CorruptionError(
        f"unknown compression type {compression}", context={"compression": compression}
    )


@dataclass(frozen=True, slots=True)
class SealedBatch(Generic[H]):
    """A batch ready for the wire: one entry's worth of messages and their handles."""

    sequence_id: int
    last_sequence_id: int
    payload: bytes
    """The serialized MessageBatch, compressed as ``compression`` says."""
    compression: int
    uncompressed_size: int
    handles: Sequence[H]
    """One per message, in batch order (the producer's futures and callbacks)."""
    first_added_at: float
    """Clock reading when the first message entered the batch."""
    key_hashes: Sequence[int] = ()
    """Routing hashes of the messages' keys, as :func:`batch_key_hashes` gives them."""
    deliver_at_ms: int = 0
    """Deliver no earlier than this (ms since the epoch); 0: at once."""

    @property
    def num_messages(self) -> int:
        return len(self.handles)


class BatchBuilder(Generic[H]):
    """Gathers one partition's messages until a limit is reached; :meth:`seal` encodes them.

    ``add`` never refuses: the caller asks :meth:`has_room_for` first and seals when there is no
    room, so a batch holds at least one message however large it is. Likewise the caller seals
    before a message whose delivery time differs from the batch's (:attr:`deliver_at_ms`).
    """

    def __init__(
        self, *, max_messages: int, max_bytes: int, compression: CompressionName = "none"
    ) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise InvalidArgumentError("a batch needs max_messages >= 1 and max_bytes >= 1")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._compression = COMPRESSION_TYPES[compression]
        self._batch = entry_pb2.MessageBatch()
        self._handles: list[H] = []
        self._bytes = 0
        self._first_added_at = 0.0
        self._keys: list[str | None] = []
        self._deliver_at_ms = 0

    def __len__(self) -> int:
        return len(self._handles)

    @property
    def size_bytes(self) -> int:
        """Estimated bytes of the messages added so far."""
        return self._bytes

    @property
    def first_added_at(self) -> float:
        return self._first_added_at

    @property
    def deliver_at_ms(self) -> int:
        """The delivery time of the messages in the batch (0: at once, or an empty batch)."""
        return self._deliver_at_ms

    def has_room_for(self, size: int) -> bool:
        """Whether a message of ``size`` bytes fits (an empty batch takes any message)."""
        if not self._handles:
            return True
        return len(self._handles) < self.max_messages and self._bytes + size <= self.max_bytes

    def is_full(self) -> bool:
        return len(self._handles) >= self.max_messages or self._bytes >= self.max_bytes

    def add(
        self,
        content: bytes,
        handle: H,
        *,
        partition_key: str | None = None,
        properties: Mapping[str, str] | None = None,
        event_time_ms: int = 0,
        size: int | None = None,
        now: float = 0.0,
        deliver_at_ms: int = 0,
    ) -> None:
        if self._handles and deliver_at_ms != self._deliver_at_ms:
            raise InvalidArgumentError(
                f"a batch delivered at {self._deliver_at_ms} cannot take a message delivered at"
                f" {deliver_at_ms}: seal it first"
            )
        message = self._batch.messages.add(value=content, event_time_ms=event_time_ms)
        if partition_key is not None:
            message.partition_key = partition_key
        if properties:
            message.properties.update(properties)
        if not self._handles:
            self._first_added_at = now
            self._deliver_at_ms = deliver_at_ms
        self._handles.append(handle)
        self._keys.append(partition_key)
        self._bytes += (
            size if size is not None else message_size(content, partition_key, properties)
        )

    def seal(self, sequence_id: int) -> SealedBatch[H]:
        """Encode the batch with sequence ids from ``sequence_id`` on, and start a new one."""
        if not self._handles:
            raise InvalidArgumentError("cannot seal an empty batch")
        raw = self._batch.SerializeToString()
        sealed = SealedBatch(
            sequence_id=sequence_id,
            last_sequence_id=sequence_id + len(self._handles) - 1,
            payload=compress(raw, self._compression),
            compression=self._compression,
            uncompressed_size=len(raw),
            handles=self._handles,
            first_added_at=self._first_added_at,
            key_hashes=tuple(batch_key_hashes(self._keys)),
            deliver_at_ms=self._deliver_at_ms,
        )
        self._reset()
        return sealed

    def take_handles(self) -> list[H]:
        """Empty the batch without encoding it; the handles of its messages (to fail them)."""
        handles = self._handles
        self._reset()
        return handles

    def _reset(self) -> None:
        self._batch = entry_pb2.MessageBatch()
        self._handles = []
        self._bytes = 0
        self._keys = []
        self._deliver_at_ms = 0


@dataclass(frozen=True, slots=True)
class DecodedEntry:
    """One stored entry: the envelope's facts and the batch's messages, in batch order."""

    producer_name: str
    sequence_id: int
    publish_time_ms: int
    first_offset: int
    messages: Sequence[entry_pb2.BatchedMessage]


def decode_entry(data: bytes) -> DecodedEntry:
    """Unpack a serialized ``EntryEnvelope``; :class:`CorruptionError` if it does not parse."""
    try:
        envelope = entry_pb2.EntryEnvelope.FromString(data)
        raw = decompress(envelope.batch, envelope.compression, envelope.uncompressed_size)
        batch = entry_pb2.MessageBatch.FromString(raw)
    except DecodeError as e:
        raise CorruptionError(f"a delivered entry does not parse: {e}") from None
    return DecodedEntry(
        producer_name=envelope.producer_name,
        sequence_id=envelope.sequence_id,
        publish_time_ms=envelope.publish_time_ms,
        first_offset=envelope.first_offset,
        messages=batch.messages,
    )
