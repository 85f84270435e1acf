"""An in-process fake of the broker protocol, for the client's reconnect and flow-control tests.

Real grpc.aio servers on port 0 speak ``proto/magnetar/broker/v1/broker.proto`` over an in-memory
store: topics, partitions, entries in ledgers (a new ledger on every ownership change, as the real
broker rolls on failover), producer deduplication by (name, sequence id), durable exclusive
subscriptions with individual and cumulative acks, non-durable readers, permits counted in
messages, seeks. Tests move partitions between brokers (the old owner closes its streams, as a
broker does when a partition moves) and kill brokers outright (``server.stop(0)``).

It is small on purpose: no shared/failover/key_shared dispatch, no dead-letter topics, no
durability. System tests run the client against real brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from magnetar.common.errors import (
    ConsumerBusyError,
    MagnetarError,
    ProducerBusyError,
    ServiceNotReadyError,
    TopicNotFoundError,
    TopicNotOwnedError,
)
from magnetar.common.grpc_errors import abort_with, error_to_detail
from proto.broker.v1 import broker_pb2 as pb
from proto.broker.v1 import broker_pb2_grpc
from proto.common.v1 import types_pb2
from proto.format.v1 import entry_pb2

_CLOSE = object()
_WAKE = object()


@dataclass
class Stored:
    ledger_id: int
    entry_id: int
    envelope: bytes
    num_messages: int
    first_offset: int
    publish_time_ms: int
    producer_name: str
    last_sequence_id: int


@dataclass
class Subscription:
    name: str
    durable: bool
    acked: set[tuple[int, int]] = field(default_factory=set)
    read_index: int = 0
    attached: bool = False
    redeliveries: dict[tuple[int, int], int] = field(default_factory=dict)
    replay: list[int] = field(default_factory=list)


@dataclass
class Partition:
    name: str
    index: int
    owner: int
    ledger_id: int
    next_entry_id: int = 0
    next_offset: int = 0
    entries: list[Stored] = field(default_factory=list)
    last_sequence: dict[str, int] = field(default_factory=dict)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    streams: set[asyncio.Queue[Any]] = field(default_factory=set)
    producers: set[str] = field(default_factory=set)

    def append(self, producer_name: str, batch: pb.ProduceBatch, now_ms: int) -> Stored:
        envelope = entry_pb2.EntryEnvelope(
            format_version=1,
            producer_name=producer_name,
            sequence_id=batch.sequence_id,
            last_sequence_id=batch.last_sequence_id,
            num_messages=batch.num_messages,
            publish_time_ms=now_ms,
            first_offset=self.next_offset,
            compression=batch.compression,
            uncompressed_size=batch.uncompressed_size,
            batch=batch.batch,
        ).SerializeToString()
        stored = Stored(
            self.ledger_id,
            self.next_entry_id,
            envelope,
            batch.num_messages,
            self.next_offset,
            now_ms,
            producer_name,
            batch.last_sequence_id,
        )
        self.entries.append(stored)
        self.next_entry_id += 1
        self.next_offset += batch.num_messages
        self.last_sequence[producer_name] = batch.last_sequence_id
        for stream in self.streams:
            stream.put_nowait(_WAKE)
        return stored

    def index_of(self, position: tuple[int, int]) -> int:
        """Index of the first entry at or after ``position``."""
        for i, stored in enumerate(self.entries):
            if (stored.ledger_id, stored.entry_id) >= position:
                return i
        return len(self.entries)

    def close_streams(self, reason: MagnetarError) -> None:
        for stream in self.streams:
            stream.put_nowait((_CLOSE, reason))


class FakeCluster:
    """Brokers sharing one in-memory store of topics."""

    def __init__(self) -> None:
        self.topics: dict[str, int] = {}
        self.partitions: dict[str, Partition] = {}
        self.servers: list[grpc.aio.Server | None] = []
        self.ports: list[int] = []
        self._ledger_ids = itertools.count(100)
        self._names = itertools.count(1)
        self.clock_ms = 1_700_000_000_000
        self.produce_messages = 0
        """ProduceSend stream messages received, over every broker."""
        self.lookups_refused = False
        self.drop_receipts = False
        """Store batches but send no receipts (as if the broker died before answering)."""
        self.refuse_next_batch: MagnetarError | None = None
        """Answer the next batch with a ProduceError carrying this error."""
        self.write_problem: MagnetarError | None = None
        """Tell producers on opening that batches wait, and why (ProduceStalled)."""

    async def start(self, brokers: int = 2) -> FakeCluster:
        for index in range(brokers):
            server = grpc.aio.server()
            broker_pb2_grpc.add_BrokerServiceServicer_to_server(FakeBroker(self, index), server)
            self.ports.append(server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            self.servers.append(server)
        return self

    async def stop(self) -> None:
        for server in self.servers:
            if server is not None:
                await server.stop(None)

    @property
    def service_url(self) -> str:
        return "magnetar://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def broker_url(self, index: int) -> str:
        return f"magnetar://127.0.0.1:{self.ports[index]}"

    def create_topic(self, name: str, partitions: int = 0, owner: int = 0) -> None:
        full = name if "/" in name else f"public/default/{name}"
        self.topics[full] = partitions
        names = [full] if partitions == 0 else [f"{full}-partition-{i}" for i in range(partitions)]
        for i, partition in enumerate(names):
            self.partitions[partition] = Partition(
                partition, i if partitions else -1, owner, next(self._ledger_ids)
            )

    def partition(self, name: str) -> Partition:
        full = name if "/" in name else f"public/default/{name}"
        return self.partitions[full]

    def delete_topic(self, name: str) -> None:
        full = name if "/" in name else f"public/default/{name}"
        del self.topics[full]
        for partition in [p for p in self.partitions if p == full or p.startswith(f"{full}-")]:
            self.partitions.pop(partition).close_streams(TopicNotFoundError(f"{full} was deleted"))

    def move(self, partition: str, to: int) -> None:
        """Hand a partition to another broker: a new ledger, the old owner's streams closed."""
        p = self.partition(partition)
        p.owner = to
        p.ledger_id = next(self._ledger_ids)
        p.next_entry_id = 0
        p.producers.clear()
        p.close_streams(ServiceNotReadyError(f"{p.name} moved to broker {to}"))

    async def kill(self, index: int) -> None:
        """Stop a broker abruptly; its partitions go to the next live broker."""
        server = self.servers[index]
        assert server is not None
        self.servers[index] = None
        live = [i for i, s in enumerate(self.servers) if s is not None]
        for p in self.partitions.values():
            if p.owner == index:
                p.owner = live[0]
                p.ledger_id = next(self._ledger_ids)
                p.next_entry_id = 0
                p.producers.clear()
        for p in self.partitions.values():
            for sub in p.subscriptions.values():
                sub.attached = False
        await server.stop(0)

    def now_ms(self) -> int:
        self.clock_ms += 1
        return self.clock_ms

    def new_producer_name(self) -> str:
        return f"fake-producer-{next(self._names)}"


class FakeBroker(broker_pb2_grpc.BrokerServiceServicer):
    def __init__(self, cluster: FakeCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index

    async def Lookup(  # noqa: N802 - the protocol's method name
        self, request: pb.LookupRequest, context: Any
    ) -> pb.LookupResponse:
        cluster = self.cluster
        if cluster.lookups_refused:
            await abort_with(context, ServiceNotReadyError("the cluster is starting"))
        name = request.topic if "/" in request.topic else f"public/default/{request.topic}"
        if name in cluster.partitions and cluster.topics.get(name) is None:
            names = [name]  # one partition, looked up on its own
            partitions = 0
        elif name in cluster.topics:
            partitions = cluster.topics[name]
            names = (
                [name] if partitions == 0 else [f"{name}-partition-{i}" for i in range(partitions)]
            )
        else:
            await abort_with(context, TopicNotFoundError(f"no topic {name}"))
            raise AssertionError("unreachable")
        owners = []
        for partition_name in names:
            p = cluster.partitions[partition_name]
            owners.append(
                pb.PartitionOwner(
                    partition_topic=p.name,
                    partition=p.index,
                    broker_url=cluster.broker_url(p.owner),
                    broker_id=f"broker-{p.owner}",
                )
            )
        return pb.LookupResponse(topic=name, partitions=partitions, owners=owners)

    def _partition(self, topic: str) -> Partition:
        p = self.cluster.partitions.get(topic)
        if p is None:
            raise TopicNotFoundError(f"no topic {topic}")
        if p.owner != self.index:
            raise TopicNotOwnedError(f"broker {self.index} does not own {topic}")
        return p

    @staticmethod
    async def _pump(requests: AsyncIterator[Any], events: asyncio.Queue[Any]) -> None:
        with contextlib.suppress(Exception):
            async for request in requests:
                events.put_nowait(request)
        events.put_nowait(None)

    async def Produce(  # noqa: N802 - the protocol's method name
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[pb.ProduceResponse]:
        first = await anext(aiter(request_iterator))
        try:
            p = self._partition(first.open.topic)
            name = first.open.producer_name or self.cluster.new_producer_name()
            if name in p.producers:
                raise ProducerBusyError(f"{name} is connected to {p.name}")
        except MagnetarError as e:
            yield pb.ProduceResponse(closed=pb.ProducerClosed(reason=error_to_detail(e)))
            return
        p.producers.add(name)
        events: asyncio.Queue[Any] = asyncio.Queue()
        p.streams.add(events)
        pump = asyncio.create_task(self._pump(request_iterator, events))
        try:
            yield pb.ProduceResponse(
                opened=pb.ProducerOpened(
                    producer_name=name,
                    topic=p.name,
                    last_sequence_id=p.last_sequence.get(name, -1),
                    max_message_bytes=1024 * 1024,
                )
            )
            if self.cluster.write_problem is not None:
                problem = error_to_detail(self.cluster.write_problem)
                yield pb.ProduceResponse(stalled=pb.ProduceStalled(problem=problem))
            while True:
                event = await events.get()
                if event is None:
                    return
                if event is _WAKE:
                    continue
                if isinstance(event, tuple) and event[0] is _CLOSE:
                    reason = error_to_detail(event[1])
                    yield pb.ProduceResponse(closed=pb.ProducerClosed(reason=reason))
                    return
                if event.WhichOneof("kind") != "send":
                    return
                self.cluster.produce_messages += 1
                receipts = pb.ProduceReceipts()
                refusals: list[pb.ProduceResponse] = []
                for batch in event.send.batches:
                    if self.cluster.refuse_next_batch is not None:
                        error = error_to_detail(self.cluster.refuse_next_batch)
                        self.cluster.refuse_next_batch = None
                        refusals.append(
                            pb.ProduceResponse(
                                error=pb.ProduceError(request_id=batch.request_id, error=error)
                            )
                        )
                        continue
                    duplicate = batch.last_sequence_id <= p.last_sequence.get(name, -1)
                    if duplicate:
                        stored = next(
                            (
                                s
                                for s in p.entries
                                if s.producer_name == name
                                and s.last_sequence_id == batch.last_sequence_id
                            ),
                            None,
                        )
                    else:
                        stored = p.append(name, batch, self.cluster.now_ms())
                    receipts.receipts.add(
                        request_id=batch.request_id,
                        sequence_id=batch.sequence_id,
                        last_sequence_id=batch.last_sequence_id,
                        message_id=types_pb2.MessageId(
                            ledger_id=stored.ledger_id if stored else -1,
                            entry_id=stored.entry_id if stored else -1,
                            batch_index=-1,
                            partition=p.index,
                        ),
                        first_offset=stored.first_offset if stored else -1,
                        publish_time_ms=stored.publish_time_ms if stored else 0,
                        duplicate=duplicate,
                    )
                for refusal in refusals:
                    yield refusal
                if not self.cluster.drop_receipts and receipts.receipts:
                    yield pb.ProduceResponse(receipts=receipts)
        finally:
            pump.cancel()
            p.streams.discard(events)
            p.producers.discard(name)

    async def Consume(  # noqa: N802 - the protocol's method name
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[pb.ConsumeResponse]:
        first = await anext(aiter(request_iterator))
        request = first.subscribe
        try:
            p = self._partition(request.topic)
            sub = p.subscriptions.get(request.subscription)
            if sub is None or not request.durable:
                sub = Subscription(request.subscription, request.durable)
                sub.read_index = self._resolve(p, request.start)
                p.subscriptions[request.subscription] = sub
            elif sub.attached:
                raise ConsumerBusyError(f"{request.subscription} on {p.name} has its consumer")
            else:
                sub.read_index = 0  # back to the first unacknowledged entry
        except MagnetarError as e:
            yield pb.ConsumeResponse(closed=pb.ConsumerClosed(reason=error_to_detail(e)))
            return
        sub.attached = True
        events: asyncio.Queue[Any] = asyncio.Queue()
        p.streams.add(events)
        pump = asyncio.create_task(self._pump(request_iterator, events))
        permits = 0
        try:
            yield pb.ConsumeResponse(
                subscribed=pb.Subscribed(
                    topic=p.name, subscription=sub.name, consumer_name=request.consumer_name
                )
            )
            while True:
                event = await events.get()
                if event is None:
                    return
                if isinstance(event, tuple) and event[0] is _CLOSE:
                    reason = error_to_detail(event[1])
                    yield pb.ConsumeResponse(closed=pb.ConsumerClosed(reason=reason))
                    return
                if event is not _WAKE:
                    kind = event.WhichOneof("kind")
                    if kind == "flow":
                        permits += event.flow.permits
                    elif kind == "ack":
                        self._ack(p, sub, event.ack)
                        if event.ack.request_id:
                            yield pb.ConsumeResponse(
                                ack_receipt=pb.AckReceipt(request_id=event.ack.request_id)
                            )
                    elif kind == "nack":
                        for m in event.nack.message_ids:
                            entry = (m.ledger_id, m.entry_id)
                            sub.redeliveries[entry] = sub.redeliveries.get(entry, 0) + 1
                            sub.replay.append(p.index_of(entry))
                    elif kind == "seek":
                        sub.read_index = self._resolve(p, event.seek.target)
                        sub.replay.clear()
                        sub.acked = {(s.ledger_id, s.entry_id) for s in p.entries[: sub.read_index]}
                        permits = 0
                        yield pb.ConsumeResponse(
                            seek_complete=pb.SeekComplete(request_id=event.seek.request_id)
                        )
                    elif kind == "close":
                        return
                deliveries = pb.Deliveries()
                while permits > 0 and (sub.replay or sub.read_index < len(p.entries)):
                    if sub.replay:
                        stored = p.entries[sub.replay.pop(0)]
                    else:
                        stored = p.entries[sub.read_index]
                        sub.read_index += 1
                    entry = (stored.ledger_id, stored.entry_id)
                    if entry in sub.acked:
                        continue
                    deliveries.deliveries.add(
                        message_id=types_pb2.MessageId(
                            ledger_id=stored.ledger_id,
                            entry_id=stored.entry_id,
                            batch_index=-1,
                            partition=p.index,
                            batch_size=stored.num_messages,
                        ),
                        entry=stored.envelope,
                        redelivery_count=sub.redeliveries.get(entry, 0),
                    )
                    permits -= stored.num_messages
                if deliveries.deliveries:
                    yield pb.ConsumeResponse(deliveries=deliveries)
        finally:
            pump.cancel()
            p.streams.discard(events)
            sub.attached = False
            if not sub.durable:
                p.subscriptions.pop(sub.name, None)

    @staticmethod
    def _resolve(p: Partition, start: types_pb2.StartPosition) -> int:
        which = start.WhichOneof("target")
        if which == "message_id":
            return p.index_of((start.message_id.ledger_id, start.message_id.entry_id))
        if which == "offset":
            for i, stored in enumerate(p.entries):
                if stored.first_offset + stored.num_messages > start.offset:
                    return i
            return len(p.entries)
        if which == "publish_time_ms":
            for i, stored in enumerate(p.entries):
                if stored.publish_time_ms >= start.publish_time_ms:
                    return i
            return len(p.entries)
        if start.initial == types_pb2.INITIAL_POSITION_EARLIEST:
            return 0
        return len(p.entries)

    @staticmethod
    def _ack(p: Partition, sub: Subscription, ack: pb.Ack) -> None:
        for m in ack.message_ids:
            assert m.ledger_id >= 0, "acks name stored entries"
            assert m.entry_id >= 0, "acks name stored entries"
            if ack.ack_type == pb.ACK_TYPE_CUMULATIVE:
                sub.acked.update(
                    (s.ledger_id, s.entry_id)
                    for s in p.entries
                    if (s.ledger_id, s.entry_id) <= (m.ledger_id, m.entry_id)
                )
            else:
                sub.acked.add((m.ledger_id, m.entry_id))
