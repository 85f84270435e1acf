"""The client across a broker SIGKILL: a producer and a consumer of a partitioned topic keep
working, nothing acknowledged is lost, nothing is stored twice, per-key order holds.

A real cluster of separate processes (etcd, 3 bookies, 2 brokers with a 3 s session TTL). One
named producer (deduplication on, the broker default) sends keyed messages with ``send_async``
from a thread; one consumer receives and acknowledges from another. The broker owning partition
0 is killed with SIGKILL mid-stream; the producer re-sends what was unconfirmed with the same
sequence ids to the new owner, so the log must hold every acknowledged message exactly once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import magnetar
from magnetar.common.errors import ReceiveTimeoutError
from magnetar.testing import LocalCluster
from magnetar.testing.eventually import eventually

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.timeout(240)]

BROKER_ARGS = ["--session-ttl-s", "3", "--load-report-interval-ms", "500"]
KEYS = 8


class ProducerLoop:
    def __init__(self, client: magnetar.Client, topic: str) -> None:
        self.producer = client.create_producer(
            topic, "failover-producer", batching_max_publish_delay_ms=2, max_pending_messages=500
        )
        self.acked: set[int] = set()
        self.failed: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():

            def done(error: object, _mid: object, n: int = n) -> None:
                with self.lock:
                    if error is None:
                        self.acked.add(n)
                    else:
                        self.failed.append((n, repr(error)))

            self.producer.send_async(str(n).encode(), done, partition_key=f"k{n % KEYS}")
            n += 1
            if n % 200 == 0:
                time.sleep(0.01)  # a steady stream, not a flood
        self.producer.flush()

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


class ConsumerLoop:
    def __init__(self, client: magnetar.Client, topic: str) -> None:
        self.consumer = client.subscribe(topic, "failover-sub", initial_position="earliest")
        self.received: list[tuple[str, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                messages = self.consumer.batch_receive(max_messages=200, timeout_millis=200)
            except ReceiveTimeoutError:
                continue
            for message in messages:
                key = message.partition_key()
                assert key is not None
                self.received.append((key, int(message.data())))
                self.consumer.acknowledge(message)


async def test_producer_and_consumer_survive_a_broker_sigkill(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path, bookies=3, brokers=2, broker_args=BROKER_ARGS) as cluster:
        await cluster.wait_brokers_registered()
        client = magnetar.Client(cluster.service_url, operation_timeout_s=60)
        admin = client.admin()
        try:
            # retention keeps consumed ledgers, so the whole log can be read back at the end
            admin.create_topic(
                "failover",
                partitions=2,
                policies={"retention_time_ms": -1, "retention_size_bytes": -1},
            )
            producer = ProducerLoop(client, "failover")
            consumer = ConsumerLoop(client, "failover")
            producer.thread.start()
            consumer.thread.start()
            await eventually(
                lambda: producer.count() >= 2000,
                timeout_s=60,
                what="2000 acknowledged sends",
                interval_s=0.1,
            )

            owners = {o["partition_topic"]: o["broker_id"] for o in admin.list_ownership()}
            victim_id = owners["public/default/failover-partition-0"]
            victim = next(b for b in cluster.brokers if b.broker_id == victim_id)
            at_kill = producer.count()
            await victim.kill()

            # both partitions move to the survivor (session TTL 3 s) and the stream goes on
            await eventually(
                lambda: producer.count() >= at_kill + 3000,
                timeout_s=90,
                what="3000 sends after the kill",
                interval_s=0.1,
            )
            producer.stop.set()
            await asyncio.to_thread(producer.thread.join, 60)
            assert not producer.thread.is_alive()
            acked = set(producer.acked)
            assert producer.failed == []

            await eventually(
                lambda: acked <= {n for _, n in consumer.received},
                timeout_s=60,
                what="every acked message",
                interval_s=0.1,
            )
            consumer.stop.set()
            await asyncio.to_thread(consumer.thread.join, 10)

            received = consumer.received
            assert acked <= {n for _, n in received}  # lost = 0
            # per-key order: first deliveries of each key come in send order
            first_seen: dict[str, list[int]] = defaultdict(list)
            seen: set[int] = set()
            for key, n in received:
                if n not in seen:
                    seen.add(n)
                    first_seen[key].append(n)
            for key, numbers in first_seen.items():
                assert numbers == sorted(numbers), f"key {key} out of order"
            redelivered = len(received) - len(seen)

            # the log itself holds every message once: the resends were deduplicated
            stored: Counter[int] = Counter()
            for partition in client.get_topic_partitions("failover"):
                with client.create_reader(partition, "earliest") as reader:
                    while True:
                        try:
                            stored[int(reader.read_next(timeout_millis=2000).data())] += 1
                        except ReceiveTimeoutError:
                            break
            duplicates = {n: c for n, c in stored.items() if c > 1}
            assert duplicates == {}
            assert acked <= set(stored)
            print(
                f"\nacked {len(acked)}, stored {len(stored)}, consumer deliveries"
                f" {len(received)} ({redelivered} redelivered after the failover)"
            )
        finally:
            admin.close()
            client.close()
