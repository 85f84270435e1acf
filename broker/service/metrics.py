"""A broker's Prometheus metrics, read from its state when scraped (nothing on the hot path).

Per-partition counters carry a ``topic`` label; rates are for Prometheus' ``rate()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bookie.client.metrics import LedgerClientCollector

if TYPE_CHECKING:
    from broker.service.broker import Broker


class BrokerCollector(Collector):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        labels = ["broker"]
        b = [broker.broker_id]
        owned = GaugeMetricFamily(
            "magnetar_broker_owned_partitions", "Partitions this broker owns", labels=labels
        )
        owned.add_metric(b, len(broker.topics.topics))
        yield owned
        leader = GaugeMetricFamily(
            "magnetar_broker_load_manager_leader",
            "1 while this broker leads load shedding",
            labels=labels,
        )
        leader.add_metric(b, 1.0 if broker.load_manager.is_leader else 0.0)
        yield leader
        lost = CounterMetricFamily(
            "magnetar_broker_sessions_lost", "Metadata sessions this broker lost", labels=labels
        )
        lost.add_metric(b, broker.sessions_lost)
        yield lost
        revoked = CounterMetricFamily(
            "magnetar_broker_peer_leases_revoked",
            "Sessions of other brokers this broker ended because their process was found dead",
            labels=labels,
        )
        revoked.add_metric(b, broker.peer_leases_revoked)
        yield revoked
        watched = GaugeMetricFamily(
            "magnetar_broker_peers_watched",
            "Other brokers seen listening, whose process dying this broker would notice",
            labels=labels,
        )
        watched.add_metric(b, broker.peers_watched)
        yield watched
        security = broker.security
        failures = CounterMetricFamily(
            "magnetar_broker_authentication_failures",
            "Calls and streams refused for their credentials, by reason",
            labels=["broker", "reason"],
        )
        for reason, count in sorted(security.authentication.failures.items()):
            failures.add_metric([broker.broker_id, reason], count)
        yield failures
        denied = CounterMetricFamily(
            "magnetar_broker_authorization_denied",
            "Calls and streams refused by authorization, by what they needed",
            labels=["broker", "action"],
        )
        for action, count in sorted(security.authorization.denials.items()):
            denied.add_metric([broker.broker_id, action], count)
        yield denied
        cache = GaugeMetricFamily(
            "magnetar_broker_entry_cache_bytes", "Bytes in the entry cache", labels=labels
        )
        cache.add_metric(b, broker.cache.size_bytes)
        yield cache
        stalled = GaugeMetricFamily(
            "magnetar_broker_partitions_cannot_write",
            "Owned partitions whose entries wait on a write problem (e.g. fewer writable"
            " bookies than Qw); topic stats name it",
            labels=labels,
        )
        stalled.add_metric(
            b, sum(1 for t in list(broker.topics.topics.values()) if t.ml.write_problem)
        )
        yield stalled
        t_labels = ["broker", "topic"]
        msgs_in = CounterMetricFamily(
            "magnetar_topic_messages_in", "Messages stored", labels=t_labels
        )
        bytes_in = CounterMetricFamily(
            "magnetar_topic_bytes_in", "Batch bytes stored", labels=t_labels
        )
        msgs_out = CounterMetricFamily(
            "magnetar_topic_messages_out", "Messages dispatched", labels=t_labels
        )
        bytes_out = CounterMetricFamily(
            "magnetar_topic_bytes_out", "Entry bytes dispatched", labels=t_labels
        )
        pending = GaugeMetricFamily(
            "magnetar_topic_pending_bytes", "Batch bytes in flight to bookies", labels=t_labels
        )
        storage = GaugeMetricFamily(
            "magnetar_topic_storage_bytes", "Bytes stored in the topic's ledgers", labels=t_labels
        )
        producers = GaugeMetricFamily(
            "magnetar_topic_producers", "Connected producers", labels=t_labels
        )
        consumers = GaugeMetricFamily(
            "magnetar_topic_consumers", "Connected consumers", labels=t_labels
        )
        delayed = GaugeMetricFamily(
            "magnetar_topic_delayed_entries",
            "Entries its subscriptions hold aside until their delivery time",
            labels=t_labels,
        )
        counts_dropped = CounterMetricFamily(
            "magnetar_topic_redelivery_counts_dropped",
            "Redelivery counts its cursors dropped at max_persisted_redelivery_counts",
            labels=t_labels,
        )
        for name, topic in list(broker.topics.topics.items()):
            tl = [broker.broker_id, name]
            delayed.add_metric(
                tl, sum(len(s.dispatcher.delayed) for s in topic.subscriptions.values())
            )
            counts_dropped.add_metric(
                tl, sum(c.redelivery_counts.dropped for c in topic.ml.cursors.values())
            )
            msgs_in.add_metric(tl, topic.msgs_in)
            bytes_in.add_metric(tl, topic.bytes_in)
            msgs_out.add_metric(tl, topic.msgs_out)
            bytes_out.add_metric(tl, topic.bytes_out)
            pending.add_metric(tl, topic.pending_bytes)
            storage.add_metric(tl, topic.ml.storage_size_bytes)
            producers.add_metric(tl, len(topic.producers))
            consumers.add_metric(tl, sum(len(s.consumers) for s in topic.subscriptions.values()))
        yield from (msgs_in, bytes_in, msgs_out, bytes_out, pending, storage, producers, consumers)
        yield from (delayed, counts_dropped)


class BrokerMetrics:
    def __init__(self, broker: Broker) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(broker))
        self.registry.register(
            LedgerClientCollector(broker.ledger_client, {"broker": broker.broker_id})
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
