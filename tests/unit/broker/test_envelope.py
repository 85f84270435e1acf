"""The envelope built by prefix-and-join is, byte for byte, what protobuf would serialize."""

from __future__ import annotations

import pytest

from broker.service.envelope import (
    IncomingBatch,
    build_envelope,
    envelope_head,
    parse_envelope,
    producer_of,
)
from proto.format.v1 import entry_pb2


def _protobuf_envelope(batch: IncomingBatch, first_offset: int, publish_time_ms: int) -> bytes:
    """What protobuf itself writes for the whole envelope, ``batch`` included."""
    envelope = envelope_head("producer-é", batch, first_offset, publish_time_ms)
    envelope.batch = batch.batch
    return envelope.SerializeToString()


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 128 * 1024, 2_097_152])
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"key_hashes": (7,), "deliver_at_ms": 1_700_000_000_123},
        {"key_hashes": (1, 2, 3), "format": entry_pb2.ENTRY_FORMAT_PULSAR, "compression": 2},
    ],
)
def test_the_envelope_is_protobufs_own_serialization(size: int, fields: dict[str, object]) -> None:
    batch = IncomingBatch(
        request_id=9,
        sequence_id=-1 if size == 1 else 41,
        last_sequence_id=44,
        num_messages=4,
        batch=bytes(range(256)) * (size // 256) + b"z" * (size % 256),
        compression=int(fields.get("compression", 0)),  # type: ignore[call-overload]
        uncompressed_size=size * 2,
        key_hashes=fields.get("key_hashes", ()),  # type: ignore[arg-type]
        deliver_at_ms=int(fields.get("deliver_at_ms", 0)),  # type: ignore[call-overload]
        format=int(fields.get("format", 0)),  # type: ignore[call-overload]
    )
    built = build_envelope("producer-é", batch, 1 << 40, 1_700_000_000_000)
    assert built == _protobuf_envelope(batch, 1 << 40, 1_700_000_000_000)
    envelope = parse_envelope(built)
    assert envelope.batch == batch.batch
    assert envelope.first_offset == 1 << 40
    produced = producer_of(built)
    assert (produced.producer_name, produced.last_sequence_id) == ("producer-é", 44)
    assert produced.completes_message
