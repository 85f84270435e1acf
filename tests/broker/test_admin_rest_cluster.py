"""Pulsar's admin REST API on two brokers: any broker's HTTP port answers for any topic, the
partitions another broker owns included (their stats are fetched from the owner, and the dedup
switch reopens them there), as the gRPC admin service does (brokers and bookies in this
process)."""

from __future__ import annotations

import asyncio
import http.client
import json
from typing import Any

import pulsar  # the real pulsar-client from PyPI (its C++ core)

from broker.process import BrokerProcess
from proto.broker.v1 import broker_pb2 as pb
from tests.broker.conftest import StartCluster

TOPIC = "public/default/spread-rest"
PATH = f"/admin/v2/persistent/{TOPIC}"


def call(broker: BrokerProcess, method: str, path: str, body: str | None = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", broker.http_port, timeout=30)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    return response.status, json.loads(raw) if raw else None


async def test_any_broker_answers_for_partitions_the_other_owns(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster(brokers=2)
    first, second = cluster.brokers
    assert await asyncio.to_thread(call, first, "PUT", f"{PATH}/partitions", "4") == (204, None)
    lookup = await cluster.broker_stub(first).Lookup(pb.LookupRequest(topic=TOPIC))
    owners = {o.partition_topic: o.broker_id for o in lookup.owners}
    assert set(owners.values()) == {first.broker_id, second.broker_id}

    def produce() -> None:
        client = pulsar.Client(
            first.broker.pulsar_url,
            operation_timeout_seconds=15,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        try:
            producer = client.create_producer(f"persistent://{TOPIC}", batching_enabled=False)
            for i in range(20):
                producer.send(str(i).encode())
            # the switch, asked of the broker that owns only some partitions: every open
            # partition reopens on its owner, the client follows, and the next sends go on
            assert call(second, "POST", f"{PATH}/deduplication", "false") == (204, None)
            for i in range(20, 24):
                producer.send(str(i).encode())
        finally:
            client.close()

    await asyncio.to_thread(produce)
    for asked in (first, second):
        status, stats = await asyncio.to_thread(call, asked, "GET", f"{PATH}/partitioned-stats")
        assert status == 200
        assert stats["msgInCounter"] == 24
        assert len(stats["partitions"]) == 4
        assert await asyncio.to_thread(call, asked, "GET", f"{PATH}/deduplication") == (
            200,
            False,
        )
    # every partition open now was opened with the switch off, on whichever broker owns it
    reopened = [t for b in cluster.brokers for t in b.broker.topics.topics.values()]
    assert reopened
    assert all(not t.dedup.enabled for t in reopened)
    assert await asyncio.to_thread(call, second, "DELETE", f"{PATH}/partitions?force=true") == (
        204,
        None,
    )
    assert await asyncio.to_thread(call, first, "GET", f"{PATH}/partitions") == (
        200,
        {"partitions": 0},
    )
