"""The real ``pulsar-client`` from PyPI (its C++ core) against a Magnetar standalone: producer
access modes (Exclusive, WaitForExclusive, ExclusiveWithFencing, beside Magnetar's own shared
producers) and chunked messages larger than the broker's ``max_message_bytes``.

The Pulsar client is synchronous: it is called from a thread (``run``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import pulsar  # the real pulsar-client from PyPI (its C++ core)
import pytest
import pytest_asyncio

import magnetar
import magnetar.aio
from magnetar.common.errors import ProducerBusyError
from magnetar.testing import StandaloneNode

T = TypeVar("T")

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_MESSAGE_BYTES = 5_226_496
"""The broker's default ``max_message_bytes``, which CONNECTED tells the client: it sends a
message larger than that in chunks of that size."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def standalone(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StandaloneNode]:
    async with StandaloneNode(
        tmp_path_factory.mktemp("exclusive") / "data",
        bookies=1,
    ) as node:
        yield node


@pytest.fixture(scope="module")
def client(standalone: StandaloneNode) -> Iterator[pulsar.Client]:
    client = pulsar.Client(
        standalone.pulsar_url,
        operation_timeout_seconds=15,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    yield client
    client.close()


async def run(step: Callable[[], T]) -> T:
    return await asyncio.to_thread(step)


def topic_name(what: str) -> str:
    return f"persistent://public/default/{what}-{uuid.uuid4().hex[:8]}"


def nothing_more(consumer: pulsar.Consumer, wait_ms: int = 500) -> bool:
    try:
        message = consumer.receive(wait_ms)
    except pulsar.Timeout:
        return True
    print(f"unexpected: {len(message.data())} bytes, {message.message_id()}")
    return False


async def refused_send(native: magnetar.aio.Client, topic: str) -> None:
    producer = await native.create_producer(topic)
    await producer.send(b"refused")


# --- access modes -----------------------------------------------------------------------------


async def test_exclusive_is_refused_while_another_producer_is_there_and_keeps_others_out(
    client: pulsar.Client,
) -> None:
    topic = topic_name("exclusive")
    shared = await run(lambda: client.create_producer(topic))
    with pytest.raises(pulsar.ProducerFenced):
        await run(
            lambda: client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
        )
    await run(shared.close)
    exclusive = await run(
        lambda: client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    )
    with pytest.raises(pulsar.ProducerBusy):
        await run(lambda: client.create_producer(topic))  # a shared one
    with pytest.raises(pulsar.ProducerFenced):
        await run(
            lambda: client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
        )
    await run(lambda: exclusive.send(b"alone"))
    await run(exclusive.close)


async def test_magnetar_producers_are_shared_they_block_and_are_blocked_by_exclusive_ones(
    client: pulsar.Client, standalone: StandaloneNode
) -> None:
    topic = topic_name("grpc-shared")
    async with magnetar.aio.Client(standalone.service_url) as native:
        producer = await native.create_producer(topic)
        await producer.send(b"native")
        with pytest.raises(pulsar.ProducerFenced):
            await run(
                lambda: client.create_producer(
                    topic, access_mode=pulsar.ProducerAccessMode.Exclusive
                )
            )
        await producer.close()
        exclusive = await run(
            lambda: client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
        )
        with pytest.raises(ProducerBusyError, match="exclusive producer"):
            await refused_send(native, topic)
        await run(exclusive.close)


async def test_wait_for_exclusive_gets_the_topic_when_the_first_closes(
    client: pulsar.Client,
) -> None:
    topic = topic_name("wait")
    first = await run(
        lambda: client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    )
    created = threading.Event()
    waiting: list[Any] = []

    def create_waiting() -> None:
        waiting.append(
            client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.WaitForExclusive)
        )
        created.set()

    waiter = asyncio.ensure_future(run(create_waiting))
    # queued behind the first (told producer_ready=false): nothing comes while it holds
    assert not await run(lambda: created.wait(1.0))
    await run(lambda: first.send(b"first"))
    await run(first.close)
    await asyncio.wait_for(waiter, 15)
    second = waiting[0]
    await run(lambda: second.send(b"second"))
    consumer = await run(
        lambda: client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    )
    got = await run(lambda: [consumer.receive(10_000).data() for _ in range(2)])
    assert got == [b"first", b"second"]
    await run(second.close)
    await run(consumer.close)


async def test_exclusive_with_fencing_fences_the_first_producer(client: pulsar.Client) -> None:
    topic = topic_name("fencing")
    first = await run(
        lambda: client.create_producer(
            topic, access_mode=pulsar.ProducerAccessMode.Exclusive, send_timeout_millis=10_000
        )
    )
    await run(lambda: first.send(b"from the first"))
    fencer = await run(
        lambda: client.create_producer(
            topic, access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing
        )
    )
    await run(lambda: fencer.send(b"from the fencer"))

    with pytest.raises(pulsar.ProducerFenced):
        # closed by the broker, the first producer comes back and is told it is fenced; a
        # send meanwhile waits for that answer and fails with it
        await run(lambda: first.send(b"too late"))
    with pytest.raises(pulsar.ProducerFenced):
        await run(lambda: first.send(b"still too late"))  # fenced is final
    consumer = await run(
        lambda: client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    )
    got = await run(lambda: [consumer.receive(10_000).data() for _ in range(2)])
    assert got == [b"from the first", b"from the fencer"]
    assert await run(lambda: nothing_more(consumer))
    await run(fencer.close)
    await run(consumer.close)


# --- chunked messages -------------------------------------------------------------------------


async def test_chunked_messages_reach_exclusive_and_shared_consumers_whole(
    client: pulsar.Client,
) -> None:
    topic = topic_name("chunked")
    exclusive = await run(
        lambda: client.subscribe(
            topic, "exclusive", initial_position=pulsar.InitialPosition.Earliest
        )
    )
    shared = await run(
        lambda: client.subscribe(
            topic,
            "shared",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
        )
    )
    producer = await run(
        lambda: client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    )
    big = [os.urandom(2 * MAX_MESSAGE_BYTES + 12345), os.urandom(MAX_MESSAGE_BYTES + 1)]
    sent = [big[0], b"small between", big[1]]
    for payload in sent:
        await run(lambda payload=payload: producer.send(payload, properties={"n": "1"}))  # type: ignore[misc]

    def receive_all(consumer: pulsar.Consumer) -> list[bytes]:
        got = []
        for _ in sent:
            message = consumer.receive(15_000)
            assert message.properties() == {"n": "1"}
            consumer.acknowledge(message)  # a chunked message's id names all its chunks
            got.append(message.data())
        assert nothing_more(consumer)
        return got

    assert await run(lambda: receive_all(exclusive)) == sent
    assert await run(lambda: receive_all(shared)) == sent
    await run(exclusive.close)
    # acknowledged whole: a new consumer of the subscription gets nothing again
    again = await run(
        lambda: client.subscribe(
            topic, "exclusive", initial_position=pulsar.InitialPosition.Earliest
        )
    )
    assert await run(lambda: nothing_more(again, 1000))
    for consumer in (again, shared):
        await run(consumer.close)
    await run(producer.close)


@pytest.mark.parametrize("codec", ["LZ4", "ZSTD"])
async def test_compressed_chunked_messages_are_stored_unopened_and_come_whole(
    client: pulsar.Client, codec: str
) -> None:
    # random bytes do not compress: the compressed message is over the limit and is cut, each
    # chunk declaring the codec and the whole message's size (neither of which a chunk alone
    # can be checked against)
    topic = topic_name(f"chunked-{codec.lower()}")
    consumer = await run(
        lambda: client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    )
    producer = await run(
        lambda: client.create_producer(
            topic,
            chunking_enabled=True,
            batching_enabled=False,
            compression_type=getattr(pulsar.CompressionType, codec),
        )
    )
    sent = [os.urandom(MAX_MESSAGE_BYTES + 4321), b"small" * 1000]
    for payload in sent:
        await run(lambda payload=payload: producer.send(payload))  # type: ignore[misc]

    def receive_all() -> list[bytes]:
        got = []
        for _ in sent:
            message = consumer.receive(15_000)
            consumer.acknowledge(message)
            got.append(message.data())
        assert nothing_more(consumer)
        return got

    assert await run(receive_all) == sent
    await run(consumer.close)
    await run(producer.close)


async def test_chunked_messages_resent_across_an_unload_come_once(
    client: pulsar.Client, standalone: StandaloneNode
) -> None:
    topic = topic_name("chunked-moves")
    producer = await run(
        lambda: client.create_producer(
            topic, chunking_enabled=True, batching_enabled=False, send_timeout_millis=60_000
        )
    )
    payloads = [os.urandom(MAX_MESSAGE_BYTES + 1000 * i) for i in range(1, 7)]
    done: list[Any] = []
    errors: list[Any] = []

    def send_all() -> None:
        for payload in payloads:
            producer.send_async(
                payload,
                lambda result, _id: (done if result == pulsar.Result.Ok else errors).append(result),
            )

    await run(send_all)
    admin = magnetar.AdminClient(standalone.service_url)
    try:
        await asyncio.to_thread(admin.unload_topic, topic)  # while chunks are on their way
    finally:
        await asyncio.to_thread(admin.close)
    await run(producer.flush)
    assert errors == []
    assert len(done) == len(payloads)
    # subscribed now, the consumer reads what is stored: each message once, whole
    consumer = await run(
        lambda: client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    )

    def receive_all() -> list[bytes]:
        got = []
        for _ in payloads:
            message = consumer.receive(20_000)
            consumer.acknowledge(message)
            got.append(message.data())
        assert nothing_more(consumer, 1000)
        return got

    assert await run(receive_all) == payloads
    await run(producer.close)
    await run(consumer.close)
