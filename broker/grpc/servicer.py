"""The broker's gRPC adapter for clients: Lookup, Produce and Consume streams.

Protobuf in, domain calls, protobuf out. Streams are long-lived and answer failures in band:
a bad batch gets a ``ProduceError`` and the stream goes on. When the broker stops serving a
partition (moved, shutting down, session lost) the stream ends with a "closed" message saying
why, and the client looks the partition up again and resends what was not receipted.

Each stream has a reader task (requests in) and the handler body (responses out). The producer
reader stops reading while the partition's bytes in flight are at their bound, so back-pressure
reaches the client through gRPC flow control. Receipts that complete together travel in one
message.

Every call is authenticated once (:mod:`broker.grpc.auth` reads its credentials) and authorized
for what it does: a lookup, producing or consuming. A refused stream's first answer is
``closed`` with the error. A stream whose token expires is challenged in band
(``auth_challenge``) and goes on with the client's fresh token (``auth``); see
:mod:`broker.service.security`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable

import grpc
import grpc.aio
import structlog
from google.protobuf.descriptor import EnumDescriptor

from broker.managed_ledger import Position
from broker.service.authorization import TopicAction
from broker.service.broker import Broker
from broker.service.config import BrokerConfig
from broker.service.envelope import IncomingBatch
from broker.service.security import StreamCredentials
from broker.service.streams import (
    AckDone,
    ActiveChange,
    AuthChallenge,
    ClientDone,
    ConsumerEvent,
    Deliveries,
    MessageIdStart,
    OffsetStart,
    Receipt,
    RequestFailed,
    SeekDone,
    Start,
    StreamClosed,
    SubscribeRequest,
    SubscriptionType,
    TimeStart,
)
from broker.service.subscription import ConsumerSession
from broker.service.topic import ProducerSession
from broker.service.validation import check_name, check_properties
from magnetar.common.errors import (
    InternalError,
    InvalidArgumentError,
    LedgerError,
    MagnetarError,
    ManagedLedgerError,
    ManagedLedgerTerminatedError,
    MetadataError,
    ProtocolError,
    ServiceNotReadyError,
    StorageError,
    TopicNotOwnedError,
)
from magnetar.common.grpc_errors import abort_with, error_to_detail
from magnetar.common.names import parse_topic
from magnetar.common.security.grpc_credentials import credentials_of
from proto.broker.v1 import broker_pb2 as pb
from proto.broker.v1 import broker_pb2_grpc
from proto.common.v1 import types_pb2

log = structlog.get_logger("magnetar.broker.grpc")

_producer_ids = itertools.count(1)
# under gRPC's default 4 MiB receive limit unless one entry alone is bigger
MAX_DELIVERY_MESSAGE_BYTES = 3 * 1024 * 1024

_ACK_TYPES = (pb.ACK_TYPE_INDIVIDUAL, pb.ACK_TYPE_CUMULATIVE)


_INITIAL_POSITIONS: dict[int, Start] = {
    types_pb2.INITIAL_POSITION_LATEST: "latest",
    types_pb2.INITIAL_POSITION_EARLIEST: "earliest",
}


def to_start(start: types_pb2.StartPosition, field: str = "start") -> Start:
    """Where a subscription, seek or reset starts; an unset or unspecified start is refused
    (it would pick "latest" for a client that perhaps meant "earliest")."""
    which = start.WhichOneof("target")
    if which is None:
        raise InvalidArgumentError(
            f"{field} is not set: set {field}.initial (INITIAL_POSITION_LATEST or"
            f" INITIAL_POSITION_EARLIEST), {field}.message_id, {field}.offset or"
            f" {field}.publish_time_ms",
            context={"field": field},
        )
    if which == "initial":
        initial = _INITIAL_POSITIONS.get(start.initial)
        if initial is None:
            value = _enum_value(types_pb2.InitialPosition.DESCRIPTOR, start.initial)
            raise InvalidArgumentError(
                f"{field}.initial is {value}: set INITIAL_POSITION_LATEST or"
                " INITIAL_POSITION_EARLIEST",
                context={"field": f"{field}.initial", "value": start.initial},
            )
        return initial
    if which == "message_id":
        m = start.message_id
        return MessageIdStart(m.ledger_id, m.entry_id, m.batch_index)
    if which == "offset":
        return OffsetStart(start.offset)
    return TimeStart(start.publish_time_ms)


def _enum_value(enum: EnumDescriptor, value: int) -> str:
    """An enum value as an error names it: its name, or the number a client sent that this
    broker does not know."""
    known = enum.values_by_number.get(value)
    return known.name if known is not None else f"{value}, which this broker does not know"


_SUBSCRIPTION_TYPES = frozenset(int(t) for t in SubscriptionType)


def _subscription_type(value: int) -> SubscriptionType:
    if value not in _SUBSCRIPTION_TYPES:
        raise InvalidArgumentError(
            f"subscription_type is {_enum_value(types_pb2.SubscriptionType.DESCRIPTOR, value)}:"
            " set SUBSCRIPTION_TYPE_EXCLUSIVE, SUBSCRIPTION_TYPE_FAILOVER,"
            " SUBSCRIPTION_TYPE_SHARED or SUBSCRIPTION_TYPE_KEY_SHARED",
            context={"field": "subscription_type", "value": value},
        )
    return SubscriptionType(value)


def _check_producer_open(open_: pb.ProducerOpen, config: BrokerConfig) -> None:
    check_name("producer_name", open_.producer_name, config.max_name_chars)
    check_properties(
        "properties",
        open_.properties,
        max_key_chars=config.max_name_chars,
        max_bytes=config.max_properties_bytes,
    )


def _check_subscribe(sub: pb.Subscribe, config: BrokerConfig) -> None:
    for field in ("subscription", "consumer_name", "dead_letter_topic"):
        check_name(field, getattr(sub, field), config.max_name_chars)
    check_properties(
        "properties",
        sub.properties,
        max_key_chars=config.max_name_chars,
        max_bytes=config.max_properties_bytes,
    )


def _position(message_id: types_pb2.MessageId) -> Position:
    if message_id.ledger_id < 0 or message_id.entry_id < 0:
        raise InvalidArgumentError(
            f"message id ({message_id.ledger_id}, {message_id.entry_id}) is not a stored entry"
        )
    return Position(message_id.ledger_id, message_id.entry_id)


def _message_id(position: Position, partition: int, batch_size: int = 0) -> types_pb2.MessageId:
    return types_pb2.MessageId(
        ledger_id=position.ledger_id,
        entry_id=position.entry_id,
        batch_index=-1,
        partition=partition,
        batch_size=batch_size,
    )


class BrokerServicer(broker_pb2_grpc.BrokerServiceServicer):
    def __init__(
        self, broker: Broker, *, entry_for_client: Callable[[bytes], bytes] | None = None
    ) -> None:
        self.broker = broker
        self._entry_for_client = entry_for_client
        """Turns a stored entry of another format than Magnetar's (``payload_format``: one a
        Pulsar producer wrote) into what a Magnetar client reads; set by the process, which
        knows both adapters (this one may not import the other). Entries of Magnetar's own
        format go out as they are, without being parsed."""

    # --- lookup -----------------------------------------------------------------------------------

    async def Lookup(
        self, request: pb.LookupRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.LookupResponse:
        try:
            principal = self.broker.security.authenticate(credentials_of(context))
            name = parse_topic(request.topic)
            await self.broker.security.authorize_topic(principal, TopicAction.LOOKUP, name)
            result = await self.broker.lookup(request.topic)
        except MagnetarError as e:
            await abort_with(
                context, _not_now(e, self.broker.broker_id, f"lookup of {request.topic}")
            )
        return pb.LookupResponse(
            topic=result.topic,
            partitions=result.partitions,
            owners=[
                pb.PartitionOwner(
                    partition_topic=o.partition_topic,
                    partition=o.partition,
                    broker_url=o.broker_url,
                    broker_id=o.broker_id,
                    broker_url_tls=o.broker_url_tls,
                )
                for o in result.owners
            ],
        )

    # --- produce ----------------------------------------------------------------------------------

    async def Produce(
        self,
        request_iterator: AsyncIterator[pb.ProduceRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[pb.ProduceResponse]:
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        except MagnetarError as e:  # the request could not be decoded
            yield _producer_closed(e)
            return
        if first.WhichOneof("kind") != "open":
            yield _producer_closed(ProtocolError("the first message of a produce stream is open"))
            return
        security = self.broker.security
        try:
            principal = security.authenticate(credentials_of(context))
            name = parse_topic(first.open.topic)
            _check_producer_open(first.open, self.broker.config)
            await security.authorize_topic(principal, TopicAction.PRODUCE, name)
            topic = await self.broker.open_topic(name)
            producer_name = first.open.producer_name or (
                f"{self.broker.broker_id}-{self.broker.start_time_ms}-{next(_producer_ids)}"
            )
            producer = topic.add_producer(producer_name, context.peer())
        except MagnetarError as e:
            yield _producer_closed(
                _not_now(e, self.broker.broker_id, f"producer open on {first.open.topic}")
            )
            return
        except Exception as e:
            log.exception("producer_open_failed", topic=first.open.topic)
            yield _producer_closed(InternalError(f"opening the producer failed: {e!r}"))
            return
        log.info("producer_opened", topic=name.full, producer=producer_name)
        # from here on the producer is attached: whatever ends the stream (the client
        # cancelling while the answer below is written included) removes it, or a stream that
        # is gone would keep the producer name taken
        credentials: StreamCredentials | None = None
        reader: asyncio.Task[None] | None = None
        try:
            yield pb.ProduceResponse(
                opened=pb.ProducerOpened(
                    producer_name=producer_name,
                    topic=name.full,
                    last_sequence_id=producer.last_sequence_id,
                    max_message_bytes=self.broker.config.max_message_bytes,
                    max_messages_per_batch=self.broker.config.max_messages_per_batch,
                )
            )
            inflight: deque[tuple[int, asyncio.Future[Receipt]]] = deque()
            arrived = asyncio.Event()
            taken = asyncio.Event()
            """Set when receipts left ``inflight``: a reader waiting for room looks again."""
            challenges: deque[int] = deque()

            def challenge(expired_at_ms: int) -> None:
                challenges.append(expired_at_ms)
                arrived.set()

            credentials = security.stream(
                principal,
                context.peer(),
                action=TopicAction.PRODUCE,
                topic=name,
                on_challenge=challenge,
                on_revoked=producer.close_with,
            )
            reader = asyncio.create_task(
                self._read_produce(
                    request_iterator,
                    producer,
                    inflight=inflight,
                    arrived=arrived,
                    taken=taken,
                    credentials=credentials,
                )
            )
            async for response in self._produce_responses(
                producer,
                inflight=inflight,
                arrived=arrived,
                taken=taken,
                reader=reader,
                challenges=challenges,
            ):
                yield response
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                error = reader.exception()
                if not isinstance(error, MagnetarError):
                    # a refused request (one that did not decode) was logged where it was seen
                    log.error("produce_stream_failed", topic=name.full, error=repr(error))
                yield _producer_closed(
                    _not_now(error, self.broker.broker_id, f"produce stream on {name.full}")
                    if isinstance(error, MagnetarError)
                    else ProtocolError(f"the produce stream failed: {error!r}")
                )
        finally:
            if credentials is not None:
                credentials.close()
            if reader is not None:
                await _reap(reader)
            topic.remove_producer(producer)
            log.info("producer_closed", topic=name.full, producer=producer_name)

    async def _read_produce(
        self,
        requests: AsyncIterator[pb.ProduceRequest],
        producer: ProducerSession,
        *,
        inflight: deque[tuple[int, asyncio.Future[Receipt]]],
        arrived: asyncio.Event,
        taken: asyncio.Event,
        credentials: StreamCredentials,
    ) -> None:
        topic = producer.topic
        loop = asyncio.get_running_loop()
        max_pending = self.broker.config.max_pending_publish_requests
        producer.closed.add_done_callback(lambda _: taken.set())
        async for request in requests:
            kind = request.WhichOneof("kind")
            if kind == "close":
                return
            if kind == "auth":
                if not await credentials.refresh_or_revoke(request.auth.token):
                    return
                continue
            if kind != "send":
                failed: asyncio.Future[Receipt] = loop.create_future()
                failed.set_exception(ProtocolError(f"unexpected {kind} on an open producer"))
                inflight.append((0, failed))
                arrived.set()
                continue
            for batch in request.send.batches:
                while len(inflight) >= max_pending and not producer.is_closed:
                    # receipts the client has not taken: read no more until it does
                    taken.clear()
                    await taken.wait()
                await topic.wait_for_space()
                if producer.is_closed:
                    return
                incoming = IncomingBatch(
                    batch.request_id,
                    batch.sequence_id,
                    batch.last_sequence_id,
                    batch.num_messages,
                    batch.batch,
                    batch.compression,
                    batch.uncompressed_size,
                    tuple(batch.key_hashes),
                    batch.deliver_at_ms,
                )
                try:
                    receipt = topic.publish(producer, incoming)
                except MagnetarError as e:
                    if e.look_up_again:
                        producer.close_with(_moved(e))
                        return
                    receipt = loop.create_future()
                    receipt.set_exception(e)
                inflight.append((batch.request_id, receipt))
                receipt.add_done_callback(lambda _: arrived.set())

    async def _produce_responses(
        self,
        producer: ProducerSession,
        *,
        inflight: deque[tuple[int, asyncio.Future[Receipt]]],
        arrived: asyncio.Event,
        taken: asyncio.Event,
        reader: asyncio.Task[None],
        challenges: deque[int],
    ) -> AsyncIterator[pb.ProduceResponse]:
        partition = producer.topic.name.partition
        # one event wakes this loop: a batch arriving or completing (each receipt future sets
        # it when done), the producer closing, or the reader ending; no task per wait
        producer.closed.add_done_callback(lambda _: arrived.set())
        reader.add_done_callback(lambda _: arrived.set())
        producer.on_problem = arrived.set
        while True:
            while challenges:
                yield pb.ProduceResponse(
                    auth_challenge=pb.AuthChallenge(expired_at_ms=challenges.popleft())
                )
            while producer.problems:
                problem = producer.problems.popleft()
                yield pb.ProduceResponse(
                    stalled=pb.ProduceStalled(problem=error_to_detail(problem))
                    if problem is not None
                    else pb.ProduceStalled()
                )
            if not (inflight and inflight[0][1].done()):
                if producer.is_closed:
                    # what is not receipted is resent by the client
                    yield _producer_closed(producer.closed.result())
                    return
                if not inflight and reader.done():
                    return  # the client closed its side
                arrived.clear()
                await arrived.wait()
                continue
            receipts = pb.ProduceReceipts()
            errors: list[pb.ProduceResponse] = []
            moved: MagnetarError | None = None
            while inflight and inflight[0][1].done():
                request_id, future = inflight.popleft()
                if future.cancelled():
                    moved = ServiceNotReadyError("the batch was not stored; resend it")
                    continue
                error = future.exception()
                if error is None:
                    r = future.result()
                    receipts.receipts.add(
                        request_id=r.request_id,
                        sequence_id=r.sequence_id,
                        last_sequence_id=r.last_sequence_id,
                        message_id=_message_id(r.position, partition),
                        first_offset=r.first_offset,
                        publish_time_ms=r.publish_time_ms,
                        duplicate=r.duplicate,
                    )
                elif not isinstance(error, MagnetarError) or error.look_up_again:
                    moved = (
                        _moved(error)
                        if isinstance(error, MagnetarError)
                        else ServiceNotReadyError(f"the batch could not be stored: {error}")
                    )
                else:
                    errors.append(
                        pb.ProduceResponse(
                            error=pb.ProduceError(
                                request_id=request_id, error=error_to_detail(error)
                            )
                        )
                    )
            if receipts.receipts:
                yield pb.ProduceResponse(receipts=receipts)
            for response in errors:
                yield response
            taken.set()  # what was popped above is written: the reader may read on
            if moved is not None:
                # the partition's writer failed: the client resends everything unreceipted
                producer.close_with(moved)
                yield _producer_closed(moved)
                return

    # --- consume ----------------------------------------------------------------------------------

    async def Consume(
        self,
        request_iterator: AsyncIterator[pb.ConsumeRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[pb.ConsumeResponse]:
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        except MagnetarError as e:  # the request could not be decoded
            yield _consumer_closed(e)
            return
        if first.WhichOneof("kind") != "subscribe":
            yield _consumer_closed(
                ProtocolError("the first message of a consume stream is subscribe")
            )
            return
        sub = first.subscribe
        security = self.broker.security
        try:
            principal = security.authenticate(credentials_of(context))
            name = parse_topic(sub.topic)
            _check_subscribe(sub, self.broker.config)
            await security.authorize_topic(principal, TopicAction.CONSUME, name)
            sub_type = _subscription_type(sub.subscription_type)
            start = to_start(sub.start)
            topic = await self.broker.open_topic(name)
            consumer = await topic.subscribe(
                SubscribeRequest(
                    topic=name.full,
                    subscription=sub.subscription,
                    subscription_type=sub_type,
                    consumer_name=sub.consumer_name or f"consumer-{next(_producer_ids)}",
                    start=start,
                    # unset means durable: a minimal subscribe must not be a reader whose
                    # acknowledgements persist nothing
                    durable=sub.durable if sub.HasField("durable") else True,
                    priority_level=sub.priority_level,
                    properties=dict(sub.properties),
                ),
                context.peer(),
            )
        except MagnetarError as e:
            yield _consumer_closed(_not_now(e, self.broker.broker_id, f"subscribe to {sub.topic}"))
            return
        except ValueError as e:
            yield _consumer_closed(InvalidArgumentError(f"bad subscribe request: {e}"))
            return
        except Exception as e:
            log.exception("subscribe_failed", topic=sub.topic)
            yield _consumer_closed(InternalError(f"subscribe failed: {e!r}"))
            return
        log.info(
            "consumer_subscribed",
            topic=name.full,
            subscription=consumer.subscription.name,
            consumer=consumer.name,
        )
        # from here on the consumer is attached: whatever ends the stream (the client
        # cancelling while the answer below is written included) detaches it, or a stream that
        # is gone would hold an exclusive subscription and the permits it was given
        credentials: StreamCredentials | None = None
        reader: asyncio.Task[None] | None = None
        try:
            yield pb.ConsumeResponse(
                subscribed=pb.Subscribed(
                    topic=name.full,
                    subscription=consumer.subscription.name,
                    consumer_name=consumer.name,
                    max_redelivery_count=topic.max_redelivery_count,
                )
            )
            credentials = security.stream(
                principal,
                context.peer(),
                action=TopicAction.CONSUME,
                topic=name,
                on_challenge=lambda expired_at_ms: consumer.events.put_nowait(
                    AuthChallenge(expired_at_ms)
                ),
                on_revoked=consumer.close_with,
            )
            reader = asyncio.create_task(
                self._read_consume(request_iterator, consumer, credentials)
            )
            async for response in self._consume_responses(consumer, reader):
                yield response
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                error = reader.exception()
                if not isinstance(error, MagnetarError):
                    log.error("consume_stream_failed", topic=name.full, error=repr(error))
                yield _consumer_closed(
                    _not_now(error, self.broker.broker_id, f"consume stream on {name.full}")
                    if isinstance(error, MagnetarError)
                    else ProtocolError(f"the consume stream failed: {error!r}")
                )
        finally:
            if credentials is not None:
                credentials.close()
            if reader is not None:
                await _reap(reader)
            consumer.detach()
            # what the stream held when it ended: a stalled consumer shows here (no permits,
            # a full buffer its client never read, messages it never acknowledged)
            log.info(
                "consumer_closed",
                topic=name.full,
                subscription=consumer.subscription.name,
                consumer=consumer.name,
                permits=consumer.permits,
                unacked_messages=consumer.unacked_messages,
                buffered_bytes=consumer.buffered_bytes,
                msgs_out=consumer.msgs_out,
            )

    async def _read_consume(
        self,
        requests: AsyncIterator[pb.ConsumeRequest],
        consumer: ConsumerSession,
        credentials: StreamCredentials,
    ) -> None:
        async for request in requests:
            kind = request.WhichOneof("kind")
            if kind == "auth":
                if not await credentials.refresh_or_revoke(request.auth.token):
                    return
                continue
            try:
                if kind == "flow":
                    consumer.flow(request.flow.permits)
                elif kind == "ack":
                    ack = request.ack
                    if ack.ack_type not in _ACK_TYPES:
                        raise InvalidArgumentError(
                            f"ack_type is {_enum_value(pb.AckType.DESCRIPTOR, ack.ack_type)}: set"
                            " ACK_TYPE_INDIVIDUAL or ACK_TYPE_CUMULATIVE",
                            context={"field": "ack_type", "value": ack.ack_type},
                        )
                    consumer.ack(
                        [_position(m) for m in ack.message_ids],
                        cumulative=ack.ack_type == pb.ACK_TYPE_CUMULATIVE,
                        request_id=ack.request_id,
                        partial=[
                            (_position(p.message_id), tuple(p.batch_indexes), p.batch_size)
                            for p in ack.partial
                        ],
                        dead_lettered=ack.dead_lettered,
                    )
                elif kind == "nack":
                    consumer.nack(
                        [_position(m) for m in request.nack.message_ids], request.nack.delay_ms
                    )
                elif kind == "redeliver":
                    consumer.redeliver([_position(m) for m in request.redeliver.message_ids])
                elif kind == "seek":
                    await consumer.seek(
                        to_start(request.seek.target, "target"), request.seek.request_id
                    )
                elif kind == "close":
                    return
                else:
                    raise ProtocolError(f"unexpected {kind} on an open consumer")
            except MagnetarError as e:
                request_id = (
                    request.ack.request_id
                    if kind == "ack"
                    else request.seek.request_id
                    if kind == "seek"
                    else 0
                )
                consumer.events.put_nowait(RequestFailed(request_id, e))

    async def _consume_responses(
        self, consumer: ConsumerSession, reader: asyncio.Task[None]
    ) -> AsyncIterator[pb.ConsumeResponse]:
        partition = consumer.subscription.topic.name.partition
        queue = consumer.events
        # the reader's end comes through the queue too: one plain wait per turn, no task
        reader.add_done_callback(lambda _: queue.put_nowait(ClientDone()))
        while True:
            events: list[ConsumerEvent] = [await queue.get()]
            while not queue.empty():
                events.append(queue.get_nowait())
            deliveries = pb.Deliveries()
            size = 0
            for event in events:
                if isinstance(event, ClientDone):
                    return  # the client closed its side
                if isinstance(event, Deliveries):
                    for item in consumer.still_unacked(event):
                        deliveries.deliveries.add(
                            message_id=_message_id(item.position, partition, item.num_messages),
                            entry=(
                                item.payload
                                if self._entry_for_client is None or not item.payload_format
                                else self._entry_for_client(item.payload)
                            ),
                            redelivery_count=item.redelivery_count,
                            batch_indexes=item.batch_indexes,
                        )
                        size += len(item.payload)
                        if size >= MAX_DELIVERY_MESSAGE_BYTES:
                            yield pb.ConsumeResponse(deliveries=deliveries)
                            consumer.taken(size)
                            deliveries = pb.Deliveries()
                            size = 0
                    continue
                if deliveries.deliveries:
                    yield pb.ConsumeResponse(deliveries=deliveries)
                    consumer.taken(size)
                    deliveries = pb.Deliveries()
                    size = 0
                if isinstance(event, AckDone):
                    yield pb.ConsumeResponse(ack_receipt=pb.AckReceipt(request_id=event.request_id))
                elif isinstance(event, SeekDone):
                    yield pb.ConsumeResponse(
                        seek_complete=pb.SeekComplete(request_id=event.request_id)
                    )
                elif isinstance(event, RequestFailed):
                    yield pb.ConsumeResponse(
                        error=pb.ConsumeError(
                            request_id=event.request_id, error=error_to_detail(event.error)
                        )
                    )
                elif isinstance(event, ActiveChange):
                    yield pb.ConsumeResponse(
                        active_change=pb.ActiveConsumerChange(is_active=event.active)
                    )
                elif isinstance(event, AuthChallenge):
                    yield pb.ConsumeResponse(
                        auth_challenge=pb.AuthChallenge(expired_at_ms=event.expired_at_ms)
                    )
                elif isinstance(event, StreamClosed):
                    yield _consumer_closed(event.reason, end_of_topic=event.end_of_topic)
                    return
            if deliveries.deliveries:
                yield pb.ConsumeResponse(deliveries=deliveries)
                consumer.taken(size)


async def _reap(reader: asyncio.Task[None]) -> None:
    """Stop a stream's reader task; a failure the stream did not already report is logged."""
    reported = reader.done()
    reader.cancel()
    try:
        await reader
    except asyncio.CancelledError:
        pass
    except Exception:
        if not reported:
            log.exception("stream_reader_failed")


def _producer_closed(error: MagnetarError) -> pb.ProduceResponse:
    return pb.ProduceResponse(closed=pb.ProducerClosed(reason=error_to_detail(error)))


def _moved(error: MagnetarError) -> MagnetarError:
    """A write that failed because the partition's writer did (its managed ledger fenced by a
    new owner, or failed here) means "look the partition up again and resend what was not
    receipted", which is what a retriable reason tells a client; a client would give up on
    the managed ledger's own, final, error."""
    if error.retriable:
        return error
    return TopicNotOwnedError(
        f"{error.message}; look the partition up again and resend",
        context={**error.context, "cause": error.code.name},
    )


_NOT_NOW = (MetadataError, StorageError, LedgerError, ManagedLedgerError, InternalError)
"""Failures of what the broker stands on (the metadata store, the bookies, the partition's
managed ledger) or of the broker itself, as opposed to refusals of the request."""


def _not_now(error: MagnetarError, broker_id: str, what: str = "") -> MagnetarError:
    """What a lookup, a producer open or a subscribe that failed with ``error`` tells the client.

    A refusal of the request (no such topic, a bad name, not allowed, busy) is final and passed
    on. A failure of this broker to do it *now* (its metadata store call failed in a way the
    store does not call retriable, loading the partition's managed ledger failed, a bookie
    refused) is not the client's to give up on: passed on as it is, it would fail the client's
    partition for good (the client stops reconnecting on a final error), and the partition
    would take no message until the application made a new producer, although the next
    attempt, perhaps on another broker, may well work. It becomes
    :class:`ServiceNotReadyError` (retriable), naming the cause, and is logged here
    (``request_failed_here``, naming ``what`` was asked).
    """
    if error.retriable or not isinstance(error, _NOT_NOW):
        return error
    if isinstance(error, ManagedLedgerTerminatedError):
        return error  # the partition takes no more messages: final
    # the client only hears "not now": the cause is for the operator
    log.info("request_failed_here", what=what, error=repr(error))
    return ServiceNotReadyError(
        f"broker {broker_id} cannot do it now: {error.message}; ask again",
        context={**error.context, "broker": broker_id, "cause": error.code.name},
    )


def _consumer_closed(error: MagnetarError, *, end_of_topic: bool = False) -> pb.ConsumeResponse:
    return pb.ConsumeResponse(
        closed=pb.ConsumerClosed(reason=error_to_detail(error), end_of_topic=end_of_topic)
    )
