"""Every public method of the client library, end to end, against a real ``magnetar standalone``
process and against a real multi-process cluster (etcd, 3 bookies, 2 brokers).

The sync facade (``magnetar.Client``, ``magnetar.AdminClient``) runs each asyncio method of the
same name, so the sync tests exercise both; the asyncio-only forms (``async for``, ``async
with``, callbacks on the caller's loop) have their own tests.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

import magnetar
import magnetar.aio
from magnetar.common.errors import (
    IncompatibleSubscriptionError,
    InvalidArgumentError,
    InvalidConfigError,
    InvalidServiceUrlError,
    InvalidTopicNameError,
    MessageTooLargeError,
    OperationTimeoutError,
    ProducerQueueFullError,
    ReceiveTimeoutError,
    TopicNotFoundError,
)
from magnetar.testing import LocalCluster, StandaloneNode
from magnetar.testing.eventually import eventually_sync

pytestmark = [pytest.mark.timeout(180)]


@dataclass
class Target:
    kind: str
    service_url: str


@pytest_asyncio.fixture(
    scope="module",
    loop_scope="module",
    params=["standalone", pytest.param("cluster", marks=pytest.mark.etcd)],
)
async def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Target]:
    root = tmp_path_factory.mktemp(f"client-{request.param}")
    if request.param == "standalone":
        async with StandaloneNode(root / "data") as node:
            yield Target("standalone", node.service_url)
    else:
        async with LocalCluster(root, bookies=3, brokers=2) as cluster:
            await cluster.wait_brokers_registered()
            yield Target("cluster", cluster.service_url)


@pytest.fixture
def client(target: Target) -> Iterator[magnetar.Client]:
    with magnetar.Client(target.service_url, operation_timeout_s=30) as c:
        yield c


@pytest.fixture
def admin(target: Target) -> Iterator[magnetar.AdminClient]:
    with magnetar.AdminClient(target.service_url) as a:
        yield a


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def receive_all(consumer: magnetar.Consumer, count: int) -> list[magnetar.Message]:
    got: list[magnetar.Message] = []
    while len(got) < count:
        got.append(consumer.receive(timeout_millis=15_000))
    return got


# --- producer and consumer ---------------------------------------------------------------------


def test_produce_and_consume_every_method(client: magnetar.Client, admin: magnetar.AdminClient):
    topic = unique("api")
    admin.create_topic(topic, partitions=3)
    assert client.get_topic_partitions(topic) == [
        f"public/default/{topic}-partition-{i}" for i in range(3)
    ]

    with client.create_producer(topic, "api-producer", batching_max_messages=50) as producer:
        assert producer.topic() == f"public/default/{topic}"
        assert producer.producer_name() == "api-producer"
        assert producer.is_connected()
        first = producer.send(
            b"first", properties={"kind": "sync"}, partition_key="k1", event_timestamp=1234
        )

        called: list[tuple[object, object]] = []
        done = threading.Event()

        def callback(error: object, message_id: object) -> None:
            called.append((error, message_id))
            if len(called) == 20:
                done.set()

        futures = [
            producer.send_async(f"async-{i}".encode(), callback, partition_key=f"k{i % 4}")
            for i in range(20)
        ]
        producer.flush()
        assert done.wait(10)
        assert producer.pending_messages() == 0
        ids = [f.result(timeout=10) for f in futures]
        assert all(error is None for error, _ in called)
        assert sorted(map(str, ids)) == sorted(str(mid) for _, mid in called)

    with client.subscribe(
        topic, "api-sub", initial_position="earliest", consumer_name="api-consumer"
    ) as consumer:
        assert consumer.topic() == f"public/default/{topic}"
        assert consumer.subscription_name() == "api-sub"
        assert consumer.consumer_name() == "api-consumer"
        assert consumer.is_connected()
        assert not consumer.has_reached_end_of_topic()
        messages = consumer.batch_receive(max_messages=5, timeout_millis=5000)
        assert 1 <= len(messages) <= 5
        messages += receive_all(consumer, 21 - len(messages))
        by_data = {m.data(): m for m in messages}
        assert set(by_data) == {b"first", *(f"async-{i}".encode() for i in range(20))}

        m = by_data[b"first"]
        assert m.partition_key() == "k1"
        assert m.properties() == {"kind": "sync"}
        assert m.event_timestamp() == 1234
        assert m.message_id() == first
        assert m.redelivery_count() == 0
        assert m.producer_name() == "api-producer"
        assert m.topic_name().startswith(f"public/default/{topic}-partition-")
        assert m.offset() >= 0
        assert m.sequence_id() >= 0
        assert abs(m.publish_timestamp() - time.time() * 1000) < 120_000

        # same key -> same partition, in send order
        for key in ("k0", "k1", "k2", "k3"):
            keyed = [x for x in messages if x.partition_key() == key]
            assert len({x.message_id().partition for x in keyed}) == 1
            offsets = [x.offset() for x in keyed]
            assert offsets == sorted(offsets)

        for x in messages[:10]:
            consumer.acknowledge(x)
        last_by_partition: dict[int, magnetar.Message] = {}
        for x in messages:
            last_by_partition[x.message_id().partition] = x
        for x in last_by_partition.values():
            consumer.acknowledge_cumulative(x)
        with pytest.raises(ReceiveTimeoutError):
            consumer.receive(timeout_millis=300)
        assert consumer.batch_receive(timeout_millis=200) == []

    stats = admin.topic_stats(topic)
    subscription = next(
        s for p in stats["partitions"] for s in p["subscriptions"] if s["subscription"] == "api-sub"
    )
    assert subscription["subscription_type"] == "exclusive"
    assert sum(s["backlog_messages"] for p in stats["partitions"] for s in p["subscriptions"]) == 0


def test_send_many_publishes_a_run_in_order(client: magnetar.Client):
    topic = unique("many")
    with client.create_producer(topic, batching_max_messages=100) as producer:
        values = [b"run-%d" % i for i in range(230)]
        receipt = producer.send_many(values, partition_key="same", event_timestamp=77)
        assert isinstance(receipt, magnetar.SendReceipt)
        assert len(receipt) == 230
        ids = receipt.message_ids()
        assert ids == sorted(ids)
        with pytest.raises(InvalidArgumentError, match="at least one message"):
            producer.send_many([])
    with client.subscribe(topic, "many-sub", initial_position="earliest") as consumer:
        received = receive_all(consumer, 230)
        assert [m.data() for m in received] == values
        assert [m.message_id() for m in received] == ids
        assert {(m.partition_key(), m.event_timestamp()) for m in received} == {("same", 77)}


def test_negative_acknowledge_redelivers(client: magnetar.Client):
    topic = unique("nack")
    producer = client.create_producer(topic)
    producer.send(b"again")
    consumer = client.subscribe(
        topic, "nack-sub", initial_position="earliest", negative_ack_redelivery_delay_ms=100
    )
    message = consumer.receive(timeout_millis=10_000)
    consumer.negative_acknowledge(message)
    redelivered = consumer.receive(timeout_millis=10_000)
    assert redelivered.data() == b"again"
    assert redelivered.message_id() == message.message_id()
    assert redelivered.redelivery_count() >= 1
    consumer.acknowledge(redelivered)
    consumer.close()
    producer.close()


def test_a_full_pending_queue_makes_senders_wait_in_order(client: magnetar.Client):
    topic = unique("full")
    with client.create_producer(topic, max_pending_messages=5) as producer:
        futures = []
        for i in range(300):
            if i % 50 == 0:
                producer.send(b"%d" % i)  # sync sends share the same bounded queue
            else:
                futures.append(producer.send_async(b"%d" % i))
            assert producer.pending_messages() <= 5
        producer.flush()
        assert all(f.done() and f.exception() is None for f in futures)
    with client.create_reader(topic, "earliest") as reader:
        got = [int(reader.read_next(timeout_millis=10_000).data()) for _ in range(300)]
    assert got == list(range(300))


def test_consumer_iterates_and_seeks(client: magnetar.Client):
    topic = unique("seek")
    with client.create_producer(topic) as producer:
        ids = [producer.send(f"m{i}".encode()) for i in range(10)]
    consumer = client.subscribe(topic, "seek-sub", initial_position="earliest")
    seen = []
    for message in consumer:
        seen.append(message)
        if len(seen) == 10:
            break
    assert [m.data() for m in seen] == [f"m{i}".encode() for i in range(10)]
    consumer.acknowledge_cumulative(seen[-1])

    consumer.seek(seen[3].offset())  # by offset
    assert consumer.receive(timeout_millis=10_000).data() == b"m3"
    consumer.seek(ids[6])  # by message id: that message comes next
    assert consumer.receive(timeout_millis=10_000).data() == b"m6"
    consumer.seek(publish_time_ms=seen[0].publish_timestamp())  # by time
    assert consumer.receive(timeout_millis=10_000).data() == b"m0"
    consumer.seek(magnetar.MessageId.latest)
    with pytest.raises(ReceiveTimeoutError):
        consumer.receive(timeout_millis=300)
    consumer.close()
    # closed: iteration ends, calls say so
    assert list(consumer) == []


# --- readers ------------------------------------------------------------------------------------


def test_readers_from_every_kind_of_start(client: magnetar.Client):
    topic = unique("reader")
    with client.create_producer(topic) as producer:
        ids = [producer.send(f"r{i}".encode()) for i in range(6)]
    with client.create_producer(topic) as producer:
        ids += [producer.send(f"r{i}".encode()) for i in range(6, 8)]

    def read(reader: magnetar.Reader, count: int) -> list[bytes]:
        with reader:
            assert reader.topic() == f"public/default/{topic}"
            assert reader.is_connected()
            return [reader.read_next(timeout_millis=10_000).data() for _ in range(count)]

    assert read(client.create_reader(topic, "earliest"), 2) == [b"r0", b"r1"]
    assert read(client.create_reader(topic, magnetar.MessageId.earliest), 1) == [b"r0"]
    assert read(client.create_reader(topic, ids[2]), 1) == [b"r3"]
    assert read(client.create_reader(topic, ids[2], start_message_id_inclusive=True), 1) == [b"r2"]
    with client.create_reader(topic, "earliest") as probe:
        offsets = [probe.read_next(timeout_millis=10_000) for _ in range(8)]
    assert read(client.create_reader(topic, start_offset=offsets[5].offset()), 3) == [
        b"r5",
        b"r6",
        b"r7",
    ]
    t6 = offsets[6].publish_timestamp()
    first_at_t6 = next(m for m in offsets if m.publish_timestamp() >= t6)  # same ms: earlier
    assert read(client.create_reader(topic, start_publish_time_ms=t6), 1) == [first_at_t6.data()]

    latest = client.create_reader(topic, "latest")
    with pytest.raises(ReceiveTimeoutError):
        latest.read_next(timeout_millis=300)
    with client.create_producer(topic) as producer:
        producer.send(b"new")
    assert latest.read_next(timeout_millis=10_000).data() == b"new"
    latest.seek(ids[0])
    assert latest.read_next(timeout_millis=10_000).data() == b"r0"
    assert not latest.has_reached_end_of_topic()
    collected = []
    for message in latest:
        collected.append(message.data())
        if len(collected) == 2:
            break
    assert collected == [b"r1", b"r2"]
    latest.close()

    with pytest.raises(InvalidArgumentError, match="exactly one"):
        client.create_reader(topic, "earliest", start_offset=3)
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        client.create_reader(topic)


# --- admin --------------------------------------------------------------------------------------


def test_admin_every_method(client: magnetar.Client, admin: magnetar.AdminClient, target: Target):
    topic = unique("admin")
    created = admin.create_topic(
        topic, 2, policies={"retention_time_ms": 60_000}, properties={"team": "a"}
    )
    assert created == {"topic": f"public/default/{topic}", "partitions": 2}
    info = admin.get_topic(topic)
    assert info["partitions"] == 2
    assert info["policies"]["retention_time_ms"] == 60_000
    assert info["properties"] == {"team": "a"}
    assert admin.get_partitions(topic) == 2
    assert {"topic": f"public/default/{topic}", "partitions": 2} in admin.list_topics()
    assert any(t["topic"].endswith(topic) for t in admin.list_topics("public/default"))

    with client.create_producer(topic) as producer:
        for i in range(10):
            producer.send_async(f"a{i}".encode())
        producer.flush()

    admin.create_subscription(topic, "made-by-admin", "earliest")
    assert "made-by-admin" in admin.list_subscriptions(topic)
    stats = admin.topic_stats(topic, internal=True)
    assert len(stats["partitions"]) == 2
    assert sum(p["next_offset"] for p in stats["partitions"]) == 10
    assert all(p["ledgers"] and p["owner_broker_id"] for p in stats["partitions"])

    consumer = client.subscribe(topic, "made-by-admin")
    assert len(receive_all(consumer, 10)) == 10  # the admin-made subscription started earliest
    consumer.close()
    admin.reset_cursor(topic, "made-by-admin", "earliest")
    consumer = client.subscribe(topic, "made-by-admin")
    again = receive_all(consumer, 10)
    assert sorted(m.data() for m in again) == sorted(f"a{i}".encode() for i in range(10))
    consumer.close()
    admin.reset_cursor(topic, "made-by-admin", 5)  # an offset on every partition
    admin.reset_cursor(topic, "made-by-admin", publish_time_ms=0)
    admin.delete_subscription(topic, "made-by-admin")
    assert "made-by-admin" not in admin.list_subscriptions(topic)

    assert admin.update_partitions(topic, 3) == 3
    assert admin.get_partitions(topic) == 3

    brokers = admin.list_brokers()
    assert len(brokers) == (1 if target.kind == "standalone" else 2)
    assert all(b["service_url"].startswith("magnetar://") for b in brokers)
    bookies = admin.list_bookies()
    assert len(bookies) == 3
    assert all(b["state"] == "writable" for b in bookies)
    ownership = admin.list_ownership()
    owned = {o["partition_topic"]: o["broker_id"] for o in ownership}
    assert f"public/default/{topic}-partition-0" in owned
    mine = admin.list_ownership(owned[f"public/default/{topic}-partition-0"])
    assert mine
    assert all(o["broker_id"] == mine[0]["broker_id"] for o in mine)
    ledgers = admin.list_ledgers(topic)
    assert ledgers
    assert all(ledger["topic"].startswith(f"public/default/{topic}") for ledger in ledgers)
    one = admin.get_ledger(ledgers[0]["ledger_id"])
    assert one["summary"]["ledger_id"] == ledgers[0]["ledger_id"]
    assert one["ensembles"]
    assert len(one["ensembles"][0]["bookie_ids"]) == 3

    admin.unload_topic(topic)
    with client.create_producer(topic) as producer:  # placed again on the next lookup
        producer.send(b"after unload")

    admin.delete_topic(topic, force=True)
    assert not any(t["topic"].endswith(topic) for t in admin.list_topics())
    with pytest.raises(TopicNotFoundError):
        admin.get_topic(topic)


def test_client_admin_shares_the_client(client: magnetar.Client):
    admin = client.admin()
    topic = unique("shared-admin")
    admin.create_topic(topic)
    assert admin.get_partitions(topic) == 0
    admin.close()
    # the client keeps working after its admin closed
    with client.create_producer(topic) as producer:
        producer.send(b"x")


# --- asyncio forms ------------------------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="module")
async def test_asyncio_forms(target: Target):
    topic = unique("aio")
    async with magnetar.aio.Client(target.service_url) as client:
        async with magnetar.aio.AdminClient(target.service_url) as admin:
            await admin.create_topic(topic, 2)
        seen: list[tuple[object, object, int]] = []
        loop_thread = threading.get_ident()

        def callback(error: object, message_id: object) -> None:
            seen.append((error, message_id, threading.get_ident()))

        async with await client.create_producer(topic) as producer:
            futures = [producer.send_async(f"x{i}".encode(), callback) for i in range(10)]
            await producer.flush()
            await asyncio.gather(*futures)
        assert len(seen) == 10
        assert all(e is None and t == loop_thread for e, _, t in seen)  # on the caller's loop

        async with (
            await client.subscribe(topic, "aio-sub", initial_position="earliest") as consumer,
            asyncio.timeout(30),
        ):
            got = []
            async for message in consumer:
                got.append(message)
                await consumer.acknowledge(message)
                if len(got) == 10:
                    break
            assert sorted(m.data() for m in got) == sorted(f"x{i}".encode() for i in range(10))
            assert await consumer.batch_receive(timeout_millis=100) == []

        partition_topic = got[0].topic_name()
        async with (
            await client.create_reader(partition_topic, "earliest") as reader,
            asyncio.timeout(30),
        ):
            async for message in reader:
                assert message.topic_name() == partition_topic
                break
            else:
                pytest.fail("the reader ended without a message")


# --- bad input ----------------------------------------------------------------------------------


def test_malformed_service_url_says_what_is_expected():
    for url in ("localhost:6650", "magnetar://", "magnetar://host:99999", "http://x:1"):
        with pytest.raises(InvalidServiceUrlError, match=r"magnetar://host:port"):
            magnetar.Client(url)
    with pytest.raises(InvalidConfigError, match="operation_timeout"):
        magnetar.Client("magnetar://localhost:6650", operation_timeout=3)


def test_unreachable_broker_says_to_check_it_runs(unused_tcp_port: int):
    with (
        magnetar.Client(
            f"magnetar://127.0.0.1:{unused_tcp_port}", operation_timeout_s=1.5
        ) as client,
        pytest.raises(OperationTimeoutError, match="broker runs there"),
    ):
        client.create_producer("nowhere")
    with (
        magnetar.AdminClient(
            f"magnetar://127.0.0.1:{unused_tcp_port}", operation_timeout_s=1.5
        ) as admin,
        pytest.raises(OperationTimeoutError, match="broker runs there"),
    ):
        admin.list_topics()


def test_unknown_topic_and_subscription(admin: magnetar.AdminClient):
    with pytest.raises(TopicNotFoundError, match="no-such-topic"):
        admin.topic_stats(unique("no-such-topic"))
    with pytest.raises(TopicNotFoundError):
        admin.delete_topic(unique("no-such-topic"))
    with pytest.raises(InvalidTopicNameError, match="invalid topic name 'a/b/c/d'"):
        admin.get_topic("a/b/c/d")


def test_bad_topic_policies_are_refused_by_name(admin: magnetar.AdminClient):
    with pytest.raises(InvalidArgumentError, match="retention_time_ms is >= 0, or -1"):
        admin.create_topic(unique("policy"), policies={"retention_time_ms": -5})
    with pytest.raises(InvalidArgumentError, match=r"unknown topic policies.*retention_ms"):
        admin.create_topic(unique("policy"), policies={"retention_ms": 5})


def test_oversized_message_fails_alone(client: magnetar.Client):
    topic = unique("big")
    with client.create_producer(topic) as producer:
        with pytest.raises(MessageTooLargeError, match="over the broker's limit"):
            producer.send(b"x" * (6 * 1024 * 1024))
        small = producer.send(b"small")  # the producer goes on
    consumer = client.subscribe(topic, "s", initial_position="earliest")
    received = consumer.receive(timeout_millis=10_000)
    assert (received.data(), received.message_id()) == (b"small", small)
    consumer.close()


def test_wrong_subscription_type_says_what_to_do(client: magnetar.Client):
    topic = unique("type")
    first = client.subscribe(topic, "typed", "exclusive")
    with pytest.raises(IncompatibleSubscriptionError, match=r"is exclusive, not shared.*exclusive"):
        client.subscribe(topic, "typed", "shared")
    with client.create_producer(topic) as producer:
        producer.send(b"still flowing")
    assert first.receive(timeout_millis=10_000).data() == b"still flowing"
    first.close()


def test_other_bad_calls(client: magnetar.Client):
    topic = unique("bad")
    with client.create_producer(
        topic,
        max_pending_messages=1,
        block_if_queue_full=False,
        batching_max_publish_delay_ms=50,
        batching_self_clocking=False,  # the first send stays pending for the delay
    ) as producer:
        with pytest.raises(InvalidArgumentError, match="must be bytes"):
            producer.send("text")  # type: ignore[arg-type]
        first = producer.send_async(b"1")
        second = producer.send_async(b"2")
        with pytest.raises(ProducerQueueFullError, match="block_if_queue_full"):
            second.result(timeout=10)
        first.result(timeout=10)
    with pytest.raises(InvalidConfigError, match="batching_max_mesages"):
        client.create_producer(topic, batching_max_mesages=3)
    with pytest.raises(InvalidConfigError, match="subscription_type"):
        client.subscribe(topic, "s", "fanout")  # type: ignore[arg-type]


def test_client_closed_is_clear(target: Target):
    client = magnetar.Client(target.service_url)
    producer = client.create_producer(unique("closing"))
    client.close()
    client.close()  # idempotent
    with pytest.raises(magnetar.MagnetarError, match="closed"):
        producer.send(b"late")
    with pytest.raises(magnetar.MagnetarError, match="closed"):
        client.create_producer("x")


@pytest.fixture
def unused_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_receiver_queue_bounds_what_is_delivered(
    client: magnetar.Client, admin: magnetar.AdminClient
):
    topic = unique("queue")
    with client.create_producer(topic, batching_max_messages=500) as producer:
        for i in range(20_000):
            producer.send_async(b"%d" % i)
        producer.flush()
    consumer = client.subscribe(
        topic, "bounded", initial_position="earliest", receiver_queue_size=1000
    )
    first = consumer.receive(timeout_millis=10_000)

    def delivered_so_far() -> tuple[int, dict[str, Any]]:
        stats = admin.topic_stats(topic)
        (subscription,) = [
            s for s in stats["partitions"][0]["subscriptions"] if s["subscription"] == "bounded"
        ]
        return subscription["consumers"][0]["unacked_messages"], subscription

    # the broker delivers until the permits are spent (then nothing more comes unasked)
    eventually_sync(
        lambda: delivered_so_far()[0] >= 1000,
        timeout_s=30,
        what="the broker to spend the permits",
        interval_s=0.05,
    )
    delivered, subscription = delivered_so_far()
    # the queue's size, the one message taken, and at most one batch of overshoot
    assert 1000 <= delivered <= 1000 + 1 + 500, subscription
    consumer.acknowledge(first)
    consumer.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_named_producer_numbers_from_its_initial_sequence_id_and_learns_the_last(
    target: Target,
):
    topic = unique("seq")
    async with magnetar.aio.Client(target.service_url) as client:
        async with await client.create_producer(
            topic, "numbered", initial_sequence_id=99
        ) as producer:
            assert producer.last_sequence_id == 99  # nothing sent yet
            await asyncio.gather(*(producer.send_async(b"m") for _ in range(3)))
            assert producer.last_sequence_id == 102
        # the same name again, with a lower base: the broker's 102 wins, and a new name starts
        # from its own base
        async with await client.create_producer(topic, "numbered", initial_sequence_id=49) as again:
            assert again.last_sequence_id == 102
            await again.send(b"n")
            assert again.last_sequence_id == 103
        async with await client.create_producer(topic, "other") as other:
            assert other.last_sequence_id == -1
        with pytest.raises(InvalidConfigError, match="initial_sequence_id"):
            await client.create_producer(topic, initial_sequence_id=-2)
    with magnetar.Client(target.service_url) as sync_client:
        sync_producer = sync_client.create_producer(topic, "numbered")
        assert sync_producer.last_sequence_id == 103
        sync_producer.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_reader_takes_what_is_available_in_bulk(target: Target):
    topic = unique("bulk")
    async with magnetar.aio.Client(target.service_url) as client:
        async with await client.create_producer(topic) as producer:
            await asyncio.gather(*(producer.send_async(f"b{i}".encode()) for i in range(10)))
        async with await client.create_reader(topic, "earliest") as reader:
            got: list[bytes] = []
            while len(got) < 10:
                taken = await reader.read_available(4, timeout_millis=10_000)
                assert 1 <= len(taken) <= 4
                got += [m.data() for m in taken]
            assert got == [f"b{i}".encode() for i in range(10)]
            with pytest.raises(ReceiveTimeoutError):
                await reader.read_available(4, timeout_millis=100)
    with magnetar.Client(target.service_url) as sync_client:
        sync_reader = sync_client.create_reader(topic, "earliest")
        assert sync_reader.read_available(1, timeout_millis=10_000)[0].data() == b"b0"
        sync_reader.close()
