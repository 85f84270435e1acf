"""Settings of a managed ledger: quorums of its ledgers, rollover, retention, cursor persistence."""

from __future__ import annotations

from dataclasses import dataclass

from magnetar.common.config import config_error


@dataclass(frozen=True, kw_only=True)
class ManagedLedgerConfig:
    """How a partition's managed ledger writes, rolls, trims and persists its cursors."""

    ensemble_size: int | None = None
    """E of new ledgers (none: the ledger client's default)."""

    write_quorum: int | None = None
    """Qw of new ledgers (none: the ledger client's default, at most E)."""

    ack_quorum: int | None = None
    """Qa of new ledgers (none: the ledger client's default, at most Qw)."""

    max_entries_per_ledger: int = 50_000
    """A ledger is rolled over once it holds this many entries."""

    max_ledger_size_bytes: int = 512 * 1024 * 1024
    """A ledger is rolled over once its payloads reach this many bytes."""

    max_ledger_age_ms: int = 4 * 3600 * 1000
    """A ledger with entries is rolled over once it is this old."""

    min_ledger_age_ms: int = 10_000
    """No roll by entries, size or age before a ledger is this old (failures still roll)."""

    retention_time_ms: int = 0
    """Consumed ledgers are deleted once their last entry is older than this (-1: never by age)."""

    retention_size_bytes: int = 0
    """Consumed ledgers are deleted, oldest first, while they add up to more (-1: never by size)."""

    cursor_persist_interval_ms: int = 1000
    """A cursor's acknowledgements are written at most this often (and on flush and close);
    acks a client waits a receipt for are written at once."""

    max_inline_ack_ranges: int = 10_000
    """Acknowledgement holes a subscription may have before it stops dispatching new entries
    until acknowledgements fill some (every range is always persisted; this keeps the cursor's
    record small)."""

    max_persisted_redelivery_counts: int = 10_000
    """Redelivery counts a cursor keeps and persists (entries taken back from consumers and
    not acknowledged yet); beyond it the longest-kept count is dropped and reported."""

    trim_interval_ms: int = 5_000
    """How often the managed ledger checks for ledgers to trim and for an age rollover."""

    def __post_init__(self) -> None:
        quorums = {
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
        }
        for name, value in quorums.items():
            if value is not None and (not isinstance(value, int) or value < 1):
                raise config_error(name, value, "must be >= 1 (or none for the client default)")
        e, qw, qa = self.ensemble_size, self.write_quorum, self.ack_quorum
        if e is not None and qw is not None and qw > e:
            raise config_error("write_quorum", qw, f"must be <= ensemble_size ({e})")
        if qw is not None and qa is not None and qa > qw:
            raise config_error("ack_quorum", qa, f"must be <= write_quorum ({qw})")
        if e is not None and qa is not None and qa > e:
            raise config_error("ack_quorum", qa, f"must be <= ensemble_size ({e})")
        for name in (
            "max_entries_per_ledger",
            "max_ledger_size_bytes",
            "max_ledger_age_ms",
            "max_inline_ack_ranges",
            "max_persisted_redelivery_counts",
            "trim_interval_ms",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise config_error(name, value, "must be >= 1")
        for name in ("min_ledger_age_ms", "cursor_persist_interval_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise config_error(name, value, "must be >= 0")
        for name in ("retention_time_ms", "retention_size_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < -1:
                raise config_error(name, value, "must be >= 0, or -1 for no limit")
