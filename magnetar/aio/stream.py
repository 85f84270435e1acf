"""The life of one partition's stream to its owner, shared by producers and consumers.

A :class:`PartitionStream` runs until closed or failed: it looks its partition up, opens a stream
on the owner, serves it (a writer and a reader task) until it ends, and then backs off and
reconnects, or fails for good when the error is final. What a producer and a consumer put on the
stream and make of the answers are hooks; the loop, the open handshake and its errors are here.

The stream opens with the client's credentials (:meth:`ConnectionPool.call_metadata`). When the
broker says they expired (``auth_challenge``), the token supplier is asked again and the fresh
token goes back in band (``auth``): the stream goes on, nothing is resent.

The events it logs start with the stream's role: ``producer_reconnecting``,
``consumer_stream_crashed``, ``producer_failed`` and so on.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import grpc
import grpc.aio

from magnetar.aio.backoff import Backoff
from magnetar.aio.connection import is_transient
from magnetar.common.errors import (
    ClientConnectionError,
    MagnetarError,
    ProtocolError,
    ServiceNotReadyError,
    TopicLookupError,
    TopicNotOwnedError,
)
from magnetar.common.grpc_errors import error_from_detail, error_from_rpc_error
from proto.common.v1 import errors_pb2

if TYPE_CHECKING:
    from magnetar.aio.config import ClientConfig
    from magnetar.aio.connection import ConnectionPool, PartitionOwner
    from magnetar.common.log import LibraryLogger
    from proto.broker.v1 import broker_pb2_grpc

__all__ = ["PartitionStream", "reconnect_delay_s"]

_SETTLE_TIMEOUT_S = 1.0

MOVING_RETRY_MAX_S = 0.25
"""Longest pause before reconnecting a partition that a broker reported as moving."""


def reconnect_delay_s(error: MagnetarError, backoff: Backoff) -> float:
    """The pause before the next attempt: the backoff's, but at most
    :data:`MOVING_RETRY_MAX_S` (or the backoff's first pause, if longer) when a broker said the
    partition is moving (not owned there, or no session there).

    Such a partition gets its next owner the moment the old owner's session ends, which the
    client cannot foresee (a broker cut off from the metadata store gives its partitions up a
    little before its lease expires). Sleeping a whole ``max_backoff_ms`` then would add up to
    that much to the outage; a quarter of a second is no tight loop.
    """
    delay_s = backoff.next_delay_s()
    if isinstance(error, TopicNotOwnedError | ServiceNotReadyError):
        return min(delay_s, max(MOVING_RETRY_MAX_S, backoff.initial_s))
    return delay_s


class PartitionStream(ABC):
    """One partition's stream, reopened on the partition's current owner until closed or failed."""

    _role: ClassVar[str]
    """``"producer"`` or ``"consumer"``: the first word of log events and errors."""
    _busy_error: ClassVar[type[MagnetarError]]
    """Refused because the stream is open already; retried once the first open succeeded."""
    _opened_kind: ClassVar[str]
    """The kind of the broker's first reply that says the stream is open."""
    _open_request_name: ClassVar[str]
    """The first request as errors name it (``a subscribe``)."""
    _open_verb: ClassVar[str]
    """What the broker did not do in time (``answer the subscribe``)."""
    _open_gerund: ClassVar[str]
    """What the stream ended before (``subscribing``)."""

    def __init__(
        self,
        *,
        partition_topic: str,
        partition: int,
        client_config: ClientConfig,
        pool: ConnectionPool,
        log: LibraryLogger,
    ) -> None:
        self._client_config = client_config
        self._pool = pool
        self.partition_topic = partition_topic
        self.partition = partition
        """Partition index; -1 for a non-partitioned topic."""
        self.connected = False
        self.broker: str | None = None
        self._opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ever_opened = False
        self.error: MagnetarError | None = None
        """Set when the partition failed for good."""
        self.last_error: MagnetarError | None = None
        """The last reason a connection attempt failed or a stream ended."""
        self._closing = False
        self._call: Any = None
        self._run_task: asyncio.Task[None] | None = None
        self._auth_tasks: set[asyncio.Task[None]] = set()
        self._log = log

    # --- hooks -----------------------------------------------------------------------------

    @abstractmethod
    def _open_call(
        self,
        stub: broker_pb2_grpc.BrokerServiceAsyncStub,
        metadata: tuple[tuple[str, str], ...] | None,
    ) -> Any:
        """Start the bidirectional call on the owner, with ``metadata`` (the credentials)."""

    @abstractmethod
    def _send_control(self, token: str) -> None:
        """Queue the answer to an auth challenge (a request holding ``token``) ahead of the
        stream's other requests."""

    @abstractmethod
    def _open_request(self) -> Any:
        """The first request on a new stream."""

    @abstractmethod
    def _on_opened(self, reply: Any, owner: PartitionOwner) -> None:
        """The broker opened the stream (``reply`` is its first answer): set ``connected``."""

    @abstractmethod
    def _on_disconnected(self) -> None:
        """The stream ended, however: clear ``connected`` and what belonged to that stream."""

    @abstractmethod
    async def _write(self, call: Any) -> NoReturn:
        """Write requests on the stream until the call breaks."""

    @abstractmethod
    def _on_response(self, kind: str | None, response: Any) -> MagnetarError | None:
        """Handle one answer other than ``closed``; an error ends the stream."""

    @abstractmethod
    def _on_failed(self, error: MagnetarError) -> None:
        """The partition failed for good: fail whatever waits on it."""

    def _closed(self, closed: Any, address: str) -> MagnetarError:
        """The broker closed the stream: why."""
        detail: errors_pb2.ErrorDetail = closed.reason
        if detail.code == errors_pb2.ERROR_CODE_UNSPECIFIED:
            return ServiceNotReadyError(
                f"broker {address} closed the stream", context={"broker": address}
            )
        return error_from_detail(detail)

    def _ended(self) -> bool:
        """The stream ended for good without an error: do not reconnect."""
        return False

    def _reconnect_context(self) -> dict[str, object]:
        """More to log with each reconnect."""
        return {}

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> asyncio.Future[None]:
        """Start connecting; the future completes when the first open succeeded (or failed)."""
        self._run_task = asyncio.create_task(
            self._run(), name=f"{self._role}:{self.partition_topic}"
        )
        return self._opened

    def _mark_opened(self) -> None:
        """An open succeeded: later busy refusals are retried, and ``start()`` completes."""
        self._ever_opened = True
        if not self._opened.done():
            self._opened.set_result(None)

    def _fail(self, error: MagnetarError) -> None:
        """A final error: the partition is not reopened and fails what it holds."""
        self.error = error
        self._closing = True
        if not self._opened.done():
            # the creating call raises it to the application: a debug record is enough
            self._log.debug(f"{self._role}_open_failed", error=repr(error))
            self._opened.set_exception(error)
            self._opened.exception()
            return
        self._log.warning(f"{self._role}_failed", error=repr(error))
        self._on_failed(error)

    # --- the connection --------------------------------------------------------------------

    def _retriable(self, error: MagnetarError) -> bool:
        if is_transient(error):
            return True
        # after a failover the old owner may not have dropped our previous stream yet
        return self._ever_opened and isinstance(error, self._busy_error)

    def _stopping(self) -> bool:
        # a method, not the attribute: close() flips it while _run awaits
        return self._closing

    async def _run(self) -> None:
        role = self._role
        backoff = Backoff(
            self._client_config.initial_backoff_ms, self._client_config.max_backoff_ms
        )
        while not self._closing:
            try:
                error = await self._connect_and_serve(backoff)
            except asyncio.CancelledError:
                raise
            except MagnetarError as e:
                error = e
            except Exception as e:  # noqa: BLE001 - a bug must not stop reconnecting; it is logged
                self._log.exception(f"{role}_stream_crashed")
                error = ClientConnectionError(f"the {role} stream failed: {e!r}")
            self.last_error = error
            if self._stopping() or self._ended():
                return
            if not self._retriable(error):
                self._fail(error)
                return
            delay_s = reconnect_delay_s(error, backoff)
            self._log.info(
                f"{role}_reconnecting",
                error=repr(error),
                delay_ms=round(delay_s * 1000),
                attempt=backoff.attempts,
                **self._reconnect_context(),
            )
            await asyncio.sleep(delay_s)

    async def _connect_and_serve(self, backoff: Backoff) -> MagnetarError:
        """One connection: look up, open, serve until the stream ends; why it ended."""
        topic = self.partition_topic
        # a partition is looked up on its own: only its owner is assigned and returned
        lookup = await self._pool.lookup(topic)
        owner = lookup.owner_of(topic)
        if owner is None and len(lookup.owners) == 1:
            owner = lookup.owners[0]
        if owner is None:
            return TopicLookupError(
                f"the lookup of {topic!r} names no owner for it", context={"topic": topic}
            )
        address = owner.address
        stub = await self._pool.stub(address)
        call: Any = self._open_call(stub, await self._pool.call_metadata())
        self._call = call
        try:
            timeout_ms = self._client_config.connection_timeout_ms
            try:
                await call.write(self._open_request())
                first = await asyncio.wait_for(call.read(), timeout_ms / 1000)
            except TimeoutError:
                return ClientConnectionError(
                    f"broker {address} did not {self._open_verb} on {topic} within {timeout_ms} ms",
                    context={"broker": address},
                )
            ended = self._end_reason(first, address, f"before {self._open_gerund}")
            if ended is not None:
                return ended
            kind = first.WhichOneof("kind")
            if kind != self._opened_kind:
                return ProtocolError(
                    f"broker {address} answered {self._open_request_name} with {kind!r}",
                    context={"broker": address},
                )
            self._on_opened(first, owner)
            backoff.reset()
            return await self._serve(call, address)
        except grpc.aio.AioRpcError as e:
            return error_from_rpc_error(e, address)
        finally:
            self._call = None
            self._on_disconnected()
            call.cancel()
            await _settled(call)

    async def _serve(self, call: Any, address: str) -> MagnetarError:
        writer = asyncio.create_task(self._write_loop(call, address))
        reader = asyncio.create_task(self._read_loop(call, address))
        try:
            done, _ = await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (writer, reader):
                task.cancel()
            await asyncio.gather(writer, reader, return_exceptions=True)
        return done.pop().result()

    async def _write_loop(self, call: Any, address: str) -> MagnetarError:
        try:
            await self._write(call)
        except grpc.aio.AioRpcError as e:
            return error_from_rpc_error(e, address)
        except (asyncio.InvalidStateError, grpc.aio.UsageError) as e:
            return ClientConnectionError(f"the {self._role} stream to {address} ended: {e}")

    async def _read_loop(self, call: Any, address: str) -> MagnetarError:
        try:
            while True:
                response = await call.read()
                error = self._end_reason(response, address, f"of {self.partition_topic}")
                if error is None:
                    kind = response.WhichOneof("kind")
                    if kind == "auth_challenge":
                        self._answer_challenge()
                        continue
                    error = self._on_response(kind, response)
                if error is not None:
                    return error
        except grpc.aio.AioRpcError as e:
            return error_from_rpc_error(e, address)

    def _answer_challenge(self) -> None:
        """Ask the token supplier for a fresh token (in a task: it may be a coroutine) and send
        it. If it fails, the broker closes the stream after its grace period, retriably, and the
        stream reconnects with whatever the supplier gives then."""

        async def answer() -> None:
            try:
                metadata = await self._pool.call_metadata()
            except MagnetarError as e:
                self._log.warning(f"{self._role}_auth_refresh_failed", error=str(e))
                return
            if metadata is None:
                self._log.warning(
                    f"{self._role}_auth_refresh_failed",
                    error="the broker asked for fresh credentials and the client has no token",
                )
                return
            self._send_control(metadata[0][1].removeprefix("Bearer "))
            self._log.info(f"{self._role}_auth_refreshed")

        task = asyncio.create_task(answer(), name=f"{self._role}-auth:{self.partition_topic}")
        self._auth_tasks.add(task)
        task.add_done_callback(self._auth_tasks.discard)

    def _end_reason(self, response: Any, address: str, where: str) -> MagnetarError | None:
        """Why the stream ended, when ``response`` is its end (EOF or ``closed``); else None."""
        if response is grpc.aio.EOF:
            return ClientConnectionError(
                f"broker {address} ended the {self._role} stream {where}",
                context={"broker": address},
            )
        if response.WhichOneof("kind") == "closed":
            return self._closed(response.closed, address)
        return None


async def _settled(call: Any) -> None:
    """Wait (briefly) until a cancelled call has its status, then let gRPC's own status task
    run: otherwise a program that ends right after closing the client (``asyncio.run``) can
    close the loop with that task still queued, and asyncio prints "Task was destroyed but it
    is pending"."""
    with contextlib.suppress(TimeoutError, grpc.RpcError):
        await asyncio.wait_for(call.code(), _SETTLE_TIMEOUT_S)
    await asyncio.sleep(0)
