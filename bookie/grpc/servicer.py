"""The bookie's gRPC adapter: protobuf in, domain calls, protobuf out, errors as codes.

The AddEntries stream is pipelined. A reader task takes requests off the stream as long as the
entry bytes in flight stay under ``max_inflight_bytes``; past that it stops reading, and gRPC's
flow control pushes back on the client instead of memory growing here. Each request is handled
concurrently and answered when all its entries are durable or refused. Refusals travel in band,
per entry, so one bad entry never ends a stream that other adds share.

Every call is checked first (:class:`~bookie.service.access.BookieAccess`): a caller that is not
a bookie client role is refused with UNAUTHENTICATED or PERMISSION_DENIED before it touches
anything, and the bookie goes on serving everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import structlog

from bookie.entries import AddEntry, AddFailure
from bookie.service.access import BookieAccess
from bookie.service.bookie import Bookie
from bookie.service.budget import InflightBytes
from magnetar import __version__
from magnetar.common.errors import MagnetarError
from magnetar.common.grpc_errors import abort_with, error_to_detail
from magnetar.common.security.grpc_credentials import credentials_of
from proto.bookie.v1 import bookie_pb2 as pb
from proto.bookie.v1 import bookie_pb2_grpc
from proto.common.v1 import types_pb2

log = structlog.get_logger("magnetar.bookie.grpc")

DEFAULT_LIST_LIMIT = 1000
Context = grpc.aio.ServicerContext[Any, Any]


class BookieServicer(bookie_pb2_grpc.BookieServiceServicer):
    """Serves one :class:`Bookie` over the v1 bookie protocol."""

    def __init__(
        self, bookie: Bookie, *, max_inflight_bytes: int, access: BookieAccess | None = None
    ) -> None:
        self.bookie = bookie
        self.max_inflight_bytes = max_inflight_bytes
        self.access = access

    async def _allow(self, context: Context, operation: str) -> None:
        """Refuse the call (UNAUTHENTICATED, PERMISSION_DENIED) unless its caller may."""
        if self.access is None or not self.access.enabled:
            return
        try:
            self.access.check(credentials_of(context), operation)
        except MagnetarError as e:
            await abort_with(context, e)

    async def AddEntries(
        self,
        request_iterator: AsyncIterator[pb.AddEntriesRequest],
        context: grpc.aio.ServicerContext[pb.AddEntriesRequest, pb.AddEntriesResponse],
    ) -> AsyncIterator[pb.AddEntriesResponse]:
        await self._allow(context, "add entries")
        responses: asyncio.Queue[pb.AddEntriesResponse | None] = asyncio.Queue()
        budget = InflightBytes(self.max_inflight_bytes)
        handlers: set[asyncio.Task[None]] = set()

        async def handle(request_id: int, adds: list[AddEntry], size: int) -> None:
            try:
                try:
                    failures = await self.bookie.add_entries(adds)
                except MagnetarError as e:
                    # the request as a whole was refused: each of its entries says why
                    failures = [AddFailure(a.ledger_id, a.entry_id, e) for a in adds]
                response = pb.AddEntriesResponse(request_id=request_id)
                for failure in failures:
                    response.failures.add(
                        ledger_id=failure.ledger_id,
                        entry_id=failure.entry_id,
                        error=error_to_detail(failure.error),
                    )
                responses.put_nowait(response)
            finally:
                budget.release(size)

        async def read_requests() -> None:
            try:
                async for request in request_iterator:
                    # convert once; the payloads' sizes are the budget (ByteSize() would
                    # serialize the whole message again to count it)
                    adds = [
                        AddEntry(
                            e.ledger_id,
                            e.entry_id,
                            e.last_add_confirmed,
                            e.payload,
                            e.crc32c,
                            e.recovery,
                        )
                        for e in request.entries
                    ]
                    size = sum(len(a.payload) for a in adds)
                    await budget.acquire(size)
                    task = asyncio.create_task(handle(request.request_id, adds, size))
                    handlers.add(task)
                    task.add_done_callback(handlers.discard)
                if handlers:
                    await asyncio.gather(*handlers, return_exceptions=True)
            finally:
                responses.put_nowait(None)

        reader = asyncio.create_task(read_requests())
        try:
            while (response := await responses.get()) is not None:
                yield response
            error = reader.exception() if reader.done() and not reader.cancelled() else None
            if isinstance(error, MagnetarError):
                # a request that did not decode or was refused whole ends the stream with its
                # status (INVALID_ARGUMENT, naming the field), not UNKNOWN
                await abort_with(context, error)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            for task in list(handlers):
                task.cancel()

    async def ReadEntries(
        self,
        request: pb.ReadEntriesRequest,
        context: grpc.aio.ServicerContext[pb.ReadEntriesRequest, pb.ReadEntriesResponse],
    ) -> pb.ReadEntriesResponse:
        await self._allow(context, "read entries")
        try:
            result = await self.bookie.read_entries(
                request.ledger_id,
                request.first_entry_id,
                request.last_entry_id,
                request.max_bytes,
                entry_ids=list(request.entry_ids),
            )
        except MagnetarError as e:
            await abort_with(context, e)
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

    async def ReadLac(
        self,
        request: pb.ReadLacRequest,
        context: grpc.aio.ServicerContext[pb.ReadLacRequest, pb.ReadLacResponse],
    ) -> pb.ReadLacResponse:
        await self._allow(context, "read the last add confirmed")
        try:
            result = await self.bookie.read_lac(
                request.ledger_id, request.previous_lac, request.timeout_ms, request.include_entry
            )
        except MagnetarError as e:
            await abort_with(context, e)
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

    async def Fence(
        self,
        request: pb.FenceRequest,
        context: grpc.aio.ServicerContext[pb.FenceRequest, pb.FenceResponse],
    ) -> pb.FenceResponse:
        await self._allow(context, "fence ledgers")
        try:
            result = await self.bookie.fence(request.ledger_id)
        except MagnetarError as e:
            await abort_with(context, e)
        return pb.FenceResponse(
            ledger_id=result.ledger_id,
            last_add_confirmed=result.last_add_confirmed,
            last_entry_id=result.last_entry_id,
        )

    async def DeleteLedger(
        self,
        request: pb.DeleteLedgerRequest,
        context: grpc.aio.ServicerContext[pb.DeleteLedgerRequest, pb.DeleteLedgerResponse],
    ) -> pb.DeleteLedgerResponse:
        await self._allow(context, "delete ledgers")
        try:
            await self.bookie.delete_ledger(request.ledger_id)
        except MagnetarError as e:
            await abort_with(context, e)
        return pb.DeleteLedgerResponse()

    async def GetBookieInfo(
        self,
        request: pb.GetBookieInfoRequest,
        context: grpc.aio.ServicerContext[pb.GetBookieInfoRequest, pb.GetBookieInfoResponse],
    ) -> pb.GetBookieInfoResponse:
        await self._allow(context, "read its status")
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

    async def ListLedgers(
        self,
        request: pb.ListLedgersRequest,
        context: grpc.aio.ServicerContext[pb.ListLedgersRequest, pb.ListLedgersResponse],
    ) -> pb.ListLedgersResponse:
        await self._allow(context, "list ledgers")
        limit = request.limit or DEFAULT_LIST_LIMIT
        ids, more = self.bookie.list_ledgers(request.after_ledger_id, limit)
        return pb.ListLedgersResponse(ledger_ids=ids, more=more)
