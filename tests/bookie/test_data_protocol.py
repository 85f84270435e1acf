"""The bookie data port against hostile and broken clients, over real sockets.

Each bad connection (garbage bytes, a frame over the maximum, a stream cut inside a frame, a
request before HELLO, a greeting that never comes, bad credentials) is closed, alone: a ledger
client on the same bookie keeps adding and reading throughout, and the bookie holds nothing for
the closed connections afterwards. A request whose message does not decode is refused in band
and its connection stays.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bookie import data_protocol as dp
from bookie.client.bookie_client import BookieClient, BookieCredentials
from bookie.data_protocol import Kind
from bookie.entries import AddEntry, entry_checksum
from bookie.process import BookieProcess
from bookie.service.config import BookieConfig
from bookie.storage.config import StorageConfig
from magnetar.common.errors import (
    AuthenticationError,
    AuthorizationError,
    InvalidArgumentError,
    NoSuchLedgerError,
)
from magnetar.common.framing import FrameDecoder
from magnetar.common.security.tokens import TokenFile
from magnetar.testing.eventually import eventually
from metadata import open_store
from proto.bookie.v1 import bookie_pb2 as pb
from proto.bookie.v1 import framed_pb2
from proto.common.v1 import errors_pb2

MAX_FRAME = 1024 * 1024
TOKEN = "data-port-test-token"


def entry(ledger: int, entry_id: int) -> AddEntry:
    data = f"ledger {ledger} entry {entry_id}".encode()
    return AddEntry(
        ledger, entry_id, entry_id - 1, data, entry_checksum(ledger, entry_id, entry_id - 1, data)
    )


async def start_bookie(tmp_path: Path, **overrides: object) -> AsyncIterator[BookieProcess]:
    store = await open_store("memory://")
    settings: dict[str, object] = {
        "data_dir": tmp_path / "b1",
        "metadata": "memory://",
        "port": 0,
        "http_port": 0,
        "data_port": 0,
        "bind_host": "127.0.0.1",
        "advertised_host": "127.0.0.1",
        "max_data_frame_bytes": MAX_FRAME,
        "connection_handshake_timeout_ms": 500,
        "storage": StorageConfig(gc_interval_s=0, max_group_wait_ms=0, max_entry_bytes=512 * 1024),
    }
    settings.update(overrides)
    process = await BookieProcess.start(BookieConfig(**settings), store=store)  # type: ignore[arg-type]
    try:
        yield process
    finally:
        await process.stop(grace_s=0)
        await store.close()


@pytest.fixture
async def bookie(tmp_path: Path) -> AsyncIterator[BookieProcess]:
    async for process in start_bookie(tmp_path):
        yield process


class Raw:
    """A hand-driven connection to the data port."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(max_frame_size=1 << 30)

    @classmethod
    async def open(cls, process: BookieProcess) -> Raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", process.data_port)
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def hello(self, token: str = "") -> tuple[int, memoryview]:
        hello = framed_pb2.DataHello(protocol_version=dp.PROTOCOL_VERSION, token=token)
        self.send(dp.frame(Kind.HELLO, 0, hello.SerializeToString()))
        frame = await self.next_frame()
        assert frame is not None
        return frame

    async def next_frame(self) -> tuple[int, memoryview] | None:
        """(kind, message) of the next frame (request ids are checked by the callers that care);
        None at the end of the stream."""
        async with asyncio.timeout(10):
            frames: list[memoryview] = []
            while not frames:
                data = await self.reader.read(65536)
                if not data:
                    return None
                frames = self.decoder.feed(data)
        assert len(frames) == 1, "one answer at a time in these tests"
        kind, _, message = dp.parse(frames[0])
        return kind, message

    async def closed_after_error(self) -> errors_pb2.ErrorDetail:
        """The ERROR frame (request id 0) the bookie sends before it closes the connection."""
        frame = await self.next_frame()
        assert frame is not None, "the bookie closed without saying why"
        kind, message = frame
        assert kind == dp.ERROR_KIND, dp.kind_name(kind)
        assert await self.next_frame() is None, "the connection was closed"
        self.close()
        return errors_pb2.ErrorDetail.FromString(bytes(message))

    def close(self) -> None:
        self.writer.close()
        self.writer.transport.abort()


async def still_serves(client: BookieClient, ledger: int, entry_id: int) -> None:
    assert await client.add_entries([entry(ledger, entry_id)]) == []
    result = await client.read_entries(ledger, entry_id, entry_id)
    assert [e.entry_id for e in result.entries] == [entry_id]


async def settled(process: BookieProcess) -> None:
    """Until the bookie holds exactly the one well-behaved connection."""
    server = process.data_server
    assert server is not None
    await eventually(lambda: server.connections == 1, timeout_s=5, interval_s=0.01)


async def test_each_broken_connection_is_closed_alone(bookie: BookieProcess) -> None:
    good = BookieClient(bookie.data_address)
    server = bookie.data_server
    assert server is not None
    try:
        await still_serves(good, 7, 0)

        # garbage: its first four bytes claim a frame far over the maximum
        raw = await Raw.open(bookie)
        raw.send(b"\xde\xad\xbe\xef" + bytes(range(256)) * 4)
        detail = await raw.closed_after_error()
        assert int(detail.code) == int(InvalidArgumentError.code)
        assert f"over the maximum of {MAX_FRAME}" in detail.message
        await still_serves(good, 7, 1)

        # an oversized frame after a proper greeting: refused by its length prefix alone,
        # before any of the 1 GiB it announces is sent or buffered
        raw = await Raw.open(bookie)
        kind, _ = await raw.hello()
        assert kind == Kind.HELLO | dp.RESPONSE
        raw.send(struct.pack(">I", 1 << 30) + b"\x02")
        detail = await raw.closed_after_error()
        assert f"{1 << 30} bytes is over the maximum of {MAX_FRAME}" in detail.message
        await still_serves(good, 7, 2)

        # a stream cut inside a frame: 10 of the 100 bytes a frame announced, then EOF
        raw = await Raw.open(bookie)
        await raw.hello()
        raw.send(struct.pack(">I", 100) + b"\x03" + bytes(9))
        raw.writer.write_eof()
        detail = await raw.closed_after_error()
        assert "the stream ended inside a data protocol frame" in detail.message
        await still_serves(good, 7, 3)

        # a frame too short to hold the header
        raw = await Raw.open(bookie)
        await raw.hello()
        raw.send(struct.pack(">I", 3) + b"\x05\x00\x00")
        detail = await raw.closed_after_error()
        assert "shorter than its 9-byte header" in detail.message

        # a kind no one defined, and a response kind from a client
        for kind in (0x42, Kind.FENCE | dp.RESPONSE, Kind.HELLO):
            raw = await Raw.open(bookie)
            await raw.hello()
            raw.send(dp.frame(kind, 1, b""))
            detail = await raw.closed_after_error()
            assert "does not take" in detail.message, detail.message
        await still_serves(good, 7, 4)
        await settled(bookie)
        assert server.protocol_errors == 7
        metrics = bookie.bookie.metrics.render().decode()
        labels = f'{{bookie="{bookie.bookie_id}"}}'
        assert f"magnetar_bookie_data_connections_protocol_errors_total{labels} 7.0" in metrics
        assert f"magnetar_bookie_data_connections{labels} 1.0" in metrics
    finally:
        await good.close()


async def test_no_request_is_read_before_the_greeting(bookie: BookieProcess) -> None:
    good = BookieClient(bookie.data_address)
    try:
        await still_serves(good, 9, 0)
        raw = await Raw.open(bookie)
        raw.send(dp.frame(Kind.FENCE, 1, pb.FenceRequest(ledger_id=9).SerializeToString()))
        detail = await raw.closed_after_error()
        assert "must be HELLO, not FENCE" in detail.message
        # the fence was not done: the writer adds on
        await still_serves(good, 9, 1)
        assert not (await good.read_lac(9)).fenced

        # a client that connects and says nothing is closed at the handshake timeout (0.5 s)
        silent = await Raw.open(bookie)
        assert await silent.next_frame() is None
        silent.close()

        # a greeting of another protocol version
        raw = await Raw.open(bookie)
        hello = framed_pb2.DataHello(protocol_version=99)
        raw.send(dp.frame(Kind.HELLO, 0, hello.SerializeToString()))
        detail = await raw.closed_after_error()
        assert "speaks data protocol version 1, not 99" in detail.message
        await settled(bookie)
    finally:
        await good.close()


async def test_a_bad_message_is_refused_in_band(bookie: BookieProcess) -> None:
    raw = await Raw.open(bookie)
    try:
        await raw.hello()
        raw.send(dp.frame(Kind.READ_ENTRIES, 5, b"\xff\xff\xff"))
        frame = await raw.next_frame()
        assert frame is not None
        kind, message = frame
        assert kind == dp.ERROR_KIND
        detail = errors_pb2.ErrorDetail.FromString(bytes(message))
        assert int(detail.code) == int(InvalidArgumentError.code)
        assert "does not decode as ReadEntriesRequest" in detail.message
        # the connection goes on: a ping, and a read of a ledger this bookie does not hold
        raw.send(dp.frame(Kind.PING, 6))
        pong = await raw.next_frame()
        assert pong is not None
        assert (pong[0], bytes(pong[1])) == (Kind.PING | dp.RESPONSE, b"")
        request = pb.ReadEntriesRequest(ledger_id=404, first_entry_id=0, last_entry_id=0)
        raw.send(dp.frame(Kind.READ_ENTRIES, 7, request.SerializeToString()))
        frame = await raw.next_frame()
        assert frame is not None
        assert frame[0] == dp.ERROR_KIND
        detail = errors_pb2.ErrorDetail.FromString(bytes(frame[1]))
        assert int(detail.code) == int(NoSuchLedgerError.code)
    finally:
        raw.close()


async def test_many_requests_in_flight_on_one_connection(bookie: BookieProcess) -> None:
    client = BookieClient(bookie.data_address)
    try:
        adds = [client.add_entries([entry(11, i)]) for i in range(200)]
        assert await asyncio.gather(*adds) == [[]] * 200
        reads = [client.read_entries(11, i, i) for i in range(200)]
        results = await asyncio.gather(*reads)
        assert [r.entries[0].entry_id for r in results] == list(range(200))
        assert client.connections_opened == 1
    finally:
        await client.close()


async def test_credentials_are_checked_at_the_greeting(tmp_path: Path) -> None:
    static = tmp_path / "static-tokens"
    static.write_text(
        f"broker {hashlib.sha256(TOKEN.encode()).hexdigest()}\n"
        f"billing {hashlib.sha256(b'billing-token').hexdigest()}\n"
    )
    async for bookie in start_bookie(
        tmp_path,
        authentication_enabled=True,
        authentication_providers=("token",),
        token_static_file=static,
        bookie_client_roles=("broker",),
    ):
        # a request before authenticating: the greeting without credentials is refused
        raw = await Raw.open(bookie)
        kind, message = await raw.hello()
        assert kind == dp.ERROR_KIND
        detail = errors_pb2.ErrorDetail.FromString(bytes(message))
        assert int(detail.code) == int(AuthenticationError.code)
        assert await raw.next_frame() is None
        raw.close()

        def client(token: str, bookie: BookieProcess = bookie) -> BookieClient:
            token_file = tmp_path / f"{token}.token"
            token_file.write_text(token)
            credentials = BookieCredentials(token=TokenFile(token_file))
            return BookieClient(bookie.data_address, timeout_s=5, credentials=credentials)

        stranger = client("not-a-token")
        with pytest.raises(AuthenticationError):
            await stranger.info()
        await stranger.close()
        # authenticated, but a role that may not use bookies: refused per request, in band
        billing = client("billing-token")
        for _ in range(2):
            with pytest.raises(AuthorizationError, match="role 'billing' may not read its status"):
                await billing.info()
        assert billing.connections_opened == 1
        await billing.close()
        broker = client(TOKEN)
        await still_serves(broker, 3, 0)
        await broker.close()
