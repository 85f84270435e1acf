"""What the broker holds for one stream is bounded, whatever its client does (issue 23, finding
4): a producer that never reads its receipts is slowed (``max_pending_publish_requests``), and
a consumer that grants huge permits and never reads gets no more than
``max_consumer_buffer_bytes`` queued for it. The clients here disable gRPC's window growth
(``grpc.http2.bdp_probe`` 0), so that the transport's own share stays at its 64 KiB default."""

from __future__ import annotations

import asyncio

import grpc

from broker.service.topic import Topic
from magnetar.testing.eventually import eventually
from proto.broker.v1 import broker_pb2_grpc
from proto.common.v1 import types_pb2
from tests.broker.conftest import Cluster, StartCluster
from tests.broker.raw import RawConsumer, RawProducer, produce_batch

PENDING = 50
BUFFER = 64 * 1024


def slow_reader_stub(cluster: Cluster) -> broker_pb2_grpc.BrokerServiceAsyncStub:
    channel = grpc.aio.insecure_channel(
        cluster.brokers[0].address,
        options=[("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", 64 << 20)],
    )
    cluster._channels.append(channel)
    return broker_pb2_grpc.BrokerServiceStub(channel)


def topic_of(cluster: Cluster, name: str) -> Topic:
    return cluster.brokers[0].broker.topics.topics[f"public/default/{name}"]


async def settled(read: object, quiet_s: float = 1.0) -> int:
    """The value ``read()`` stops changing at (unchanged over ``quiet_s``)."""
    last = -1
    while True:
        now = read()  # type: ignore[operator]
        if now == last:
            return int(now)
        last = now
        await asyncio.sleep(quiet_s)


async def test_a_producer_that_does_not_read_its_receipts_is_slowed(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster(bookies=3, max_pending_publish_requests=PENDING)
    producer = RawProducer(slow_reader_stub(cluster))
    assert (await producer.open("unread")).WhichOneof("kind") == "opened"
    sent = 5_000
    for first in range(0, sent, 100):
        await producer.send(
            *(produce_batch(i + 1, i, b"r" * 100) for i in range(first, first + 100))
        )
    topic = topic_of(cluster, "unread")
    async with asyncio.timeout(60):
        stored = await settled(lambda: topic.msgs_in)
    # the broker stopped reading: what it stored is the receipts the transport took (64 KiB of
    # them at most) and the bound, not all that was sent
    assert 0 < stored < sent
    # once the client reads, everything goes through
    responses = await producer.receipts(sent)
    assert sum(len(r.receipts.receipts) for r in responses if r.HasField("receipts")) == sent
    assert topic.msgs_in == sent
    await producer.close()


async def test_a_consumer_that_does_not_read_gets_only_its_buffer(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster(bookies=3, max_consumer_buffer_bytes=BUFFER)
    writer = RawProducer(cluster.broker_stub())
    await writer.open("backlog")
    count, size = 3_000, 1_000
    for first in range(0, count, 100):
        await writer.send(
            *(produce_batch(i + 1, i, b"b" * size) for i in range(first, first + 100))
        )
    await writer.receipts(count)
    reader = RawConsumer(slow_reader_stub(cluster))
    await reader.subscribe(
        "backlog", "s", start=types_pb2.StartPosition(initial=types_pb2.INITIAL_POSITION_EARLIEST)
    )
    await reader.flow(10_000_000)
    topic = topic_of(cluster, "backlog")
    async with asyncio.timeout(60):
        await eventually(lambda: topic.msgs_out > 0, timeout_s=20.0, interval_s=0.05)
        out = await settled(lambda: topic.bytes_out)
    # the 64 KiB buffer, the transport's 64 KiB window and one delivery message: far less than
    # the 3 MB backlog the permits would allow
    assert out < count * size // 2, out
    # reading drains it all
    got = await reader.deliveries(count)
    assert len(got) == count
    await reader.close()
    await writer.close()
