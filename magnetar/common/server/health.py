"""What a server process reports on the standard gRPC health service (``grpc.health.v1.Health``),
which Kubernetes probes read. Brokers and bookies both use :class:`ProcessHealth`.

The contract, one meaning per service name:

- ``""`` (:data:`READINESS_SERVICE`, the overall service) is **readiness**: ``SERVING`` only
  while the process can do its job right now, which is a live metadata session for a broker
  and, for a bookie, its registration written under a live session. It goes ``NOT_SERVING`` as
  soon as the session is lost and back to ``SERVING`` once a new one is in place. Point
  ``readinessProbe`` here, so Kubernetes sends no new clients to a process that cannot serve
  them.
- each component service name (``magnetar.broker.v1.BrokerService``,
  ``magnetar.bookie.v1.BookieService``, ...; the process module's ``LIVENESS_SERVICE``) is
  **liveness**: ``SERVING`` from the end of start-up for as long as the process runs, whatever
  the metadata store does. A liveness probe must not restart a pod because etcd is briefly
  unreachable, since a restart fixes nothing there. Point ``livenessProbe`` and
  ``startupProbe`` here.

From the first moment of a stop (SIGTERM) every name is ``NOT_SERVING``, for good. Readiness
therefore drops *before* a broker starts handing its partitions over, or a bookie leaves the
cluster. Until start-up is complete, every name is ``NOT_SERVING`` too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

import grpc.aio
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

log = structlog.get_logger("magnetar.health")

READINESS_SERVICE = ""
"""The health service name of readiness: the overall service."""

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ProcessHealth:
    """One process's gRPC health service, following the contract above.

    Create with :meth:`serve` before the gRPC server starts, call :meth:`started` once the
    process serves, :meth:`changed` whenever readiness may have changed (from any synchronous
    callback: it only wakes a task), and :meth:`stop` first thing when stopping.
    """

    def __init__(self, liveness_services: Sequence[str], **context: str) -> None:
        self._servicer = health.aio.HealthServicer()
        self._liveness_services = tuple(liveness_services)
        self._log = log.bind(**context)
        self._ready: Callable[[], bool] = lambda: False
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @classmethod
    async def serve(
        cls, server: grpc.aio.Server, liveness_services: Sequence[str], **context: str
    ) -> ProcessHealth:
        """Add the health service to ``server`` (not started yet), everything NOT_SERVING."""
        self = cls(liveness_services, **context)
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)
        # the reference servicer starts with "" SERVING: a process still starting is not ready
        for service in (READINESS_SERVICE, *self._liveness_services):
            await self._servicer.set(service, _NOT_SERVING)
        return self

    async def started(self, ready: Callable[[], bool]) -> None:
        """Start-up is done: liveness SERVING; readiness is ``ready()`` from now on."""
        if self._stopped:
            return
        self._ready = ready
        for service in self._liveness_services:
            await self._servicer.set(service, _SERVING)
        self._task = asyncio.create_task(self._follow(), name="health-readiness")

    def changed(self) -> None:
        """Readiness may have changed: look again (soon, in a task)."""
        self._changed.set()

    async def _follow(self) -> None:
        # one task reads the current state and writes it, so quick flips cannot land out of
        # order, and the last word is always the present state
        reported: bool | None = None
        while True:
            self._changed.clear()
            ready = self._ready()
            if ready != reported:
                await self._servicer.set(READINESS_SERVICE, _SERVING if ready else _NOT_SERVING)
                if reported is not None:
                    self._log.info("readiness_changed", ready=ready)
                reported = ready
            await self._changed.wait()

    async def stop(self) -> None:
        """Every service NOT_SERVING now and for good (the process is stopping)."""
        if self._stopped:
            return
        self._stopped = True
        # first: after this the servicer ignores every later set, so nothing can undo it
        await self._servicer.enter_graceful_shutdown()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
