"""The ledger client's Prometheus metrics, read from the client when scraped.

A process that uses a :class:`~bookie.client.ledger_client.LedgerClient` (a broker) registers
:class:`LedgerClientCollector` in its own registry, with the labels that name the process.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from bookie.client.ledger_client import LedgerClient


class LedgerClientCollector(Collector):
    """Recoveries, the ones that met a last-add-confirmed no replica backs, and under-striped
    ledgers (created on fewer bookies than their E, while fewer were writable)."""

    def __init__(self, client: LedgerClient, labels: Mapping[str, str]) -> None:
        self.client = client
        self.labels = dict(labels)

    def collect(self) -> Iterator[Metric]:
        names, values = list(self.labels), list(self.labels.values())
        recoveries = CounterMetricFamily(
            "magnetar_ledger_recoveries",
            "Ledgers this process recovered (fenced and closed after their writer stopped)",
            labels=names,
        )
        recoveries.add_metric(values, self.client.recoveries)
        yield recoveries
        unbacked = CounterMetricFamily(
            "magnetar_ledger_recovery_unbacked_lac",
            "Recoveries that met a last-add-confirmed whose entry no replica holds, and closed"
            " the ledger at what the replicas hold instead (see ledger_recovery_lac_unbacked)",
            labels=names,
        )
        unbacked.add_metric(values, self.client.unbacked_lac_recoveries)
        yield unbacked
        created = CounterMetricFamily(
            "magnetar_ledger_under_striped_created",
            "Ledgers created on fewer bookies than their intended E (fewer were writable; each"
            " entry still has Qw copies and Qa acknowledgements)",
            labels=names,
        )
        created.add_metric(values, self.client.under_striped_created)
        yield created
        open_now = GaugeMetricFamily(
            "magnetar_ledgers_under_striped",
            "Under-striped ledgers this process is writing now",
            labels=names,
        )
        open_now.add_metric(values, len(self.client.under_striped_open))
        yield open_now
