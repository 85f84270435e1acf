"""The real ``pulsar-client`` from PyPI (its C++ core, unmodified) against a Magnetar standalone's
Pulsar-protocol listener: produce, consume, acks, redelivery, lookups, partitioned topics,
readers and deduplication. One standalone (one bookie) serves the whole module.

The Pulsar client is synchronous: the tests call it from a thread (``run``), so that the
module's event loop, which owns the standalone, stays free.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import re
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import cramjam
import pulsar  # the real pulsar-client from PyPI (its C++ core)
import pytest
import pytest_asyncio

import magnetar
from broker.pulsar.codec import Frame, encode_batch, encode_command, encode_message
from broker.service.config import BrokerConfig
from magnetar.common.framing import FrameError
from magnetar.testing import StandaloneNode
from proto.pulsar import PulsarApi_pb2 as api
from tests.interop.pulsar_raw import RawConnection, command

T = TypeVar("T")

on_node = pytest.mark.asyncio(loop_scope="module")
pytestmark = on_node


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def standalone(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StandaloneNode]:
    async with StandaloneNode(tmp_path_factory.mktemp("pulsar") / "data", bookies=1) as node:
        yield node


@pytest.fixture(scope="module")
def client(standalone: StandaloneNode) -> Iterator[pulsar.Client]:
    client = pulsar.Client(
        standalone.pulsar_url,
        operation_timeout_seconds=15,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    yield client
    client.close()


async def run(step: Callable[[], T]) -> T:
    """A blocking Pulsar client call, off the event loop."""
    return await asyncio.to_thread(step)


def topic_name(what: str) -> str:
    return f"persistent://public/default/{what}-{uuid.uuid4().hex[:8]}"


def receive_all(consumer: pulsar.Consumer, count: int, timeout_ms: int = 10_000) -> list[Any]:
    return [consumer.receive(timeout_ms) for _ in range(count)]


def nothing_more(consumer: pulsar.Consumer, wait_ms: int = 300) -> bool:
    try:
        message = consumer.receive(wait_ms)
    except pulsar.Timeout:
        return True
    print(f"unexpected: {message.data()!r} {message.message_id()} {message.redelivery_count()}")
    return False


async def test_produce_and_consume_keep_payload_key_properties_event_time_and_order(
    client: pulsar.Client,
) -> None:
    topic = topic_name("basic")

    def steps() -> None:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        sent_ids = [
            producer.send(
                f"sync-{i}".encode(),
                properties={"i": str(i)},
                partition_key=f"key-{i % 3}",
                event_timestamp=1_700_000_000_000 + i,
            )
            for i in range(5)
        ]
        done: list[Any] = []
        for i in range(5):
            producer.send_async(f"async-{i}".encode(), lambda result, msg_id: done.append(result))
        producer.flush()
        assert done == [pulsar.Result.Ok] * 5
        messages = receive_all(consumer, 10)
        assert [m.data() for m in messages] == [f"sync-{i}".encode() for i in range(5)] + [
            f"async-{i}".encode() for i in range(5)
        ]
        for i, m in enumerate(messages[:5]):
            assert m.properties() == {"i": str(i)}
            assert m.partition_key() == f"key-{i % 3}"
            assert m.event_timestamp() == 1_700_000_000_000 + i
            assert m.publish_timestamp() > 0
            # the id the receipt gave is the id the message comes with
            assert m.message_id().ledger_id() == sent_ids[i].ledger_id()
            assert m.message_id().entry_id() == sent_ids[i].entry_id()
            assert m.message_id().partition() == -1  # not a partition of a partitioned topic
            assert m.message_id().batch_index() == -1  # sent unbatched
        for m in messages:
            consumer.acknowledge(m)
        assert nothing_more(consumer)
        producer.close()
        consumer.close()

    await run(steps)


@pytest.mark.parametrize(
    "compression",
    [
        pulsar.CompressionType.NONE,
        pulsar.CompressionType.LZ4,
        pulsar.CompressionType.ZSTD,
        pulsar.CompressionType.SNAPPY,
    ],
    ids=["none", "lz4", "zstd", "snappy"],
)
async def test_batches_are_stored_and_delivered_as_the_producer_sent_them(
    client: pulsar.Client, standalone: StandaloneNode, compression: pulsar.CompressionType
) -> None:
    topic = topic_name("batched")

    def produce_and_consume() -> None:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(
            topic,
            batching_enabled=True,
            batching_max_messages=20,
            batching_max_publish_delay_ms=50,
            compression_type=compression,
        )
        for i in range(20):
            producer.send_async(b"x" * 100 + str(i).encode(), lambda *_: None)
        producer.flush()
        messages = receive_all(consumer, 20)
        assert [m.data() for m in messages] == [b"x" * 100 + str(i).encode() for i in range(20)]
        assert {m.message_id().batch_index() for m in messages} == set(range(20))
        for m in messages:
            consumer.acknowledge(m)
        producer.close()
        consumer.close()

    await run(produce_and_consume)
    # a consumer speaking the protocol by hand sees the batch's metadata as the client wrote
    # it: compressed as it was, one entry of 20 messages (nothing was transcoded)
    assert standalone.pulsar_address is not None
    async with RawConnection.open(standalone.pulsar_address) as raw:
        await raw.subscribe(topic, "raw", consumer_id=1, earliest=True)
        await raw.flow(1, 100)
        message = await raw.expect("MESSAGE")
        assert message.payload is not None
        metadata = message.payload.metadata
        assert metadata.compression == int(compression)
        assert metadata.num_messages_in_batch == 20
        assert message.command.message.message_id.partition == -1


async def test_subscription_types(client: pulsar.Client) -> None:
    topic = topic_name("types")

    def steps() -> None:
        producer = client.create_producer(topic)
        first = client.subscribe(topic, "exclusive")
        with pytest.raises(pulsar.exceptions.ConsumerBusy):
            client.subscribe(topic, "exclusive")
        shared = [
            client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
            for _ in range(2)
        ]
        keyed = [
            client.subscribe(topic, "keyed", consumer_type=pulsar.ConsumerType.KeyShared)
            for _ in range(2)
        ]
        failover = [
            client.subscribe(
                topic, "failover", consumer_type=pulsar.ConsumerType.Failover, consumer_name=n
            )
            for n in ("a", "b")
        ]
        for i in range(20):
            producer.send(str(i).encode(), partition_key=f"k{i % 4}")
        assert [m.data() for m in receive_all(first, 20)] == [str(i).encode() for i in range(20)]

        def drain(consumers: list[pulsar.Consumer]) -> list[list[Any]]:
            got: list[list[Any]] = [[] for _ in consumers]
            total = 0
            deadline = time.monotonic() + 15
            while total < 20 and time.monotonic() < deadline:
                for index, consumer in enumerate(consumers):
                    try:
                        message = consumer.receive(100)
                    except pulsar.Timeout:
                        continue
                    consumer.acknowledge(message)
                    got[index].append(message)
                    total += 1
            return got

        shared_got = drain(shared)
        assert sorted(int(m.data()) for ms in shared_got for m in ms) == list(range(20))
        assert all(shared_got), "both shared consumers get messages"
        keyed_got = drain(keyed)
        assert sorted(int(m.data()) for ms in keyed_got for m in ms) == list(range(20))
        keys_by_consumer = [{m.partition_key() for m in ms} for ms in keyed_got]
        assert not keys_by_consumer[0] & keys_by_consumer[1], "a key goes to one consumer"
        for ms in keyed_got:  # per key, in order
            for key in {m.partition_key() for m in ms}:
                values = [int(m.data()) for m in ms if m.partition_key() == key]
                assert values == sorted(values)
        failover_got = drain(failover)
        assert [len(ms) > 0 for ms in failover_got].count(True) == 1, "one active consumer"
        for consumer in [first, *shared, *keyed, *failover]:
            consumer.close()
        producer.close()

    await run(steps)


async def test_acks_negative_acks_and_redelivery(client: pulsar.Client) -> None:
    topic = topic_name("acks")

    def steps() -> None:
        producer = client.create_producer(topic)
        consumer = client.subscribe(
            topic,
            "sub",
            initial_position=pulsar.InitialPosition.Earliest,
            negative_ack_redelivery_delay_ms=100,
        )
        for i in range(6):
            producer.send(str(i).encode())
        messages = receive_all(consumer, 6)
        consumer.acknowledge(messages[0])
        consumer.acknowledge_cumulative(messages[2])  # 1 and 2
        consumer.negative_acknowledge(messages[3])
        again = consumer.receive(10_000)
        assert again.data() == b"3"
        assert again.redelivery_count() == 1
        consumer.acknowledge(again)
        time.sleep(0.3)  # the client holds acks for up to 100 ms
        consumer.redeliver_unacknowledged_messages()  # 4 and 5 come again
        redelivered = sorted(m.data() for m in receive_all(consumer, 2))
        assert redelivered == [b"4", b"5"]
        consumer.close()
        # the cursor kept what was acknowledged: only 4 and 5 come to the next consumer
        resubscribed = client.subscribe(topic, "sub")
        rest = receive_all(resubscribed, 2)
        assert [m.data() for m in rest] == [b"4", b"5"]
        for m in rest:
            resubscribed.acknowledge(m)
        assert nothing_more(resubscribed)
        resubscribed.close()
        producer.close()

    await run(steps)


async def test_batch_index_acks(client: pulsar.Client) -> None:
    topic = topic_name("batch-acks")

    def steps() -> None:
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=50
        )
        consumer = client.subscribe(
            topic,
            "sub",
            initial_position=pulsar.InitialPosition.Earliest,
            batch_index_ack_enabled=True,
        )
        for i in range(10):
            producer.send_async(str(i).encode(), lambda *_: None)
        producer.flush()
        messages = receive_all(consumer, 10)
        assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in messages}) == 1
        for m in messages[:6]:
            consumer.acknowledge(m)
        time.sleep(0.3)  # the client groups acks for up to 100 ms
        consumer.close()
        resubscribed = client.subscribe(topic, "sub", batch_index_ack_enabled=True)
        rest = receive_all(resubscribed, 4)
        assert [m.data() for m in rest] == [str(i).encode() for i in range(6, 10)]
        resubscribed.close()
        producer.close()

    await run(steps)


async def test_partitioned_topics_lookups_and_pattern_consumers(
    client: pulsar.Client, standalone: StandaloneNode
) -> None:
    base = f"parts-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{base}"
    admin = magnetar.AdminClient(standalone.service_url)
    try:
        await asyncio.to_thread(admin.create_topic, topic, 3)
    finally:
        await asyncio.to_thread(admin.close)

    def steps() -> None:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        # the C++ client matches a pattern against topic names, partitions folded into their
        # topic (Pulsar's GET_TOPICS_OF_NAMESPACE answers partitions, as Magnetar's does)
        pattern = client.subscribe(
            re.compile(f"persistent://public/default/{base}.*"),
            "pattern",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        producer = client.create_producer(
            topic, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution
        )
        for i in range(30):
            producer.send(str(i).encode())
        messages = receive_all(consumer, 30)
        assert sorted(int(m.data()) for m in messages) == list(range(30))
        assert {m.message_id().partition() for m in messages} == {0, 1, 2}
        for m in messages:
            assert m.topic_name().endswith(f"{base}-partition-{m.message_id().partition()}")
            consumer.acknowledge(m)
        patterned = receive_all(pattern, 30)
        assert sorted(int(m.data()) for m in patterned) == list(range(30))
        for consumer_ in (consumer, pattern):
            consumer_.close()
        producer.close()

    await run(steps)


async def test_readers_and_the_last_message_id(client: pulsar.Client) -> None:
    topic = topic_name("readers")

    def steps() -> None:
        producer = client.create_producer(topic)
        empty = client.create_reader(topic, pulsar.MessageId.earliest)
        assert not empty.has_message_available()
        ids = [producer.send(str(i).encode()) for i in range(5)]
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert [reader.read_next(10_000).data() for _ in range(5)] == [
            str(i).encode() for i in range(5)
        ]
        assert not reader.has_message_available()
        after = client.create_reader(topic, ids[2])
        assert after.read_next(10_000).data() == b"3"
        inclusive = client.create_reader(topic, ids[2], start_message_id_inclusive=True)
        assert inclusive.read_next(10_000).data() == b"2"
        latest = client.create_reader(topic, pulsar.MessageId.latest)
        producer.send(b"new")
        assert latest.read_next(10_000).data() == b"new"
        for r in (empty, reader, after, inclusive, latest):
            r.close()
        producer.close()

    await run(steps)


async def test_deduplication_by_producer_name_and_sequence_id(client: pulsar.Client) -> None:
    topic = topic_name("dedup")

    def steps() -> None:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, producer_name="dedup-producer")
        for i in range(3):
            producer.send(str(i).encode(), sequence_id=i)
        producer.close()
        again = client.create_producer(topic, producer_name="dedup-producer")
        assert again.last_sequence_id() == 2
        again.send(b"1-again", sequence_id=1)  # answered as stored, and not stored again
        again.send(b"3", sequence_id=3)
        assert [m.data() for m in receive_all(consumer, 4)] == [b"0", b"1", b"2", b"3"]
        assert nothing_more(consumer)
        again.close()
        consumer.close()

    await run(steps)


async def test_unsubscribe(client: pulsar.Client, standalone: StandaloneNode) -> None:
    topic = topic_name("unsubscribe")

    def steps() -> None:
        producer = client.create_producer(topic)
        one = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
        two = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
        with pytest.raises(pulsar.exceptions.ConsumerBusy):
            one.unsubscribe()  # another consumer is attached
        two.close()
        producer.send(b"kept until unsubscribed")
        one.unsubscribe()
        producer.close()

    await run(steps)
    admin = magnetar.AdminClient(standalone.service_url)
    try:
        subscriptions = await asyncio.to_thread(admin.list_subscriptions, topic)
    finally:
        await asyncio.to_thread(admin.close)
    assert "shared" not in subscriptions


# --- the protocol by hand -------------------------------------------------------------------------


async def test_connected_carries_the_lower_protocol_version_and_pings_are_answered(
    standalone: StandaloneNode,
) -> None:
    assert standalone.pulsar_address is not None
    for client_version, expected in ((20, 19), (19, 19), (12, 12)):
        async with RawConnection.open(standalone.pulsar_address, connect=False) as raw:
            connected = await raw.connect(client_version)
            assert connected.protocol_version == expected
            assert connected.server_version.startswith("Magnetar")
            assert connected.max_message_size > 0
            raw.send("PING", ping=api.CommandPing())
            await raw.expect("PONG")
    # older than v6 (no checksums): refused, naming the version
    async with RawConnection.open(standalone.pulsar_address, connect=False) as raw:
        raw.send(
            "CONNECT",
            connect=api.CommandConnect(client_version="ancient", protocol_version=5),
        )
        error = (await raw.expect("ERROR")).command.error
        assert error.error == api.UnsupportedVersionError
        assert "protocol version 5" in error.message
        assert await raw.closed_by_broker()


async def test_bad_input_closes_that_connection_and_touches_nothing_else(
    client: pulsar.Client, standalone: StandaloneNode
) -> None:
    topic = topic_name("bad-input")
    producer = await run(lambda: client.create_producer(topic))
    consumer = await run(
        lambda: client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    )
    address = standalone.pulsar_address
    assert address is not None

    async def garbage(raw: RawConnection) -> None:
        raw.write(b"\x00\x00\x00\x08GARBAGE!")

    async def too_large(raw: RawConnection) -> None:
        raw.write(struct.pack(">I", 64 * 1024 * 1024) + b"\x00" * 1024)

    async def bad_checksum(raw: RawConnection) -> None:
        await raw.create_producer(topic, producer_id=7)
        frame = bytearray(
            encode_message(
                command("SEND", send=api.CommandSend(producer_id=7, sequence_id=0)),
                api.MessageMetadata(producer_name="raw", sequence_id=0, publish_time=1),
                b"payload",
            )
        )
        frame[-1] ^= 0xFF  # the payload no longer matches its CRC-32C
        raw.write(bytes(frame))

    async def unknown_producer(raw: RawConnection) -> None:
        raw.send_message(producer_id=99, sequence_id=0, payload=b"to nobody")

    async def broker_command(raw: RawConnection) -> None:
        raw.send("SUCCESS", success=api.CommandSuccess(request_id=1))

    cases = {
        "garbage": (garbage, True),
        "a frame over the maximum size": (too_large, True),
        "a command before CONNECT": (None, False),
        "a bad CRC": (bad_checksum, True),
        "a SEND for an unknown producer": (unknown_producer, True),
        "a command only a broker sends": (broker_command, True),
    }
    for i, (case, (act, connect)) in enumerate(cases.items()):
        async with RawConnection.open(address, connect=connect) as raw:
            if act is None:
                raw.send("PING", ping=api.CommandPing())
            else:
                await act(raw)
            assert await raw.closed_by_broker(), case
        # the real client's producer and consumer on the same broker go on as if nothing was
        await run(lambda i=i: producer.send(f"after {i}".encode()))  # type: ignore[misc]
        message = await run(lambda: consumer.receive(10_000))
        assert message.data() == f"after {i}".encode(), case
    await run(producer.close)
    await run(consumer.close)


async def test_failed_requests_are_answered_in_their_own_response(
    standalone: StandaloneNode,
) -> None:
    address = standalone.pulsar_address
    assert address is not None
    topic = topic_name("answers")
    async with RawConnection.open(address) as raw:
        raw.send(
            "PARTITIONED_METADATA",
            partitionMetadata=api.CommandPartitionedTopicMetadata(topic="a/b/c/d", request_id=1),
        )
        metadata = (await raw.expect("PARTITIONED_METADATA_RESPONSE")).command
        assert metadata.partitionMetadataResponse.request_id == 1
        assert (
            metadata.partitionMetadataResponse.response == metadata.partitionMetadataResponse.Failed
        )
        assert metadata.partitionMetadataResponse.error == api.InvalidTopicName
        assert "invalid topic name" in metadata.partitionMetadataResponse.message

        raw.send("LOOKUP", lookupTopic=api.CommandLookupTopic(topic="a/b/c/d", request_id=2))
        lookup = (await raw.expect("LOOKUP_RESPONSE")).command.lookupTopicResponse
        assert (lookup.request_id, lookup.response) == (2, lookup.Failed)
        assert lookup.error == api.InvalidTopicName

        raw.send("LOOKUP", lookupTopic=api.CommandLookupTopic(topic=topic, request_id=3))
        lookup = (await raw.expect("LOOKUP_RESPONSE")).command.lookupTopicResponse
        assert (lookup.request_id, lookup.response) == (3, lookup.Connect)
        assert lookup.brokerServiceUrl == standalone.pulsar_url

        raw.send(
            "PRODUCER",
            producer=api.CommandProducer(topic=topic, producer_id=1, request_id=4, encrypted=True),
        )
        error = (await raw.expect("ERROR")).command.error
        assert (error.request_id, error.error) == (4, api.NotAllowedError)
        assert "encrypted producers are not supported yet" in error.message

        raw.send("GET_SCHEMA", getSchema=api.CommandGetSchema(request_id=5, topic=topic))
        schema = (await raw.expect("GET_SCHEMA_RESPONSE")).command.getSchemaResponse
        assert (schema.request_id, schema.error_code) == (5, api.TopicNotFound)
        assert not schema.HasField("schema")

        raw.send(
            "CONSUMER_STATS", consumerStats=api.CommandConsumerStats(request_id=6, consumer_id=1)
        )
        error = (await raw.expect("ERROR")).command.error
        assert (error.request_id, error.error) == (6, api.NotAllowedError)
        assert "CONSUMER_STATS is not supported" in error.message
        raw.send("SEEK", seek=api.CommandSeek(consumer_id=1, request_id=12, message_publish_time=1))
        error = (await raw.expect("ERROR")).command.error
        assert (error.request_id, error.error) == (12, api.NotAllowedError)
        assert "consumer 1 is not on this connection" in error.message

        # a batch that is not what its metadata says: SEND_ERROR, and the producer goes on
        await raw.create_producer(topic, producer_id=2)
        lying = api.MessageMetadata(
            producer_name="raw", sequence_id=0, publish_time=1, num_messages_in_batch=3
        )
        one = encode_batch([(api.SingleMessageMetadata(), b"only one")])
        raw.send_message(producer_id=2, sequence_id=0, payload=one, metadata=lying)
        send_error = (await raw.expect("SEND_ERROR")).command.send_error
        assert (send_error.producer_id, send_error.sequence_id) == (2, 0)
        assert send_error.error == api.NotAllowedError
        assert "not what its metadata says" in send_error.message
        raw.send_message(producer_id=2, sequence_id=1, payload=b"fine")
        receipt = (await raw.expect("SEND_RECEIPT")).command.send_receipt
        assert (receipt.producer_id, receipt.sequence_id) == (2, 1)

        raw.send(
            "GET_TOPICS_OF_NAMESPACE",
            getTopicsOfNamespace=api.CommandGetTopicsOfNamespace(
                request_id=7, namespace="public/default"
            ),
        )
        topics = (await raw.expect("GET_TOPICS_OF_NAMESPACE_RESPONSE")).command
        assert topic in topics.getTopicsOfNamespaceResponse.topics
        raw.send("PING", ping=api.CommandPing())
        await raw.expect("PONG")  # the connection lived through every refusal


async def test_acks_with_a_request_id_get_an_ack_response(standalone: StandaloneNode) -> None:
    address = standalone.pulsar_address
    assert address is not None
    topic = topic_name("ack-receipts")
    async with RawConnection.open(address) as raw:
        await raw.create_producer(topic, producer_id=1)
        for sequence_id in range(2):
            raw.send_message(producer_id=1, sequence_id=sequence_id, payload=b"m%d" % sequence_id)
            await raw.expect("SEND_RECEIPT")
        await raw.subscribe(topic, "sub", consumer_id=5, earliest=True)
        await raw.flow(5, 10)
        messages = [await raw.expect("MESSAGE") for _ in range(2)]
        assert [bytes(m.payload.payload) for m in messages if m.payload] == [b"m0", b"m1"]
        # not asked for in CONNECT: no broker entry metadata
        assert all(m.payload and m.payload.broker_entry_metadata is None for m in messages)
        ids = [m.command.message.message_id for m in messages]
        # request id 0 is a client's first request id: it gets its receipt too
        raw.send(
            "ACK",
            ack=api.CommandAck(
                consumer_id=5,
                ack_type=api.CommandAck.Individual,
                message_id=[api.MessageIdData(ledgerId=ids[0].ledgerId, entryId=ids[0].entryId)],
                request_id=0,
            ),
        )
        response = (await raw.expect("ACK_RESPONSE")).command.ackResponse
        assert (response.consumer_id, response.request_id) == (5, 0)
        assert not response.HasField("error")
        raw.send(
            "ACK",
            ack=api.CommandAck(
                consumer_id=77,
                ack_type=api.CommandAck.Cumulative,
                message_id=[api.MessageIdData(ledgerId=ids[1].ledgerId, entryId=ids[1].entryId)],
                request_id=9,
            ),
        )
        response = (await raw.expect("ACK_RESPONSE")).command.ackResponse
        assert (response.consumer_id, response.request_id) == (77, 9)
        assert response.error == api.ConsumerNotFound
        raw.send(
            "ACK",
            ack=api.CommandAck(
                consumer_id=5,
                ack_type=api.CommandAck.Cumulative,
                message_id=[api.MessageIdData(ledgerId=ids[1].ledgerId, entryId=ids[1].entryId)],
                request_id=10,
            ),
        )
        response = (await raw.expect("ACK_RESPONSE")).command.ackResponse
        assert (response.request_id, response.HasField("error")) == (10, False)
        raw.send(
            "CLOSE_CONSUMER", close_consumer=api.CommandCloseConsumer(consumer_id=5, request_id=11)
        )
        assert (await raw.expect("SUCCESS")).command.success.request_id == 11
        await raw.subscribe(topic, "sub", consumer_id=6)
        await raw.flow(6, 10)
        with pytest.raises(TimeoutError):
            await raw.read(timeout_s=0.5)  # both were acknowledged: nothing comes again


async def test_both_protocols_on_one_topic(
    client: pulsar.Client, standalone: StandaloneNode
) -> None:
    topic = topic_name("cross")

    def steps() -> None:
        ours = magnetar.Client(standalone.service_url)
        try:
            pulsar_consumer = client.subscribe(
                topic, "pulsar-side", initial_position=pulsar.InitialPosition.Earliest
            )
            magnetar_consumer = ours.subscribe(topic, "magnetar-side", initial_position="earliest")
            magnetar_producer = ours.create_producer(topic)
            magnetar_producer.send(
                b"from magnetar", partition_key="mk", properties={"a": "1"}, event_timestamp=11
            )
            magnetar_producer.flush()
            pulsar_producer = client.create_producer(topic)
            pulsar_producer.send(
                b"from pulsar", partition_key="pk", properties={"b": "2"}, event_timestamp=22
            )
            batching = client.create_producer(
                topic, batching_enabled=True, compression_type=pulsar.CompressionType.ZLib
            )
            for i in range(3):
                batching.send_async(f"batched {i}".encode(), lambda *_: None, partition_key="bk")
            batching.flush()

            expected = [
                (b"from magnetar", "mk", {"a": "1"}, 11),
                (b"from pulsar", "pk", {"b": "2"}, 22),
                *[(f"batched {i}".encode(), "bk", {}, None) for i in range(3)],
            ]
            got = receive_all(pulsar_consumer, 5)
            assert [m.data() for m in got] == [e[0] for e in expected]
            for message, (_, key, properties, event_time) in zip(got, expected, strict=True):
                assert message.partition_key() == key
                assert message.properties() == properties
                if event_time is not None:
                    assert message.event_timestamp() == event_time
            ours_got = [magnetar_consumer.receive(timeout_millis=10_000) for _ in range(5)]
            assert [m.data() for m in ours_got] == [e[0] for e in expected]
            for message, (_, key, properties, event_time) in zip(ours_got, expected, strict=True):
                assert message.partition_key() == key
                assert message.properties() == properties
                if event_time is not None:
                    assert message.event_timestamp() == event_time
            for p in (pulsar_producer, batching):
                p.close()
            pulsar_consumer.close()
        finally:
            ours.close()

    await run(steps)


CODECS = {
    "lz4": (pulsar.CompressionType.LZ4, api.LZ4),
    "zstd": (pulsar.CompressionType.ZSTD, api.ZSTD),
    "snappy": (pulsar.CompressionType.SNAPPY, api.SNAPPY),
}


def packed(codec: str, raw: bytes) -> bytes:
    """``raw`` compressed as Pulsar's C++ client does it (lib/CompressionCodec*.cc)."""
    if codec == "lz4":
        return bytes(cramjam.lz4.compress_block(raw, store_size=False))
    if codec == "zstd":
        return bytes(cramjam.zstd.compress(raw, level=3))
    return bytes(cramjam.snappy.compress_raw(raw))


@pytest.mark.parametrize("codec", list(CODECS))
async def test_compressed_messages_of_pulsar_producers_reach_magnetar_consumers(
    client: pulsar.Client, standalone: StandaloneNode, codec: str
) -> None:
    topic = topic_name(f"cross-{codec}")
    compression = CODECS[codec][0]

    def steps() -> None:
        ours = magnetar.Client(standalone.service_url)
        try:
            consumer = ours.subscribe(topic, "magnetar-side", initial_position="earliest")
            unbatched = client.create_producer(
                topic, batching_enabled=False, compression_type=compression
            )
            batching = client.create_producer(
                topic,
                batching_enabled=True,
                batching_max_messages=50,
                batching_max_publish_delay_ms=200,
                compression_type=compression,
            )
            expected = []
            for i in range(3):
                value = f"unbatched {i} ".encode() * 30
                unbatched.send(
                    value, partition_key=f"u{i}", properties={"i": str(i)}, event_timestamp=100 + i
                )
                expected.append((value, f"u{i}", {"i": str(i)}, 100 + i))
            for i in range(50):
                value = f"batched {i} ".encode() * (i + 1)
                batching.send_async(
                    value,
                    lambda *_: None,
                    partition_key=f"b{i % 5}",
                    properties={"n": str(i), "codec": codec},
                    event_timestamp=1_000 + i,
                )
                expected.append((value, f"b{i % 5}", {"n": str(i), "codec": codec}, 1_000 + i))
            batching.flush()
            got = [consumer.receive(timeout_millis=10_000) for _ in range(len(expected))]
            assert [
                (m.data(), m.partition_key(), m.properties(), m.event_timestamp()) for m in got
            ] == expected
            for message in got:
                consumer.acknowledge(message)
            assert consumer.discarded_corrupt_entries() == 0
            unbatched.close()
            batching.close()
        finally:
            ours.close()

    await run(steps)


async def test_compressed_payloads_that_do_not_decode_get_send_error_and_the_producer_goes_on(
    client: pulsar.Client, standalone: StandaloneNode
) -> None:
    address = standalone.pulsar_address
    assert address is not None
    topic = topic_name("bad-compression")
    limit = BrokerConfig(metadata="memory://").max_message_bytes
    consumer = await run(
        lambda: client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    )
    raw_batch = encode_batch(
        [(api.SingleMessageMetadata(payload_size=9), f"message {i}".encode()) for i in range(5)]
    )
    sequence_ids = itertools.count()
    expected: list[bytes] = []
    async with RawConnection.open(address) as raw:
        await raw.create_producer(topic, producer_id=1)

        async def send(compression: int, payload: bytes, declared: int, batch: int | None) -> Frame:
            sequence_id = next(sequence_ids)
            metadata = api.MessageMetadata(
                producer_name="raw",
                sequence_id=sequence_id,
                publish_time=1,
                compression=compression,  # type: ignore[arg-type]
                uncompressed_size=declared,
            )
            if batch is not None:
                metadata.num_messages_in_batch = batch
            raw.send_message(1, sequence_id, payload, metadata)
            frame = await raw.read()
            assert frame is not None, "the broker closed the connection"
            return frame

        for codec, (_, compression) in CODECS.items():
            good = packed(codec, raw_batch)
            bomb = packed(codec, bytes(limit))  # a few kB that inflate to the whole limit
            cases = {
                "a size over the limit": (good, limit + 1, "over the broker's limit"),
                "the largest size": (good, 2**32 - 1, "over the broker's limit"),
                "garbage": (b"\x13garbage\x00" * 20, len(raw_batch), codec.upper()),
                "truncated": (good[: len(good) // 2], len(raw_batch), codec.upper()),
                "a bomb": (bomb, len(raw_batch), "declared uncompressed_size of"),
            }
            for case, (payload, declared, reason) in cases.items():
                for batch in (5, None):
                    frame = await send(compression, payload, declared, batch)
                    assert frame.type_name == "SEND_ERROR", (codec, case, frame.command)
                    error = frame.command.send_error
                    assert error.error == api.NotAllowedError, (codec, case)
                    assert reason in error.message, (codec, case, error.message)
            # the same producer, on the same connection, goes on
            frame = await send(compression, good, len(raw_batch), 5)
            assert frame.type_name == "SEND_RECEIPT", (codec, frame.command)
            expected += [f"message {i}".encode() for i in range(5)]
            single = f"{codec} alone".encode()
            frame = await send(compression, packed(codec, single), len(single), None)
            assert frame.type_name == "SEND_RECEIPT", (codec, frame.command)
            expected.append(single)
        raw.send("PING", ping=api.CommandPing())
        await raw.expect("PONG")
    # only what decoded was stored: a Pulsar consumer and a Magnetar one read exactly that
    got = await run(lambda: receive_all(consumer, len(expected)))
    assert [m.data() for m in got] == expected
    assert await run(lambda: nothing_more(consumer))
    await run(consumer.close)

    def magnetar_side() -> list[bytes]:
        with magnetar.Client(standalone.service_url) as ours:
            reader = ours.subscribe(topic, "magnetar-side", initial_position="earliest")
            return [reader.receive(timeout_millis=10_000).data() for _ in expected]

    assert await run(magnetar_side) == expected


async def test_producers_and_consumers_follow_a_partition_that_moves(
    client: pulsar.Client, standalone: StandaloneNode
) -> None:
    # an unload closes the partition as a handover does: the broker sends CLOSE_PRODUCER and
    # CLOSE_CONSUMER, and the client looks the topic up again and carries on
    topic = topic_name("moves")
    producer = await run(lambda: client.create_producer(topic))
    consumer = await run(
        lambda: client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    )
    await run(lambda: [producer.send(f"before {i}".encode()) for i in range(3)])
    admin = magnetar.AdminClient(standalone.service_url)
    try:
        await asyncio.to_thread(admin.unload_topic, topic)
    finally:
        await asyncio.to_thread(admin.close)
    await run(lambda: [producer.send(f"after {i}".encode()) for i in range(3)])

    def receive_and_ack() -> list[bytes]:
        got = []
        for m in receive_all(consumer, 6):
            consumer.acknowledge(m)
            got.append(m.data())
        assert nothing_more(consumer)
        return got

    got = await run(receive_and_ack)
    assert got == [f"before {i}".encode() for i in range(3)] + [
        f"after {i}".encode() for i in range(3)
    ]
    await run(producer.close)
    await run(consumer.close)


async def test_random_and_mangled_frames_never_take_the_broker_down(
    client: pulsar.Client, standalone: StandaloneNode
) -> None:
    """A bounded fuzz of the listener: random frames and valid ones with bytes flipped. Each
    connection is refused or answered; no request handler fails unexpectedly (the broker logs
    such a failure as an error), and the real client goes on."""
    address = standalone.pulsar_address
    assert address is not None
    topic = topic_name("fuzz")
    valid = [
        encode_command(
            command(
                "PRODUCER",
                producer=api.CommandProducer(topic=topic, producer_id=1, request_id=1),
            )
        ),
        encode_message(
            command("SEND", send=api.CommandSend(producer_id=1, sequence_id=0)),
            api.MessageMetadata(producer_name="fuzz", sequence_id=0, publish_time=1),
            b"payload",
        ),
        encode_command(
            command(
                "SUBSCRIBE",
                subscribe=api.CommandSubscribe(
                    topic=topic,
                    subscription="fuzz",
                    subType=api.CommandSubscribe.Shared,
                    consumer_id=1,
                    request_id=2,
                ),
            )
        ),
        encode_command(command("FLOW", flow=api.CommandFlow(consumer_id=1, messagePermits=5))),
        encode_command(
            command(
                "ACK",
                ack=api.CommandAck(
                    consumer_id=1,
                    ack_type=api.CommandAck.Individual,
                    message_id=[api.MessageIdData(ledgerId=1, entryId=2, ack_set=[5])],
                    request_id=3,
                ),
            )
        ),
        encode_command(
            command("LOOKUP", lookupTopic=api.CommandLookupTopic(topic=topic, request_id=4))
        ),
    ]
    rng = random.Random(26)
    for case in range(60):
        if case < 20:
            body = rng.randbytes(rng.randrange(0, 200))
            if case % 2:
                body = struct.pack(">I", len(body)) + body  # a command size in front
            frames = [struct.pack(">I", len(body)) + body]
        else:
            frames = list(valid)
            target = rng.randrange(len(frames))
            mangled = bytearray(frames[target])
            for _ in range(rng.randrange(1, 4)):
                mangled[rng.randrange(4, len(mangled))] ^= 1 << rng.randrange(8)
            frames[target] = bytes(mangled)
        async with RawConnection.open(address) as raw:
            for data in frames:
                raw.write(data)
            raw.send("PING", ping=api.CommandPing())
            # refused (closed, perhaps reset with bytes unread) or answered: a PONG comes
            with contextlib.suppress(ConnectionError, FrameError):
                while (answer := await raw.read(10)) is not None and answer.type_name != "PONG":
                    pass
    producer = await run(lambda: client.create_producer(topic))
    consumer = await run(
        lambda: client.subscribe(topic, "after", initial_position=pulsar.InitialPosition.Latest)
    )
    await run(lambda: producer.send(b"still serving"))
    assert (await run(lambda: consumer.receive(10_000))).data() == b"still serving"
    await run(producer.close)
    await run(consumer.close)
    log = standalone.log_path.read_text(errors="replace")
    assert "pulsar_connection_failed" not in log
    assert "pulsar_request_failed" not in log


async def test_seek_by_message_id_and_by_time_on_consumers_and_readers(
    client: pulsar.Client,
) -> None:
    topic = topic_name("seek")

    def steps() -> None:
        producer = client.create_producer(topic)
        ids, times = [], []
        for i in range(10):
            ids.append(producer.send(str(i).encode()))
            times.append(int(time.time() * 1000))
            time.sleep(0.01)
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        for m in receive_all(consumer, 10):
            consumer.acknowledge(m)
        # the client holds acks for up to 100 ms, and takes those still held then for
        # duplicates of what comes after a seek
        time.sleep(0.3)
        # back to 3: the broker delivers from its entry on, as Pulsar's does, and the client
        # leaves out the id it seeked to (its start id is exclusive by default)
        consumer.seek(ids[3])
        assert [m.data() for m in receive_all(consumer, 6)] == [
            str(i).encode() for i in range(4, 10)
        ]
        assert nothing_more(consumer)
        consumer.seek(times[6] + 1)  # by publish time: from the first published after it
        again = receive_all(consumer, 3)
        assert [m.data() for m in again] == [b"7", b"8", b"9"]
        consumer.close()

        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert [reader.read_next(10_000).data() for _ in range(10)] == [
            str(i).encode() for i in range(10)
        ]
        reader.seek(ids[4])  # a reader is exclusive of its start: the next is 5
        assert reader.read_next(10_000).data() == b"5"
        reader.seek(times[1] + 1)
        assert [reader.read_next(10_000).data() for _ in range(8)] == [
            str(i).encode() for i in range(2, 10)
        ]
        assert not reader.has_message_available()
        reader.close()
        producer.close()

    await run(steps)


async def test_broker_entry_metadata_carries_the_offset_to_clients_that_ask(
    standalone: StandaloneNode,
) -> None:
    address = standalone.pulsar_address
    assert address is not None
    topic = topic_name("entry-metadata")
    async with RawConnection.open(address, entry_metadata=True) as raw:
        await raw.create_producer(topic, producer_id=1)
        raw.send_message(producer_id=1, sequence_id=0, payload=b"single")
        batch = encode_batch(
            [(api.SingleMessageMetadata(), b"a"), (api.SingleMessageMetadata(), b"b")]
        )
        raw.send_message(
            producer_id=1,
            sequence_id=1,
            payload=batch,
            metadata=api.MessageMetadata(
                producer_name="raw", sequence_id=1, publish_time=1, num_messages_in_batch=2
            ),
        )
        for _ in range(2):
            await raw.expect("SEND_RECEIPT")
        await raw.subscribe(topic, "sub", consumer_id=1, earliest=True)
        await raw.flow(1, 10)
        entries = []
        for _ in range(2):
            message = await raw.expect("MESSAGE")
            assert message.payload is not None
            entries.append(message.payload.broker_entry_metadata)
        # the index is the offset of the entry's last message: 0, then 2 (offsets 1 and 2)
        assert [e.index for e in entries if e is not None] == [0, 2]
        assert all(e is not None and e.broker_timestamp > 0 for e in entries)


async def test_negative_acks_reach_the_dead_letter_topic(client: pulsar.Client) -> None:
    # the client's dead-letter policy reads the redelivery counts the broker keeps
    topic = topic_name("dlq")
    dead = topic_name("dlq-dead")

    def steps() -> None:
        dead_consumer = client.subscribe(
            dead, "dead", initial_position=pulsar.InitialPosition.Earliest
        )
        consumer = client.subscribe(
            topic,
            "sub",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
            negative_ack_redelivery_delay_ms=100,
            dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
                max_redeliver_count=2, dead_letter_topic=dead
            ),
        )
        producer = client.create_producer(topic)
        producer.send(b"poison", properties={"p": "1"})
        counts = []
        for _ in range(3):
            message = consumer.receive(10_000)
            counts.append(message.redelivery_count())
            consumer.negative_acknowledge(message)
        assert counts == [0, 1, 2]
        buried = dead_consumer.receive(10_000)
        assert buried.data() == b"poison"
        assert buried.properties()["p"] == "1"
        assert nothing_more(consumer)
        for c in (consumer, dead_consumer):
            c.close()
        producer.close()

    await run(steps)
