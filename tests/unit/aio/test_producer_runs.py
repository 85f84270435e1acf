"""The producer's run API (``try_add_run`` / ``add_run_when_room`` and a :class:`RunSink`): how
the sync client hands a run of ``send_async`` calls to the loop, each message told its outcome.

Runs against the in-process fake broker (``fake_broker.py``), and checks what a consumer then
receives against what each run's sink heard.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

import magnetar
from magnetar.aio import Client, Message, MessageId, Producer
from magnetar.aio.send_options import NO_OPTIONS, send_options
from magnetar.common.errors import (
    MagnetarError,
    ProducerClosedError,
    ProducerQueueFullError,
)
from tests.unit.aio.fake_broker import FakeCluster

WAIT_S = 10.0


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    fake = await FakeCluster().start(brokers=1)
    yield fake
    await fake.stop()


@pytest.fixture
async def client(cluster: FakeCluster) -> AsyncIterator[Client]:
    async with Client(
        cluster.service_url,
        operation_timeout_s=10,
        initial_backoff_ms=10,
        max_backoff_ms=100,
        connection_timeout_ms=2000,
    ) as c:
        yield c


Where = tuple[int, int, int, int, int]


class RecordingSink:
    """A :class:`~magnetar.aio.producer.RunSink` that writes down what it hears."""

    def __init__(self) -> None:
        self.confirmations: list[tuple[int, int, Where]] = []
        self.failures: list[tuple[int, int, MagnetarError]] = []

    def confirmed(self, offset: int, count: int, where: Where) -> None:
        self.confirmations.append((offset, count, where))

    def failed(self, offset: int, count: int, error: MagnetarError) -> None:
        self.failures.append((offset, count, error))

    def heard_nothing(self) -> bool:
        return not self.confirmations and not self.failures

    def message_ids(self, count: int) -> list[MessageId]:
        """Each message's id, built from the confirmations; each message heard exactly once."""
        ids: dict[int, MessageId] = {}
        for offset, size, where in self.confirmations:
            ledger_id, entry_id, first_index, batch_size, partition = where
            for k in range(size):
                assert offset + k not in ids, f"message {offset + k} confirmed twice"
                ids[offset + k] = MessageId(
                    ledger_id, entry_id, first_index + k, partition, batch_size
                )
        assert sorted(ids) == list(range(count)), "some messages were never confirmed"
        return [ids[offset] for offset in range(count)]

    def failed_offsets(self) -> list[int]:
        return sorted(o + k for o, size, _ in self.failures for k in range(size))


async def receive_all(client: Client, topic: str, count: int) -> list[Message]:
    consumer = await client.subscribe(topic, "check", initial_position="earliest")
    try:
        return [await consumer.receive(timeout_millis=5000) for _ in range(count)]
    finally:
        await consumer.close()


def stored_messages(cluster: FakeCluster, topic: str) -> int:
    return sum(entry.num_messages for entry in cluster.partition(topic).entries)


async def test_a_run_over_several_batches_tells_each_message_its_id_once(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("runs")
    producer = await client.create_producer(
        "runs", batching_max_messages=4, batching_max_publish_delay_ms=10_000
    )
    single = producer.send_async(b"single")  # the run starts in a batch already open
    contents = [f"m{i}".encode() for i in range(10)]
    sink = RecordingSink()
    assert producer.try_add_run(contents, NO_OPTIONS, sink) is True
    await producer.flush()
    assert sink.failures == []
    # offsets count in the run, indexes in the batch: the first part fills the open batch
    heard = [(offset, count, where[2], where[3]) for offset, count, where in sink.confirmations]
    assert heard == [(0, 3, 1, 4), (3, 4, 0, 4), (7, 3, 0, 3)]
    ids = sink.message_ids(len(contents))
    assert {message_id.partition for message_id in ids} == {-1}
    assert ids == sorted(ids)
    assert len({message_id.entry for message_id in ids}) == 3
    assert (await single) < ids[0]
    assert producer.pending_messages() == 0
    received = await receive_all(client, "runs", 11)
    assert [m.data() for m in received[1:]] == contents
    assert [m.message_id() for m in received[1:]] == ids
    assert [m.message_id().batch_size for m in received[1:]] == [i.batch_size for i in ids]


async def test_a_keyed_run_goes_to_one_partition_and_its_sink_hears_which(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("keyed", partitions=3)
    producer = await client.create_producer("keyed", batching_max_messages=4)
    options = send_options({"partition_key": "k", "properties": {"p": "1"}})
    contents = [f"k{i}".encode() for i in range(6)]
    sink = RecordingSink()
    assert producer.try_add_run(contents, options, sink)
    await producer.flush()
    ids = sink.message_ids(len(contents))
    partitions = {message_id.partition for message_id in ids}
    assert len(partitions) == 1
    assert partitions <= {0, 1, 2}
    received = await receive_all(client, "keyed", 6)
    assert [m.data() for m in received] == contents
    assert [m.message_id() for m in received] == ids
    assert {(m.partition_key(), m.properties()["p"]) for m in received} == {("k", "1")}


async def test_a_run_without_room_is_refused_and_nothing_of_it_happens(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("full")
    producer = await client.create_producer(
        "full", max_pending_messages=5, batching_max_publish_delay_ms=10_000
    )
    held = [producer.send_async(f"h{i}".encode()) for i in range(4)]
    refused = RecordingSink()
    assert producer.try_add_run([b"a", b"b"], NO_OPTIONS, refused) is False
    assert refused.heard_nothing()
    assert producer.pending_messages() == 4
    fits = RecordingSink()
    assert producer.try_add_run([b"c"], NO_OPTIONS, fits) is True  # room for one is room
    assert producer.pending_messages() == 5
    await producer.flush()
    await asyncio.gather(*held)
    assert refused.heard_nothing()
    assert len(fits.message_ids(1)) == 1
    assert stored_messages(cluster, "full") == 5
    # the refused run is whole and can be handed over again once there is room
    assert producer.try_add_run([b"a", b"b"], NO_OPTIONS, refused) is True
    await producer.flush()
    assert len(refused.message_ids(2)) == 2
    received = await receive_all(client, "full", 7)
    assert [m.data() for m in received] == [b"h0", b"h1", b"h2", b"h3", b"c", b"a", b"b"]


async def test_a_run_that_can_never_fit_or_may_not_wait_fails_at_once(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("never")
    blocking = await client.create_producer(
        "never", max_pending_messages=5, batching_max_publish_delay_ms=10_000
    )
    too_long = RecordingSink()
    assert blocking.try_add_run([b"x"] * 6, NO_OPTIONS, too_long) is True
    assert [(o, n, type(e)) for o, n, e in too_long.failures] == [(0, 6, ProducerQueueFullError)]
    assert too_long.confirmations == []
    assert blocking.pending_messages() == 0

    not_blocking = await client.create_producer(
        "never",
        max_pending_messages=5,
        block_if_queue_full=False,
        batching_max_publish_delay_ms=10_000,
    )
    held = [not_blocking.send_async(b"h") for _ in range(5)]
    overflow = RecordingSink()
    assert not_blocking.try_add_run([b"y", b"z"], NO_OPTIONS, overflow) is True
    assert [(o, n, type(e)) for o, n, e in overflow.failures] == [(0, 2, ProducerQueueFullError)]
    assert not_blocking.pending_messages() == 5
    await not_blocking.flush()
    await asyncio.gather(*held)
    assert overflow.confirmations == []
    assert stored_messages(cluster, "never") == 5


async def test_a_run_handed_over_when_room_waits_for_it_then_goes_in_order(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("later")
    producer = await client.create_producer(
        "later", max_pending_messages=5, batching_max_publish_delay_ms=10_000
    )
    held = [producer.send_async(f"h{i}".encode()) for i in range(4)]
    sink = RecordingSink()
    adding = asyncio.create_task(producer.add_run_when_room([b"a", b"b"], NO_OPTIONS, sink))
    await asyncio.sleep(0)
    assert not adding.done()  # two do not fit next to four
    assert sink.heard_nothing()
    assert producer.pending_messages() == 4
    await producer.flush()  # the four are confirmed: room
    await asyncio.wait_for(adding, WAIT_S)
    await producer.flush()
    await asyncio.gather(*held)
    ids = sink.message_ids(2)
    received = await receive_all(client, "later", 6)
    assert [m.data() for m in received] == [b"h0", b"h1", b"h2", b"h3", b"a", b"b"]
    assert [m.message_id() for m in received[4:]] == ids


async def test_a_run_given_to_a_closed_producer_fails_every_message_once(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("closed")
    producer = await client.create_producer("closed")
    await producer.close()
    now = RecordingSink()
    assert producer.try_add_run([b"a", b"b", b"c"], NO_OPTIONS, now) is True
    when_room = RecordingSink()
    await producer.add_run_when_room([b"d", b"e"], NO_OPTIONS, when_room)
    for sink, count in ((now, 3), (when_room, 2)):
        assert sink.confirmations == []
        assert [(o, n, type(e)) for o, n, e in sink.failures] == [(0, count, ProducerClosedError)]
    assert producer.pending_messages() == 0


async def test_a_run_in_flight_when_the_producer_closes_fails_every_message_once(
    cluster: FakeCluster,
) -> None:
    cluster.create_topic("cut")
    # close() waits operation_timeout_s for receipts when sends never time out: keep it short
    async with Client(cluster.service_url, operation_timeout_s=2) as client:
        producer = await client.create_producer(
            "cut", batching_max_messages=4, send_timeout_ms=0, batching_max_publish_delay_ms=0
        )
        cluster.drop_receipts = True  # stored, never confirmed
        single = producer.send_async(b"single")
        sink = RecordingSink()
        assert producer.try_add_run([f"m{i}".encode() for i in range(10)], NO_OPTIONS, sink)
        await producer.close()
    assert sink.confirmations == []
    assert sink.failed_offsets() == list(range(10))
    assert {type(error) for _, _, error in sink.failures} == {ProducerClosedError}
    with pytest.raises(ProducerClosedError):
        await single
    assert producer.pending_messages() == 0


async def test_a_sink_that_raises_is_logged_and_the_runs_other_batches_are_still_told(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("clumsy")
    producer: Producer = await client.create_producer(
        "clumsy", batching_max_messages=4, batching_max_publish_delay_ms=10_000
    )

    class Clumsy(RecordingSink):
        def confirmed(self, offset: int, count: int, where: Where) -> None:
            super().confirmed(offset, count, where)
            if offset == 0:
                raise ValueError("application bug")

    sink = Clumsy()
    # structlog's capture, whatever an earlier test in this process configured logging to
    with capture_logs() as logs:
        assert producer.try_add_run([b"x"] * 10, NO_OPTIONS, sink)
        await producer.flush()
        assert len(sink.message_ids(10)) == 10
        assert producer.pending_messages() == 0
        after = producer.send_async(b"after")  # the producer goes on
        await producer.flush()
        assert (await after).entry_id >= 0
    failures = [e for e in logs if e["event"] == "send_callback_failed"]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "error"


async def test_a_properties_dict_reused_between_sync_sends_does_not_change_earlier_messages(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("reused")
    holding, release = threading.Event(), threading.Event()

    def hold_the_loop(_error: object, _message_id: object) -> None:
        holding.set()
        release.wait(WAIT_S)  # the client's thread is busy: the sends below wait for it

    def produce() -> None:
        with magnetar.Client(cluster.service_url, operation_timeout_s=10) as sync_client:
            producer = sync_client.create_producer("reused")
            producer.send_async(b"hold", hold_the_loop)
            assert holding.wait(WAIT_S)
            properties: dict[str, str] = {}
            sent = []
            for i in range(5):
                properties["seq"] = str(i)
                sent.append(producer.send_async(b"x", properties=properties))
            release.set()
            for future in sent:
                future.result(WAIT_S)

    await asyncio.to_thread(produce)
    received = await receive_all(client, "reused", 6)
    assert [m.properties().get("seq") for m in received[1:]] == ["0", "1", "2", "3", "4"]
