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
    /magnetar/topics/<tenant>/<namespace>/<topic>       TopicMetadata
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
