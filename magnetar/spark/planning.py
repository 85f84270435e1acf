"""Offset arithmetic for the connector: splitting ranges and sharing a read limit. Plain Python."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["OffsetRange", "share_limit", "split_ranges"]


@dataclass(frozen=True)
class OffsetRange:
    """Messages ``[start, end)`` of one partition: what one Spark task reads."""

    topic: str
    """The topic's full name (``tenant/namespace/topic``)."""
    partition: int
    """The partition's number; -1 for a topic without partitions."""
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def partition_topic(self) -> str:
        """The name a client reads this partition by."""
        return self.topic if self.partition < 0 else f"{self.topic}-partition-{self.partition}"


def split_ranges(ranges: Sequence[OffsetRange], min_partitions: int) -> list[OffsetRange]:
    """Every non-empty range as one task, and more (as Kafka's source does) when that makes
    fewer than ``min_partitions`` tasks: each range is cut into pieces in proportion to its
    size, so that every piece is about as large."""
    nonempty = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in nonempty)
    if not nonempty or len(nonempty) >= min_partitions:
        return nonempty
    result: list[OffsetRange] = []
    for r in nonempty:
        pieces = max(1, min(r.size, round(min_partitions * r.size / total)))
        step, extra = divmod(r.size, pieces)
        start = r.start
        for i in range(pieces):
            end = start + step + (1 if i < extra else 0)
            result.append(OffsetRange(r.topic, r.partition, start, end))
            start = end
    return result


def share_limit(backlogs: Mapping[str, int], limit: int) -> dict[str, int]:
    """How many of ``limit`` messages each partition may give, in proportion to its backlog
    (largest remainders first, never more than the backlog): a partition far behind catches up
    faster, and none is starved. The shares add up to ``min(limit, total backlog)``."""
    total = sum(max(0, b) for b in backlogs.values())
    if total <= limit:
        return {key: max(0, b) for key, b in backlogs.items()}
    shares: dict[str, int] = {}
    remainders: list[tuple[float, str]] = []
    for key, backlog in backlogs.items():
        exact = limit * max(0, backlog) / total
        shares[key] = int(exact)
        remainders.append((exact - int(exact), key))
    left = limit - sum(shares.values())
    for _, key in sorted(remainders, key=lambda item: (-item[0], item[1])):
        if left <= 0:
            break
        if shares[key] < backlogs[key]:
            shares[key] += 1
            left -= 1
    return shares
