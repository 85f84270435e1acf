"""A deleted or unloaded topic leaves nothing behind in the broker (issue 23, finding 6): no
topic, managed ledger or cached entry of it stays reachable, so its memory can be given back.
The RSS figures before and after are printed by bench/memory_bench.py, not asserted here."""

from __future__ import annotations

import asyncio
import gc

from broker.managed_ledger.managed_ledger import ManagedLedger
from broker.service.topic import Topic
from magnetar.aio import AdminClient, Client
from tests.broker.conftest import StartCluster


def alive(name: str) -> list[object]:
    gc.collect()
    return [
        o
        for o in gc.get_objects()
        if (isinstance(o, ManagedLedger) and o.name.endswith(name))
        or (isinstance(o, Topic) and o.name.full.endswith(name))
    ]


async def fill(url: str, topic: str, count: int) -> None:
    async with Client(url) as client:
        producer = await client.create_producer(topic, batching_max_messages=1)
        await asyncio.gather(*(producer.send_async(b"x" * 100) for _ in range(count)))
        await producer.close()


async def test_a_deleted_topic_leaves_no_topic_ledger_or_cached_entry(
    start_cluster: StartCluster,
) -> None:
    cluster = await start_cluster(bookies=3)
    broker = cluster.brokers[0]
    cache = broker.broker.cache
    before = len(cache)
    await fill(cluster.service_url, "gone", 300)
    assert alive("/gone")
    assert len(cache) >= before + 300
    async with AdminClient(cluster.service_url) as admin:
        await admin.delete_topic("gone", force=True)
    assert alive("/gone") == []
    assert len(cache) == before


async def test_an_unloaded_topic_is_let_go_of_too(start_cluster: StartCluster) -> None:
    cluster = await start_cluster(bookies=3)
    await fill(cluster.service_url, "moved", 50)
    async with AdminClient(cluster.service_url) as admin:
        await admin.unload_topic("moved")
    assert alive("/moved") == []
