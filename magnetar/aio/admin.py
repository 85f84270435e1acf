"""The admin client: topics, subscriptions and the cluster, through any broker's admin service.

::

    async with magnetar.aio.AdminClient("magnetar://localhost:6650") as admin:
        await admin.create_topic("orders", partitions=4)
        stats = await admin.topic_stats("orders")
        print(stats["msg_rate_in"], [p["next_offset"] for p in stats["partitions"]])

Every call goes to the service URL's brokers in turn (a broker that cannot be reached, or answers
with a retriable error, passes the call to the next one) and is retried with backoff for up to
``operation_timeout_s``. Answers are plain ``dict``/``list`` values with the field names of
``proto/magnetar/admin/v1/admin.proto`` (enums as lower-case names: ``"shared"``,
``"writable"``), ready for ``json.dumps``. Failures are the typed errors of
:mod:`magnetar.common.errors`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar

import grpc
import grpc.aio
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as ProtoMessage

from magnetar.aio.auth import Authentication
from magnetar.aio.backoff import Backoff
from magnetar.aio.config import ClientConfig, client_config
from magnetar.aio.connection import ConnectionPool, is_transient
from magnetar.aio.consumer import start_position
from magnetar.aio.message_id import MessageId
from magnetar.aio.names import parse_topic
from magnetar.common.errors import (
    ClientClosedError,
    InvalidArgumentError,
    MagnetarError,
    OperationTimeoutError,
)
from magnetar.common.grpc_errors import error_from_rpc_error
from proto.admin.v1 import admin_pb2 as pb
from proto.admin.v1 import admin_pb2_grpc

__all__ = ["AdminClient", "to_plain"]

R = TypeVar("R", bound=ProtoMessage)

_POLICY_FIELDS = frozenset(pb.TopicPolicies.DESCRIPTOR.fields_by_name)
_AUTH_ACTIONS = {"produce": pb.AUTH_ACTION_PRODUCE, "consume": pb.AUTH_ACTION_CONSUME}


def _enum_name(field: Any, number: int) -> str:
    enum = field.enum_type
    assert enum is not None
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    prefix = "".join(f"_{c}" if c.isupper() else c.upper() for c in enum.name).lstrip("_") + "_"
    return str(value.name).removeprefix(prefix).lower()


def _plain_value(field: Any, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return to_plain(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return _enum_name(field, value)
    return value


def to_plain(message: ProtoMessage) -> dict[str, Any]:
    """A protobuf message as a ``dict`` of plain values: every field present (defaults
    included), integers kept as integers, enums as lower-case names without their prefix."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _plain_value(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_plain_value(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _plain_value(field, value)
    return out


def _start(
    target: MessageId | int | Literal["earliest", "latest"] | None, publish_time_ms: int | None
) -> Any:
    if target == "earliest":
        target = MessageId.earliest
    elif target == "latest":
        target = MessageId.latest
    if isinstance(target, str):
        raise InvalidArgumentError(
            f"a position is 'earliest', 'latest', a MessageId, an offset or publish_time_ms=,"
            f" got {target!r}"
        )
    return start_position(target, publish_time_ms)


class AdminClient:
    """Administration of a Magnetar cluster (the asyncio core of ``magnetar.AdminClient``).

    ``AdminClient("magnetar://h1:6650,h2:6650", operation_timeout_s=30)``; keyword settings are
    the fields of :class:`ClientConfig`. Creating it opens nothing.
    """

    def __init__(
        self,
        service_url: str | ClientConfig,
        *,
        authentication: Authentication | None = None,
        **settings: Any,
    ) -> None:
        config = client_config(service_url, settings)
        self.config = config
        self._pool = ConnectionPool(config, authentication)
        self._stubs: dict[str, admin_pb2_grpc.AdminServiceAsyncStub] = {}
        self._next = 0

    async def _stub(self, address: str) -> admin_pb2_grpc.AdminServiceAsyncStub:
        stub = self._stubs.get(address)
        if stub is None:
            stub = admin_pb2_grpc.AdminServiceStub(await self._pool.channel(address))
            self._stubs[address] = stub
        return stub

    async def _call(
        self, what: str, call: Callable[[admin_pb2_grpc.AdminServiceAsyncStub, float], Awaitable[R]]
    ) -> R:
        """One admin call on the first broker that answers, retried while retriable."""
        if self._pool.closed:
            raise ClientClosedError("the admin client was closed")
        timeout_s = self.config.operation_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        backoff = Backoff(self.config.initial_backoff_ms, self.config.max_backoff_ms)
        targets = self._pool.service_targets
        last: MagnetarError | None = None
        while True:
            for attempt in range(len(targets)):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                index = (self._next + attempt) % len(targets)
                address = targets[index]
                try:
                    response = await call(await self._stub(address), remaining)
                except grpc.aio.AioRpcError as e:
                    error = error_from_rpc_error(e, address)
                    if not is_transient(error):
                        raise error from None
                    last = error
                    continue
                except MagnetarError as error:
                    # a new TLS channel's check: untrusted is final, unreachable is retried
                    if not is_transient(error):
                        raise
                    last = error
                    continue
                self._next = index
                return response
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise OperationTimeoutError(
                    f"{what} did not succeed within {timeout_s} s on any broker of"
                    f" {self.config.service_url} (last problem: {last}). Check that a broker"
                    " runs there (for a quick start: magnetar standalone)",
                    context={"service_url": self.config.service_url},
                )
            await asyncio.sleep(min(backoff.next_delay_s(), remaining))

    # --- topics ------------------------------------------------------------------------------

    async def create_topic(
        self,
        topic: str,
        partitions: int = 0,
        *,
        policies: Mapping[str, Any] | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create ``topic`` with ``partitions`` partitions (0: not partitioned). ``policies``
        are fields of ``TopicPolicies`` (``retention_time_ms``, ``deduplication`` ...)."""
        name = parse_topic(topic).full
        if partitions < 0:
            raise InvalidArgumentError(f"partitions is >= 0, got {partitions}")
        unknown = set(policies or {}) - _POLICY_FIELDS
        if unknown:
            raise InvalidArgumentError(
                f"unknown topic policies {sorted(unknown)}; known: {sorted(_POLICY_FIELDS)}"
            )
        request = pb.CreateTopicRequest(
            topic=name,
            partitions=partitions,
            policies=pb.TopicPolicies(**dict(policies or {})),
            properties=dict(properties or {}),
        )
        response = await self._call(
            f"creating {name}", lambda s, t: s.CreateTopic(request, timeout=t)
        )
        return to_plain(response)

    async def delete_topic(self, topic: str, *, force: bool = False) -> None:
        """Delete ``topic`` (all its partitions and their data). Refused while producers or
        consumers are attached, unless ``force`` (they are disconnected)."""
        request = pb.DeleteTopicRequest(topic=parse_topic(topic).full, force=force)
        await self._call(f"deleting {topic}", lambda s, t: s.DeleteTopic(request, timeout=t))

    async def list_topics(self, namespace: str = "") -> list[dict[str, Any]]:
        """``[{"topic": ..., "partitions": N}, ...]`` of ``namespace`` (``tenant/namespace``;
        empty: every namespace)."""
        request = pb.ListTopicsRequest(namespace=namespace)
        response = await self._call("listing topics", lambda s, t: s.ListTopics(request, timeout=t))
        return [to_plain(t) for t in response.topics]

    async def get_topic(self, topic: str) -> dict[str, Any]:
        """The topic's partition count, policies, properties and creation time."""
        request = pb.GetTopicRequest(topic=parse_topic(topic).full)
        response = await self._call(f"reading {topic}", lambda s, t: s.GetTopic(request, timeout=t))
        return to_plain(response)

    async def get_partitions(self, topic: str) -> int:
        """The number of partitions of ``topic`` (0: not partitioned)."""
        return int((await self.get_topic(topic))["partitions"])

    async def update_partitions(self, topic: str, partitions: int) -> int:
        """Grow ``topic`` to ``partitions`` partitions (they never shrink); the new count."""
        request = pb.UpdatePartitionsRequest(topic=parse_topic(topic).full, partitions=partitions)
        response = await self._call(
            f"updating the partitions of {topic}",
            lambda s, t: s.UpdatePartitions(request, timeout=t),
        )
        return response.partitions

    async def topic_stats(self, topic: str, *, internal: bool = False) -> dict[str, Any]:
        """Rates, storage, offsets, publishers and subscriptions, per partition and summed;
        ``internal`` adds each partition's ledgers and cursors."""
        request = pb.GetTopicStatsRequest(topic=parse_topic(topic).full, internal=internal)
        response = await self._call(
            f"reading the stats of {topic}", lambda s, t: s.GetTopicStats(request, timeout=t)
        )
        return to_plain(response)

    async def unload_topic(self, topic: str) -> None:
        """Release ``topic``'s partitions from their brokers; the next lookup places them
        again (the way to move load by hand)."""
        request = pb.UnloadTopicRequest(topic=parse_topic(topic).full)
        await self._call(f"unloading {topic}", lambda s, t: s.UnloadTopic(request, timeout=t))

    # --- subscriptions -----------------------------------------------------------------------

    async def list_subscriptions(self, topic: str) -> list[str]:
        request = pb.ListSubscriptionsRequest(topic=parse_topic(topic).full)
        response = await self._call(
            f"listing the subscriptions of {topic}",
            lambda s, t: s.ListSubscriptions(request, timeout=t),
        )
        return list(response.subscriptions)

    async def create_subscription(
        self,
        topic: str,
        subscription: str,
        start: MessageId | int | Literal["earliest", "latest"] = "latest",
        *,
        publish_time_ms: int | None = None,
    ) -> None:
        """Create a durable subscription on every partition, starting at ``start`` (earliest,
        latest, a message id, an offset) or ``publish_time_ms=``."""
        if not subscription:
            raise InvalidArgumentError("a subscription needs a name")
        request = pb.CreateSubscriptionRequest(
            topic=parse_topic(topic).full,
            subscription=subscription,
            start=_start(None if publish_time_ms is not None else start, publish_time_ms),
        )
        await self._call(
            f"creating subscription {subscription!r} on {topic}",
            lambda s, t: s.CreateSubscription(request, timeout=t),
        )

    async def delete_subscription(
        self, topic: str, subscription: str, *, force: bool = False
    ) -> None:
        """Delete the subscription (its cursor) on every partition; refused while consumers
        are attached, unless ``force``."""
        request = pb.DeleteSubscriptionRequest(
            topic=parse_topic(topic).full, subscription=subscription, force=force
        )
        await self._call(
            f"deleting subscription {subscription!r} of {topic}",
            lambda s, t: s.DeleteSubscription(request, timeout=t),
        )

    async def reset_cursor(
        self,
        topic: str,
        subscription: str,
        target: MessageId | int | Literal["earliest", "latest"] | None = None,
        *,
        publish_time_ms: int | None = None,
    ) -> None:
        """Move the subscription on every partition: to earliest, latest, a message id, an
        offset, or the first message published at or after ``publish_time_ms``."""
        if target is None and publish_time_ms is None:
            raise InvalidArgumentError(
                "reset_cursor needs a target (earliest, latest, a MessageId, an offset) or"
                " publish_time_ms="
            )
        request = pb.ResetCursorRequest(
            topic=parse_topic(topic).full,
            subscription=subscription,
            target=_start(target, publish_time_ms),
        )
        await self._call(
            f"resetting subscription {subscription!r} of {topic}",
            lambda s, t: s.ResetCursor(request, timeout=t),
        )

    # --- cluster -----------------------------------------------------------------------------

    async def list_brokers(self) -> list[dict[str, Any]]:
        response = await self._call(
            "listing brokers", lambda s, t: s.ListBrokers(pb.ListBrokersRequest(), timeout=t)
        )
        return [to_plain(b) for b in response.brokers]

    async def list_bookies(self) -> list[dict[str, Any]]:
        response = await self._call(
            "listing bookies", lambda s, t: s.ListBookies(pb.ListBookiesRequest(), timeout=t)
        )
        return [to_plain(b) for b in response.bookies]

    async def list_ownership(self, broker_id: str = "") -> list[dict[str, Any]]:
        """Which broker owns each loaded partition (only ``broker_id``'s when given)."""
        request = pb.ListOwnershipRequest(broker_id=broker_id)
        response = await self._call(
            "listing ownership", lambda s, t: s.ListOwnership(request, timeout=t)
        )
        return [to_plain(o) for o in response.ownership]

    async def list_ledgers(self, topic: str = "") -> list[dict[str, Any]]:
        """Every ledger, or only those of ``topic``'s partitions."""
        request = pb.ListLedgersRequest(topic=parse_topic(topic).full if topic else "")
        response = await self._call(
            "listing ledgers", lambda s, t: s.ListLedgers(request, timeout=t)
        )
        return [to_plain(ledger) for ledger in response.ledgers]

    async def get_ledger(self, ledger_id: int) -> dict[str, Any]:
        """One ledger's summary, ensembles, creation time and properties."""
        request = pb.GetLedgerRequest(ledger_id=ledger_id)
        response = await self._call(
            f"reading ledger {ledger_id}", lambda s, t: s.GetLedger(request, timeout=t)
        )
        return to_plain(response)

    # --- tenants, namespaces and permissions (pulsar-admin's names) ------------------------------

    async def create_tenant(self, tenant: str, admin_roles: Iterable[str] = ()) -> None:
        """Create ``tenant``, administered by ``admin_roles`` (superusers only)."""
        request = pb.CreateTenantRequest(tenant=tenant, admin_roles=list(admin_roles))
        await self._call(
            f"creating tenant {tenant}", lambda s, t: s.CreateTenant(request, timeout=t)
        )

    async def update_tenant(self, tenant: str, admin_roles: Iterable[str]) -> None:
        """Replace the admin roles of ``tenant`` (superusers only)."""
        request = pb.UpdateTenantRequest(tenant=tenant, admin_roles=list(admin_roles))
        await self._call(
            f"updating tenant {tenant}", lambda s, t: s.UpdateTenant(request, timeout=t)
        )

    async def delete_tenant(self, tenant: str) -> None:
        """Delete ``tenant``; refused while it has namespaces (superusers only)."""
        request = pb.DeleteTenantRequest(tenant=tenant)
        await self._call(
            f"deleting tenant {tenant}", lambda s, t: s.DeleteTenant(request, timeout=t)
        )

    async def list_tenants(self) -> list[str]:
        """The tenants this role may see: all of them for a superuser."""
        response = await self._call(
            "listing tenants", lambda s, t: s.ListTenants(pb.ListTenantsRequest(), timeout=t)
        )
        return list(response.tenants)

    async def get_tenant(self, tenant: str) -> dict[str, Any]:
        """``{"tenant": ..., "admin_roles": [...]}``."""
        request = pb.GetTenantRequest(tenant=tenant)
        response = await self._call(
            f"reading tenant {tenant}", lambda s, t: s.GetTenant(request, timeout=t)
        )
        return to_plain(response.tenant)

    async def create_namespace(self, namespace: str) -> None:
        """Create ``tenant/namespace`` (tenant admins and superusers)."""
        request = pb.CreateNamespaceRequest(namespace=namespace)
        await self._call(
            f"creating namespace {namespace}", lambda s, t: s.CreateNamespace(request, timeout=t)
        )

    async def delete_namespace(self, namespace: str) -> None:
        """Delete ``tenant/namespace``; refused while it has topics."""
        request = pb.DeleteNamespaceRequest(namespace=namespace)
        await self._call(
            f"deleting namespace {namespace}", lambda s, t: s.DeleteNamespace(request, timeout=t)
        )

    async def list_namespaces(self, tenant: str) -> list[str]:
        """The namespaces of ``tenant`` this role may see."""
        request = pb.ListNamespacesRequest(tenant=tenant)
        response = await self._call(
            f"listing the namespaces of {tenant}", lambda s, t: s.ListNamespaces(request, timeout=t)
        )
        return list(response.namespaces)

    async def grant_permission(
        self, namespace: str, role: str, actions: Iterable[str] = ("produce", "consume")
    ) -> None:
        """Let ``role`` take ``actions`` (``produce``, ``consume``) on every topic of
        ``namespace``, replacing what it had there."""
        wire = []
        for action in actions:
            number = _AUTH_ACTIONS.get(action.strip().lower())
            if number is None:
                raise InvalidArgumentError(
                    f"unknown action {action!r}: the actions are produce and consume"
                )
            wire.append(number)
        request = pb.GrantPermissionRequest(namespace=namespace, role=role, actions=wire)
        await self._call(
            f"granting {role} on {namespace}", lambda s, t: s.GrantPermission(request, timeout=t)
        )

    async def revoke_permission(self, namespace: str, role: str) -> None:
        """Take every action on ``namespace`` from ``role``."""
        request = pb.RevokePermissionRequest(namespace=namespace, role=role)
        await self._call(
            f"revoking {role} on {namespace}", lambda s, t: s.RevokePermission(request, timeout=t)
        )

    async def permissions(self, namespace: str) -> dict[str, list[str]]:
        """``{role: ["consume", "produce"], ...}`` granted on ``namespace``."""
        request = pb.GetPermissionsRequest(namespace=namespace)
        response = await self._call(
            f"reading the permissions of {namespace}",
            lambda s, t: s.GetPermissions(request, timeout=t),
        )
        names = {number: name for name, number in _AUTH_ACTIONS.items()}
        return {
            p.role: sorted(names.get(a, str(a)) for a in p.actions) for p in response.permissions
        }

    async def whoami(self) -> dict[str, Any]:
        """How the broker sees this client: ``role``, ``method`` (token, tls, none),
        ``superuser``, and whether authentication and authorization are on."""
        response = await self._call(
            "asking who this client is", lambda s, t: s.WhoAmI(pb.WhoAmIRequest(), timeout=t)
        )
        return to_plain(response)

    # --- lifetime ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the connections. Idempotent."""
        await self._pool.close()

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
