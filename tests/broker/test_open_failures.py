"""A partition whose reload fails in the metadata store is retried by the client, not given up.

The long secure verify run (seed 20261125) had partitions 3 and 1 acknowledge nothing from
698.7 s and 1054.3 s to the end, each send failing at once: the partition's producer in the
client had failed for good. A client stops reconnecting a partition on a final error, and a
broker passed on as final what was only its own failure of the moment (a metadata store call
failing with an error the store does not call retriable, as an etcd member killed mid-call
can give). Here the store fails the reload's reads that way; the producer goes on once the
store answers again. In-process brokers and bookies on a memory store with injected faults.
"""

from __future__ import annotations

from magnetar.aio import Client
from magnetar.common.errors import MetadataError, TopicNotOwnedError
from magnetar.common.names import parse_topic
from metadata.faults import FaultyMetadataStore
from proto.admin.v1 import admin_pb2 as admin
from tests.broker.conftest import Cluster


async def test_a_reload_failing_in_the_store_is_retried_and_the_producer_goes_on(
    faulty_cluster: tuple[Cluster, FaultyMetadataStore],
) -> None:
    cluster, faulty = faulty_cluster
    for _ in range(3):
        await cluster.add_bookie()
    broker = await cluster.add_broker()
    await cluster.admin().CreateTopic(admin.CreateTopicRequest(topic="reload", partitions=1))
    partition = parse_topic("reload").partition_name(0)
    async with Client(cluster.service_url, operation_timeout_s=30) as client:
        producer = await client.create_producer("reload", "p", send_timeout_ms=20_000)
        await producer.send(b"before")
        # what an etcd member killed under a call can give: not a retriable error
        faulty.fail(
            "get", MetadataError("injected: etcd failed range: UNKNOWN: Stream removed"), times=4
        )
        assert await broker.broker.topics.unload(
            partition, reason=TopicNotOwnedError("moved by the test")
        )
        message_id = await producer.send(b"after")
        assert message_id.partition == 0
        assert faulty.injected["get"] == 4, "the reconnect did not meet the injected failures"
        (stream,) = producer._partitions
        assert stream.error is None
        await producer.close()
