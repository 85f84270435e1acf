"""A corrupt entry never takes a consumer down or holds its backlog back (issue 23, finding 10):
the client inflates no batch past its declared size, and discards what it cannot decode with a
warning and a count, acknowledging it as Pulsar's client does."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

import pytest

from magnetar.aio import Client
from magnetar.aio.codec import decompress
from magnetar.common.errors import CorruptionError
from proto.broker.v1 import broker_pb2 as pb
from proto.common.v1 import types_pb2
from tests.unit.aio.fake_broker import FakeCluster

ZLIB = types_pb2.COMPRESSION_TYPE_ZLIB


def test_a_batch_inflates_to_exactly_its_declared_size() -> None:
    raw = b"abc" * 1000
    assert decompress(zlib.compress(raw), ZLIB, len(raw)) == raw


@pytest.mark.parametrize(
    ("data", "declared", "says"),
    [
        # a zlib bomb: 256 MiB of zeros in about 255 KiB, declared small
        (zlib.compress(bytes(256 * 1024 * 1024), 9), 1000, "inflates past its declared 1000"),
        # declared as large as it really is, but larger than any batch can be
        (zlib.compress(bytes(65 * 1024 * 1024), 9), 65 * 1024 * 1024, "between 1 and"),
        (zlib.compress(b"x" * 100), 0, "between 1 and"),
        (zlib.compress(b"x" * 100), 150, "not its declared 150"),  # the size lies low
        (zlib.compress(b"x" * 100)[:-6], 100, "not its declared 100"),  # truncated
        (zlib.compress(b"x" * 100) + b"trailing", 100, "does not end"),
        (b"\x00not zlib at all", 100, "does not decompress"),
    ],
)
def test_a_batch_that_lies_is_refused_without_inflating_it(
    data: bytes, declared: int, says: str
) -> None:
    with pytest.raises(CorruptionError, match=says):
        decompress(data, ZLIB, declared)


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    fake = await FakeCluster().start(brokers=1)
    yield fake
    await fake.stop()


async def test_a_consumer_discards_a_corrupt_entry_and_reads_on(cluster: FakeCluster) -> None:
    """The stored entry (as a buggy producer or broker could have written it) is logged,
    acknowledged and counted; the messages after it arrive, and the backlog drains."""
    cluster.create_topic("bombed")
    partition = cluster.partition("bombed")
    async with Client(cluster.service_url, operation_timeout_s=10) as client:
        consumer = await client.subscribe("bombed", "s", initial_position="earliest")
        producer = await client.create_producer("bombed")
        await producer.send(b"before")
        bomb = zlib.compress(bytes(64 * 1024 * 1024), 9)
        stored = partition.append(
            "buggy",
            pb.ProduceBatch(
                sequence_id=1,
                last_sequence_id=1,
                num_messages=1,
                compression=ZLIB,
                uncompressed_size=100,
                batch=bomb,
            ),
            cluster.now_ms(),
        )
        await producer.send(b"after")
        got = [(await consumer.receive(timeout_millis=5000)).data() for _ in range(2)]
        assert got == [b"before", b"after"]
        assert consumer.discarded_corrupt_entries() == 1
        await consumer.close()  # flushes the grouped acks
        subscription = partition.subscriptions["s"]
        assert (stored.ledger_id, stored.entry_id) in subscription.acked
