"""Settings of a bookie (flags ``--data-dir``, ``--port``..., environment ``MAGNETAR_*``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from bookie.storage.config import StorageConfig
from magnetar.common.config import config_error
from magnetar.common.security.config import (
    AuthenticationSettings,
    ConnectionSettings,
    HttpSettings,
    TlsSettings,
)
from metadata.config import EtcdSecuritySettings, MetadataStoreConfig

BOOKIE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


@dataclass(frozen=True, kw_only=True)
class BookieConfig(
    AuthenticationSettings, TlsSettings, HttpSettings, ConnectionSettings, EtcdSecuritySettings
):
    """One bookie: where its data is, how to reach it, when it turns read-only, who may use it.

    With tls_cert_file set the bookie's gRPC port is TLS (with tls_trust_certs_file, mutual TLS:
    every client presents a certificate, and the 'tls' provider takes its common name as the
    role)."""

    data_dir: Path
    """Directory of this bookie's data: segments, index and identity file."""

    metadata: str
    """Metadata URL: etcd://h1:2379,h2:2379, embedded:///path, or memory://."""

    port: int = 3181
    """gRPC port of the bookie service (0: any free port)."""

    http_port: int = 8000
    """HTTP port for /metrics and /health (0: any free port)."""

    data_port: int = 3182
    """Port of the framed data protocol that ledger clients add, read and fence through (0: any
    free port); same TLS and roles as the gRPC port."""

    max_data_frame_bytes: int = 16 * 1024 * 1024
    """Largest frame the data port accepts; a longer one closes that connection. At least
    storage.max_entry_bytes plus 64 KiB, so any entry the bookie stores fits in a frame."""

    bind_host: str = "0.0.0.0"  # noqa: S104 - a server listens on every interface by default
    """Address the servers listen on."""

    advertised_host: str | None = None
    """Host name or address others use to reach this bookie (default: this machine's name)."""

    bookie_id: str | None = None
    """Stable identity; generated at first start and kept in the data directory if not given."""

    zone: str | None = None
    """Placement label: replicas of a ledger go to different zones when enough exist."""

    readonly_disk_usage: float = 0.95
    """Disk usage (fraction) at which the bookie turns read-only."""

    writable_disk_usage: float = 0.90
    """Disk usage (fraction) below which a read-only bookie turns writable again."""

    disk_check_interval_s: float = 1.0
    """How often disk usage is checked."""

    registration_refresh_s: float = 10.0
    """How often the bookie refreshes its registration (disk figures, state)."""

    session_ttl_s: int = 10
    """TTL of the metadata session its registration is bound to."""

    autorecovery: bool = False
    """Also run an autorecovery instance in this bookie (one in the cluster is active at a time)."""

    max_inflight_bytes_per_stream: int = 64 * 1024 * 1024
    """Entry bytes one add stream (or data connection) may have in flight; the client waits
    beyond it."""

    storage: StorageConfig = field(default_factory=StorageConfig)
    """How entries are written, indexed and compacted."""

    bookie_client_roles: tuple[str, ...] = ()
    """Roles that may add, read, fence and delete ledgers here (with authentication on): the
    brokers' and autorecovery's, besides superuser_roles."""

    def metadata_config(self) -> MetadataStoreConfig:
        """How this bookie opens the metadata store: the URL and etcd's credentials."""
        return self.store_config(self.metadata)

    def __post_init__(self) -> None:
        self._check_tls()
        self._check_authentication()
        self._check_etcd_security()
        self._check_http()
        self._check_connections()
        for name in ("port", "http_port", "data_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise config_error(name, value, "must be a port number from 0 to 65535")
        if (
            self.authentication_enabled
            and not self.bookie_client_roles
            and not self.superuser_roles
        ):
            raise config_error(
                "bookie_client_roles",
                "",
                "must name the brokers' and autorecovery's roles when authentication is on"
                " (or superuser_roles must): otherwise no one could use this bookie",
            )
        if (
            self.authentication_enabled
            and "tls" in self.authentication_providers
            and self.tls_trust_certs_file is None
        ):
            raise config_error(
                "authentication_providers",
                ",".join(self.authentication_providers),
                "includes tls, which needs tls_trust_certs_file (the CA of client certificates)",
            )
        if self.bookie_id is not None and not BOOKIE_ID_PATTERN.fullmatch(self.bookie_id):
            raise config_error(
                "bookie_id",
                self.bookie_id,
                "must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
            )
        if not 0 < self.writable_disk_usage < self.readonly_disk_usage <= 1:
            raise config_error(
                "writable_disk_usage",
                self.writable_disk_usage,
                f"must be above 0 and below readonly_disk_usage ({self.readonly_disk_usage}),"
                " which must be at most 1",
            )
        if self.disk_check_interval_s <= 0:
            raise config_error("disk_check_interval_s", self.disk_check_interval_s, "must be > 0")
        if self.registration_refresh_s <= 0:
            raise config_error("registration_refresh_s", self.registration_refresh_s, "must be > 0")
        if self.session_ttl_s < 2:
            raise config_error("session_ttl_s", self.session_ttl_s, "must be at least 2")
        if self.data_port and self.data_port in (self.port, self.http_port):
            raise config_error("data_port", self.data_port, "must differ from port and http_port")
        if self.max_data_frame_bytes < self.storage.max_entry_bytes + 64 * 1024:
            raise config_error(
                "max_data_frame_bytes",
                self.max_data_frame_bytes,
                f"must be at least storage.max_entry_bytes ({self.storage.max_entry_bytes})"
                " plus 64 KiB, or the largest entries could not be sent",
            )
        if self.max_data_frame_bytes > 2**32 - 1:
            raise config_error(
                "max_data_frame_bytes", self.max_data_frame_bytes, "must fit in 32 bits"
            )
        if self.max_inflight_bytes_per_stream < self.storage.max_entry_bytes:
            raise config_error(
                "max_inflight_bytes_per_stream",
                self.max_inflight_bytes_per_stream,
                f"must be at least storage.max_entry_bytes ({self.storage.max_entry_bytes})",
            )
