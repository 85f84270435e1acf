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

import time
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
from proto.pulsar import PulsarApi_pb2

__all__ = [
    "MAX_INFLATED_BYTES",
    "BatchBuilder",
    "DecodedEntry",
    "SealedBatch",
    "compress",
    "decode_entry",
    "decompress",
    "encode_extras",
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


MAX_INFLATED_BYTES = 64 * 1024 * 1024
"""No batch inflates past this (a broker's largest gRPC message): what a producer could have
sent uncompressed."""


def decompress(
    data: bytes,
    compression: int,
    uncompressed_size: int = 0,
    max_bytes: int = MAX_INFLATED_BYTES,
) -> bytes:
    """The batch ``data`` holds, inflated to no more than its declared ``uncompressed_size``
    (and ``max_bytes``): a zlib bomb, a size that lies, trailing bytes or a truncated stream
    are :class:`CorruptionError`, found without inflating past the declared size."""
    if compression in (types_pb2.COMPRESSION_TYPE_NONE, types_pb2.COMPRESSION_TYPE_UNSPECIFIED):
        return data
    if compression == types_pb2.COMPRESSION_TYPE_ZLIB:
        if not 0 < uncompressed_size <= max_bytes:
            raise CorruptionError(
                f"a zlib batch declares {uncompressed_size} bytes uncompressed; it must be"
                f" between 1 and {max_bytes}",
                context={"uncompressed_size": uncompressed_size},
            )
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(data, uncompressed_size + 1)
        except zlib.error as e:
            raise CorruptionError(f"a zlib batch does not decompress: {e}") from None
        if len(raw) > uncompressed_size or inflater.unconsumed_tail:
            raise CorruptionError(
                f"a zlib batch inflates past its declared {uncompressed_size} bytes",
                context={"uncompressed_size": uncompressed_size},
            )
        if not inflater.eof or inflater.unused_data or len(raw) != uncompressed_size:
            raise CorruptionError(
                f"a zlib batch inflates to {len(raw)} bytes, not its declared"
                f" {uncompressed_size}, or does not end where its bytes end",
                context={"uncompressed_size": uncompressed_size},
            )
        return raw
    raise CorruptionError(
        f"unknown compression type {compression}", context={"compression": compression}
    )


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_HEADERS: dict[tuple[int, int], bytes] = {}
_HEADER_CACHE_LIMIT = 4096


def _header(value_len: int, rest_len: int) -> bytes:
    """The bytes before a message's value in a ``MessageBatch``: the ``messages`` tag and length,
    then the ``value`` tag and length. ``rest_len``: bytes of the message's other fields, which
    follow the value. Cached: a batch's messages mostly share a few sizes."""
    key = (value_len, rest_len)
    header = _HEADERS.get(key)
    if header is None:
        length = _varint(value_len)
        header = b"\x0a" + _varint(1 + len(length) + value_len + rest_len) + b"\x0a" + length
        if len(_HEADERS) < _HEADER_CACHE_LIMIT:
            _HEADERS[key] = header
    return header


def encode_extras(
    partition_key: str | None, properties: Mapping[str, str] | None, event_time_ms: int
) -> bytes:
    """A ``BatchedMessage``'s fields other than its value, encoded (empty for a plain message).
    Protobuf accepts fields in any order, so they follow the value in the batch."""
    if partition_key is None and not properties and not event_time_ms:
        return b""
    return entry_pb2.BatchedMessage(
        partition_key=partition_key, properties=properties, event_time_ms=event_time_ms
    ).SerializeToString()


@dataclass(frozen=True, slots=True)
class SealedBatch(Generic[H]):
    """A batch ready for the wire: one entry's worth of messages and the handles waiting on them."""

    sequence_id: int
    last_sequence_id: int
    payload: bytes
    """The serialized MessageBatch, compressed as ``compression`` says."""
    compression: int
    uncompressed_size: int
    parts: Sequence[tuple[H, int]]
    """``(handle, count)`` in batch order: each handle covers the next ``count`` messages (one
    for a single send, a run of them for ``send_many``)."""
    num_messages: int
    first_added_at: float
    """Clock reading when the first message entered the batch."""
    key_hashes: Sequence[int] = ()
    """Routing hashes of the messages' keys, as :func:`batch_key_hashes` gives them."""
    deliver_at_ms: int = 0
    """Deliver no earlier than this (ms since the epoch); 0: at once."""


class BatchBuilder(Generic[H]):
    """Gathers one partition's messages until a limit is reached; :meth:`seal` encodes them.

    ``add`` never refuses: the caller asks :meth:`has_room_for` first and seals when there is no
    room, so a batch holds at least one message however large it is. Likewise the caller seals
    before a message whose delivery time differs from the batch's (:attr:`deliver_at_ms`).
    ``add_many`` takes as many messages of a run as fit (at least one into an empty batch).

    Messages are encoded as they are added, straight into the bytes of a ``MessageBatch`` (a
    cached header per value size, then the value): no protobuf object per message, and sealing
    is one join.
    """

    def __init__(
        self, *, max_messages: int, max_bytes: int, compression: CompressionName = "none"
    ) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise InvalidArgumentError("a batch needs max_messages >= 1 and max_bytes >= 1")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._compression = COMPRESSION_TYPES[compression]
        self._chunks: list[bytes] = []
        self._parts: list[tuple[H, int]] = []
        self._count = 0
        self._bytes = 0
        self._first_added_at = 0.0
        self._keys: list[str | None] = []
        self._keyed = False
        self._deliver_at_ms = 0

    def __len__(self) -> int:
        return self._count

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
        if not self._count:
            return True
        return self._count < self.max_messages and self._bytes + size <= self.max_bytes

    def is_full(self) -> bool:
        return self._count >= self.max_messages or self._bytes >= self.max_bytes

    def _start(self, now: float, deliver_at_ms: int) -> None:
        if not self._count:
            self._first_added_at = now
            self._deliver_at_ms = deliver_at_ms
        elif deliver_at_ms != self._deliver_at_ms:
            raise InvalidArgumentError(
                f"a batch delivered at {self._deliver_at_ms} cannot take a message delivered at"
                f" {deliver_at_ms}: seal it first"
            )

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
        self._start(now, deliver_at_ms)
        extras = encode_extras(partition_key, properties, event_time_ms)
        chunks = self._chunks
        chunks.append(_header(len(content), len(extras)))
        chunks.append(content)
        if extras:
            chunks.append(extras)
        self._parts.append((handle, 1))
        self._count += 1
        self._keys.append(partition_key)
        if partition_key is not None:
            self._keyed = True
        self._bytes += (
            size if size is not None else message_size(content, partition_key, properties)
        )

    def add_plain(self, content: bytes, handle: H, size: int) -> None:
        """:meth:`add` of a message with nothing but its value (no key, properties, event or
        delivery time): the per-message fast path. ``size`` is :func:`message_size`'s."""
        if not self._count:
            self._first_added_at = time.monotonic()
            self._deliver_at_ms = 0
        length = len(content)
        chunks = self._chunks
        chunks.append(_HEADERS.get((length, 0)) or _header(length, 0))
        chunks.append(content)
        self._parts.append((handle, 1))
        self._count += 1
        self._keys.append(None)
        self._bytes += size

    def add_many(
        self,
        contents: Sequence[bytes],
        start: int,
        handle: H,
        *,
        partition_key: str | None = None,
        properties: Mapping[str, str] | None = None,
        event_time_ms: int = 0,
        extras: bytes | None = None,
        overhead: int | None = None,
        now: float = 0.0,
        deliver_at_ms: int = 0,
    ) -> int:
        """Add ``contents[start:]`` (messages sharing key, properties and event time) until the
        batch is full; how many were taken (at least one into an empty batch). ``extras`` and
        ``overhead`` (bytes a message adds beyond its value) may be given precomputed."""
        self._start(now, deliver_at_ms)
        if extras is None:
            extras = encode_extras(partition_key, properties, event_time_ms)
        if overhead is None:
            overhead = message_size(b"", partition_key, properties)
        room = self.max_messages - self._count
        taken = min(len(contents) - start, max(room, 0 if self._count else 1))
        if not taken:
            return 0
        run = contents[start : start + taken]
        size = sum(map(len, run)) + overhead * taken
        if self._count and self._bytes + size > self.max_bytes:
            # fewer fit by bytes: count them one by one (the run's sizes may differ)
            budget = self.max_bytes - self._bytes
            taken = 0
            for content in run:
                budget -= len(content) + overhead
                if budget < 0:
                    break
                taken += 1
            run = run[:taken]
            size = sum(map(len, run)) + overhead * taken
            if not taken:
                return 0
        elif not self._count and size > self.max_bytes:
            # an empty batch: as many as fit, and at least the first
            budget = self.max_bytes
            taken = 0
            for content in run:
                budget -= len(content) + overhead
                if budget < 0 and taken:
                    break
                taken += 1
            run = run[:taken]
            size = sum(map(len, run)) + overhead * taken
        chunks = self._chunks
        rest = len(extras)
        if extras:
            for content in run:
                chunks.append(_header(len(content), rest))
                chunks.append(content)
                chunks.append(extras)
        else:
            headers = _HEADERS
            for content in run:
                chunks.append(headers.get((len(content), 0)) or _header(len(content), 0))
                chunks.append(content)
        self._parts.append((handle, taken))
        self._count += taken
        self._keys.extend([partition_key] * taken)
        if partition_key is not None:
            self._keyed = True
        self._bytes += size
        return taken

    def seal(self, sequence_id: int) -> SealedBatch[H]:
        """Encode the batch with sequence ids from ``sequence_id`` on, and start a new one."""
        if not self._count:
            raise InvalidArgumentError("cannot seal an empty batch")
        raw = b"".join(self._chunks)
        sealed = SealedBatch(
            sequence_id=sequence_id,
            last_sequence_id=sequence_id + self._count - 1,
            payload=compress(raw, self._compression),
            compression=self._compression,
            uncompressed_size=len(raw),
            parts=self._parts,
            num_messages=self._count,
            first_added_at=self._first_added_at,
            key_hashes=tuple(batch_key_hashes(self._keys)) if self._keyed else (),
            deliver_at_ms=self._deliver_at_ms,
        )
        self._reset()
        return sealed

    def take_parts(self) -> list[tuple[H, int]]:
        """Empty the batch without encoding it; its ``(handle, count)`` parts (to fail them)."""
        parts = self._parts
        self._reset()
        return parts

    def _reset(self) -> None:
        self._chunks = []
        self._parts = []
        self._count = 0
        self._bytes = 0
        self._keys = []
        self._keyed = False
        self._deliver_at_ms = 0


@dataclass(frozen=True, slots=True)
class DecodedEntry:
    """One stored entry: the envelope's facts and the batch's messages, in batch order."""

    producer_name: str
    sequence_id: int
    publish_time_ms: int
    first_offset: int
    messages: Sequence[entry_pb2.BatchedMessage]


def _unconverted(envelope: entry_pb2.EntryEnvelope) -> str:
    """Why an entry of another format reached this client, naming its format and, for a Pulsar
    producer's, its compression and what the broker lacks to open it."""
    known = envelope.format in entry_pb2.EntryFormat.values()
    name = entry_pb2.EntryFormat.Name(envelope.format) if known else str(envelope.format)
    if envelope.format == entry_pb2.ENTRY_FORMAT_PULSAR and len(envelope.batch) >= 4:
        size = int.from_bytes(envelope.batch[:4], "big")
        try:
            metadata = PulsarApi_pb2.MessageMetadata.FromString(envelope.batch[4 : 4 + size])
        except DecodeError:
            metadata = PulsarApi_pb2.MessageMetadata()
        codec = PulsarApi_pb2.CompressionType.Name(metadata.compression)
        if metadata.compression in (PulsarApi_pb2.LZ4, PulsarApi_pb2.ZSTD, PulsarApi_pb2.SNAPPY):
            return (
                f"a delivered entry was written by a Pulsar producer ({name}) with {codec}"
                " compression, which the broker could not open (brokers open LZ4, ZSTD and"
                " SNAPPY only with the optional extra magnetar[pulsar-compression] installed,"
                " and only what decodes); consume it with a Pulsar client"
            )
        return (
            f"a delivered entry was written by a Pulsar producer ({name}, compression {codec})"
            " and does not decode; consume it with a Pulsar client"
        )
    return f"a delivered entry is of format {name}, which this client cannot read"


def decode_entry(data: bytes) -> DecodedEntry:
    """Unpack a serialized ``EntryEnvelope``; :class:`CorruptionError` if it does not parse."""
    try:
        envelope = entry_pb2.EntryEnvelope.FromString(data)
        if envelope.format != entry_pb2.ENTRY_FORMAT_UNSPECIFIED:
            # a Pulsar producer's entry (stored as it sent it), which the broker did not turn
            # into a MessageBatch; see docs/pulsar-compatibility.md
            raise CorruptionError(_unconverted(envelope), context={"format": envelope.format})
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
