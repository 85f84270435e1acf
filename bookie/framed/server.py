"""The bookie's framed data port: the data protocol (:mod:`bookie.data_protocol`) served over
asyncio streams, beside the gRPC adapter and over the same :class:`Bookie` calls.

Per connection, in order:

1. TLS, when the bookie has a certificate: the same files as the gRPC port, reloaded when they
   change, and with a trust file mutual TLS (a client without a certificate its CAs signed
   fails the handshake).
2. HELLO within ``handshake_timeout_s`` of the accept, and before any other frame: the client's
   token (or else its certificate's common name) is authenticated as on gRPC calls. A refusal is
   an ERROR frame with request id 0, and the connection closes.
3. Requests, many in flight. Each request is checked against the role's rights
   (:class:`BookieAccess`, the one rule of every bookie adapter) and refused in band when the
   role may not, like a gRPC call with PERMISSION_DENIED: the connection stays.

Bounds, so one connection cannot take the bookie's memory: frames over ``max_frame_bytes`` are
refused as soon as their length prefix is read; add payload bytes in flight stay under
``max_inflight_bytes`` and other requests under ``max_requests_in_flight``; past either, this
connection's frames are not read, its socket buffer fills, and TCP's window pushes back on the
client. Answers wait for the socket (``drain``) before they are written, so a client that does
not read its answers stops its own requests: an add keeps its bytes in flight until its answer
is written. At most ``max_connections`` connections are held; one more is closed unread.

An add request costs no task: the bookie's future (:meth:`Bookie.add_entries_nowait`) is
answered from its callback once the group commit is durable, written at once when the socket
has room, and only otherwise by a task that waits for it.

A frame that breaks the framing or the protocol (a length over the maximum, a stream cut inside
a frame, an unknown kind, a request before HELLO) gets an ERROR frame naming what was wrong, and
that connection is closed; the bookie and its other connections go on. A request whose message
does not decode is refused in band (INVALID_ARGUMENT), as gRPC's decoding interceptor does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import structlog
from google.protobuf.message import DecodeError, Message

from bookie import data_protocol as dp
from bookie.data_protocol import Kind
from bookie.entries import AddEntry, AddFailure
from bookie.service.access import BookieAccess
from bookie.service.bookie import Bookie
from bookie.service.budget import InflightBytes
from magnetar import __version__
from magnetar.common.errors import (
    AuthenticationExpiredError,
    InvalidArgumentError,
    MagnetarError,
)
from magnetar.common.framing import FrameError, FrameReader
from magnetar.common.grpc_errors import error_to_detail
from magnetar.common.security.authentication import ANONYMOUS, Credentials, Principal
from magnetar.common.security.tls import ReloadingSslContext
from proto.bookie.v1 import bookie_pb2 as pb
from proto.bookie.v1 import framed_pb2
from proto.common.v1 import types_pb2

log = structlog.get_logger("magnetar.bookie.framed")

DEFAULT_LIST_LIMIT = 1000
MAX_CLIENT_NAME_CHARS = 200
_ERROR_WRITE_TIMEOUT_S = 1.0

_OPERATIONS = {
    Kind.ADD_ENTRIES: "add entries",
    Kind.READ_ENTRIES: "read entries",
    Kind.READ_LAC: "read the last add confirmed",
    Kind.FENCE: "fence ledgers",
    Kind.DELETE_LEDGER: "delete ledgers",
    Kind.GET_BOOKIE_INFO: "read its status",
    Kind.LIST_LEDGERS: "list ledgers",
}
"""What each request does, in the words of the gRPC adapter's refusals."""


def _peer(writer: asyncio.StreamWriter) -> str:
    found = writer.get_extra_info("peername")
    if isinstance(found, tuple) and len(found) >= 2:
        host, port = found[0], found[1]
        return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
    return "unknown"


def _common_name(writer: asyncio.StreamWriter) -> str | None:
    """The common name of the client certificate the handshake verified, or None."""
    peercert = writer.get_extra_info("peercert")
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""  # a verified certificate without a common name: authentication says so


class FramedBookieServer:
    """Serves one :class:`Bookie` on the data port."""

    def __init__(
        self,
        bookie: Bookie,
        *,
        access: BookieAccess | None,
        tls: ReloadingSslContext | None = None,
        max_frame_bytes: int,
        max_inflight_bytes: int,
        max_requests_in_flight: int = 256,
        max_connections: int = 0,
        handshake_timeout_s: float = 10.0,
    ) -> None:
        self.bookie = bookie
        self.access = access
        self.tls = tls
        self.max_frame_bytes = max_frame_bytes
        self.max_inflight_bytes = max_inflight_bytes
        self.max_requests_in_flight = max_requests_in_flight
        self.max_connections = max_connections
        self.handshake_timeout_s = handshake_timeout_s
        self.port = 0
        self.accepted = 0
        """Connections taken so far."""
        self.refused = 0
        """Connections closed unread because max_connections were held."""
        self.protocol_errors = 0
        """Connections closed because they broke the framing or the protocol."""
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()

    @property
    def connections(self) -> int:
        """Connections held now."""
        return len(self._connections)

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port``; the bound port (useful with port 0)."""
        self._server = await asyncio.start_server(self._accept, host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.max_connections and len(self._connections) >= self.max_connections:
            self.refused += 1
            writer.transport.abort()  # no handshake, no reading: refusing costs nothing
            return
        self.accepted += 1
        connection = _Connection(self, reader, writer)
        self._connections.add(connection)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)

    async def stop(self, grace_s: float) -> None:
        """Stop listening and reading; answer what is in flight (up to ``grace_s``); close."""
        if self._server is not None:
            self._server.close()
        connections = list(self._connections)
        for connection in connections:
            connection.stop_reading()
        if connections and grace_s > 0:
            draining = [asyncio.ensure_future(c.drained()) for c in connections]
            await asyncio.wait(draining, timeout=grace_s)
            for waiter in draining:
                waiter.cancel()
        for connection in connections:
            connection.cancel_handlers()
            connection.abort()


class _Connection:
    """One client connection: greeting, then requests dispatched to the bookie."""

    def __init__(
        self,
        server: FramedBookieServer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.server = server
        self.bookie = server.bookie
        self.reader = reader
        self.writer = writer
        self.peer = _peer(writer)
        self.principal: Principal = ANONYMOUS
        self.client_name = ""
        self.budget = InflightBytes(server.max_inflight_bytes)
        self.slots = asyncio.Semaphore(server.max_requests_in_flight)
        self.handlers: set[asyncio.Task[None]] = set()
        self.adds: set[asyncio.Future[list[AddFailure]]] = set()
        """Add requests the bookie is storing (answered from their callbacks)."""
        self._reading: asyncio.Task[None] | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        self._reading = asyncio.current_task()
        try:
            frames = await self._greet()
            if frames is not None:
                await self._serve(frames)
                await self.drained()
        except asyncio.CancelledError:
            if self._reading is None:  # stop_reading(): let the handlers finish, then close
                return
            raise
        except (FrameError, dp.ProtocolError) as e:
            self.server.protocol_errors += 1
            log.info(
                "bookie_data_protocol_error",
                peer=self.peer,
                client=self.client_name or None,
                error=e.message,
            )
            await self._refuse_connection(e)
        except AuthenticationExpiredError as e:
            await self._refuse_connection(e)
        except (ConnectionError, OSError, TimeoutError):
            pass  # the client went away, or never finished its handshake: nothing to answer
        finally:
            if self._reading is not None:
                self.cancel_handlers()
                self.abort()

    def stop_reading(self) -> None:
        task, self._reading = self._reading, None
        if task is not None and not task.done():
            task.cancel()

    async def drained(self) -> None:
        """Once every request read has been answered (or has failed)."""
        while self.handlers or self.adds:
            await asyncio.gather(*self.handlers, *self.adds, return_exceptions=True)
            await asyncio.sleep(0)  # an add's callback may have spawned a handler

    def cancel_handlers(self) -> None:
        for task in list(self.handlers):
            task.cancel()
        for adding in list(self.adds):
            adding.cancel()

    def abort(self) -> None:
        # abort, not close: a TLS close would wait for the client's close_notify
        self.writer.transport.abort()

    async def _greet(self) -> FrameReader | None:
        """TLS, then HELLO -> WELCOME, within the handshake timeout; the connection's frames."""
        server = self.server
        async with asyncio.timeout(server.handshake_timeout_s):
            if server.tls is not None:
                await self.writer.start_tls(server.tls.current())
            frames = FrameReader(
                self.reader, max_frame_size=server.max_frame_bytes, name="data protocol frame"
            )
            first = await frames.read_frame()
            if first is None:
                return None
            kind, _, message = dp.parse(first)
            if kind != Kind.HELLO:
                raise dp.ProtocolError(
                    f"the first frame on a bookie data connection must be HELLO, not"
                    f" {dp.kind_name(kind)}: no request is read before the client authenticates",
                    context={"kind": kind},
                )
            try:
                hello = framed_pb2.DataHello.FromString(message)  # type: ignore[arg-type]  # any buffer does
            except DecodeError:
                raise dp.ProtocolError("the HELLO frame holds no DataHello message") from None
            self.client_name = hello.client_name[:MAX_CLIENT_NAME_CHARS]
            if hello.protocol_version != dp.PROTOCOL_VERSION:
                raise dp.ProtocolError(
                    f"this bookie speaks data protocol version {dp.PROTOCOL_VERSION}, not"
                    f" {hello.protocol_version}",
                    context={"protocol_version": hello.protocol_version},
                )
            access = server.access
            if access is not None and access.enabled:
                credentials = Credentials(self.peer, hello.token or None, _common_name(self.writer))
                try:
                    self.principal = access.authentication.authenticate(credentials)
                except MagnetarError as e:
                    await self._refuse_connection(e)
                    return None
            welcome = framed_pb2.DataWelcome(
                protocol_version=dp.PROTOCOL_VERSION,
                bookie_id=self.bookie.bookie_id,
                max_frame_bytes=server.max_frame_bytes,
            )
            self.writer.write(dp.frame(Kind.HELLO | dp.RESPONSE, 0, welcome.SerializeToString()))
            await self.writer.drain()
        return frames

    async def _refuse_connection(self, error: MagnetarError) -> None:
        """Tell the client why (an ERROR frame with request id 0), briefly, before closing."""
        body = error_to_detail(error).SerializeToString()
        with contextlib.suppress(Exception):
            self.writer.write(dp.frame(dp.ERROR_KIND, 0, body))
            await asyncio.wait_for(self.writer.drain(), _ERROR_WRITE_TIMEOUT_S)

    # --- requests --------------------------------------------------------------------------------

    async def _serve(self, frames: FrameReader) -> None:
        while (body := await frames.read_frame()) is not None:
            kind, request_id, message = dp.parse(body)
            if kind == Kind.ADD_ENTRIES:
                await self._add(request_id, message)
            elif kind == Kind.PING:
                await self._answer(Kind.PING, request_id, b"")
            elif kind in dp.REQUEST_KINDS and kind != Kind.HELLO:
                await self.slots.acquire()
                self._spawn(self._unary(kind, request_id, message), self.slots.release)
            else:
                raise dp.ProtocolError(
                    f"a bookie data connection does not take {dp.kind_name(kind)} frames"
                    + (" (the connection has already said HELLO)" if kind == Kind.HELLO else ""),
                    context={"kind": kind, "request_id": request_id},
                )

    def _spawn(self, work: Awaitable[None], done: Callable[[], None]) -> None:
        async def run() -> None:
            try:
                await work
            finally:
                done()

        task = asyncio.create_task(run())
        self.handlers.add(task)
        task.add_done_callback(self.handlers.discard)

    def _authorize(self, kind: int) -> None:
        """Raise the refusal of a role that may not make this request (or whose token expired)."""
        access = self.server.access
        principal = self.principal
        if access is None or principal.anonymous:
            return
        expires = principal.expires_at_ms
        if expires is not None and expires <= time.time() * 1000:
            raise AuthenticationExpiredError(
                "the token this connection authenticated with has expired: reconnect with a"
                " fresh one",
                context={"role": principal.role},
            )
        access.authorize(principal, self.peer, _OPERATIONS[Kind(kind)])

    async def _answer(self, kind: int, request_id: int, message: bytes) -> None:
        # wait for room first, so a client that does not read its answers holds back only
        # the answers in flight, never an unbounded buffer
        await self.writer.drain()
        self.writer.write(dp.frame(kind | dp.RESPONSE, request_id, message))

    async def _answer_error(self, request_id: int, error: MagnetarError) -> None:
        await self.writer.drain()
        self.writer.write(
            dp.frame(dp.ERROR_KIND, request_id, error_to_detail(error).SerializeToString())
        )

    async def _add(self, request_id: int, message: memoryview) -> None:
        try:
            self._authorize(Kind.ADD_ENTRIES)
            request = pb.AddEntriesRequest.FromString(message)  # type: ignore[arg-type]  # any buffer does
        except AuthenticationExpiredError:
            raise
        except DecodeError:
            await self._answer_error(request_id, _undecodable(Kind.ADD_ENTRIES))
            return
        except MagnetarError as e:
            await self._answer_error(request_id, e)
            return
        adds = [
            AddEntry(e.ledger_id, e.entry_id, e.last_add_confirmed, e.payload, e.crc32c, e.recovery)
            for e in request.entries
        ]
        size = sum(len(a.payload) for a in adds)
        await self.budget.acquire(size)
        # no task per add: a future from the bookie, answered from its callback
        adding = self.bookie.add_entries_nowait(adds)
        self.adds.add(adding)
        adding.add_done_callback(functools.partial(self._added, request_id, adds, size))

    def _added(
        self,
        request_id: int,
        adds: list[AddEntry],
        size: int,
        adding: asyncio.Future[list[AddFailure]],
    ) -> None:
        self.adds.discard(adding)
        if adding.cancelled():  # the connection is closing: no answer
            self.budget.release(size)
            return
        error = adding.exception()
        if error is None:
            failures = adding.result()
        elif isinstance(error, MagnetarError):
            # the request as a whole was refused: each of its entries says why
            failures = [AddFailure(a.ledger_id, a.entry_id, error) for a in adds]
        else:
            self.budget.release(size)
            log.error("bookie_add_failed", peer=self.peer, error=repr(error))
            self.abort()  # a bug: the client sees the connection break, as a dead task did
            return
        response = pb.AddEntriesResponse()
        for failure in failures:
            response.failures.add(
                ledger_id=failure.ledger_id,
                entry_id=failure.entry_id,
                error=error_to_detail(failure.error),
            )
        answer = dp.frame(Kind.ADD_ENTRIES | dp.RESPONSE, request_id, response.SerializeToString())
        if self.writer.is_closing():  # the client went away: no one to answer
            self.budget.release(size)
            return
        if not self._write_paused():
            # the socket takes it now: no task to wait for room
            self.writer.write(answer)
            self.budget.release(size)
            return

        async def when_room() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.drain()
                self.writer.write(answer)

        self._spawn(when_room(), lambda: self.budget.release(size))

    def _write_paused(self) -> bool:
        """Whether the transport's buffer is over its high-water mark (``drain`` would wait)."""
        transport = self.writer.transport
        return transport.get_write_buffer_size() > transport.get_write_buffer_limits()[1]

    async def _unary(self, kind: int, request_id: int, message: memoryview) -> None:
        request_type, call = self._calls[Kind(kind)]
        try:
            self._authorize(kind)
            try:
                request = request_type.FromString(message)
            except DecodeError:
                raise _undecodable(Kind(kind)) from None
            response = await call(self, request)
        except MagnetarError as e:
            with contextlib.suppress(ConnectionError, OSError):
                await self._answer_error(request_id, e)
            if isinstance(e, AuthenticationExpiredError):
                self.abort()
            return
        with contextlib.suppress(ConnectionError, OSError):
            await self._answer(kind, request_id, response.SerializeToString())

    async def _read_entries(self, request: Any) -> Message:
        result = await self.bookie.read_entries(
            request.ledger_id,
            request.first_entry_id,
            request.last_entry_id,
            request.max_bytes,
            entry_ids=list(request.entry_ids),
        )
        response = pb.ReadEntriesResponse(
            ledger_id=result.ledger_id,
            last_add_confirmed=result.last_add_confirmed,
            fenced=result.fenced,
        )
        for entry in result.entries:
            response.entries.add(
                entry_id=entry.entry_id,
                last_add_confirmed=entry.last_add_confirmed,
                payload=entry.payload,
                crc32c=entry.crc32c,
            )
        return response

    async def _read_lac(self, request: Any) -> Message:
        result = await self.bookie.read_lac(
            request.ledger_id, request.previous_lac, request.timeout_ms, request.include_entry
        )
        response = pb.ReadLacResponse(
            ledger_id=result.ledger_id,
            last_add_confirmed=result.last_add_confirmed,
            fenced=result.fenced,
        )
        if result.entry is not None:
            response.entry.entry_id = result.entry.entry_id
            response.entry.last_add_confirmed = result.entry.last_add_confirmed
            response.entry.payload = result.entry.payload
            response.entry.crc32c = result.entry.crc32c
        return response

    async def _fence(self, request: Any) -> Message:
        result = await self.bookie.fence(request.ledger_id)
        return pb.FenceResponse(
            ledger_id=result.ledger_id,
            last_add_confirmed=result.last_add_confirmed,
            last_entry_id=result.last_entry_id,
        )

    async def _delete_ledger(self, request: Any) -> Message:
        await self.bookie.delete_ledger(request.ledger_id)
        return pb.DeleteLedgerResponse()

    async def _info(self, request: Any) -> Message:  # noqa: ARG002 - the table's signature
        status = self.bookie.status()
        return pb.GetBookieInfoResponse(
            bookie_id=status.bookie_id,
            address=status.address,
            state=(
                types_pb2.BOOKIE_STATE_READ_ONLY
                if status.read_only
                else types_pb2.BOOKIE_STATE_WRITABLE
            ),
            total_disk_bytes=status.total_disk_bytes,
            free_disk_bytes=status.free_disk_bytes,
            ledger_count=status.ledger_count,
            version=__version__,
            labels=status.labels,
        )

    async def _list_ledgers(self, request: Any) -> Message:
        ids, more = self.bookie.list_ledgers(
            request.after_ledger_id, request.limit or DEFAULT_LIST_LIMIT
        )
        return pb.ListLedgersResponse(ledger_ids=ids, more=more)

    _calls: ClassVar[dict[Kind, tuple[Any, Callable[[_Connection, Any], Awaitable[Message]]]]] = {
        Kind.READ_ENTRIES: (pb.ReadEntriesRequest, _read_entries),
        Kind.READ_LAC: (pb.ReadLacRequest, _read_lac),
        Kind.FENCE: (pb.FenceRequest, _fence),
        Kind.DELETE_LEDGER: (pb.DeleteLedgerRequest, _delete_ledger),
        Kind.GET_BOOKIE_INFO: (pb.GetBookieInfoRequest, _info),
        Kind.LIST_LEDGERS: (pb.ListLedgersRequest, _list_ledgers),
    }


def _undecodable(kind: Kind) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"the {kind.name} request's message does not decode as {_MESSAGE_NAMES[kind]}",
        context={"kind": kind.name},
    )


_MESSAGE_NAMES = {
    Kind.ADD_ENTRIES: "AddEntriesRequest",
    Kind.READ_ENTRIES: "ReadEntriesRequest",
    Kind.READ_LAC: "ReadLacRequest",
    Kind.FENCE: "FenceRequest",
    Kind.DELETE_LEDGER: "DeleteLedgerRequest",
    Kind.GET_BOOKIE_INFO: "GetBookieInfoRequest",
    Kind.LIST_LEDGERS: "ListLedgersRequest",
}

__all__ = ["FramedBookieServer"]
