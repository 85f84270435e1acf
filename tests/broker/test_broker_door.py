"""Validation at the door (issue 23), on the wire against a real broker: hostile or buggy
requests are refused with an error naming what was wrong, nothing of them is stored, and a
control producer and consumer on another topic lose nothing meanwhile."""

from __future__ import annotations

import contextlib
import logging
import random
import zlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import grpc
import grpc.aio
import pytest
import structlog
from structlog.testing import capture_logs

import magnetar.aio
from magnetar.common.errors import ErrorCode, InvalidTopicNameError
from magnetar.common.grpc_errors import error_from_detail, error_from_rpc_error
from proto.admin.v1 import admin_pb2 as admin
from proto.broker.v1 import broker_pb2 as pb
from proto.broker.v1 import broker_pb2_grpc
from proto.common.v1 import types_pb2
from tests.broker.conftest import Cluster, StartCluster
from tests.broker.raw import RawConsumer, RawProducer, batch_bytes, produce_batch, values_of


@contextlib.contextmanager
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """structlog's ``capture_logs``, leaving structlog unconfigured afterwards if it was: the
    client library's loggers go to the standard library (and pytest's caplog) only then."""
    configured = structlog.is_configured()
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        if not configured:
            structlog.reset_defaults()


def rss_mib() -> float:
    """This process's resident memory (the brokers of these tests run in it)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class Control:
    """A producer and a consumer on a topic of their own: after the hostile steps, every
    message the producer had receipted reaches the consumer, in order."""

    def __init__(self, stub: broker_pb2_grpc.BrokerServiceAsyncStub) -> None:
        self.producer = RawProducer(stub)
        self.consumer = RawConsumer(stub)
        self.sent: list[bytes] = []

    async def start(self) -> None:
        await self.producer.open("control")
        subscribed = await self.consumer.subscribe("control", "control-sub")
        assert subscribed.WhichOneof("kind") == "subscribed"
        await self.consumer.flow(10_000)

    async def step(self) -> None:
        value = f"control-{len(self.sent)}".encode()
        await self.producer.send(produce_batch(len(self.sent) + 1, len(self.sent), value))
        [response] = await self.producer.receipts(1)
        assert response.WhichOneof("kind") == "receipts", response
        self.sent.append(value)

    async def check(self) -> None:
        await self.step()
        received = [v for d in await self.consumer.deliveries(len(self.sent)) for v in values_of(d)]
        assert received == self.sent
        await self.producer.close()
        await self.consumer.close()


def batch_of(request_id: int, sequence_id: int, **fields: Any) -> pb.ProduceBatch:
    made = produce_batch(request_id, sequence_id, b"one")
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(made, name).extend(value)
        else:
            setattr(made, name, value)
    return made


def error_of(response: pb.ProduceResponse | pb.ConsumeResponse) -> Any:
    kind = response.WhichOneof("kind")
    assert kind in ("error", "closed"), response
    detail = response.error.error if kind == "error" else response.closed.reason
    return error_from_detail(detail)


async def test_bad_batches_are_refused_and_nothing_of_them_is_stored(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster()
    stub = cluster.broker_stub()
    control = Control(stub)
    await control.start()
    before = rss_mib()
    producer = RawProducer(stub)
    await producer.open("hostile")
    noise = random.Random(23).randbytes(300)  # not a MessageBatch
    hostile = {
        # the one-message batch declaring 2^31-1 messages, and one declaring a million
        1: batch_of(1, 0, num_messages=2**31 - 1),
        2: batch_of(2, 1, num_messages=1_000_000),
        3: batch_of(3, 2, batch=noise, uncompressed_size=len(noise)),
        4: batch_of(  # the zlib flag on plain bytes
            4,
            3,
            compression=types_pb2.COMPRESSION_TYPE_ZLIB,
            uncompressed_size=len(batch_bytes(b"one")),
        ),
        5: batch_of(5, 4, compression=7),  # an enum value nobody defined
        6: batch_of(6, 5, compression=types_pb2.COMPRESSION_TYPE_UNSPECIFIED),
        7: batch_of(7, 6, key_hashes=[12345]),  # not the hash of "no key"
    }
    wanted = {
        1: "2,147,483,647",
        2: "1,000,000",
        3: "not a serialized magnetar.format.v1.MessageBatch",
        4: "not a zlib stream",
        5: "7, which this broker does not know",
        6: "COMPRESSION_TYPE_UNSPECIFIED",
        7: "key hash",
    }
    for request_id, bad in hostile.items():
        await producer.send(bad)
        [response] = await producer.receipts(1)
        error = error_of(response)
        assert response.error.request_id == request_id
        assert error.code == ErrorCode.PROTOCOL_ERROR, error
        assert wanted[request_id] in error.message, error.message
        await control.step()
    # the stream goes on: a good batch after them is stored, and it is the only entry
    await producer.send(produce_batch(8, 0, b"good-1", b"good-2"))
    [receipts] = await producer.receipts(1)
    assert [r.first_offset for r in receipts.receipts.receipts] == [0]
    after = rss_mib()
    print(f"broker RSS before the hostile batches {before:.0f} MiB, after {after:.0f} MiB")

    consumer = RawConsumer(stub)
    await consumer.subscribe("hostile", "sub")
    await consumer.flow(100)
    [delivery] = await consumer.deliveries(1)
    assert values_of(delivery) == [b"good-1", b"good-2"]
    await consumer.ack_with_receipt([delivery.message_id], request_id=1)
    # the consumer's permits were not spent by a claimed million: it keeps receiving
    await producer.send(produce_batch(9, 2, b"good-3"))
    await producer.receipts(1)
    [later] = await consumer.deliveries(1)
    assert values_of(later) == [b"good-3"]
    await producer.close()
    await consumer.close()
    await control.check()


async def test_a_zlib_batch_inflates_to_what_it_declares_or_is_refused(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster(max_message_bytes=64 * 1024)
    stub = cluster.broker_stub()
    producer = RawProducer(stub)
    await producer.open("zipped")
    raw = batch_bytes(b"z" * 1000)
    packed = zlib.compress(raw)
    zlib_type = types_pb2.COMPRESSION_TYPE_ZLIB
    good = batch_of(1, 0, batch=packed, compression=zlib_type, uncompressed_size=len(raw))
    lying = batch_of(2, 1, batch=packed, compression=zlib_type, uncompressed_size=10)
    bomb_raw = batch_bytes(b"\0" * (1024 * 1024))  # 1 MiB from about a kilobyte
    bomb = batch_of(
        3, 1, batch=zlib.compress(bomb_raw), compression=zlib_type, uncompressed_size=len(bomb_raw)
    )
    await producer.send(good, lying, bomb)
    responses = await producer.receipts(3)
    receipts = [r.request_id for resp in responses for r in resp.receipts.receipts]
    errors = {r.error.request_id: error_of(r) for r in responses if r.WhichOneof("kind") == "error"}
    assert receipts == [1]
    assert errors[2].code == ErrorCode.PROTOCOL_ERROR
    assert "more than its declared uncompressed_size of 10" in errors[2].message
    assert errors[3].code == ErrorCode.MESSAGE_TOO_LARGE
    await producer.close()


async def test_producing_or_subscribing_on_a_partitioned_topics_base_name_is_refused(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster()
    stub = cluster.broker_stub()
    await cluster.admin().CreateTopic(admin.CreateTopicRequest(topic="parts", partitions=4))
    producer = RawProducer(stub)
    refused = await producer.open("parts")
    error = error_of(refused)
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert "has 4 partitions" in error.message
    assert "public/default/parts-partition-0" in error.message
    assert "public/default/parts-partition-3" in error.message
    consumer = RawConsumer(stub)
    error = error_of(await consumer.subscribe("parts", "sub"))
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert "public/default/parts-partition-3" in error.message
    # a partition itself is served
    partition = RawProducer(stub)
    opened = await partition.open("parts-partition-2")
    assert opened.WhichOneof("kind") == "opened"
    for stream in (producer, consumer, partition):
        await stream.close()


async def _produce(cluster: Cluster, topic: str, *values: bytes) -> None:
    producer = RawProducer(cluster.broker_stub())
    await producer.open(topic)
    await producer.send(*(produce_batch(i + 1, i, v) for i, v in enumerate(values)))
    await producer.receipts(len(values))
    await producer.close()


async def test_a_minimal_subscribe_is_durable(start_cluster: StartCluster) -> None:
    cluster = await start_cluster()
    stub = cluster.broker_stub()
    await _produce(cluster, "minimal", b"first", b"second")
    consumer = RawConsumer(stub)
    await consumer.subscribe("minimal", "sub", durable=None)  # the field left unset
    await consumer.flow(10)
    first, _ = await consumer.deliveries(2)
    await consumer.ack_with_receipt([first.message_id], request_id=1)
    await consumer.close()
    again = RawConsumer(stub)
    await again.subscribe("minimal", "sub", durable=None)
    await again.flow(10)
    [redelivered] = await again.deliveries(1)
    assert values_of(redelivered) == [b"second"]  # the ack persisted: a durable cursor
    await again.close()


async def test_unspecified_enums_are_refused(start_cluster: StartCluster) -> None:
    cluster = await start_cluster()
    stub = cluster.broker_stub()
    control = Control(stub)
    await control.start()
    await _produce(cluster, "enums", b"a", b"b")

    unspecified_type = RawConsumer(stub)
    error = error_of(
        await unspecified_type.subscribe(
            "enums", "sub", sub_type=types_pb2.SUBSCRIPTION_TYPE_UNSPECIFIED
        )
    )
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert "subscription_type is SUBSCRIPTION_TYPE_UNSPECIFIED" in error.message
    no_start = RawConsumer(stub)
    error = error_of(await no_start.subscribe("enums", "sub", start=types_pb2.StartPosition()))
    assert "start is not set" in error.message
    unspecified_start = RawConsumer(stub)
    start = types_pb2.StartPosition(initial=types_pb2.INITIAL_POSITION_UNSPECIFIED)
    error = error_of(await unspecified_start.subscribe("enums", "sub", start=start))
    assert "start.initial is INITIAL_POSITION_UNSPECIFIED" in error.message
    await control.step()

    consumer = RawConsumer(stub)
    await consumer.subscribe("enums", "sub")
    await consumer.flow(10)
    first, _ = await consumer.deliveries(2)
    await consumer.send(pb.ConsumeRequest(ack=pb.Ack(message_ids=[first.message_id], request_id=5)))
    error = error_of(await consumer.next())
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert "ack_type is ACK_TYPE_UNSPECIFIED" in error.message
    await consumer.close()
    # nothing was acknowledged: both come again
    again = RawConsumer(stub)
    await again.subscribe("enums", "sub")
    await again.flow(10)
    assert [values_of(d) for d in await again.deliveries(2)] == [[b"a"], [b"b"]]
    for stream in (unspecified_type, no_start, unspecified_start, again):
        await stream.close()
    await control.check()


async def test_a_wrong_batch_index_is_refused(start_cluster: StartCluster) -> None:
    cluster = await start_cluster()
    stub = cluster.broker_stub()
    producer = RawProducer(stub)
    await producer.open("indexes")
    await producer.send(produce_batch(1, 0, b"a", b"b"))
    await producer.receipts(1)
    await producer.close()
    consumer = RawConsumer(stub)
    await consumer.subscribe("indexes", "sub", sub_type=types_pb2.SUBSCRIPTION_TYPE_SHARED)
    await consumer.flow(10)
    [delivery] = await consumer.deliveries(1)
    entry = delivery.message_id
    assert entry.batch_size == 2
    for request_id, (indexes, batch_size) in enumerate([([5], 10), ([2], 2), ([0], 1)], 1):
        await consumer.send(
            pb.ConsumeRequest(
                ack=pb.Ack(
                    ack_type=pb.ACK_TYPE_INDIVIDUAL,
                    partial=[
                        pb.PartialAck(
                            message_id=entry, batch_indexes=indexes, batch_size=batch_size
                        )
                    ],
                    request_id=request_id,
                )
            )
        )
        response = await consumer.next()
        assert response.error.request_id == request_id, response
        assert error_of(response).code == ErrorCode.INVALID_ARGUMENT
    # a start or seek at a batch index the entry does not have
    target = types_pb2.StartPosition(
        message_id=types_pb2.MessageId(
            ledger_id=entry.ledger_id, entry_id=entry.entry_id, batch_index=2
        )
    )
    await consumer.send(pb.ConsumeRequest(seek=pb.Seek(request_id=9, target=target)))
    response = await consumer.next()
    assert response.error.request_id == 9, response
    assert "batch index 2" in error_of(response).message
    await consumer.close()
    # nothing was acknowledged: the whole entry comes again
    again = RawConsumer(stub)
    await again.subscribe("indexes", "sub", sub_type=types_pb2.SUBSCRIPTION_TYPE_SHARED)
    await again.flow(10)
    [redelivered] = await again.deliveries(1)
    assert values_of(redelivered) == [b"a", b"b"]
    assert list(redelivered.batch_indexes) == []
    await again.close()


async def test_long_names_are_refused_without_being_echoed(start_cluster: StartCluster) -> None:
    cluster = await start_cluster()
    stub = cluster.broker_stub()
    control = Control(stub)
    await control.start()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Lookup(pb.LookupRequest(topic="t" * 10_000))
    error = error_from_rpc_error(raised.value)
    assert isinstance(error, InvalidTopicNameError), error
    assert "10,000 characters long; the limit is 200" in error.message
    assert len(error.message) < 200
    producer = RawProducer(stub)
    error = error_of(await producer.open("names", producer_name="p" * 10_000))
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert "producer_name is 10,000 characters long; the limit is 256" in error.message
    assert len(error.message) < 200
    consumer = RawConsumer(stub)
    error = error_of(await consumer.subscribe("names", "s" * 10_000))
    assert "subscription is 10,000 characters long" in error.message
    consumer_name = RawConsumer(stub)
    error = error_of(await consumer_name.subscribe("names", "sub", consumer_name="c" * 300))
    assert "consumer_name is 300 characters long" in error.message
    for stream in (producer, consumer, consumer_name):
        await stream.close()
    await control.check()


def _spoiled(message: Any, good: bytes) -> bytes:
    data: bytes = message.SerializeToString()
    assert data.count(good) == 1
    return data.replace(good, b"\xff" * len(good))


async def test_invalid_utf8_is_refused_naming_the_field(
    start_cluster: StartCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    cluster = await start_cluster()
    stub = cluster.broker_stub()
    control = Control(stub)
    await control.start()
    channel = cluster.channel()
    # requests as raw bytes: a client whose strings are not UTF-8
    lookup: Any = channel.unary_unary(
        "/magnetar.broker.v1.BrokerService/Lookup",
        request_serializer=None,
        response_deserializer=pb.LookupResponse.FromString,
    )
    with captured_logs() as logs:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await lookup(_spoiled(pb.LookupRequest(topic="orders"), b"orders"))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        error = error_from_rpc_error(raised.value)
        assert error.code == ErrorCode.INVALID_ARGUMENT
        assert error.context["field"] == "topic"

        produce: Any = channel.stream_stream(
            "/magnetar.broker.v1.BrokerService/Produce",
            request_serializer=None,
            response_deserializer=pb.ProduceResponse.FromString,
        )
        call: Any = produce()
        await call.write(
            _spoiled(
                pb.ProduceRequest(open=pb.ProducerOpen(topic="utf8", producer_name="pp")), b"pp"
            )
        )
        response = await call.read()
        error = error_of(response)
        assert error.code == ErrorCode.INVALID_ARGUMENT
        assert "field open.producer_name" in error.message
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK

        consume: Any = channel.stream_stream(
            "/magnetar.broker.v1.BrokerService/Consume",
            request_serializer=None,
            response_deserializer=pb.ConsumeResponse.FromString,
        )
        consumer_call: Any = consume()
        subscribe = pb.ConsumeRequest(
            subscribe=pb.Subscribe(
                topic="utf8",
                subscription="sub",
                subscription_type=types_pb2.SUBSCRIPTION_TYPE_EXCLUSIVE,
                start=types_pb2.StartPosition(initial=types_pb2.INITIAL_POSITION_EARLIEST),
                properties={"kk": "v"},
            )
        )
        await consumer_call.write(_spoiled(subscribe, b"kk"))
        error = error_of(await consumer_call.read())
        assert error.context["field"] == "subscribe.properties.key"
        consumer_call.cancel()
    undecodable = [entry for entry in logs if entry["event"] == "request_undecodable"]
    assert len(undecodable) == 3  # one line each (one per method and interval)
    assert all("exc_info" not in entry for entry in undecodable)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records
    await control.check()


async def test_the_python_client_batches_no_more_messages_than_the_broker_takes(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster(max_messages_per_batch=10)
    async with magnetar.aio.Client(cluster.service_url) as client:
        producer = await client.create_producer(
            "capped", batching_max_messages=1000, batching_max_publish_delay_ms=50
        )
        sent = [producer.send_async(f"m{i}".encode()) for i in range(95)]
        await producer.flush()
        for future in sent:
            await future  # none refused
        await producer.close()
    consumer = RawConsumer(cluster.broker_stub())
    await consumer.subscribe("capped", "sub")
    await consumer.flow(1000)
    received: list[bytes] = []
    while len(received) < 95:
        for delivery in await consumer.deliveries(1):
            assert delivery.message_id.batch_size <= 10
            received.extend(values_of(delivery))
    assert received == [f"m{i}".encode() for i in range(95)]
    await consumer.close()
