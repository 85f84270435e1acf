"""The settings of autorecovery (``magnetar autorecovery``, or the instance a bookie runs with
``--autorecovery``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bookie.client.config import LedgerClientConfig
from magnetar.common.config import config_error
from magnetar.common.security.config import HttpSettings
from metadata.config import EtcdSecuritySettings


@dataclass(frozen=True, kw_only=True)
class AutorecoveryConfig(HttpSettings, EtcdSecuritySettings):
    """When a bookie counts as lost, and how often autorecovery looks."""

    metadata: str = "memory://"
    """Metadata URL of the cluster (magnetar autorecovery --metadata)."""

    name: str = "autorecovery"
    """Name of this instance in the election (and in logs)."""

    http_port: int = 8001
    """HTTP port of /metrics and /health of `magnetar autorecovery` (0: any free port)."""

    bind_host: str = "0.0.0.0"  # noqa: S104 - a server listens on every interface by default
    """Address the HTTP server of `magnetar autorecovery` listens on."""

    lost_bookie_grace_s: float = 60.0
    """A bookie missing this long is lost, and its ledgers are re-replicated."""

    check_interval_s: float = 5.0
    """How often the active instance audits and replicates."""

    session_ttl_s: int = 10
    """TTL of the metadata session the active instance holds its election with."""

    ledger: LedgerClientConfig = field(default_factory=LedgerClientConfig)
    """How copies are read and written."""

    def __post_init__(self) -> None:
        self._check_etcd_security()
        self._check_http()
        if not 0 <= self.http_port <= 65535:
            raise config_error("http_port", self.http_port, "must be a port number from 0 to 65535")
        if self.lost_bookie_grace_s < 0:
            raise config_error("lost_bookie_grace_s", self.lost_bookie_grace_s, "must be >= 0")
        if self.check_interval_s <= 0:
            raise config_error("check_interval_s", self.check_interval_s, "must be > 0")
