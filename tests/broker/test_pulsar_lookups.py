"""Pulsar clients on two brokers: a lookup on any broker answers the ``pulsar://`` URL of the
partition's owner, found as Magnetar's own lookups find it, and the real ``pulsar-client``
follows it to produce and consume across both brokers (brokers and bookies in this process).
Over TLS, the answer's ``brokerServiceUrlTls`` names the owner's ``pulsar+ssl://`` listener,
which a client connected over TLS follows."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pulsar  # the real pulsar-client from PyPI (its C++ core)

import magnetar
from magnetar.testing.security import TestPki
from proto.broker.v1 import broker_pb2 as pb
from proto.pulsar import PulsarApi_pb2 as api
from tests.broker.conftest import StartCluster
from tests.interop.pulsar_raw import RawConnection


async def test_lookups_answer_the_owners_pulsar_url_and_clients_follow_them(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster(brokers=2)
    first, second = cluster.brokers
    urls = {b.broker_id: b.broker.pulsar_url for b in cluster.brokers}
    assert all(url.startswith("pulsar://127.0.0.1:") for url in urls.values())
    topic = "public/default/spread"
    admin = magnetar.AdminClient(cluster.service_url)
    try:
        await asyncio.to_thread(admin.create_topic, topic, 4)
    finally:
        await asyncio.to_thread(admin.close)
    # Magnetar's lookup assigns the four partitions, spread over both brokers
    lookup = await cluster.broker_stub(first).Lookup(pb.LookupRequest(topic=topic))
    owners = {o.partition_topic: o.broker_id for o in lookup.owners}
    assert set(owners.values()) == {first.broker_id, second.broker_id}

    # a Pulsar lookup on either broker names the owner's Pulsar listener
    for asked in (first, second):
        async with RawConnection.open(f"127.0.0.1:{asked.pulsar_port}") as raw:
            async for answer, owner in lookups(raw, owners):
                assert answer.brokerServiceUrl == urls[owner]

    await produce_and_consume_across(cluster, owners, urls[first.broker_id], topic)


async def test_clients_over_tls_are_sent_to_the_owners_tls_listener(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    pki = TestPki(tmp_path / "pki")
    server = pki.issue("broker", hosts=["127.0.0.1"])
    # TLS Pulsar listeners only: a client follows brokerServiceUrlTls, or reaches nothing
    cluster = await start_cluster(
        brokers=2,
        tls_cert_file=server.cert_file,
        tls_key_file=server.key_file,
        tls_port=0,
        pulsar_tls_port=0,
        pulsar_port=None,
    )
    first, second = cluster.brokers
    urls = {b.broker_id: b.broker.pulsar_url_tls for b in cluster.brokers}
    assert all(url.startswith("pulsar+ssl://127.0.0.1:") for url in urls.values())
    assert all(not b.broker.pulsar_url for b in cluster.brokers)
    topic = "public/default/spread-tls"
    admin = magnetar.AdminClient(cluster.service_url)
    try:
        await asyncio.to_thread(admin.create_topic, topic, 4)
    finally:
        await asyncio.to_thread(admin.close)
    lookup = await cluster.broker_stub(first).Lookup(pb.LookupRequest(topic=topic))
    owners = {o.partition_topic: o.broker_id for o in lookup.owners}
    assert set(owners.values()) == {first.broker_id, second.broker_id}

    context = ssl.create_default_context(cafile=str(pki.ca_file))
    for asked in (first, second):
        address = f"127.0.0.1:{asked.pulsar_tls_port}"
        async with RawConnection.open(address, tls=context) as raw:
            async for answer, owner in lookups(raw, owners):
                assert answer.brokerServiceUrlTls == urls[owner]
                assert not answer.HasField("brokerServiceUrl")

    await produce_and_consume_across(
        cluster,
        owners,
        urls[second.broker_id],
        topic,
        tls_trust_certs_file_path=str(pki.ca_file),
        tls_validate_hostname=True,
    )


async def produce_and_consume_across(
    cluster: Any, owners: dict[str, str], url: str, topic: str, **tls: Any
) -> None:
    """The real client, given one broker's URL, produces 20 messages to the partitioned
    ``topic`` and consumes them: they come from every partition, and each broker served the
    producers of its own partitions (the client followed the lookups)."""

    def produce_and_consume() -> list[int]:
        client = pulsar.Client(
            url,
            operation_timeout_seconds=15,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            **tls,
        )
        try:
            consumer = client.subscribe(
                f"persistent://{topic}", "sub", initial_position=pulsar.InitialPosition.Earliest
            )
            producer = client.create_producer(f"persistent://{topic}")
            for i in range(20):
                producer.send(str(i).encode())
            got = []
            for _ in range(20):
                message = consumer.receive(10_000)
                consumer.acknowledge(message)
                got.append(message.message_id().partition())
            return got
        finally:
            client.close()

    partitions = await asyncio.to_thread(produce_and_consume)
    assert sorted(set(partitions)) == [0, 1, 2, 3]
    for broker in cluster.brokers:
        served = {str(t.name) for t in broker.broker.topics.topics.values() if t.msgs_in}
        assert served == {p for p, owner in owners.items() if owner == broker.broker_id}


async def lookups(
    raw: RawConnection, owners: dict[str, str]
) -> AsyncIterator[tuple[api.CommandLookupTopicResponse, str]]:
    """A Pulsar LOOKUP of each partition on ``raw``: each answer (a ``Connect``) and the
    partition's owner."""
    for request_id, (partition, owner) in enumerate(sorted(owners.items())):
        raw.send(
            "LOOKUP",
            lookupTopic=api.CommandLookupTopic(
                topic=f"persistent://{partition}", request_id=request_id
            ),
        )
        answer = (await raw.expect("LOOKUP_RESPONSE")).command.lookupTopicResponse
        assert answer.response == answer.Connect, answer
        yield answer, owner
