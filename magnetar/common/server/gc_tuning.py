"""Garbage-collector settings for processes that move many small objects: perf, servers.

CPython's cyclic collector runs a young-generation pass every 700 net allocations of tracked
objects, and an older one every 10 of those. A consumer that turns each 1,000-message entry into
1,000 ``Message`` objects (and holds thousands in its queue) triggers it constantly, and the
older passes walk everything it holds: measured with ``magnetar perf consume`` draining 3
million 100 B messages on our 2-core machine, 580-780k msg/s with the defaults, 1.16-1.24M with
the collector off, and 0.97-1.08M with the thresholds below. Reference counting frees almost
everything anyway; the cyclic collector only has cycles to find.

The servers gain too: with ``magnetar standalone`` tuned, end-to-end p50 at 2,000 msg/s went
from 9.0-10.5 ms to 6.8-7.0 ms and max-rate produce from 567-642k to 606-674k msg/s (two
alternating runs each, same machine). A library must not change its host's collector, so the
client never calls this: processes we own do (``magnetar perf``, ``bookie``, ``broker``,
``standalone``), and docs/client.md tells applications how.

The price: with these thresholds the full pass almost never runs, so whatever long-lived objects
end up in a reference cycle stay in memory. A deleted topic did (its topic, managed ledger,
write handle and deduplication table: +42 MiB kept per 100,000 one-message entries in
bench/memory_bench.py), until closing let go of what pointed back (ended tasks, whose traceback
holds their owner; subscriptions, cursors, outboxes). Server objects that end while the process
lives must be freed by reference counting alone; tests/broker/test_topic_memory.py checks it
for topics with the collector off.
"""

from __future__ import annotations

import gc

__all__ = ["THRESHOLDS", "tune_gc_for_throughput"]

THRESHOLDS = (50_000, 50, 100)
"""Young-generation allocations between passes, and the passes between older ones."""


def tune_gc_for_throughput() -> None:
    """Collect once, move everything alive now (imports, configuration) out of the collector's
    sight for good (``gc.freeze``), and make passes rarer (:data:`THRESHOLDS`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
