"""Configuration of a metadata store connection (any backend)."""

from __future__ import annotations

from dataclasses import dataclass

from magnetar.common.errors import InvalidConfigError


@dataclass(frozen=True, kw_only=True)
class MetadataStoreConfig:
    """How to reach and use the metadata store."""

    url: str = "memory://"
    """Where metadata lives: etcd://h1:2379,h2:2379, embedded:///path/to/dir, or memory://."""

    request_timeout_ms: int = 5000
    """Deadline of one metadata request (etcd: per endpoint attempt)."""

    connect_timeout_ms: int = 5000
    """How long opening the store waits for an etcd endpoint to answer."""

    max_value_bytes: int = 1_048_576
    """Largest value accepted (etcd's own request limit is 1.5 MiB by default)."""

    max_txn_ops: int = 128
    """Most comparisons plus operations in one transaction (etcd's default --max-txn-ops)."""

    watch_history_events: int = 100_000
    """Embedded and memory stores: change events kept for watches that resume from a revision."""

    snapshot_after_log_bytes: int = 64 * 1024 * 1024
    """Embedded store: write a snapshot and start a new log once the log passes this size."""

    def __post_init__(self) -> None:
        positive = {
            "request_timeout_ms": self.request_timeout_ms,
            "connect_timeout_ms": self.connect_timeout_ms,
            "max_value_bytes": self.max_value_bytes,
            "max_txn_ops": self.max_txn_ops,
            "watch_history_events": self.watch_history_events,
            "snapshot_after_log_bytes": self.snapshot_after_log_bytes,
        }
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                raise InvalidConfigError(
                    f"metadata store setting {name} must be a positive integer, got {value!r}",
                    context={"field": name, "value": value},
                )
