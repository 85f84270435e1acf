"""Tenants and namespaces: who administers a tenant, and what each role may do in a namespace.

Records live in the metadata store (``/magnetar/tenants/<tenant>``,
``/magnetar/namespaces/<tenant>/<namespace>``), written by the admin service and read by
authorization. Every broker keeps both prefixes in memory through watches, so a grant or a
revocation made through any broker applies on every broker within a watch's delay, with no
restart; writes read the store itself, so they never act on a stale view.

Deleting is careful: a tenant with namespaces, or a namespace with topics, is refused with
:class:`NotEmptyError` naming what is still there.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from broker.service.records import (
    NamespacePermission,
    NamespaceRecord,
    TenantRecord,
    decode_namespace,
    decode_tenant,
    encode_namespace,
    encode_tenant,
)
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    BadVersionError,
    InvalidArgumentError,
    KeyExistsError,
    NamespaceAlreadyExistsError,
    NamespaceNotFoundError,
    NotEmptyError,
    TenantAlreadyExistsError,
    TenantNotFoundError,
)
from magnetar.common.names import check_tenant, parse_namespace
from metadata import MetadataStore, layout
from metadata.coordination.view import PrefixView

__all__ = ["Action", "Namespace", "Tenant", "TenantCatalog"]

REFRESH_MIN_S = 0.5
_CAS_ATTEMPTS = 10


class Action(enum.StrEnum):
    """What a role may be granted in a namespace (pulsar-admin's ``--actions``)."""

    PRODUCE = "produce"
    CONSUME = "consume"


def parse_actions(names: Iterable[str]) -> frozenset[Action]:
    """Action names (``produce``, ``consume``) as a set; :class:`InvalidArgumentError` naming
    an unknown one."""
    actions: set[Action] = set()
    for name in names:
        try:
            actions.add(Action(name.strip().lower()))
        except ValueError:
            raise InvalidArgumentError(
                f"unknown action {name!r}: the actions are produce and consume",
                context={"action": name},
            ) from None
    if not actions:
        raise InvalidArgumentError("grant at least one action: produce, consume")
    return frozenset(actions)


Permissions = dict[str, frozenset["Action"]]
_PermissionChange = Callable[[Permissions], Permissions]


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    admin_roles: tuple[str, ...]
    created_ms: int


@dataclass(frozen=True, slots=True)
class Namespace:
    name: str
    """``tenant/namespace``."""
    permissions: dict[str, frozenset[Action]]
    """Role -> what it may do here."""
    created_ms: int

    def allows(self, role: str, action: Action) -> bool:
        return action in self.permissions.get(role, ())


def _tenant(name: str, value: bytes) -> Tenant:
    record = decode_tenant(value)
    return Tenant(name, record.admin_roles, record.created_ms)


def _namespace(name: str, value: bytes) -> Namespace:
    record = decode_namespace(value)
    permissions = {
        role: frozenset(
            a
            for a, granted in ((Action.PRODUCE, p.produce), (Action.CONSUME, p.consume))
            if granted
        )
        for role, p in record.permissions.items()
    }
    return Namespace(name, permissions, record.created_ms)


def _namespace_value(namespace: Namespace) -> bytes:
    return encode_namespace(
        NamespaceRecord(
            {
                role: NamespacePermission(Action.PRODUCE in actions, Action.CONSUME in actions)
                for role, actions in namespace.permissions.items()
            },
            namespace.created_ms,
        )
    )


def _check_roles(roles: Iterable[str], what: str) -> tuple[str, ...]:
    checked = tuple(dict.fromkeys(r.strip() for r in roles))
    if any(not r for r in checked):
        raise InvalidArgumentError(f"{what} must not hold an empty role")
    return checked


_R = TypeVar("_R")


def _parsed(
    view: PrefixView,
    cache: dict[str, tuple[bytes, _R]],
    name: str,
    parse: Callable[[str, bytes], _R],
) -> _R | None:
    """The record ``name`` of ``view``, parsed once per value it takes."""
    value = view.values.get(name)
    if value is None:
        return None
    cached = cache.get(name)
    if cached is None or cached[0] is not value:
        cached = (value, parse(name, value))
        cache[name] = cached
    return cached[1]


class TenantCatalog:
    """Tenant and namespace records: reads from the in-memory views, writes to the store."""

    def __init__(self, store: MetadataStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.clock = clock
        self._tenants = PrefixView(store, layout.TENANTS, name="tenants")
        self._namespaces = PrefixView(store, layout.NAMESPACES, name="namespaces")
        self._parsed_tenants: dict[str, tuple[bytes, Tenant]] = {}
        self._parsed_namespaces: dict[str, tuple[bytes, Namespace]] = {}
        self._refreshed_at = -REFRESH_MIN_S

    async def start(self) -> None:
        await self._tenants.start()
        await self._namespaces.start()

    async def close(self) -> None:
        await self._tenants.close()
        await self._namespaces.close()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Hear every change to tenants and namespaces (re-check open streams)."""
        self._tenants.on_change(listener)
        self._namespaces.on_change(listener)

    # --- reads from the views (authorization's hot path) ----------------------------------------

    def tenant(self, name: str) -> Tenant | None:
        return _parsed(self._tenants, self._parsed_tenants, name, _tenant)

    def namespace(self, name: str) -> Namespace | None:
        return _parsed(self._namespaces, self._parsed_namespaces, name, _namespace)

    def tenants(self) -> list[str]:
        return sorted(self._tenants.values)

    def namespaces(self, tenant: str | None = None) -> list[str]:
        names = sorted(self._namespaces.values)
        if tenant is None:
            return names
        return [n for n in names if n.split("/", 1)[0] == tenant]

    async def refresh(self) -> None:
        """Read both prefixes again, unless that was done in the last :data:`REFRESH_MIN_S`.

        A denial is confirmed this way, against the store and not a view that may not have
        heard of a grant yet; the pause keeps a stream of refused attempts from becoming a
        stream of reads on the store."""
        now = time.monotonic()
        if now - self._refreshed_at < REFRESH_MIN_S:
            return
        self._refreshed_at = now
        await self._tenants.refresh()
        await self._namespaces.refresh()

    # --- reads from the store ---------------------------------------------------------------

    async def read_tenant(self, name: str) -> Tenant:
        record = await self.store.get(layout.tenant(check_tenant(name)))
        if record is None:
            raise TenantNotFoundError(f"tenant {name!r} does not exist", context={"tenant": name})
        return _tenant(name, record.value)

    async def read_namespace(self, name: str) -> tuple[Namespace, int]:
        tenant, local = parse_namespace(name)
        full = f"{tenant}/{local}"
        record = await self.store.get(layout.namespace(full))
        if record is None:
            raise NamespaceNotFoundError(
                f"namespace {full!r} does not exist", context={"namespace": full}
            )
        return _namespace(full, record.value), record.version

    # --- tenants ----------------------------------------------------------------------------

    async def create_tenant(self, name: str, admin_roles: Iterable[str]) -> Tenant:
        check_tenant(name)
        roles = _check_roles(admin_roles, "admin roles")
        now = self.clock.time_ms()
        try:
            await self.store.create(layout.tenant(name), encode_tenant(TenantRecord(roles, now)))
        except KeyExistsError:
            raise TenantAlreadyExistsError(
                f"tenant {name!r} already exists", context={"tenant": name}
            ) from None
        await self._tenants.refresh()
        return Tenant(name, roles, now)

    async def ensure_tenant(self, name: str, admin_roles: Iterable[str] = ()) -> None:
        """Create ``name`` unless it exists (cluster init's ``public``)."""
        with contextlib.suppress(TenantAlreadyExistsError):
            await self.create_tenant(name, admin_roles)

    async def update_tenant(self, name: str, admin_roles: Iterable[str]) -> Tenant:
        roles = _check_roles(admin_roles, "admin roles")
        for _ in range(_CAS_ATTEMPTS):
            stored = await self.store.get(layout.tenant(check_tenant(name)))
            if stored is None:
                raise TenantNotFoundError(
                    f"tenant {name!r} does not exist", context={"tenant": name}
                )
            value = encode_tenant(TenantRecord(roles, decode_tenant(stored.value).created_ms))
            try:
                await self.store.put(layout.tenant(name), value, expected_version=stored.version)
            except BadVersionError:
                continue
            await self._tenants.refresh()
            return _tenant(name, value)
        raise BadVersionError(f"tenant {name!r} kept changing; try again")

    async def delete_tenant(self, name: str) -> None:
        await self.read_tenant(name)
        listing = await self.store.list(f"{layout.NAMESPACES}{name}/")
        if listing.records:
            names = [r.key.removeprefix(layout.NAMESPACES) for r in listing.records]
            raise NotEmptyError(
                f"tenant {name!r} still has {len(names)} namespace(s): {', '.join(names[:10])};"
                " delete them first",
                context={"tenant": name},
            )
        await self.store.delete(layout.tenant(name))
        await self._tenants.refresh()

    # --- namespaces -------------------------------------------------------------------------

    async def create_namespace(self, name: str) -> Namespace:
        tenant, local = parse_namespace(name)
        await self.read_tenant(tenant)
        full = f"{tenant}/{local}"
        namespace = Namespace(full, {}, self.clock.time_ms())
        try:
            await self.store.create(layout.namespace(full), _namespace_value(namespace))
        except KeyExistsError:
            raise NamespaceAlreadyExistsError(
                f"namespace {full!r} already exists", context={"namespace": full}
            ) from None
        await self._namespaces.refresh()
        return namespace

    async def ensure_namespace(self, name: str) -> None:
        with contextlib.suppress(NamespaceAlreadyExistsError):
            await self.create_namespace(name)

    async def delete_namespace(self, name: str) -> None:
        namespace, _ = await self.read_namespace(name)
        listing = await self.store.list(layout.topics_of_namespace(namespace.name))
        if listing.records:
            names = [r.key.rsplit("/", 1)[1] for r in listing.records]
            raise NotEmptyError(
                f"namespace {namespace.name!r} still has {len(names)} topic(s):"
                f" {', '.join(names[:10])}; delete them first",
                context={"namespace": namespace.name},
            )
        await self.store.delete(layout.namespace(namespace.name))
        await self._namespaces.refresh()

    async def grant(self, name: str, role: str, actions: frozenset[Action]) -> Namespace:
        """Give ``role`` exactly ``actions`` in namespace ``name``."""
        (checked,) = _check_roles([role], "a role")
        return await self._change(name, lambda p: {**p, checked: actions})

    async def revoke(self, name: str, role: str) -> Namespace:
        """Take every action from ``role`` in namespace ``name``."""
        return await self._change(name, lambda p: {r: a for r, a in p.items() if r != role})

    async def _change(self, name: str, change: _PermissionChange) -> Namespace:
        for _ in range(_CAS_ATTEMPTS):
            namespace, version = await self.read_namespace(name)
            permissions = change(namespace.permissions)
            updated = Namespace(namespace.name, permissions, namespace.created_ms)
            try:
                await self.store.put(
                    layout.namespace(namespace.name),
                    _namespace_value(updated),
                    expected_version=version,
                )
            except BadVersionError:
                continue
            await self._namespaces.refresh()
            return updated
        raise BadVersionError(f"namespace {name!r} kept changing; try again")
