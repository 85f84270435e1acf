"""The client's side of subscriptions against a broker the test drives: partial acks, ack
timeouts, dead letters, failover activity, bad ack ids; and what producers put on the wire for
key_shared routing and delayed delivery.

Producers talk to the in-process fake broker (``fake_broker.py``), with every batch recorded as
it arrived. Consumer streams are scripted instead: the test pushes deliveries and activity
changes, and reads back every request the consumer sent, so that it can check exactly what the
broker was told (which entry was acked whole or in part, redelivered, dead-lettered).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest

import magnetar
from magnetar.aio import Client, Consumer, Message, MessageId, ReceiveTimeoutError
from magnetar.aio.codec import decode_entry
from magnetar.aio.message import received_monotonic, stream_opened_monotonic
from magnetar.common.errors import (
    InvalidArgumentError,
    MagnetarError,
    MessageTooLargeError,
    ServiceNotReadyError,
)
from magnetar.common.grpc_errors import error_to_detail
from magnetar.common.keys import KEYLESS_HASH, key_hash
from magnetar.testing.eventually import eventually
from proto.broker.v1 import broker_pb2 as pb
from proto.broker.v1 import broker_pb2_grpc
from proto.common.v1 import types_pb2
from proto.format.v1 import entry_pb2
from tests.unit.aio.fake_broker import FakeBroker, FakeCluster

Entry = tuple[int, int]


# --- a broker the test drives ----------------------------------------------------------------


@dataclass
class ConsumerStream:
    """One consumer stream: what the client asked, and a way to answer it."""

    subscribe: pb.Subscribe
    requests: list[pb.ConsumeRequest] = field(default_factory=list)
    outgoing: asyncio.Queue[pb.ConsumeResponse | None] = field(default_factory=asyncio.Queue)
    ended: bool = False

    def deliver(self, *deliveries: pb.Delivery) -> None:
        self.outgoing.put_nowait(
            pb.ConsumeResponse(deliveries=pb.Deliveries(deliveries=deliveries))
        )

    def set_active(self, active: bool) -> None:
        self.outgoing.put_nowait(
            pb.ConsumeResponse(active_change=pb.ActiveConsumerChange(is_active=active))
        )

    def close(self, reason: MagnetarError) -> None:
        """End the stream as a broker does when the partition moves."""
        self.outgoing.put_nowait(
            pb.ConsumeResponse(closed=pb.ConsumerClosed(reason=error_to_detail(reason)))
        )

    def of_kind(self, kind: str) -> list[Any]:
        return [getattr(r, kind) for r in self.requests if r.WhichOneof("kind") == kind]

    @property
    def acks(self) -> list[pb.Ack]:
        return self.of_kind("ack")

    def acked_whole(self) -> list[Entry]:
        return [(m.ledger_id, m.entry_id) for a in self.acks for m in a.message_ids]

    def acked_in_part(self) -> list[tuple[Entry, list[int], int]]:
        return [
            ((p.message_id.ledger_id, p.message_id.entry_id), list(p.batch_indexes), p.batch_size)
            for a in self.acks
            for p in a.partial
        ]

    def acked_entries(self) -> set[Entry]:
        return {*self.acked_whole(), *(entry for entry, _, _ in self.acked_in_part())}

    def nacked(self) -> list[Entry]:
        return [(m.ledger_id, m.entry_id) for n in self.of_kind("nack") for m in n.message_ids]

    def redelivery_requests(self) -> list[list[Entry]]:
        return [
            [(m.ledger_id, m.entry_id) for m in r.message_ids] for r in self.of_kind("redeliver")
        ]

    def permits(self) -> int:
        return sum(f.permits for f in self.of_kind("flow"))


class ScriptedCluster(FakeCluster):
    """The fake cluster, with consumer streams left to the test and produced batches recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.consumer_streams: list[ConsumerStream] = []
        self.batches: list[tuple[str, pb.ProduceBatch]] = []
        """(partition topic, batch) of every batch received, in arrival order."""
        self.receipts_open = asyncio.Event()
        self.receipts_open.set()
        """Cleared: produce receipts wait until it is set again."""
        self.failing_acks: dict[Entry, MagnetarError] = {}
        """Acks (with a request id) naming these entries are answered with the error."""

    async def start(self, brokers: int = 1) -> ScriptedCluster:
        for index in range(brokers):
            server = grpc.aio.server()
            broker_pb2_grpc.add_BrokerServiceServicer_to_server(ScriptedBroker(self, index), server)
            self.ports.append(server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            self.servers.append(server)
        return self

    def batches_of(self, topic: str) -> list[pb.ProduceBatch]:
        return [b for t, b in self.batches if t == f"public/default/{topic}"]

    async def stream(
        self, partition_topic: str, *, after: ConsumerStream | None = None
    ) -> ConsumerStream:
        """The open consumer stream of a partition (a newer one than ``after``)."""
        full = f"public/default/{partition_topic}"

        def found() -> ConsumerStream | None:
            for stream in reversed(self.consumer_streams):
                if stream.subscribe.topic == full and not stream.ended and stream is not after:
                    return stream
            return None

        await eventually(
            lambda: found() is not None, what=f"a consumer stream on {full}", interval_s=0.005
        )
        stream = found()
        assert stream is not None
        return stream


class ScriptedBroker(FakeBroker):
    cluster: ScriptedCluster

    async def Produce(  # noqa: N802 - the protocol's method name
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[pb.ProduceResponse]:
        cluster = self.cluster

        async def recorded() -> AsyncIterator[pb.ProduceRequest]:
            topic = ""
            async for request in request_iterator:
                kind = request.WhichOneof("kind")
                if kind == "open":
                    topic = request.open.topic
                elif kind == "send":
                    cluster.batches.extend((topic, b) for b in request.send.batches)
                yield request

        async for response in super().Produce(recorded(), context):
            if response.WhichOneof("kind") == "receipts":
                await cluster.receipts_open.wait()
            yield response

    async def Consume(  # noqa: N802 - the protocol's method name
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[pb.ConsumeResponse]:
        first = await anext(aiter(request_iterator))
        try:
            p = self._partition(first.subscribe.topic)
        except MagnetarError as e:
            yield pb.ConsumeResponse(closed=pb.ConsumerClosed(reason=error_to_detail(e)))
            return
        stream = ConsumerStream(first.subscribe)
        self.cluster.consumer_streams.append(stream)
        pump = asyncio.create_task(self._read(request_iterator, stream))
        try:
            yield pb.ConsumeResponse(
                subscribed=pb.Subscribed(topic=p.name, subscription=first.subscribe.subscription)
            )
            while True:
                response = await stream.outgoing.get()
                if response is None:
                    return
                yield response
                if response.WhichOneof("kind") == "closed":
                    return
        finally:
            stream.ended = True
            pump.cancel()

    async def _read(self, requests: Any, stream: ConsumerStream) -> None:
        try:
            async for request in requests:
                stream.requests.append(request)
                if request.WhichOneof("kind") == "ack" and request.ack.request_id:
                    stream.outgoing.put_nowait(self._answer(request.ack))
        finally:
            stream.outgoing.put_nowait(None)

    def _answer(self, ack: pb.Ack) -> pb.ConsumeResponse:
        named = [*ack.message_ids, *(p.message_id for p in ack.partial)]
        for m in named:
            error = self.cluster.failing_acks.get((m.ledger_id, m.entry_id))
            if error is not None:
                return pb.ConsumeResponse(
                    error=pb.ConsumeError(request_id=ack.request_id, error=error_to_detail(error))
                )
        return pb.ConsumeResponse(ack_receipt=pb.AckReceipt(request_id=ack.request_id))


def delivery(
    entry: Entry,
    values: Sequence[bytes],
    *,
    partition: int = -1,
    batch_indexes: Sequence[int] = (),
    redelivery_count: int = 0,
    key: str | None = None,
    properties: Mapping[str, str] | None = None,
    event_time_ms: int = 0,
) -> pb.Delivery:
    """An entry holding ``values`` as a producer would have batched them."""
    batch = entry_pb2.MessageBatch()
    for value in values:
        message = batch.messages.add(value=value, event_time_ms=event_time_ms)
        if key is not None:
            message.partition_key = key
        message.properties.update(properties or {})
    raw = batch.SerializeToString()
    envelope = entry_pb2.EntryEnvelope(
        format_version=1,
        producer_name="producer-1",
        sequence_id=entry[1] * 100,
        last_sequence_id=entry[1] * 100 + len(values) - 1,
        num_messages=len(values),
        publish_time_ms=1_700_000_000_000,
        first_offset=entry[1] * 100,
        compression=types_pb2.COMPRESSION_TYPE_NONE,
        uncompressed_size=len(raw),
        batch=raw,
    )
    return pb.Delivery(
        message_id=types_pb2.MessageId(
            ledger_id=entry[0],
            entry_id=entry[1],
            batch_index=-1,
            partition=partition,
            batch_size=len(values),
        ),
        entry=envelope.SerializeToString(),
        redelivery_count=redelivery_count,
        batch_indexes=batch_indexes,
    )


async def receive_all(consumer: Consumer, count: int) -> list[Message]:
    return [await consumer.receive(timeout_millis=10_000) for _ in range(count)]


@pytest.fixture
async def cluster() -> AsyncIterator[ScriptedCluster]:
    fake = await ScriptedCluster().start()
    yield fake
    fake.receipts_open.set()
    await fake.stop()


@pytest.fixture
async def client(cluster: ScriptedCluster) -> AsyncIterator[Client]:
    async with Client(
        cluster.service_url,
        operation_timeout_s=10,
        initial_backoff_ms=10,
        max_backoff_ms=100,
        connection_timeout_ms=2000,
    ) as c:
        yield c


E1 = (7, 1)
E2 = (7, 2)
E3 = (7, 3)


# --- partial acks -------------------------------------------------------------------------------


async def test_an_entry_delivered_in_part_is_acked_in_part_and_a_whole_one_whole(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("split")
    consumer = await client.subscribe("split", "sub", "key_shared")
    stream = await cluster.stream("split")
    # key_shared: only messages 1 and 3 of E1 have keys of this consumer
    stream.deliver(
        delivery(E1, [b"a0", b"a1", b"a2", b"a3"], batch_indexes=[1, 3]),
        delivery(E2, [b"b0", b"b1"]),
    )
    received = await receive_all(consumer, 4)
    assert [m.data() for m in received] == [b"a1", b"a3", b"b0", b"b1"]
    for message in received:
        await consumer.acknowledge(message)
    await eventually(
        lambda: stream.acked_entries() == {E1, E2}, what="acks of both entries", interval_s=0.005
    )
    assert stream.acked_in_part() == [(E1, [1, 3], 4)]
    assert stream.acked_whole() == [E2]


async def test_more_messages_of_a_held_entry_are_acked_together_with_the_first_ones(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("moved")
    consumer = await client.subscribe("moved", "sub", "key_shared")
    stream = await cluster.stream("moved")
    values = [b"m0", b"m1", b"m2", b"m3", b"m4"]
    stream.deliver(delivery(E1, values, batch_indexes=[0, 1]))
    first = await receive_all(consumer, 2)
    await consumer.acknowledge(first[0])
    # a key moved to this consumer: more of the same entry
    stream.deliver(delivery(E1, values, batch_indexes=[3]))
    (later,) = await receive_all(consumer, 1)
    assert later.data() == b"m3"
    await consumer.acknowledge(later)  # m1 is still out: E1 is not done
    await consumer.acknowledge(first[1])
    await eventually(lambda: stream.acks, what="the ack of E1", interval_s=0.005)
    assert stream.acked_in_part() == [(E1, [0, 1, 3], 5)]
    assert stream.acked_whole() == []


async def test_closing_acks_in_part_what_the_application_acknowledged_of_an_entry(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("restart")
    consumer = await client.subscribe("restart", "sub")
    stream = await cluster.stream("restart")
    stream.deliver(delivery(E1, [b"0", b"1", b"2"]), delivery(E2, [b"x", b"y"]))
    received = await receive_all(consumer, 5)
    await consumer.acknowledge(received[0])
    await consumer.acknowledge(received[2])
    await consumer.close()
    assert stream.acked_in_part() == [(E1, [0, 2], 3)]
    assert stream.acked_whole() == []  # E2: nothing of it was acknowledged


async def test_a_nack_tells_the_broker_which_messages_of_the_entry_were_acknowledged(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("nacked")
    consumer = await client.subscribe("nacked", "sub", negative_ack_redelivery_delay_ms=0)
    stream = await cluster.stream("nacked")
    stream.deliver(delivery(E1, [b"0", b"1", b"2"]))
    received = await receive_all(consumer, 3)
    await consumer.acknowledge(received[0])
    consumer.negative_acknowledge(received[1])
    await eventually(lambda: stream.nacked() == [E1], what="the nack of E1", interval_s=0.005)
    assert stream.acked_in_part() == [(E1, [0], 3)]
    assert stream.acked_whole() == []


# --- ack timeout --------------------------------------------------------------------------------


async def test_messages_not_acknowledged_in_time_are_asked_back(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("slow")
    consumer = await client.subscribe(
        "slow", "sub", "shared", ack_timeout_ms=1000, ack_timeout_tick_ms=10
    )
    stream = await cluster.stream("slow")
    stream.deliver(
        delivery(E1, [b"acked"]), delivery(E2, [b"forgotten"]), delivery(E3, [b"nacked"])
    )
    acked, forgotten, nacked = await receive_all(consumer, 3)
    await consumer.acknowledge(acked)
    consumer.negative_acknowledge(nacked)
    await eventually(stream.redelivery_requests, what="a redelivery request", interval_s=0.005)
    assert stream.redelivery_requests() == [[forgotten.message_id().entry]]
    # asked back once: the message left the tracker (it comes again, and is tracked again)
    stream.deliver(delivery(E2, [b"forgotten"], redelivery_count=1))
    (again,) = await receive_all(consumer, 1)
    assert again.redelivery_count() == 1
    await consumer.acknowledge(again)
    await consumer.close()
    assert stream.redelivery_requests() == [[E2]]


async def test_closing_stops_the_ack_timeout_timer(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("timer")
    consumer = await client.subscribe("timer", "sub", ack_timeout_ms=1000, ack_timeout_tick_ms=10)

    def timers() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if t.get_name().startswith("consumer-ack-timeout")]

    assert len(timers()) == 1
    await consumer.close()
    assert timers() == []


@pytest.mark.parametrize(
    ("settings", "rule"),
    [
        ({"ack_timeout_ms": 999}, "ack_timeout_ms: must be 0 (off) or >= 1000"),
        ({"ack_timeout_ms": -1}, "ack_timeout_ms: must be 0 (off) or >= 1000"),
        ({"ack_timeout_tick_ms": 9}, "ack_timeout_tick_ms: must be >= 10"),
    ],
)
async def test_ack_timeout_settings_are_checked(
    client: Client, settings: dict[str, Any], rule: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        await client.subscribe("any", "sub", **settings)
    assert rule in info.value.message


# --- dead letters -------------------------------------------------------------------------------


async def test_a_message_redelivered_too_often_goes_to_the_dead_letter_topic_first(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("orders", partitions=2)
    cluster.create_topic("orders-DLQ")
    consumer = await client.subscribe(
        "orders",
        "sub",
        "shared",
        max_redelivery_count=3,
        ack_receipts=True,
        receiver_queue_size=4,
    )
    stream = await cluster.stream("orders-partition-1")
    await eventually(stream.permits, what="the first permits", interval_s=0.005)
    granted = stream.permits()
    cluster.receipts_open.clear()  # the dead-letter topic's receipt waits
    stream.deliver(
        delivery(
            E1,
            [b"poison"],
            partition=1,
            redelivery_count=4,
            key="k1",
            properties={"origin": "app"},
            event_time_ms=1234,
        ),
        delivery(E2, [b"fine"], partition=1, redelivery_count=3),  # not more than 3: delivered
    )
    (first,) = await receive_all(consumer, 1)
    assert first.data() == b"fine"  # the poison message never reaches the application
    await eventually(
        lambda: cluster.batches_of("orders-DLQ"), what="the dead-letter send", interval_s=0.005
    )
    # everything acknowledged before this is on the wire once the broker confirmed it
    await consumer.acknowledge(first)
    assert stream.acked_entries() == {E2}, "acked before the dead-letter topic stored it"

    cluster.receipts_open.set()
    await eventually(
        lambda: E1 in stream.acked_entries(),
        what="the ack of the dead-lettered message",
        interval_s=0.005,
    )
    (dead_ack,) = [a for a in stream.acks if any(m.entry_id == E1[1] for m in a.message_ids)]
    assert dead_ack.dead_lettered == 1
    # its permit came back
    await eventually(
        lambda: stream.permits() > granted + 1,
        what="the permit of the dead-lettered message",
        interval_s=0.005,
    )

    (stored,) = cluster.partition("orders-DLQ").entries
    (copy,) = decode_entry(stored.envelope).messages
    assert copy.value == b"poison"
    assert copy.partition_key == "k1"
    assert copy.event_time_ms == 1234
    assert dict(copy.properties) == {
        "origin": "app",
        "REAL_TOPIC": "public/default/orders-partition-1",
        "ORIGIN_MESSAGE_ID": str(MessageId(E1[0], E1[1], 0, 1)),
    }
    with pytest.raises(ReceiveTimeoutError):
        await consumer.receive(timeout_millis=0)


async def test_a_failed_dead_letter_send_leaves_the_message_unacknowledged(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("jobs")
    cluster.create_topic("graveyard")
    consumer = await client.subscribe(
        "jobs",
        "sub",
        "shared",
        max_redelivery_count=1,
        dead_letter_topic="graveyard",
        ack_receipts=True,
    )
    stream = await cluster.stream("jobs")
    cluster.refuse_next_batch = MessageTooLargeError("the dead-letter topic refuses it")
    stream.deliver(delivery(E1, [b"p0", b"p1"], redelivery_count=2), delivery(E2, [b"fine"]))
    (first,) = await receive_all(consumer, 1)
    assert first.data() == b"fine"
    # asked for again (it is tried again when it comes back), never acknowledged
    await eventually(
        lambda: E1 in stream.nacked(),
        what="the nack of the message that was not stored",
        interval_s=0.005,
    )
    await consumer.acknowledge(first)
    assert stream.acked_entries() == {E2}
    assert cluster.partition("graveyard").entries == []

    # it comes again, and this time the copy is stored
    stream.deliver(delivery(E1, [b"p0", b"p1"], redelivery_count=3))
    await eventually(
        lambda: E1 in stream.acked_entries(),
        what="the ack after the copy was stored",
        interval_s=0.005,
    )
    assert [
        m.value for m in decode_entry(cluster.partition("graveyard").entries[0].envelope).messages
    ] == [b"p0", b"p1"]
    assert sum(a.dead_lettered for a in stream.acks) == 2


# --- failover: which partitions are active -----------------------------------------------------


async def test_active_partitions_follow_what_the_broker_says(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("ha", partitions=2)
    heard: list[tuple[str, bool]] = []
    consumer = await client.subscribe(
        "ha", "sub", "failover", on_active_change=lambda t, a: heard.append((t, a))
    )
    assert consumer.active_partitions() == []
    p0 = await cluster.stream("ha-partition-0")
    p1 = await cluster.stream("ha-partition-1")
    p0.set_active(True)
    p1.set_active(True)
    await eventually(
        lambda: consumer.active_partitions() == [0, 1],
        what="both partitions active",
        interval_s=0.005,
    )
    p0.set_active(False)
    await eventually(
        lambda: consumer.active_partitions() == [1], what="partition 0 inactive", interval_s=0.005
    )
    assert heard == [
        ("public/default/ha-partition-0", True),
        ("public/default/ha-partition-1", True),
        ("public/default/ha-partition-0", False),
    ]

    # the stream ends: inactive until the broker says otherwise on the new one
    p1.close(ServiceNotReadyError("ha-partition-1 moves"))
    again = await cluster.stream("ha-partition-1", after=p1)
    assert consumer.active_partitions() == []
    assert heard[-1] == ("public/default/ha-partition-1", False)
    again.set_active(True)
    await eventually(
        lambda: consumer.active_partitions() == [1],
        what="partition 1 active again",
        interval_s=0.005,
    )
    assert heard[-1] == ("public/default/ha-partition-1", True)


async def test_a_consumer_that_stops_being_active_drops_what_it_had_queued(
    cluster: ScriptedCluster, client: Client
) -> None:
    # the broker gives the new active consumer everything unacknowledged: handing the queued
    # copies to this application too would deliver them after the other one acknowledged them
    cluster.create_topic("handover")
    consumer = await client.subscribe("handover", "sub", "failover", receiver_queue_size=4)
    stream = await cluster.stream("handover")
    stream.set_active(True)
    stream.deliver(delivery(E1, [b"one"]), delivery(E2, [b"two"]), delivery(E3, [b"three"]))
    (first,) = await receive_all(consumer, 1)
    assert first.data() == b"one"
    granted = stream.permits()
    stream.set_active(False)
    await eventually(lambda: consumer.active_partitions() == [], what="inactive", interval_s=0.005)
    with pytest.raises(ReceiveTimeoutError):
        await consumer.receive(timeout_millis=200)
    # the two dropped messages' permits come back with the received one's (refills go out
    # at half the queue), so the queue is whole again when it is active once more
    await eventually(
        lambda: stream.permits() == granted + 3,
        what="the permits of the dropped messages",
        interval_s=0.005,
    )
    stream.set_active(True)
    stream.deliver(delivery(E2, [b"two"], redelivery_count=1))
    (again,) = await receive_all(consumer, 1)
    assert (again.data(), again.redelivery_count()) == (b"two", 1)
    await consumer.close()


async def test_a_failing_active_change_callback_breaks_nothing(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("noisy")

    def broken(topic: str, active: bool) -> None:
        raise RuntimeError("application bug")

    consumer = await client.subscribe("noisy", "sub", "failover", on_active_change=broken)
    stream = await cluster.stream("noisy")
    stream.set_active(True)
    stream.deliver(delivery(E1, [b"still here"]))
    (message,) = await receive_all(consumer, 1)
    assert message.data() == b"still here"
    assert consumer.active_partitions() == [-1]


async def test_the_sync_client_reports_activity_on_its_thread(cluster: ScriptedCluster) -> None:
    cluster.create_topic("sync-ha")
    heard: list[tuple[str, bool]] = []

    def subscribe() -> tuple[magnetar.Client, magnetar.Consumer]:
        sync_client = magnetar.Client(cluster.service_url, operation_timeout_s=10)
        return sync_client, sync_client.subscribe(
            "sync-ha", "sub", "failover", on_active_change=lambda t, a: heard.append((t, a))
        )

    sync_client, consumer = await asyncio.to_thread(subscribe)
    try:
        stream = await cluster.stream("sync-ha")
        stream.set_active(True)
        await eventually(
            lambda: consumer.active_partitions() == [-1],
            what="the partition active",
            interval_s=0.005,
        )
        assert heard == [("public/default/sync-ha", True)]
    finally:
        await asyncio.to_thread(sync_client.close)


# --- bad acknowledgements ----------------------------------------------------------------------


async def test_acking_an_id_of_a_partition_the_consumer_does_not_have_names_both(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("two", partitions=2)
    cluster.create_topic("one")
    two = await client.subscribe("two", "sub")
    one = await client.subscribe("one", "sub")
    stranger = MessageId(5, 6, 0, partition=7)
    for consumer, topic in ((two, "public/default/two"), (one, "public/default/one")):
        for call in (
            consumer.acknowledge,
            consumer.acknowledge_cumulative,
        ):
            with pytest.raises(InvalidArgumentError) as info:
                await call(stranger)
            assert "5:6:0:7" in info.value.message
            assert topic in info.value.message
        with pytest.raises(InvalidArgumentError) as info:
            consumer.negative_acknowledge(stranger)
        assert "5:6:0:7" in info.value.message
    with pytest.raises(InvalidArgumentError) as info:
        await one.acknowledge(MessageId.earliest)
    assert "public/default/one" in info.value.message


async def test_an_ack_the_broker_refuses_reaches_the_caller_with_receipts(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("refused")
    consumer = await client.subscribe("refused", "sub", ack_receipts=True)
    await cluster.stream("refused")
    cluster.failing_acks[(999, 999)] = InvalidArgumentError("999:999 is not a stored entry")
    with pytest.raises(InvalidArgumentError) as info:
        await consumer.acknowledge(MessageId(999, 999, 0))
    assert "not a stored entry" in info.value.message
    # the stream goes on
    cluster.failing_acks.clear()
    await consumer.acknowledge(MessageId(999, 998, 0))


# --- what producers put on the wire ----------------------------------------------------------


async def test_batches_carry_their_key_hashes(cluster: ScriptedCluster, client: Client) -> None:
    cluster.create_topic("keys")
    producer = await client.create_producer("keys", batching_max_publish_delay_ms=10_000)
    for keys in ([None, None], ["a", "a", "a"], ["a", None, "b"]):
        futures = [producer.send_async(b"x", partition_key=k) for k in keys]
        await producer.flush()
        await asyncio.gather(*futures)
    assert [list(b.key_hashes) for b in cluster.batches_of("keys")] == [
        [],
        [key_hash("a")],
        [key_hash("a"), KEYLESS_HASH, key_hash("b")],
    ]


async def test_a_message_with_another_delivery_time_starts_a_new_batch(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("later")
    producer = await client.create_producer("later", batching_max_publish_delay_ms=10_000)
    at = 1_900_000_000_000
    futures = [
        producer.send_async(b"0"),
        producer.send_async(b"1"),
        producer.send_async(b"2", deliver_at_ms=at),
        producer.send_async(b"3", deliver_at_ms=at),
        producer.send_async(b"4", deliver_at_ms=at + 1),
        producer.send_async(b"5"),
    ]
    await producer.flush()
    await asyncio.gather(*futures)
    assert [(b.num_messages, b.deliver_at_ms) for b in cluster.batches_of("later")] == [
        (2, 0),
        (2, at),
        (1, at + 1),
        (1, 0),
    ]


async def test_a_delay_becomes_a_delivery_time_by_the_wall_clock(
    cluster: ScriptedCluster, client: Client
) -> None:
    cluster.create_topic("delay")
    producer = await client.create_producer("delay")
    before = time.time_ns() // 1_000_000
    await producer.send(b"in a minute", deliver_after_ms=60_000)
    after = time.time_ns() // 1_000_000
    (batch,) = cluster.batches_of("delay")
    assert before + 60_000 <= batch.deliver_at_ms <= after + 60_000
    await producer.send(b"now", deliver_after_ms=0)
    assert cluster.batches_of("delay")[-1].deliver_at_ms == 0


@pytest.mark.parametrize(
    ("delivery_args", "named"),
    [
        ({"deliver_after_ms": 10, "deliver_at_ms": 1_900_000_000_000}, "deliver_after_ms"),
        ({"deliver_after_ms": -1}, "deliver_after_ms"),
        ({"deliver_at_ms": -5}, "deliver_at_ms"),
        ({"deliver_at_ms": 1.5}, "deliver_at_ms"),
    ],
)
async def test_bad_delivery_times_are_refused(
    cluster: ScriptedCluster, client: Client, delivery_args: dict[str, Any], named: str
) -> None:
    cluster.create_topic("bad-delay")
    producer = await client.create_producer("bad-delay")
    heard: list[object] = []
    for send in (
        producer.send(b"x", **delivery_args),
        producer.send_async(b"x", lambda e, _: heard.append(e), **delivery_args),
        await producer.send_async_when_room(b"x", **delivery_args),
    ):
        with pytest.raises(InvalidArgumentError) as info:
            await send
        assert named in info.value.message
    assert len(heard) == 1
    assert isinstance(heard[0], InvalidArgumentError)
    assert producer.pending_messages() == 0
    assert cluster.batches_of("bad-delay") == []


async def test_the_sync_producer_passes_delivery_times_through(cluster: ScriptedCluster) -> None:
    cluster.create_topic("sync-delay")
    at = 1_900_000_000_000

    def produce() -> None:
        with magnetar.Client(cluster.service_url, operation_timeout_s=10) as sync_client:
            producer = sync_client.create_producer("sync-delay")
            producer.send(b"at", deliver_at_ms=at)
            producer.send_async(b"after", deliver_after_ms=60_000).result(timeout=10)
            with pytest.raises(InvalidArgumentError):
                producer.send(b"both", deliver_at_ms=at, deliver_after_ms=1)
            with pytest.raises(InvalidArgumentError):
                producer.send_async(b"negative", deliver_after_ms=-1).result(timeout=10)

    before = time.time_ns() // 1_000_000
    await asyncio.to_thread(produce)
    after = time.time_ns() // 1_000_000
    first, second = cluster.batches_of("sync-delay")
    assert first.deliver_at_ms == at
    assert before + 60_000 <= second.deliver_at_ms <= after + 60_000


async def test_a_message_tells_when_its_stream_was_opened_and_when_it_came(
    cluster: ScriptedCluster, client: Client
) -> None:
    # magnetar verify reasons with both: a copy on a stream opened before an ack's receipt may
    # have been sent before the ack was applied, whenever the client got it
    cluster.create_topic("times")
    before = time.monotonic()
    consumer = await client.subscribe("times", "sub", "shared")
    stream = await cluster.stream("times")
    stream.deliver(delivery(E1, [b"one"]))
    (first,) = await receive_all(consumer, 1)
    opened = stream_opened_monotonic(first)
    assert before <= opened <= received_monotonic(first) <= time.monotonic()

    stream.close(ServiceNotReadyError("times moves"))
    again = await cluster.stream("times", after=stream)
    again.deliver(delivery(E2, [b"two"]))
    (second,) = await receive_all(consumer, 1)
    # the client notes its stream open when the call is set up, which the fake cluster may see
    # a moment before: bounded by the message's own arrival, not by when the test saw the stream
    assert opened < stream_opened_monotonic(second) <= received_monotonic(second)
    assert received_monotonic(second) <= time.monotonic()
    await consumer.close()
