"""A bookie's Prometheus metrics, in a registry of its own (standalone runs several bookies).

Rates (adds/s, bytes/s) are Prometheus counters, read with ``rate()``. The journal keeps its
fdatasync latencies and group sizes in plain lists, and these are drained into histograms when
metrics are scraped, so the write path never takes a metrics lock per entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from bookie.service.access import BookieAccess
    from bookie.storage.engine import StorageEngine

_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
_SIZE_BUCKETS = tuple(float(1 << n) for n in range(8, 26, 2))  # 256 B .. 16 MiB


class DataPortStats(Protocol):
    """What the data port's server counts (``bookie.framed.server.FramedBookieServer``)."""

    @property
    def connections(self) -> int: ...

    accepted: int
    refused: int
    protocol_errors: int


class _DataPortCollector(Collector):
    """The data port's connections, read from its server when scraped."""

    def __init__(self, bookie_id: str, metrics: BookieMetrics) -> None:
        self.bookie_id = bookie_id
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        server = self.metrics.data_port
        if server is None:
            return
        labels = ["bookie"]
        open_now = GaugeMetricFamily(
            "magnetar_bookie_data_connections", "Data protocol connections held now", labels=labels
        )
        open_now.add_metric([self.bookie_id], server.connections)
        yield open_now
        for name, text, value in (
            ("accepted", "Data protocol connections taken", server.accepted),
            (
                "refused",
                "Data protocol connections closed unread (max_connections held)",
                server.refused,
            ),
            (
                "protocol_errors",
                "Data protocol connections closed for breaking the framing or the protocol",
                server.protocol_errors,
            ),
        ):
            family = CounterMetricFamily(
                f"magnetar_bookie_data_connections_{name}", text, labels=labels
            )
            family.add_metric([self.bookie_id], value)
            yield family


class _RefusalCollector(Collector):
    """Refused callers, read from the bookie's access control when scraped."""

    def __init__(self, bookie_id: str, metrics: BookieMetrics) -> None:
        self.bookie_id = bookie_id
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            "magnetar_bookie_authentication_failures",
            "Calls refused for their credentials, by reason",
            labels=["bookie", "reason"],
        )
        denied = CounterMetricFamily(
            "magnetar_bookie_authorization_denied",
            "Calls of roles that may not use bookies, by operation",
            labels=["bookie", "operation"],
        )
        access = self.metrics.access
        if access is not None:
            for reason, count in sorted(access.authentication.failures.items()):
                failures.add_metric([self.bookie_id, reason], count)
            for operation, count in sorted(access.denials.items()):
                denied.add_metric([self.bookie_id, operation], count)
        yield failures
        yield denied


class BookieMetrics:
    """Counters, gauges and histograms of one bookie."""

    def __init__(self, bookie_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"bookie": bookie_id}
        r = self.registry
        self.adds = Counter(
            "magnetar_bookie_adds", "Entries stored.", ["bookie"], registry=r
        ).labels(**labels)
        self.add_bytes = Counter(
            "magnetar_bookie_add_bytes", "Entry payload bytes stored.", ["bookie"], registry=r
        ).labels(**labels)
        self.adds_refused = Counter(
            "magnetar_bookie_adds_refused",
            "Entries refused (fenced, read-only, checksum, size, last-add-confirmed, write-once).",
            ["bookie"],
            registry=r,
        ).labels(**labels)
        self.adds_conflicting = Counter(
            "magnetar_bookie_adds_conflicting",
            "Adds refused because the entry is stored with other bytes (entries are write-once).",
            ["bookie"],
            registry=r,
        ).labels(**labels)
        self.add_latency = Histogram(
            "magnetar_bookie_add_latency_seconds",
            "Time from accepting a group of adds to their fdatasync.",
            ["bookie"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.fdatasync_latency = Histogram(
            "magnetar_bookie_fdatasync_seconds",
            "Time of one group commit: write plus fdatasync.",
            ["bookie"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.group_bytes = Histogram(
            "magnetar_bookie_group_commit_bytes",
            "Bytes written by one group commit.",
            ["bookie"],
            buckets=_SIZE_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.reads = Counter(
            "magnetar_bookie_read_entries", "Entries read.", ["bookie"], registry=r
        ).labels(**labels)
        self.read_latency = Histogram(
            "magnetar_bookie_read_latency_seconds",
            "Time to serve one read request.",
            ["bookie"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.disk_total = Gauge(
            "magnetar_bookie_disk_total_bytes",
            "Size of the data file system.",
            ["bookie"],
            registry=r,
        ).labels(**labels)
        self.disk_free = Gauge(
            "magnetar_bookie_disk_free_bytes",
            "Free bytes on the data file system.",
            ["bookie"],
            registry=r,
        ).labels(**labels)
        self.disk_used_ratio = Gauge(
            "magnetar_bookie_disk_used_ratio",
            "Used fraction of the data file system.",
            ["bookie"],
            registry=r,
        ).labels(**labels)
        self.read_only = Gauge(
            "magnetar_bookie_read_only",
            "1 while the bookie is read-only.",
            ["bookie"],
            registry=r,
        ).labels(**labels)
        self.ledgers = Gauge(
            "magnetar_bookie_ledgers", "Ledgers stored.", ["bookie"], registry=r
        ).labels(**labels)
        self.data_bytes = Gauge(
            "magnetar_bookie_data_bytes",
            "Bytes of segment and index files.",
            ["bookie"],
            registry=r,
        ).labels(**labels)
        self.index_memory = Gauge(
            "magnetar_bookie_index_memory_bytes",
            "Memory the entry index accounts for (grows with entries stored, not with id range).",
            ["bookie"],
            registry=r,
        ).labels(**labels)
        self._storage: StorageEngine | None = None
        self.access: BookieAccess | None = None
        self.registry.register(_RefusalCollector(bookie_id, self))
        self.data_port: DataPortStats | None = None
        self.registry.register(_DataPortCollector(bookie_id, self))

    def bind_storage(self, storage: StorageEngine) -> None:
        self._storage = storage

    def bind_access(self, access: BookieAccess) -> None:
        self.access = access

    def bind_data_port(self, server: DataPortStats) -> None:
        self.data_port = server

    # --- updates from the service ---------------------------------------------------------

    def added(self, entries: int, payload_bytes: int, seconds: float) -> None:
        self.adds.inc(entries)
        self.add_bytes.inc(payload_bytes)
        self.add_latency.observe(seconds)

    def add_refused(self, entries: int) -> None:
        self.adds_refused.inc(entries)

    def add_conflicting(self, entries: int) -> None:
        self.adds_conflicting.inc(entries)

    def read(self, entries: int, seconds: float) -> None:
        self.reads.inc(entries)
        self.read_latency.observe(seconds)

    def set_disk(self, total: int, free: int) -> None:
        self.disk_total.set(total)
        self.disk_free.set(free)
        self.disk_used_ratio.set(1 - free / total if total else 0)

    def set_state(self, read_only: bool) -> None:
        self.read_only.set(1 if read_only else 0)

    # --- exposition -----------------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text format, after pulling what the storage engine collected."""
        storage = self._storage
        stats = storage.journal_stats if storage is not None else None
        if storage is not None and stats is not None:
            latencies, sizes = stats.drain()
            for seconds in latencies:
                self.fdatasync_latency.observe(seconds)
            for size in sizes:
                self.group_bytes.observe(size)
            self.ledgers.set(len(storage.index.ledgers))
            self.data_bytes.set(storage.disk_bytes())
            self.index_memory.set(storage.index.memory_bytes())
        return bytes(generate_latest(self.registry))
