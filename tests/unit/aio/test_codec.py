"""The client's codec: batches as the producer seals them, entries as the consumer unpacks them."""

from __future__ import annotations

import pytest

from magnetar.aio.codec import BatchBuilder, decode_entry, message_size
from magnetar.common.errors import CorruptionError, InvalidArgumentError
from magnetar.common.keys import batch_key_hashes
from proto.common.v1 import types_pb2
from proto.format.v1 import entry_pb2


def stored_entry(batch_builder_output: object, *, first_offset: int = 100) -> bytes:
    """What the broker stores for a sealed batch: the bytes as sent, in an envelope."""
    sealed = batch_builder_output
    return entry_pb2.EntryEnvelope(
        format_version=1,
        producer_name="p-1",
        sequence_id=sealed.sequence_id,  # type: ignore[attr-defined]
        last_sequence_id=sealed.last_sequence_id,  # type: ignore[attr-defined]
        num_messages=sealed.num_messages,  # type: ignore[attr-defined]
        publish_time_ms=1_700_000_000_000,
        first_offset=first_offset,
        compression=sealed.compression,  # type: ignore[attr-defined]
        uncompressed_size=sealed.uncompressed_size,  # type: ignore[attr-defined]
        batch=sealed.payload,  # type: ignore[attr-defined]
    ).SerializeToString()


def fill(builder: BatchBuilder[int], count: int, content: bytes = b"x" * 10) -> None:
    for i in range(count):
        builder.add(content, i, partition_key=f"k{i}", properties={"i": str(i)}, event_time_ms=i)


@pytest.mark.parametrize("compression", ["none", "zlib"])
def test_a_sealed_batch_comes_back_message_for_message(compression: str) -> None:
    builder: BatchBuilder[int] = BatchBuilder(
        max_messages=100,
        max_bytes=1 << 20,
        compression=compression,  # type: ignore[arg-type]
    )
    builder.add(b"first", 0, partition_key="a", properties={"p": "1"}, event_time_ms=42, now=1.0)
    builder.add(b"", 1)
    builder.add(b"third" * 100, 2, partition_key="")
    sealed = builder.seal(sequence_id=7)
    assert (sealed.sequence_id, sealed.last_sequence_id, sealed.num_messages) == (7, 9, 3)
    assert sealed.parts == [(0, 1), (1, 1), (2, 1)]
    assert sealed.first_added_at == 1.0
    if compression == "zlib":
        assert sealed.compression == types_pb2.COMPRESSION_TYPE_ZLIB
        assert len(sealed.payload) < sealed.uncompressed_size

    entry = decode_entry(stored_entry(sealed))
    assert (entry.producer_name, entry.sequence_id, entry.first_offset) == ("p-1", 7, 100)
    first, second, third = entry.messages
    assert (first.value, first.partition_key, dict(first.properties), first.event_time_ms) == (
        b"first",
        "a",
        {"p": "1"},
        42,
    )
    assert second.value == b""
    assert not second.HasField("partition_key")
    assert third.HasField("partition_key")
    assert third.partition_key == ""
    assert len(builder) == 0


def test_a_batch_is_full_at_its_message_limit() -> None:
    builder: BatchBuilder[int] = BatchBuilder(max_messages=3, max_bytes=1 << 20)
    fill(builder, 2)
    assert not builder.is_full()
    assert builder.has_room_for(10)
    fill(builder, 1)
    assert builder.is_full()
    assert not builder.has_room_for(1)


def test_a_batch_refuses_what_would_pass_its_byte_limit_but_takes_one_large_message() -> None:
    builder: BatchBuilder[int] = BatchBuilder(max_messages=100, max_bytes=100)
    assert builder.has_room_for(10_000)  # an empty batch takes any message
    builder.add(b"x" * 50, 0)
    assert builder.size_bytes == message_size(b"x" * 50, None, None)
    assert not builder.has_room_for(message_size(b"x" * 50, None, None))
    assert builder.has_room_for(100 - builder.size_bytes)


def test_message_size_counts_key_and_properties() -> None:
    plain = message_size(b"abc", None, None)
    assert message_size(b"abc", "key", None) == plain + 3
    assert message_size(b"abc", None, {"k": "vv"}) > plain + 3


def test_take_parts_empties_the_batch_without_encoding() -> None:
    builder: BatchBuilder[int] = BatchBuilder(max_messages=10, max_bytes=1000)
    fill(builder, 4)
    builder.add_many([b"a", b"b"], 0, 4)
    assert builder.take_parts() == [(0, 1), (1, 1), (2, 1), (3, 1), (4, 2)]
    assert len(builder) == 0
    assert builder.size_bytes == 0
    with pytest.raises(InvalidArgumentError):
        builder.seal(0)


def test_sealing_starts_a_fresh_batch() -> None:
    builder: BatchBuilder[int] = BatchBuilder(max_messages=10, max_bytes=1000)
    fill(builder, 2)
    builder.seal(0)
    builder.add(b"only", 9)
    again = decode_entry(stored_entry(builder.seal(2)))
    assert [m.value for m in again.messages] == [b"only"]


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xff\xff\xff",
        entry_pb2.EntryEnvelope(
            batch=b"not zlib", compression=types_pb2.COMPRESSION_TYPE_ZLIB
        ).SerializeToString(),
        entry_pb2.EntryEnvelope(batch=b"x", compression=99).SerializeToString(),  # type: ignore[arg-type]
    ],
)
def test_damaged_entries_are_reported_not_delivered(data: bytes) -> None:
    with pytest.raises(CorruptionError):
        decode_entry(data)


@pytest.mark.parametrize(
    ("key", "properties", "event_time_ms"),
    [(None, None, 0), ("k", None, 0), (None, {"a": "1", "b": ""}, 0), ("", {"x": "y"}, 2**40)],
)
def test_hand_encoded_messages_read_back_as_protobuf_writes_them(
    key: str | None, properties: dict[str, str] | None, event_time_ms: int
) -> None:
    """The builder writes ``MessageBatch`` bytes itself; they must parse to the same messages,
    for values of every length class of a varint (0, 1, 127, 128, 16,384 bytes)."""
    values = [b"", b"v", b"x" * 127, b"y" * 128, b"z" * 16_384, bytes(range(256))]
    builder: BatchBuilder[str] = BatchBuilder(max_messages=100, max_bytes=1 << 20)
    builder.add(values[0], "one", partition_key=key, properties=properties, event_time_ms=5)
    taken = builder.add_many(
        values, 1, "run", partition_key=key, properties=properties, event_time_ms=event_time_ms
    )
    assert taken == len(values) - 1
    sealed = builder.seal(0)
    assert sealed.parts == [("one", 1), ("run", 5)]
    assert sealed.num_messages == 6
    expected = entry_pb2.MessageBatch(
        messages=[
            entry_pb2.BatchedMessage(
                value=value,
                partition_key=key,
                properties=properties,
                event_time_ms=5 if i == 0 else event_time_ms,
            )
            for i, value in enumerate(values)
        ]
    )
    assert entry_pb2.MessageBatch.FromString(sealed.payload) == expected
    assert sealed.key_hashes == (() if key is None else (batch_key_hashes([key])[0],))


def test_a_run_fills_the_batch_and_stops_at_its_limits() -> None:
    builder: BatchBuilder[int] = BatchBuilder(max_messages=5, max_bytes=1 << 20)
    builder.add(b"single", 0)
    run = [b"m%d" % i for i in range(10)]
    assert builder.add_many(run, 0, 1) == 4  # room for 4 more messages
    assert builder.is_full()
    assert builder.add_many(run, 4, 1) == 0
    builder.seal(0)
    assert builder.add_many(run, 4, 1) == 5
    by_bytes: BatchBuilder[int] = BatchBuilder(max_messages=1000, max_bytes=100)
    sized = [b"x" * 30] * 5  # 46 bytes each with the per-message overhead
    assert by_bytes.add_many(sized, 0, 0) == 2
    assert by_bytes.add_many(sized, 2, 0) == 0
    big: BatchBuilder[int] = BatchBuilder(max_messages=1000, max_bytes=100)
    assert big.add_many([b"x" * 500, b"y"], 0, 0) == 1  # an empty batch takes the first
