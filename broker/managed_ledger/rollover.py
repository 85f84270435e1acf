"""When to roll over to a new ledger: the decision alone, with no I/O and no clock.

A ledger is closed and a new one started once it holds ``max_entries`` entries, or
``max_size_bytes`` bytes of payload, or (if it holds anything) it is ``max_age_ms`` old, but
never before it is ``min_age_ms`` old: a burst of large entries must not create a ledger per
second. Write failures and ownership changes roll regardless; they do not ask this policy.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.managed_ledger.config import ManagedLedgerConfig


class RollReason(enum.Enum):
    ENTRIES = "entries"
    SIZE = "size"
    AGE = "age"


@dataclass(frozen=True, slots=True)
class RolloverPolicy:
    """Limits on one ledger; :meth:`reason` says whether (and why) a ledger is due to roll."""

    max_entries: int
    max_size_bytes: int
    max_age_ms: int
    min_age_ms: int

    @classmethod
    def from_config(cls, config: ManagedLedgerConfig) -> RolloverPolicy:
        return cls(
            max_entries=config.max_entries_per_ledger,
            max_size_bytes=config.max_ledger_size_bytes,
            max_age_ms=config.max_ledger_age_ms,
            min_age_ms=config.min_ledger_age_ms,
        )

    def reason(self, *, entries: int, size_bytes: int, age_ms: int) -> RollReason | None:
        """Why a ledger with these counts and age should roll now, or ``None``."""
        if age_ms < self.min_age_ms:
            return None
        if entries >= self.max_entries:
            return RollReason.ENTRIES
        if size_bytes >= self.max_size_bytes:
            return RollReason.SIZE
        if entries > 0 and age_ms >= self.max_age_ms:
            return RollReason.AGE
        return None
