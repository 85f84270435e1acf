"""The Pulsar listener's settings and the pure parts of its adapter: ports, ack sets, errors,
and entries stored as a Pulsar producer sent them."""

from __future__ import annotations

import argparse
import zlib

import pytest

from bookie.client.config import LedgerClientConfig
from broker.pulsar.codec import Payload, encode_batch, encode_metadata_and_payload
from broker.pulsar.connection import ack_set_indexes, ack_set_words
from broker.pulsar.entries import (
    UnsupportedFeatureError,
    incoming_batch,
    last_batch_index,
    magnetar_entry,
    pulsar_metadata_and_payload,
)
from broker.pulsar.errors import server_error
from broker.service.config import DEFAULT_PULSAR_PORT, BrokerConfig
from broker.service.envelope import IncomingBatch, build_envelope
from broker.service.validation import BatchLimits
from magnetar.cli.standalone import StandaloneConfig
from magnetar.common.config import add_config_arguments, config_overrides_from_args, load_config
from magnetar.common.errors import (
    InvalidConfigError,
    InvalidTopicNameError,
    MessageTooLargeError,
    MetadataUnavailableError,
    ProducerBusyError,
    ProducerFencedError,
    ProtocolError,
    StorageError,
    TopicNotFoundError,
    TopicNotOwnedError,
)
from magnetar.common.keys import key_hash
from proto.format.v1 import entry_pb2
from proto.pulsar import PulsarApi_pb2 as api

LIMITS = BatchLimits(max_message_bytes=1000, max_messages=100)


def test_the_default_pulsar_port_clashes_with_none_of_magnetars() -> None:
    config = BrokerConfig(metadata="memory://")
    assert config.pulsar_port == DEFAULT_PULSAR_PORT
    assert DEFAULT_PULSAR_PORT not in {config.port, config.tls_port, config.http_port, 3181, 8000}
    assert BrokerConfig(metadata="memory://", pulsar_port=None).pulsar_port is None


def test_two_listeners_on_one_fixed_port_are_refused_naming_both() -> None:
    with pytest.raises(InvalidConfigError, match="pulsar_port") as e:
        BrokerConfig(metadata="memory://", pulsar_port=8080)
    assert "http_port's port" in e.value.message
    with pytest.raises(InvalidConfigError, match="pulsar_port"):
        BrokerConfig(metadata="memory://", pulsar_port=70000)
    # any free port (0) twice is no clash
    assert BrokerConfig(metadata="memory://", port=0, pulsar_port=0, http_port=0).pulsar_port == 0


def test_standalone_takes_pulsar_tools_hard_coded_ports() -> None:
    # `magnetar standalone --pulsar-port 6650 --http-port 8080`, as parsed from its flags
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, StandaloneConfig)
    args = parser.parse_args(["--pulsar-port", "6650", "--http-port", "8080"])
    config = load_config(
        StandaloneConfig, env={}, overrides=config_overrides_from_args(args, StandaloneConfig)
    )
    assert (config.pulsar_port, config.http_port) == (6650, 8080)
    broker = config.broker_config(ledger=_ledger())
    assert (broker.pulsar_port, broker.port, broker.http_port) == (6650, DEFAULT_PULSAR_PORT, 8080)
    # without the clash, gRPC keeps its port
    assert StandaloneConfig().broker_config(ledger=_ledger()).port == 6650
    with pytest.raises(InvalidConfigError, match="pulsar_port"):
        StandaloneConfig(port=DEFAULT_PULSAR_PORT, pulsar_port=DEFAULT_PULSAR_PORT)


def _ledger() -> LedgerClientConfig:
    return LedgerClientConfig()


def test_ack_sets_are_java_bitsets_of_the_messages_still_unacknowledged() -> None:
    assert ack_set_words(()) == []
    assert ack_set_words((0, 2)) == [0b101]
    assert ack_set_words((63,)) == [-(2**63)]  # the sign bit of a Java long
    assert ack_set_words((64,)) == [0, 1]
    # set bits are unacknowledged: the clear ones below the batch size are what is acked
    assert ack_set_indexes([0b101], 4) == (1, 3)
    assert ack_set_indexes(ack_set_words((3, 70)), 72) == tuple(
        i for i in range(72) if i not in (3, 70)
    )
    assert ack_set_indexes([], 3) == (0, 1, 2)


def test_retriable_and_infrastructure_errors_tell_pulsar_clients_to_retry() -> None:
    assert server_error(TopicNotOwnedError("moved")) == api.ServiceNotReady
    assert server_error(MetadataUnavailableError("etcd")) == api.ServiceNotReady
    assert server_error(StorageError("disk")) == api.ServiceNotReady
    assert server_error(TopicNotFoundError("gone")) == api.TopicNotFound
    assert server_error(ProducerBusyError("shared behind an exclusive")) == api.ProducerBusy
    assert server_error(ProducerFencedError("exclusive behind another")) == api.ProducerFenced
    assert server_error(InvalidTopicNameError("bad")) == api.InvalidTopicName
    assert server_error(UnsupportedFeatureError("later")) == api.NotAllowedError


def _payload(metadata: api.MessageMetadata, payload: bytes) -> Payload:
    body = encode_metadata_and_payload(metadata, payload)
    return Payload(
        metadata, body, memoryview(body)[-len(payload) :] if payload else memoryview(b""), 0
    )


def test_a_pulsar_send_is_stored_as_sent_with_what_the_log_needs_beside_it() -> None:
    metadata = api.MessageMetadata(
        producer_name="p", sequence_id=5, publish_time=1, partition_key="k", deliver_at_time=77
    )
    payload = _payload(metadata, b"value")
    batch = incoming_batch(payload, sequence_id=5, highest_sequence_id=0, limits=LIMITS)
    assert batch.batch == payload.metadata_and_payload
    assert batch.format == entry_pb2.ENTRY_FORMAT_PULSAR
    assert (batch.sequence_id, batch.last_sequence_id, batch.num_messages) == (5, 5, 1)
    assert batch.key_hashes == (key_hash("k"),)
    assert batch.deliver_at_ms == 77
    entry = build_envelope("p", batch, first_offset=0, publish_time_ms=1)
    assert pulsar_metadata_and_payload(entry, 10_000) == payload.metadata_and_payload
    assert last_batch_index(entry) == -1


def test_a_batch_is_checked_where_the_broker_can_open_it() -> None:
    messages = [
        (api.SingleMessageMetadata(partition_key=k, ordering_key=o), b"v")
        for k, o in (("a", b""), ("b", b"x"), ("c", b""))
    ]
    raw = encode_batch(messages)
    for compression, body in ((api.NONE, raw), (api.ZLIB, zlib.compress(raw))):
        metadata = api.MessageMetadata(
            producer_name="p",
            sequence_id=1,
            publish_time=1,
            num_messages_in_batch=3,
            compression=compression,
            uncompressed_size=len(raw),
        )
        batch = incoming_batch(
            _payload(metadata, body), sequence_id=1, highest_sequence_id=3, limits=LIMITS
        )
        # the ordering key wins over the key, as key_shared routes in Pulsar
        assert batch.key_hashes == (key_hash("a"), key_hash("x"), key_hash("c"))
        assert (batch.num_messages, batch.last_sequence_id) == (3, 3)
        entry = build_envelope("p", batch, 0, 1)
        assert last_batch_index(entry) == 2
        lying = api.MessageMetadata()
        lying.CopyFrom(metadata)
        lying.num_messages_in_batch = 4
        with pytest.raises(ProtocolError, match="not what its metadata says"):
            incoming_batch(
                _payload(lying, body), sequence_id=1, highest_sequence_id=4, limits=LIMITS
            )
    # LZ4, ZSTD and SNAPPY are opened too (tests/unit/broker/test_pulsar_compression.py)
    lz4 = api.MessageMetadata(
        producer_name="p", sequence_id=1, publish_time=1, num_messages_in_batch=3,
        compression=api.LZ4, uncompressed_size=len(raw),
    )  # fmt: skip
    with pytest.raises(ProtocolError, match="a payload marked LZ4 does not decode"):
        incoming_batch(
            _payload(lz4, b"opaque"), sequence_id=1, highest_sequence_id=3, limits=LIMITS
        )


def test_a_chunk_is_stored_as_sent_and_checked_for_what_consumers_rely_on() -> None:
    base = {"producer_name": "p", "sequence_id": 1, "publish_time": 1}
    whole = {"uuid": "p-1", "num_chunks_from_msg": 3, "total_chunk_msg_size": 30}
    chunk = api.MessageMetadata(**base, **whole, chunk_id=1)  # type: ignore[arg-type]
    stored = incoming_batch(
        _payload(chunk, b"c" * 10), sequence_id=1, highest_sequence_id=0, limits=LIMITS
    )
    assert (stored.chunk_id, stored.num_chunks, stored.num_messages) == (1, 3, 1)
    assert not stored.completes_message
    last = api.MessageMetadata(**base, **whole, chunk_id=2)  # type: ignore[arg-type]
    assert incoming_batch(
        _payload(last, b"c"), sequence_id=1, highest_sequence_id=0, limits=LIMITS
    ).completes_message
    # a Magnetar consumer cannot read a part of a message: it gets it unchanged, and skips it
    entry = build_envelope("p", stored, 0, 1)
    assert magnetar_entry(entry, 1 << 20) == entry
    bad = [
        ({**whole, "chunk_id": 3}, "chunk_id=3 of num_chunks_from_msg=3"),
        ({**whole, "chunk_id": -1}, "chunk_id=-1"),
        ({**whole, "uuid": ""}, "needs the uuid"),
        ({**whole, "total_chunk_msg_size": 0}, "total_chunk_msg_size=0"),
        ({**whole, "num_messages_in_batch": 1}, "cannot be a batch"),
    ]
    for fields, named in bad:
        with pytest.raises(ProtocolError, match=named):
            incoming_batch(
                _payload(api.MessageMetadata(**base, **fields), b"c"),  # type: ignore[arg-type]
                sequence_id=1,
                highest_sequence_id=0,
                limits=LIMITS,
            )


def test_what_the_broker_does_not_offer_yet_is_refused_naming_it() -> None:
    base = {"producer_name": "p", "sequence_id": 1, "publish_time": 1}
    keys = [api.EncryptionKeys(key="k", value=b"v")]
    with pytest.raises(UnsupportedFeatureError, match="encrypted messages"):
        incoming_batch(
            _payload(api.MessageMetadata(**base, encryption_keys=keys), b"c"),  # type: ignore[arg-type]
            sequence_id=1,
            highest_sequence_id=0,
            limits=LIMITS,
        )
    with pytest.raises(MessageTooLargeError, match="over the broker's limit of 1,000"):
        incoming_batch(
            _payload(api.MessageMetadata(**base), b"x" * 1001),  # type: ignore[arg-type]
            sequence_id=1,
            highest_sequence_id=0,
            limits=LIMITS,
        )


def test_a_magnetar_batch_reaches_a_pulsar_consumer_as_a_pulsar_batch() -> None:
    batch = entry_pb2.MessageBatch(
        messages=[
            entry_pb2.BatchedMessage(value=b"one", partition_key="k", properties={"a": "b"}),
            entry_pb2.BatchedMessage(value=b"two", event_time_ms=42),
        ]
    ).SerializeToString()
    entry = build_envelope(
        "magnetar-producer",
        IncomingBatch(1, 7, 8, 2, zlib.compress(batch), 2, len(batch)),  # COMPRESSION_TYPE_ZLIB
        first_offset=0,
        publish_time_ms=1234,
    )
    body = pulsar_metadata_and_payload(entry, 10_000)
    size = int.from_bytes(body[:4], "big")
    metadata = api.MessageMetadata.FromString(body[4 : 4 + size])
    assert (metadata.producer_name, metadata.sequence_id, metadata.publish_time) == (
        "magnetar-producer",
        7,
        1234,
    )
    assert metadata.num_messages_in_batch == 2
    assert metadata.compression == api.NONE
    from broker.pulsar.codec import decode_batch  # noqa: PLC0415

    one, two = decode_batch(body[4 + size :], 2)
    assert (bytes(one.payload), one.metadata.partition_key) == (b"one", "k")
    assert [(p.key, p.value) for p in one.metadata.properties] == [("a", "b")]
    assert (bytes(two.payload), two.metadata.event_time) == (b"two", 42)
    assert last_batch_index(entry) == 1
