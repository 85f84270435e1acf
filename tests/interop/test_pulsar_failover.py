"""The real ``pulsar-client`` (PyPI, its C++ core) across a handover (SIGTERM) and a crash
(SIGKILL) of the broker that owns the partitions it produces to and consumes from.

A real cluster of separate processes (etcd, 3 bookies, 2 brokers), shared by the module. In
each scenario one named producer (``send_async``, batching on, deduplication on for the topic)
sends numbered messages under 16 keys from a thread, and two consumers of one subscription
receive and acknowledge from two more; the owning broker is stopped or killed mid-stream, and
restarted once the scenario is over. The client follows the partitions to the other broker
(CLOSE_PRODUCER and CLOSE_CONSUMER on a handover, the lost connection on a crash) and resends
what was not receipted under the same sequence ids. What must hold:

- every send whose callback said OK is received by the consumers, and no send failed;
- the topic stores every message exactly once (read back by a subscription created before the
  first send and left untouched meanwhile), each key's messages in send order;
- each consumer receives each key's messages in send order (counting first deliveries: what
  was acknowledged just before or during the fault may come again).

The longest time a partition went without a receipt (the producer's stall) and how many
messages came again are printed (``-s``); they are not checked, as no timing is. Two shorter
tests go with them: what a stopping broker tells a client, frame by frame, and key_shared
consumers of batches that hold several keys (split between them) acknowledging their parts.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pulsar  # the real pulsar-client from PyPI (its C++ core)
import pytest
import pytest_asyncio

import magnetar
from magnetar.testing import BrokerNode, LocalCluster
from magnetar.testing.eventually import eventually
from proto.broker.v1 import broker_pb2, broker_pb2_grpc
from tests.interop.pulsar_raw import RawConnection

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.asyncio(loop_scope="module"),
]

BROKER_ARGS = ["--session-ttl-s", "4", "--load-report-interval-ms", "500"]
KEYS = 16
BEFORE_FAULT = 1500
"""Receipts before the fault, and again after it: the stream runs on both sides of it."""
AFTER_FAULT = 1500


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("pulsar-failover")
    async with LocalCluster(root, bookies=3, brokers=2, broker_args=BROKER_ARGS) as cluster:
        await cluster.wait_brokers_registered()
        yield cluster


async def both_brokers_up(cluster: LocalCluster) -> None:
    """Both brokers running, registered, each watching the other (a broker revokes the session
    of a crashed peer only if it saw it listening), and reporting no partitions (the scenarios
    delete their topics), so that a new topic's partitions are spread over both."""
    for node in cluster.brokers:
        if not node.is_running:
            await node.start()
    await cluster.wait_brokers_registered()
    for node in cluster.brokers:
        await watching(node, peers=1)
    admin = magnetar.AdminClient(cluster.service_url)
    try:

        def idle() -> bool:
            brokers = admin.list_brokers()
            return len(brokers) == 2 and all(b.get("owned_partitions", 0) == 0 for b in brokers)

        await eventually(
            lambda: asyncio.to_thread(idle), timeout_s=30, what="both brokers without partitions"
        )
    finally:
        await asyncio.to_thread(admin.close)


async def watching(node: BrokerNode, peers: int) -> None:
    url = f"http://{node.http_address}/metrics"
    line = f'magnetar_broker_peers_watched{{broker="{node.broker_id}"}} {peers}.0'

    async def seen() -> bool:
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        return line in text.decode()

    await eventually(seen, timeout_s=30, what=f"{node.broker_id} watching {peers} peer(s)")


def pulsar_service_url(cluster: LocalCluster) -> str:
    """Both brokers' Pulsar listeners: the client looks topics up on the one that answers."""
    return "pulsar://" + ",".join(
        node.pulsar_url.removeprefix("pulsar://") for node in cluster.brokers
    )


async def owners(cluster: LocalCluster, topic: str) -> dict[str, str]:
    """partition -> owning broker id, assigning owners to unowned partitions (one lookup of the
    whole topic, so that its partitions are spread over the brokers)."""
    asked = next(node for node in cluster.brokers if node.is_running)
    async with grpc.aio.insecure_channel(asked.address) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        answer = await stub.Lookup(broker_pb2.LookupRequest(topic=topic), timeout=30)
    return {o.partition_topic: o.broker_id for o in answer.owners}


@dataclass
class Producing:
    """A named producer sending numbered, keyed messages with ``send_async`` from a thread."""

    producer: Any
    acked: set[int] = field(default_factory=set)
    failed: list[tuple[int, str]] = field(default_factory=list)
    receipt_times: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    """Per partition (-1: not partitioned), when its receipts came."""
    sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="pulsar-producer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            self.producer.send_async(str(n).encode(), self._callback(n), partition_key=key_of(n))
            n += 1
            self.sent = n
            if n % 20 == 0:
                time.sleep(0.01)  # a steady stream (~2,000 a second at most), not a flood
        self.producer.flush()

    def _callback(self, n: int) -> Callable[[pulsar.Result, Any], None]:
        def done(result: pulsar.Result, message_id: Any) -> None:
            with self.lock:
                if result == pulsar.Result.Ok:
                    self.acked.add(n)
                    self.receipt_times[message_id.partition()].append(time.monotonic())
                else:
                    self.failed.append((n, str(result)))

        return done

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def longest_stall_s(self) -> float:
        """The longest time a partition went without a receipt while the producer ran."""
        with self.lock:
            per_partition = [sorted(times) for times in self.receipt_times.values()]
        return max(
            (b - a for times in per_partition for a, b in itertools.pairwise(times)),
            default=0.0,
        )


@dataclass
class Consuming:
    """A consumer receiving and acknowledging from a thread, noting ``(key, n)`` per delivery."""

    consumer: Any
    received: list[tuple[str, int]] = field(default_factory=list)
    acked_at: dict[int, float] = field(default_factory=dict)
    """When the application first acknowledged each message."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="pulsar-consumer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                message = self.consumer.receive(200)
            except pulsar.Timeout:
                continue
            n = int(message.data())
            with self.lock:
                self.received.append((message.partition_key(), n))
            self.consumer.acknowledge(message)
            with self.lock:
                self.acked_at.setdefault(n, time.monotonic())

    def numbers(self) -> set[int]:
        with self.lock:
            return {n for _, n in self.received}


def key_of(n: int) -> str:
    return f"k{n % KEYS}"


def out_of_order(deliveries: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """``(key, before, after)`` wherever a key's first deliveries go backwards."""
    seen: set[int] = set()
    last: dict[str, int] = {}
    wrong = []
    for key, n in deliveries:
        if n in seen:
            continue  # delivered again: allowed (not acknowledged before a crash)
        seen.add(n)
        if key in last and n < last[key]:
            wrong.append((key, last[key], n))
        last[key] = n
    return wrong


def read_back(client: pulsar.Client, topic: str, subscription: str) -> list[tuple[str, int]]:
    """Everything stored, through a subscription that was created before the first send."""
    consumer = client.subscribe(topic, subscription, receiver_queue_size=5000)
    got: list[tuple[str, int]] = []
    try:
        while True:
            try:
                message = consumer.receive(3000)
            except pulsar.Timeout:
                return got
            assert message.redelivery_count() == 0
            got.append((message.partition_key(), int(message.data())))
    finally:
        consumer.close()


@dataclass
class Outcome:
    sent: int
    acked: set[int]
    failed: list[tuple[int, str]]
    per_consumer: list[list[tuple[str, int]]]
    stored: list[tuple[str, int]]
    longest_stall_s: float
    redelivered_acked_s_before: list[float]
    """For each message delivered again that had been acknowledged before the fault: how long
    before it."""

    @property
    def redelivered(self) -> int:
        """Deliveries of a message a consumer had received before."""
        deliveries = [n for per_consumer in self.per_consumer for _, n in per_consumer]
        return len(deliveries) - len(set(deliveries))


async def produce_and_consume_across(
    cluster: LocalCluster,
    topic: str,
    subscription_type: pulsar.ConsumerType,
    fault: Callable[[], Awaitable[None]],
) -> Outcome:
    """Run the producer and two consumers, ``fault`` once ``BEFORE_FAULT`` sends are receipted,
    go on until ``AFTER_FAULT`` more are, then stop and read the topic back."""
    client = pulsar.Client(
        pulsar_service_url(cluster),
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        audit = await asyncio.to_thread(
            lambda: client.subscribe(
                topic, "audit", initial_position=pulsar.InitialPosition.Earliest
            )
        )
        await asyncio.to_thread(audit.close)  # the subscription stays, its cursor at the start
        consumers = [
            Consuming(
                await asyncio.to_thread(
                    client.subscribe,
                    topic,
                    "work",
                    consumer_type=subscription_type,
                    consumer_name=name,
                    initial_position=pulsar.InitialPosition.Earliest,
                )
            )
            for name in ("c1", "c2")
        ]
        producing = Producing(
            await asyncio.to_thread(
                lambda: client.create_producer(
                    topic,
                    producer_name=f"failover-{uuid.uuid4().hex[:6]}",
                    batching_enabled=True,
                    batching_max_publish_delay_ms=5,
                    batching_max_messages=100,
                    block_if_queue_full=True,
                    max_pending_messages=2000,
                    send_timeout_millis=60_000,
                    # as Pulsar asks of key_shared producers: a batch holds one key, so that
                    # each key goes to its own consumer (a batch of several keys goes whole to
                    # its first key's consumer; see test_key_shared_consumers_of_mixed_batches_*)
                    batching_type=(
                        pulsar.BatchingType.KeyBased
                        if subscription_type == pulsar.ConsumerType.KeyShared
                        else pulsar.BatchingType.Default
                    ),
                )
            )
        )
        for consuming in consumers:
            consuming.start()
        producing.start()
        await eventually(
            lambda: producing.count() >= BEFORE_FAULT,
            timeout_s=60,
            what=f"{BEFORE_FAULT} receipts before the fault",
            interval_s=0.05,
        )
        at_fault = producing.count()
        fault_at = time.monotonic()
        await fault()
        await eventually(
            lambda: producing.count() >= at_fault + AFTER_FAULT,
            timeout_s=90,
            what=f"{AFTER_FAULT} receipts after the fault",
            interval_s=0.05,
        )
        producing.stop.set()
        assert producing.thread is not None
        await asyncio.to_thread(producing.thread.join, 90)
        assert not producing.thread.is_alive(), "the producer's flush did not end"
        acked = set(producing.acked)

        def all_received() -> bool:
            return acked <= set().union(*(c.numbers() for c in consumers))

        await eventually(all_received, timeout_s=60, what="every receipted message consumed")
        for consuming in consumers:
            consuming.stop.set()
            assert consuming.thread is not None
            await asyncio.to_thread(consuming.thread.join, 10)
        stored = await asyncio.to_thread(read_back, client, topic, "audit")
        return Outcome(
            sent=producing.sent,
            acked=acked,
            failed=list(producing.failed),
            per_consumer=[list(c.received) for c in consumers],
            stored=stored,
            longest_stall_s=producing.longest_stall_s(),
            redelivered_acked_s_before=acked_then_redelivered(consumers, fault_at),
        )
    finally:
        await asyncio.to_thread(client.close)


def acked_then_redelivered(consumers: list[Consuming], fault_at: float) -> list[float]:
    deliveries: dict[int, int] = defaultdict(int)
    acked_at: dict[int, float] = {}
    for consuming in consumers:
        for _, n in consuming.received:
            deliveries[n] += 1
        for n, at in consuming.acked_at.items():
            acked_at[n] = min(at, acked_at.get(n, at))
    return sorted(
        fault_at - acked_at[n]
        for n, count in deliveries.items()
        if count > 1 and n in acked_at and acked_at[n] < fault_at
    )


def check(outcome: Outcome, *, both_consumers_served: bool = True) -> None:
    assert outcome.failed == []  # no send failed
    assert len(outcome.acked) == outcome.sent  # every send was receipted
    received = {n for deliveries in outcome.per_consumer for _, n in deliveries}
    assert outcome.acked <= received  # nothing acknowledged lost
    stored = [n for _, n in outcome.stored]
    assert len(stored) == len(set(stored)), "a message is stored twice"
    assert set(stored) == outcome.acked  # stored: exactly what was receipted
    assert all(key == key_of(n) for key, n in outcome.stored)
    assert out_of_order(outcome.stored) == []  # each key stored in send order
    for deliveries in outcome.per_consumer:
        assert out_of_order(deliveries) == []  # and delivered in send order
    if both_consumers_served:  # each had keys or partitions of its own
        assert all(deliveries for deliveries in outcome.per_consumer)


async def create_topic(cluster: LocalCluster, topic: str, partitions: int) -> None:
    admin = magnetar.AdminClient(cluster.service_url)
    try:
        await asyncio.to_thread(
            admin.create_topic, topic, partitions, policies={"deduplication": True}
        )
    finally:
        await asyncio.to_thread(admin.close)


async def delete_topic(cluster: LocalCluster, topic: str) -> None:
    admin = magnetar.AdminClient(cluster.service_url)
    try:
        await asyncio.to_thread(admin.delete_topic, topic, force=True)
    finally:
        await asyncio.to_thread(admin.close)


async def scenario(
    cluster: LocalCluster,
    *,
    signal: str,
    partitions: int,
    subscription_type: pulsar.ConsumerType,
) -> Outcome:
    """One fault under the Pulsar client: ``signal`` ("SIGTERM" or "SIGKILL") to the broker
    that owns partition 0 of a new topic of ``partitions`` partitions (0: not partitioned),
    spread over both brokers; the victim is started again afterwards."""
    await both_brokers_up(cluster)
    name = f"{signal.lower()}-{uuid.uuid4().hex[:8]}"
    await create_topic(cluster, name, partitions)
    spread = await owners(cluster, name)
    if partitions > 1:
        assert set(spread.values()) == {node.broker_id for node in cluster.brokers}
    first = f"public/default/{name}-partition-0" if partitions else f"public/default/{name}"
    victim = next(node for node in cluster.brokers if node.broker_id == spread[first])
    survivor = next(node for node in cluster.brokers if node is not victim)

    async def fault() -> None:
        if signal == "SIGTERM":
            await victim.stop()  # hands its partitions over, then exits
            assert victim.exit_code == 0
        else:
            await victim.kill()
            assert victim.exit_code == -9

    outcome = await produce_and_consume_across(
        cluster, f"persistent://public/default/{name}", subscription_type, fault
    )
    assert set((await owners(cluster, name)).values()) == {survivor.broker_id}
    print(
        f"{signal} of {victim.broker_id} ({partitions} partitions, {subscription_type}):"
        f" {len(outcome.acked)} receipted, {outcome.redelivered} delivered again (acknowledged"
        f" before the fault: {len(outcome.redelivered_acked_s_before)}, at most"
        f" {max(outcome.redelivered_acked_s_before, default=0):.2f} s before), longest receipt"
        f" gap of a partition {outcome.longest_stall_s:.2f} s"
    )
    await delete_topic(cluster, name)
    await both_brokers_up(cluster)
    return outcome


async def test_a_handover_sigterm_loses_and_duplicates_nothing_and_keeps_key_order(
    cluster: LocalCluster,
) -> None:
    outcome = await scenario(
        cluster, signal="SIGTERM", partitions=0, subscription_type=pulsar.ConsumerType.KeyShared
    )
    check(outcome)


async def test_a_crash_sigkill_loses_and_duplicates_nothing_and_keeps_key_order(
    cluster: LocalCluster,
) -> None:
    outcome = await scenario(
        cluster, signal="SIGKILL", partitions=4, subscription_type=pulsar.ConsumerType.Failover
    )
    check(outcome)


async def test_a_stopping_broker_tells_its_pulsar_producers_and_consumers_before_it_goes(
    cluster: LocalCluster,
) -> None:
    # what the client is told on a handover, frame by frame: CLOSE_PRODUCER and CLOSE_CONSUMER
    # (the client looks the topic up again at once), not only a dropped connection
    await both_brokers_up(cluster)
    name = f"told-{uuid.uuid4().hex[:8]}"
    await create_topic(cluster, name, 0)
    owner = (await owners(cluster, name))[f"public/default/{name}"]
    victim = next(node for node in cluster.brokers if node.broker_id == owner)
    assert victim.pulsar_address is not None
    topic = f"persistent://public/default/{name}"
    async with RawConnection.open(victim.pulsar_address) as raw:
        await raw.create_producer(topic, producer_id=1)
        await raw.subscribe(topic, "sub", consumer_id=7, earliest=True)
        await raw.flow(7, 100)
        for sequence_id in range(5):
            raw.send_message(1, sequence_id, f"m{sequence_id}".encode())
        receipts = messages = 0
        while receipts < 5 or messages < 5:
            frame = await raw.read()
            assert frame is not None
            receipts += frame.type_name == "SEND_RECEIPT"
            messages += frame.type_name == "MESSAGE"
        stopping = asyncio.ensure_future(victim.stop())
        told = []
        while (frame := await raw.read(timeout_s=60)) is not None:
            told.append(frame)
        await stopping
    closes = {
        (f.type_name, f.command.close_producer.producer_id or f.command.close_consumer.consumer_id)
        for f in told
    }
    assert closes == {("CLOSE_PRODUCER", 1), ("CLOSE_CONSUMER", 7)}, told
    assert victim.exit_code == 0
    await delete_topic(cluster, name)
    await both_brokers_up(cluster)


@pytest.mark.parametrize("batch_index_acks", [True, False], ids=["batch-index-acks", "entry-acks"])
async def test_key_shared_consumers_of_mixed_batches_get_them_whole_and_acknowledge_them(
    cluster: LocalCluster, batch_index_acks: bool
) -> None:
    # batches of several keys go whole to the consumer of their first key, as Pulsar's broker
    # routes them (a C++ client acknowledges part of a batch only with batch-index acks, which
    # it does not tell the broker); a later batch with a key another consumer holds waits for
    # its acknowledgement, so each key's messages still come in order, and the backlog drains
    await both_brokers_up(cluster)
    name = f"mixed-{uuid.uuid4().hex[:8]}"
    await create_topic(cluster, name, 0)
    topic = f"persistent://public/default/{name}"

    def produce_and_consume() -> list[list[tuple[str, int]]]:
        client = pulsar.Client(
            pulsar_service_url(cluster), logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        )
        try:
            consumers = [
                client.subscribe(
                    topic,
                    "mixed",
                    consumer_type=pulsar.ConsumerType.KeyShared,
                    consumer_name=consumer_name,
                    batch_index_ack_enabled=batch_index_acks,
                )
                for consumer_name in ("c1", "c2")
            ]
            producer = client.create_producer(
                topic,
                batching_enabled=True,
                batching_max_publish_delay_ms=50,
                batching_max_messages=10,  # 20 batches, whose first keys go to both consumers
            )
            for n in range(200):
                producer.send_async(str(n).encode(), None, partition_key=key_of(n))
            producer.flush()
            got: list[list[tuple[str, int]]] = [[] for _ in consumers]
            idle = 0
            while sum(map(len, got)) < 200 and idle < 20:
                idle += 1
                for consumer, mine in zip(consumers, got, strict=True):
                    try:
                        message = consumer.receive(250)
                    except pulsar.Timeout:
                        continue
                    idle = 0
                    mine.append((message.partition_key(), int(message.data())))
                    consumer.acknowledge(message)
            return got
        finally:
            client.close()

    got = await asyncio.to_thread(produce_and_consume)
    assert sorted(n for per_consumer in got for _, n in per_consumer) == list(range(200))
    assert all(got)
    for per_consumer in got:
        assert out_of_order(per_consumer) == []
    admin = magnetar.AdminClient(cluster.service_url)
    try:

        def backlog() -> int:
            stats = admin.topic_stats(name)
            (subscription,) = stats["partitions"][0]["subscriptions"]
            return int(subscription.get("backlog_messages", 0))

        await eventually(
            lambda: asyncio.to_thread(lambda: backlog() == 0),
            timeout_s=30,
            what="an empty backlog",
        )
    finally:
        await asyncio.to_thread(admin.close)
    await delete_topic(cluster, name)


@pytest.mark.soak
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("signal", ["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize(
    ("partitions", "subscription_type"),
    [
        (0, pulsar.ConsumerType.KeyShared),
        (0, pulsar.ConsumerType.Failover),
        (3, pulsar.ConsumerType.KeyShared),
        (3, pulsar.ConsumerType.Failover),
    ],
)
async def test_every_combination_three_times(
    cluster: LocalCluster, signal: str, partitions: int, subscription_type: pulsar.ConsumerType
) -> None:
    for _ in range(3):
        outcome = await scenario(
            cluster, signal=signal, partitions=partitions, subscription_type=subscription_type
        )
        # one failover consumer of a non-partitioned topic is active at a time
        check(
            outcome,
            both_consumers_served=partitions > 0
            or subscription_type == pulsar.ConsumerType.KeyShared,
        )
