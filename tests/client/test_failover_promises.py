"""Redelivery counts across broker crashes: the count a consumer sees never goes back, and
dead-lettering comes after the same number of deliveries however often the owner dies.

A real cluster of separate processes (etcd, 3 bookies, 3 brokers with a 3 s session TTL). The
broker owning the topic is killed with SIGKILL, twice (a restarted broker would listen on a new
port, out of the client's service URL, so the third broker serves at the end); each time
another one takes the partition over from the persisted cursor. A soak test: the two
session TTLs and restarts take longer than the default run allows. The default run has the
same scenario with unloads (``test_subscriptions.py``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import magnetar
from broker.managed_ledger.persistence import decode_cursor
from magnetar.common.errors import ReceiveTimeoutError
from magnetar.testing import LocalCluster
from magnetar.testing.eventually import eventually
from metadata import MetadataStore, layout, open_store

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.soak, pytest.mark.timeout(300)]

BROKER_ARGS = ["--session-ttl-s", "3", "--load-report-interval-ms", "500"]


async def persisted_counts(store: MetadataStore, topic: str, subscription: str) -> list[int]:
    listing = await store.list(layout.MANAGED_LEDGERS)
    suffix = f"/{topic}/cursors/{subscription}"
    for record in listing.records:
        if record.key.endswith(suffix):
            return [c for _, c in decode_cursor(subscription, record.value).redelivery_counts]
    return []


async def test_redelivery_counts_survive_two_broker_crashes_then_dead_letter(
    tmp_path: Path,
) -> None:
    async with LocalCluster(tmp_path, bookies=3, brokers=3, broker_args=BROKER_ARGS) as cluster:
        await cluster.wait_brokers_registered()
        store = await open_store(cluster.metadata_url)
        client = magnetar.Client(cluster.service_url, operation_timeout_s=60)
        admin = client.admin()
        try:
            admin.create_topic("poison")
            consumer = client.subscribe(
                "poison",
                "dlq",
                "shared",
                initial_position="earliest",
                max_redelivery_count=3,
                # longer than a persisted-count check and a kill take: the owner must not
                # deliver the message again before it dies (the application could take that
                # copy, and its nack would be lost with the stream)
                negative_ack_redelivery_delay_ms=5_000,
            )
            client.create_producer("poison").send(b"poison")
            counts: list[int] = []
            while True:
                try:
                    # the fifth delivery goes to the dead-letter topic, not here
                    wait_ms = 60_000 if len(counts) < 4 else 5_000
                    message = await asyncio.to_thread(consumer.receive, wait_ms)
                except ReceiveTimeoutError:
                    break
                counts.append(message.redelivery_count())
                consumer.negative_acknowledge(message)
                if len(counts) > 2:
                    continue
                # the raised count is persisted before it is used
                wanted = [len(counts)]

                async def persisted(wanted: list[int] = wanted) -> bool:
                    return await persisted_counts(store, "poison", "dlq") == wanted

                await eventually(
                    persisted,
                    timeout_s=30,
                    what=f"the redelivery count {len(counts)} persisted",
                    interval_s=0.1,
                )
                owners = {o["partition_topic"]: o["broker_id"] for o in admin.list_ownership()}
                victim = next(
                    b for b in cluster.brokers if b.broker_id == owners["public/default/poison"]
                )
                await victim.kill()
            # max_redelivery_count=3: counts 0 to 3, two of them from a broker that took over
            # after a crash, then the dead-letter topic
            assert counts == [0, 1, 2, 3]
            dlq = client.subscribe("poison-DLQ", "inspect", initial_position="earliest")
            assert (await asyncio.to_thread(dlq.receive, 30_000)).data() == b"poison"
        finally:
            client.close()
            await store.close()
