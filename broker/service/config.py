"""Settings of a broker (flags ``--port``, ``--metadata``..., environment ``MAGNETAR_*``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from bookie.client.config import LedgerClientConfig
from bookie.client.write_handle import MAX_ENTRY_BYTES
from broker.managed_ledger import ManagedLedgerConfig
from magnetar.common.config import config_error
from magnetar.common.security.config import (
    AuthenticationSettings,
    ConnectionSettings,
    HttpSettings,
    TlsSettings,
)
from metadata.config import EtcdSecuritySettings, MetadataStoreConfig

BROKER_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
DEFAULT_PULSAR_PORT = 6660
"""Not Pulsar's 6650, which is Magnetar's gRPC port; a Pulsar tool that hard-codes 6650 is
pointed at a broker started with ``--pulsar-port 6650 --port <another>``."""
DEFAULT_PULSAR_TLS_PORT = 6661
"""Not Pulsar's 6651, which is Magnetar's gRPC TLS port, for the same reason: the Pulsar
listeners sit ten above the gRPC ones (6660 plaintext, 6661 TLS)."""
ENVELOPE_ALLOWANCE_BYTES = 16 * 1024
"""Room kept in an entry for the envelope the broker wraps around a producer's batch."""


@dataclass(frozen=True, kw_only=True)
class BrokerConfig(
    AuthenticationSettings, TlsSettings, HttpSettings, ConnectionSettings, EtcdSecuritySettings
):
    """One broker: how clients reach it, how it owns partitions, its limits, its security."""

    metadata: str
    """Metadata URL: etcd://h1:2379,h2:2379, embedded:///path, or memory://."""

    port: int | None = 6650
    """Plaintext gRPC port of the broker and admin services (0: any free port; empty: no
    plaintext listener, TLS only)."""

    tls_port: int = 6651
    """TLS gRPC port of the same services, open when tls_cert_file and tls_key_file are set (0:
    any free port)."""

    http_port: int = 8080
    """HTTP port for /metrics and /health (0: any free port)."""

    pulsar_port: int | None = DEFAULT_PULSAR_PORT
    """Port of the listener for Pulsar's binary protocol (pulsar://host:port), which Pulsar's
    own clients use unchanged (0: any free port; empty: no such listener). Plaintext: it stays
    closed while port is empty (TLS only)."""

    pulsar_tls_port: int | None = DEFAULT_PULSAR_TLS_PORT
    """Port of the TLS listener for Pulsar's binary protocol (pulsar+ssl://host:port), open
    when tls_cert_file and tls_key_file are set, with the same certificate, key and trusted CAs
    as the TLS gRPC port, reloaded when they change (0: any free port; empty: no such
    listener)."""

    bind_host: str = "0.0.0.0"  # noqa: S104 - a server listens on every interface by default
    """Address the servers listen on."""

    advertised_host: str | None = None
    """Host name or address clients use to reach this broker (default: this machine's name)."""

    broker_id: str | None = None
    """Identity in the cluster (default: '<advertised host>-<port>')."""

    session_ttl_s: int = 10
    """TTL of the metadata session that ownership is bound to: the partitions of a broker that
    is paused, cut off or gone with its host move after about this long (a crashed process on a
    live host is noticed sooner; see peer_probe_interval_ms)."""

    peer_probe_interval_ms: int = 250
    """How often the broker probes each other live broker's port (0: never). A connection
    refused twice in a row means that broker's process is gone: its session lease is revoked,
    so its partitions move within about a second instead of one session TTL. A probe that times
    out (a network cut, a vanished host) changes nothing."""

    allow_auto_topic_creation: bool = True
    """Create a topic on first lookup instead of refusing it as unknown."""

    auto_topic_partitions: int = 0
    """Partitions of an auto-created topic (0: non-partitioned)."""

    max_message_bytes: int = MAX_ENTRY_BYTES - ENVELOPE_ALLOWANCE_BYTES
    """Largest batch a producer may send, in bytes (one batch is stored as one entry)."""

    max_messages_per_batch: int = 100_000
    """Most messages one batch (one entry) may hold; a batch that declares or holds more is
    refused. Bounds what the broker does per entry (acks, redelivery, key_shared routing)."""

    max_name_chars: int = 256
    """Longest producer, consumer or subscription name, or property key, a client may send;
    a longer one is refused, its error naming the length and the limit (topic names have
    their own limit of 200 characters)."""

    max_properties_bytes: int = 64 * 1024
    """Most bytes of keys and values in the properties of one producer open or subscribe."""

    max_pending_bytes_per_partition: int = 64 * 1024 * 1024
    """Bytes of batches a partition may have in flight to the bookies; producers beyond it wait
    (back-pressure)."""

    deduplication_enabled: bool = True
    """Drop batches resent with a (producer name, sequence id) already stored."""

    dedup_snapshot_interval_entries: int = 1000
    """Entries between persisted snapshots of the producers' last sequence ids; a new owner
    replays at most this many entries to rebuild the rest."""

    dispatch_max_entries: int = 100
    """Entries one dispatch read takes from the managed ledger."""

    dispatch_max_bytes: int = 4 * 1024 * 1024
    """Bytes one delivery message carries at most (at least one entry)."""

    dispatch_max_replay_entries: int = 10_000
    """Entries a subscription may hold back for redelivery, for key order (key_shared) or until
    a consumer has permits, before it stops reading new ones."""

    dispatch_max_delayed_entries: int = 200_000
    """Shared and key_shared: entries a subscription holds aside until they are due (delayed
    delivery), in memory (about 300 bytes each), before it stops reading new ones until some
    are due (0: no limit). Their holes, persisted with the cursor, add to max_inline_ack_ranges:
    keep the sum within the metadata store's request limit."""

    dispatch_delayed_index_bucket_entries: int = 5_000
    """Shared and key_shared: entries held aside (delayed delivery) per bucket of the
    subscription's persisted delay index, written when full or after
    dispatch_delayed_index_seal_ms, so that a new owner of the partition loads them instead of
    reading them all again (0: no index; a new owner reads them again)."""

    dispatch_delayed_index_seal_ms: int = 5_000
    """A bucket of the delay index is written at the latest this long after its first entry was
    held aside: after a crash, a new owner reads again at most the entries held aside this long
    before it."""

    max_pending_publish_requests: int = 1_000
    """Batches of one producer stream the broker holds at once, being stored or stored with
    their receipt not yet taken by the client (Pulsar's maxPendingPublishRequestsPerConnection);
    past it the broker reads no more from the stream, so a producer that does not read its
    receipts is slowed, not buffered without bound."""

    max_consumer_buffer_bytes: int = 8 * 1024 * 1024
    """Bytes of deliveries the broker holds for one consumer stream that its client has not
    taken yet; past it that consumer gets nothing more until it reads, whatever its permits
    (at least one entry always goes out)."""

    max_unacked_messages_per_consumer: int = 50_000
    """Any subscription type: a consumer holding this many unacknowledged messages gets no
    more until it has acknowledged half of them (0: no limit). Readers are not counted."""

    max_unacked_messages_per_subscription: int = 200_000
    """Any subscription type: a subscription whose consumers hold this many unacknowledged
    messages dispatches no more until half of them are acknowledged (0: no limit)."""

    message_ttl_ms: int = 0
    """Messages older than this are acknowledged for every subscription (0: never); a topic's
    message_ttl_ms policy overrides it."""

    entry_cache_max_bytes: int = 128 * 1024 * 1024
    """Memory for recently written entries, shared by every partition (tailing reads)."""

    load_report_interval_ms: int = 5000
    """How often the broker publishes its load report."""

    load_shedding_enabled: bool = True
    """Let the elected leader move partitions off brokers above the load threshold."""

    load_shedding_interval_ms: int = 30_000
    """How often the leader looks for overloaded brokers."""

    load_shedding_threshold: float = 0.2
    """Spread of load shares (most loaded minus least loaded broker, 0..1) that starts
    shedding."""

    load_shedding_max_moves: int = 16
    """Partitions moved in one shedding round at most."""

    load_shedding_min_ownership_ms: int = 30_000
    """A partition is not moved again until it has been owned this long (no flapping)."""

    handover_hint_ttl_ms: int = 30_000
    """How long a partition handed over (shedding, shutdown) stays reserved for its chosen
    next owner."""

    unload_timeout_ms: int = 30_000
    """How long a graceful unload of one partition may take before it is forced."""

    shutdown_timeout_s: float = 60.0
    """How long SIGTERM waits for partitions to be handed over before exiting anyway."""

    managed_ledger: ManagedLedgerConfig = field(default_factory=ManagedLedgerConfig)
    """How partitions are stored: ledger rollover, retention, cursors."""

    ledger: LedgerClientConfig = field(default_factory=LedgerClientConfig)
    """How ledgers are placed, written and read."""

    authorization_enabled: bool = False
    """Check every call against tenant admins, namespace permissions and superusers (needs
    authentication_enabled)."""

    broker_client_trust_certs_file: Path | None = None
    """CA certificates that sign other brokers' certificates, for the admin calls a broker
    forwards to a partition's owner over TLS (default: tls_trust_certs_file, else the system's)."""

    broker_client_auth_token_file: Path | None = None
    """Token this broker presents when it forwards admin calls to other brokers (its role must be
    a superuser). Read again at each call, so it can be rotated in place."""

    def _check_port_clash(self) -> None:
        """Two listeners asking for the same fixed port: refused here, naming both, rather
        than as "address in use" when the second binds."""
        ports = {"port": self.port, "http_port": self.http_port, "pulsar_port": self.pulsar_port}
        if self.tls_enabled:
            ports["tls_port"] = self.tls_port
            ports["pulsar_tls_port"] = self.pulsar_tls_port
        taken: dict[int, str] = {}
        for name, value in ports.items():
            if not value:
                continue  # empty (no listener) or 0 (any free port)
            if value in taken:
                raise config_error(
                    name, value, f"is also {taken[value]}'s port: give each listener its own"
                )
            taken[value] = name

    def metadata_config(self) -> MetadataStoreConfig:
        """How this broker opens the metadata store: the URL and etcd's credentials."""
        return self.store_config(self.metadata)

    def __post_init__(self) -> None:
        for name in ("port", "http_port", "tls_port", "pulsar_port", "pulsar_tls_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise config_error(name, value, "must be a port number from 0 to 65535")
        self._check_port_clash()
        self._check_tls()
        self._check_authentication()
        self._check_etcd_security()
        self._check_http()
        self._check_connections()
        if self.port is None and not self.tls_enabled:
            raise config_error(
                "port", "", "may be empty (no plaintext listener) only with TLS on (tls_cert_file)"
            )
        if self.authorization_enabled and not self.authentication_enabled:
            raise config_error(
                "authorization_enabled",
                self.authorization_enabled,
                "needs authentication_enabled (authorization decides by the authenticated role)",
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
        if self.broker_id is not None and not BROKER_ID_PATTERN.fullmatch(self.broker_id):
            raise config_error(
                "broker_id",
                self.broker_id,
                "must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
            )
        if self.session_ttl_s < 2:
            raise config_error("session_ttl_s", self.session_ttl_s, "must be at least 2")
        if self.peer_probe_interval_ms != 0 and not 10 <= self.peer_probe_interval_ms <= 60_000:
            raise config_error(
                "peer_probe_interval_ms",
                self.peer_probe_interval_ms,
                "must be 0 (no probes) or from 10 to 60,000",
            )
        if self.auto_topic_partitions < 0:
            raise config_error("auto_topic_partitions", self.auto_topic_partitions, "must be >= 0")
        limit = MAX_ENTRY_BYTES - ENVELOPE_ALLOWANCE_BYTES
        if not 1 <= self.max_message_bytes <= limit:
            raise config_error(
                "max_message_bytes", self.max_message_bytes, f"must be from 1 to {limit:,}"
            )
        if self.max_pending_bytes_per_partition < self.max_message_bytes:
            raise config_error(
                "max_pending_bytes_per_partition",
                self.max_pending_bytes_per_partition,
                f"must be at least max_message_bytes ({self.max_message_bytes:,})",
            )
        for name in (
            "dedup_snapshot_interval_entries",
            "dispatch_max_entries",
            "dispatch_max_bytes",
            "max_messages_per_batch",
            "max_name_chars",
            "max_properties_bytes",
            "entry_cache_max_bytes",
            "max_pending_publish_requests",
            "max_consumer_buffer_bytes",
            "load_report_interval_ms",
            "load_shedding_interval_ms",
            "load_shedding_max_moves",
            "unload_timeout_ms",
        ):
            if getattr(self, name) < 1:
                raise config_error(name, getattr(self, name), "must be >= 1")
        for name in (
            "load_shedding_min_ownership_ms",
            "handover_hint_ttl_ms",
            "dispatch_max_replay_entries",
            "dispatch_max_delayed_entries",
            "dispatch_delayed_index_bucket_entries",
            "dispatch_delayed_index_seal_ms",
            "max_unacked_messages_per_consumer",
            "max_unacked_messages_per_subscription",
            "message_ttl_ms",
        ):
            if getattr(self, name) < 0:
                raise config_error(name, getattr(self, name), "must be >= 0")
        if not 0 < self.load_shedding_threshold < 1:
            raise config_error(
                "load_shedding_threshold", self.load_shedding_threshold, "must be between 0 and 1"
            )
        if self.shutdown_timeout_s <= 0:
            raise config_error("shutdown_timeout_s", self.shutdown_timeout_s, "must be > 0")
