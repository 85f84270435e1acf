"""Pulsar's binary protocol spoken by hand, for what the real client does not show: the exact
answers of the broker, bad input, and metadata as delivered. Built on Magnetar's own codec
(:mod:`broker.pulsar.codec`), which the real client's framing test checks both ways."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any

from broker.pulsar.codec import Frame, decode_frame, encode_command, encode_message, type_name
from magnetar.common.framing import FrameReader
from proto.pulsar import PulsarApi_pb2 as api

Base = api.BaseCommand


def command(kind: str, **sub: Any) -> Base:
    return Base(type=Base.Type.Value(kind), **sub)


class RawConnection:
    """One TCP connection to a broker's Pulsar listener."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.frames = FrameReader(reader, max_frame_size=64 * 1024 * 1024, name="Pulsar frame")
        self.connected: api.CommandConnected | None = None
        self.request_ids = iter(range(1000, 10**9))

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        address: str,
        *,
        connect: bool = True,
        protocol_version: int = 20,
        entry_metadata: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> AsyncIterator[RawConnection]:
        """``tls``: over TLS (a TLS listener), handshaking with this context."""
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port), ssl=tls)
        raw = cls(reader, writer)
        try:
            if connect:
                await raw.connect(protocol_version, entry_metadata=entry_metadata)
            yield raw
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, kind: str, **sub: Any) -> None:
        self.writer.write(encode_command(command(kind, **sub)))

    async def read(self, timeout_s: float = 10) -> Frame | None:
        """The next frame, answering the broker's PINGs; None when the broker closed."""
        while True:
            body = await asyncio.wait_for(self.frames.read_frame(), timeout_s)
            if body is None:
                return None
            frame = decode_frame(body)
            if frame.type == Base.PING:
                self.send("PONG", pong=api.CommandPong())
                continue
            return frame

    async def expect(self, kind: str, timeout_s: float = 10) -> Frame:
        frame = await self.read(timeout_s)
        assert frame is not None, f"the broker closed the connection; expected {kind}"
        assert frame.type_name == kind, f"expected {kind}, got {frame.type_name}: {frame.command}"
        return frame

    async def closed_by_broker(self, timeout_s: float = 10) -> bool:
        """Whether the broker closes the connection (reading on until it does)."""
        try:
            while await self.read(timeout_s) is not None:
                pass
        except (ConnectionError, TimeoutError):
            return False
        except Exception:  # a truncated frame: the broker closed mid-frame
            return True
        return True

    async def connect(
        self, protocol_version: int = 20, *, entry_metadata: bool = False
    ) -> api.CommandConnected:
        self.send(
            "CONNECT",
            connect=api.CommandConnect(
                client_version="magnetar-raw-test",
                protocol_version=protocol_version,
                feature_flags=api.FeatureFlags(supports_broker_entry_metadata=entry_metadata),
            ),
        )
        frame = await self.expect("CONNECTED")
        self.connected = frame.command.connected
        return self.connected

    async def create_producer(self, topic: str, producer_id: int) -> api.CommandProducerSuccess:
        request_id = next(self.request_ids)
        self.send(
            "PRODUCER",
            producer=api.CommandProducer(
                topic=topic, producer_id=producer_id, request_id=request_id
            ),
        )
        frame = await self.expect("PRODUCER_SUCCESS")
        assert frame.command.producer_success.request_id == request_id
        return frame.command.producer_success

    def send_message(
        self,
        producer_id: int,
        sequence_id: int,
        payload: bytes,
        metadata: api.MessageMetadata | None = None,
    ) -> None:
        if metadata is None:
            metadata = api.MessageMetadata(
                producer_name="raw", sequence_id=sequence_id, publish_time=1
            )
        self.writer.write(
            encode_message(
                command(
                    "SEND", send=api.CommandSend(producer_id=producer_id, sequence_id=sequence_id)
                ),
                metadata,
                payload,
            )
        )

    async def subscribe(
        self, topic: str, subscription: str, *, consumer_id: int, earliest: bool = False
    ) -> None:
        request_id = next(self.request_ids)
        self.send(
            "SUBSCRIBE",
            subscribe=api.CommandSubscribe(
                topic=topic,
                subscription=subscription,
                subType=api.CommandSubscribe.Exclusive,
                consumer_id=consumer_id,
                request_id=request_id,
                initialPosition=(
                    api.CommandSubscribe.Earliest if earliest else api.CommandSubscribe.Latest
                ),
            ),
        )
        frame = await self.expect("SUCCESS")
        assert frame.command.success.request_id == request_id

    async def flow(self, consumer_id: int, permits: int) -> None:
        self.send("FLOW", flow=api.CommandFlow(consumer_id=consumer_id, messagePermits=permits))
        await self.writer.drain()


__all__ = ["RawConnection", "command", "type_name"]
