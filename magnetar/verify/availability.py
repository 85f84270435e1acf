"""Availability: each partition's outages, how soon it recovers once faults heal, and the bound.

It reads a :class:`~magnetar.verify.history.History` and nothing else (no I/O), so a saved
history can be judged again. Definitions (docs/verify.md, "Availability"):

- A partition's **acknowledgements** are the ``answered_at`` times of its acknowledged sends.
  A send's partition is the one its key's acknowledged sends went to (the key picks the
  partition), so failed and unanswered sends count as sends to it too.
- An **outage** of a partition is a stretch of more than ``gap_s`` without an acknowledgement
  *while the workload sends to it*: it begins at the first send to the partition after its
  previous acknowledgement (or after the workload began) and ends at its next acknowledgement.
  A producer that sent nothing to the partition (blocked by another partition's backlog, or
  stopped for the drain) does not make an outage. One still open when the producers stopped
  (``producers_stopped``) ends there *unrecovered*.
- A fault **could explain** an outage when it began before the outage ended and healed no
  earlier than the outage began. A fault never healed by its own step is taken as healed when
  the nemesis healed everything (``healed``). The checker does not know which broker owned
  which partition when, so every overlapping fault counts, whatever its target.
- An outage's **lateness** is its longest stretch not covered by a fault that could explain
  it (each covering from its start to its heal): how long the partition stayed out after the
  faults active so far had healed, before it recovered or another fault began. An outage no
  fault explains is late by its whole length. A lateness above ``bound_s`` fails the run, an
  unrecovered outage's included.
- For each fault F and each partition in an outage F could explain (the last one, if F
  could explain several): **after start** is the time from F's start to the partition's
  first acknowledgement ending that outage, **after heal** the time from F's heal to it (0
  when the partition recovered while F was still on). Both are None when it never recovered
  before the producers stopped. A later fault that prolongs the outage lengthens both: they
  say how long each fault's partitions stayed out, the lateness says whether that was
  justified.
- Distributions are nearest-rank percentiles (p50, p99) and the maximum over every (fault,
  affected partition) pair of a kind, unrecovered pairs counted as infinitely long.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from magnetar.verify.history import Fault, History

DEFAULT_RECOVERY_BOUND_S = 5.0
"""Issue 24's target: every partition acknowledges a send within 5 s once all faults heal."""
DEFAULT_GAP_S = 1.0


@dataclass(frozen=True)
class Outage:
    """A stretch of time the workload sent to a partition and it acknowledged nothing."""

    partition: int
    start: float
    end: float
    """Its next acknowledgement, or when the producers stopped if ``recovered`` is False."""
    recovered: bool
    faults: tuple[int, ...]
    """Indexes of the faults that could explain it."""
    last_heal: float | None
    """When the last of those faults healed (None: no fault explains it)."""
    late_from: float
    late_to: float
    """Its longest stretch no explaining fault covers (its lateness)."""

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @property
    def lateness_s(self) -> float:
        return self.late_to - self.late_from


@dataclass(frozen=True)
class PartitionRecovery:
    """One partition in an outage one fault could explain."""

    fault: int
    partition: int
    after_start_s: float | None
    after_heal_s: float | None


@dataclass(frozen=True)
class Distribution:
    """p50, p99 and max of some durations (``inf``: one never ended)."""

    count: int
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: list[float | None]) -> Distribution:
        ordered = sorted(math.inf if v is None else v for v in values)
        if not ordered:
            return cls(0, math.nan, math.nan, math.nan)
        return cls(len(ordered), _rank(ordered, 50), _rank(ordered, 99), ordered[-1])

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "p50_s": _json_float(self.p50),
            "p99_s": _json_float(self.p99),
            "max_s": _json_float(self.max),
        }


@dataclass
class Availability:
    """What :func:`measure` found."""

    bound_s: float
    gap_s: float
    outages: list[Outage] = field(default_factory=list)
    recoveries: list[PartitionRecovery] = field(default_factory=list)
    faults: dict[int, Fault] = field(default_factory=dict)
    """The injected faults, by index."""
    heals: dict[int, float] = field(default_factory=dict)
    """When each injected fault healed (its own heal, else the nemesis' final one)."""

    @property
    def late(self) -> list[Outage]:
        """Outages that outlasted their explaining faults by more than the bound."""
        return [o for o in self.outages if o.lateness_s > self.bound_s]

    def by_kind(self) -> dict[str, dict[str, Distribution]]:
        """Per fault kind: the distributions of ``after_start`` and ``after_heal``."""
        starts: dict[str, list[float | None]] = defaultdict(list)
        heals: dict[str, list[float | None]] = defaultdict(list)
        for recovery in self.recoveries:
            kind = self.faults[recovery.fault].kind
            starts[kind].append(recovery.after_start_s)
            heals[kind].append(recovery.after_heal_s)
        return {
            kind: {
                "after_start": Distribution.of(starts[kind]),
                "after_heal": Distribution.of(heals[kind]),
            }
            for kind in sorted(starts)
        }

    def lateness(self) -> Distribution:
        """Of every outage's lateness: what the recovery bound judges."""
        return Distribution.of([o.lateness_s for o in self.outages])

    def overall(self) -> dict[str, Distribution]:
        return {
            "after_start": Distribution.of([r.after_start_s for r in self.recoveries]),
            "after_heal": Distribution.of([r.after_heal_s for r in self.recoveries]),
        }

    def describe(self, outage: Outage) -> str:
        """One line naming the partition, the outage and the faults, for a failure."""
        ending = f"{outage.end:.1f}s" if outage.recovered else "the end, never recovered"
        if not outage.faults:
            cause = "no fault explains it" + self._healed_before(outage.start)
        else:
            cause = "faults that could explain it: " + ", ".join(
                self._name(i) for i in outage.faults
            )
        stretch = (
            f"from {outage.late_from:.1f}s to {outage.late_to:.1f}s"
            if outage.faults
            else "for its whole length"
        )
        return (
            f"partition {outage.partition} acknowledged no send from {outage.start:.1f}s to"
            f" {ending} ({cause}); out {outage.lateness_s:.1f}s with none of them active,"
            f" {stretch}, over the {self.bound_s:g}s recovery bound"
        )

    def _healed_before(self, at: float) -> str:
        """The fault healed last before ``at``, for an outage none explains."""
        before = [i for i, heal in self.heals.items() if heal < at]
        if not before:
            return ""
        index = max(before, key=lambda i: self.heals[i])
        return (
            f"; the last fault before it, {self._name(index)}, healed"
            f" {at - self.heals[index]:.1f}s before it began"
        )

    def _name(self, index: int) -> str:
        fault = self.faults[index]
        return (
            f"#{index} {fault.kind}:{fault.target} {fault.started_at or 0.0:.1f}s"
            f"-{self.heals[index]:.1f}s"
        )

    def problems(self) -> list[str]:
        return [self.describe(o) for o in self.late]

    def to_json(self) -> dict[str, Any]:
        return {
            "bound_s": self.bound_s,
            "gap_s": self.gap_s,
            "late": len(self.late),
            "lateness": self.lateness().to_json(),
            "overall": {k: d.to_json() for k, d in self.overall().items()},
            "by_kind": {
                kind: {k: d.to_json() for k, d in dists.items()}
                for kind, dists in self.by_kind().items()
            },
            "outages": [
                {
                    "partition": o.partition,
                    "start": round(o.start, 3),
                    "end": round(o.end, 3),
                    "recovered": o.recovered,
                    "duration_s": round(o.duration_s, 3),
                    "faults": list(o.faults),
                    "last_heal": None if o.last_heal is None else round(o.last_heal, 3),
                    "late_from": round(o.late_from, 3),
                    "late_to": round(o.late_to, 3),
                    "lateness_s": round(o.lateness_s, 3),
                }
                for o in self.outages
            ],
            "recoveries": [
                {
                    "fault": r.fault,
                    "kind": self.faults[r.fault].kind,
                    "partition": r.partition,
                    "after_start_s": _json_float(r.after_start_s),
                    "after_heal_s": _json_float(r.after_heal_s),
                }
                for r in self.recoveries
            ],
        }


def measure(
    history: History,
    *,
    bound_s: float = DEFAULT_RECOVERY_BOUND_S,
    gap_s: float = DEFAULT_GAP_S,
) -> Availability:
    """Every partition's outages and every fault's recoveries (see the module docstring)."""
    if bound_s <= 0:
        raise ValueError(f"the recovery bound must be > 0 seconds, got {bound_s}")
    if gap_s <= 0:
        raise ValueError(f"the outage gap must be > 0 seconds, got {gap_s}")
    result = Availability(bound_s=bound_s, gap_s=gap_s)
    final_heal = history.phases.get("healed")
    for fault in history.faults:
        if fault.started_at is None:
            continue  # never injected
        result.faults[fault.index] = fault
        heal = fault.ended_at if fault.ended_at is not None else final_heal
        result.heals[fault.index] = heal if heal is not None else math.inf

    partition_of_key: dict[str, int] = {}
    acks: dict[int, list[float]] = defaultdict(list)
    for send in history.sends:
        if send.outcome == "acked" and send.answered_at is not None:
            acks[send.partition].append(send.answered_at)
            partition_of_key.setdefault(send.key, send.partition)
    sent: dict[int, list[float]] = defaultdict(list)
    for send in history.sends:
        partition = partition_of_key.get(send.key)
        if partition is not None:
            sent[partition].append(send.sent_at)
    begin = history.phases.get("workload", 0.0)
    stop = history.phases.get("producers_stopped")
    for partition in sorted(acks):
        times = sorted(acks[partition])
        sends = sorted(sent[partition])
        result.outages.extend(_outages(result, partition, times, sends, begin, stop, gap_s))
        result.recoveries.extend(_recoveries(result, partition))
    return result


def _outages(  # noqa: PLR0917 - a private helper of one loop
    result: Availability,
    partition: int,
    acks: list[float],
    sends: list[float],
    begin: float,
    stop: float | None,
    gap_s: float,
) -> list[Outage]:
    found: list[Outage] = []
    boundaries = [*acks, stop] if stop is not None else list(acks)
    previous = begin
    for index, stamp in enumerate(boundaries):
        recovered = index < len(acks)
        if stamp > previous + gap_s:
            first_send = bisect.bisect_left(sends, previous)
            if first_send < len(sends) and sends[first_send] < stamp:
                start = max(previous, sends[first_send])
                if stamp - start > gap_s:
                    found.append(_explained(result, partition, start, stamp, recovered=recovered))
        previous = max(previous, stamp)
    return found


def _explained(
    result: Availability, partition: int, start: float, end: float, *, recovered: bool
) -> Outage:
    explaining = tuple(
        index
        for index, fault in result.faults.items()
        if fault.started_at is not None and fault.started_at < end and result.heals[index] >= start
    )
    last_heal = max((result.heals[i] for i in explaining), default=None)
    covered = sorted((result.faults[i].started_at or start, result.heals[i]) for i in explaining)
    late_from, late_to = start, start
    cursor = start
    for began, healed in [*covered, (end, end)]:
        if began > cursor and began - cursor > late_to - late_from:
            late_from, late_to = cursor, min(began, end)
        cursor = max(cursor, healed)
        if cursor >= end:
            break
    return Outage(partition, start, end, recovered, explaining, last_heal, late_from, late_to)


def _recoveries(result: Availability, partition: int) -> list[PartitionRecovery]:
    outages = [o for o in result.outages if o.partition == partition]
    found: list[PartitionRecovery] = []
    for index, fault in result.faults.items():
        explained = [o for o in outages if index in o.faults]
        if not explained:
            continue
        last = explained[-1]
        started = fault.started_at
        assert started is not None  # only injected faults are kept
        found.append(
            PartitionRecovery(
                fault=index,
                partition=partition,
                after_start_s=last.end - started if last.recovered else None,
                after_heal_s=max(0.0, last.end - result.heals[index]) if last.recovered else None,
            )
        )
    return found


def _rank(ordered: list[float], percent: float) -> float:
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]


def _json_float(value: float | None) -> float | None:
    """Rounded; None for a time that never came (JSON has no infinity)."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, 3)
