"""Entries as a Pulsar producer sent them, and what a Pulsar consumer gets of an entry.

A SEND's checksummed part, ``[metadata_size][MessageMetadata][payload]``, is stored as it came,
tagged ``ENTRY_FORMAT_PULSAR`` in its envelope (:mod:`broker.service.envelope`): a Pulsar
consumer later gets exactly those bytes, compression and batching included, with no
transcoding. What the log must know beside them (message count, sequence ids, delivery time,
key hashes for key_shared routing) is read from the metadata here.

Both protocols read one topic: a Pulsar consumer may meet entries of Magnetar's own clients
(``MessageBatch``), which :func:`pulsar_metadata_and_payload` rewrites as an uncompressed Pulsar
batch, and a Magnetar consumer entries of Pulsar producers, which :func:`magnetar_entry`
rewrites as a ``MessageBatch``; each message keeps its value, key, properties and event time.
Compressed payloads are opened by :mod:`broker.pulsar.compression`: every one on SEND, so that
what is stored decodes for every consumer (a bad one gets SEND_ERROR), and again when a Magnetar
consumer reads it. Without the optional extra ``pulsar-compression`` (cramjam), LZ4, ZSTD and
SNAPPY payloads cannot be opened: they are stored unchecked and stay Pulsar entries for
Magnetar consumers, which cannot read them.
A chunk of a chunked message (a part of one, which only a Pulsar consumer puts together)
stays a Pulsar entry too: a Magnetar client gets it as it is and skips it, naming its format.

Pure functions over bytes, no I/O.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from broker.pulsar.codec import (
    Payload,
    PulsarFrameError,
    decode_batch,
    encode_batch,
    encode_metadata_and_payload,
)
from broker.pulsar.compression import Decoded, decompress
from broker.service.envelope import IncomingBatch, parse_envelope
from broker.service.validation import BatchLimits, inflate
from magnetar.common.errors import (
    CorruptionError,
    InvalidArgumentError,
    MagnetarError,
    MessageTooLargeError,
    ProtocolError,
)
from magnetar.common.keys import key_hash
from proto.common.v1 import types_pb2
from proto.format.v1 import entry_pb2
from proto.pulsar import PulsarApi_pb2 as api


class UnsupportedFeatureError(InvalidArgumentError):
    """A Pulsar feature this broker does not offer yet (the message names it)."""


def _text(value: object) -> str:
    """A metadata string: the protobuf runtime gives ``bytes`` for one that is not UTF-8."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _message_key(key: object, ordering_key: bytes) -> str:
    """The key key_shared routes a message by: its ordering key if set, else its key."""
    if ordering_key:
        return ordering_key.decode("utf-8", "replace")
    return _text(key)


def _opened(
    metadata: api.MessageMetadata, payload: memoryview, limit: int
) -> Decoded | memoryview | None:
    """The payload's uncompressed bytes (a message's, or a batch's), or None when it is
    compressed with a codec this broker cannot open (LZ4, ZSTD, SNAPPY without the optional
    extra ``pulsar-compression``: stored and delivered to Pulsar consumers as sent, unopened).
    Raises as :func:`broker.pulsar.compression.decompress` does."""
    if metadata.compression == api.NONE:
        return payload
    return decompress(metadata.compression, payload, metadata.uncompressed_size, limit)


def incoming_batch(
    payload: Payload, *, sequence_id: int, highest_sequence_id: int, limits: BatchLimits
) -> IncomingBatch:
    """What the service stores for one SEND, after the checks a Pulsar broker makes.

    Raises :class:`MessageTooLargeError` (a payload, or the uncompressed size it declares, over
    the limit), :class:`ProtocolError` (a payload that does not decode, or a batch that is not
    what its metadata says, where this broker can open it) or :class:`UnsupportedFeatureError`.
    """
    metadata = payload.metadata
    size = len(payload.payload)
    if size > limits.max_message_bytes:
        raise MessageTooLargeError(
            f"a message of {size:,} bytes is over the broker's limit of"
            f" {limits.max_message_bytes:,} bytes",
            context={"size": size, "limit": limits.max_message_bytes},
        )
    chunk_id, num_chunks = _chunk_of(metadata)
    if metadata.encryption_keys:
        raise UnsupportedFeatureError("encrypted messages are not supported yet")
    batched = metadata.HasField("num_messages_in_batch")
    count = metadata.num_messages_in_batch if batched else 1
    keys: list[str] = []
    # every compressed payload is opened (and thrown away: the entry is stored as sent), so that
    # what is stored decodes for every consumer; see docs/pulsar-compatibility.md. Not a chunk:
    # the client compresses the whole message and then cuts it, so a chunk alone does not decode
    # (and the uncompressed size it declares is the whole message's, which may be over the limit)
    raw = None if num_chunks else _opened(metadata, payload.payload, limits.max_message_bytes)
    if batched:
        if raw is not None:
            try:
                messages = decode_batch(raw, count)
            except PulsarFrameError as e:
                raise ProtocolError(f"the batch is not what its metadata says: {e.message}") from e
            keys = [
                _message_key(m.metadata.partition_key, m.metadata.ordering_key) for m in messages
            ]
    else:
        keys = [_message_key(metadata.partition_key, metadata.ordering_key)]
    if keys and len(set(keys)) == 1:
        key_hashes: tuple[int, ...] = (key_hash(keys[0]),)
    else:
        key_hashes = tuple(key_hash(k) for k in keys)
    return IncomingBatch(
        request_id=sequence_id,
        sequence_id=sequence_id,
        last_sequence_id=max(sequence_id, highest_sequence_id),
        num_messages=count,
        batch=payload.metadata_and_payload,
        compression=0,
        uncompressed_size=0,
        key_hashes=key_hashes,
        deliver_at_ms=max(0, metadata.deliver_at_time),
        format=entry_pb2.ENTRY_FORMAT_PULSAR,
        chunk_id=chunk_id,
        num_chunks=num_chunks,
    )


def _chunk_of(metadata: api.MessageMetadata) -> tuple[int, int]:
    """``(chunk_id, num_chunks)`` of a chunk of a larger message (``(0, 0)`` for a whole one),
    after checking what a consumer relies on to put the message together again."""
    num_chunks = metadata.num_chunks_from_msg
    if num_chunks <= 1:
        return 0, 0
    chunk_id = metadata.chunk_id
    if not 0 <= chunk_id < num_chunks:
        raise ProtocolError(
            f"a chunk declares chunk_id={chunk_id} of num_chunks_from_msg={num_chunks:,}; it"
            f" must be 0 to {num_chunks - 1:,}"
        )
    if not metadata.uuid:
        raise ProtocolError("a chunk (num_chunks_from_msg > 1) needs the uuid of its message")
    if metadata.total_chunk_msg_size <= 0:
        raise ProtocolError(
            f"a chunk declares total_chunk_msg_size={metadata.total_chunk_msg_size}; the size"
            " of the whole message must be positive"
        )
    if metadata.HasField("num_messages_in_batch"):
        raise ProtocolError("a chunk cannot be a batch (num_messages_in_batch is set)")
    return chunk_id, num_chunks


def _pulsar_messages(
    metadata: api.MessageMetadata, payload: memoryview, max_bytes: int
) -> list[tuple[api.SingleMessageMetadata | api.MessageMetadata, memoryview]] | None:
    """The messages of a Pulsar entry with the metadata that describes each, or None when its
    compression is one this broker does not open."""
    raw = _opened(metadata, payload, max_bytes)
    if raw is None:
        return None
    if not metadata.HasField("num_messages_in_batch"):
        return [(metadata, memoryview(raw))]
    return [(m.metadata, m.payload) for m in decode_batch(raw, metadata.num_messages_in_batch)]


def magnetar_entry(entry: bytes, max_bytes: int) -> bytes:
    """A stored entry as a Magnetar client reads it: its own entries as they are, and a Pulsar
    producer's rewritten as a ``MessageBatch`` (value, key, properties, event time of each
    message). A Pulsar entry this broker cannot open (LZ4, ZSTD or SNAPPY without the optional
    extra, or one that does not decode), or a chunk of a chunked message, stays as it is: the
    client names it and cannot read it."""
    try:
        envelope = parse_envelope(entry)
    except CorruptionError:
        return entry  # the client reports it
    if envelope.format != entry_pb2.ENTRY_FORMAT_PULSAR:
        return entry
    body = memoryview(envelope.batch)
    try:
        if len(body) < 4:
            return entry
        size = int.from_bytes(body[:4], "big")
        metadata = api.MessageMetadata.FromString(bytes(body[4 : 4 + size]))
        messages = _pulsar_messages(metadata, body[4 + size :], max_bytes)
    except (MagnetarError, PulsarFrameError, ValueError, DecodeError):
        return entry  # unreadable as it is: the client reports it
    if messages is None or metadata.num_chunks_from_msg > 1:
        # a chunk is a part of a message, which only a Pulsar consumer puts together again
        return entry
    batch = entry_pb2.MessageBatch()
    for single, value in messages:
        message = batch.messages.add(value=bytes(value))
        key = single.ordering_key.decode("utf-8", "replace") if single.ordering_key else ""
        if single.HasField("partition_key"):
            message.partition_key = _text(single.partition_key)
        elif key:
            message.partition_key = key
        for pair in single.properties:
            message.properties[_text(pair.key)] = _text(pair.value)
        if single.event_time > 0:
            message.event_time_ms = single.event_time
    envelope.format = entry_pb2.ENTRY_FORMAT_UNSPECIFIED
    envelope.batch = batch.SerializeToString()
    envelope.compression = types_pb2.COMPRESSION_TYPE_NONE
    envelope.uncompressed_size = 0
    return envelope.SerializeToString()


def last_batch_index(entry: bytes) -> int:
    """The batch index of an entry's last message as a Pulsar consumer sees it: -1 for a Pulsar
    producer's message sent unbatched, else the batch's count less one (a Magnetar entry is
    always delivered as a batch)."""
    envelope = parse_envelope(entry)
    if envelope.format != entry_pb2.ENTRY_FORMAT_PULSAR:
        return max(1, envelope.num_messages) - 1
    body = envelope.batch
    if len(body) < 4:
        raise CorruptionError("a Pulsar entry shorter than its metadata size")
    size = int.from_bytes(body[:4], "big")
    metadata = api.MessageMetadata()
    try:
        metadata.ParseFromString(body[4 : 4 + size])
    except DecodeError as e:
        raise CorruptionError(f"a Pulsar entry's metadata does not parse: {e}") from e
    if not metadata.HasField("num_messages_in_batch"):
        return -1
    return max(1, metadata.num_messages_in_batch) - 1


def broker_entry_metadata(entry: bytes) -> api.BrokerEntryMetadata:
    """PIP-70's broker entry metadata of a stored entry: the broker's publish time and the
    offset of the entry's last message as its ``index`` (Pulsar's client numbers the messages
    of a batch back from it)."""
    envelope = parse_envelope(entry)
    return api.BrokerEntryMetadata(
        broker_timestamp=max(0, envelope.publish_time_ms),
        index=max(0, envelope.first_offset + max(1, envelope.num_messages) - 1),
    )


def pulsar_metadata_and_payload(entry: bytes, max_bytes: int) -> bytes:
    """``[metadata_size][MessageMetadata][payload]`` of a stored entry, for a MESSAGE.

    A Pulsar producer's entry is returned as it was sent. A Magnetar client's batch is
    rewritten as an uncompressed Pulsar batch (always a batch, so that every message keeps
    its batch index). Raises :class:`CorruptionError` for an entry that cannot be read.
    """
    envelope = parse_envelope(entry)
    if envelope.format == entry_pb2.ENTRY_FORMAT_PULSAR:
        return envelope.batch
    if envelope.format != entry_pb2.ENTRY_FORMAT_UNSPECIFIED:
        raise CorruptionError(f"an entry of unknown format {envelope.format}")
    try:
        raw = inflate(
            IncomingBatch(
                0,
                0,
                0,
                envelope.num_messages,
                envelope.batch,
                envelope.compression,
                envelope.uncompressed_size,
            ),
            max_bytes,
        )
        batch = entry_pb2.MessageBatch.FromString(raw)
    except (MagnetarError, ValueError) as e:
        raise CorruptionError(f"a Magnetar entry does not decode: {e}") from e
    except DecodeError as e:
        raise CorruptionError(f"a Magnetar entry does not decode: {e}") from e
    messages = []
    for message in batch.messages:
        single = api.SingleMessageMetadata(payload_size=len(message.value))
        if message.HasField("partition_key"):
            single.partition_key = message.partition_key
        for key, value in message.properties.items():
            single.properties.add(key=key, value=value)
        if message.event_time_ms > 0:
            single.event_time = message.event_time_ms
        messages.append((single, message.value))
    metadata = api.MessageMetadata(
        producer_name=envelope.producer_name,
        sequence_id=max(0, envelope.sequence_id),
        publish_time=envelope.publish_time_ms,
        num_messages_in_batch=len(messages),
    )
    if envelope.deliver_at_ms > 0:
        metadata.deliver_at_time = envelope.deliver_at_ms
    return encode_metadata_and_payload(metadata, encode_batch(messages))
