"""Authorization: what an authenticated role may do, Pulsar's model.

- **Superusers** (``superuser_roles``) may do anything.
- **Tenant admins** (a tenant's ``admin_roles``) may do anything in their tenant: produce and
  consume, create, update and delete its topics, reset and delete subscriptions, create and
  delete namespaces, and grant permissions in them.
- **Namespace permissions** give a role ``produce`` and/or ``consume`` on every topic of a
  namespace. Either lets it look those topics up and see their stats (without client
  addresses); ``consume`` also lets it list and create their subscriptions.
- **Cluster operations** (brokers, bookies, ledgers, ownership, unloading, tenants) need a
  superuser.

Nothing else is allowed: a role with no grant is refused, naming the role, the action and the
namespace ("role 'bob' may not consume from acme/ns1"). Decisions read the tenants and
namespaces from memory (:class:`~broker.service.tenants.TenantCatalog`'s watched views); a
refusal is confirmed against the store before it is given, so a grant made a moment ago on
another broker is never refused for a view that has not heard of it yet. Refusals are counted by
action (:attr:`AuthorizationService.denials`, a metric).
"""

from __future__ import annotations

import enum
from collections import Counter

from broker.service.tenants import Action, TenantCatalog
from magnetar.common.errors import AuthorizationError
from magnetar.common.names import TopicName
from magnetar.common.security.authentication import Principal, RefusalLog

__all__ = ["AuthorizationService", "TopicAction"]


class TopicAction(enum.Enum):
    """What a client does with a topic; each maps to the namespace actions that allow it."""

    PRODUCE = ("produce to", frozenset({Action.PRODUCE}))
    CONSUME = ("consume from", frozenset({Action.CONSUME}))
    LOOKUP = ("look up topics of", frozenset({Action.PRODUCE, Action.CONSUME}))

    def __init__(self, verb: str, allowed_by: frozenset[Action]) -> None:
        self.verb = verb
        self.allowed_by = allowed_by


class AuthorizationService:
    """Decides whether a principal may act on a topic, a tenant or the cluster."""

    def __init__(
        self, catalog: TenantCatalog, *, enabled: bool, superusers: frozenset[str]
    ) -> None:
        self.catalog = catalog
        self.enabled = enabled
        self.superusers = superusers
        self.denials: Counter[str] = Counter()
        """Refusals by action, since start (the ``..._authorization_denied`` metric)."""
        self._log = RefusalLog()

    # --- questions (no refusal, no count) -------------------------------------------------------

    def is_superuser(self, principal: Principal) -> bool:
        return not self.enabled or principal.anonymous or principal.role in self.superusers

    def is_tenant_admin(self, principal: Principal, tenant: str) -> bool:
        """Superuser, or an admin role of ``tenant``."""
        if self.is_superuser(principal):
            return True
        found = self.catalog.tenant(tenant)
        return found is not None and principal.role in found.admin_roles

    def may(self, principal: Principal, action: TopicAction, namespace: str) -> bool:
        """Whether ``principal`` may take ``action`` on the topics of ``namespace``."""
        if self.is_tenant_admin(principal, namespace.split("/", 1)[0]):
            return True
        found = self.catalog.namespace(namespace)
        if found is None:
            return False
        return any(found.allows(principal.role, a) for a in action.allowed_by)

    # --- checks (refuse with AuthorizationError) -------------------------------------------------

    async def check_topic(
        self, principal: Principal, action: TopicAction, topic: TopicName
    ) -> None:
        """Refuse unless ``principal`` may take ``action`` on ``topic``."""
        if not self.enabled or self.may(principal, action, topic.namespace_name):
            return
        await self.catalog.refresh()
        if self.may(principal, action, topic.namespace_name):
            return
        raise self._deny(
            action.name.lower(),
            principal,
            f"role {principal.role!r} may not {action.verb} {topic.namespace_name}"
            f" (topic {topic.topic}): it needs {_grant_of(action)} on the namespace, or to be an"
            f" admin of tenant {topic.tenant!r}",
            resource=topic.topic,
        )

    async def check_tenant_admin(self, principal: Principal, tenant: str, operation: str) -> None:
        """Refuse ``operation`` (``"delete topic acme/ns1/t"``) unless ``principal`` administers
        ``tenant`` or is a superuser."""
        if self.is_tenant_admin(principal, tenant):
            return
        await self.catalog.refresh()
        if self.is_tenant_admin(principal, tenant):
            return
        raise self._deny(
            "tenant_admin",
            principal,
            f"role {principal.role!r} may not {operation}: that needs an admin of tenant"
            f" {tenant!r} or a superuser",
            resource=tenant,
        )

    def check_superuser(self, principal: Principal, operation: str) -> None:
        """Refuse ``operation`` (``"list bookies"``) unless ``principal`` is a superuser."""
        if self.is_superuser(principal):
            return
        raise self._deny(
            "superuser",
            principal,
            f"role {principal.role!r} may not {operation}: that needs a superuser",
            resource="cluster",
        )

    def deny_revoked(
        self, principal: Principal, action: TopicAction, topic: TopicName
    ) -> AuthorizationError:
        """The error that closes an open stream whose role lost its grant."""
        return self._deny(
            action.name.lower(),
            principal,
            f"role {principal.role!r} may no longer {action.verb} {topic.namespace_name}: its"
            " permission was revoked",
            resource=topic.topic,
        )

    def _deny(
        self, action: str, principal: Principal, message: str, *, resource: str
    ) -> AuthorizationError:
        self.denials[action] += 1
        self._log.info(
            "authorization_denied", role=principal.role, action=action, resource=resource
        )
        return AuthorizationError(
            message, context={"role": principal.role, "action": action, "resource": resource}
        )


def _grant_of(action: TopicAction) -> str:
    return " or ".join(f"'{a.value}'" for a in sorted(action.allowed_by))
