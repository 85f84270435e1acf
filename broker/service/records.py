"""The persisted forms of what the broker's services keep in the metadata store, and their codec.

This is the only module of ``broker.service`` that handles the ``magnetar.format.v1`` messages
of topics, tenants and the cluster (``proto/magnetar/format/v1/topic.proto``, ``tenant.proto``
and ``cluster.proto``); the services work with the plain values below, as the managed ledger
does with :mod:`broker.managed_ledger.persistence`. (Entries are the other persisted form, and
:mod:`broker.service.envelope` and :mod:`broker.service.validation` are their codec.)

``decode_*(encode_*(x)) == x`` for every value, and a record written before this module existed
reads back the same: the messages and their field numbers did not change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from proto.format.v1 import cluster_pb2, tenant_pb2, topic_pb2

FORMAT_VERSION = 1

# --- topics -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicPolicies:
    """A topic's own policies; None: not set, the broker's setting applies."""

    retention_time_ms: int | None = None
    retention_size_bytes: int | None = None
    message_ttl_ms: int | None = None
    backlog_quota_bytes: int | None = None
    deduplication: bool | None = None
    max_redelivery_count: int | None = None


_POLICY_NAMES = tuple(f.name for f in fields(TopicPolicies))


def policies_from_message(message: topic_pb2.TopicPolicies) -> TopicPolicies:
    """The policies a ``TopicPolicies`` message sets (a wire message with the same fields
    converts through its bytes: see ``broker.grpc.admin``)."""
    has = message.HasField
    return TopicPolicies(
        retention_time_ms=message.retention_time_ms if has("retention_time_ms") else None,
        retention_size_bytes=(
            message.retention_size_bytes if has("retention_size_bytes") else None
        ),
        message_ttl_ms=message.message_ttl_ms if has("message_ttl_ms") else None,
        backlog_quota_bytes=message.backlog_quota_bytes if has("backlog_quota_bytes") else None,
        deduplication=message.deduplication if has("deduplication") else None,
        max_redelivery_count=(
            message.max_redelivery_count if has("max_redelivery_count") else None
        ),
    )


def policies_to_message(policies: TopicPolicies) -> topic_pb2.TopicPolicies:
    return topic_pb2.TopicPolicies(
        **{name: value for name in _POLICY_NAMES if (value := getattr(policies, name)) is not None}
    )


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """A topic's record at ``/magnetar/topics/<tenant>/<namespace>/<topic>``."""

    partitions: int
    created_ms: int
    policies: TopicPolicies = TopicPolicies()
    properties: Mapping[str, str] = field(default_factory=dict)


def encode_topic(meta: TopicMetadata) -> bytes:
    return topic_pb2.TopicMetadata(
        format_version=FORMAT_VERSION,
        partitions=meta.partitions,
        created_ms=meta.created_ms,
        policies=policies_to_message(meta.policies),
        properties=dict(meta.properties),
    ).SerializeToString()


def decode_topic(value: bytes) -> TopicMetadata:
    message = topic_pb2.TopicMetadata.FromString(value)
    return TopicMetadata(
        message.partitions,
        message.created_ms,
        policies_from_message(message.policies),
        dict(message.properties),
    )


@dataclass(frozen=True, slots=True)
class DeduplicationSnapshot:
    """A partition's deduplication table as of one entry: the last sequence id of each producer
    in the entries up to and including ``(ledger_id, entry_id)``."""

    ledger_id: int
    entry_id: int
    last_sequence_ids: Mapping[str, int] = field(default_factory=dict)


def encode_dedup_snapshot(snapshot: DeduplicationSnapshot) -> bytes:
    return topic_pb2.DeduplicationSnapshot(
        format_version=FORMAT_VERSION,
        ledger_id=snapshot.ledger_id,
        entry_id=snapshot.entry_id,
        last_sequence_ids=dict(snapshot.last_sequence_ids),
    ).SerializeToString()


def decode_dedup_snapshot(value: bytes) -> DeduplicationSnapshot:
    message = topic_pb2.DeduplicationSnapshot.FromString(value)
    return DeduplicationSnapshot(
        message.ledger_id, message.entry_id, dict(message.last_sequence_ids)
    )


# --- tenants and namespaces -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TenantRecord:
    """A tenant's record at ``/magnetar/tenants/<tenant>``."""

    admin_roles: tuple[str, ...]
    created_ms: int


def encode_tenant(record: TenantRecord) -> bytes:
    return tenant_pb2.TenantRecord(
        format_version=FORMAT_VERSION, admin_roles=record.admin_roles, created_ms=record.created_ms
    ).SerializeToString()


def decode_tenant(value: bytes) -> TenantRecord:
    message = tenant_pb2.TenantRecord.FromString(value)
    return TenantRecord(tuple(message.admin_roles), message.created_ms)


@dataclass(frozen=True, slots=True)
class NamespacePermission:
    produce: bool = False
    consume: bool = False


@dataclass(frozen=True, slots=True)
class NamespaceRecord:
    """A namespace's record: the permissions granted on it, by role."""

    permissions: Mapping[str, NamespacePermission]
    created_ms: int


def encode_namespace(record: NamespaceRecord) -> bytes:
    message = tenant_pb2.NamespaceRecord(
        format_version=FORMAT_VERSION, created_ms=record.created_ms
    )
    for role, permission in record.permissions.items():
        message.permissions[role].produce = permission.produce
        message.permissions[role].consume = permission.consume
    return message.SerializeToString()


def decode_namespace(value: bytes) -> NamespaceRecord:
    message = tenant_pb2.NamespaceRecord.FromString(value)
    return NamespaceRecord(
        {
            role: NamespacePermission(p.produce, p.consume)
            for role, p in message.permissions.items()
        },
        message.created_ms,
    )


# --- the cluster: brokers, their load, owners and handovers -----------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerRegistration:
    """A live broker's registration at ``/magnetar/brokers/<broker>`` (bound to its session)."""

    broker_id: str
    service_url: str = ""
    service_url_tls: str = ""
    http_address: str = ""
    version: str = ""
    start_time_ms: int = 0
    pulsar_url: str = ""
    """``pulsar://host:port`` of its Pulsar-protocol listener ("" without one)."""
    pulsar_url_tls: str = ""
    """``pulsar+ssl://host:port`` of its TLS Pulsar-protocol listener ("" without one)."""


def encode_broker_registration(registration: BrokerRegistration) -> bytes:
    return cluster_pb2.BrokerRegistration(
        format_version=FORMAT_VERSION,
        broker_id=registration.broker_id,
        service_url=registration.service_url,
        service_url_tls=registration.service_url_tls,
        http_address=registration.http_address,
        version=registration.version,
        start_time_ms=registration.start_time_ms,
        pulsar_url=registration.pulsar_url,
        pulsar_url_tls=registration.pulsar_url_tls,
    ).SerializeToString()


def decode_broker_registration(value: bytes) -> BrokerRegistration:
    message = cluster_pb2.BrokerRegistration.FromString(value)
    return BrokerRegistration(
        broker_id=message.broker_id,
        service_url=message.service_url,
        service_url_tls=message.service_url_tls,
        http_address=message.http_address,
        version=message.version,
        start_time_ms=message.start_time_ms,
        pulsar_url=message.pulsar_url,
        pulsar_url_tls=message.pulsar_url_tls,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionLoad:
    """One owned partition's rates in a load report."""

    partition: str
    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    bytes_rate_in: float = 0.0
    bytes_rate_out: float = 0.0
    acquired_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerLoadReport:
    """What a broker publishes about its load, at ``/magnetar/load/<broker>``."""

    broker_id: str
    timestamp_ms: int = 0
    owned_partitions: int = 0
    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    bytes_rate_in: float = 0.0
    bytes_rate_out: float = 0.0
    cpu_percent: float = 0.0
    memory_bytes: int = 0
    partitions: tuple[PartitionLoad, ...] = ()


def encode_load_report(report: BrokerLoadReport) -> bytes:
    message = cluster_pb2.BrokerLoadReport(
        broker_id=report.broker_id,
        timestamp_ms=report.timestamp_ms,
        owned_partitions=report.owned_partitions,
        msg_rate_in=report.msg_rate_in,
        msg_rate_out=report.msg_rate_out,
        bytes_rate_in=report.bytes_rate_in,
        bytes_rate_out=report.bytes_rate_out,
        cpu_percent=report.cpu_percent,
        memory_bytes=report.memory_bytes,
    )
    for p in report.partitions:
        message.partitions.add(
            partition=p.partition,
            msg_rate_in=p.msg_rate_in,
            msg_rate_out=p.msg_rate_out,
            bytes_rate_in=p.bytes_rate_in,
            bytes_rate_out=p.bytes_rate_out,
            acquired_ms=p.acquired_ms,
        )
    return message.SerializeToString()


def decode_load_report(value: bytes) -> BrokerLoadReport:
    message = cluster_pb2.BrokerLoadReport.FromString(value)
    return BrokerLoadReport(
        broker_id=message.broker_id,
        timestamp_ms=message.timestamp_ms,
        owned_partitions=message.owned_partitions,
        msg_rate_in=message.msg_rate_in,
        msg_rate_out=message.msg_rate_out,
        bytes_rate_in=message.bytes_rate_in,
        bytes_rate_out=message.bytes_rate_out,
        cpu_percent=message.cpu_percent,
        memory_bytes=message.memory_bytes,
        partitions=tuple(
            PartitionLoad(
                partition=p.partition,
                msg_rate_in=p.msg_rate_in,
                msg_rate_out=p.msg_rate_out,
                bytes_rate_in=p.bytes_rate_in,
                bytes_rate_out=p.bytes_rate_out,
                acquired_ms=p.acquired_ms,
            )
            for p in message.partitions
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnershipRecord:
    """Who owns a partition: the value of its ownership lock at ``/magnetar/ownership/...``."""

    broker_id: str
    service_url: str = ""
    service_url_tls: str = ""
    acquired_ms: int = 0


def encode_owner(record: OwnershipRecord) -> bytes:
    return cluster_pb2.OwnershipRecord(
        broker_id=record.broker_id,
        service_url=record.service_url,
        service_url_tls=record.service_url_tls,
        acquired_ms=record.acquired_ms,
    ).SerializeToString()


def decode_owner(value: bytes) -> OwnershipRecord:
    message = cluster_pb2.OwnershipRecord.FromString(value)
    return OwnershipRecord(
        broker_id=message.broker_id,
        service_url=message.service_url,
        service_url_tls=message.service_url_tls,
        acquired_ms=message.acquired_ms,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoverHint:
    """A partition reserved for ``broker_id`` (handed over by ``from_broker_id``, if set) until
    ``expires_ms``."""

    broker_id: str
    from_broker_id: str = ""
    expires_ms: int = 0


def encode_handover(hint: HandoverHint) -> bytes:
    return cluster_pb2.HandoverHint(
        broker_id=hint.broker_id, from_broker_id=hint.from_broker_id, expires_ms=hint.expires_ms
    ).SerializeToString()


def decode_handover(value: bytes) -> HandoverHint:
    message = cluster_pb2.HandoverHint.FromString(value)
    return HandoverHint(
        broker_id=message.broker_id,
        from_broker_id=message.from_broker_id,
        expires_ms=message.expires_ms,
    )
