"""The broker protocol spoken by hand, for tests that check exact wire behaviour."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from proto.broker.v1 import broker_pb2 as pb
from proto.broker.v1 import broker_pb2_grpc
from proto.common.v1 import types_pb2
from proto.format.v1 import entry_pb2


def batch_bytes(*values: bytes) -> bytes:
    return entry_pb2.MessageBatch(
        messages=[entry_pb2.BatchedMessage(value=v) for v in values]
    ).SerializeToString()


def produce_batch(request_id: int, sequence_id: int, *values: bytes) -> pb.ProduceBatch:
    return pb.ProduceBatch(
        request_id=request_id,
        sequence_id=sequence_id,
        last_sequence_id=sequence_id + len(values) - 1,
        num_messages=len(values),
        batch=batch_bytes(*values),
        compression=types_pb2.COMPRESSION_TYPE_NONE,
    )


class RawStream:
    """A bidirectional stream with a request queue and a response iterator."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[object] = asyncio.Queue()

    async def _iterate(self) -> AsyncIterator[object]:
        while True:
            item = await self.requests.get()
            if item is None:
                return
            yield item


class RawProducer(RawStream):
    def __init__(self, stub: broker_pb2_grpc.BrokerServiceAsyncStub) -> None:
        super().__init__()
        self.call = stub.Produce(self._iterate())  # type: ignore[arg-type]

    async def open(self, topic: str, producer_name: str = "") -> pb.ProduceResponse:
        await self.requests.put(
            pb.ProduceRequest(open=pb.ProducerOpen(topic=topic, producer_name=producer_name))
        )
        return await self.next()

    async def send(self, *batches: pb.ProduceBatch) -> None:
        await self.requests.put(pb.ProduceRequest(send=pb.ProduceSend(batches=list(batches))))

    async def next(self, timeout_s: float = 20) -> pb.ProduceResponse:
        async with asyncio.timeout(timeout_s):
            response = await self.call.read()
        if not isinstance(response, pb.ProduceResponse):
            raise EOFError("the broker ended the produce stream")  # noqa: TRY004 - end of stream, not a bad type
        return response

    async def receipts(self, count: int) -> list[pb.ProduceResponse]:
        """Responses until ``count`` receipts or errors have arrived."""
        got: list[pb.ProduceResponse] = []
        seen = 0
        while seen < count:
            response = await self.next()
            got.append(response)
            kind = response.WhichOneof("kind")
            if kind == "receipts":
                seen += len(response.receipts.receipts)
            elif kind == "error":
                seen += 1
            elif kind == "closed":
                break
        return got

    async def close(self) -> None:
        await self.requests.put(None)
        self.call.cancel()


class RawConsumer(RawStream):
    def __init__(self, stub: broker_pb2_grpc.BrokerServiceAsyncStub) -> None:
        super().__init__()
        self.call = stub.Consume(self._iterate())  # type: ignore[arg-type]

    async def subscribe(
        self,
        topic: str,
        subscription: str,
        *,
        start: types_pb2.StartPosition | None = None,
        durable: bool | None = True,
        sub_type: int = types_pb2.SUBSCRIPTION_TYPE_EXCLUSIVE,
        consumer_name: str = "",
    ) -> pb.ConsumeResponse:
        """Subscribe (``durable=None``: the field left unset, as a minimal client sends it)."""
        await self.requests.put(
            pb.ConsumeRequest(
                subscribe=pb.Subscribe(
                    topic=topic,
                    subscription=subscription,
                    subscription_type=sub_type,  # type: ignore[arg-type]
                    start=start
                    or types_pb2.StartPosition(initial=types_pb2.INITIAL_POSITION_EARLIEST),
                    durable=durable,
                    consumer_name=consumer_name,
                )
            )
        )
        return await self.next()

    async def flow(self, permits: int) -> None:
        await self.requests.put(pb.ConsumeRequest(flow=pb.Flow(permits=permits)))

    async def send(self, request: pb.ConsumeRequest) -> None:
        await self.requests.put(request)

    async def next(self, timeout_s: float = 20) -> pb.ConsumeResponse:
        async with asyncio.timeout(timeout_s):
            response = await self.call.read()
        if not isinstance(response, pb.ConsumeResponse):
            raise EOFError("the broker ended the consume stream")  # noqa: TRY004 - end of stream, not a bad type
        return response

    async def ack_with_receipt(
        self, message_ids: list[types_pb2.MessageId], request_id: int
    ) -> None:
        """Acknowledge ``message_ids`` individually and wait for the receipt (other responses
        arriving meanwhile are passed over)."""
        await self.send(
            pb.ConsumeRequest(
                ack=pb.Ack(
                    ack_type=pb.ACK_TYPE_INDIVIDUAL,
                    message_ids=message_ids,
                    request_id=request_id,
                )
            )
        )
        while (await self.next()).WhichOneof("kind") != "ack_receipt":
            pass

    async def deliveries(self, count: int) -> list[pb.Delivery]:
        got: list[pb.Delivery] = []
        while len(got) < count:
            response = await self.next()
            if response.WhichOneof("kind") == "deliveries":
                got.extend(response.deliveries.deliveries)
        return got

    async def close(self) -> None:
        await self.requests.put(None)
        self.call.cancel()


def values_of(delivery: pb.Delivery) -> list[bytes]:
    envelope = entry_pb2.EntryEnvelope()
    envelope.ParseFromString(delivery.entry)
    batch = entry_pb2.MessageBatch()
    batch.ParseFromString(envelope.batch)
    return [m.value for m in batch.messages]


def envelope_of(delivery: pb.Delivery) -> entry_pb2.EntryEnvelope:
    envelope = entry_pb2.EntryEnvelope()
    envelope.ParseFromString(delivery.entry)
    return envelope
