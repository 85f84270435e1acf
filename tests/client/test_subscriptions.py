"""Subscription types and delivery semantics, end to end on a real cluster.

One cluster of separate processes (etcd, 3 bookies, 2 brokers) serves the module, with small
limits so that they are reached: 40 unacknowledged messages per consumer, 15 ack holes
per cursor. Consumers that must die holding messages run in their own process
(``sub_worker.py``) and are killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import pytest_asyncio

import magnetar
from broker.managed_ledger.persistence import StoredCursor, decode_cursor
from magnetar.common.errors import (
    IncompatibleSubscriptionError,
    InvalidArgumentError,
    ReceiveTimeoutError,
)
from magnetar.testing import LocalCluster
from magnetar.testing.eventually import eventually_sync
from metadata import layout, open_store

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.timeout(240)]

BROKER_ARGS = [
    "--session-ttl-s", "3",
    "--load-report-interval-ms", "500",
    "--max-unacked-messages-per-consumer", "40",
    "--managed-ledger-max-inline-ack-ranges", "15",
]  # fmt: skip
WORKER = Path(__file__).with_name("sub_worker.py")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    root = tmp_path_factory.mktemp("subscriptions")
    async with LocalCluster(root, bookies=3, brokers=2, broker_args=BROKER_ARGS) as running:
        await running.wait_brokers_registered()
        yield running


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[magnetar.Client]:
    with magnetar.Client(cluster.service_url, operation_timeout_s=60) as c:
        yield c


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[magnetar.AdminClient]:
    with magnetar.AdminClient(cluster.service_url) as a:
        yield a


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def nothing_arrives(consumer: magnetar.Consumer, wait_ms: int = 1000) -> bool:
    try:
        consumer.receive(timeout_millis=wait_ms)
    except ReceiveTimeoutError:
        return True
    return False


class Worker:
    """A consumer process that receives ``count`` messages, holds them, and waits to die."""

    def __init__(
        self,
        service_url: str,
        topic: str,
        subscription: str,
        sub_type: str,
        name: str,
        count: int,
        ack_first: int = 0,
    ) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), service_url, topic, subscription, sub_type, name,
             str(count), str(ack_first)],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.strip())

    def wait(self, marker: str, timeout_s: float = 60) -> None:
        eventually_sync(
            lambda: marker in self.lines or self.process.poll() is not None,
            timeout_s=timeout_s,
            what=marker,
            interval_s=0.05,
        )
        assert marker in self.lines, f"the worker exited ({self.process.returncode})"

    @property
    def held(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines if line.startswith("{")]

    def kill(self) -> None:
        self.process.kill()  # SIGKILL
        self.process.wait(10)
        self._reader.join(10)
        assert self.process.stdout is not None
        self.process.stdout.close()


class Collector:
    """Receives and acknowledges on a thread, recording (key, value, redelivery count)."""

    def __init__(self, consumer: magnetar.Consumer, *, ack: bool = True) -> None:
        self.consumer = consumer
        self.ack = ack
        self.received: list[tuple[str | None, str, int, int]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                messages = self.consumer.batch_receive(max_messages=100, timeout_millis=100)
            except ReceiveTimeoutError:
                continue
            except magnetar.MagnetarError:
                return  # closed under us
            with self.lock:
                for m in messages:
                    self.received.append(
                        (
                            m.partition_key(),
                            m.data().decode(),
                            m.redelivery_count(),
                            m.message_id().partition,
                        )
                    )
            if self.ack:
                for m in messages:
                    self.consumer.acknowledge(m)

    def values(self) -> set[str]:
        with self.lock:
            return {value for _, value, _, _ in self.received}

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(10)


def per_key_in_order(received: list[tuple[str | None, str, int, int]]) -> bool:
    """Within one consumer, each key's messages (by sequence number) arrive in increasing order,
    a redelivery restarting no earlier than the first unacknowledged one."""
    last: dict[str | None, int] = {}
    for key, value, redelivery, _ in received:
        seq = int(value.split(":")[1])
        if redelivery == 0 and seq <= last.get(key, -1):
            return False
        last[key] = max(seq, last.get(key, -1))
    return True


def produce(client: magnetar.Client, topic: str, count: int, keys: int = 10, **settings: Any):
    with client.create_producer(topic, **settings) as producer:
        for i in range(count):
            key = f"k{i % keys}"
            producer.send_async(f"{key}:{i}".encode(), None, partition_key=key)
        producer.flush()


# --- failover --------------------------------------------------------------------------------


def test_failover_spreads_partitions_and_prefers_priority(
    client: magnetar.Client, admin: magnetar.AdminClient
) -> None:
    topic = unique("failover")
    admin.create_topic(topic, partitions=4)
    changes: list[tuple[str, str, bool]] = []

    def listener(name: str) -> Callable[[str, bool], None]:
        return lambda partition, active: changes.append((name, partition, active))

    a = client.subscribe(
        topic, "fo", "failover", consumer_name="a", priority_level=1,
        on_active_change=listener("a"),
    )  # fmt: skip
    b = client.subscribe(
        topic, "fo", "failover", consumer_name="b", priority_level=1,
        on_active_change=listener("b"),
    )  # fmt: skip
    # sorted by name, consumer i % 2 is active for partition i
    eventually_sync(
        lambda: sorted(a.active_partitions()) == [0, 2] and sorted(b.active_partitions()) == [1, 3],
        timeout_s=30,
        what="a active on 0 and 2, b on 1 and 3",
        interval_s=0.05,
    )
    assert ("b", f"public/default/{topic}-partition-1", True) in changes
    produce(client, topic, 200)
    ca, cb = Collector(a), Collector(b)
    eventually_sync(
        lambda: len(ca.values() | cb.values()) == 200,
        timeout_s=60,
        what="200 messages",
        interval_s=0.05,
    )
    ca.finish()
    cb.finish()
    assert {p for *_, p in ca.received} == {0, 2}
    assert {p for *_, p in cb.received} == {1, 3}
    assert ca.values().isdisjoint(cb.values())  # exactly once: no failover happened

    # a consumer with a better (lower) priority level takes every partition
    z = client.subscribe(topic, "fo", "failover", consumer_name="z", priority_level=0)
    eventually_sync(
        lambda: sorted(z.active_partitions()) == [0, 1, 2, 3],
        timeout_s=30,
        what="z active everywhere",
        interval_s=0.05,
    )
    eventually_sync(
        lambda: not a.active_partitions() and not b.active_partitions(),
        timeout_s=30,
        what="a, b idle",
        interval_s=0.05,
    )
    produce(client, topic, 40)
    cz = Collector(z)
    eventually_sync(
        lambda: len(cz.values()) == 40, timeout_s=60, what="z receives everything", interval_s=0.05
    )
    cz.finish()
    assert nothing_arrives(a, 300)
    assert nothing_arrives(b, 300)
    z.close()
    eventually_sync(
        lambda: sorted(a.active_partitions()) == [0, 2],
        timeout_s=30,
        what="a active again",
        interval_s=0.05,
    )
    a.close()
    b.close()


def test_failover_standby_takes_over_from_a_killed_consumer(
    client: magnetar.Client, admin: magnetar.AdminClient, cluster: LocalCluster
) -> None:
    topic = unique("failover-kill")
    admin.create_topic(topic)
    worker = Worker(cluster.service_url, topic, "fo", "failover", "a", 30)
    worker.wait("SUBSCRIBED")
    standby = client.subscribe(topic, "fo", "failover", consumer_name="b")
    with client.create_producer(topic) as producer:
        for i in range(100):
            producer.send(f"k:{i}".encode(), partition_key="k")
    worker.wait("HOLDING")
    assert not standby.active_partitions()  # "a" sorts first: b is the standby
    assert nothing_arrives(standby, 300)
    held = [m["value"] for m in worker.held]
    assert held == [f"k:{i}" for i in range(30)]
    worker.kill()

    collector = Collector(standby)
    eventually_sync(
        lambda: len(collector.values()) == 100,
        timeout_s=60,
        what="the standby receives everything",
        interval_s=0.05,
    )
    collector.finish()
    assert standby.active_partitions()
    values = [value for _, value, _, _ in collector.received]
    assert values == [f"k:{i}" for i in range(100)]  # in order, from the first unacked
    redelivered = {value for _, value, count, _ in collector.received if count > 0}
    assert set(held) <= redelivered  # (and what its client had prefetched beyond them)
    standby.close()


# --- shared ----------------------------------------------------------------------------------


def test_shared_round_robin_and_a_killed_consumers_messages_go_to_the_others(
    client: magnetar.Client, admin: magnetar.AdminClient, cluster: LocalCluster
) -> None:
    topic = unique("shared-kill")
    admin.create_topic(topic)
    worker = Worker(cluster.service_url, topic, "sh", "shared", "w", 30)
    worker.wait("SUBSCRIBED")
    c1 = Collector(client.subscribe(topic, "sh", "shared", consumer_name="c1"))
    c2 = Collector(client.subscribe(topic, "sh", "shared", consumer_name="c2"))
    produce(client, topic, 300, batching_max_messages=5)
    worker.wait("HOLDING")
    held = {m["value"] for m in worker.held}
    assert len(held) == 30
    # the worker's queue may hold more than it printed; what it holds goes nowhere else
    eventually_sync(
        lambda: len(c1.values() | c2.values()) >= 200,
        timeout_s=60,
        what="the others' share",
        interval_s=0.05,
    )
    assert held.isdisjoint(c1.values() | c2.values())
    worker.kill()
    everything = {f"k{i % 10}:{i}" for i in range(300)}
    eventually_sync(
        lambda: c1.values() | c2.values() == everything,
        timeout_s=60,
        what="all 300",
        interval_s=0.05,
    )
    c1.finish()
    c2.finish()
    assert c1.values()  # both took a share
    assert c2.values()
    redelivered = {v for c in (c1, c2) for _, v, count, _ in c.received if count > 0}
    assert held <= redelivered


def test_shared_unacked_limit_blocks_a_consumer_until_it_acks_half(
    client: magnetar.Client, admin: magnetar.AdminClient
) -> None:
    topic = unique("shared-limit")
    admin.create_topic(topic)
    consumer = client.subscribe(topic, "lim", "shared", receiver_queue_size=500)
    with client.create_producer(topic) as producer:
        for i in range(100):
            producer.send(f"k:{i}".encode())
    got = []
    while True:
        try:
            got.append(consumer.receive(timeout_millis=1000))
        except ReceiveTimeoutError:
            break
    assert len(got) == 40  # the broker's max_unacked_messages_per_consumer
    stats = admin.topic_stats(topic)["partitions"][0]["subscriptions"][0]
    assert stats["consumers"][0]["blocked"]
    assert stats["consumers"][0]["unacked_messages"] == 40
    for message in got[:19]:
        consumer.acknowledge(message)
    assert nothing_arrives(consumer)  # 21 held: still over half the limit
    consumer.acknowledge(got[19])  # 20 held: unblocked
    more = consumer.receive(timeout_millis=10_000)
    assert more.data() == b"k:40"
    consumer.close()


@pytest.mark.parametrize("sub_type", ["exclusive", "failover"])
def test_exclusive_and_failover_unacked_limit_and_a_reader_holds_nothing(
    client: magnetar.Client,
    admin: magnetar.AdminClient,
    sub_type: Literal["exclusive", "failover"],
) -> None:
    """A consumer that never acknowledges cannot make the broker track an unbounded number of
    messages, whatever its subscription type; a cumulative ack unblocks it. A reader does not
    acknowledge, so the broker tracks nothing for it and it is never blocked."""
    topic = unique(f"{sub_type}-limit")
    admin.create_topic(topic)
    consumer = client.subscribe(topic, "lim", sub_type, receiver_queue_size=500)
    reader = client.create_reader(topic, "earliest", receiver_queue_size=500)
    with client.create_producer(topic) as producer:
        for i in range(100):
            producer.send(f"k:{i}".encode())
    got = []
    while True:
        try:
            got.append(consumer.receive(timeout_millis=1000))
        except ReceiveTimeoutError:
            break
    assert len(got) == 40  # the broker's max_unacked_messages_per_consumer
    read = [reader.read_next(timeout_millis=10_000).data() for _ in range(100)]
    assert read == [f"k:{i}".encode() for i in range(100)]
    subscriptions = admin.topic_stats(topic)["partitions"][0]["subscriptions"]
    stats = next(s for s in subscriptions if s["subscription"] == "lim")
    assert stats["consumers"][0]["blocked"]
    assert stats["consumers"][0]["unacked_messages"] == 40
    reader_stats = next(s for s in subscriptions if s["subscription"] != "lim")
    assert reader_stats["consumers"][0]["unacked_messages"] == 0
    assert not reader_stats["consumers"][0]["blocked"]
    consumer.acknowledge_cumulative(got[18])
    assert nothing_arrives(consumer)  # 21 held: still over half the limit
    consumer.acknowledge_cumulative(got[19])  # 20 held: unblocked
    more = consumer.receive(timeout_millis=10_000)
    assert more.data() == b"k:40"
    consumer.close()
    reader.close()


# --- key_shared ------------------------------------------------------------------------------


def test_key_shared_same_key_same_consumer_and_order_through_joins_leaves_and_a_kill(
    client: magnetar.Client, admin: magnetar.AdminClient, cluster: LocalCluster
) -> None:
    topic = unique("key-shared")
    admin.create_topic(topic)
    consumers = {
        name: Collector(client.subscribe(topic, "ks", "key_shared", consumer_name=name))
        for name in ("c1", "c2", "c3")
    }
    produce(client, topic, 600, keys=12, batching_max_messages=20)
    eventually_sync(
        lambda: sum(len(c.values()) for c in consumers.values()) == 600,
        timeout_s=60,
        what="600 messages",
        interval_s=0.05,
    )
    owners: dict[str | None, set[str]] = defaultdict(set)
    for name, collector in consumers.items():
        for key, *_ in collector.received:
            owners[key].add(name)
    assert all(len(names) == 1 for names in owners.values()), owners  # a key, one consumer
    assert len({next(iter(n)) for n in owners.values()}) > 1  # the keys spread

    # consumers join, leave and die while messages flow; nothing is lost or reordered per key
    worker = Worker(cluster.service_url, topic, "ks", "key_shared", "w", 30)
    worker.wait("SUBSCRIBED")
    stop = threading.Event()
    sent: list[int] = []

    def produce_forever() -> None:
        with client.create_producer(topic, batching_max_messages=20) as producer:
            i = 600
            while not stop.is_set() or i < 1200:
                key = f"k{i % 12}"
                producer.send_async(f"{key}:{i}".encode(), None, partition_key=key)
                sent.append(i)
                i += 1
                if i % 50 == 0:
                    time.sleep(0.02)
            producer.flush()

    thread = threading.Thread(target=produce_forever, daemon=True)
    thread.start()
    worker.wait("HOLDING")
    consumers["c4"] = Collector(client.subscribe(topic, "ks", "key_shared", consumer_name="c4"))
    eventually_sync(
        lambda: bool(consumers["c4"].values()),
        timeout_s=60,
        what="the joined consumer to take keys",
        interval_s=0.05,
    )
    consumers["c1"].finish()
    consumers["c1"].consumer.close()
    worker.kill()
    sent_at_kill = len(sent)
    eventually_sync(
        lambda: len(sent) >= sent_at_kill + 100,
        timeout_s=60,
        what="more messages after the kill",
        interval_s=0.05,
    )
    consumers["c1b"] = Collector(client.subscribe(topic, "ks", "key_shared", consumer_name="c1"))
    stop.set()
    thread.join(60)
    everything = {f"k{i % 12}:{i}" for i in range(len(sent) + 600)}
    eventually_sync(
        lambda: set().union(*(c.values() for c in consumers.values())) == everything,
        timeout_s=90,
        what="every message (no stuck keys)",
        interval_s=0.05,
    )
    for collector in consumers.values():
        collector.finish()
        assert per_key_in_order(collector.received)
        collector.consumer.close()
    held = {m["value"] for m in worker.held}
    redelivered = {v for c in consumers.values() for _, v, n, _ in c.received if n > 0}
    assert held <= redelivered


# --- acknowledgement and redelivery ----------------------------------------------------------


def test_acks_nacks_ack_timeout_and_dead_letters(
    client: magnetar.Client, admin: magnetar.AdminClient
) -> None:
    topic = unique("acks")
    admin.create_topic(topic)
    with client.create_producer(topic) as producer:
        for i in range(10):
            producer.send(f"m{i}".encode(), properties={"n": str(i)})

    # cumulative acks (exclusive): nothing up to the acked message comes back
    consumer = client.subscribe(topic, "cumulative", initial_position="earliest")
    got = [consumer.receive(timeout_millis=10_000) for _ in range(10)]
    consumer.acknowledge_cumulative(got[6])
    consumer.close()
    consumer = client.subscribe(topic, "cumulative")
    assert consumer.receive(timeout_millis=10_000).data() == b"m7"
    consumer.close()

    # a negative ack redelivers after the delay, with the count on the message
    consumer = client.subscribe(
        topic, "nack", "shared", initial_position="earliest",
        negative_ack_redelivery_delay_ms=200,
    )  # fmt: skip
    first = consumer.receive(timeout_millis=10_000)
    assert first.redelivery_count() == 0
    consumer.negative_acknowledge(first)
    seen = [consumer.receive(timeout_millis=10_000) for _ in range(10)]
    again = [m for m in seen if m.data() == first.data()]
    assert [m.redelivery_count() for m in again] == [1]
    consumer.close()

    # ack timeout: a message not acknowledged in time is delivered again
    consumer = client.subscribe(
        topic, "timeout", "shared", initial_position="earliest", ack_timeout_ms=1000,
        ack_timeout_tick_ms=100,
    )  # fmt: skip
    first = consumer.receive(timeout_millis=10_000)
    for _ in range(9):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    redelivered = consumer.receive(timeout_millis=10_000)
    assert redelivered.data() == first.data()
    assert redelivered.redelivery_count() == 1
    consumer.close()

    # after max_redelivery_count redeliveries the message goes to <topic>-DLQ, properties kept
    consumer = client.subscribe(
        topic, "dlq", "shared", initial_position="earliest", max_redelivery_count=2,
        negative_ack_redelivery_delay_ms=100,
    )  # fmt: skip
    counts: list[int] = []
    while True:
        try:
            message = consumer.receive(timeout_millis=2000)
        except ReceiveTimeoutError:
            break
        if message.data() == b"m3":
            counts.append(message.redelivery_count())
            consumer.negative_acknowledge(message)
        else:
            consumer.acknowledge(message)
    assert counts == [0, 1, 2]
    dlq = client.subscribe(f"{topic}-DLQ", "inspect", initial_position="earliest")
    dead = dlq.receive(timeout_millis=10_000)
    assert dead.data() == b"m3"
    assert dead.properties()["n"] == "3"
    assert dead.properties()["REAL_TOPIC"] == f"public/default/{topic}"
    assert "ORIGIN_MESSAGE_ID" in dead.properties()
    stats = admin.topic_stats(topic)["partitions"][0]["subscriptions"]
    assert next(s for s in stats if s["subscription"] == "dlq")["dead_lettered_messages"] == 1
    dlq.close()
    consumer.close()

    # the topic's max_redelivery_count policy applies to consumers that set none
    policy_topic = unique("acks-policy")
    admin.create_topic(policy_topic, policies={"max_redelivery_count": 1})
    with client.create_producer(policy_topic) as producer:
        producer.send(b"poison", properties={"n": "p"})
    consumer = client.subscribe(
        policy_topic, "policy", "shared", initial_position="earliest",
        negative_ack_redelivery_delay_ms=100,
    )  # fmt: skip
    counts = []
    while True:
        try:
            message = consumer.receive(timeout_millis=2000)
        except ReceiveTimeoutError:
            break
        counts.append(message.redelivery_count())
        consumer.negative_acknowledge(message)
    assert counts == [0, 1]
    dlq = client.subscribe(f"{policy_topic}-DLQ", "inspect", initial_position="earliest")
    assert dlq.receive(timeout_millis=10_000).properties()["n"] == "p"
    dlq.close()
    consumer.close()


def persisted_cursor(cluster: LocalCluster, topic: str, subscription: str) -> StoredCursor:
    """The subscription's cursor as persisted in etcd (read on a thread of its own: the module's
    event loop is not running during a synchronous test)."""

    async def read() -> StoredCursor:
        store = await open_store(cluster.metadata_url)
        try:
            listing = await store.list(layout.MANAGED_LEDGERS)
            suffix = f"/{topic}/cursors/{subscription}"
            record = next(r for r in listing.records if r.key.endswith(suffix))
            return decode_cursor(subscription, record.value)
        finally:
            await store.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, read()).result(timeout=30)


def test_redelivery_counts_survive_four_failovers_then_dead_letter(
    client: magnetar.Client, admin: magnetar.AdminClient, cluster: LocalCluster
) -> None:
    topic = unique("dlq-failover")
    admin.create_topic(topic)
    consumer = client.subscribe(
        topic, "dlq", "shared", initial_position="earliest", max_redelivery_count=3,
        negative_ack_redelivery_delay_ms=60_000,
    )  # fmt: skip
    with client.create_producer(topic) as producer:
        producer.send(b"poison")
    counts: list[int] = []
    while True:
        try:
            message = consumer.receive(timeout_millis=3000)
        except ReceiveTimeoutError:
            break
        counts.append(message.redelivery_count())
        consumer.negative_acknowledge(message)
        if len(counts) <= 4:
            # the broker counted the negative ack (and persisted it): move the partition while
            # the message waits out its delay there (the new owner delivers it at once). With a
            # short delay the old owner could deliver it first, and the application could take
            # that copy and negatively acknowledge it on the closing stream: lost, so it would
            # come again with the same count, as the docs say
            eventually_sync(
                lambda: (
                    [c for _, c in persisted_cursor(cluster, topic, "dlq").redelivery_counts]
                    == [len(counts)]
                ),
                timeout_s=30,
                what="the redelivery count to be persisted",
                interval_s=0.05,
            )
            admin.unload_topic(topic)
    # max_redelivery_count=3: the application got it with counts 0, 1, 2 and 3 (three
    # redeliveries, each by a new owner), then the dead-letter topic (by a fourth)
    assert counts == [0, 1, 2, 3]
    dlq = client.subscribe(f"{topic}-DLQ", "inspect", initial_position="earliest")
    assert dlq.receive(timeout_millis=10_000).data() == b"poison"
    assert nothing_arrives(dlq, 500)
    dlq.close()
    eventually_sync(
        lambda: persisted_cursor(cluster, topic, "dlq").redelivery_counts == (),
        timeout_s=30,
        what="the dead-lettered entry's count to go with its ack",
        interval_s=0.05,
    )
    sub = admin.topic_stats(topic)["partitions"][0]["subscriptions"][0]
    assert sub["redelivery_counts"] == 0
    assert sub["dead_lettered_messages"] == 1
    consumer.close()


# --- cursor state ----------------------------------------------------------------------------


def test_ack_holes_over_the_limit_pause_dispatch_and_survive_a_reload(
    client: magnetar.Client, admin: magnetar.AdminClient
) -> None:
    topic = unique("holes")
    admin.create_topic(topic)
    consumer = client.subscribe(topic, "holes", initial_position="earliest", ack_receipts=True)
    with client.create_producer(topic) as producer:
        for i in range(40):
            producer.send(f"m{i}".encode())
    # 40 held (the limit of unacknowledged messages per consumer), then 20 holes (over 15)
    got = [consumer.receive(timeout_millis=10_000) for _ in range(40)]
    for message in got[1::2]:  # every other one
        consumer.acknowledge(message)
    sub = admin.topic_stats(topic)["partitions"][0]["subscriptions"][0]
    assert sub["ack_hole_ranges"] == 20
    assert sub["ack_ranges_over_limit"]
    assert sub["blocked"]
    with client.create_producer(topic) as producer:
        producer.send(b"after")
    assert nothing_arrives(consumer)  # no new dispatch while over the limit

    # every hole is persisted: after the partition moves, exactly the unacked come back
    admin.unload_topic(topic)
    redelivered = [consumer.receive(timeout_millis=30_000) for _ in range(20)]
    assert sorted(m.data() for m in redelivered) == sorted(m.data() for m in got[0::2])
    for message in redelivered:
        consumer.acknowledge(message)
    assert consumer.receive(timeout_millis=10_000).data() == b"after"
    sub = admin.topic_stats(topic)["partitions"][0]["subscriptions"][0]
    assert sub["ack_hole_ranges"] == 0
    assert not sub["blocked"]
    consumer.close()


def check_normal_messages_flow_past_delayed_ones(
    client: magnetar.Client, admin: magnetar.AdminClient, delayed: int
) -> None:
    """``delayed`` messages due in an hour, each followed by an immediate one (so each is an
    entry of its own and leaves a hole once the immediate ones are acknowledged): every
    immediate message arrives, none of the delayed."""
    topic = unique("delayed-many")
    admin.create_topic(topic)
    consumer = client.subscribe(
        topic, "work", "shared", initial_position="earliest", receiver_queue_size=2000
    )
    due_ms = int(time.time() * 1000) + 3_600_000
    with client.create_producer(topic, batching_max_messages=1000) as producer:
        for i in range(delayed):
            producer.send_async(b"later", deliver_at_ms=due_ms)
            producer.send_async(b"now %d" % i)
        producer.flush()
    received = 0
    while received < delayed:
        message = consumer.receive(timeout_millis=30_000)
        assert message.data().startswith(b"now ")
        consumer.acknowledge(message)
        received += 1

    def stats() -> dict[str, Any]:
        return dict(admin.topic_stats(topic)["partitions"][0]["subscriptions"][0])

    # one hole per delayed entry, far more than the limit of 50, and none a reason to stop
    eventually_sync(
        lambda: stats()["ack_hole_ranges"] == delayed,
        timeout_s=30,
        what="every ack to arrive",
        interval_s=0.05,
    )
    sub = stats()
    assert not sub["ack_ranges_over_limit"]
    assert not sub["blocked"]
    assert sub["delayed_entries"] == delayed
    with client.create_producer(topic) as producer:
        producer.send(b"after")
    after = consumer.receive(timeout_millis=30_000)
    assert after.data() == b"after"
    consumer.acknowledge(after)
    # a new owner loads the delayed entries from the subscription's delay index (the old one
    # wrote what it held aside as it closed), holds them aside again without reading them, and
    # new messages flow
    admin.unload_topic(topic)
    with client.create_producer(topic) as producer:
        producer.send(b"after the move")
    message = consumer.receive(timeout_millis=60_000)
    if message.data() == b"after":  # its ack may not have reached the old owner
        message = consumer.receive(timeout_millis=60_000)
    assert message.data() == b"after the move"
    eventually_sync(
        lambda: stats()["delayed_entries"] == delayed,
        timeout_s=60,
        what="the delayed ones held aside",
        interval_s=0.05,
    )
    sub = stats()
    assert sub["delayed_entries_loaded"] == delayed
    assert sub["delayed_index_buckets"] >= 1
    consumer.close()


def test_normal_messages_flow_past_many_delayed_ones(
    client: magnetar.Client, admin: magnetar.AdminClient
) -> None:
    check_normal_messages_flow_past_delayed_ones(client, admin, 2_000)


@pytest.mark.soak
@pytest.mark.timeout(1200)
def test_normal_messages_flow_past_100k_delayed_ones(
    client: magnetar.Client, admin: magnetar.AdminClient
) -> None:
    check_normal_messages_flow_past_delayed_ones(client, admin, 100_000)


def test_delayed_messages_survive_two_failovers_and_arrive_when_due(
    client: magnetar.Client, admin: magnetar.AdminClient
) -> None:
    """Messages delayed by an hour stay held aside across two moves of the partition and are
    not delivered; messages delayed by seconds arrive when due, never early, whether they
    became due before, during or after the moves (how loaded the machine is decides which)."""
    topic = unique("delayed-failover")
    admin.create_topic(topic)
    # ack receipts: the immediate messages' acks are persisted before the partition moves, so
    # none of them comes again among the delayed ones
    consumer = client.subscribe(
        topic, "work", "shared", initial_position="earliest", ack_receipts=True
    )
    hour_ms = int(time.time() * 1000) + 3_600_000
    soon_ms = int(time.time() * 1000) + 5_000
    with client.create_producer(topic) as producer:
        for i in range(10):
            producer.send(b"hour %d" % i, deliver_at_ms=hour_ms)
            producer.send(b"soon %d" % i, deliver_at_ms=soon_ms + 10 * i)
            producer.send(b"now %d" % i)
    got: dict[bytes, list[bytes]] = {b"now": [], b"soon": []}

    def take(timeout_ms: int) -> None:
        message = consumer.receive(timeout_millis=timeout_ms)
        kind, _, _ = message.data().partition(b" ")
        assert kind != b"hour", message.data()  # an hour early
        if kind == b"soon":
            # not early: the broker held it until its time (one clock on this host)
            assert time.time() * 1000 >= soon_ms
        got[kind].append(message.data())
        consumer.acknowledge(message)

    while len(got[b"now"]) < 10:
        take(10_000)
    assert got[b"now"] == [b"now %d" % i for i in range(10)]

    def hour_ones_held_aside() -> bool:
        sub = admin.topic_stats(topic)["partitions"][0]["subscriptions"][0]
        return bool(sub["delayed_entries"] >= 10)

    eventually_sync(
        hour_ones_held_aside,
        timeout_s=30,
        what="the delayed entries to be held aside",
        interval_s=0.05,
    )
    admin.unload_topic(topic)  # the new owner re-reads the holes and holds them aside again
    eventually_sync(
        hour_ones_held_aside,
        timeout_s=30,
        what="the new owner to hold the delayed entries aside",
        interval_s=0.05,
    )
    admin.unload_topic(topic)
    eventually_sync(
        hour_ones_held_aside,
        timeout_s=30,
        what="the next owner to hold the delayed entries aside",
        interval_s=0.05,
    )
    while len(got[b"soon"]) < 10:
        take(30_000)
    assert sorted(got[b"soon"]) == sorted(b"soon %d" % i for i in range(10))
    assert nothing_arrives(consumer, 500)  # the hour ones, still held
    consumer.close()


# --- replay and time -------------------------------------------------------------------------


def test_seek_reset_initial_position_ttl_and_delayed_delivery(
    client: magnetar.Client, admin: magnetar.AdminClient
) -> None:
    topic = unique("replay")
    admin.create_topic(topic)
    latest = client.subscribe(topic, "latest", initial_position="latest")
    with client.create_producer(topic) as producer:
        ids = [producer.send(f"m{i}".encode()) for i in range(20)]
        middle_ms = int(time.time() * 1000)
        time.sleep(0.05)
        ids += [producer.send(f"m{i}".encode()) for i in range(20, 30)]
    assert latest.receive(timeout_millis=10_000).data() == b"m0"  # subscribed before m0
    latest.close()
    late = client.subscribe(topic, "late", initial_position="latest")
    assert nothing_arrives(late, 500)  # a new subscription at latest sees none of the 30
    late.close()

    consumer = client.subscribe(topic, "replay", initial_position="earliest")
    assert consumer.receive(timeout_millis=10_000).data() == b"m0"
    consumer.seek(ids[12])
    assert consumer.receive(timeout_millis=10_000).data() == b"m12"
    consumer.seek(25)  # an offset
    assert consumer.receive(timeout_millis=10_000).data() == b"m25"
    consumer.seek(publish_time_ms=middle_ms)
    assert consumer.receive(timeout_millis=10_000).data() == b"m20"
    consumer.close()
    admin.reset_cursor(topic, "replay", 5)
    consumer = client.subscribe(topic, "replay")
    assert consumer.receive(timeout_millis=10_000).data() == b"m5"
    consumer.close()

    # delayed delivery: a shared subscription gets the message when it is due
    delayed = client.subscribe(topic, "delayed", "shared", initial_position="latest")
    with client.create_producer(topic) as producer:
        sent_at = time.monotonic()
        producer.send(b"later", deliver_after_ms=1500)
        producer.send(b"now")
    assert delayed.receive(timeout_millis=10_000).data() == b"now"
    later = delayed.receive(timeout_millis=10_000)
    assert later.data() == b"later"
    assert time.monotonic() - sent_at >= 1.4
    delayed.close()

    # message TTL: messages older than the TTL are acknowledged for every subscription
    ttl_topic = unique("ttl")
    admin.create_topic(ttl_topic, policies={"message_ttl_ms": 1000})
    admin.create_subscription(ttl_topic, "idle")
    with client.create_producer(ttl_topic) as producer:
        for i in range(20):
            producer.send(f"old{i}".encode())

    def backlog() -> int:
        sub = admin.topic_stats(ttl_topic)["partitions"][0]["subscriptions"][0]
        return int(sub["backlog_messages"])

    eventually_sync(
        lambda: backlog() == 0, timeout_s=30, what="the TTL to expire the backlog", interval_s=0.05
    )
    consumer = client.subscribe(ttl_topic, "idle")
    with client.create_producer(ttl_topic) as producer:
        producer.send(b"fresh")
    assert consumer.receive(timeout_millis=10_000).data() == b"fresh"
    consumer.close()


# --- broker failover ---------------------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="module")
async def test_subscription_state_survives_a_broker_sigkill(
    client: magnetar.Client, admin: magnetar.AdminClient, cluster: LocalCluster
) -> None:
    """Acknowledgements confirmed by the broker and older than cursor_persist_interval_ms (1 s)
    are persisted: none is redelivered by the new owner; every unacknowledged one is."""
    topic = unique("broker-kill")
    admin.create_topic(topic)
    consumer = client.subscribe(
        topic, "survive", "shared", initial_position="earliest", ack_receipts=True
    )
    everything = {f"k:{i}".encode() for i in range(200)}
    with client.create_producer(topic) as producer:
        for i in range(200):
            producer.send_async(f"k:{i}".encode(), None)
        producer.flush()
    got = [consumer.receive(timeout_millis=10_000) for _ in range(30)]
    acked = {m.data() for m in got[::3]}
    for message in got[::3]:
        consumer.acknowledge(message)  # confirmed by the broker (ack_receipts)
    await asyncio.sleep(1.5)  # past the persist interval: those acks are persisted
    owners = {o["partition_topic"]: o["broker_id"] for o in admin.list_ownership()}
    victim = next(b for b in cluster.brokers if b.broker_id == owners[f"public/default/{topic}"])
    await victim.kill()
    try:

        def drain() -> list[magnetar.Message]:
            received: list[magnetar.Message] = []
            while {m.data() for m in received} | acked != everything:
                message = consumer.receive(timeout_millis=60_000)
                received.append(message)
                consumer.acknowledge(message)
            return received

        received = await asyncio.to_thread(drain)
        values = {m.data() for m in received}
        assert values.isdisjoint(acked)  # no persisted ack is redelivered
        assert values | acked == everything
        assert {m.data() for m in got} - acked <= values  # what it held unacked came back
    finally:
        await victim.start()
        consumer.close()


@pytest.mark.parametrize(("sub_type", "acked"), [("shared", 4), ("exclusive", 6)])
def test_confirmed_acks_inside_a_batch_outlive_the_consumer(
    client: magnetar.Client,
    admin: magnetar.AdminClient,
    cluster: LocalCluster,
    sub_type: Literal["shared", "exclusive"],
    acked: int,
) -> None:
    """The long ``magnetar verify --seed 20261122`` found confirmed acks of messages inside a
    batch delivered again to another consumer: the client held them until the rest of the
    batch was acknowledged, yet confirmed them at once. With receipts, the part of a batch
    acknowledged so far now goes (and is persisted) as a partial ack, individual or
    cumulative, so a consumer killed right after its receipts loses none of them."""
    topic = unique(f"batch-acks-{sub_type}")
    admin.create_topic(topic)
    values = [f"b:{i}".encode() for i in range(10)]
    with client.create_producer(topic, batching_max_messages=100) as producer:
        receipt = producer.send_many(values)
    assert {i.batch_size for i in receipt.message_ids()} == {10}  # one batch, one entry
    worker = Worker(cluster.service_url, topic, "acks", sub_type, "doomed", 10, acked)
    try:
        worker.wait("HOLDING")
    finally:
        worker.kill()  # SIGKILL: no close, no parting acks
    with client.subscribe(topic, "acks", sub_type, initial_position="earliest") as consumer:
        received = [consumer.receive(timeout_millis=30_000) for _ in range(10 - acked)]
        assert [m.data() for m in received] == values[acked:]
        assert nothing_arrives(consumer, 1500)


# --- bad input ---------------------------------------------------------------------------------


def test_bad_input_gets_clear_errors(client: magnetar.Client, admin: magnetar.AdminClient) -> None:
    topic = unique("bad")
    admin.create_topic(topic)
    other = unique("other")
    admin.create_topic(other)
    with client.create_producer(topic) as producer:
        for i in range(5):
            producer.send(f"m{i}".encode())
    with client.create_producer(other) as producer:
        foreign = producer.send(b"x")

    consumer = client.subscribe(
        topic, "bad", "shared", initial_position="earliest", ack_receipts=True
    )
    with pytest.raises(IncompatibleSubscriptionError, match="shared"):
        client.subscribe(topic, "bad", "failover")
    message = consumer.receive(timeout_millis=10_000)
    with pytest.raises(InvalidArgumentError, match="cumulative"):
        consumer.acknowledge_cumulative(message)
    with pytest.raises(InvalidArgumentError):
        consumer.acknowledge(foreign)  # another topic's message id
    unknown = magnetar.MessageId(
        message.message_id().ledger_id + 1000, 0, -1, message.message_id().partition
    )
    with pytest.raises(InvalidArgumentError, match=r"past the last confirmed|not an entry"):
        consumer.acknowledge(unknown)
    with pytest.raises(InvalidArgumentError, match="past the end"):
        consumer.seek(10_000)
    with pytest.raises(InvalidArgumentError, match="past the end"):
        admin.reset_cursor(topic, "bad", 10_000)
    # the subscription still works
    consumer.acknowledge(message)
    assert consumer.receive(timeout_millis=10_000).data() == b"m1"
    consumer.close()

    # on a partitioned topic one offset goes to every partition: past a shorter one's end is
    # that partition's end, not an error
    partitioned = unique("bad-partitioned")
    admin.create_topic(partitioned, partitions=2)
    with client.create_producer(partitioned) as producer:
        for i in range(6):
            producer.send(f"p{i}".encode(), partition_key="only-one-partition")
    consumer = client.subscribe(partitioned, "seek", initial_position="earliest")
    consumer.seek(4)
    assert consumer.receive(timeout_millis=10_000).data() == b"p4"
    consumer.close()
