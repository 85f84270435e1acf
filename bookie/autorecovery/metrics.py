"""Autorecovery's Prometheus metrics, read from the instance when scraped, in a registry of its own.

Every value is one the instance already keeps as it works (:class:`~bookie.autorecovery.worker.
Autorecovery`), so a scrape reads no metadata. The audit's figures (lost bookies,
under-replicated ledgers) are as of this instance's last audit, which only the active instance
runs: read them where ``magnetar_autorecovery_active`` is 1, e.g.
``magnetar_autorecovery_under_replicated_ledgers * magnetar_autorecovery_active``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from bookie.autorecovery.worker import Autorecovery

FAILURE_REASONS = ("no_replacement", "ledger_error")
"""Values of the ``reason`` label of ``magnetar_autorecovery_replication_failures_total``."""


class AutorecoveryCollector(Collector):
    def __init__(self, instance: Autorecovery) -> None:
        self.instance = instance

    def collect(self) -> Iterator[Metric]:
        instance = self.instance
        labels = ["autorecovery"]
        a = [instance.name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"magnetar_autorecovery_{name}", doc, labels=labels)
            family.add_metric(a, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(f"magnetar_autorecovery_{name}", doc, labels=labels)
            family.add_metric(a, value)
            return family

        yield gauge("active", "1 while this instance is the active one", instance.is_active)
        yield gauge(
            "lost_bookies",
            "Bookies counted as lost at this instance's last audit",
            instance.lost_bookie_count,
        )
        yield gauge(
            "under_replicated_ledgers",
            "Under-replicated ledgers listed at this instance's last audit, less those it"
            " has re-replicated since",
            instance.under_replicated_ledgers,
        )
        last_audit = instance.last_audit_at
        yield gauge(
            "last_audit_timestamp_seconds",
            "Unix time this instance last completed an audit (0: never)",
            last_audit if last_audit is not None else 0.0,
        )
        yield counter(
            "replicated_ledgers",
            "Ledgers this instance re-replicated (their record cleared)",
            instance.replicated_ledgers,
        )
        yield counter(
            "replicated_fragments",
            "Ledger fragments this instance copied to a replacement bookie",
            instance.replicated_fragments,
        )
        yield counter(
            "copied_entries",
            "Entries this instance copied to replacement bookies",
            instance.copied_entries,
        )
        failures = CounterMetricFamily(
            "magnetar_autorecovery_replication_failures",
            "Attempts to re-replicate a ledger that failed (retried at the next pass), by reason",
            labels=[*labels, "reason"],
        )
        for reason in FAILURE_REASONS:
            failures.add_metric([*a, reason], instance.replication_failures[reason])
        yield failures
        yield counter(
            "interruptions",
            "Times a lost metadata session or a metadata error cut this instance's work short",
            instance.interruptions,
        )


class AutorecoveryMetrics:
    """The registry ``magnetar autorecovery`` serves on /metrics."""

    def __init__(self, instance: Autorecovery) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(AutorecoveryCollector(instance))

    def render(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)
