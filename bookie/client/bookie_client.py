"""A client for one bookie: the requests of the bookie data protocol as domain calls.

One connection per bookie carries everything: the framed data protocol
(:mod:`bookie.data_protocol`, ``docs/protocol.md``) over TCP, or TLS when credentials say so.
Requests are tagged with ids, many in flight at once, and answered in any order; a request that
fails as a whole comes back as an ERROR frame, which is rebuilt into the typed error its code
names (never from its text), as gRPC's trailers were.

Adds: callers call :meth:`add_entries` concurrently; a sender task packs everything waiting
into as few frames as possible. Frames stop at ``max_message_bytes`` (1 MiB) so that the bookie
works on one while the next is in transit: packing a whole window into one frame would make
client and bookie take turns. The bookie's per-entry refusals are mapped back to the callers
that sent them. Writes wait for the socket (``drain``): a bookie that reads slowly slows its
writers down instead of filling memory here. While the sender is idle, the calls of one loop turn
are packed and written at the end of that turn by a callback, without waking the sender task;
the sender takes over when the socket is full.

If the connection breaks (the bookie died or restarted, or stopped answering pings), every
request waiting on it fails with :class:`BookieUnavailableError`, and the next request opens a
new connection. A silent connection with requests outstanding is pinged after
:data:`KEEPALIVE_S` and dropped when nothing comes back within :data:`KEEPALIVE_TIMEOUT_S` (a
SIGSTOPped bookie, a cut network), as gRPC's keepalive did.

With :class:`BookieCredentials` the connection is TLS (the bookie's certificate checked against
the trusted CAs and its host name; the client's certificate presented for mutual TLS) and a
token, when given, goes in the greeting. A bookie that refuses the credentials answers the
greeting with an ERROR: every request fails with that typed error, not a retriable
"unavailable"; a role the bookie does not allow gets AuthorizationError per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import structlog
from google.protobuf.message import DecodeError, Message

from bookie import data_protocol as dp
from bookie.client.config import LedgerClientConfig
from bookie.client.wire import add_request_parts
from bookie.data_protocol import Kind
from bookie.entries import (
    AddEntry,
    AddFailure,
    FenceResult,
    LacResult,
    ReadEntry,
    ReadResult,
)
from magnetar.common.errors import (
    BookieUnavailableError,
    MagnetarError,
    OperationTimeoutError,
    ServiceUnavailableError,
)
from magnetar.common.framing import FrameError, FrameReader
from magnetar.common.grpc_errors import error_from_detail
from magnetar.common.security.tokens import TokenFile
from proto.bookie.v1 import bookie_pb2 as pb
from proto.bookie.v1 import framed_pb2
from proto.common.v1 import errors_pb2, types_pb2

log = structlog.get_logger("magnetar.bookie.client")

MAX_RESPONSE_FRAME_BYTES = 256 * 1024 * 1024
"""The largest answer a client takes (a read of many large entries)."""
KEEPALIVE_S = 10.0
"""Silence, with requests outstanding, after which the client pings the bookie."""
KEEPALIVE_TIMEOUT_S = 5.0
"""How long a ping may go unanswered (with nothing else heard) before the connection is
dropped."""
READ_SIZE = 256 * 1024

_M = TypeVar("_M", bound=Message)


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class BookieCredentials:
    """How the ledger client proves itself to bookies: TLS files, a token file, or both."""

    trust_certs_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    token: TokenFile | None = None

    @classmethod
    def from_config(cls, config: LedgerClientConfig) -> BookieCredentials | None:
        """The credentials ``config`` asks for; None when it asks for none."""
        if not config.tls_enabled and config.auth_token_file is None:
            return None
        return cls(
            config.tls_trust_certs_file,
            config.tls_cert_file,
            config.tls_key_file,
            TokenFile(config.auth_token_file) if config.auth_token_file is not None else None,
        )

    @property
    def tls(self) -> bool:
        return self.trust_certs_file is not None or self.cert_file is not None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a new connection, or None for plain TCP (the files are read now:
        a certificate rotated on disk is used by the next connection)."""
        if not self.tls:
            return None
        context = ssl.create_default_context(
            cafile=str(self.trust_certs_file) if self.trust_certs_file is not None else None
        )
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context

    def token_value(self) -> str:
        """The token to present ("" for none)."""
        return (self.token.read() or "") if self.token is not None else ""


@dataclass(frozen=True, slots=True)
class BookieInfo:
    bookie_id: str
    address: str
    read_only: bool
    total_disk_bytes: int
    free_disk_bytes: int
    ledger_count: int
    version: str
    labels: dict[str, str]


@dataclass(slots=True)
class PendingAdd:
    """One add_entries call: its entries may travel in several stream messages (parts)."""

    entries: Sequence[AddEntry]
    future: asyncio.Future[list[AddFailure]]
    sent: int = 0
    """Entries already put into a message."""
    parts_out: int = 0
    """Messages carrying some of its entries that have not been answered yet."""
    failures: list[AddFailure] = field(default_factory=list)

    @property
    def fully_sent(self) -> bool:
        return self.sent == len(self.entries)


MessageParts = list[tuple[PendingAdd, Sequence[AddEntry]]]
"""The calls a message carries entries of, each with those entries."""


def take_message(outbox: deque[PendingAdd], limit: int) -> tuple[MessageParts, list[AddEntry]]:
    """Take up to ``limit`` bytes of waiting entries (at least one) off the front of ``outbox``,
    splitting a call's entries over several messages when they do not fit in one: the parts of
    calls the message carries, and its entries."""
    parts: MessageParts = []
    entries: list[AddEntry] = []
    size = 0
    while outbox:
        pending = outbox[0]
        start = pending.sent
        while pending.sent < len(pending.entries):
            entry = pending.entries[pending.sent]
            if entries and size + len(entry.payload) > limit:
                break
            entries.append(entry)
            size += len(entry.payload)
            pending.sent += 1
        if pending.sent > start:
            parts.append((pending, pending.entries[start : pending.sent]))
            pending.parts_out += 1
        if not pending.fully_sent:
            break  # the message is full
        outbox.popleft()
    return parts, entries


@dataclass(slots=True)
class _InFlight:
    parts: MessageParts = field(default_factory=list)


class _Connection:
    """One connection to a bookie and the requests waiting on it."""

    def __init__(self, client: BookieClient) -> None:
        self._client = client
        self._writer: asyncio.StreamWriter | None = None
        self._outbox: deque[PendingAdd] = deque()
        self._outbox_ready = asyncio.Event()
        self._sender_idle = False
        """The sender task waits for adds, with nothing written and not drained."""
        self._flush_scheduled = False
        self._adds: dict[int, _InFlight] = {}
        self._calls: dict[int, asyncio.Future[tuple[int, memoryview]]] = {}
        self._request_ids = itertools.count(1)
        self._broken: MagnetarError | None = None
        self._last_heard = 0.0
        loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[None] = loop.create_future()
        self._tasks: list[asyncio.Task[None]] = []
        self._main = asyncio.create_task(self._run(), name=f"bookie-conn:{client.address}")

    @property
    def broken(self) -> bool:
        return self._broken is not None

    # --- the connection ------------------------------------------------------------------------

    async def _connect(self) -> tuple[FrameReader, asyncio.StreamWriter]:
        client = self._client
        credentials = client.credentials
        host, port = _split_address(client.address)
        try:
            async with asyncio.timeout(client.timeout_s):
                context = credentials.ssl_context()
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    ssl=context,
                    server_hostname=host if context is not None else None,
                    limit=READ_SIZE,
                )
                self._writer = writer
                frames = FrameReader(
                    reader, max_frame_size=MAX_RESPONSE_FRAME_BYTES, read_size=READ_SIZE
                )
                hello = framed_pb2.DataHello(
                    protocol_version=dp.PROTOCOL_VERSION,
                    token=credentials.token_value(),
                    client_name=client.name,
                )
                writer.write(dp.frame(Kind.HELLO, 0, hello.SerializeToString()))
                await writer.drain()
                body = await frames.read_frame()
        except TimeoutError:
            raise BookieUnavailableError(
                f"bookie {client.address} did not answer the data protocol's greeting within"
                f" {client.timeout_s:g} s",
                context={"bookie": client.address},
            ) from None
        except ssl.SSLError as e:
            raise BookieUnavailableError(
                f"the TLS connection to bookie {client.address} failed: {e.reason or e}",
                context={"bookie": client.address},
            ) from None
        except (OSError, FrameError) as e:
            raise BookieUnavailableError(
                f"cannot reach bookie {client.address}: {getattr(e, 'strerror', None) or e}",
                context={"bookie": client.address},
            ) from None
        if body is None:
            raise BookieUnavailableError(
                f"bookie {client.address} closed the connection before its greeting (a refused"
                " client certificate, or not a data port)",
                context={"bookie": client.address},
            )
        kind, _, message = dp.parse(body)
        if kind == dp.ERROR_KIND:
            raise self._error(message)
        if kind != Kind.HELLO | dp.RESPONSE:
            raise BookieUnavailableError(
                f"bookie {client.address} answered the greeting with {dp.kind_name(kind)}",
                context={"bookie": client.address},
            )
        return frames, writer

    async def _run(self) -> None:
        try:
            try:
                frames, writer = await self._connect()
            except MagnetarError as e:
                self._break(e.message, e)
                return
            self._last_heard = asyncio.get_running_loop().time()
            self._ready.set_result(None)
            self._tasks = [
                asyncio.create_task(self._send(writer)),
                asyncio.create_task(self._keepalive(writer)),
            ]
            await self._receive(frames)
        except asyncio.CancelledError:
            self._break(f"the connection to bookie {self._client.address} was closed")
            raise
        except Exception as e:  # noqa: BLE001 - whatever ends the reading ends the connection
            self._break(f"the connection to bookie {self._client.address} broke: {e!r}")

    async def _receive(self, frames: FrameReader) -> None:
        loop = asyncio.get_running_loop()
        while (body := await frames.read_frame()) is not None:
            self._last_heard = loop.time()
            kind, request_id, message = dp.parse(body)
            if kind == Kind.ADD_ENTRIES | dp.RESPONSE:
                self._answered_add(request_id, pb.AddEntriesResponse.FromString(message))  # type: ignore[arg-type]  # any buffer does
            elif kind == dp.ERROR_KIND and request_id == 0:
                error = self._error(message)
                self._break(error.message, error if not error.retriable else None)
                return
            elif kind == dp.ERROR_KIND and request_id in self._adds:
                self._failed_add(request_id, self._error(message))
            else:
                future = self._calls.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result((kind, message))
        self._break(f"bookie {self._client.address} closed the connection")

    def _error(self, message: memoryview) -> MagnetarError:
        try:
            detail = errors_pb2.ErrorDetail.FromString(message)  # type: ignore[arg-type]  # any buffer does
        except DecodeError:
            return BookieUnavailableError(
                f"bookie {self._client.address} sent an error that does not decode",
                context={"bookie": self._client.address},
            )
        error = error_from_detail(detail)
        if isinstance(error, ServiceUnavailableError):
            return BookieUnavailableError(error.message, context={"bookie": self._client.address})
        return error

    async def _keepalive(self, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(KEEPALIVE_S / 2)
            if not (self._adds or self._calls or self._outbox):
                continue
            if loop.time() - self._last_heard < KEEPALIVE_S:
                continue
            pinged_at = loop.time()
            writer.write(dp.frame(Kind.PING, 0))
            await asyncio.sleep(KEEPALIVE_TIMEOUT_S)
            if self._last_heard < pinged_at:
                self._break(
                    f"bookie {self._client.address} answered nothing for"
                    f" {KEEPALIVE_S + KEEPALIVE_TIMEOUT_S:g} s, a ping included"
                )
                return

    def _break(self, reason: str, error: MagnetarError | None = None) -> None:
        if self._broken is None:
            self._broken = error or BookieUnavailableError(
                reason, context={"bookie": self._client.address}
            )
            log.info("bookie_connection_broken", bookie=self._client.address, reason=reason)
            current = asyncio.current_task()
            for task in (self._main, *self._tasks):
                if task is not current and not task.done():
                    task.cancel()
            if self._writer is not None:
                self._writer.transport.abort()
            if not self._ready.done():
                self._ready.set_exception(self._broken)
                self._ready.exception()  # retrieved: a connection no one waited on is no error
        waiting = [p for f in self._adds.values() for p, _ in f.parts] + list(self._outbox)
        self._adds.clear()
        self._outbox.clear()
        for pending in waiting:
            if not pending.future.done():
                pending.future.set_exception(self._broken)
        calls = list(self._calls.values())
        self._calls.clear()
        for future in calls:
            if not future.done():
                future.set_exception(self._broken)

    async def close(self) -> None:
        for task in (self._main, *self._tasks):
            task.cancel()
        for task in (self._main, *self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._break(f"the connection to bookie {self._client.address} was closed")

    # --- adds -----------------------------------------------------------------------------------

    def add(self, entries: Sequence[AddEntry]) -> asyncio.Future[list[AddFailure]]:
        future: asyncio.Future[list[AddFailure]] = asyncio.get_running_loop().create_future()
        if not entries:
            future.set_result([])
            return future
        if self._broken is not None:
            future.set_exception(self._broken)
            return future
        self._outbox.append(PendingAdd(entries, future))
        if self._sender_idle:
            # written at the end of this loop turn with whatever else comes in it, packed as
            # the sender would, without waking the sender task (a task switch per add call)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)
        else:
            self._outbox_ready.set()
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._broken is not None:
            return
        if self._sender_idle:
            while self._outbox and not self._write_paused():
                self._write_message()
        if self._outbox:
            self._outbox_ready.set()  # the socket is full: the sender waits for room

    def _write_paused(self) -> bool:
        """Whether the socket's buffer is over its high-water mark (``drain`` would wait)."""
        writer = self._writer
        if writer is None:
            return True
        transport = writer.transport
        return transport.get_write_buffer_size() > transport.get_write_buffer_limits()[1]

    def _write_message(self) -> None:
        """Write one frame of waiting adds (up to ``max_message_bytes``)."""
        assert self._writer is not None
        request_id, taken, entries = self._next_message()
        self._adds[request_id] = taken
        parts = add_request_parts(0, entries)
        self._writer.write(dp.frame_of_parts(Kind.ADD_ENTRIES, request_id, parts))
        self._client.messages_sent += 1

    def _next_message(self) -> tuple[int, _InFlight, list[AddEntry]]:
        """The next message: up to ``max_message_bytes`` of waiting entries (see
        :func:`take_message`)."""
        parts, entries = take_message(self._outbox, self._client.max_message_bytes)
        return next(self._request_ids), _InFlight(parts), entries

    async def _send(self, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                self._sender_idle = True
                await self._outbox_ready.wait()
                self._sender_idle = False
                self._outbox_ready.clear()
                while self._outbox:
                    self._write_message()
                    await writer.drain()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any write failure ends this connection
            self._break(f"the connection to bookie {self._client.address} broke: {e!r}")

    def _answered_add(self, request_id: int, response: pb.AddEntriesResponse) -> None:
        taken = self._adds.pop(request_id, None)
        if taken is None:
            return
        by_entry: dict[tuple[int, int], MagnetarError] = {
            (f.ledger_id, f.entry_id): error_from_detail(f.error) for f in response.failures
        }
        for pending, part in taken.parts:
            if by_entry:
                pending.failures.extend(
                    AddFailure(e.ledger_id, e.entry_id, by_entry[(e.ledger_id, e.entry_id)])
                    for e in part
                    if (e.ledger_id, e.entry_id) in by_entry
                )
            self._part_done(pending)

    def _failed_add(self, request_id: int, error: MagnetarError) -> None:
        """The bookie refused a whole add request (the role may not add, the message did not
        decode): the calls it carried fail with ``error``, as a refused gRPC stream did."""
        taken = self._adds.pop(request_id, None)
        if taken is None:
            return
        for pending, _ in taken.parts:
            pending.parts_out -= 1
            if not pending.future.done():
                pending.future.set_exception(error)

    @staticmethod
    def _part_done(pending: PendingAdd) -> None:
        pending.parts_out -= 1
        if pending.parts_out == 0 and pending.fully_sent and not pending.future.done():
            pending.future.set_result(pending.failures)

    # --- other requests ---------------------------------------------------------------------

    async def call(self, kind: Kind, request: Message, answer: type[_M], timeout_s: float) -> _M:
        """Send one request and wait (up to ``timeout_s``, connecting included) for its answer."""
        client = self._client
        request_id = next(self._request_ids)
        future: asyncio.Future[tuple[int, memoryview]] | None = None
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._ready)
                if self._broken is not None:
                    raise self._broken
                assert self._writer is not None
                future = asyncio.get_running_loop().create_future()
                self._calls[request_id] = future
                self._writer.write(dp.frame(kind, request_id, request.SerializeToString()))
                await self._writer.drain()
                got, message = await future
        except TimeoutError:
            raise OperationTimeoutError(
                f"no answer from bookie {client.address} in {timeout_s:g} s",
                context={"peer": client.address, "request": kind.name},
            ) from None
        except (ConnectionError, OSError) as e:
            self._break(f"the connection to bookie {client.address} broke: {e!r}")
            raise self._broken or BookieUnavailableError(str(e)) from None
        finally:
            if future is not None:
                self._calls.pop(request_id, None)
        if got == dp.ERROR_KIND:
            raise self._error(message)
        if got != kind | dp.RESPONSE:
            raise BookieUnavailableError(
                f"bookie {client.address} answered a {kind.name} request with {dp.kind_name(got)}",
                context={"bookie": client.address},
            )
        try:
            return answer.FromString(message)  # type: ignore[arg-type]  # any buffer does
        except DecodeError:
            raise BookieUnavailableError(
                f"bookie {client.address} sent a {kind.name} answer that does not decode",
                context={"bookie": client.address},
            ) from None


class BookieClient:
    """Talks to the bookie whose data port is at ``address`` (host:port)."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 10.0,
        max_message_bytes: int = 1024 * 1024,
        credentials: BookieCredentials | None = None,
        name: str = "ledger-client",
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        self.credentials = credentials or BookieCredentials()
        self.name = name
        self._connection: _Connection | None = None
        self.messages_sent = 0
        """Add frames sent (for tests and metrics)."""
        self.connections_opened = 0
        """Connections opened to the bookie so far (for tests and metrics)."""

    def _conn(self) -> _Connection:
        if self._connection is None or self._connection.broken:
            self._connection = _Connection(self)
            self.connections_opened += 1
        return self._connection

    # --- adds ------------------------------------------------------------------------------

    async def add_entries(self, entries: Sequence[AddEntry]) -> list[AddFailure]:
        """Add entries; returns the ones the bookie refused (empty: all durable).

        Raises BookieUnavailableError if the bookie could not be reached or the connection
        broke before it answered (the entries may or may not be stored).
        """
        return await self.add_entries_nowait(entries)

    def add_entries_nowait(self, entries: Sequence[AddEntry]) -> asyncio.Future[list[AddFailure]]:
        """:meth:`add_entries` as a future, for callers that would rather not spend a task on
        each call. Cancelling the future gives up waiting for the answer."""
        return self._conn().add(entries)

    # --- other requests ------------------------------------------------------------------------

    async def read_entries(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_bytes: int = 0,
        entry_ids: Sequence[int] = (),
        timeout_s: float | None = None,
    ) -> ReadResult:
        """A range of entries; or, with ``entry_ids``, those of them this bookie holds."""
        request = pb.ReadEntriesRequest(
            ledger_id=ledger_id,
            first_entry_id=first_entry_id,
            last_entry_id=last_entry_id,
            max_bytes=max_bytes,
            entry_ids=entry_ids,
        )
        response = await self._conn().call(
            Kind.READ_ENTRIES, request, pb.ReadEntriesResponse, timeout_s or self.timeout_s
        )
        entries = [
            ReadEntry(s.entry_id, s.last_add_confirmed, s.payload, s.crc32c)
            for s in response.entries
        ]
        return ReadResult(ledger_id, entries, response.last_add_confirmed, response.fenced)

    async def read_lac(
        self,
        ledger_id: int,
        *,
        previous_lac: int = -2,
        timeout_ms: int = 0,
        include_entry: bool = False,
    ) -> LacResult:
        request = pb.ReadLacRequest(
            ledger_id=ledger_id,
            previous_lac=previous_lac,
            timeout_ms=timeout_ms,
            include_entry=include_entry,
        )
        response = await self._conn().call(
            Kind.READ_LAC, request, pb.ReadLacResponse, self.timeout_s + timeout_ms / 1000
        )
        entry = None
        if response.HasField("entry"):
            stored = response.entry
            entry = ReadEntry(
                stored.entry_id, stored.last_add_confirmed, stored.payload, stored.crc32c
            )
        return LacResult(ledger_id, response.last_add_confirmed, response.fenced, entry)

    async def fence(self, ledger_id: int) -> FenceResult:
        response = await self._conn().call(
            Kind.FENCE, pb.FenceRequest(ledger_id=ledger_id), pb.FenceResponse, self.timeout_s
        )
        return FenceResult(ledger_id, response.last_add_confirmed, response.last_entry_id)

    async def delete_ledger(self, ledger_id: int) -> None:
        await self._conn().call(
            Kind.DELETE_LEDGER,
            pb.DeleteLedgerRequest(ledger_id=ledger_id),
            pb.DeleteLedgerResponse,
            self.timeout_s,
        )

    async def info(self) -> BookieInfo:
        r = await self._conn().call(
            Kind.GET_BOOKIE_INFO,
            pb.GetBookieInfoRequest(),
            pb.GetBookieInfoResponse,
            self.timeout_s,
        )
        return BookieInfo(
            r.bookie_id,
            r.address,
            r.state == types_pb2.BOOKIE_STATE_READ_ONLY,
            r.total_disk_bytes,
            r.free_disk_bytes,
            r.ledger_count,
            r.version,
            dict(r.labels),
        )

    async def list_ledgers(
        self, *, after_ledger_id: int = -1, limit: int = 0
    ) -> tuple[list[int], bool]:
        r = await self._conn().call(
            Kind.LIST_LEDGERS,
            pb.ListLedgersRequest(after_ledger_id=after_ledger_id, limit=limit),
            pb.ListLedgersResponse,
            self.timeout_s,
        )
        return list(r.ledger_ids), r.more

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
