"""What a topic's entries hold: the producer's batch, wrapped in an ``EntryEnvelope``.

The broker never unpacks a producer's batch, in either of the formats an entry can hold
(``EntryEnvelope.format``: a Magnetar client's ``MessageBatch``, or what a Pulsar producer
sent). It wraps the bytes as sent with what the log must know about them (producer, sequence
ids, message count, publish time, first offset), and the managed ledger learns an entry's
offsets and publish time through :class:`EnvelopeCodec`.
"""

from __future__ import annotations

from dataclasses import dataclass

from bookie.client.wire import varint
from broker.managed_ledger import EntryMeta
from magnetar.common.errors import CorruptionError
from proto.format.v1 import entry_pb2

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class IncomingBatch:
    """A producer's batch as received: stored as one entry."""

    request_id: int
    sequence_id: int
    last_sequence_id: int
    num_messages: int
    batch: bytes
    compression: int
    uncompressed_size: int
    key_hashes: tuple[int, ...] = ()
    deliver_at_ms: int = 0
    format: int = entry_pb2.ENTRY_FORMAT_UNSPECIFIED
    """What ``batch`` holds: a Magnetar ``MessageBatch`` (unspecified), or
    ``ENTRY_FORMAT_PULSAR``: a Pulsar producer's ``[metadata_size][MessageMetadata][payload]``."""
    chunk_id: int = 0
    num_chunks: int = 0
    """A chunk of a larger message (a Pulsar producer's chunking): its index and the message's
    chunk count (0: not a chunk). Every chunk carries the message's sequence id."""

    @property
    def is_chunk(self) -> bool:
        return self.num_chunks > 1

    @property
    def completes_message(self) -> bool:
        """Whether storing this entry completes a message: not a chunk, or its last chunk."""
        return self.num_chunks <= 1 or self.chunk_id == self.num_chunks - 1


_BATCH_TAG = bytes(((15 << 3) | 2,))
"""The key of ``EntryEnvelope.batch`` (field 15, length-delimited): one byte."""


def envelope_head(
    producer_name: str, batch: IncomingBatch, first_offset: int, publish_time_ms: int
) -> entry_pb2.EntryEnvelope:
    """The entry's envelope, every field but ``batch`` set."""
    return entry_pb2.EntryEnvelope(
        format_version=FORMAT_VERSION,
        producer_name=producer_name,
        sequence_id=batch.sequence_id,
        last_sequence_id=batch.last_sequence_id,
        num_messages=batch.num_messages,
        publish_time_ms=publish_time_ms,
        first_offset=first_offset,
        compression=batch.compression,  # type: ignore[arg-type]
        uncompressed_size=batch.uncompressed_size,
        key_hashes=batch.key_hashes,
        deliver_at_ms=batch.deliver_at_ms,
        format=batch.format,  # type: ignore[arg-type]
        chunk_id=batch.chunk_id,
        num_chunks=batch.num_chunks,
    )


def build_envelope(
    producer_name: str, batch: IncomingBatch, first_offset: int, publish_time_ms: int
) -> bytes:
    """The entry's bytes: the envelope's other fields, serialized by protobuf, then ``batch``
    (the highest field number, so last in protobuf's own order) as its key, length and the
    producer's bytes, joined once. The bytes are exactly those of protobuf serializing the
    whole envelope, without protobuf copying a large batch into a message and out again
    (~150 us for 128 KiB, where the join costs a few)."""
    head = envelope_head(producer_name, batch, first_offset, publish_time_ms).SerializeToString()
    if not batch.batch:
        return head  # proto3 leaves an empty field out
    return b"".join((head, _BATCH_TAG, varint(len(batch.batch)), batch.batch))


def parse_envelope(payload: bytes) -> entry_pb2.EntryEnvelope:
    envelope = entry_pb2.EntryEnvelope()
    try:
        envelope.ParseFromString(payload)
    except Exception as e:  # protobuf raises DecodeError, a bare Exception subclass
        raise CorruptionError(f"an entry is not a valid envelope: {e}") from e
    return envelope


class EnvelopeCodec:
    """Tells the managed ledger an entry's first offset, message count and publish time."""

    def describe(self, payload: bytes) -> EntryMeta:
        envelope = parse_envelope(payload)
        return EntryMeta(
            first_offset=envelope.first_offset,
            num_messages=max(1, envelope.num_messages),
            publish_time_ms=envelope.publish_time_ms,
            key_hashes=tuple(envelope.key_hashes),
            deliver_at_ms=envelope.deliver_at_ms,
            payload_format=envelope.format,
        )


@dataclass(frozen=True, slots=True)
class ProducedBy:
    """Who stored an entry, as deduplication replays it."""

    producer_name: str
    last_sequence_id: int
    chunk_id: int = 0
    num_chunks: int = 0

    @property
    def completes_message(self) -> bool:
        return self.num_chunks <= 1 or self.chunk_id == self.num_chunks - 1


def producer_of(payload: bytes) -> ProducedBy:
    """Producer name, last sequence id and chunk of a stored entry: what deduplication replays."""
    envelope = parse_envelope(payload)
    return ProducedBy(
        envelope.producer_name,
        envelope.last_sequence_id,
        envelope.chunk_id,
        envelope.num_chunks,
    )
