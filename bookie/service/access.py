"""Who may use a bookie: authenticated roles that are bookie clients or superusers.

A bookie's data path is for the ledger client only (brokers, autorecovery, tools), never for
applications: with authentication on, every call must come from a role in
``bookie_client_roles`` or ``superuser_roles``, proven by a TLS client certificate (its common
name) or a token. Anything else is refused, naming the role and the operation; the refusal
touches nothing else the bookie is doing. Refusals are counted by reason for the metrics.
"""

from __future__ import annotations

from collections import Counter

from magnetar.common.errors import AuthorizationError
from magnetar.common.security.authentication import (
    AuthenticationService,
    Credentials,
    Principal,
    RefusalLog,
)
from magnetar.common.security.config import AuthenticationSettings

__all__ = ["BookieAccess"]


class BookieAccess:
    """Authentication and the one authorization rule of a bookie."""

    def __init__(
        self, settings: AuthenticationSettings, *, client_roles: tuple[str, ...], bookie_id: str
    ) -> None:
        self.authentication = AuthenticationService(settings, component="bookie")
        self.allowed = frozenset(client_roles) | frozenset(settings.superuser_roles)
        self.bookie_id = bookie_id
        self.denials: Counter[str] = Counter()
        """Refusals of authenticated roles, by operation (a metric)."""
        self._log = RefusalLog()

    @property
    def enabled(self) -> bool:
        return self.authentication.enabled

    def check(self, credentials: Credentials, operation: str) -> Principal:
        """The principal of a call allowed to ``operation`` (``"add entries"``); raises
        :class:`AuthenticationError` or :class:`AuthorizationError`."""
        principal = self.authentication.authenticate(credentials)
        self.authorize(principal, credentials.peer, operation)
        return principal

    def authorize(self, principal: Principal, peer: str, operation: str) -> None:
        """Raise :class:`AuthorizationError` unless ``principal`` may ``operation`` (a data
        connection authenticates once, then asks this of every request)."""
        if principal.anonymous or principal.role in self.allowed:
            return
        self.denials[operation] += 1
        self._log.warn(
            "bookie_access_denied",
            role=principal.role,
            operation=operation,
            peer=peer,
        )
        raise AuthorizationError(
            f"role {principal.role!r} may not {operation} on bookie {self.bookie_id}: only"
            " bookie_client_roles and superuser_roles may use bookies",
            context={"role": principal.role, "action": operation, "resource": "bookie"},
        )
