"""The real ``pulsar-client`` from PyPI against Magnetar's framing and Pulsar codec.

A few lines of asyncio stand in for a broker (the listener itself is not built yet): they read the
client's frames with :class:`~magnetar.common.framing.FrameReader` and
:func:`broker.pulsar.codec.decode_frame`, answer CONNECT with CONNECTED (``server_version`` and
``protocol_version = min(client's, ours)``), send a PING that the client must answer with PONG,
answer PING with PONG, and answer the first PARTITIONED_METADATA or LOOKUP with a failed response
carrying an error, which the client must turn into the error it names. That proves both
directions of the framing against the C++ core of the client, unmodified.

``pulsar-client`` is in the dev extra (pyproject.toml, constraints/pinned.txt); until every
``.venv`` has it, the test skips where it is missing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pulsar  # the real pulsar-client from PyPI (its C++ core)

from broker.pulsar.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    decode_frame,
    encode_command,
)
from magnetar.common.framing import FrameReader
from proto.pulsar import PulsarApi_pb2 as api

Base = api.BaseCommand
OUR_PROTOCOL_VERSION = 19  # the last version of the vendored PulsarApi.proto


@dataclass
class StandIn:
    """Just enough of a Pulsar broker to take a client's first steps."""

    seen: list[str] = field(default_factory=list)
    connect: api.CommandConnect | None = None
    answered_connected: api.CommandConnected | None = None
    refused_request: str | None = None
    pong: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader(reader, max_frame_size=DEFAULT_MAX_FRAME_SIZE, name="Pulsar frame")
        try:
            async for body in frames:
                frame = decode_frame(body)
                self.seen.append(frame.type_name)
                for reply in self.answer(frame.command):
                    writer.write(encode_command(reply))
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def answer(self, command: api.BaseCommand) -> list[api.BaseCommand]:
        if command.type == Base.CONNECT:
            self.connect = command.connect
            connected = api.CommandConnected(
                server_version="Magnetar test stand-in",
                protocol_version=min(command.connect.protocol_version, OUR_PROTOCOL_VERSION),
            )
            self.answered_connected = connected
            ping = Base(type=Base.PING, ping=api.CommandPing())
            return [Base(type=Base.CONNECTED, connected=connected), ping]
        if command.type == Base.PING:
            return [Base(type=Base.PONG, pong=api.CommandPong())]
        if command.type == Base.PONG:
            self.pong.set()
            return []
        if command.type == Base.PARTITIONED_METADATA:
            # As Pulsar does: the error in the response. A bare ERROR with the request id is
            # logged by the client but leaves the lookup waiting for its operation timeout.
            request = command.partitionMetadata
            self.refused_request = request.topic
            response = api.CommandPartitionedTopicMetadataResponse(
                request_id=request.request_id,
                response=api.CommandPartitionedTopicMetadataResponse.Failed,
                error=api.NotAllowedError,
                message="the stand-in serves no topics",
            )
            return [
                Base(type=Base.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=response)
            ]
        if command.type == Base.LOOKUP:
            self.refused_request = command.lookupTopic.topic
            lookup = api.CommandLookupTopicResponse(
                request_id=command.lookupTopic.request_id,
                response=api.CommandLookupTopicResponse.Failed,
                error=api.NotAllowedError,
                message="the stand-in serves no topics",
            )
            return [Base(type=Base.LOOKUP_RESPONSE, lookupTopicResponse=lookup)]
        return []


async def test_the_real_client_connects_pongs_and_gets_the_error_it_was_sent(
    tmp_path: Path,
) -> None:
    stand_in = StandIn()
    server = await asyncio.start_server(stand_in.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    def client_steps() -> BaseException | None:
        client = pulsar.Client(
            f"pulsar://127.0.0.1:{port}",
            operation_timeout_seconds=20,
            connection_timeout_ms=20_000,
        )
        try:
            client.create_producer("persistent://public/default/framing")
        except Exception as e:  # the error the stand-in sent, as the client's exception
            return e
        finally:
            client.close()
        return None

    try:
        raised = await asyncio.to_thread(client_steps)
        await asyncio.wait_for(stand_in.pong.wait(), timeout=20)
    finally:
        server.close()
        await server.wait_closed()

    assert isinstance(raised, pulsar.exceptions.NotAllowedError), repr(raised)
    assert stand_in.seen[0] == "CONNECT"
    assert stand_in.connect is not None
    assert stand_in.connect.protocol_version >= 19  # 20 for pulsar-client 3.13.0
    assert stand_in.connect.client_version  # e.g. "Pulsar-CPP-v4.2.0"
    assert stand_in.answered_connected is not None
    assert stand_in.answered_connected.protocol_version == min(
        stand_in.connect.protocol_version, OUR_PROTOCOL_VERSION
    )
    assert "PONG" in stand_in.seen  # the client decoded our PING and answered it
    assert stand_in.refused_request == "persistent://public/default/framing"
    assert set(stand_in.seen) <= {"CONNECT", "PONG", "PING", "PARTITIONED_METADATA", "LOOKUP"}
