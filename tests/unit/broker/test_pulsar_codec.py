"""Pulsar's binary protocol, frame by frame: hand-built byte vectors decode as the spec says,
commands round-trip, and every malformed frame is refused with the codec's typed error."""

from __future__ import annotations

import contextlib
import struct

import google_crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.pulsar import codec
from broker.pulsar.codec import (
    PulsarChecksumError,
    PulsarCommandError,
    PulsarFrameError,
    PulsarMagicError,
    PulsarSizeError,
    decode_batch,
    decode_frame,
    encode_batch,
    encode_command,
    encode_message,
    frame_decoder,
)
from magnetar.common.framing import FrameError, FrameTooLargeError
from proto.pulsar import PulsarApi_pb2 as api

Base = api.BaseCommand


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def simple_frame(command: bytes) -> bytes:
    """[total_size][command_size][command], written out by hand."""
    return u32(4 + len(command)) + u32(len(command)) + command


def payload_frame(
    command: bytes, metadata: bytes, payload: bytes, entry: bytes | None = None
) -> bytes:
    """[total][cmd_size][cmd]([0x0e02][size][entry])[0x0e01][crc][metadata_size][metadata][payload]."""
    checksummed = u32(len(metadata)) + metadata + payload
    tail = b""
    if entry is not None:
        tail += b"\x0e\x02" + u32(len(entry)) + entry
    tail += b"\x0e\x01" + u32(google_crc32c.value(checksummed)) + checksummed
    rest = u32(len(command)) + command + tail
    return u32(len(rest)) + rest


def body(frame: bytes) -> memoryview:
    """The frame's body as the framing layer hands it over."""
    (only,) = frame_decoder().feed(frame)
    return only


# --- known bytes ------------------------------------------------------------------------------

# BaseCommand{type: PING (18), ping: {}}: field 1 varint 18, field 18 (tag 0x92 0x01) empty.
PING_COMMAND = bytes.fromhex("0812920100")
PONG_COMMAND = bytes.fromhex("08139a0100")
# BaseCommand{type: SEND (6), send: {producer_id: 1, sequence_id: 2}}
SEND_COMMAND = bytes.fromhex("0806320408011002")
# MessageMetadata{producer_name: "p", sequence_id: 2, publish_time: 3}
METADATA = bytes.fromhex("0a017010021803")


def test_crc32c_is_castagnoli() -> None:
    assert google_crc32c.value(b"123456789") == 0xE3069283


def test_ping_and_pong_are_the_bytes_the_spec_gives() -> None:
    ping = Base(type=Base.PING, ping=api.CommandPing())
    assert encode_command(ping) == bytes.fromhex("00000009000000050812920100")
    assert encode_command(ping) == simple_frame(PING_COMMAND)
    assert encode_command(Base(type=Base.PONG, pong=api.CommandPong())) == simple_frame(
        PONG_COMMAND
    )
    frame = decode_frame(body(simple_frame(PING_COMMAND)))
    assert frame.type == Base.PING
    assert frame.type_name == "PING"
    assert frame.payload is None


def test_a_ping_without_its_empty_sub_message_is_a_ping() -> None:
    # PING and PONG have no fields: an absent sub-message is the same as an empty one
    assert decode_frame(body(simple_frame(bytes.fromhex("0812")))).type == Base.PING


def test_send_is_the_bytes_the_spec_gives() -> None:
    expected = bytes.fromhex(
        "00000022"  # total_size: 34 bytes follow
        "00000008"
        "0806320408011002"  # command_size, BaseCommand SEND
        "0e01"
        "db396a81"  # checksum magic, CRC-32C of what follows
        "00000007"
        "0a017010021803"  # metadata_size, MessageMetadata
        "68656c6c6f"  # payload "hello"
    )
    assert payload_frame(SEND_COMMAND, METADATA, b"hello") == expected
    send = Base(type=Base.SEND, send=api.CommandSend(producer_id=1, sequence_id=2))
    metadata = api.MessageMetadata(producer_name="p", sequence_id=2, publish_time=3)
    assert encode_message(send, metadata, b"hello") == expected
    frame = decode_frame(body(expected))
    assert frame.command == send
    assert frame.payload is not None
    assert frame.payload.metadata == metadata
    assert bytes(frame.payload.payload) == b"hello"
    assert frame.payload.checksum == 0xDB396A81
    assert frame.payload.metadata_and_payload == bytes.fromhex("000000070a01701002180368656c6c6f")
    assert frame.payload.broker_entry_metadata is None


# --- round trips ------------------------------------------------------------------------------


def round_trip(command: api.BaseCommand) -> api.BaseCommand:
    frame = decode_frame(body(encode_command(command)))
    assert frame.payload is None
    assert frame.command == command
    assert codec.sub_message(frame.command) == codec.sub_message(command)
    return frame.command


def test_connect_and_connected_round_trip() -> None:
    connect = Base(
        type=Base.CONNECT,
        connect=api.CommandConnect(
            client_version="Pulsar-CPP-v4.2.0",
            protocol_version=20,
            auth_method_name="token",
            auth_data=b"secret-token",
            feature_flags=api.FeatureFlags(supports_broker_entry_metadata=True),
        ),
    )
    assert round_trip(connect).connect.feature_flags.supports_broker_entry_metadata
    connected = Base(
        type=Base.CONNECTED,
        connected=api.CommandConnected(
            server_version="Magnetar 0.1", protocol_version=19, max_message_size=5 * 1024 * 1024
        ),
    )
    assert round_trip(connected).connected.protocol_version == 19


def test_producer_round_trips() -> None:
    producer = Base(
        type=Base.PRODUCER,
        producer=api.CommandProducer(
            topic="persistent://public/default/t",
            producer_id=7,
            request_id=3,
            producer_access_mode=api.WaitForExclusive,
            metadata=[api.KeyValue(key="k", value="v")],
        ),
    )
    assert round_trip(producer).producer.producer_access_mode == api.WaitForExclusive


def test_message_with_broker_entry_metadata_round_trips() -> None:
    message = Base(
        type=Base.MESSAGE,
        message=api.CommandMessage(
            consumer_id=4,
            message_id=api.MessageIdData(ledgerId=10, entryId=20, partition=1),
            redelivery_count=2,
        ),
    )
    metadata = api.MessageMetadata(
        producer_name="prod",
        sequence_id=9,
        publish_time=1_700_000_000_000,
        partition_key="key",
        properties=[api.KeyValue(key="a", value="b")],
        event_time=123,
    )
    entry = api.BrokerEntryMetadata(broker_timestamp=1_700_000_000_001, index=41)
    frame_bytes = encode_message(message, metadata, b"\x00payload\xff", broker_entry_metadata=entry)
    # the spec's layout, built by hand, is what the encoder wrote
    assert frame_bytes == payload_frame(
        message.SerializeToString(),
        metadata.SerializeToString(),
        b"\x00payload\xff",
        entry=entry.SerializeToString(),
    )
    frame = decode_frame(body(frame_bytes))
    assert frame.command == message
    assert frame.payload is not None
    assert frame.payload.broker_entry_metadata == entry
    assert frame.payload.metadata == metadata
    assert bytes(frame.payload.payload) == b"\x00payload\xff"
    # what a producer sent can be sent on as it is, with or without the entry metadata
    again = codec.encode_payload_command(message, frame.payload.metadata_and_payload)
    assert decode_frame(body(again)).payload.metadata == metadata  # type: ignore[union-attr]


def test_batch_of_three_round_trips_in_a_send() -> None:
    singles = [
        (api.SingleMessageMetadata(payload_size=0, partition_key="k1"), b"one"),
        (
            api.SingleMessageMetadata(
                payload_size=0, properties=[api.KeyValue(key="x", value="y")]
            ),
            b"",
        ),
        (api.SingleMessageMetadata(payload_size=0, event_time=5, sequence_id=12), b"three" * 100),
    ]
    batch = encode_batch(singles)
    # by hand: [size][SingleMessageMetadata][payload] per message
    by_hand = b""
    for single_metadata, payload in singles:
        single = api.SingleMessageMetadata()
        single.CopyFrom(single_metadata)
        single.payload_size = len(payload)
        data = single.SerializeToString()
        by_hand += u32(len(data)) + data + payload
    assert batch == by_hand
    send = Base(type=Base.SEND, send=api.CommandSend(producer_id=1, sequence_id=10, num_messages=3))
    metadata = api.MessageMetadata(
        producer_name="p", sequence_id=10, publish_time=1, num_messages_in_batch=3
    )
    frame = decode_frame(body(encode_message(send, metadata, batch)))
    assert frame.payload is not None
    assert frame.payload.metadata.HasField("num_messages_in_batch")
    messages = decode_batch(frame.payload.payload, frame.payload.metadata.num_messages_in_batch)
    assert [bytes(m.payload) for m in messages] == [b"one", b"", b"three" * 100]
    assert messages[0].metadata.partition_key == "k1"
    assert messages[1].metadata.properties[0].value == "y"
    assert messages[2].metadata.sequence_id == 12


# --- refusals ---------------------------------------------------------------------------------


def test_a_frame_over_the_maximum_is_refused_by_the_framing() -> None:
    decoder = frame_decoder(max_frame_size=100)
    with pytest.raises(FrameTooLargeError, match="Pulsar frame of 101 bytes"):
        decoder.feed(u32(101) + u32(97))
    assert codec.DEFAULT_MAX_FRAME_SIZE == 5 * 1024 * 1024 + 10 * 1024


def test_a_bad_crc_is_refused() -> None:
    good = payload_frame(SEND_COMMAND, METADATA, b"hello")
    bad = good[:-1] + b"O"  # the last payload byte changed
    with pytest.raises(
        PulsarChecksumError, match=r"CRC-32C is 0x[0-9a-f]{8}, the frame says 0xdb396a81"
    ):
        decode_frame(body(bad))
    wrong_sum = good.replace(bytes.fromhex("db396a81"), bytes.fromhex("db396a80"))
    with pytest.raises(PulsarChecksumError):
        decode_frame(body(wrong_sum))


def test_a_bad_magic_is_refused() -> None:
    good = payload_frame(SEND_COMMAND, METADATA, b"hello")
    with pytest.raises(
        PulsarMagicError, match="0x0e03 where a SEND's checksum magic 0x0e01 belongs"
    ):
        decode_frame(body(good.replace(b"\x0e\x01", b"\x0e\x03")))
    # broker entry metadata belongs on MESSAGE only
    on_send = payload_frame(SEND_COMMAND, METADATA, b"x", entry=b"")
    with pytest.raises(PulsarMagicError, match="only MESSAGE carries it"):
        decode_frame(body(on_send))
    # a SEND whose payload has no checksum (protocol < v6) is not taken
    no_checksum = u32(len(SEND_COMMAND)) + SEND_COMMAND + u32(len(METADATA)) + METADATA + b"hi"
    with pytest.raises(PulsarMagicError, match="0x0000 where"):
        decode_frame(no_checksum)


def test_sizes_that_disagree_with_the_bytes_are_refused() -> None:
    with pytest.raises(PulsarSizeError, match="command_size 100 is over the 5 bytes"):
        decode_frame(u32(100) + PING_COMMAND)
    with pytest.raises(PulsarSizeError, match="inside its 4 bytes"):
        decode_frame(b"\x00\x00")
    with pytest.raises(PulsarSizeError, match="4 bytes follow a PING command"):
        decode_frame(u32(len(PING_COMMAND)) + PING_COMMAND + b"junk")
    with pytest.raises(PulsarSizeError, match="a SEND command without the payload"):
        decode_frame(u32(len(SEND_COMMAND)) + SEND_COMMAND)
    # metadata_size says more than there is, with a correct checksum over what there is
    checksummed = u32(1000) + METADATA
    tail = b"\x0e\x01" + u32(google_crc32c.value(checksummed)) + checksummed
    with pytest.raises(PulsarSizeError, match="metadata_size 1000 is over the 7 bytes"):
        decode_frame(u32(len(SEND_COMMAND)) + SEND_COMMAND + tail)
    message = Base(
        type=Base.MESSAGE,
        message=api.CommandMessage(
            consumer_id=1, message_id=api.MessageIdData(ledgerId=1, entryId=2)
        ),
    ).SerializeToString()
    with pytest.raises(PulsarSizeError, match="broker entry metadata of 4000000000 bytes"):
        decode_frame(u32(len(message)) + message + b"\x0e\x02" + u32(4_000_000_000) + b"abc")


def test_commands_that_lack_what_they_need_are_refused() -> None:
    with pytest.raises(PulsarCommandError, match="a SEND command without its send sub-message"):
        decode_frame(body(simple_frame(bytes.fromhex("0806"))))
    # SEND with send: {producer_id: 1} but no sequence_id
    with pytest.raises(PulsarCommandError, match=r"lacks required fields: send\.sequence_id"):
        decode_frame(body(simple_frame(bytes.fromhex("080632020801"))))
    # type 99 is not in this revision: the enum value is unknown, so the type is missing
    with pytest.raises(PulsarCommandError, match="without a type, or of a type"):
        decode_frame(body(simple_frame(bytes.fromhex("0863"))))
    with pytest.raises(PulsarCommandError, match="the command does not parse"):
        decode_frame(body(simple_frame(b"\xff\xff\xff")))
    # CONNECT whose client_version is not UTF-8
    bad_text = Base(type=Base.CONNECT, connect=api.CommandConnect(client_version="X"))
    raw = bad_text.SerializeToString().replace(b"X", b"\xff")
    with pytest.raises(
        PulsarCommandError, match=r"BaseCommand\.connect\.client_version is not UTF-8"
    ):
        decode_frame(body(simple_frame(raw)))
    # metadata that lacks its required fields, under a good checksum
    with pytest.raises(PulsarCommandError, match="the message metadata lacks required fields"):
        decode_frame(body(payload_frame(SEND_COMMAND, bytes.fromhex("1002"), b"x")))


def test_encoding_refuses_what_it_cannot_write_truthfully() -> None:
    with pytest.raises(PulsarCommandError, match="lacks required fields"):
        encode_command(Base(type=Base.CONNECT, connect=api.CommandConnect()))
    with pytest.raises(PulsarCommandError, match="use encode_payload_command"):
        encode_command(Base(type=Base.SEND, send=api.CommandSend(producer_id=1, sequence_id=1)))
    with pytest.raises(PulsarCommandError, match="a PING command carries no payload"):
        codec.encode_payload_command(Base(type=Base.PING), u32(0))
    send = Base(type=Base.SEND, send=api.CommandSend(producer_id=1, sequence_id=1))
    with pytest.raises(PulsarSizeError, match="must start with the size of the metadata"):
        codec.encode_payload_command(send, u32(50) + b"short")
    with pytest.raises(PulsarCommandError, match="only MESSAGE carries broker entry metadata"):
        codec.encode_payload_command(send, u32(0), broker_entry_metadata=api.BrokerEntryMetadata())


def test_batches_that_disagree_with_their_bytes_are_refused() -> None:
    batch = encode_batch([(api.SingleMessageMetadata(payload_size=0), b"abc")] * 2)
    assert len(decode_batch(batch, 2)) == 2
    with pytest.raises(PulsarSizeError, match="bytes follow the 1 messages"):
        decode_batch(batch, 1)
    with pytest.raises(PulsarSizeError, match="inside its 4 bytes"):
        decode_batch(batch, 3)
    with pytest.raises(PulsarSizeError, match="cannot fit in a batch"):
        decode_batch(batch, 2**31)  # no list is made by a count the bytes cannot hold
    with pytest.raises(PulsarSizeError, match="cannot be negative"):
        decode_batch(batch, -1)
    lying = api.SingleMessageMetadata(payload_size=1000).SerializeToString()
    with pytest.raises(PulsarSizeError, match="payload_size 1000 is not within the 3 bytes"):
        decode_batch(u32(len(lying)) + lying + b"abc", 1)
    with pytest.raises(PulsarSizeError, match="metadata of 99 bytes is over the 3 left"):
        decode_batch(u32(99) + b"abc", 1)
    with pytest.raises(PulsarCommandError, match="batched message 0's metadata lacks"):
        decode_batch(u32(0), 1)


def test_every_refusal_is_a_frame_error() -> None:
    for error in (PulsarSizeError, PulsarMagicError, PulsarChecksumError, PulsarCommandError):
        assert issubclass(error, PulsarFrameError)
        assert issubclass(error, FrameError)


def test_bytes_split_anywhere_decode_to_the_same_frames() -> None:
    send = Base(type=Base.SEND, send=api.CommandSend(producer_id=1, sequence_id=1))
    metadata = api.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
    frames = [
        encode_command(Base(type=Base.PING, ping=api.CommandPing())),
        encode_message(send, metadata, b"payload" * 50),
        encode_command(Base(type=Base.PONG, pong=api.CommandPong())),
    ]
    stream = b"".join(frames)
    decoder = frame_decoder()
    decoded = []
    for i in range(len(stream)):  # one byte at a time
        decoded += [decode_frame(b) for b in decoder.feed(stream[i : i + 1])]
    assert [f.type_name for f in decoded] == ["PING", "SEND", "PONG"]
    assert bytes(decoded[1].payload.payload) == b"payload" * 50  # type: ignore[union-attr]


# --- fuzz -------------------------------------------------------------------------------------

SEEDS = [
    simple_frame(PING_COMMAND),
    payload_frame(SEND_COMMAND, METADATA, b"hello"),
    encode_message(
        Base(
            type=Base.MESSAGE,
            message=api.CommandMessage(
                consumer_id=1, message_id=api.MessageIdData(ledgerId=1, entryId=2)
            ),
        ),
        api.MessageMetadata(
            producer_name="p", sequence_id=1, publish_time=1, num_messages_in_batch=2
        ),
        encode_batch([(api.SingleMessageMetadata(payload_size=0), b"ab")] * 2),
        broker_entry_metadata=api.BrokerEntryMetadata(index=5),
    ),
    encode_command(
        Base(type=Base.CONNECT, connect=api.CommandConnect(client_version="c", protocol_version=20))
    ),
]


def decode_everything(stream: bytes) -> None:
    """Cut, decode and unbatch like a connection would; only FrameError may come out."""
    decoder = frame_decoder(max_frame_size=4096)
    for frame_body in decoder.feed(stream):
        frame = decode_frame(frame_body)
        if frame.payload is not None and frame.payload.metadata.HasField("num_messages_in_batch"):
            decode_batch(frame.payload.payload, frame.payload.metadata.num_messages_in_batch)
    decoder.end()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "size"]))
        at = draw(st.integers(min_value=0, max_value=max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= draw(st.integers(min_value=1, max_value=255))
        elif kind == "cut":
            del data[at : at + draw(st.integers(min_value=1, max_value=8))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:  # a size field rewritten to something hostile
            data[at : at + 4] = u32(draw(st.sampled_from([0, 1, 3, 4, 2**31, 2**32 - 1])))
    return bytes(data)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.one_of(mutated(), st.binary(max_size=200)))
def test_fuzzed_frames_raise_nothing_but_frame_errors(stream: bytes) -> None:
    with contextlib.suppress(FrameError):
        decode_everything(stream)
