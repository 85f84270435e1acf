"""Where Magnetar keeps each kind of record in the metadata store: the one map of the key space.

Every component builds its keys here, so the layout is written down once::

    /magnetar/cluster                                   ClusterInfo (create-only)
    /magnetar/bookies/cookies/<bookie_id>               BookieRegistration: a bookie's identity
    /magnetar/bookies/available/<bookie_id>             BookieRegistration, lease-bound
    /magnetar/ledgers/<ledger_id>                       LedgerMetadata
    /magnetar/ledger-ids                                id allocation counter
    /magnetar/brokers/<broker_id>                       BrokerRegistration, lease-bound
    /magnetar/load/<broker_id>                          BrokerLoadReport, lease-bound
    /magnetar/ownership/<partition>                     OwnershipRecord, lease-bound
    /magnetar/handover/<partition>                      HandoverHint (expires by time)
    /magnetar/leader/load-manager                       the load-shedding leader, lease-bound
    /magnetar/topics/<tenant>/<namespace>/<topic>       TopicMetadata
    /magnetar/tenants/<tenant>                          TenantRecord
    /magnetar/namespaces/<tenant>/<namespace>           NamespaceRecord
    /magnetar/dedup/<partition>                         DeduplicationSnapshot
    /magnetar/managed-ledgers/<partition>/info          ManagedLedgerInfo
    /magnetar/managed-ledgers/<partition>/cursors/<n>   CursorInfo
"""

from __future__ import annotations

from metadata.keys import check_key

ROOT = "/magnetar"
CLUSTER = f"{ROOT}/cluster"
BOOKIE_COOKIES = f"{ROOT}/bookies/cookies/"
BOOKIES_AVAILABLE = f"{ROOT}/bookies/available/"
LEDGERS = f"{ROOT}/ledgers/"
LEDGER_ID_COUNTER = f"{ROOT}/ledger-ids"


def bookie_cookie(bookie_id: str) -> str:
    return check_key(BOOKIE_COOKIES + bookie_id)


def bookie_available(bookie_id: str) -> str:
    return check_key(BOOKIES_AVAILABLE + bookie_id)


def ledger(ledger_id: int) -> str:
    # zero-padded so that listing /magnetar/ledgers/ returns ledgers in id order
    return f"{LEDGERS}{ledger_id:020d}"


# --- brokers ----------------------------------------------------------------------------------

BROKERS = f"{ROOT}/brokers/"
LOAD = f"{ROOT}/load/"
OWNERSHIP = f"{ROOT}/ownership/"
HANDOVER = f"{ROOT}/handover/"
TOPICS = f"{ROOT}/topics/"
DEDUP = f"{ROOT}/dedup/"
LOAD_MANAGER_LEADER = f"{ROOT}/leader/load-manager"


def broker(broker_id: str) -> str:
    return check_key(BROKERS + broker_id)


def broker_load(broker_id: str) -> str:
    return check_key(LOAD + broker_id)


def ownership(partition: str) -> str:
    """Owner of a partition ('tenant/namespace/topic-partition-N' or a non-partitioned topic)."""
    return check_key(OWNERSHIP + partition)


def handover(partition: str) -> str:
    return check_key(HANDOVER + partition)


def topic(name: str) -> str:
    """A topic's metadata; ``name`` is 'tenant/namespace/topic'."""
    return check_key(TOPICS + name)


TENANTS = f"{ROOT}/tenants/"
NAMESPACES = f"{ROOT}/namespaces/"


def tenant(name: str) -> str:
    return check_key(TENANTS + name)


def namespace(name: str) -> str:
    """A namespace's record; ``name`` is 'tenant/namespace'."""
    return check_key(NAMESPACES + name)


def topics_of_namespace(name: str) -> str:
    """The prefix of the topic records of namespace ``name`` ('tenant/namespace')."""
    return f"{TOPICS}{name}/"


def dedup_snapshot(partition: str) -> str:
    return check_key(DEDUP + partition)


# --- managed ledgers --------------------------------------------------------------------------

MANAGED_LEDGERS = f"{ROOT}/managed-ledgers/"


def managed_ledger_info(name: str) -> str:
    """The info of managed ledger ``name`` (``public/default/t-partition-0``: slashes are fine)."""
    return check_key(f"{MANAGED_LEDGERS}{name}/info")


def managed_ledger_cursors(name: str) -> str:
    """The prefix under which the cursors of managed ledger ``name`` are stored."""
    return f"{MANAGED_LEDGERS}{name}/cursors/"


def managed_ledger_cursor(name: str, cursor: str) -> str:
    return check_key(f"{managed_ledger_cursors(name)}{cursor}")


def managed_ledger_delay_indexes(name: str) -> str:
    """The prefix under which the delayed-delivery indexes of ``name``'s cursors are stored."""
    return f"{MANAGED_LEDGERS}{name}/delayed/"


def managed_ledger_delay_index(name: str, cursor: str) -> str:
    """The prefix of the buckets of cursor ``cursor``'s delayed-delivery index."""
    return f"{managed_ledger_delay_indexes(name)}{cursor}/"


def managed_ledger_delay_bucket(name: str, cursor: str, bucket: str) -> str:
    return check_key(f"{managed_ledger_delay_index(name, cursor)}{bucket}")
