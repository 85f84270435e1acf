"""The calls users write one message at a time, in both APIs, against a real ``magnetar
standalone`` process: ``send_async`` in a loop, ``send``, ``receive`` + ``acknowledge``,
listeners; their ordering, their grouped acknowledgements, and what they do with bad input.

The sync client hands sends to its loop in runs, receives from a queue the calling thread reads,
and groups acknowledgements without waiting for the broker; these tests pin the behaviour that
must not change with that: order per producer and per key, every future and callback completes
once, bounded memory, and at-least-once delivery when a consumer dies before its acks were
flushed. Consumers that must die run in their own process (``ack_worker.py``), killed with
SIGKILL.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

import magnetar
import magnetar.aio
from magnetar.common.errors import (
    ClientClosedError,
    ConsumerClosedError,
    InvalidArgumentError,
    ProducerClosedError,
    ProducerQueueFullError,
    ReceiveTimeoutError,
)
from magnetar.testing import StandaloneNode
from magnetar.testing.eventually import eventually, eventually_sync

pytestmark = [pytest.mark.timeout(180)]

WORKER = Path(__file__).with_name("ack_worker.py")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    async with StandaloneNode(tmp_path_factory.mktemp("per-message") / "data") as node:
        yield node.service_url


@pytest.fixture
def client(service_url: str) -> Iterator[magnetar.Client]:
    with magnetar.Client(service_url, operation_timeout_s=30) as c:
        yield c


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def read_all(client: magnetar.Client, topic: str, count: int) -> list[magnetar.Message]:
    with client.create_reader(topic, "earliest") as reader:
        return [reader.read_next(timeout_millis=15_000) for _ in range(count)]


# --- sync producer -------------------------------------------------------------------------------


def test_a_send_async_loop_completes_every_future_and_callback_once_in_send_order(
    client: magnetar.Client,
):
    topic = unique("loop")
    heard: list[tuple[object, magnetar.MessageId | None]] = []
    threads: set[int] = set()

    def callback(error: object, message_id: magnetar.MessageId | None) -> None:
        heard.append((error, message_id))
        threads.add(threading.get_ident())

    with client.create_producer(topic, max_pending_messages=500) as producer:
        futures = [producer.send_async(b"%d" % i, callback) for i in range(5_000)]
        assert producer.pending_messages() <= 500  # bounded: the loop waited for room
        producer.flush()
        assert producer.pending_messages() == 0
    ids = [f.result(timeout=10) for f in futures]
    assert all(f.done() and f.exception() is None for f in futures)
    assert len(heard) == 5_000
    assert all(error is None for error, _ in heard)
    assert [mid for _, mid in heard] == ids  # callbacks in send order, with the futures' ids
    assert ids == sorted(ids)  # one partition: ids grow in send order
    assert threading.get_ident() not in threads  # callbacks run on the client's thread
    assert [int(m.data()) for m in read_all(client, topic, 5_000)] == list(range(5_000))


def test_messages_keep_their_own_options_and_order_when_options_change_between_calls(
    client: magnetar.Client,
):
    topic = unique("options")
    with client.create_producer(topic) as producer:
        for i in range(300):
            if i % 3 == 0:
                producer.send_async(b"%d" % i)
            elif i % 3 == 1:
                producer.send_async(b"%d" % i, properties={"i": str(i)}, event_timestamp=i + 1)
            else:
                producer.send_async(b"%d" % i, partition_key=f"k{i % 5}")
        producer.flush()
    messages = read_all(client, topic, 300)
    assert [int(m.data()) for m in messages] == list(range(300))
    for i, m in enumerate(messages):
        assert m.properties() == ({"i": str(i)} if i % 3 == 1 else {})
        assert m.event_timestamp() == (i + 1 if i % 3 == 1 else 0)
        assert m.partition_key() == (f"k{i % 5}" if i % 3 == 2 else None)


def test_keyed_send_async_keeps_order_per_key_over_partitions(client: magnetar.Client):
    topic = unique("keys")
    with client.admin() as admin:
        admin.create_topic(topic, 3)
    with client.create_producer(topic) as producer:
        for i in range(600):
            producer.send_async(b"%d" % i, partition_key=f"user-{i % 7}")
        producer.flush()
    with client.subscribe(topic, "s", initial_position="earliest") as consumer:
        got = [consumer.receive(timeout_millis=15_000) for _ in range(600)]
        for m in got:
            consumer.acknowledge(m)
    by_key: dict[str | None, list[int]] = defaultdict(list)
    partitions: dict[str | None, set[str]] = defaultdict(set)
    for m in got:
        by_key[m.partition_key()].append(int(m.data()))
        partitions[m.partition_key()].add(m.topic_name())
    assert len(by_key) == 7
    for key, values in by_key.items():
        assert values == sorted(values), key
        assert len(partitions[key]) == 1


def test_send_from_several_threads_keeps_each_threads_order(client: magnetar.Client):
    topic = unique("threads")
    with client.create_producer(topic, max_pending_messages=100) as producer:

        def send(name: str) -> None:
            for i in range(500):
                producer.send_async(f"{name}:{i}".encode())

        workers = [threading.Thread(target=send, args=(f"t{n}",)) for n in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        producer.send(b"last")  # send waits for its own receipt
    got = [m.data().decode() for m in read_all(client, topic, 2_001)]
    per_thread: dict[str, list[int]] = defaultdict(list)
    for value in got[:-1]:
        name, i = value.split(":")
        per_thread[name].append(int(i))
    assert got[-1] == "last"
    assert dict(per_thread.items()) == {f"t{n}": list(range(500)) for n in range(4)}


def test_send_returns_the_id_and_send_many_a_receipt(client: magnetar.Client):
    topic = unique("send")
    with client.create_producer(topic) as producer:
        first = producer.send(b"one", partition_key="k")
        receipt = producer.send_many([b"two", b"three"], properties={"run": "1"})
        again = producer.send_many_async([b"four"]).result(timeout=30)
    ids = [first, *receipt.message_ids(), again.first_message_id()]
    assert ids == sorted(ids)
    messages = read_all(client, topic, 4)
    assert [m.message_id() for m in messages] == ids
    assert [m.properties() for m in messages] == [{}, {"run": "1"}, {"run": "1"}, {}]


def test_a_callback_that_raises_harms_no_other_message(client: magnetar.Client):
    topic = unique("raises")
    heard: list[int] = []

    def callback(error: object, message_id: object) -> None:
        heard.append(1)
        if len(heard) % 2:
            raise RuntimeError("application bug")

    with client.create_producer(topic) as producer:
        futures = [producer.send_async(b"%d" % i, callback) for i in range(100)]
        producer.flush()
        assert producer.send(b"after") is not None
    assert len(heard) == 100
    assert all(f.exception(timeout=10) is None for f in futures)
    assert len(read_all(client, topic, 101)) == 101


def test_a_blocking_call_from_a_callback_is_refused_not_deadlocked(client: magnetar.Client):
    topic = unique("reentrant")
    errors: list[BaseException] = []
    with client.create_producer(topic) as producer:

        def callback(error: object, message_id: object) -> None:
            try:
                producer.send(b"from the callback")
            except RuntimeError as e:
                errors.append(e)

        producer.send_async(b"first", callback).result(timeout=30)
    assert len(errors) == 1
    assert "client's own thread" in str(errors[0])


def test_a_full_queue_fails_at_once_without_blocking_and_waits_with_it(
    client: magnetar.Client,
):
    topic = unique("full")
    failed: list[object] = []
    with client.create_producer(
        topic,
        max_pending_messages=3,
        block_if_queue_full=False,
        batching_max_publish_delay_ms=200,
        batching_self_clocking=False,  # the first three stay pending for the delay
    ) as producer:
        futures = [producer.send_async(b"%d" % i, lambda e, m: failed.append(e)) for i in range(5)]
        assert [type(f.exception(timeout=10)) for f in futures[3:]] == [ProducerQueueFullError] * 2
        assert all(f.exception(timeout=30) is None for f in futures[:3])
    assert [type(e) for e in failed if e is not None] == [ProducerQueueFullError] * 2
    with client.create_producer(topic, max_pending_messages=3) as blocking:
        for i in range(50):
            blocking.send_async(b"%d" % i)
            assert blocking.pending_messages() <= 3
        blocking.flush()


def test_bad_send_arguments_are_refused_by_name(client: magnetar.Client):
    with client.create_producer(unique("bad")) as producer:
        with pytest.raises(InvalidArgumentError, match="must be bytes"):
            producer.send_async("text")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="partition_key"):
            producer.send_async(b"x", partition_key=7)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="unknown send argument"):
            producer.send_async(b"x", key="k")  # type: ignore[call-arg]
        with pytest.raises(InvalidArgumentError, match="not both"):
            producer.send(b"x", deliver_after_ms=10, deliver_at_ms=10)
        with pytest.raises(InvalidArgumentError, match="sequence of messages"):
            producer.send_many(b"not a list")  # type: ignore[arg-type]
        assert producer.send(b"still fine") is not None


def test_a_closed_producer_and_client_say_so(service_url: str):
    client = magnetar.Client(service_url)
    producer = client.create_producer(unique("closed"))
    consumer = client.subscribe(unique("closed"), "s")
    reader = client.create_reader(unique("closed"), "earliest")
    producer.close()
    heard: list[object] = []
    future = producer.send_async(b"late", lambda e, m: heard.append(e))
    assert isinstance(future.exception(timeout=5), ProducerClosedError)
    assert isinstance(heard[0], ProducerClosedError)
    with pytest.raises(ProducerClosedError):
        producer.send(b"late")
    client.close()
    with pytest.raises(ConsumerClosedError):
        consumer.receive(timeout_millis=100)
    with pytest.raises(ConsumerClosedError):
        reader.read_next(timeout_millis=100)
    with pytest.raises(ClientClosedError):
        client.create_producer("x")
    with pytest.raises(ClientClosedError):
        client.subscribe("x", "s")
    consumer.close()  # idempotent, even after the client
    producer.close()


# --- sync consumer -------------------------------------------------------------------------------


def test_receive_and_acknowledge_loop_consumes_everything_once(client: magnetar.Client):
    topic = unique("drain")
    with client.create_producer(topic) as producer:
        for start in range(0, 3_000, 1_000):
            producer.send_many([b"%d" % i for i in range(start, start + 1_000)])
    consumer = client.subscribe(topic, "s", initial_position="earliest", receiver_queue_size=200)
    values = []
    for _ in range(3_000):
        message = consumer.receive(timeout_millis=15_000)
        values.append(int(message.data()))
        consumer.acknowledge(message)
    assert values == list(range(3_000))
    with pytest.raises(ReceiveTimeoutError):
        consumer.receive(timeout_millis=200)
    consumer.close()  # flushes the grouped acks
    with client.subscribe(topic, "s") as again, pytest.raises(ReceiveTimeoutError):
        again.receive(timeout_millis=500)


def test_cumulative_and_negative_acknowledgements_are_grouped_too(client: magnetar.Client):
    topic = unique("cumulative")
    with client.create_producer(topic) as producer:
        producer.send_many([b"%d" % i for i in range(20)])
    with client.subscribe(
        topic, "s", initial_position="earliest", negative_ack_redelivery_delay_ms=100
    ) as consumer:
        got = [consumer.receive(timeout_millis=10_000) for _ in range(20)]
        consumer.acknowledge_cumulative(got[9])
        consumer.negative_acknowledge(got[15])
        redelivered = consumer.receive(timeout_millis=10_000)
        assert int(redelivered.data()) >= 10  # the first ten were acknowledged
        for message in got[10:]:
            consumer.acknowledge(message)
        consumer.acknowledge(redelivered)
        with pytest.raises(InvalidArgumentError, match="names no stored message"):
            consumer.acknowledge(magnetar.MessageId.earliest)
    shared = client.subscribe(topic, "shared", "shared")
    with pytest.raises(InvalidArgumentError, match="cumulative"):
        shared.acknowledge_cumulative(got[0])
    shared.close()


def test_receive_from_two_threads_gives_each_message_to_one_of_them(client: magnetar.Client):
    topic = unique("two-threads")
    with client.create_producer(topic) as producer:
        producer.send_many([b"%d" % i for i in range(2_000)])
    consumer = client.subscribe(topic, "s", initial_position="earliest", receiver_queue_size=100)
    taken: dict[str, list[int]] = {"a": [], "b": []}

    def take(name: str) -> None:
        while True:
            try:
                message = consumer.receive(timeout_millis=1_000)
            except ReceiveTimeoutError:
                return
            taken[name].append(int(message.data()))
            consumer.acknowledge(message)

    workers = [threading.Thread(target=take, args=(name,)) for name in taken]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    consumer.close()
    assert sorted(taken["a"] + taken["b"]) == list(range(2_000))
    assert taken["a"] == sorted(taken["a"])
    assert taken["b"] == sorted(taken["b"])


def test_a_consumer_that_does_not_acknowledge_holds_at_most_its_queue(client: magnetar.Client):
    """Permits count messages, and the broker sends whole entries: the queue holds at most its
    size plus the rest of the last entry (10 messages a batch here)."""
    topic = unique("bounded")
    with client.create_producer(topic, batching_max_messages=10) as producer:
        producer.send_many([b"x"] * 1_000)
    with client.subscribe(
        topic, "s", initial_position="earliest", receiver_queue_size=50
    ) as consumer:
        eventually_sync(lambda: len(consumer._queue) >= 50, timeout_s=10, interval_s=0.05)
        time.sleep(0.5)  # more would have arrived by now if the broker had permits
        assert 50 <= len(consumer._queue) < 50 + 10


def _run_ack_worker(service_url: str, topic: str, subscription: str, mode: str) -> list[str]:
    acked: list[str] = []
    with subprocess.Popen(
        [sys.executable, str(WORKER), service_url, topic, subscription, "50", mode],
        stdout=subprocess.PIPE,
        text=True,
    ) as worker:
        try:
            assert worker.stdout is not None
            for line in worker.stdout:
                if line.startswith("ACKED "):
                    acked.append(line.split()[1])
                elif line.strip() == "HOLDING":
                    break
        finally:
            worker.kill()  # SIGKILL: nothing more is flushed
    return acked


@pytest.mark.parametrize("mode", ["grouped", "receipts"])
def test_a_consumer_killed_after_acknowledging_loses_nothing(
    client: magnetar.Client, service_url: str, mode: str
):
    """Grouped acks that never left the process come again; acks that waited for the broker's
    receipt never do. Either way every message is acknowledged durably or delivered again."""
    topic = unique(f"crash-{mode}")
    with client.create_producer(topic) as producer:
        for i in range(50):
            producer.send_async(b"%d" % i)  # one entry each: acks are per entry
            producer.flush()
    acked = _run_ack_worker(service_url, topic, "s", mode)
    assert acked == [str(i) for i in range(50)]
    again = []
    with client.subscribe(topic, "s") as consumer:
        while True:
            try:
                message = consumer.receive(timeout_millis=2_000)
            except ReceiveTimeoutError:
                break
            again.append(message.data().decode())
            consumer.acknowledge(message)
    if mode == "grouped":
        assert again == acked  # none of the grouped acks reached the broker: all come again
    else:
        assert again == []  # every acknowledgement was persisted before it returned


# --- listeners ----------------------------------------------------------------------------------


def test_message_listener_gets_every_message_in_order_and_a_raising_one_goes_on(
    client: magnetar.Client,
):
    topic = unique("listener")
    seen: list[int] = []
    threads: set[str] = set()
    finished = threading.Event()

    def listener(consumer: magnetar.Consumer, message: magnetar.Message) -> None:
        value = int(message.data())
        seen.append(value)
        threads.add(threading.current_thread().name)
        if value % 10 == 3:
            raise ValueError("a listener bug")  # logged; delivery goes on
        consumer.acknowledge(message)
        if len(seen) == 200:
            finished.set()

    consumer = client.subscribe(topic, "s", initial_position="earliest", message_listener=listener)
    with pytest.raises(InvalidArgumentError, match="listener"):
        consumer.receive(timeout_millis=100)
    with client.create_producer(topic) as producer:
        for i in range(200):
            producer.send_async(b"%d" % i)
    assert finished.wait(30)
    assert seen == list(range(200))
    assert len(threads) == 1
    assert threading.current_thread().name not in threads
    consumer.close()
    # the messages whose listener raised were never acknowledged: they come again
    with client.subscribe(topic, "s") as again:
        back = sorted(int(again.receive(timeout_millis=10_000).data()) for _ in range(20))
    assert back == [i for i in range(200) if i % 10 == 3]


def test_a_blocked_listener_holds_up_only_its_own_consumer(client: magnetar.Client):
    topic = unique("blocked")
    release = threading.Event()
    stuck_on: list[int] = []
    other: list[int] = []
    other_done = threading.Event()

    def stuck(consumer: magnetar.Consumer, message: magnetar.Message) -> None:
        stuck_on.append(int(message.data()))
        release.wait(60)
        consumer.acknowledge(message)

    def fine(consumer: magnetar.Consumer, message: magnetar.Message) -> None:
        other.append(int(message.data()))
        consumer.acknowledge(message)
        if len(other) == 50:
            other_done.set()

    blocked = client.subscribe(topic, "a", initial_position="earliest", message_listener=stuck)
    free = client.subscribe(topic, "b", initial_position="earliest", message_listener=fine)
    with client.create_producer(topic) as producer:
        producer.send_many([b"%d" % i for i in range(50)])
    assert other_done.wait(30)
    assert other == list(range(50))
    assert stuck_on == [0]  # still on its first message
    release.set()
    blocked.close()  # the listener finishes its message; the rest stay for later
    free.close()


def test_reader_listener_reads_in_order(client: magnetar.Client):
    topic = unique("reader-listener")
    with client.create_producer(topic) as producer:
        producer.send_many([b"%d" % i for i in range(100)])
    seen: list[int] = []
    done = threading.Event()

    def listener(reader: magnetar.Reader, message: magnetar.Message) -> None:
        seen.append(int(message.data()))
        if len(seen) == 100:
            done.set()

    reader = client.create_reader(topic, "earliest", reader_listener=listener)
    assert done.wait(30)
    assert seen == list(range(100))
    with pytest.raises(InvalidArgumentError, match="listener"):
        reader.read_next(timeout_millis=100)
    reader.close()


# --- asyncio -------------------------------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="module")
async def test_asyncio_per_message_calls_and_listeners(service_url: str):
    topic = unique("aio")
    async with magnetar.aio.Client(service_url) as client:
        heard: list[magnetar.MessageId | None] = []
        async with await client.create_producer(topic, max_pending_messages=200) as producer:
            futures = []
            for i in range(2_000):
                if not producer.has_room():
                    await producer.send(b"%d" % i)  # waits for room
                    continue
                futures.append(producer.send_async(b"%d" % i, lambda e, m: heard.append(m)))
            await producer.flush()
            ids = await asyncio.gather(*futures)
        assert heard == list(ids)

        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        values = []
        for _ in range(2_000):
            message = await consumer.receive(timeout_millis=15_000)
            values.append(int(message.data()))
            await consumer.acknowledge(message)
        assert values == list(range(2_000))
        await consumer.close()

        seen: list[int] = []
        done = asyncio.Event()

        async def listener(consumer: magnetar.aio.Consumer, message: magnetar.Message) -> None:
            await asyncio.sleep(0)  # a coroutine listener is awaited before the next message
            seen.append(int(message.data()))
            if int(message.data()) == 5:
                raise ValueError("a listener bug")
            await consumer.acknowledge(message)
            if len(seen) == 2_000:
                done.set()

        listening = await client.subscribe(
            topic, "l", initial_position="earliest", message_listener=listener
        )
        await asyncio.wait_for(done.wait(), 30)
        assert seen == list(range(2_000))
        with pytest.raises(InvalidArgumentError, match="listener"):
            await listening.receive(timeout_millis=100)
        await listening.close()

        read: list[int] = []

        def reader_listener(reader: magnetar.aio.Reader, message: magnetar.Message) -> None:
            read.append(int(message.data()))

        reader = await client.create_reader(topic, "earliest", reader_listener=reader_listener)
        await eventually(lambda: len(read) >= 2_000, timeout_s=30, interval_s=0.05)
        assert read == list(range(2_000))
        await reader.close()
