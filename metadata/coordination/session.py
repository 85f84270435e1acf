"""A session: a lease kept alive in the background, and a clear signal when it is lost.

Everything a process holds in the cluster (its registration, its locks, the partitions it owns) is
bound to its session's lease, so it vanishes when the process dies. The safety rule for
ownership is that a process stops acting on what it holds *before* the lease could expire on the
server and be taken by another. The session therefore tracks how long the lease is certainly
valid. Each keepalive's answer extends validity to ``sent + granted_ttl``, counted from when the
request was *sent*, since the server cannot have refreshed it earlier. The session declares itself
lost a safety margin before that point if it could not refresh in time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Self

import structlog

from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    LeaseNotFoundError,
    MetadataError,
    MetadataStoreClosedError,
    SessionLostError,
)
from metadata.api import MetadataStore

log = structlog.get_logger("magnetar.metadata.session")

LossListener = Callable[[SessionLostError], None]


class Session:
    """A lease plus its keepalive task. Create with :meth:`start`; end with :meth:`close`."""

    def __init__(
        self,
        store: MetadataStore,
        lease_id: int,
        ttl_s: int,
        valid_until: float,
        *,
        clock: Clock = SYSTEM_CLOCK,
        name: str = "",
    ) -> None:
        self.store = store
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        self.name = name
        self._clock = clock
        self._valid_until = valid_until
        self._lost_error: SessionLostError | None = None
        self._lost = asyncio.Event()
        self._listeners: list[LossListener] = []
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        store: MetadataStore,
        *,
        ttl_s: int = 10,
        clock: Clock = SYSTEM_CLOCK,
        name: str = "",
    ) -> Session:
        """Grant a lease of ``ttl_s`` seconds and start keeping it alive."""
        sent = clock.monotonic()
        lease = await store.grant_lease(ttl_s)
        session = cls(
            store, lease.lease_id, lease.ttl_s, sent + lease.ttl_s, clock=clock, name=name
        )
        session._task = asyncio.create_task(session._keepalive(), name=f"session-{lease.lease_id}")
        log.info("session_started", lease=lease.lease_id, ttl_s=lease.ttl_s, session=name)
        return session

    # --- state ------------------------------------------------------------------------------

    @property
    def safety_margin_s(self) -> float:
        """How long before the lease's earliest possible expiry the session gives up."""
        return max(0.5, self.ttl_s * 0.15)

    @property
    def alive(self) -> bool:
        return self._lost_error is None and not self._closed

    @property
    def lost(self) -> asyncio.Event:
        """Set once the session is lost (not when it is closed on purpose)."""
        return self._lost

    @property
    def lost_error(self) -> SessionLostError | None:
        return self._lost_error

    def check(self) -> None:
        """Raise :class:`SessionLostError` unless the session is alive."""
        if self._lost_error is not None:
            raise self._lost_error
        if self._closed:
            raise SessionLostError(f"session {self.lease_id} was closed")

    def on_lost(self, listener: LossListener) -> None:
        """Call ``listener`` (synchronously, in the event loop) when the session is lost."""
        if self._lost_error is not None:
            listener(self._lost_error)
        else:
            self._listeners.append(listener)

    async def wait_lost(self) -> SessionLostError:
        await self._lost.wait()
        assert self._lost_error is not None
        return self._lost_error

    # --- keepalive ----------------------------------------------------------------------------

    def _lose(self, reason: str) -> None:
        if self._lost_error is not None or self._closed:
            return
        self._lost_error = SessionLostError(
            f"metadata session (lease {self.lease_id}) lost: {reason}",
            context={"lease": self.lease_id, "session": self.name},
        )
        log.warning("session_lost", lease=self.lease_id, reason=reason, session=self.name)
        self._lost.set()
        for listener in self._listeners:
            try:
                listener(self._lost_error)
            except Exception:
                log.exception("session_loss_listener_failed", lease=self.lease_id)

    async def _keepalive(self) -> None:
        interval = self.ttl_s / 3
        retry = min(0.5, interval)
        # the lease's validity counts from when the grant was sent, and so does the first
        # refresh: counting from when a slow grant returned could sleep past the give-up point
        next_refresh = self._valid_until - self.ttl_s + interval
        while True:
            give_up_at = self._valid_until - self.safety_margin_s
            now = self._clock.monotonic()
            if now >= give_up_at:
                self._lose(f"could not refresh the lease within its {self.ttl_s} s TTL")
                return
            await self._clock.sleep(max(0.0, min(next_refresh, give_up_at) - now))
            now = self._clock.monotonic()
            if now >= give_up_at:
                continue
            sent = now
            try:
                granted = await asyncio.wait_for(
                    self.store.keepalive(self.lease_id), timeout=give_up_at - now
                )
            except LeaseNotFoundError:
                self._lose("the lease expired or was revoked on the metadata store")
                return
            except MetadataStoreClosedError:
                self._lose("the metadata store was closed")
                return
            except (MetadataError, TimeoutError) as e:
                log.info("session_keepalive_failed", lease=self.lease_id, error=str(e))
                next_refresh = self._clock.monotonic() + retry
                continue
            self._valid_until = sent + granted
            next_refresh = sent + interval

    # --- lifecycle ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the keepalive and revoke the lease (its keys vanish now, not after the TTL)."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._lost_error is None and not self.store.closed:
            try:
                await asyncio.wait_for(self.store.revoke_lease(self.lease_id), timeout=5)
            except (MetadataError, TimeoutError) as e:
                # the lease then expires on its own within its TTL
                log.info("session_revoke_failed", lease=self.lease_id, error=str(e))
        log.info("session_closed", lease=self.lease_id, session=self.name)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
