"""What the metadata store says about topics and brokers: topic records, live brokers, their
load reports, partition owners and handover hints. Reads and writes only; no policy."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from broker.service.load import BrokerLoadInfo, PartitionLoadInfo
from broker.service.records import (
    BrokerLoadReport,
    BrokerRegistration,
    HandoverHint,
    OwnershipRecord,
    PartitionLoad,
    TopicMetadata,
    TopicPolicies,
    decode_broker_registration,
    decode_handover,
    decode_load_report,
    decode_owner,
    decode_topic,
    encode_topic,
)
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    InvalidArgumentError,
    KeyExistsError,
    NoSuchKeyError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
)
from magnetar.common.names import TopicName
from metadata import MetadataStore, layout

MAX_PARTITIONS = 10_000


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: TopicName
    partitions: int
    created_ms: int
    policies: TopicPolicies
    properties: dict[str, str]
    version: int

    def partition_names(self) -> list[TopicName]:
        if self.partitions == 0:
            return [self.name]
        return [self.name.partition_name(i) for i in range(self.partitions)]


def check_policies(policies: TopicPolicies) -> None:
    """Refuse policy values no topic could run with, naming the policy."""
    for name in ("retention_time_ms", "retention_size_bytes", "backlog_quota_bytes"):
        value = getattr(policies, name)
        if value is not None and value < -1:
            raise InvalidArgumentError(
                f"policy {name} is >= 0, or -1 for no limit; got {value}",
                context={"policy": name},
            )
    for name in ("message_ttl_ms", "max_redelivery_count"):
        value = getattr(policies, name)
        if value is not None and value < 0:
            raise InvalidArgumentError(
                f"policy {name} is >= 0 (0: off); got {value}",
                context={"policy": name},
            )


def _parse_topic(name: TopicName, value: bytes, version: int) -> TopicRecord:
    meta = decode_topic(value)
    return TopicRecord(
        name, meta.partitions, meta.created_ms, meta.policies, dict(meta.properties), version
    )


class TopicCatalog:
    """Topic records at ``/magnetar/topics/<tenant>/<namespace>/<topic>``."""

    def __init__(self, store: MetadataStore, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.clock = clock

    async def get(self, name: TopicName) -> TopicRecord | None:
        record = await self.store.get(layout.topic(name.topic))
        if record is None:
            return None
        return _parse_topic(name.base(), record.value, record.version)

    async def require(self, name: TopicName) -> TopicRecord:
        found = await self.get(name)
        if found is None:
            raise TopicNotFoundError(
                f"topic {name.topic} does not exist", context={"topic": name.topic}
            )
        if name.is_partition and not 0 <= name.partition < max(found.partitions, 1):
            raise TopicNotFoundError(
                f"topic {name.topic} has {found.partitions} partition(s); there is no"
                f" partition {name.partition}",
                context={"topic": name.full},
            )
        if name.is_partition and found.partitions == 0:
            raise TopicNotFoundError(
                f"topic {name.topic} is not partitioned", context={"topic": name.full}
            )
        return found

    async def create(
        self,
        name: TopicName,
        partitions: int,
        *,
        policies: TopicPolicies | None = None,
        properties: dict[str, str] | None = None,
    ) -> TopicRecord:
        if not 0 <= partitions <= MAX_PARTITIONS:
            raise InvalidArgumentError(
                f"partitions must be from 0 (non-partitioned) to {MAX_PARTITIONS:,}, got"
                f" {partitions}",
                context={"partitions": partitions},
            )
        if policies is not None:
            check_policies(policies)
        value = encode_topic(
            TopicMetadata(
                partitions, self.clock.time_ms(), policies or TopicPolicies(), properties or {}
            )
        )
        try:
            version = await self.store.create(layout.topic(name.topic), value)
        except KeyExistsError:
            raise TopicAlreadyExistsError(
                f"topic {name.topic} already exists", context={"topic": name.topic}
            ) from None
        return _parse_topic(name, value, version)

    async def update_partitions(self, name: TopicName, partitions: int) -> TopicRecord:
        if partitions > MAX_PARTITIONS:
            raise InvalidArgumentError(
                f"partitions must be at most {MAX_PARTITIONS:,}, got {partitions}",
                context={"partitions": partitions},
            )
        current = await self.require(name)
        if partitions < current.partitions or current.partitions == 0:
            raise InvalidArgumentError(
                f"partitions of {name.topic} can only grow, from {current.partitions} (and a"
                f" non-partitioned topic cannot become partitioned); asked for {partitions}"
            )
        value = encode_topic(
            TopicMetadata(partitions, current.created_ms, current.policies, current.properties)
        )
        version = await self.store.put(
            layout.topic(name.topic), value, expected_version=current.version
        )
        return _parse_topic(name, value, version)

    async def update_policies(
        self, name: TopicName, changes: TopicPolicies, remove: Iterable[str] = ()
    ) -> TopicRecord:
        """Set the policies ``changes`` sets and remove the ones named in ``remove`` (so the
        broker's setting applies to them again); the others stay as they are."""
        known = {f.name for f in dataclasses.fields(TopicPolicies)}
        removed = set(remove)
        unknown = sorted(removed - known)
        if unknown:
            raise InvalidArgumentError(
                f"no such topic policy: {', '.join(unknown)}; the policies are"
                f" {', '.join(sorted(known))}",
                context={"policy": unknown[0]},
            )
        check_policies(changes)
        current = await self.require(name)
        updates: dict[str, Any] = {
            key: value for key in known if (value := getattr(changes, key)) is not None
        }
        updates.update(dict.fromkeys(removed))  # removing wins over setting the same policy
        policies = dataclasses.replace(current.policies, **updates)
        value = encode_topic(
            TopicMetadata(current.partitions, current.created_ms, policies, current.properties)
        )
        version = await self.store.put(
            layout.topic(name.topic), value, expected_version=current.version
        )
        return _parse_topic(name, value, version)

    async def delete(self, name: TopicName) -> None:
        with contextlib.suppress(NoSuchKeyError):
            await self.store.delete(layout.topic(name.topic))

    async def list(self, namespace: str = "") -> list[TopicRecord]:
        prefix = layout.TOPICS + (namespace.strip("/") + "/" if namespace else "")
        listing = await self.store.list(prefix)
        found = []
        for record in listing.records:
            tenant, ns, local = record.key[len(layout.TOPICS) :].split("/", 2)
            found.append(_parse_topic(TopicName(tenant, ns, local), record.value, record.version))
        return found


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Live brokers, their load reports and who owns what, read together."""

    brokers: dict[str, BrokerRegistration]
    loads: dict[str, BrokerLoadReport]
    owners: dict[str, OwnershipRecord]

    def load_infos(self) -> list[BrokerLoadInfo]:
        owned: dict[str, dict[str, PartitionLoadInfo]] = {b: {} for b in self.brokers}
        rates: dict[str, dict[str, PartitionLoad]] = {
            b: {p.partition: p for p in report.partitions} for b, report in self.loads.items()
        }
        for partition, record in self.owners.items():
            if record.broker_id not in owned:
                continue
            reported = rates.get(record.broker_id, {}).get(partition)
            rate = reported.msg_rate_in + reported.msg_rate_out if reported else 0.0
            owned[record.broker_id][partition] = PartitionLoadInfo(rate, record.acquired_ms)
        return [
            BrokerLoadInfo(b, owned[b], self.loads[b].cpu_percent if b in self.loads else 0.0)
            for b in sorted(self.brokers)
        ]


async def read_cluster(store: MetadataStore) -> ClusterSnapshot:
    brokers = {}
    for record in (await store.list(layout.BROKERS)).records:
        registration = decode_broker_registration(record.value)
        brokers[registration.broker_id] = registration
    loads = {}
    for record in (await store.list(layout.LOAD)).records:
        report = decode_load_report(record.value)
        loads[report.broker_id] = report
    owners = {}
    for record in (await store.list(layout.OWNERSHIP)).records:
        owners[record.key[len(layout.OWNERSHIP) :]] = decode_owner(record.value)
    return ClusterSnapshot(brokers, loads, owners)


async def read_owner(store: MetadataStore, partition: str) -> OwnershipRecord | None:
    record = await store.get(layout.ownership(partition))
    if record is None:
        return None
    return decode_owner(record.value)


async def read_handover(store: MetadataStore, partition: str, now_ms: int) -> HandoverHint | None:
    record = await store.get(layout.handover(partition))
    if record is None:
        return None
    hint = decode_handover(record.value)
    return hint if hint.expires_ms > now_ms else None
