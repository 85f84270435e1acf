"""Validation at the door: what a client sends is checked before it is stored or acted on.

The wire protocol is a public contract, and a client in any language may get it wrong. A batch is
stored as one entry and read back by every consumer of the topic, so a bad one would be a poison
entry (consumers cannot decode it, never acknowledge it, and the backlog never drains), and its
claimed message count sizes what the broker does per entry (acks, redelivery, key_shared
routing). So every batch is opened and checked here first: its compression really inflates,
within the declared uncompressed size and the broker's limit (a bounded inflater: a zlib bomb
never grows past the limit); its bytes are a ``MessageBatch``; the count it declares is the count
it holds, within ``max_messages_per_batch``; and the key hashes it carries for key_shared routing
are those of its keys. A bad batch is refused alone, with an error naming what was wrong.

Names and properties are bounded too, and an error shows at most a short prefix of a refused
value (:func:`magnetar.common.names.shown`): echoing a huge value back would itself break the
reply. These checks are pure (no I/O), so each rule is tested directly.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from broker.service.envelope import IncomingBatch
from magnetar.common.errors import InvalidArgumentError, MessageTooLargeError, ProtocolError
from magnetar.common.keys import key_hash
from magnetar.common.names import shown
from proto.common.v1 import types_pb2
from proto.format.v1 import entry_pb2

COMPRESSION_NAMES = {
    types_pb2.COMPRESSION_TYPE_NONE: "COMPRESSION_TYPE_NONE",
    types_pb2.COMPRESSION_TYPE_ZLIB: "COMPRESSION_TYPE_ZLIB",
}


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """What a broker accepts in one batch (from :class:`broker.service.config.BrokerConfig`)."""

    max_message_bytes: int
    """Largest batch, compressed or not, and largest uncompressed size it may declare."""
    max_messages: int
    """Most messages one batch may hold."""


def check_batch(batch: IncomingBatch, limits: BatchLimits) -> None:
    """Refuse a batch that is not what it claims to be (see the module doc).

    Raises :class:`MessageTooLargeError` for a batch over a size limit and
    :class:`ProtocolError` for any other fault, each naming what was wrong.
    """
    if batch.format == entry_pb2.ENTRY_FORMAT_PULSAR:
        # checked by the Pulsar adapter, which parsed its metadata (broker.pulsar.entries)
        _check_counts(batch, limits)
        return
    if batch.format != entry_pb2.ENTRY_FORMAT_UNSPECIFIED:
        raise ProtocolError(f"unknown entry format {batch.format}")
    size = len(batch.batch)
    if size > limits.max_message_bytes:
        raise MessageTooLargeError(
            f"a batch of {size:,} bytes is over the broker's limit of"
            f" {limits.max_message_bytes:,} bytes",
            context={"size": size, "limit": limits.max_message_bytes},
        )
    _check_counts(batch, limits)
    raw = inflate(batch, limits.max_message_bytes)
    try:
        decoded = entry_pb2.MessageBatch.FromString(raw)
    except DecodeError:
        raise ProtocolError(
            f"the batch's {len(raw):,} bytes (after decompression) are not a serialized"
            " magnetar.format.v1.MessageBatch"
        ) from None
    count = batch.num_messages
    held = len(decoded.messages)
    if held != count:
        raise ProtocolError(
            f"the batch declares num_messages={count:,} but holds {held:,} messages",
            context={"num_messages": count, "held": held},
        )
    if batch.key_hashes:
        _check_key_hashes(decoded, batch.key_hashes)


def _check_counts(batch: IncomingBatch, limits: BatchLimits) -> None:
    """The rules of a batch that do not need its bytes opened."""
    count = batch.num_messages
    if not 1 <= count <= limits.max_messages:
        raise ProtocolError(
            f"num_messages is {count:,}; a batch holds 1 to {limits.max_messages:,} messages"
            " (the broker's max_messages_per_batch)",
            context={"num_messages": count, "limit": limits.max_messages},
        )
    if batch.last_sequence_id < batch.sequence_id:
        raise ProtocolError(
            f"a batch needs last_sequence_id >= sequence_id, got sequence ids"
            f" {batch.sequence_id}..{batch.last_sequence_id}"
        )
    if len(batch.key_hashes) not in (0, 1, count):
        raise ProtocolError(
            f"a batch of {count:,} messages carries {len(batch.key_hashes):,} key hashes; it"
            " carries none, one, or one per message"
        )
    if batch.deliver_at_ms < 0:
        raise ProtocolError(f"deliver_at_ms is >= 0, got {batch.deliver_at_ms}")


def inflate(batch: IncomingBatch, max_bytes: int) -> bytes:
    """The batch's serialized ``MessageBatch``, decompressed as declared: never more than
    ``max_bytes`` or the declared ``uncompressed_size`` is inflated."""
    compression = batch.compression
    declared = batch.uncompressed_size
    if compression == types_pb2.COMPRESSION_TYPE_NONE:
        if declared not in (0, len(batch.batch)):
            raise ProtocolError(
                f"an uncompressed batch of {len(batch.batch):,} bytes declares"
                f" uncompressed_size={declared:,}; it is 0 or the batch's size",
                context={"uncompressed_size": declared, "size": len(batch.batch)},
            )
        return batch.batch
    if compression != types_pb2.COMPRESSION_TYPE_ZLIB:
        why = (
            "unspecified (COMPRESSION_TYPE_UNSPECIFIED)"
            if compression == types_pb2.COMPRESSION_TYPE_UNSPECIFIED
            else f"{compression}, which this broker does not know"
        )
        raise ProtocolError(
            f"the batch's compression is {why}; set COMPRESSION_TYPE_NONE or COMPRESSION_TYPE_ZLIB",
            context={"compression": compression},
        )
    if declared > max_bytes:
        raise MessageTooLargeError(
            f"a batch declaring {declared:,} uncompressed bytes is over the broker's limit of"
            f" {max_bytes:,} bytes",
            context={"uncompressed_size": declared, "limit": max_bytes},
        )
    if declared < 1:
        raise ProtocolError(
            f"a COMPRESSION_TYPE_ZLIB batch declares uncompressed_size={declared:,}; it is the"
            " size of the MessageBatch before compression",
            context={"uncompressed_size": declared},
        )
    inflater = zlib.decompressobj()
    try:
        # one byte more than declared tells a batch that inflates further from one that fits
        raw = inflater.decompress(batch.batch, declared + 1)
    except zlib.error as e:
        raise ProtocolError(
            f"the batch is marked COMPRESSION_TYPE_ZLIB but is not a zlib stream (RFC 1950): {e}"
        ) from None
    if len(raw) > declared:
        raise ProtocolError(
            f"the batch inflates to more than its declared uncompressed_size of {declared:,} bytes",
            context={"uncompressed_size": declared},
        )
    if not inflater.eof or inflater.unused_data:
        raise ProtocolError(
            "the batch is marked COMPRESSION_TYPE_ZLIB but its zlib stream is "
            + ("truncated" if not inflater.eof else "followed by other bytes")
        )
    if len(raw) != declared:
        raise ProtocolError(
            f"the batch inflates to {len(raw):,} bytes, not its declared uncompressed_size of"
            f" {declared:,}",
            context={"uncompressed_size": declared, "inflated": len(raw)},
        )
    return raw


def _check_key_hashes(decoded: entry_pb2.MessageBatch, hashes: tuple[int, ...]) -> None:
    """Each message's key hashes (:func:`magnetar.common.keys.key_hash`) to what the batch
    carries for it: key_shared routes on these hashes without opening the batch again."""
    # an absent key reads as "", which hashes as the empty key, as a keyless message does
    keys = [message.partition_key for message in decoded.messages]
    known = {key: key_hash(key) for key in set(keys)}
    if len(hashes) == 1:
        if all(actual == hashes[0] for actual in known.values()):
            return
    elif all(known[key] == carried for key, carried in zip(keys, hashes, strict=True)):
        return
    for index, key in enumerate(keys):
        carried = hashes[0] if len(hashes) == 1 else hashes[index]
        if known[key] != carried:
            raise ProtocolError(
                f"message {index} of the batch has key {shown(key)}, whose key hash is"
                f" {known[key]}, but the batch carries {carried} for it (key_hash is"
                " fmix32(crc32(utf-8 key)); a keyless message hashes as the empty key)",
                context={"batch_index": index, "key_hash": known[key], "carried": carried},
            )


def check_name(field: str, value: str, limit: int) -> None:
    """Refuse a name over ``limit`` characters, showing only its start."""
    if len(value) > limit:
        raise InvalidArgumentError(
            f"{field} is {len(value):,} characters long; the limit is {limit:,}"
            f" (it starts {value[:40]!r})",
            context={"field": field, "length": len(value), "limit": limit},
        )


def check_properties(
    field: str, properties: Mapping[str, str], *, max_key_chars: int, max_bytes: int
) -> None:
    """Refuse properties whose keys are too long or which are too large together."""
    total = 0
    for key, value in properties.items():
        check_name(f"a key of {field}", key, max_key_chars)
        total += len(key.encode()) + len(value.encode())
        if total > max_bytes:
            raise InvalidArgumentError(
                f"{field} hold more than {max_bytes:,} bytes of keys and values (the broker's"
                " max_properties_bytes)",
                context={"field": field, "limit": max_bytes},
            )
