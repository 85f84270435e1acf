"""A deleted or unloaded topic leaves nothing behind in the broker (issue 23, finding 6): no
topic, managed ledger or cached entry of it stays reachable, so its memory can be given back.

And it is freed by reference counting alone, at once: the servers' collector tuning
(magnetar/common/server/gc_tuning.py) makes full collections so rare that a closed topic caught in a
reference cycle (a cancelled task kept on it, a subscription or cursor pointing back) would
stay in memory with its deduplication table, about 40 MiB per 100,000 one-message entries.
So these tests switch the cyclic collector off and watch weak references. The RSS figures
before and after are printed by bench/memory_bench.py, not asserted here."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from broker.service.topic import Topic
from magnetar.aio import AdminClient, Client
from tests.broker.conftest import Cluster, StartCluster


@pytest.fixture
def collector_off() -> Iterator[None]:
    """No cyclic collection while the test runs: only reference counting frees objects."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def fill(url: str, topic: str, count: int) -> None:
    async with Client(url) as client:
        producer = await client.create_producer(topic, batching_max_messages=1)
        await asyncio.gather(*(producer.send_async(b"x" * 100) for _ in range(count)))
        await producer.close()
        # a subscription with a cursor, acks and a redelivery: each refers to its topic
        consumer = await client.subscribe(
            topic, "sub", subscription_type="shared", initial_position="earliest"
        )
        for _ in range(20):
            await consumer.acknowledge(await consumer.receive(timeout_millis=10_000))
        consumer.negative_acknowledge(await consumer.receive(timeout_millis=10_000))
        await consumer.close()


def held(cluster: Cluster, topic: str) -> list[weakref.ref[object]]:
    """Weak references to the topic's objects in the broker: the topic, its managed ledger,
    deduplication table, subscriptions, cursors and the ledger's write handle."""
    served: Topic = cluster.brokers[0].broker.topics.topics[f"public/default/{topic}"]
    objects: list[object] = [served, served.ml, served.dedup]
    for subscription in served.subscriptions.values():
        objects += [subscription, subscription.cursor]
    handle = served.ml._writer.handle
    if handle is not None:
        objects.append(handle)
    return [weakref.ref(o) for o in objects]


async def freed(refs: list[weakref.ref[object]]) -> list[str]:
    """The objects still alive after a few seconds, by type (empty when all were freed)."""
    for _ in range(100):
        alive = [type(o).__name__ for o in (r() for r in refs) if o is not None]
        if not alive:
            return []
        await asyncio.sleep(0.05)
    return alive


@pytest.fixture
async def cluster(start_cluster: StartCluster) -> Cluster:
    return await start_cluster(bookies=3)


async def test_a_deleted_topic_is_freed_at_once_with_its_cached_entries(
    cluster: Cluster, collector_off: None
) -> None:
    cache = cluster.brokers[0].broker.cache
    before = len(cache)
    await fill(cluster.service_url, "gone", 300)
    refs = held(cluster, "gone")
    assert len(cache) >= before + 300
    async with AdminClient(cluster.service_url) as admin:
        await admin.delete_topic("gone", force=True)
    assert await freed(refs) == []
    assert len(cache) == before


async def test_an_unloaded_topic_is_let_go_of_too(cluster: Cluster, collector_off: None) -> None:
    await fill(cluster.service_url, "moved", 50)
    refs = held(cluster, "moved")
    async with AdminClient(cluster.service_url) as admin:
        await admin.unload_topic("moved")
    assert await freed(refs) == []
