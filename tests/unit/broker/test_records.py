"""The broker services' persisted records: every field survives a round trip, and the bytes are
those the ``magnetar.format.v1`` messages had before the services used plain values (so records
already in a metadata store read back the same)."""

from __future__ import annotations

from broker.service.records import (
    BrokerLoadReport,
    BrokerRegistration,
    DeduplicationSnapshot,
    HandoverHint,
    NamespacePermission,
    NamespaceRecord,
    OwnershipRecord,
    PartitionLoad,
    TenantRecord,
    TopicMetadata,
    TopicPolicies,
    decode_broker_registration,
    decode_dedup_snapshot,
    decode_handover,
    decode_load_report,
    decode_namespace,
    decode_owner,
    decode_tenant,
    decode_topic,
    encode_broker_registration,
    encode_dedup_snapshot,
    encode_handover,
    encode_load_report,
    encode_namespace,
    encode_owner,
    encode_tenant,
    encode_topic,
    policies_from_message,
    policies_to_message,
)
from proto.format.v1 import cluster_pb2, tenant_pb2, topic_pb2


def test_topic_metadata_matches_the_message_and_keeps_which_policies_are_set() -> None:
    message = topic_pb2.TopicMetadata(
        format_version=1,
        partitions=4,
        created_ms=1_700_000_000_123,
        policies=topic_pb2.TopicPolicies(retention_time_ms=-1, deduplication=False),
        properties={"team": "a"},
    )
    meta = decode_topic(message.SerializeToString())
    assert meta == TopicMetadata(
        4,
        1_700_000_000_123,
        TopicPolicies(retention_time_ms=-1, deduplication=False),
        {"team": "a"},
    )
    assert encode_topic(meta) == message.SerializeToString()
    # set to a zero value is not the same as not set
    assert meta.policies.deduplication is False
    assert meta.policies.message_ttl_ms is None


def test_every_topic_policy_round_trips() -> None:
    policies = TopicPolicies(
        retention_time_ms=60_000,
        retention_size_bytes=0,
        message_ttl_ms=0,
        backlog_quota_bytes=-1,
        deduplication=True,
        max_redelivery_count=3,
    )
    assert policies_from_message(policies_to_message(policies)) == policies
    assert policies_from_message(topic_pb2.TopicPolicies()) == TopicPolicies()


def test_dedup_snapshot_matches_the_message() -> None:
    message = topic_pb2.DeduplicationSnapshot(
        format_version=1, ledger_id=7, entry_id=41, last_sequence_ids={"producer-1": 99}
    )
    snapshot = decode_dedup_snapshot(message.SerializeToString())
    assert snapshot == DeduplicationSnapshot(7, 41, {"producer-1": 99})
    assert encode_dedup_snapshot(snapshot) == message.SerializeToString()


def test_tenant_and_namespace_records_match_their_messages() -> None:
    tenant = tenant_pb2.TenantRecord(format_version=1, admin_roles=["a", "b"], created_ms=5)
    assert decode_tenant(tenant.SerializeToString()) == TenantRecord(("a", "b"), 5)
    assert encode_tenant(TenantRecord(("a", "b"), 5)) == tenant.SerializeToString()

    namespace = tenant_pb2.NamespaceRecord(format_version=1, created_ms=6)
    namespace.permissions["reader"].consume = True
    record = decode_namespace(namespace.SerializeToString())
    assert record == NamespaceRecord({"reader": NamespacePermission(False, True)}, 6)
    assert encode_namespace(record) == namespace.SerializeToString()


def test_cluster_records_match_their_messages() -> None:
    registration = cluster_pb2.BrokerRegistration(
        format_version=1,
        broker_id="broker-1",
        service_url="magnetar://h:6650",
        service_url_tls="magnetar+ssl://h:6651",
        http_address="h:8080",
        version="1.2.3",
        start_time_ms=11,
        pulsar_url="pulsar://h:6660",
    )
    decoded = decode_broker_registration(registration.SerializeToString())
    assert decoded == BrokerRegistration(
        broker_id="broker-1",
        service_url="magnetar://h:6650",
        service_url_tls="magnetar+ssl://h:6651",
        http_address="h:8080",
        version="1.2.3",
        start_time_ms=11,
        pulsar_url="pulsar://h:6660",
    )
    assert encode_broker_registration(decoded) == registration.SerializeToString()

    report = cluster_pb2.BrokerLoadReport(
        broker_id="broker-1",
        timestamp_ms=12,
        owned_partitions=1,
        msg_rate_in=1.5,
        msg_rate_out=2.5,
        bytes_rate_in=3.5,
        bytes_rate_out=4.5,
        cpu_percent=55.0,
        memory_bytes=1 << 30,
    )
    report.partitions.add(
        partition="persistent://t/n/x-partition-0",
        msg_rate_in=1.5,
        msg_rate_out=2.5,
        bytes_rate_in=3.5,
        bytes_rate_out=4.5,
        acquired_ms=13,
    )
    load = decode_load_report(report.SerializeToString())
    assert load.partitions == (
        PartitionLoad(
            partition="persistent://t/n/x-partition-0",
            msg_rate_in=1.5,
            msg_rate_out=2.5,
            bytes_rate_in=3.5,
            bytes_rate_out=4.5,
            acquired_ms=13,
        ),
    )
    assert (load.cpu_percent, load.memory_bytes, load.owned_partitions) == (55.0, 1 << 30, 1)
    assert encode_load_report(load) == report.SerializeToString()
    assert encode_load_report(BrokerLoadReport(broker_id="b")) == (
        cluster_pb2.BrokerLoadReport(broker_id="b").SerializeToString()
    )

    owner = cluster_pb2.OwnershipRecord(
        broker_id="broker-2", service_url="magnetar://o:1", service_url_tls="", acquired_ms=14
    )
    assert decode_owner(owner.SerializeToString()) == OwnershipRecord(
        broker_id="broker-2", service_url="magnetar://o:1", acquired_ms=14
    )
    assert encode_owner(decode_owner(owner.SerializeToString())) == owner.SerializeToString()

    hint = cluster_pb2.HandoverHint(broker_id="broker-3", from_broker_id="broker-2", expires_ms=15)
    assert decode_handover(hint.SerializeToString()) == HandoverHint(
        broker_id="broker-3", from_broker_id="broker-2", expires_ms=15
    )
    assert encode_handover(decode_handover(hint.SerializeToString())) == hint.SerializeToString()
