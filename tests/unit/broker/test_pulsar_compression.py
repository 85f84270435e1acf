"""Pulsar payloads compressed with LZ4, ZSTD, SNAPPY (and ZLIB): opened on SEND within the
broker's limit, refused with a reason when they are not what their metadata says, and turned into
Magnetar batches for Magnetar consumers (broker/pulsar/compression.py, broker/pulsar/entries.py).

The entries in ``REAL_CLIENT`` are byte for byte what the real ``pulsar-client`` 3.13.0 (its C++
core 4.2.0) sent to a Magnetar standalone, read back by a raw consumer."""

from __future__ import annotations

import contextlib
import os
import random
import zlib
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import cramjam
import pytest
import structlog
from structlog.testing import capture_logs

from broker.pulsar import compression
from broker.pulsar.codec import Payload, encode_batch, encode_metadata_and_payload
from broker.pulsar.compression import decompress
from broker.pulsar.entries import incoming_batch, magnetar_entry
from broker.service.envelope import build_envelope
from broker.service.validation import BatchLimits
from magnetar.aio.codec import decode_entry
from magnetar.common.errors import CorruptionError, MessageTooLargeError, ProtocolError
from magnetar.common.keys import key_hash
from proto.format.v1 import entry_pb2
from proto.pulsar import PulsarApi_pb2 as api

LIMIT = 200_000
LIMITS = BatchLimits(max_message_bytes=LIMIT, max_messages=10_000)

# (codec, batched) -> [metadata_size][MessageMetadata][payload] as pulsar-client sent it:
# batched: three messages (b"first message" key k1 {"a": "1"} event time ...001; b"second " * 10
# key k2 event time ...002; b"" {"empty": "yes"}); unbatched: b"hello " * 20 key "solo" {"b": "2"}
# event time ...003
REAL_CLIENT = {
    ("LZ4", True): "0000001d0a076361707475726510001885cef892a23432026b3140014897015803f2250000"
    "00170a060a016112013112026b31180d2881d095ffbc3140006669727374206d6573736167650000000f12026b"
    "321846288220008f017365636f6e642007002cf007000000120a0c0a05656d707479120379657318004002",
    ("LZ4", False): "0000002b0a0763617074757265100018a6cef892a23422060a01621201323204736f6c6f40"
    "0148786083d095ffbc316f68656c6c6f2006005a50656c6c6f20",
    ("ZSTD", True): "0000001d0a0763617074757265100018c7cef892a23432026b314003489701580328b52ffd"
    "2097e502002405000000170a060a016112013112026b31180d2881d095ffbc3140006669727374206d657373616765"
    "0000000f12026b3218462882017365636f6e6420000000120a0c0a05656d707479120379657318004002020054919c"
    "c6a0a0",
    ("ZSTD", False): "0000002b0a0763617074757265100018d6cef892a23422060a01621201323204736f6c6f4003"
    "48786083d095ffbc3128b52ffd20786d00003068656c6c6f2001002f692902",
    ("SNAPPY", True): "0000001d0a0763617074757265100018e4cef892a23432026b31400448970158039701d00000"
    "00170a060a016112013112026b31180d2881d095ffbc3140006669727374206d6573736167650000000f12026b32"
    "18462882d005201c017365636f6e6420fa070054000000120a0c0a05656d707479120379657318004002",
    ("SNAPPY", False): "0000002b0a0763617074757265100018f2cef892a23422060a01621201323204736f6c6f40"
    "0448786083d095ffbc31781468656c6c6f20fe0600c60600",
}

BATCHED = [
    (b"first message", "k1", {"a": "1"}, 1_700_000_000_001),
    (b"second " * 10, "k2", {}, 1_700_000_000_002),
    (b"", None, {"empty": "yes"}, None),
]
UNBATCHED = [(b"hello " * 20, "solo", {"b": "2"}, 1_700_000_000_003)]

CODECS = {"LZ4": api.LZ4, "ZLIB": api.ZLIB, "ZSTD": api.ZSTD, "SNAPPY": api.SNAPPY}


def pack(codec: str, raw: bytes) -> bytes:
    """``raw`` compressed as Pulsar's C++ client does it (lib/CompressionCodec*.cc): an LZ4 block
    with no size prefix (LZ4_compress_default), a zstd frame at level 3 (ZSTD_compress), raw
    snappy (snappy::Compress), a zlib stream."""
    if codec == "LZ4":
        return bytes(cramjam.lz4.compress_block(raw, store_size=False))
    if codec == "ZSTD":
        return bytes(cramjam.zstd.compress(raw, level=3))
    if codec == "SNAPPY":
        return bytes(cramjam.snappy.compress_raw(raw))
    return zlib.compress(raw)


def parsed(body: bytes) -> Payload:
    size = int.from_bytes(body[:4], "big")
    metadata = api.MessageMetadata.FromString(body[4 : 4 + size])
    return Payload(metadata, body, memoryview(body)[4 + size :], 0)


def payload_of(metadata: api.MessageMetadata, data: bytes) -> Payload:
    return parsed(encode_metadata_and_payload(metadata, data))


def send(codec: str, data: bytes, declared: int, *, batch: int | None = None) -> Payload:
    metadata = api.MessageMetadata(
        producer_name="p",
        sequence_id=1,
        publish_time=1,
        compression=CODECS[codec],
        uncompressed_size=declared,
    )
    if batch is not None:
        metadata.num_messages_in_batch = batch
    return payload_of(metadata, data)


def crossed(body: bytes) -> list[tuple[bytes, str | None, dict[str, str], int | None]]:
    """What a Magnetar consumer reads of a stored Pulsar entry."""
    payload = parsed(body)
    batch = incoming_batch(payload, sequence_id=1, highest_sequence_id=0, limits=LIMITS)
    entry = magnetar_entry(build_envelope("capture", batch, 0, 1), LIMIT)
    return [
        (
            m.value,
            m.partition_key if m.HasField("partition_key") else None,
            dict(m.properties),
            m.event_time_ms or None,
        )
        for m in decode_entry(entry).messages
    ]


@contextlib.contextmanager
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    configured = structlog.is_configured()
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        if not configured:
            structlog.reset_defaults()


@pytest.mark.parametrize(
    ("codec", "batched"),
    list(REAL_CLIENT),
    ids=[f"{codec}-{'batched' if batched else 'unbatched'}" for codec, batched in REAL_CLIENT],
)
def test_what_the_real_client_sends_is_checked_and_reaches_magnetar_consumers_whole(
    codec: str, batched: bool
) -> None:
    body = bytes.fromhex(REAL_CLIENT[codec, batched])
    payload = parsed(body)
    assert payload.metadata.compression == CODECS[codec]
    stored = incoming_batch(payload, sequence_id=1, highest_sequence_id=0, limits=LIMITS)
    assert stored.batch == body  # stored as sent
    expected = BATCHED if batched else UNBATCHED
    assert stored.num_messages == len(expected)
    assert stored.key_hashes == tuple(key_hash(key or "") for _, key, _, _ in expected)
    assert crossed(body) == expected


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("size", [0, 1, 100_000], ids=["empty", "1B", "100kB"])
def test_each_codec_opens_what_pulsar_clients_write(codec: str, size: int) -> None:
    raw = os.urandom(size // 2) + b"x" * (size - size // 2)
    packed = pack(codec, raw)
    opened = decompress(CODECS[codec], memoryview(packed), size, LIMIT)
    assert opened is not None
    assert bytes(opened) == raw
    # a payload at the end of a larger buffer, as a frame hands it over
    opened = decompress(CODECS[codec], memoryview(b"\x01\x02" + packed)[2:], size, LIMIT)
    assert opened is not None
    assert bytes(opened) == raw


@pytest.mark.parametrize("codec", list(CODECS))
def test_a_batch_of_a_thousand_messages_crosses_with_every_field(codec: str) -> None:
    messages = [
        (
            api.SingleMessageMetadata(
                partition_key=f"k{i % 7}",
                properties=[api.KeyValue(key="i", value=str(i))],
                event_time=1_000 + i,
            ),
            f"{i:03d}".encode() * 33 + b"!",
        )
        for i in range(1000)
    ]
    raw = encode_batch(messages)
    payload = send(codec, pack(codec, raw), len(raw), batch=1000)
    stored = incoming_batch(payload, sequence_id=1, highest_sequence_id=999, limits=LIMITS)
    assert stored.key_hashes == tuple(key_hash(f"k{i % 7}") for i in range(1000))
    got = crossed(payload.metadata_and_payload)
    assert got == [
        (f"{i:03d}".encode() * 33 + b"!", f"k{i % 7}", {"i": str(i)}, 1_000 + i)
        for i in range(1000)
    ]


def refusal(payload: Payload) -> str:
    with pytest.raises(ProtocolError) as e:
        incoming_batch(payload, sequence_id=1, highest_sequence_id=0, limits=LIMITS)
    return e.value.message


@pytest.mark.parametrize("codec", list(CODECS))
def test_a_claimed_size_over_the_limit_is_refused_before_anything_is_decoded(codec: str) -> None:
    for declared in (LIMIT + 1, 2**32 - 1):
        for batch in (None, 3):
            payload = send(codec, pack(codec, b"small"), declared, batch=batch)
            with pytest.raises(MessageTooLargeError) as e:
                incoming_batch(payload, sequence_id=1, highest_sequence_id=0, limits=LIMITS)
            assert f"{codec} payload declares uncompressed_size={declared:,}" in e.value.message
            assert f"over the broker's limit of {LIMIT:,} bytes" in e.value.message
    # exactly the limit is fine
    raw = b"y" * LIMIT
    assert (
        len(decompress(CODECS[codec], memoryview(pack(codec, raw)), LIMIT, LIMIT) or b"") == LIMIT
    )


@pytest.mark.parametrize("codec", list(CODECS))
def test_a_bomb_stops_at_its_declared_size(codec: str) -> None:
    # 4 MiB of zeros compress to a few kB (SNAPPY: 192 kB); declared as 1,000 bytes
    bomb = pack(codec, bytes(4 * 1024 * 1024))
    message = refusal(send(codec, bomb, 1000))
    if codec == "SNAPPY":  # raw snappy states its size first: refused before decoding
        assert "says it holds 4,194,304 bytes, not its declared uncompressed_size of 1,000" in (
            message
        )
    else:
        # the decoder stops where the buffer of 1,001 bytes ends
        assert f"a payload marked {codec} " in message
        assert "declared uncompressed_size of 1,000 bytes" in message


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize(
    ("case", "spoil"),
    [
        ("garbage", lambda packed: random.Random(7).randbytes(len(packed))),
        ("truncated", lambda packed: packed[: len(packed) * 2 // 3]),
        ("trailing bytes", lambda packed: packed + b"\x00\x07"),
        ("empty", lambda packed: b""),
    ],
)
def test_a_payload_that_does_not_decode_is_refused_naming_its_codec(
    codec: str, case: str, spoil: Callable[[bytes], bytes]
) -> None:
    raw = b"".join(f"message {i} ".encode() for i in range(300))
    packed = spoil(pack(codec, raw))
    for batch in (None, 300):
        assert codec in refusal(send(codec, packed, len(raw), batch=batch)), case


@pytest.mark.parametrize("codec", list(CODECS))
def test_a_payload_must_decode_to_exactly_its_declared_size(codec: str) -> None:
    raw = b"0123456789" * 50
    packed = pack(codec, raw)
    assert codec in refusal(send(codec, packed, len(raw) + 1))
    assert codec in refusal(send(codec, packed, len(raw) - 1))
    assert codec in refusal(send(codec, packed, 0))


def test_a_batch_that_opens_but_is_not_what_its_metadata_says_is_refused() -> None:
    raw = encode_batch([(api.SingleMessageMetadata(), b"only one")])
    for codec in CODECS:
        message = refusal(send(codec, pack(codec, raw), len(raw), batch=2))
        assert "not what its metadata says" in message, codec


def test_without_the_optional_extra_lz4_zstd_snappy_are_stored_unopened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compression, "_cramjam", None)
    monkeypatch.setattr(compression, "_warned", set())
    with captured_logs() as logs:
        for codec in ("LZ4", "ZSTD", "SNAPPY"):
            for batched in (True, False):
                body = bytes.fromhex(REAL_CLIENT[codec, batched])
                stored = incoming_batch(
                    parsed(body), sequence_id=1, highest_sequence_id=0, limits=LIMITS
                )
                assert stored.batch == body
                # a batch's keys cannot be read: no key hashes (an unbatched message's key is
                # in its metadata)
                assert stored.key_hashes == (() if batched else (key_hash("solo"),))
                entry = build_envelope("capture", stored, 0, 1)
                assert magnetar_entry(entry, LIMIT) == entry  # left as it is
                with pytest.raises(CorruptionError) as e:
                    decode_entry(entry)
                assert f"Pulsar producer (ENTRY_FORMAT_PULSAR) with {codec} compression" in (
                    e.value.message
                )
                assert "magnetar[pulsar-compression]" in e.value.message
            # nor can garbage be told from a good payload: stored too, as before
            incoming_batch(
                send(codec, b"garbage", 10, batch=1),
                sequence_id=1,
                highest_sequence_id=0,
                limits=LIMITS,
            )
        # ZLIB needs nothing more
        crossed(send("ZLIB", pack("ZLIB", b"z" * 10), 10).metadata_and_payload)
    warnings = [log for log in logs if log["event"] == "pulsar_compression_unavailable"]
    assert [w["compression"] for w in warnings] == ["LZ4", "ZSTD", "SNAPPY"]  # once each
    assert all(w["install"] == "magnetar[pulsar-compression]" for w in warnings)
    assert all(w["log_level"] == "warning" for w in warnings)


def test_an_entry_that_does_not_decode_reaches_a_magnetar_client_named() -> None:
    # an entry stored before SEND checked its payload: the consumer names what it is
    metadata = api.MessageMetadata(
        producer_name="p", sequence_id=1, publish_time=1, compression=api.ZLIB, uncompressed_size=9
    )
    stored = incoming_batch(
        payload_of(api.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1), b"x"),
        sequence_id=1,
        highest_sequence_id=0,
        limits=LIMITS,
    )
    envelope = entry_pb2.EntryEnvelope.FromString(build_envelope("p", stored, 0, 1))
    envelope.batch = encode_metadata_and_payload(metadata, b"not zlib")
    entry = envelope.SerializeToString()
    assert magnetar_entry(entry, LIMIT) == entry
    with pytest.raises(CorruptionError, match=r"compression ZLIB\) and does not decode"):
        decode_entry(entry)
