"""Configuration of a metadata store connection (any backend)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from magnetar.common.errors import InvalidConfigError


@dataclass(frozen=True, kw_only=True)
class EtcdSecuritySettings:
    """How a process proves itself to etcd: TLS (client certificates) and etcd's own users."""

    etcd_trust_certs_file: Path | None = None
    """CA certificates that sign etcd's certificates: set it (or etcd_cert_file) when etcd
    serves TLS (https client URLs)."""

    etcd_cert_file: Path | None = None
    """Client certificate (PEM) presented to etcd (etcd --client-cert-auth)."""

    etcd_key_file: Path | None = None
    """Private key (PEM) of etcd_cert_file."""

    etcd_user: str | None = None
    """etcd user to authenticate as (etcd auth enabled), with etcd_password_file."""

    etcd_password_file: Path | None = None
    """File holding etcd_user's password (never given on the command line)."""

    @property
    def etcd_tls_enabled(self) -> bool:
        return self.etcd_trust_certs_file is not None or self.etcd_cert_file is not None

    def store_config(self, url: str) -> MetadataStoreConfig:
        """How to open the store at ``url`` with these credentials (a server's config to the
        metadata store's)."""
        return MetadataStoreConfig(
            url=url,
            etcd_trust_certs_file=self.etcd_trust_certs_file,
            etcd_cert_file=self.etcd_cert_file,
            etcd_key_file=self.etcd_key_file,
            etcd_user=self.etcd_user,
            etcd_password_file=self.etcd_password_file,
        )

    def _check_etcd_security(self) -> None:
        if (self.etcd_cert_file is None) != (self.etcd_key_file is None):
            raise InvalidConfigError(
                "etcd_key_file must be set together with etcd_cert_file",
                context={"field": "etcd_key_file"},
            )
        if (self.etcd_user is None) != (self.etcd_password_file is None):
            raise InvalidConfigError(
                "etcd_password_file must be set together with etcd_user",
                context={"field": "etcd_password_file"},
            )

    def __post_init__(self) -> None:
        self._check_etcd_security()


@dataclass(frozen=True, kw_only=True)
class MetadataStoreConfig(EtcdSecuritySettings):
    """How to reach and use the metadata store."""

    url: str = "memory://"
    """Where metadata lives: etcd://h1:2379,h2:2379, embedded:///path/to/dir, or memory://."""

    request_timeout_ms: int = 5000
    """Deadline of one metadata request (etcd: per endpoint attempt)."""

    connect_timeout_ms: int = 15000
    """How long opening the store waits for an etcd endpoint to answer (etcd still starting,
    a busy machine); a refusal that waiting cannot cure (a bad password or certificate) fails
    at once."""

    max_value_bytes: int = 1_048_576
    """Largest value accepted (etcd's own request limit is 1.5 MiB by default)."""

    max_txn_ops: int = 128
    """Most comparisons plus operations in one transaction (etcd's default --max-txn-ops)."""

    watch_history_events: int = 100_000
    """Embedded and memory stores: change events kept for watches that resume from a revision."""

    snapshot_after_log_bytes: int = 64 * 1024 * 1024
    """Embedded store: write a snapshot and start a new log once the log passes this size."""

    def __post_init__(self) -> None:
        self._check_etcd_security()
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
