"""The managed ledger: a partition as an ordered list of ledgers plus cursors.

A library over the ledger-client and metadata APIs; it knows nothing of the broker. See
``docs/managed-ledger.md`` for the layout in metadata, rollover, recovery and retention.
"""

from broker.managed_ledger.ack_ranges import AckRanges
from broker.managed_ledger.cache import EntryCache
from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.cursor import ManagedCursor
from broker.managed_ledger.factory import ManagedLedgerFactory
from broker.managed_ledger.managed_ledger import ManagedLedger
from broker.managed_ledger.ports import LedgerClientApi
from broker.managed_ledger.redelivery_counts import RedeliveryCounts
from broker.managed_ledger.rollover import RolloverPolicy, RollReason
from broker.managed_ledger.types import (
    BEFORE_EVERYTHING,
    AppendResult,
    DelayedEntry,
    Entry,
    EntryCodec,
    EntryMeta,
    LedgerInfo,
    ManagedLedgerSnapshot,
    Position,
    StartAt,
)

__all__ = [
    "BEFORE_EVERYTHING",
    "AckRanges",
    "AppendResult",
    "DelayedEntry",
    "Entry",
    "EntryCache",
    "EntryCodec",
    "EntryMeta",
    "LedgerClientApi",
    "LedgerInfo",
    "ManagedCursor",
    "ManagedLedger",
    "ManagedLedgerConfig",
    "ManagedLedgerFactory",
    "ManagedLedgerSnapshot",
    "Position",
    "RedeliveryCounts",
    "RollReason",
    "RolloverPolicy",
    "StartAt",
]
