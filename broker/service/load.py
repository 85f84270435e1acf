"""Load: how loaded each broker is, where an unowned partition goes, and what shedding moves.

Pure functions over load snapshots, no I/O, so the policy is tested directly. A broker's load
is its share of the cluster's partitions and of its message rate, weighted equally (a cluster
with no traffic is balanced by partition count alone). Shedding moves partitions from the most
to the least loaded broker while that narrows the spread of shares, so brokers that just joined
(share 0) take partitions at once: scale-out needs no data movement, only ownership changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PartitionLoadInfo:
    msg_rate: float = 0.0
    """Messages per second in and out."""
    acquired_ms: int = 0


@dataclass(frozen=True, slots=True)
class BrokerLoadInfo:
    broker_id: str
    partitions: Mapping[str, PartitionLoadInfo] = field(default_factory=dict)
    cpu_percent: float = 0.0


@dataclass(frozen=True, slots=True)
class Move:
    partition: str
    source: str
    target: str


def _weights(brokers: Iterable[BrokerLoadInfo]) -> dict[str, dict[str, float]]:
    """Each partition's share of the cluster's load, per broker."""
    listed = list(brokers)
    total_partitions = sum(len(b.partitions) for b in listed)
    total_rate = sum(p.msg_rate for b in listed for p in b.partitions.values())
    weights: dict[str, dict[str, float]] = {}
    for b in listed:
        weights[b.broker_id] = {}
        for name, p in b.partitions.items():
            by_count = 1 / total_partitions
            by_rate = p.msg_rate / total_rate if total_rate > 0 else by_count
            weights[b.broker_id][name] = 0.5 * by_count + 0.5 * by_rate
    return weights


def load_shares(brokers: Iterable[BrokerLoadInfo]) -> dict[str, float]:
    """Each broker's share of the cluster's load (the shares add up to 1, or are all 0)."""
    return {broker: sum(w.values()) for broker, w in _weights(brokers).items()}


def choose_least_loaded(
    brokers: Iterable[BrokerLoadInfo],
    *,
    exclude: Iterable[str] = (),
    extra: Mapping[str, int] | None = None,
) -> str | None:
    """The broker that should take a new partition; ties go to the fewest partitions, then id.

    ``extra`` counts partitions already promised to a broker in this decision round (a lookup of
    a topic with many partitions spreads them instead of sending all to one broker).
    """
    excluded = set(exclude)
    candidates = [b for b in brokers if b.broker_id not in excluded]
    if not candidates:
        return None
    extra = extra or {}
    shares = load_shares(candidates)
    total = sum(len(b.partitions) for b in candidates) + sum(extra.values())
    unit = 1 / max(1, total)

    def key(b: BrokerLoadInfo) -> tuple[float, int, str]:
        promised = extra.get(b.broker_id, 0)
        return (shares[b.broker_id] + promised * unit, len(b.partitions) + promised, b.broker_id)

    return min(candidates, key=key).broker_id


def plan_shedding(
    brokers: Iterable[BrokerLoadInfo],
    *,
    threshold: float,
    max_moves: int,
    min_ownership_ms: int,
    now_ms: int,
) -> list[Move]:
    """Moves that bring the spread of load shares under ``threshold`` (at most ``max_moves``)."""
    listed = list(brokers)
    if len(listed) < 2:
        return []
    weights = _weights(listed)
    acquired = {name: p.acquired_ms for b in listed for name, p in b.partitions.items()}
    moves: list[Move] = []
    while len(moves) < max_moves:
        shares = {b: sum(w.values()) for b, w in weights.items()}
        source = max(shares, key=lambda b: (shares[b], b))
        target = min(shares, key=lambda b: (shares[b], b))
        gap = shares[source] - shares[target]
        if gap <= threshold:
            break
        movable = [
            (name, w)
            for name, w in weights[source].items()
            if w < gap and now_ms - acquired.get(name, 0) >= min_ownership_ms
        ]
        if not movable:
            break
        # the move that best evens the two brokers out
        name, w = min(movable, key=lambda item: (abs(gap / 2 - item[1]), item[0]))
        del weights[source][name]
        weights[target][name] = w
        moves.append(Move(name, source, target))
    return moves
