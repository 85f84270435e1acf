"""The checker: what a run's history says about durability, order and duplicates.

It reads a :class:`~magnetar.verify.history.History` and nothing else. The rules, each a
count in :class:`Verdict` (a violation fails the run):

- **lost**: an acknowledged send missing from the final read of the topic, or stored but never
  delivered to one of the subscriptions (counted once per subscription that missed it).
- **misplaced**: stored somewhere else than the message id its acknowledgement gave.
- **phantoms**: a stored or delivered payload no producer wrote (unknown or corrupt).
- **duplicates**: a message stored more than once (the broker deduplicates producer retries,
  so this must be 0 when deduplication is on; with it off they are counted, not failed).
- **reordered**:
  * in the log: one producer's messages for one key stored out of send order (they share a
    partition, so their offsets must follow their sequence numbers);
  * exclusive and failover subscriptions: a consumer given a message it had never been given
    at a lower offset than one it was given before, on the same partition (a rewind to
    redeliver is fine; a new message overtaking is not);
  * key_shared: the first delivery of a key's messages, across all consumers, out of offset
    order (the draining rule exists to prevent exactly this when keys move).
  Shared subscriptions promise no order and are not checked for it.
- **acknowledged positions**: a message delivered again after the broker confirmed its ack.
  An ack receipt means the ack is persisted, so no later dispatch may bring the message back:
  not the broker that applied it (it writes no copy of an acknowledged entry), nor a new owner
  (it loads the cursors only after its takeover fenced the old owner's cursor writes). Copies
  the broker had sent before it applied the ack may still arrive after the receipt. Three
  cases are *explained*, since the broker sent the message before the ack was confirmed:
  * ``in_flight``: the copy reached the consumer's client before the ack was confirmed, and
    only waited in its queue. For example, after a failover the new owner dispatches what its
    stored cursor says is unacknowledged to one consumer while another consumer resends its
    unconfirmed ack of it. That is at-least-once delivery, not a lost ack.
  * ``open_stream``: another consumer than the one whose ack was confirmed got the copy after
    the confirmation, on a consumer stream opened before it: the same case with the copy
    slowed on its way (the broker's stream queue, the client's event loop), since the receipt
    came on another stream, with no order between the two. The acker's own copy and receipt
    share a stream, in order, so this never explains those. A copy on a stream opened after
    the receipt came from a dispatch that started after the ack was persisted: a violation.
  * ``switch``: a failover consumer's message, handed out within ``switch_s`` of a switch
    (histories without the client's receive times).
  Any other is a violation, whatever faults were running.

- **security** (secure runs, from ``history.security``): the mid-run rotation must have
  happened, and at the end every TLS listener must present the certificate now in its files
  (the rotated one); one that presents another, or cannot be asked, is a violation.

Unavailability windows are the gaps in each partition's stream of acknowledgements longer
than ``gap_s``, with the faults active during each.

- **late recoveries** (:mod:`magnetar.verify.availability`): a partition that stayed in an
  outage (no acknowledged send while the workload sent to it) for more than the recovery
  bound with no fault active that could explain it, e.g. longer than the bound after the
  faults healed. The report also gives, per fault kind, the distribution of each partition's
  time to its first acknowledged send after the fault began and after it healed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from magnetar.verify.availability import DEFAULT_RECOVERY_BOUND_S, Availability, measure
from magnetar.verify.history import Delivery, History, Name

ORDERED_PER_CONSUMER = ("exclusive", "failover")
SAMPLE = 10


@dataclass
class Window:
    """A stretch of time a partition acknowledged no send."""

    partition: int
    start: float
    end: float
    faults: list[str]

    @property
    def duration_s(self) -> float:
        return self.end - self.start


@dataclass
class Verdict:
    """The counts the checker found, and samples of every violation."""

    attempted: int = 0
    acked: int = 0
    failed: int = 0
    pending: int = 0
    stored: int = 0
    delivered: dict[str, int] = field(default_factory=dict)
    """Distinct messages each subscription was given."""
    deliveries: int = 0
    redeliveries: int = 0
    lost: int = 0
    lost_from_log: int = 0
    lost_by_subscription: dict[str, int] = field(default_factory=dict)
    misplaced: int = 0
    phantoms: int = 0
    duplicates: int = 0
    reordered: int = 0
    redelivered_after_ack: int = 0
    explained_redeliveries_after_ack: int = 0
    explained_by: dict[str, int] = field(default_factory=dict)
    """Explained redeliveries after an ack, by reason: ``switch`` or a fault kind."""
    unexplained_redeliveries_after_ack: int = 0
    faults: int = 0
    fault_kinds: dict[str, int] = field(default_factory=dict)
    failed_faults: int = 0
    windows: list[Window] = field(default_factory=list)
    longest_window_s: float = 0.0
    drain_complete: bool = True
    dedup: bool = True
    secure: bool = False
    security_problems: list[str] = field(default_factory=list)
    """Secure runs: no rotation, or TLS listeners not presenting their rotated certificate at
    the end."""
    samples: dict[str, list[str]] = field(default_factory=dict)
    unexpected_exits: list[str] = field(default_factory=list)
    """Servers that exited on their own (the nemesis did not kill them): a crash is a failure
    even when nothing was lost."""
    late_recoveries: list[str] = field(default_factory=list)
    """Outages that outlasted, by more than the recovery bound, every fault that could explain
    them: one line each naming the partition, the outage and the faults."""
    availability: Availability | None = None
    """Outages and recovery times (:func:`magnetar.verify.availability.measure`)."""

    @property
    def duplicates_unexplained(self) -> int:
        return self.duplicates if self.dedup else 0

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.misplaced == 0
            and self.phantoms == 0
            and self.duplicates_unexplained == 0
            and self.reordered == 0
            and self.unexplained_redeliveries_after_ack == 0
            and self.drain_complete
            and not self.security_problems
            and not self.late_recoveries
            and not self.unexpected_exits
        )

    def problems(self) -> list[str]:
        """One line per violated rule (empty when the run passed)."""
        found = []
        for name, count in (
            ("lost", self.lost),
            ("misplaced", self.misplaced),
            ("phantoms", self.phantoms),
            ("duplicates", self.duplicates_unexplained),
            ("reordered", self.reordered),
            ("unexplained redeliveries after ack", self.unexplained_redeliveries_after_ack),
        ):
            if count:
                examples = "; ".join(self.samples.get(name.split(" ")[0], [])[:3])
                found.append(f"{name}: {count}" + (f" (e.g. {examples})" if examples else ""))
        if not self.drain_complete:
            found.append("the final read did not reach the end of every partition")
        found.extend(self.security_problems)
        found.extend(f"late recovery: {line}" for line in self.late_recoveries)
        found.extend(f"unexpected exit: {line}" for line in self.unexpected_exits)
        return found

    def summary(self) -> dict[str, Any]:
        """The one-line summary (``magnetar verify --json``)."""
        after_heal = self.availability.overall()["after_heal"] if self.availability else None
        return {
            "ok": self.ok,
            "acked": self.acked,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "reordered": self.reordered,
            "faults": self.faults,
            "attempted": self.attempted,
            "failed": self.failed,
            "stored": self.stored,
            "delivered": self.delivered,
            "redeliveries": self.redeliveries,
            "misplaced": self.misplaced,
            "phantoms": self.phantoms,
            "redelivered_after_ack": self.redelivered_after_ack,
            "unexplained_redeliveries_after_ack": self.unexplained_redeliveries_after_ack,
            "explained_by": self.explained_by,
            "fault_kinds": self.fault_kinds,
            "failed_faults": self.failed_faults,
            "unavailability_windows": len(self.windows),
            "longest_unavailability_s": round(self.longest_window_s, 3),
            "secure": self.secure,
            "security_problems": len(self.security_problems),
            "late_recoveries": len(self.late_recoveries),
            "unexpected_exits": len(self.unexpected_exits),
            "recovery_bound_s": self.availability.bound_s if self.availability else None,
            "recovery_after_heal": after_heal.to_json() if after_heal else None,
            "recovery_lateness": (
                self.availability.lateness().to_json() if self.availability else None
            ),
        }

    def to_json(self) -> dict[str, Any]:
        body = asdict(replace(self, availability=None))
        body["availability"] = self.availability.to_json() if self.availability else None
        body["ok"] = self.ok
        body["problems"] = self.problems()
        return body


def _note(verdict: Verdict, rule: str, text: str) -> None:
    examples = verdict.samples.setdefault(rule, [])
    if len(examples) < SAMPLE:
        examples.append(text)


def _label(name: Name) -> str:
    return f"{name[0]}/{name[1]}#{name[2]}"


def check(
    history: History,
    *,
    gap_s: float = 1.0,
    switch_s: float = 2.0,
    recovery_bound_s: float | None = None,
) -> Verdict:
    """Judge one history (see the module docstring for the rules). The recovery bound is the
    run's (``recovery_bound_s`` in its configuration) unless given."""
    verdict = Verdict(drain_complete=history.drain_complete)
    verdict.dedup = bool(history.config.get("dedup", True))
    _check_sends_and_log(history, verdict)
    _check_subscriptions(history, verdict, switch_s)
    _check_faults_and_windows(history, verdict, gap_s)
    if recovery_bound_s is None:
        recovery_bound_s = float(history.config.get("recovery_bound_s", DEFAULT_RECOVERY_BOUND_S))
    verdict.availability = measure(history, bound_s=recovery_bound_s, gap_s=gap_s)
    verdict.late_recoveries = verdict.availability.problems()
    verdict.lost = verdict.lost_from_log + sum(verdict.lost_by_subscription.values())
    _check_security(history, verdict)
    return verdict


def _check_security(history: History, verdict: Verdict) -> None:
    security = history.security
    verdict.secure = bool(security.get("secure", False))
    if not verdict.secure:
        return
    if "rotation" not in security:
        verdict.security_problems.append("the certificates were never rotated")
    final: dict[str, bool] = security.get("final_certificates", {})
    unreachable = set(security.get("unreachable_at_end", []))
    stale = sorted(
        label + (" (unreachable)" if label in unreachable else "")
        for label, ok in final.items()
        if not ok
    )
    if not final:
        verdict.security_problems.append("no server was asked for its certificate at the end")
    elif stale:
        verdict.security_problems.append(
            "not presenting the rotated certificate at the end: " + ", ".join(stale)
        )


def _check_sends_and_log(history: History, verdict: Verdict) -> None:
    sent = {s.name: s for s in history.sends}
    verdict.attempted = len(history.sends)
    acked = {name: s for name, s in sent.items() if s.outcome == "acked"}
    verdict.acked = len(acked)
    verdict.failed = sum(1 for s in history.sends if s.outcome == "failed")
    verdict.pending = sum(1 for s in history.sends if s.outcome == "pending")
    verdict.stored = len(history.stored)

    where: dict[Name, tuple[int, int, int, int]] = {}
    last_seq: dict[tuple[str, str], tuple[int, int, int]] = {}
    for record in sorted(history.stored, key=lambda r: (r.partition, r.offset)):
        if record.phantom or record.name not in sent:
            verdict.phantoms += 1
            _note(verdict, "phantoms", f"stored at {record.partition}:{record.offset}")
            continue
        position = (record.partition, record.ledger_id, record.entry_id, record.batch_index)
        if record.name in where:
            verdict.duplicates += 1
            _note(
                verdict,
                "duplicates",
                f"{_label(record.name)} at {where[record.name]} and {position}",
            )
            continue
        where[record.name] = position
        stream = (record.producer, record.key)
        previous = last_seq.get(stream)
        if previous is not None and previous[0] > record.seq and previous[1] == record.partition:
            verdict.reordered += 1
            _note(
                verdict,
                "reordered",
                f"log: {_label(record.name)} at offset {record.offset} after seq {previous[0]}"
                f" at offset {previous[2]}",
            )
        last_seq[stream] = (record.seq, record.partition, record.offset)

    for name, send in acked.items():
        stored_at = where.get(name)
        if stored_at is None:
            verdict.lost_from_log += 1
            _note(verdict, "lost", f"{_label(name)} acked at {send.answered_at:.3f}s, not stored")
        elif stored_at != (send.partition, send.ledger_id, send.entry_id, send.batch_index):
            verdict.misplaced += 1
            _note(
                verdict,
                "misplaced",
                f"{_label(name)} acked as {send.partition}:{send.ledger_id}:{send.entry_id}"
                f":{send.batch_index}, stored at {stored_at}",
            )


def _check_subscriptions(history: History, verdict: Verdict, switch_s: float) -> None:
    acked = {s.name for s in history.sends if s.outcome == "acked"}
    stored = {r.name for r in history.stored if not r.phantom}
    sent = {s.name for s in history.sends}
    switches: dict[tuple[str, int], list[float]] = defaultdict(list)
    for switch in history.switches:
        switches[(switch.consumer, switch.partition)].append(switch.at)
    by_subscription: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in history.deliveries:
        by_subscription[delivery.subscription].append(delivery)
    verdict.deliveries = len(history.deliveries)
    for subscription in history.config.get("subscriptions", sorted(by_subscription)):
        deliveries = sorted(by_subscription.get(subscription, []), key=lambda d: d.at)
        seen: set[Name] = set()
        confirmed: dict[Name, tuple[float, str]] = {}
        """The first confirmed ack of each message, and the consumer that made it."""
        high_offset: dict[tuple[str, int], int] = {}
        key_high: dict[tuple[int, str], int] = {}
        for d in deliveries:
            if d.phantom or d.name not in sent:
                verdict.phantoms += 1
                _note(verdict, "phantoms", f"{subscription}: delivered at {d.partition}:{d.offset}")
                continue
            first = d.name not in seen
            if not first:
                verdict.redeliveries += 1
                acked_at, acker = confirmed.get(d.name, (None, ""))
                if acked_at is not None and acked_at < d.at:
                    verdict.redelivered_after_ack += 1
                    switched = any(
                        abs(at - d.at) <= switch_s for at in switches[(d.consumer, d.partition)]
                    )
                    in_flight = d.received_at is not None and d.received_at <= acked_at
                    # the acker's own copy came on the stream its receipt came on, in order:
                    # only another consumer's copy can overtake the receipt
                    open_stream = (
                        d.consumer != acker
                        and d.stream_opened_at is not None
                        and d.stream_opened_at <= acked_at
                    )
                    if in_flight or open_stream or switched:
                        reason = (
                            "in_flight" if in_flight else "open_stream" if open_stream else "switch"
                        )
                        verdict.explained_redeliveries_after_ack += 1
                        verdict.explained_by[reason] = verdict.explained_by.get(reason, 0) + 1
                    else:
                        verdict.unexplained_redeliveries_after_ack += 1
                        _note(
                            verdict,
                            "unexplained",
                            f"{subscription}: {_label(d.name)} ack confirmed at {acked_at:.3f}s,"
                            f" delivered again at {d.at:.3f}s to {d.consumer}"
                            + (
                                f" (its client got it at {d.received_at:.3f}s)"
                                if d.received_at is not None
                                else ""
                            )
                            + (
                                f" on a stream opened at {d.stream_opened_at:.3f}s"
                                if d.stream_opened_at is not None
                                else ""
                            ),
                        )
            _check_order(verdict, subscription, d, first, high_offset, key_high)
            seen.add(d.name)
            if d.acked_at is not None and d.acked_at < confirmed.get(d.name, (math.inf, ""))[0]:
                confirmed[d.name] = (d.acked_at, d.consumer)
        verdict.delivered[subscription] = len(seen)
        missing = (acked & stored) - seen
        verdict.lost_by_subscription[subscription] = len(missing)
        for name in sorted(missing)[:SAMPLE]:
            _note(verdict, "lost", f"{subscription}: {_label(name)} stored but never delivered")


def _check_order(  # noqa: PLR0917 - a private helper of one loop
    verdict: Verdict,
    subscription: str,
    d: Delivery,
    first: bool,
    high_offset: dict[tuple[str, int], int],
    key_high: dict[tuple[int, str], int],
) -> None:
    if d.subscription_type in ORDERED_PER_CONSUMER:
        slot = (d.consumer, d.partition)
        high = high_offset.get(slot, -1)
        if first and d.offset < high:
            verdict.reordered += 1
            _note(
                verdict,
                "reordered",
                f"{subscription}: {d.consumer} got new offset {d.offset} of partition"
                f" {d.partition} after offset {high}",
            )
        high_offset[slot] = max(high, d.offset)
    elif d.subscription_type == "key_shared" and first:
        slot_key = (d.partition, d.key)
        high = key_high.get(slot_key, -1)
        if d.offset < high:
            verdict.reordered += 1
            _note(
                verdict,
                "reordered",
                f"{subscription}: key {d.key} offset {d.offset} first delivered (to {d.consumer})"
                f" after offset {high} of the same key",
            )
        key_high[slot_key] = max(high, d.offset)


def _check_faults_and_windows(history: History, verdict: Verdict, gap_s: float) -> None:
    verdict.faults = sum(1 for f in history.faults if f.started_at is not None and not f.error)
    verdict.failed_faults = sum(1 for f in history.faults if f.error)
    verdict.unexpected_exits = list(history.unexpected_exits)
    kinds: dict[str, int] = defaultdict(int)
    for fault in history.faults:
        if fault.started_at is not None and not fault.error:
            kinds[fault.kind] += 1
    verdict.fault_kinds = dict(sorted(kinds.items()))

    start = history.phases.get("workload", 0.0)
    end = history.phases.get("producers_stopped")
    times: dict[int, list[float]] = defaultdict(list)
    for send in history.sends:
        if send.outcome == "acked" and send.answered_at is not None:
            times[send.partition].append(send.answered_at)
    for partition in sorted(times):
        stamps = sorted(times[partition])
        if end is not None:
            stamps.append(end)  # a partition silent until the end was unavailable that long
        previous = start
        for stamp in stamps:
            if stamp - previous > gap_s:
                active = [
                    f"{f.kind}:{f.target}"
                    for f in history.faults
                    if f.started_at is not None
                    and f.started_at <= stamp
                    and (f.ended_at is None or f.ended_at >= previous)
                ]
                verdict.windows.append(Window(partition, previous, stamp, active))
            previous = max(previous, stamp)
    verdict.longest_window_s = max((w.duration_s for w in verdict.windows), default=0.0)
