"""Outages, recovery times and the recovery bound (magnetar.verify.availability) on hand-made
timelines: a partition's sends are acknowledged at once except during the outages a test
gives, when they wait for its end (or fail, for one that never ends)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from magnetar.cli import build_parser
from magnetar.verify.availability import Distribution, measure
from magnetar.verify.checker import check
from magnetar.verify.history import Fault, History, Send, Stored
from magnetar.verify.report import write_report
from magnetar.verify.runner import VerifyConfig

STOP = 60.0
"""When the producers stopped (the end of every timeline)."""


def timeline(
    outages: dict[int, list[tuple[float, float | None]]],
    *,
    partitions: int = 2,
    until: float = 50.0,
    every: float = 0.1,
) -> History:
    """Sends every ``every`` s to each partition from 1 s to ``until``; one sent during an
    outage ``(a, b)`` of its partition is acknowledged at ``b``, or fails when ``b`` is None."""
    history = History(seed=3, config={"subscriptions": []}, drain_complete=True)
    history.phases = {"workload": 0.0, "healed": 45.0, "producers_stopped": STOP}
    for partition in range(partitions):
        key = f"k{partition}"
        for step in range(round((until - 1.0) / every) + 1):
            at = 1.0 + step * every
            send = Send("p0", key, step, at, "acked", at + 0.01, partition, 1, step, -1)
            for start, end in outages.get(partition, []):
                if start <= at < (end if end is not None else math.inf):
                    if end is None:
                        send.outcome, send.answered_at, send.partition = "failed", STOP, -1
                    else:
                        send.answered_at = end
            history.sends.append(send)
            if send.outcome == "acked":
                history.stored.append(Stored(partition, step, 1, step, -1, "p0", key, step))
    return history


def fault(history: History, kind: str, started: float, ended: float | None) -> None:
    index = len(history.faults)
    history.faults.append(Fault(index, kind, f"t{index}", started, 1.0, started, ended))


def test_a_partition_out_during_a_fault_recovers_after_its_heal() -> None:
    history = timeline({0: [(10.0, 16.0)]})
    fault(history, "kill-broker", 10.0, 14.0)
    availability = measure(history)
    [outage] = availability.outages
    assert (outage.partition, outage.recovered, outage.faults) == (0, True, (0,))
    assert outage.start == pytest.approx(10.0)
    assert outage.end == pytest.approx(16.0)
    assert outage.lateness_s == pytest.approx(2.0)  # out from the heal at 14 until 16
    assert availability.late == []
    [recovery] = availability.recoveries  # partition 1 was never out
    assert recovery.partition == 0
    assert recovery.after_start_s == pytest.approx(6.0)
    assert recovery.after_heal_s == pytest.approx(2.0)
    kinds = availability.by_kind()
    assert list(kinds) == ["kill-broker"]
    assert kinds["kill-broker"]["after_heal"] == Distribution(1, 2.0, 2.0, 2.0)
    assert check(history).ok


def test_a_recovery_slower_than_the_bound_fails_naming_partition_outage_and_fault() -> None:
    history = timeline({1: [(10.0, 21.5)]})
    fault(history, "pause-broker", 10.0, 14.0)
    verdict = check(history)
    assert not verdict.ok
    [line] = verdict.late_recoveries
    assert line == (
        "partition 1 acknowledged no send from 10.0s to 21.5s (faults that could explain it:"
        " #0 pause-broker:t0 10.0s-14.0s); out 7.5s with none of them active, from 14.0s to"
        " 21.5s, over the 5s recovery bound"
    )
    assert f"late recovery: {line}" in verdict.problems()
    assert verdict.summary()["late_recoveries"] == 1
    # a looser bound, given or from the run's configuration, passes the same timeline
    assert check(history, recovery_bound_s=8.0).ok
    history.config["recovery_bound_s"] = 8.0
    assert check(history).ok


def test_overlapping_faults_count_from_the_last_heal() -> None:
    # partition 0: a bookie killed 10-16 and a broker paused 13-20, overlapping: out 10-24,
    # 4 s after the last heal. Partition 1: out 30-33, inside a fault.
    history = timeline({0: [(10.0, 24.0)], 1: [(30.0, 33.0)]})
    fault(history, "kill-bookie", 10.0, 16.0)
    fault(history, "pause-broker", 13.0, 20.0)
    fault(history, "kill-etcd", 29.0, 35.0)
    availability = measure(history)
    first, second = sorted(availability.outages, key=lambda o: o.start)
    assert first.faults == (0, 1)
    assert first.last_heal == pytest.approx(20.0)
    assert first.lateness_s == pytest.approx(4.0)
    assert (first.late_from, first.late_to) == pytest.approx((20.0, 24.0))
    assert second.faults == (2,)
    assert second.lateness_s == pytest.approx(0.0)
    assert availability.late == []
    # each fault's own figures: the kill's heal came 8 s before partition 0 recovered
    by_fault = {(r.fault, r.partition): r for r in availability.recoveries}
    assert set(by_fault) == {(0, 0), (1, 0), (2, 1)}
    assert by_fault[0, 0].after_heal_s == pytest.approx(8.0)
    assert by_fault[1, 0].after_heal_s == pytest.approx(4.0)
    assert by_fault[1, 0].after_start_s == pytest.approx(11.0)
    # partition 1 was flowing again when its fault healed
    assert by_fault[2, 1].after_heal_s == 0.0
    assert by_fault[2, 1].after_start_s == pytest.approx(4.0)


def test_faults_in_a_row_with_a_long_quiet_stretch_between_them_are_late() -> None:
    # out 10-30; a kill healed at 12, the next fault only began at 19: 7 s out with none
    history = timeline({0: [(10.0, 30.0)]})
    fault(history, "kill-broker", 10.0, 12.0)
    fault(history, "cut-broker-etcd", 19.0, 28.0)
    [late] = measure(history).late
    assert late.faults == (0, 1)
    assert (late.late_from, late.late_to) == pytest.approx((12.0, 19.0))
    [line] = check(history).late_recoveries
    assert "#0 kill-broker:t0 10.0s-12.0s, #1 cut-broker-etcd:t1 19.0s-28.0s" in line
    assert "from 12.0s to 19.0s" in line
    # the same gap within the bound is not late
    history = timeline({0: [(10.0, 30.0)]})
    fault(history, "kill-broker", 10.0, 12.0)
    fault(history, "cut-broker-etcd", 16.0, 28.0)
    assert measure(history).late == []


def test_an_outage_no_fault_explains_is_late_by_its_whole_length() -> None:
    history = timeline({0: [(5.0, 11.0)], 1: [(20.0, 23.0)]})
    fault(history, "kill-bookie", 30.0, 32.0)  # later: explains neither
    availability = measure(history)
    assert [o.faults for o in availability.outages] == [(), ()]
    [late] = availability.late
    assert late.partition == 0
    assert late.lateness_s == pytest.approx(6.0)
    assert "no fault explains it)" in availability.describe(late)
    # one healed before the outage began is named, to help find what it left behind
    fault(history, "pause-bookie", 2.0, 3.5)
    [late] = measure(history).late
    assert late.faults == ()
    assert (
        "(no fault explains it; the last fault before it, #1 pause-bookie:t1 2.0s-3.5s,"
        " healed 1.5s before it began); out 6.0s with none of them active, for its whole"
        " length, over the 5s recovery bound" in measure(history).describe(late)
    )
    assert availability.recoveries == []


def test_a_partition_nothing_was_sent_to_is_not_out() -> None:
    # partition 0's producer stalled 10-20 (sent nothing): a gap in acks, but no outage
    history = timeline({})
    history.sends = [s for s in history.sends if not (s.partition == 0 and 10 <= s.sent_at < 20)]
    assert measure(history).outages == []
    # short gaps are not outages either
    history = timeline({0: [(10.0, 10.9)]})
    assert measure(history).outages == []


def test_a_partition_never_recovered_is_late_and_its_times_are_never() -> None:
    history = timeline({1: [(40.0, None)]})
    fault(history, "fill-disk", 40.0, None)  # never healed by its own step: the final heal
    availability = measure(history)
    [outage] = availability.outages
    assert not outage.recovered
    assert outage.start == pytest.approx(40.0)
    assert outage.end == STOP
    assert outage.last_heal == 45.0
    assert availability.late == [outage]
    assert "to the end, never recovered" in availability.describe(outage)
    [recovery] = availability.recoveries
    assert (recovery.after_start_s, recovery.after_heal_s) == (None, None)
    dist = availability.overall()["after_heal"]
    assert (dist.count, dist.max) == (1, math.inf)
    assert dist.to_json()["max_s"] is None


def test_distributions_are_nearest_rank() -> None:
    dist = Distribution.of([float(v) for v in range(100, 0, -1)])
    assert (dist.count, dist.p50, dist.p99, dist.max) == (100, 50.0, 99.0, 100.0)
    assert Distribution.of([2.0, None]).p50 == 2.0
    assert Distribution.of([2.0, None]).p99 == math.inf
    empty = Distribution.of([])
    assert empty.count == 0
    assert math.isnan(empty.p50)


def test_bad_bounds_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="recovery bound must be > 0 seconds, got 0"):
        measure(timeline({}), bound_s=0)
    with pytest.raises(ValueError, match="outage gap must be > 0 seconds, got -1"):
        measure(timeline({}), gap_s=-1)
    with pytest.raises(ValueError, match="recovery bound must be > 0 seconds, got -2"):
        VerifyConfig(recovery_bound_s=-2)
    args = build_parser().parse_args(["verify", "--recovery-bound-s", "7.5"])
    assert args.recovery_bound_s == 7.5


def test_the_report_has_a_recovery_section_and_an_availability_plot(tmp_path: Path) -> None:
    history = timeline({0: [(10.0, 21.5)], 1: [(10.0, 15.0)]})
    fault(history, "kill-broker", 10.0, 14.0)
    verdict = check(history)
    paths = write_report(tmp_path, history, verdict, ["  #0 at 10.00s kill-broker"])
    assert paths["availability_png"].read_bytes()[:4] == b"\x89PNG"
    text = paths["summary"].read_text()
    assert "**FAILED**: late recovery: partition 0 acknowledged no send from 10.0s" in text
    assert "## Recovery" in text
    assert "2 outages" in text
    assert "1 late" in text
    assert "| kill-broker | 2 | 5.00 / 11.50 / 11.50 | 1.00 / 7.50 / 7.50 |" in text
    assert "| late_recoveries | 1 |" in text
    # outage 0 is late by 7.5 s (14-21.5), outage 1 by 1 s (14-15)
    assert "over the 2 outages: p50 / p99 / max 1.00 / 7.50 / 7.50 s" in text
    assert "the longest on partition 0, 14.0-21.5 s" in text
    body = verdict.to_json()["availability"]
    assert body["late"] == 1
    assert body["by_kind"]["kill-broker"]["after_heal"] == {
        "count": 2,
        "p50_s": 1.0,
        "p99_s": 7.5,
        "max_s": 7.5,
    }
