"""The client against an in-process fake broker: what a user sees, including failover.

The fake (``fake_broker.py``) speaks the real protocol over real gRPC; tests move partitions
between its brokers and kill brokers outright, and check what producers, consumers and readers
deliver: every message confirmed once, received at least once, readers without gaps or repeats.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import magnetar.aio
from magnetar.aio import (
    Client,
    Consumer,
    ConsumerBusyError,
    Message,
    MessageId,
    MessageTooLargeError,
    OperationTimeoutError,
    ProducerClosedError,
    ProducerQueueFullError,
    ReceiveTimeoutError,
    TopicNotFoundError,
)
from magnetar.common.errors import (
    AuthenticationError,
    AuthenticationExpiredError,
    InvalidArgumentError,
    InvalidConfigError,
    NotEnoughBookiesError,
)
from magnetar.testing.eventually import eventually
from tests.unit.aio.fake_broker import FakeCluster


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    fake = await FakeCluster().start(brokers=2)
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


async def receive_all(consumer: Consumer, count: int, timeout_ms: int = 5000) -> list[Message]:
    return [await consumer.receive(timeout_millis=timeout_ms) for _ in range(count)]


async def test_messages_round_trip_with_everything_a_message_carries(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("orders")
    consumer = await client.subscribe("orders", "sub", initial_position="earliest")
    producer = await client.create_producer("orders")
    ids = [
        await producer.send(
            f"m{i}".encode(), properties={"i": str(i)}, partition_key=f"k{i}", event_timestamp=i
        )
        for i in range(5)
    ]
    assert ids == sorted(ids)
    received = await receive_all(consumer, 5)
    assert [m.data() for m in received] == [f"m{i}".encode() for i in range(5)]
    assert [m.message_id() for m in received] == ids
    assert [m.offset() for m in received] == [0, 1, 2, 3, 4]
    first = received[0]
    assert (first.partition_key(), first.properties(), first.event_timestamp()) == (
        "k0",
        {"i": "0"},
        0,
    )
    assert first.topic_name() == "public/default/orders"
    assert first.publish_timestamp() > 0
    assert first.redelivery_count() == 0
    assert first.producer_name() == producer.producer_name()
    assert [m.sequence_id() for m in received] == [0, 1, 2, 3, 4]
    for message in received:
        await consumer.acknowledge(message)
    with pytest.raises(ReceiveTimeoutError):
        await consumer.receive(timeout_millis=50)


async def test_many_messages_travel_in_few_batches_and_stream_messages(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("bulk")
    producer = await client.create_producer(
        "bulk", batching_max_messages=100, batching_max_publish_delay_ms=5
    )
    futures = [producer.send_async(b"x" * 100) for _ in range(2000)]
    ids = await asyncio.gather(*futures)
    partition = cluster.partition("bulk")
    assert sum(e.num_messages for e in partition.entries) == 2000
    assert len(partition.entries) <= 40
    assert cluster.produce_messages <= len(partition.entries)
    assert len(set(ids)) == 2000
    assert {i.batch_size for i in ids} <= {100, *(e.num_messages for e in partition.entries)}


async def test_an_idle_send_does_not_wait_out_the_batching_delay(
    cluster: FakeCluster, client: Client
) -> None:
    """Self-clocking over the real stream: with a ten-minute batching delay an idle send still
    goes at once, and senders woken by one receipt share the next batch."""
    cluster.create_topic("idle")
    producer = await client.create_producer("idle", batching_max_publish_delay_ms=600_000)
    first = await asyncio.wait_for(producer.send(b"a"), 10)
    second = await asyncio.wait_for(producer.send(b"b"), 10)
    assert first < second

    async def sender(index: int) -> list[MessageId]:
        return [await producer.send(f"{index}-{k}".encode()) for k in range(20)]

    per_sender = await asyncio.wait_for(asyncio.gather(*(sender(i) for i in range(5))), 30)
    for ids in per_sender:
        assert ids == sorted(ids)
    entries = cluster.partition("idle").entries
    assert sum(e.num_messages for e in entries) == 102
    # the five senders send together each time: one entry per round, not one per message
    assert [e.num_messages for e in entries] == [1, 1, *[5] * 20]


async def test_a_callback_hears_of_every_message(cluster: FakeCluster, client: Client) -> None:
    cluster.create_topic("cb")
    producer = await client.create_producer("cb")
    heard: list[tuple[object, object]] = []
    futures = [producer.send_async(b"x", lambda e, i: heard.append((e, i))) for _ in range(10)]
    await producer.flush()
    assert len(heard) == 10
    assert all(e is None for e, _ in heard)
    assert [i for _, i in heard] == [f.result() for f in futures]


async def test_keys_stick_to_partitions_and_a_consumer_reads_them_all(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("parted", partitions=4)
    consumer = await client.subscribe("parted", "sub", initial_position="earliest")
    producer = await client.create_producer("parted")
    assert await client.get_topic_partitions("parted") == [
        f"public/default/parted-partition-{i}" for i in range(4)
    ]
    keyed = await asyncio.gather(
        *(producer.send_async(b"k", partition_key="user-7") for _ in range(20))
    )
    assert len({m.partition for m in keyed}) == 1
    keyless = [await producer.send(b"n") for _ in range(8)]
    assert len({m.partition for m in keyless}) > 1  # each batch goes to the next partition
    received = await receive_all(consumer, 28)
    assert sorted(m.message_id() for m in received) == sorted([*keyed, *keyless])
    for message in received:
        assert message.topic_name().endswith(f"-partition-{message.message_id().partition}")
    # one producer name on every partition: deduplication is by name
    names = {n for p in cluster.partitions.values() for n in p.last_sequence}
    assert names == {producer.producer_name()}


async def test_unconfirmed_batches_are_resent_to_the_new_owner_and_stored_once(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("moving")
    producer = await client.create_producer("moving")
    first_id = await producer.send(b"before")
    cluster.drop_receipts = True  # stored, but the receipts never reach the client
    futures = [producer.send_async(f"m{i}".encode()) for i in range(50)]
    partition = cluster.partition("moving")
    while sum(e.num_messages for e in partition.entries) < 51:
        await asyncio.sleep(0.01)
    cluster.drop_receipts = False
    cluster.move("moving", to=1)
    ids = await asyncio.gather(*futures)
    assert sum(e.num_messages for e in partition.entries) == 51  # no duplicates stored
    # duplicate receipts name the entries stored on the first owner
    assert {i.ledger_id for i in ids} == {first_id.ledger_id}
    after = await producer.send(b"after")
    assert after.ledger_id != first_id.ledger_id
    assert producer.is_connected()


async def test_a_killed_broker_costs_nothing_but_time(cluster: FakeCluster, client: Client) -> None:
    cluster.create_topic("fragile")
    producer = await client.create_producer("fragile")
    consumer = await client.subscribe(
        "fragile", "sub", initial_position="earliest", ack_receipts=True
    )
    for i in range(10):
        await producer.send(f"a{i}".encode())
    for message in await receive_all(consumer, 10):
        await consumer.acknowledge(message)
    cluster.drop_receipts = True
    pending = [producer.send_async(f"b{i}".encode()) for i in range(10)]
    # stored, their receipts dropped
    await eventually(lambda: cluster.partition("fragile").next_offset == 20, what="b0..b9 stored")
    cluster.drop_receipts = False
    await cluster.kill(0)  # the service URL's first broker is gone: lookups go to the second
    await asyncio.gather(*pending)
    pending.extend(producer.send_async(f"c{i}".encode()) for i in range(10))
    await asyncio.gather(*pending)
    received = [m.data() for m in await receive_all(consumer, 20)]
    assert received == [f"b{i}".encode() for i in range(10)] + [f"c{i}".encode() for i in range(10)]


async def test_a_send_timeout_names_the_problem_the_broker_reported(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("stalled")
    cluster.write_problem = NotEnoughBookiesError(
        "not enough writable bookies for a new ledger: 1 writable (bookie-2), need 2 (Qw=2)"
        " for E3/Qw2; bookie-0 read-only (disk 96% used), bookie-1 unreachable"
    )
    cluster.drop_receipts = True  # the batch waits in the broker
    producer = await client.create_producer("stalled", send_timeout_ms=300)
    with pytest.raises(OperationTimeoutError) as info:
        await producer.send(b"waits")
    assert "last problem: not enough writable bookies" in info.value.message
    assert "bookie-0 read-only (disk 96% used), bookie-1 unreachable" in info.value.message
    assert info.value.retriable


async def test_sends_fail_with_a_timeout_when_the_broker_never_confirms(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("silent")
    producer = await client.create_producer("silent", send_timeout_ms=200)
    cluster.drop_receipts = True
    with pytest.raises(OperationTimeoutError) as info:
        await producer.send(b"lost?")
    assert info.value.retriable
    assert "send_timeout_ms=200" in info.value.message
    assert producer.pending_messages() == 0


async def test_back_pressure_bounds_pending_messages(cluster: FakeCluster, client: Client) -> None:
    cluster.create_topic("bounded")
    producer = await client.create_producer("bounded", max_pending_messages=5)
    cluster.drop_receipts = True
    futures = [producer.send_async(b"x") for _ in range(5)]
    refused = producer.send_async(b"one too many")
    with pytest.raises(ProducerQueueFullError):
        await refused
    waiting = asyncio.create_task(producer.send(b"waits"))
    await eventually(lambda: cluster.partition("bounded").next_offset == 5, what="5 stored")
    for _ in range(20):  # the blocked send has had its chances to run
        await asyncio.sleep(0)
    assert not waiting.done()
    assert cluster.partition("bounded").next_offset == 5
    cluster.drop_receipts = False
    cluster.move("bounded", to=1)  # the resend is confirmed and frees room
    await asyncio.gather(*futures)
    await asyncio.wait_for(waiting, 5)


async def test_a_message_over_the_broker_limit_fails_alone(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("big")
    producer = await client.create_producer("big")
    with pytest.raises(MessageTooLargeError):
        await producer.send(b"x" * (2 * 1024 * 1024))
    assert (await producer.send(b"small")).entry_id == 0


async def test_a_refused_batch_fails_alone_and_the_stream_goes_on(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("picky")
    producer = await client.create_producer("picky")
    cluster.refuse_next_batch = MessageTooLargeError("the broker thinks this batch is too large")
    with pytest.raises(MessageTooLargeError):
        await producer.send(b"refused")
    assert (await producer.send(b"accepted")).entry_id == 0
    assert producer.is_connected()


async def test_a_deleted_topic_fails_what_is_pending_and_what_comes_after(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("doomed")
    producer = await client.create_producer("doomed")
    await producer.send(b"fine")
    cluster.drop_receipts = True
    pending = producer.send_async(b"never confirmed")
    await eventually(lambda: cluster.partition("doomed").next_offset == 2, what="it stored")
    cluster.delete_topic("doomed")
    with pytest.raises(TopicNotFoundError):
        await pending
    with pytest.raises(TopicNotFoundError):
        await producer.send(b"later")


async def test_final_errors_surface_at_once(cluster: FakeCluster, client: Client) -> None:
    with pytest.raises(TopicNotFoundError):
        await client.create_producer("missing")
    with pytest.raises(TopicNotFoundError):
        await client.subscribe("missing", "sub")


async def test_a_cluster_that_never_answers_times_out_with_the_reason(
    cluster: FakeCluster,
) -> None:
    cluster.create_topic("t")
    cluster.lookups_refused = True
    async with Client(cluster.service_url, operation_timeout_s=0.3, initial_backoff_ms=10) as c:
        with pytest.raises(OperationTimeoutError) as info:
            await c.create_producer("t")
    assert "could not look up" in info.value.message


async def test_an_exclusive_subscription_refuses_a_second_consumer(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("excl")
    await client.subscribe("excl", "sub")
    with pytest.raises(ConsumerBusyError):
        await client.subscribe("excl", "sub")


async def test_acknowledged_batches_are_not_delivered_again(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("acks")
    producer = await client.create_producer("acks", batching_max_publish_delay_ms=50)
    await asyncio.gather(*(producer.send_async(f"{i}".encode()) for i in range(6)))  # one batch
    await asyncio.gather(*(producer.send_async(f"{i}".encode()) for i in range(6, 9)))
    assert len(cluster.partition("acks").entries) == 2
    consumer = await client.subscribe("acks", "sub", initial_position="earliest")
    received = await receive_all(consumer, 9)
    for message in received[:6]:  # the first batch, all of it
        await consumer.acknowledge(message)
    await consumer.acknowledge(received[6])  # part of the second
    await consumer.close()
    again = await client.subscribe("acks", "sub")
    redelivered = await receive_all(again, 3)
    assert [m.data() for m in redelivered] == [b"6", b"7", b"8"]


async def test_cumulative_ack_inside_a_batch_keeps_the_rest_of_it(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("cumul")
    producer = await client.create_producer("cumul", batching_max_publish_delay_ms=50)
    for start in (0, 3, 6):
        await asyncio.gather(
            *(producer.send_async(f"{i}".encode()) for i in range(start, start + 3))
        )
    consumer = await client.subscribe(
        "cumul", "sub", initial_position="earliest", ack_receipts=True
    )
    received = await receive_all(consumer, 9)
    await consumer.acknowledge_cumulative(received[4])  # the middle of the second batch
    await consumer.close()
    again = await client.subscribe("cumul", "sub")
    assert [m.data() for m in await receive_all(again, 6)] == [f"{i}".encode() for i in range(3, 9)]


async def test_cumulative_ack_is_refused_on_shared_subscriptions(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("shared")
    consumer = await client.subscribe("shared", "sub", "shared")
    with pytest.raises(InvalidArgumentError):
        await consumer.acknowledge_cumulative(MessageId(1, 1, 0))


async def test_a_negative_ack_brings_the_message_back(cluster: FakeCluster, client: Client) -> None:
    cluster.create_topic("nack")
    producer = await client.create_producer("nack")
    consumer = await client.subscribe(
        "nack", "sub", initial_position="earliest", negative_ack_redelivery_delay_ms=10
    )
    await producer.send(b"retry me")
    first = await consumer.receive(timeout_millis=5000)
    consumer.negative_acknowledge(first)
    again = await consumer.receive(timeout_millis=5000)
    assert again.message_id() == first.message_id()
    assert again.redelivery_count() == 1


async def test_a_consumer_resubscribes_on_the_new_owner(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("hop", partitions=2)
    producer = await client.create_producer("hop")
    consumer = await client.subscribe(
        "hop", "sub", initial_position="earliest", ack_receipts=True, receiver_queue_size=4
    )
    await asyncio.gather(
        *(producer.send_async(f"a{i}".encode(), partition_key=str(i)) for i in range(20))
    )
    first = await receive_all(consumer, 10)
    for message in first:
        await consumer.acknowledge(message)
    cluster.move("hop-partition-0", to=1)
    cluster.move("hop-partition-1", to=1)
    await asyncio.gather(
        *(producer.send_async(f"b{i}".encode(), partition_key=str(i)) for i in range(20))
    )
    seen = {m.data() for m in first}
    while len(seen) < 40:
        message = await consumer.receive(timeout_millis=5000)
        assert message.data() not in {m.data() for m in first}, "an acknowledged message came back"
        seen.add(message.data())
        await consumer.acknowledge(message)
    assert consumer.is_connected()


async def test_seek_by_offset_and_by_message_id_lands_inside_a_batch(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("seek")
    producer = await client.create_producer("seek", batching_max_publish_delay_ms=50)
    await asyncio.gather(*(producer.send_async(f"{i}".encode()) for i in range(10)))
    consumer = await client.subscribe("seek", "sub", initial_position="earliest")
    received = await receive_all(consumer, 10)
    await consumer.seek(5)
    assert (await consumer.receive(timeout_millis=5000)).offset() == 5
    await consumer.seek(received[3].message_id())
    assert (await consumer.receive(timeout_millis=5000)).data() == b"3"
    await consumer.seek(MessageId.earliest)
    assert (await consumer.receive(timeout_millis=5000)).data() == b"0"
    await consumer.seek(publish_time_ms=0)
    assert (await consumer.receive(timeout_millis=5000)).data() == b"0"


async def test_a_reader_neither_loses_nor_repeats_across_a_broker_kill(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("log")
    producer = await client.create_producer("log", batching_max_publish_delay_ms=20)
    await asyncio.gather(*(producer.send_async(f"{i}".encode()) for i in range(30)))
    reader = await client.create_reader("log", MessageId.earliest, receiver_queue_size=10)
    offsets = [(await reader.read_next(5000)).offset() for _ in range(13)]  # stops mid-batch
    await cluster.kill(0)
    await asyncio.gather(*(producer.send_async(f"{i}".encode()) for i in range(30, 40)))
    offsets += [(await reader.read_next(5000)).offset() for _ in range(27)]
    assert offsets == list(range(40))
    with pytest.raises(ReceiveTimeoutError):
        await reader.read_next(50)


async def test_a_reader_starts_after_or_at_a_message_id(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("from-id")
    producer = await client.create_producer("from-id", batching_max_publish_delay_ms=50)
    ids = await asyncio.gather(*(producer.send_async(f"{i}".encode()) for i in range(5)))
    after = await client.create_reader("from-id", ids[2])
    assert (await after.read_next(5000)).data() == b"3"
    at = await client.create_reader("from-id", ids[2], start_message_id_inclusive=True)
    assert (await at.read_next(5000)).data() == b"2"
    latest = await client.create_reader("from-id", "latest")
    await producer.send(b"new")
    assert (await latest.read_next(5000)).data() == b"new"


async def test_closing_the_client_flushes_producers_and_ends_consumers(
    cluster: FakeCluster,
) -> None:
    cluster.create_topic("bye")
    client = Client(cluster.service_url)
    producer = await client.create_producer("bye", batching_max_publish_delay_ms=10_000)
    consumer = await client.subscribe("bye", "sub")
    future = producer.send_async(b"flushed on close")
    await client.close()
    assert (await future).entry_id == 0
    with pytest.raises(ProducerClosedError):
        await producer.send(b"too late")
    messages = [m async for m in consumer]  # ends: the consumer is closed
    assert messages == []


async def test_send_many_stores_a_run_in_order_with_one_receipt(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("runs", partitions=3)
    producer = await client.create_producer(
        "runs", batching_max_messages=100, batching_max_publish_delay_ms=5
    )
    consumer = await client.subscribe("runs", "sub", initial_position="earliest")
    heard: list[tuple[object, object]] = []
    values = [f"v{i}".encode() for i in range(250)]
    receipt = await producer.send_many_async(
        values, lambda e, r: heard.append((e, r)), partition_key="k", properties={"p": "1"}
    )
    assert len(receipt) == 250
    assert heard == [(None, receipt)]
    ids = receipt.message_ids()
    assert ids == sorted(ids)
    assert len(set(ids)) == 250
    assert {i.partition for i in ids} == {receipt.partition}
    assert (receipt.first_message_id(), receipt.last_message_id()) == (ids[0], ids[-1])
    assert {i.batch_size for i in ids} == {100, 50}  # split over three batches of the partition
    received = await receive_all(consumer, 250)
    assert [m.data() for m in received] == values
    assert [m.message_id() for m in received] == ids
    assert {(m.partition_key(), m.properties()["p"]) for m in received} == {("k", "1")}
    # a second run with a single send in between shares batches with them
    single = producer.send_async(b"single", partition_key="k")
    second = await producer.send_many(values[:3], partition_key="k")
    assert (await single) < second.first_message_id()


async def test_send_many_refuses_what_it_cannot_send_and_nothing_else_breaks(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("picky-runs")
    producer = await client.create_producer("picky-runs", max_pending_messages=10)
    for bad, said in [
        (b"bytes, not a list", "a sequence of messages"),
        ([], "at least one message"),
        ([b"ok", "text"], "got str at index 1"),
        ([b"x"] * 11, "more than max_pending_messages=10"),
    ]:
        with pytest.raises(InvalidArgumentError, match=said):
            await producer.send_many_async(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="event_timestamp"):
        await producer.send_many([b"x"], event_timestamp=-1)
    with pytest.raises(MessageTooLargeError):
        await producer.send_many([b"small", b"x" * (2 * 1024 * 1024)])
    cluster.drop_receipts = True
    held = producer.send_many_async([b"a"] * 8)
    with pytest.raises(ProducerQueueFullError):
        await producer.send_many_async([b"b"] * 3)
    waiting = asyncio.create_task(producer.send_many([bytearray(b"c"), memoryview(b"d")]))  # type: ignore[list-item]
    await eventually(lambda: producer.pending_messages() == 10, what="10 messages pending")
    cluster.drop_receipts = False
    cluster.move("picky-runs", to=1)
    assert len(await held) == 8
    assert len(await asyncio.wait_for(waiting, 5)) == 2
    assert producer.pending_messages() == 0
    assert (await producer.send(b"after")).entry_id >= 0


async def test_a_run_whose_batches_time_out_fails_once_and_frees_its_room(
    cluster: FakeCluster, client: Client
) -> None:
    cluster.create_topic("silent-runs")
    producer = await client.create_producer(
        "silent-runs", send_timeout_ms=200, batching_max_messages=10
    )
    cluster.drop_receipts = True
    heard: list[object] = []
    with pytest.raises(OperationTimeoutError):
        await producer.send_many_async([b"x"] * 35, lambda e, _r: heard.append(e))
    assert len(heard) == 1
    assert isinstance(heard[0], OperationTimeoutError)
    assert producer.pending_messages() == 0


async def test_credentials_are_checked_when_the_client_is_made(tmp_path: Path) -> None:
    """What can be known without a broker is refused at once, naming the setting."""
    cert = tmp_path / "c.pem"
    key = tmp_path / "c.key"
    cert.write_text("x")
    key.write_text("y")
    with pytest.raises(InvalidArgumentError, match="magnetar\\+ssl://"):
        magnetar.aio.Client(
            "magnetar://localhost:6650",
            authentication=magnetar.aio.AuthenticationTLS(cert, key),
        )
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        magnetar.aio.AuthenticationTLS(tmp_path / "missing.pem", key)
    with pytest.raises(InvalidArgumentError, match="AuthenticationToken"):
        magnetar.aio.Client("magnetar://localhost:6650", authentication="a-token")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="empty"):
        magnetar.aio.AuthenticationToken("  ")
    with pytest.raises(InvalidConfigError, match="tls_certificate_file_path"):
        magnetar.aio.Client("magnetar+ssl://h", tls_private_key_file_path=str(key))
    assert "secret" not in repr(magnetar.aio.AuthenticationToken("secret"))


async def test_a_token_supplier_is_asked_each_time_and_may_be_a_coroutine() -> None:
    calls = 0

    def supplier() -> str:
        nonlocal calls
        calls += 1
        return f"token-{calls}"

    async def async_supplier() -> str:
        return "async-token"

    sync_auth = magnetar.aio.AuthenticationToken(supplier)
    assert [await sync_auth.token(), await sync_auth.token()] == ["token-1", "token-2"]
    assert await magnetar.aio.AuthenticationToken(async_supplier).token() == "async-token"

    def broken() -> str:
        raise RuntimeError("the vault is down: secret-in-message")

    with pytest.raises(AuthenticationExpiredError) as caught:
        await magnetar.aio.AuthenticationToken(broken).token()
    assert caught.value.retriable
    assert "secret-in-message" not in str(caught.value)
    with pytest.raises(AuthenticationError, match="returned no token"):
        await magnetar.aio.AuthenticationToken(lambda: "").token()
