"""A broker's security: authentication, authorization, and the credentials of open streams.

Every adapter (gRPC now, Pulsar's protocol next) goes through :class:`BrokerSecurity`, so each
enforces the same rules: :meth:`BrokerSecurity.authenticate` once per call or stream, then the
authorization checks of :class:`~broker.service.authorization.AuthorizationService`.

A producer or consumer stream lives longer than a token may. :class:`StreamCredentials` holds a
stream's principal and follows it:

- when its token expires, the adapter is told to challenge the client (``on_challenge``), which
  answers with a fresh token for the same role (:meth:`StreamCredentials.refresh`); the stream
  goes on, nothing is resent;
- a stream that gets no good answer within ``authentication_refresh_grace_ms`` is closed with
  :class:`AuthenticationExpiredError`, which is retriable: the client reconnects with fresh
  credentials and resends what was not receipted, so a producer loses nothing;
- when a grant is revoked (a tenant or namespace record changes), every open stream is checked
  again, and one whose role may no longer do what it does is closed with
  :class:`AuthorizationError`: a revocation applies to open streams too, not only to new ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime

import structlog

from broker.service.authorization import AuthorizationService, TopicAction
from broker.service.tenants import TenantCatalog
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    AuthenticationError,
    AuthenticationExpiredError,
    AuthorizationError,
    MagnetarError,
)
from magnetar.common.names import DEFAULT_NAMESPACE, DEFAULT_TENANT, TopicName
from magnetar.common.security.authentication import (
    AuthenticationService,
    Credentials,
    Principal,
)
from magnetar.common.security.config import AuthenticationSettings
from metadata import MetadataStore

__all__ = ["BrokerSecurity", "StreamCredentials"]

log = structlog.get_logger("magnetar.broker.security")


class BrokerSecurity:
    """Authentication, authorization and the tenants they read, for one broker."""

    def __init__(
        self,
        settings: AuthenticationSettings,
        store: MetadataStore,
        *,
        authorization_enabled: bool,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.authentication = AuthenticationService(settings, component="broker")
        self.tenants = TenantCatalog(store, clock)
        self.authorization = AuthorizationService(
            self.tenants,
            enabled=authorization_enabled,
            superusers=frozenset(settings.superuser_roles),
        )
        self.refresh_grace_s = settings.authentication_refresh_grace_ms / 1000
        self._streams: set[StreamCredentials] = set()
        self.tenants.on_change(self._recheck_streams)

    @property
    def authentication_enabled(self) -> bool:
        return self.authentication.enabled

    async def start(self) -> None:
        """Follow the tenants; make sure ``public`` and ``public/default`` exist (Pulsar's
        defaults, where bare topic names live)."""
        await self.tenants.start()
        await self.tenants.ensure_tenant(DEFAULT_TENANT)
        await self.tenants.ensure_namespace(f"{DEFAULT_TENANT}/{DEFAULT_NAMESPACE}")

    async def close(self) -> None:
        for stream in list(self._streams):
            stream.close()
        await self.tenants.close()

    def authenticate(self, credentials: Credentials) -> Principal:
        return self.authentication.authenticate(credentials)

    async def authorize_topic(
        self, principal: Principal, action: TopicAction, topic: TopicName
    ) -> None:
        await self.authorization.check_topic(principal, action, topic)

    def stream(
        self,
        principal: Principal,
        peer: str,
        *,
        action: TopicAction,
        topic: TopicName,
        on_challenge: Callable[[int], None],
        on_revoked: Callable[[MagnetarError], None],
    ) -> StreamCredentials:
        """Follow the credentials of a stream that opened as ``principal`` to take ``action`` on
        ``topic``; call :meth:`StreamCredentials.close` when the stream ends."""
        stream = StreamCredentials(
            self, principal, peer, action, topic, on_challenge=on_challenge, on_revoked=on_revoked
        )
        if not principal.anonymous:
            self._streams.add(stream)
        return stream

    def _forget(self, stream: StreamCredentials) -> None:
        self._streams.discard(stream)

    def _recheck_streams(self) -> None:
        if not self.authorization.enabled:
            return
        for stream in list(self._streams):
            if not self.authorization.may(stream.principal, stream.action, stream.namespace):
                stream.revoke(
                    self.authorization.deny_revoked(stream.principal, stream.action, stream.topic)
                )


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


class StreamCredentials:
    """The principal of one open stream, refreshed in band before its token lapses."""

    def __init__(
        self,
        security: BrokerSecurity,
        principal: Principal,
        peer: str,
        action: TopicAction,
        topic: TopicName,
        *,
        on_challenge: Callable[[int], None],
        on_revoked: Callable[[MagnetarError], None],
    ) -> None:
        self._security = security
        self.principal = principal
        self.peer = peer
        self.action = action
        self.topic = topic
        self.namespace = topic.namespace_name
        self._on_challenge = on_challenge
        self._on_revoked = on_revoked
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self.challenges = 0
        self.refreshes = 0
        self._closed = False
        self._schedule()

    def _schedule(self) -> None:
        self._cancel()
        expires = self.principal.expires_at_ms
        if expires is None or self._closed:
            return
        delay_s = max(0.0, expires / 1000 - time.time())
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._expired)

    def _cancel(self) -> None:
        for handle in (self._timer, self._deadline):
            if handle is not None:
                handle.cancel()
        self._timer = self._deadline = None

    def _expired(self) -> None:
        self._timer = None
        expires = self.principal.expires_at_ms or 0
        self.challenges += 1
        log.info(
            "stream_credentials_expired",
            role=self.principal.role,
            peer=self.peer,
            topic=self.topic.full,
        )
        self._on_challenge(expires)
        self._deadline = asyncio.get_running_loop().call_later(
            self._security.refresh_grace_s, self._lapsed
        )

    def _lapsed(self) -> None:
        self._deadline = None
        expires = self.principal.expires_at_ms or 0
        grace_ms = round(self._security.refresh_grace_s * 1000)
        error = self._security.authentication.refuse(
            AuthenticationExpiredError,
            "expired",
            self.peer,
            f"the stream's token expired at {_when(expires)} and no fresh one came within"
            f" {grace_ms} ms; reconnect with a fresh token",
        )
        self.revoke(error)

    async def refresh_or_revoke(self, token: str) -> bool:
        """:meth:`refresh`, or the end of the stream (:meth:`revoke`) when the token is refused;
        whether the stream goes on."""
        try:
            await self.refresh(token)
        except (AuthenticationError, AuthorizationError) as e:
            self.revoke(e)
            return False
        return True

    async def refresh(self, token: str) -> None:
        """Take a fresh token for the stream (the client's answer to a challenge).

        :class:`AuthenticationError` when it is not good or is another role's;
        :class:`AuthorizationError` when its role may no longer do what the stream does. The
        adapter closes the stream with either."""
        authentication = self._security.authentication
        principal = authentication.authenticate_token(token, self.peer)
        if principal.role != self.principal.role:
            raise authentication.refuse(
                AuthenticationError,
                "role_changed",
                self.peer,
                f"the fresh token is for role {principal.role!r}; this stream was opened by role"
                f" {self.principal.role!r} (open a new stream to act as another role)",
            )
        await self._security.authorize_topic(principal, self.action, self.topic)
        self.principal = principal
        self.refreshes += 1
        log.info(
            "stream_credentials_refreshed",
            role=principal.role,
            peer=self.peer,
            topic=self.topic.full,
            expires_at=_when(principal.expires_at_ms) if principal.expires_at_ms else None,
        )
        self._schedule()

    def revoke(self, error: AuthenticationError | AuthorizationError) -> None:
        """End the stream: its credentials lapsed, or its role lost its grant."""
        if self._closed:
            return
        self.close()
        self._on_revoked(error)

    def close(self) -> None:
        self._closed = True
        self._cancel()
        self._security._forget(self)
