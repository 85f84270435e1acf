"""A client for one bookie: the RPCs of the v1 bookie protocol as domain calls.

Adds go over one long-lived AddEntries stream per bookie. Callers call :meth:`add_entries`
concurrently; a sender task packs everything waiting into as few stream messages as possible,
since every streamed message costs about 0.2 ms of Python time on each side. Messages stop at
``max_message_bytes`` (1 MiB) so that the bookie works on one while the next is in transit:
packing a whole window into one message would make client and bookie take turns. The bookie's
per-entry refusals are mapped back to the callers that sent them. If the stream breaks (the
bookie died or restarted), every add waiting on it fails with :class:`BookieUnavailableError`,
and the next add opens a new stream.

With :class:`BookieCredentials` the channel is TLS (the bookie's certificate checked against the
trusted CAs and its host name; the client's certificate presented for mutual TLS) and a token,
when given, goes on every call and on the add stream. A bookie that refuses the credentials
answers PERMISSION_DENIED or UNAUTHENTICATED: the call fails with that typed error, not a
retriable "unavailable".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import structlog

from bookie.client.config import LedgerClientConfig
from bookie.client.wire import encode_add_request
from bookie.entries import (
    AddEntry,
    AddFailure,
    FenceResult,
    LacResult,
    ReadEntry,
    ReadResult,
)
from magnetar.common.errors import BookieUnavailableError, MagnetarError, ServiceUnavailableError
from magnetar.common.grpc_errors import error_from_detail, error_from_rpc_error
from magnetar.common.security.grpc_credentials import bearer_metadata
from magnetar.common.security.tokens import TokenFile
from proto.bookie.v1 import bookie_pb2 as pb
from proto.bookie.v1 import bookie_pb2_grpc
from proto.common.v1 import types_pb2

log = structlog.get_logger("magnetar.bookie.client")

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


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

    def channel(self, address: str) -> grpc.aio.Channel:
        """A channel to the bookie at ``address``, over TLS when the files are set (read now:
        a certificate rotated on disk is used by the next channel)."""
        if not self.tls:
            return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(self.trust_certs_file),
            private_key=_read(self.key_file),
            certificate_chain=_read(self.cert_file),
        )
        return grpc.aio.secure_channel(address, credentials, options=CHANNEL_OPTIONS)

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        return bearer_metadata(self.token.read() if self.token is not None else None)


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
class _Pending:
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


@dataclass(slots=True)
class _InFlight:
    parts: list[tuple[_Pending, Sequence[AddEntry]]] = field(default_factory=list)


class _AddStream:
    """One AddEntries stream and the adds waiting on it."""

    def __init__(self, client: BookieClient) -> None:
        self._client = client
        self._call: Any = client._add_stream()
        self._outbox: deque[_Pending] = deque()
        self._outbox_ready = asyncio.Event()
        self._in_flight: dict[int, _InFlight] = {}
        self._request_ids = itertools.count(1)
        self._broken: MagnetarError | None = None
        self._sender = asyncio.create_task(self._send(), name=f"bookie-add-send:{client.address}")
        self._receiver = asyncio.create_task(
            self._receive(), name=f"bookie-add-recv:{client.address}"
        )

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def add(self, entries: Sequence[AddEntry]) -> asyncio.Future[list[AddFailure]]:
        future: asyncio.Future[list[AddFailure]] = asyncio.get_running_loop().create_future()
        if not entries:
            future.set_result([])
            return future
        self._outbox.append(_Pending(entries, future))
        self._outbox_ready.set()
        return future

    def _next_message(self) -> tuple[int, _InFlight, list[AddEntry]]:
        """Take up to ``max_message_bytes`` of waiting entries (at least one), splitting a
        call's entries over several messages when they do not fit in one."""
        limit = self._client.max_message_bytes
        taken = _InFlight()
        entries: list[AddEntry] = []
        size = 0
        while self._outbox:
            pending = self._outbox[0]
            start = pending.sent
            while pending.sent < len(pending.entries):
                entry = pending.entries[pending.sent]
                if entries and size + len(entry.payload) > limit:
                    break
                entries.append(entry)
                size += len(entry.payload)
                pending.sent += 1
            if pending.sent > start:
                taken.parts.append((pending, pending.entries[start : pending.sent]))
                pending.parts_out += 1
            if not pending.fully_sent:
                break  # the message is full
            self._outbox.popleft()
        return next(self._request_ids), taken, entries

    async def _send(self) -> None:
        try:
            while True:
                await self._outbox_ready.wait()
                self._outbox_ready.clear()
                while self._outbox:
                    request_id, taken, entries = self._next_message()
                    self._in_flight[request_id] = taken
                    await self._call.write(encode_add_request(request_id, entries))
                    self._client.messages_sent += 1
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any write failure ends this stream; the next add opens one
            self._break(f"the add stream to {self._client.address} broke: {e!r}")

    async def _receive(self) -> None:
        try:
            async for response in self._call:
                taken = self._in_flight.pop(response.request_id, None)
                if taken is None:
                    continue
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
                    pending.parts_out -= 1
                    if pending.parts_out == 0 and pending.fully_sent and not pending.future.done():
                        pending.future.set_result(pending.failures)
            self._break(f"bookie {self._client.address} ended the add stream")
        except asyncio.CancelledError:
            self._break(f"the add stream to {self._client.address} was closed")
            raise
        except grpc.aio.AioRpcError as e:
            error = self._client._error(e)
            if error.retriable:
                self._break(f"the add stream to {self._client.address} broke: {e.code().name}")
            else:  # refused credentials: say so, do not make it look like a flaky bookie
                self._break(error.message, error)

    def _break(self, reason: str, error: MagnetarError | None = None) -> None:
        if self._broken is None:
            self._broken = error or BookieUnavailableError(
                reason, context={"bookie": self._client.address}
            )
            log.info("bookie_add_stream_broken", bookie=self._client.address, reason=reason)
            # end both tasks (whichever is not the one reporting) and the call itself
            current = asyncio.current_task()
            for task in (self._sender, self._receiver):
                if task is not current and not task.done():
                    task.cancel()
            self._call.cancel()
        waiting = [p for f in self._in_flight.values() for p, _ in f.parts] + list(self._outbox)
        self._in_flight.clear()
        self._outbox.clear()
        for pending in waiting:
            if not pending.future.done():
                pending.future.set_exception(self._broken)

    async def close(self) -> None:
        self._call.cancel()
        for task in (self._sender, self._receiver):
            task.cancel()
        for task in (self._sender, self._receiver):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._break(f"the add stream to {self._client.address} was closed")


class BookieClient:
    """Talks to the bookie at ``address`` (host:port)."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 10.0,
        max_message_bytes: int = 1024 * 1024,
        channel: grpc.aio.Channel | None = None,
        credentials: BookieCredentials | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        self.credentials = credentials or BookieCredentials()
        self._channel = channel or self.credentials.channel(address)
        self._stub = bookie_pb2_grpc.BookieServiceStub(self._channel)
        self._adds: _AddStream | None = None
        self.messages_sent = 0
        """AddEntries stream messages sent (for tests and metrics)."""

    def _add_stream(self) -> Any:
        # requests go out pre-encoded (bookie.client.wire), so the stream's serializer is identity
        return self._channel.stream_stream(
            "/magnetar.bookie.v1.BookieService/AddEntries",
            request_serializer=None,
            response_deserializer=pb.AddEntriesResponse.FromString,
        )(metadata=self.credentials.metadata())

    def _error(self, error: grpc.aio.AioRpcError) -> MagnetarError:
        found = error_from_rpc_error(error, self.address)
        if isinstance(found, ServiceUnavailableError):
            return BookieUnavailableError(found.message, context={"bookie": self.address})
        return found

    # --- adds ------------------------------------------------------------------------------

    async def add_entries(self, entries: Sequence[AddEntry]) -> list[AddFailure]:
        """Add entries; returns the ones the bookie refused (empty: all durable).

        Raises BookieUnavailableError if the bookie could not be reached or the stream broke
        before it answered (the entries may or may not be stored).
        """
        return await self.add_entries_nowait(entries)

    def add_entries_nowait(self, entries: Sequence[AddEntry]) -> asyncio.Future[list[AddFailure]]:
        """:meth:`add_entries` as a future, for callers that would rather not spend a task on
        each call. Cancelling the future gives up waiting for the answer."""
        if self._adds is None or self._adds.broken:
            self._adds = _AddStream(self)
        return self._adds.add(entries)

    # --- unary calls --------------------------------------------------------------------------

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
        try:
            response = await self._stub.ReadEntries(
                request, timeout=timeout_s or self.timeout_s, metadata=self.credentials.metadata()
            )
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from None
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
        try:
            response = await self._stub.ReadLac(
                request,
                timeout=self.timeout_s + timeout_ms / 1000,
                metadata=self.credentials.metadata(),
            )
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from None
        entry = None
        if response.HasField("entry"):
            stored = response.entry
            entry = ReadEntry(
                stored.entry_id, stored.last_add_confirmed, stored.payload, stored.crc32c
            )
        return LacResult(ledger_id, response.last_add_confirmed, response.fenced, entry)

    async def fence(self, ledger_id: int) -> FenceResult:
        try:
            response = await self._stub.Fence(
                pb.FenceRequest(ledger_id=ledger_id),
                timeout=self.timeout_s,
                metadata=self.credentials.metadata(),
            )
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from None
        return FenceResult(ledger_id, response.last_add_confirmed, response.last_entry_id)

    async def delete_ledger(self, ledger_id: int) -> None:
        try:
            await self._stub.DeleteLedger(
                pb.DeleteLedgerRequest(ledger_id=ledger_id),
                timeout=self.timeout_s,
                metadata=self.credentials.metadata(),
            )
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from None

    async def info(self) -> BookieInfo:
        try:
            r = await self._stub.GetBookieInfo(
                pb.GetBookieInfoRequest(),
                timeout=self.timeout_s,
                metadata=self.credentials.metadata(),
            )
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from None
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
        try:
            r = await self._stub.ListLedgers(
                pb.ListLedgersRequest(after_ledger_id=after_ledger_id, limit=limit),
                timeout=self.timeout_s,
                metadata=self.credentials.metadata(),
            )
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from None
        return list(r.ledger_ids), r.more

    async def close(self) -> None:
        if self._adds is not None:
            await self._adds.close()
        await self._channel.close()
