"""Self-clocking batching in the producer (``batching_self_clocking``), as Nagle's algorithm: a
batch goes at once when no small batch of its partition is in flight, batches grow behind one
that is, a full batch always goes, and ``batching_max_publish_delay_ms`` still bounds the wait.

A partition producer runs here without a broker: the test plays the stream's two ends (takes
what the sender would write, answers with receipts) and owns the loop's clock (timers fire only
when the test moves it), so every assertion is on the order of events, never on wall time.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from magnetar.aio.config import ClientConfig, ProducerConfig
from magnetar.aio.connection import ConnectionPool
from magnetar.aio.message_id import MessageId
from magnetar.aio.producer import Producer, _PartitionProducer, _PendingBatch
from magnetar.common.errors import TopicNotFoundError
from magnetar.common.grpc_errors import error_to_detail
from magnetar.common.names import parse_topic
from proto.broker.v1 import broker_pb2
from proto.common.v1 import types_pb2

LONG_DELAY_MS = 60_000.0
"""A batching delay the fake clock never reaches unless a test moves it that far."""


class FakeClock:
    """The running loop's clock, moved only by the test: a timer fires once the clock passes
    its time (the loop still waits for I/O on the real clock; nothing here does I/O)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.now = loop.time()

    def __call__(self) -> float:
        return self.now

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        await turns()


async def turns(count: int = 5) -> None:
    """Let the loop run a few iterations (what ``call_soon`` scheduled runs in the next)."""
    for _ in range(count):
        await asyncio.sleep(0)


class FakeStream:
    """A partition producer with nothing under it: the test takes the batches its sender would
    write and sends the receipts a broker would."""

    def __init__(self, **settings: Any) -> None:
        self.producer = Producer(
            topic=parse_topic("self-clocking"),
            config=ProducerConfig(**settings),
            client_config=ClientConfig(),
            pool=cast(ConnectionPool, None),  # never opened: the test is the broker
        )
        self.partition = _PartitionProducer(
            self.producer, partition_topic=self.producer.topic(), partition=-1, producer_name="p"
        )
        self.producer._partitions = [self.partition]
        self.partition.connected = True
        self.in_flight: list[_PendingBatch] = []
        self.sequence_ids: list[tuple[int, int]] = []
        self._next_entry = 0

    def written(self) -> list[int]:
        """The sizes of the batches written since the last call, in order."""
        unsent = self.partition._unsent
        taken = [unsent.popleft() for _ in range(len(unsent))]
        self.in_flight += taken
        self.sequence_ids += [(op.batch.sequence_id, op.batch.last_sequence_id) for op in taken]
        return [op.batch.num_messages for op in taken]

    def send(self, content: bytes) -> asyncio.Future[MessageId]:
        return self.producer.send_async(content)

    async def written_after_turns(self) -> list[int]:
        """:meth:`written` once the loop has run a few iterations."""
        await turns()
        return self.written()

    async def send_alone(self, content: bytes) -> asyncio.Future[MessageId]:
        """Send one message on an idle stream: it goes out alone (self-clocking)."""
        future = self.send(content)
        assert await self.written_after_turns() == [1]
        return future

    def confirm(self, count: int = 1) -> None:
        """Receipts for the ``count`` oldest batches in flight, in one stream message."""
        receipts = []
        for op in self.in_flight[:count]:
            receipts.append(
                broker_pb2.ProduceReceipt(
                    request_id=op.request_id,
                    message_id=types_pb2.MessageId(ledger_id=7, entry_id=self._next_entry),
                )
            )
            self._next_entry += 1
        del self.in_flight[:count]
        self.partition._on_receipts(receipts)

    def refuse_oldest(self) -> None:
        """A final error for the oldest batch in flight (its messages fail, the stream goes on)."""
        op = self.in_flight.pop(0)
        error = error_to_detail(TopicNotFoundError("gone"))
        self.partition._on_produce_error(
            broker_pb2.ProduceError(request_id=op.request_id, error=error)
        )

    def gathering(self) -> int:
        """Messages in the batch not sealed yet."""
        return len(self.partition._builder)

    def close(self) -> None:
        """Fail what is left, as a closing producer does; nobody awaits those futures."""
        parts = [part for op in self.partition._pending.values() for part in op.batch.parts]
        parts += self.partition._builder._parts
        self.partition._fail_everything(TopicNotFoundError("test over"))
        for handle, _count in parts:
            if isinstance(handle, tuple) and handle[0].done():
                handle[0].exception()  # retrieved: no "never retrieved" at exit


@pytest.fixture
async def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    loop = asyncio.get_running_loop()
    fake = FakeClock(loop)
    monkeypatch.setattr(loop, "time", fake)
    return fake


@pytest.fixture
async def stream_factory() -> Any:
    made: list[FakeStream] = []

    def make(**settings: Any) -> FakeStream:
        stream = FakeStream(**settings)
        made.append(stream)
        return stream

    yield make
    for stream in made:
        stream.close()


@pytest.fixture
async def stream(stream_factory: Any) -> FakeStream:
    """A stream whose batching delay the fake clock never reaches."""
    made: FakeStream = stream_factory(batching_max_publish_delay_ms=LONG_DELAY_MS)
    return made


async def test_an_idle_send_goes_out_in_the_next_loop_iteration(
    clock: FakeClock, stream: FakeStream
) -> None:
    future = stream.send(b"alone")
    assert stream.written() == []  # sealed with call_soon: a burst could still join it
    assert await stream.written_after_turns() == [1]
    stream.confirm()
    message_id = await future
    assert isinstance(message_id, MessageId)
    assert (message_id.ledger_id, message_id.entry_id, message_id.batch_index) == (7, 0, 0)
    assert stream.producer.pending_messages() == 0


async def test_without_self_clocking_an_idle_send_waits_out_the_delay(
    clock: FakeClock, stream_factory: Any
) -> None:
    stream = stream_factory(batching_max_publish_delay_ms=5, batching_self_clocking=False)
    stream.send(b"waits")
    assert await stream.written_after_turns() == []
    await clock.advance(0.004)
    assert stream.written() == []
    await clock.advance(0.002)
    assert stream.written() == [1]


async def test_a_burst_from_one_coroutine_shares_a_batch(
    clock: FakeClock, stream: FakeStream
) -> None:
    futures = [stream.send(f"m{i}".encode()) for i in range(5)]
    receipt = stream.producer.send_many_async([b"r1", b"r2"])
    assert await stream.written_after_turns() == [7]
    stream.confirm()
    ids = [await f for f in futures]
    assert [i.batch_index for i in ids] == [0, 1, 2, 3, 4]
    assert [i.batch_index for i in (await receipt).message_ids()] == [5, 6]


async def test_batches_grow_while_a_small_batch_is_in_flight(
    clock: FakeClock, stream: FakeStream
) -> None:
    first = await stream.send_alone(b"0")
    later = []
    for i in range(1, 4):  # one message per loop iteration, as separate senders would
        later.append(stream.send(str(i).encode()))
        await turns()
        assert stream.written() == []
        assert stream.gathering() == i
    stream.confirm()  # the receipt clocks out what gathered behind it
    await first
    assert await stream.written_after_turns() == [3]
    assert stream.gathering() == 0
    stream.confirm()
    assert [(await f).entry_id for f in later] == [1, 1, 1]
    # idle again: the next message goes at once, and sequence ids ran on without a gap
    await stream.send_alone(b"4")
    assert stream.sequence_ids == [(0, 0), (1, 3), (4, 4)]


async def test_senders_woken_by_a_receipt_join_the_batch_it_clocks_out(
    clock: FakeClock, stream: FakeStream
) -> None:
    """Closed-loop senders: each sends its next message once its last one is confirmed."""
    sent: list[int] = []

    async def sender(index: int) -> None:
        for round_ in range(2):
            await stream.producer.send(f"{index}-{round_}".encode())
            sent.append(index)

    senders = [asyncio.create_task(sender(i)) for i in range(3)]
    assert await stream.written_after_turns() == [3]  # the three first sends, one iteration
    stream.confirm()
    # all three woke on that receipt and sent again, in one loop iteration
    assert await stream.written_after_turns() == [3]
    stream.confirm()
    await asyncio.gather(*senders)
    assert sorted(sent) == [0, 0, 1, 1, 2, 2]


async def test_a_full_batch_goes_at_once_while_a_small_one_is_in_flight(
    clock: FakeClock, stream_factory: Any
) -> None:
    stream = stream_factory(batching_max_messages=3, batching_max_publish_delay_ms=LONG_DELAY_MS)
    await stream.send_alone(b"small")
    for i in range(4):
        stream.send(str(i).encode())
    assert stream.written() == [3]  # full: sealed as it filled, not waiting for the receipt
    assert await stream.written_after_turns() == []  # the fourth waits behind the small batch
    stream.confirm()  # the small one: the full one is still in flight
    assert await stream.written_after_turns() == [1]


async def test_full_batches_in_flight_do_not_hold_back_the_next_one(
    clock: FakeClock, stream_factory: Any
) -> None:
    stream = stream_factory(batching_max_messages=3, batching_max_publish_delay_ms=LONG_DELAY_MS)
    stream.producer.send_many_async([b"a", b"b", b"c", b"d", b"e", b"f"])
    assert stream.written() == [3, 3]
    stream.send(b"g")
    # only a small batch in flight holds the next one back
    assert await stream.written_after_turns() == [1]


async def test_the_delay_still_bounds_a_batch_behind_one_in_flight(
    clock: FakeClock, stream_factory: Any
) -> None:
    stream = stream_factory(batching_max_publish_delay_ms=5)
    await stream.send_alone(b"first")
    stream.send(b"second")
    await clock.advance(0.003)
    stream.send(b"third")
    await clock.advance(0.001)
    assert stream.written() == []
    await clock.advance(0.0015)  # 5 ms after "second", no receipt yet
    assert stream.written() == [2]
    # two small batches in flight now: the next batch waits for the receipt of the later one
    stream.send(b"fourth")
    stream.confirm()
    assert await stream.written_after_turns() == []
    stream.confirm()
    assert await stream.written_after_turns() == [1]


async def test_a_refused_small_batch_clocks_out_the_next_too(
    clock: FakeClock, stream: FakeStream
) -> None:
    refused = await stream.send_alone(b"refused")
    after = stream.send(b"after")
    assert await stream.written_after_turns() == []
    stream.refuse_oldest()
    with pytest.raises(TopicNotFoundError):
        await refused
    assert await stream.written_after_turns() == [1]
    stream.confirm()
    assert (await after).batch_index == 0


async def test_flush_sends_what_gathers_behind_a_batch_in_flight(
    clock: FakeClock, stream: FakeStream
) -> None:
    await stream.send_alone(b"in flight")
    stream.send(b"gathering")
    flushed = asyncio.ensure_future(stream.producer.flush())
    assert await stream.written_after_turns() == [1]
    assert not flushed.done()
    stream.confirm(2)
    await asyncio.wait_for(flushed, 10)
