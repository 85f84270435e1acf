"""The broker service's rules for producers: Pulsar's access modes (Shared, Exclusive,
WaitForExclusive, ExclusiveWithFencing) and the topic epoch, and deduplication of a chunked
message's chunks. A real :class:`Topic` over a managed ledger on in-memory ledgers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from broker.managed_ledger import ManagedLedger, ManagedLedgerConfig, ManagedLedgerFactory, Position
from broker.service.config import BrokerConfig
from broker.service.dedup import Deduplication
from broker.service.envelope import EnvelopeCodec, IncomingBatch, parse_envelope
from broker.service.topic import AccessMode, ProducerSession, Topic
from magnetar.common.errors import (
    ProducerBusyError,
    ProducerFencedError,
    ServiceNotReadyError,
)
from magnetar.common.names import parse_topic
from magnetar.testing.fake_ledgers import FakeBookies
from metadata import MetadataStore, open_store
from proto.format.v1 import entry_pb2

NAME = "public/default/access"
FAST = ManagedLedgerConfig(min_ledger_age_ms=0, cursor_persist_interval_ms=0)


class Broker:
    """What a broker keeps of one partition: its ledgers in a store, opened as a Topic."""

    def __init__(self) -> None:
        self.bookies = FakeBookies()
        self.store: MetadataStore | None = None
        self.factories: list[ManagedLedgerFactory] = []

    async def open(self) -> Topic:
        if self.store is None:
            self.store = await open_store("memory://")
        factory = ManagedLedgerFactory(
            self.store, self.bookies.client(), codec=EnvelopeCodec(), config=FAST
        )
        self.factories.append(factory)
        ml: ManagedLedger = await factory.open(NAME)
        dedup = Deduplication(self.store, NAME, ml, enabled=True, snapshot_interval=1000)
        await dedup.load()
        return Topic(
            parse_topic(NAME),
            ml,
            dedup,
            BrokerConfig(metadata="memory://"),
            on_fenced=lambda *_: None,
        )


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    broker = Broker()
    yield broker
    for factory in broker.factories:
        await factory.close()
    if broker.store is not None:
        await broker.store.close()


@pytest.fixture
async def topic(broker: Broker) -> AsyncIterator[Topic]:
    topic = await broker.open()
    yield topic
    await topic.close(ServiceNotReadyError("test over"), graceful=False)


def refused(session: ProducerSession) -> BaseException | None:
    return session.ready.exception() if session.ready.done() else None


# --- access modes -----------------------------------------------------------------------------


async def test_shared_producers_share_and_exclusive_is_fenced_while_any_is_there(
    topic: Topic,
) -> None:
    first = topic.add_producer("a")
    topic.add_producer("b")  # a Magnetar (gRPC) producer attaches this way: always shared
    assert first.ready.done()
    assert first.topic_epoch is None
    with pytest.raises(ProducerFencedError, match="2 other producer"):
        topic.add_producer("x", access_mode=AccessMode.EXCLUSIVE)
    assert set(topic.producers) == {"a", "b"}
    assert topic.exclusive_producer is None


async def test_an_exclusive_producer_keeps_everyone_else_out_until_it_leaves(topic: Topic) -> None:
    exclusive = topic.add_producer("x", access_mode=AccessMode.EXCLUSIVE)
    assert exclusive.ready.done()
    assert exclusive.topic_epoch == 0
    with pytest.raises(ProducerBusyError, match="exclusive producer \\('x'\\)"):
        topic.add_producer("shared")  # Pulsar's answer to a shared producer: ProducerBusy
    with pytest.raises(ProducerFencedError, match="exclusive producer \\('x'\\)"):
        topic.add_producer("y", access_mode=AccessMode.EXCLUSIVE)
    topic.remove_producer(exclusive)
    assert topic.exclusive_producer is None
    again = topic.add_producer("y", access_mode=AccessMode.EXCLUSIVE)
    assert again.topic_epoch == 1  # each grant raises the epoch


async def test_wait_for_exclusive_queues_until_the_topic_is_free(topic: Topic) -> None:
    shared = topic.add_producer("shared")
    first = topic.add_producer("w1", access_mode=AccessMode.WAIT_FOR_EXCLUSIVE)
    second = topic.add_producer("w2", access_mode=AccessMode.WAIT_FOR_EXCLUSIVE)
    assert not first.ready.done()
    assert not second.ready.done()
    assert "w1" not in topic.producers
    with pytest.raises(ProducerBusyError):
        topic.add_producer("late")  # shared producers wait behind the queue too
    # Pulsar promotes a waiter only when an exclusive producer leaves; here, when the last
    # producer of any mode does
    topic.remove_producer(shared)
    await asyncio.wait_for(first.ready, 1)
    assert topic.exclusive_producer is first
    assert first.topic_epoch == 0
    assert not second.ready.done()
    topic.remove_producer(first)
    await asyncio.wait_for(second.ready, 1)
    assert topic.exclusive_producer is second
    assert second.topic_epoch == 1


async def test_a_waiter_that_gives_up_leaves_the_queue(topic: Topic) -> None:
    holder = topic.add_producer("x", access_mode=AccessMode.EXCLUSIVE)
    waiter = topic.add_producer("w", access_mode=AccessMode.WAIT_FOR_EXCLUSIVE)
    topic.remove_producer(waiter)
    assert waiter.ready.cancelled()
    topic.remove_producer(holder)
    assert topic.exclusive_producer is None
    assert not topic.producers


async def test_exclusive_with_fencing_closes_the_others_and_takes_the_topic(topic: Topic) -> None:
    old = topic.add_producer("old", access_mode=AccessMode.EXCLUSIVE)
    waiter = topic.add_producer("w", access_mode=AccessMode.WAIT_FOR_EXCLUSIVE)
    fencer = topic.add_producer("new", access_mode=AccessMode.EXCLUSIVE_WITH_FENCING)
    assert fencer.ready.done()
    assert topic.exclusive_producer is fencer
    assert fencer.topic_epoch == 1
    assert isinstance(old.closed.result(), ProducerFencedError)
    assert isinstance(refused(waiter), ProducerFencedError)
    assert list(topic.producers) == ["new"]
    # the fenced producer reconnects with its old epoch: refused, the topic is taken
    with pytest.raises(ProducerFencedError):
        topic.add_producer("old", access_mode=AccessMode.EXCLUSIVE, topic_epoch=0)
    # the adapter removes the closed producer: nothing changes for the new one
    topic.remove_producer(old)
    assert topic.exclusive_producer is fencer


async def test_a_producer_with_an_older_epoch_was_replaced_and_is_fenced(topic: Topic) -> None:
    first = topic.add_producer("a", access_mode=AccessMode.EXCLUSIVE)
    topic.remove_producer(first)
    second = topic.add_producer("b", access_mode=AccessMode.EXCLUSIVE)
    topic.remove_producer(second)
    assert topic.topic_epoch == 1
    # "a" comes back (a reconnection) after "b" had the topic: fenced
    with pytest.raises(ProducerFencedError, match="epoch 0"):
        topic.add_producer("a", access_mode=AccessMode.EXCLUSIVE, topic_epoch=0)
    # "b" comes back with its own epoch: granted, keeping it
    back = topic.add_producer("b", access_mode=AccessMode.EXCLUSIVE, topic_epoch=1)
    assert back.topic_epoch == 1


async def test_the_epoch_lives_in_memory_a_new_owner_takes_the_producers(broker: Broker) -> None:
    topic = await broker.open()
    topic.add_producer("a", access_mode=AccessMode.EXCLUSIVE)
    topic.remove_producer(topic.add_producer("b", access_mode=AccessMode.EXCLUSIVE_WITH_FENCING))
    assert topic.topic_epoch == 1
    await topic.close(ServiceNotReadyError("moving"), graceful=True)
    moved = await broker.open()  # the partition's next owner
    assert moved.topic_epoch is None
    back = moved.add_producer("b", access_mode=AccessMode.EXCLUSIVE, topic_epoch=1)
    assert back.topic_epoch == 1
    assert back.topic.topic_epoch == 1  # the new owner took the producer's epoch
    await moved.close(ServiceNotReadyError("test over"), graceful=False)


async def test_closing_the_topic_refuses_its_waiters_with_the_reason(broker: Broker) -> None:
    topic = await broker.open()
    topic.add_producer("x", access_mode=AccessMode.EXCLUSIVE)
    waiter = topic.add_producer("w", access_mode=AccessMode.WAIT_FOR_EXCLUSIVE)
    await topic.close(ServiceNotReadyError("moving"), graceful=False)
    assert isinstance(refused(waiter), ServiceNotReadyError)
    with pytest.raises(ServiceNotReadyError):
        topic.add_producer("y", access_mode=AccessMode.WAIT_FOR_EXCLUSIVE)


# --- chunked messages -------------------------------------------------------------------------


def chunk(sequence_id: int, chunk_id: int, num_chunks: int, body: bytes = b"") -> IncomingBatch:
    return IncomingBatch(
        request_id=sequence_id,
        sequence_id=sequence_id,
        last_sequence_id=sequence_id,
        num_messages=1,
        batch=body or f"{sequence_id}/{chunk_id}".encode(),
        compression=0,
        uncompressed_size=0,
        format=entry_pb2.ENTRY_FORMAT_PULSAR,
        chunk_id=chunk_id,
        num_chunks=num_chunks,
    )


async def publish(
    topic: Topic, producer: ProducerSession, batch: IncomingBatch
) -> tuple[Position, bool]:
    receipt = await asyncio.wait_for(topic.publish(producer, batch), 5)
    return receipt.position, receipt.duplicate


async def stored_bodies(topic: Topic) -> list[bytes]:
    entries = await topic.ml.read(topic.ml.first_position, max_entries=100, max_bytes=1 << 20)
    return [parse_envelope(e.payload).batch for e in entries]


async def test_every_chunk_is_stored_and_the_message_deduplicated_at_its_last(topic: Topic) -> None:
    producer = topic.add_producer("p")
    positions = [(await publish(topic, producer, chunk(0, i, 3)))[0] for i in range(3)]
    assert len(set(positions)) == 3  # one sequence id, three entries
    assert topic.dedup.last_sequence_id("p") == 0
    # the whole message resent: answered from what is stored, nothing stored again
    again = [await publish(topic, producer, chunk(0, i, 3)) for i in range(3)]
    assert again == [(p, True) for p in positions]
    assert await stored_bodies(topic) == [b"0/0", b"0/1", b"0/2"]


async def test_a_partly_sent_message_resent_stores_each_chunk_once(topic: Topic) -> None:
    producer = topic.add_producer("p")
    first = await publish(topic, producer, chunk(5, 0, 3))
    second = await publish(topic, producer, chunk(5, 1, 3))
    # the producer reconnects having missed the second receipt: it resends from there
    topic.remove_producer(producer)
    producer = topic.add_producer("p")
    assert await publish(topic, producer, chunk(5, 1, 3)) == (second[0], True)
    last = await publish(topic, producer, chunk(5, 2, 3))
    assert not last[1]
    assert first[0] < second[0] < last[0]
    assert await stored_bodies(topic) == [b"5/0", b"5/1", b"5/2"]
    assert topic.dedup.last_sequence_id("p") == 5
    # the next message goes through
    assert not (await publish(topic, producer, chunk(6, 0, 2)))[1]


async def test_the_chunks_of_a_message_are_known_to_the_next_owner(broker: Broker) -> None:
    topic = await broker.open()
    producer = topic.add_producer("p")
    kept = await publish(topic, producer, chunk(9, 0, 3))
    await publish(topic, producer, chunk(9, 1, 3))
    await topic.close(ServiceNotReadyError("moving"), graceful=True)
    moved = await broker.open()  # replays the entries
    assert moved.dedup.last_sequence_id("p") == -1  # the message is not complete
    producer = moved.add_producer("p")
    assert await publish(moved, producer, chunk(9, 0, 3)) == (kept[0], True)
    assert not (await publish(moved, producer, chunk(9, 2, 3)))[1]
    assert moved.dedup.last_sequence_id("p") == 9
    assert await stored_bodies(moved) == [b"9/0", b"9/1", b"9/2"]
    await moved.close(ServiceNotReadyError("test over"), graceful=False)
