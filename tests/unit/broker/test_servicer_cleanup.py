"""A stream that ends right after it opened still lets go of its consumer or producer.

gRPC ends a stream whose client went away by closing the handler's generator where it stands.
If that is the ``yield`` of the first answer (subscribed, opened), code after it never runs: a
consumer left attached would hold an exclusive subscription and the permits it was given, a
producer its name. These tests close the generators at exactly that point, on a broker service
faked down to what the handlers touch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from broker.grpc.servicer import BrokerServicer
from broker.service.config import BrokerConfig
from proto.broker.v1 import broker_pb2 as pb
from proto.common.v1 import types_pb2


class FakeContext:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


@dataclass
class FakeCredentials:
    closed: bool = False

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeSecurity:
    streams: list[FakeCredentials] = field(default_factory=list)

    def authenticate(self, credentials: object) -> object:
        return object()

    async def authorize_topic(self, principal: object, action: object, name: object) -> None:
        return None

    def stream(self, *args: object, **kwargs: object) -> FakeCredentials:
        credentials = FakeCredentials()
        self.streams.append(credentials)
        return credentials


@dataclass
class FakeTopicName:
    partition: int = -1


@dataclass
class FakeTopicOfSubscription:
    name: FakeTopicName = field(default_factory=FakeTopicName)


@dataclass
class FakeSubscription:
    name: str
    topic: FakeTopicOfSubscription = field(default_factory=FakeTopicOfSubscription)


class FakeConsumer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.subscription = FakeSubscription("s")
        self.events: asyncio.Queue[object] = asyncio.Queue()
        self.detached = 0
        self.permits = 0
        self.unacked_messages = 0
        self.buffered_bytes = 0
        self.msgs_out = 0

    def detach(self) -> None:
        self.detached += 1

    def close_with(self, reason: object) -> None:
        return None


class FakeProducer:
    last_sequence_id = -1

    def __init__(self) -> None:
        self.closed: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    def close_with(self, reason: object) -> None:
        return None


class FakeTopic:
    max_redelivery_count = 0

    def __init__(self) -> None:
        self.consumers: list[FakeConsumer] = []
        self.producers: list[FakeProducer] = []
        self.removed: list[FakeProducer] = []

    async def subscribe(self, request: Any, address: str) -> FakeConsumer:
        consumer = FakeConsumer(request.consumer_name)
        self.consumers.append(consumer)
        return consumer

    def add_producer(self, name: str, address: str) -> FakeProducer:
        producer = FakeProducer()
        self.producers.append(producer)
        return producer

    def remove_producer(self, producer: FakeProducer) -> None:
        self.removed.append(producer)


class FakeBroker:
    broker_id = "b1"
    start_time_ms = 0

    def __init__(self) -> None:
        self.config = BrokerConfig(metadata="memory://")
        self.security = FakeSecurity()
        self.topic = FakeTopic()

    async def open_topic(self, name: object) -> FakeTopic:
        return self.topic


async def requests(*items: object) -> AsyncIterator[Any]:
    for item in items:
        yield item
    await asyncio.Event().wait()  # the client keeps its side open


async def test_a_consume_stream_closed_at_its_first_answer_detaches_its_consumer() -> None:
    broker = FakeBroker()
    servicer = BrokerServicer(broker)  # type: ignore[arg-type]
    subscribe = pb.ConsumeRequest(
        subscribe=pb.Subscribe(
            topic="t",
            subscription="s",
            consumer_name="c",
            subscription_type=types_pb2.SUBSCRIPTION_TYPE_EXCLUSIVE,
            start=types_pb2.StartPosition(initial=types_pb2.INITIAL_POSITION_EARLIEST),
        )
    )
    stream = cast(
        AsyncGenerator[pb.ConsumeResponse],
        servicer.Consume(requests(subscribe), FakeContext()),  # type: ignore[arg-type]
    )
    first = await anext(stream)
    assert first.WhichOneof("kind") == "subscribed"
    [consumer] = broker.topic.consumers
    assert consumer.detached == 0
    await stream.aclose()  # what gRPC does when the client goes away here
    assert consumer.detached == 1


async def test_a_produce_stream_closed_at_its_first_answer_removes_its_producer() -> None:
    broker = FakeBroker()
    servicer = BrokerServicer(broker)  # type: ignore[arg-type]
    open_request = pb.ProduceRequest(open=pb.ProducerOpen(topic="t", producer_name="p"))
    stream = cast(
        AsyncGenerator[pb.ProduceResponse],
        servicer.Produce(requests(open_request), FakeContext()),  # type: ignore[arg-type]
    )
    first = await anext(stream)
    assert first.WhichOneof("kind") == "opened"
    [producer] = broker.topic.producers
    assert broker.topic.removed == []
    await stream.aclose()
    assert broker.topic.removed == [producer]


async def test_a_consume_stream_that_runs_and_ends_closes_its_credentials() -> None:
    broker = FakeBroker()
    servicer = BrokerServicer(broker)  # type: ignore[arg-type]
    subscribe = pb.ConsumeRequest(
        subscribe=pb.Subscribe(
            topic="t",
            subscription="s",
            consumer_name="c",
            subscription_type=types_pb2.SUBSCRIPTION_TYPE_EXCLUSIVE,
            start=types_pb2.StartPosition(initial=types_pb2.INITIAL_POSITION_EARLIEST),
        )
    )
    close = pb.ConsumeRequest(close=pb.ConsumerClose())

    async def then_close() -> AsyncIterator[Any]:
        yield subscribe
        yield close

    answers = [a async for a in servicer.Consume(then_close(), FakeContext())]  # type: ignore[arg-type]
    assert [a.WhichOneof("kind") for a in answers] == ["subscribed"]
    [consumer] = broker.topic.consumers
    assert consumer.detached == 1
    [credentials] = broker.security.streams
    assert credentials.closed
