"""The pure parts of ``bench/suite.py``: its workload table and perf command lines, reading what
``magnetar perf`` prints, the growth ratio, the targets' verdicts, and the report of a run."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.bench.fake_results import run_head

# The benchmarks are scripts that import each other as top-level modules (``python
# bench/suite.py`` puts bench/ on the path), so the test does the same.
_BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(_BENCH) not in sys.path:
    sys.path.insert(0, str(_BENCH))
suite: Any = importlib.import_module("suite")
# what perf prints is read by the benchmarks' harness, which the suite runs perf with
harness: Any = importlib.import_module("harness")

URL = "magnetar://127.0.0.1:6650"


# --- the workload table -----------------------------------------------------------------------


def test_the_table_covers_partitions_sizes_and_rates_once_each():
    keys = [w.key for w in suite.WORKLOADS]
    assert len(keys) == len(set(keys))
    by_kind: dict[str, list[Any]] = {}
    for w in suite.WORKLOADS:
        if w.protocol == "magnetar":
            by_kind.setdefault(w.kind, []).append(w)
    combos = {(p, s) for p in (1, 16) for s in (100, 1024)}
    # max rate and backlog: the per-message calls and the batch calls side by side
    both = (False, True)
    assert {(w.partitions, w.message_bytes, w.batch_api) for w in by_kind["max-rate"]} == {
        (p, s, b) for p, s in combos for b in both
    }
    for rate in (2_000, 50_000):
        at_rate = [w for w in by_kind["fixed-rate"] if w.rate == rate]
        assert {(w.partitions, w.message_bytes) for w in at_rate} == combos
        assert not any(w.batch_api for w in at_rate)
    assert {(w.partitions, w.message_bytes, w.batch_api) for w in by_kind["backlog"]} == {
        (p, 100, b) for p in (1, 16) for b in both
    }
    assert len(suite.WORKLOADS) == 23  # 20 of Magnetar's client, 3 of the Pulsar port


def test_each_pulsar_port_workload_runs_right_after_its_grpc_counterpart():
    keys = [w.key for w in suite.WORKLOADS]
    pulsar = [w for w in suite.WORKLOADS if w.protocol == "pulsar"]
    assert [(w.key, w.counterpart) for w in pulsar] == [
        ("pulsar-produce", "max-1p-100B"),
        ("pulsar-e2e-2000", "rate2000-1p-100B"),
        ("pulsar-e2e-50000", "rate50000-1p-100B"),
    ]
    for w in pulsar:
        assert keys.index(w.key) == keys.index(w.counterpart) + 1
        assert (w.partitions, w.message_bytes, w.batch_api) == (1, 100, False)
    assert pulsar[0].name == "max rate, 1 partition, 100 B, Pulsar port (pulsar-client)"
    assert pulsar[0].api == "pulsar-client send_async"
    assert pulsar[1].api == "pulsar-client send_async; message_listener + acknowledge"
    assert pulsar[1].topic == "suite-pulsar-e2e-2000"
    assert suite.Workload("max-rate", 1, 100).counterpart is None


def test_a_workload_whose_counterpart_is_not_there_goes_last():
    wl = suite.Workload
    lone = wl("fixed-rate", 1, 100, 7, protocol="pulsar")
    grpc = (wl("max-rate", 1, 100), wl("max-rate", 16, 100))
    pulsar = wl("max-rate", 1, 100, protocol="pulsar")
    placed = suite.beside_counterparts(grpc, (lone, pulsar))
    assert [w.key for w in placed] == [
        "max-1p-100B",
        "pulsar-produce",
        "max-16p-100B",
        "pulsar-e2e-7",
    ]


def test_only_pulsar_port_runs_the_pulsar_workloads_and_their_counterparts():
    args = suite.parse_args(["--quick", "--only", "pulsar-port"])
    assert [w.key for w in suite.chosen_workloads(args)] == [
        "max-1p-100B",
        "pulsar-produce",
        "rate2000-1p-100B",
        "pulsar-e2e-2000",
        "rate50000-1p-100B",
        "pulsar-e2e-50000",
    ]
    args = suite.parse_args(["--only", "pulsar-e2e-2000", "--only", "max-16p-100B"])
    assert [w.key for w in suite.chosen_workloads(args)] == ["max-16p-100B", "pulsar-e2e-2000"]
    with pytest.raises(SystemExit):
        suite.parse_args(["--only", "pulsar-e2e-9"])


def test_a_pulsar_port_workload_runs_the_pulsar_load_generator_against_the_pulsar_url():
    e2e = suite.Workload("fixed-rate", 1, 100, 2_000, protocol="pulsar")
    (phase,) = suite.perf_phases(
        e2e, URL, duration_s=2, backlog_messages=10, warmup_s=0.5, pulsar_url="pulsar://h:1"
    )
    name, args, timeout_s = phase
    assert name == "end-to-end"
    assert args[:6] == [
        "bench/pulsar_perf.py",
        "end-to-end",
        "suite-pulsar-e2e-2000",
        "--service-url",
        "pulsar://h:1",
        "--json",
    ]
    assert "--json-progress" in args
    assert args[args.index("--rate") + 1] == "2000"
    assert args[args.index("--size") + 1] == "100"
    assert args[args.index("--duration") + 1] == "2"
    assert args[args.index("--warmup-s") + 1] == "0.5"
    assert timeout_s == pytest.approx(2.5 + suite.PERF_TIMEOUT_MARGIN_S)
    # what it prints is perf's --json and --json-progress: the generator takes these options
    pulsar_perf = importlib.import_module("pulsar_perf")
    parsed = pulsar_perf.parse_args(args[1:])
    assert (parsed.mode, parsed.rate, parsed.json, parsed.json_progress) == (
        "end-to-end",
        2000.0,
        True,
        True,
    )
    produce = suite.Workload("max-rate", 1, 100, protocol="pulsar")
    ((name, args, _),) = suite.perf_phases(
        produce, URL, duration_s=2, backlog_messages=10, pulsar_url="pulsar://h:1"
    )
    assert name == "produce"
    assert args[args.index("--rate") + 1] == "0"
    with pytest.raises(ValueError, match="Pulsar URL"):
        suite.perf_phases(produce, URL, duration_s=2, backlog_messages=10)


def test_keys_and_names_read_as_the_workload():
    w = suite.Workload("fixed-rate", 16, 1024, 50_000)
    assert w.key == "rate50000-16p-1KiB"
    assert w.name == "50,000 msg/s, 16 partitions, 1 KiB"
    assert w.topic == "suite-rate50000-16p-1KiB"
    assert suite.Workload("max-rate", 1, 100).key == "max-1p-100B"
    assert suite.Workload("backlog", 1, 100).name == "backlog drain, 1 partition, 100 B"
    batch = suite.Workload("max-rate", 1, 100, batch_api=True)
    assert batch.key == "max-1p-100B-batch"
    assert batch.name == "max rate, 1 partition, 100 B, batch API"
    assert batch.topic == "suite-max-1p-100B-batch"


def test_each_workload_names_the_client_calls_perf_makes():
    wl = suite.Workload
    assert wl("max-rate", 1, 100).api == "send_async"
    assert wl("max-rate", 1, 100, batch_api=True).api == "send_many_async"
    assert wl("fixed-rate", 1, 100, 2_000).api == "send_async; receive + acknowledge"
    assert wl("backlog", 1, 100, batch_api=True).api == (
        "send_many_async, then batch_receive + acknowledge_cumulative"
    )


def test_max_rate_is_one_timed_produce_at_rate_zero():
    (phase,) = suite.perf_phases(
        suite.Workload("max-rate", 16, 100), URL, duration_s=20, backlog_messages=10
    )
    name, args, timeout_s = phase
    assert name == "produce"
    assert args[:4] == ["-m", "magnetar.cli", "perf", "produce"]
    text = " ".join(args)
    assert "--partitions 16" in text
    assert "--size 100" in text
    assert "--rate 0" in text
    assert "--duration 20" in text
    assert "--json" in args
    assert "--num-messages" not in args
    assert "--batch-api" not in args  # perf's default: send_async per message
    assert timeout_s > 20
    ((_, batch_args, _),) = suite.perf_phases(
        suite.Workload("max-rate", 16, 100, batch_api=True), URL, duration_s=20, backlog_messages=1
    )
    assert "--batch-api" in batch_args
    assert "suite-max-16p-100B-batch" in batch_args


def test_fixed_rate_is_a_timed_end_to_end_run():
    ((name, args, _),) = suite.perf_phases(
        suite.Workload("fixed-rate", 1, 1024, 2_000), URL, duration_s=5, backlog_messages=10
    )
    assert name == "end-to-end"
    text = " ".join(args)
    assert "perf end-to-end suite-rate2000-1p-1KiB" in text
    assert "--rate 2000" in text
    assert "--size 1024" in text
    assert "--service-url " + URL in text


def test_a_backlog_is_produced_then_drained_by_the_subscription_made_before_it():
    phases = suite.perf_phases(
        suite.Workload("backlog", 1, 100), URL, duration_s=5, backlog_messages=1234
    )
    assert [p[0] for p in phases] == ["produce", "consume"]
    produce, consume = (" ".join(p[1]) for p in phases)
    assert "--num-messages 1234" in produce
    assert "--rate 0" in produce
    assert "--duration" not in produce
    assert "--num-messages 1234" in consume
    # the subscription exists before the produce (prepare_backlog), at the earliest message:
    # without it the broker would delete every rolled-over ledger as consumed
    assert f"--subscription {suite.BACKLOG_SUBSCRIPTION}" in consume
    assert phases[0][1][4] == phases[1][1][4]  # the same topic
    assert "--batch-api" not in produce
    assert "--batch-api" not in consume
    batch = suite.perf_phases(
        suite.Workload("backlog", 1, 100, batch_api=True), URL, duration_s=5, backlog_messages=1
    )
    assert all("--batch-api" in args for _, args, _ in batch)


# --- what perf prints -------------------------------------------------------------------------


def test_progress_lines_are_read_as_numbers():
    line = (
        "produce    3.0 s     201,234 msg/s     20.12 MB/s  p50    7.123 ms"
        "  p99   40.000 ms  pending 9,999"
    )
    assert harness.parse_progress(line) == {
        "t_s": 3.0,
        "msg_per_s": 201234,
        "mb_per_s": 20.12,
        "p50_ms": 7.123,
        "p99_ms": 40.0,
        "pending": 9999,
        "errors": 0,
    }


def test_progress_lines_without_latency_with_errors_or_negative_pending():
    quiet = harness.parse_progress(
        "consume   12.0 s           0 msg/s      0.00 MB/s  p50        - ms  p99        - ms"
        "  pending 0"
    )
    assert quiet is not None
    assert quiet["p50_ms"] is None
    assert quiet["p99_ms"] is None
    noisy = harness.parse_progress(
        "end-to-end    1.0 s       1,998 msg/s      0.20 MB/s  p50    3.100 ms  p99   12.000 ms"
        "  pending -3  errors 1,200"
    )
    assert noisy is not None
    assert noisy["pending"] == -3
    assert noisy["errors"] == 1200


def test_json_progress_lines_are_read_with_their_warmup_flag():
    line = (
        '{"progress": "produce", "t_s": 2.0, "warmup": true, "msg_per_s": 5.5, "mb_per_s": 0.1,'
        ' "p50_ms": null, "p99_ms": 3.0, "pending": 4, "errors": 0}'
    )
    assert harness.parse_progress(line) == {
        "t_s": 2.0,
        "msg_per_s": 5.5,
        "mb_per_s": 0.1,
        "p50_ms": None,
        "p99_ms": 3.0,
        "pending": 4,
        "errors": 0,
        "warmup": True,
    }
    assert harness.parse_progress('{"mode": "produce", "messages": 3}') is None  # the summary
    assert harness.parse_progress("{not json") is None


def test_timed_phases_warm_up_and_the_drain_prefetches_deeply():
    (phase,) = suite.perf_phases(
        suite.Workload(suite.MAX_RATE, 1, 100),
        "magnetar://h:1",
        duration_s=5,
        backlog_messages=10,
        warmup_s=2,
    )
    assert phase[1][-2:] == ["--warmup-s", "2"]
    assert "--json-progress" in phase[1]
    assert phase[2] == 2 + 5 + suite.PERF_TIMEOUT_MARGIN_S
    _produce, consume = suite.perf_phases(
        suite.Workload(suite.BACKLOG, 1, 100), "magnetar://h:1", duration_s=5, backlog_messages=10
    )
    queue = consume[1].index("--receiver-queue-size")
    assert consume[1][queue + 1] == str(suite.CONSUMER_QUEUE)


@pytest.mark.parametrize(
    "line",
    [
        "magnetar perf produce: created t with 16 partitions",
        "magnetar perf consume: got 10 of 100 messages before 10 s passed without one",
        "",
    ],
)
def test_other_stderr_lines_are_not_progress(line):
    assert harness.parse_progress(line) is None


def test_the_json_summary_line_is_found_and_nothing_else():
    summary = {"mode": "produce", "messages": 5, "msg_per_s": 2.5, "latency_ms": {"p50": 1.0}}
    assert harness.parse_summary(json.dumps(summary) + "\n") == summary
    assert harness.parse_summary("magnetar perf produce t1") is None
    assert harness.parse_summary("{not json") is None
    assert harness.parse_summary('{"no": "mode"}') is None
    assert harness.parse_summary("[1, 2]") is None


# --- growth -----------------------------------------------------------------------------------


def _seconds(*mb_per_s: float) -> list[dict[str, Any]]:
    return [
        {"t_s": float(i + 1), "mb_per_s": v, "msg_per_s": int(v * 1000)}
        for i, v in enumerate(mb_per_s)
    ]


def test_steady_throughput_has_a_ratio_of_one():
    ratio = suite.grow_ratio(_seconds(*[50.0] * 40))
    assert ratio["ratio"] == pytest.approx(1.0)
    assert ratio["first_seconds"] == ratio["last_seconds"] == 4


def test_falling_throughput_is_last_tenth_over_first_tenth_of_the_data():
    # 10 seconds at 100 MB/s then 10 at 50: the first 10% of 1,500 MB is written at 100,
    # the last 10% at 50
    ratio = suite.grow_ratio(_seconds(*[100.0] * 10, *[50.0] * 10))
    assert ratio["first_mb_per_s"] == pytest.approx(100.0)
    assert ratio["last_mb_per_s"] == pytest.approx(50.0)
    assert ratio["ratio"] == pytest.approx(0.5)
    assert ratio["total_mb"] == pytest.approx(1500.0)


def test_no_data_has_no_ratio():
    assert suite.grow_ratio([])["ratio"] is None
    assert suite.grow_ratio(_seconds(0.0, 0.0))["ratio"] is None


def test_the_grow_part_asks_for_its_copies_and_the_floor():
    needed = suite.grow_disk_needed(20)
    assert needed >= 20 * suite.GB * suite.QUORUM[1] + suite.GROW_FLOOR_BYTES
    assert needed == suite.grow_disk_needed(20.0)
    assert suite.grow_disk_needed(0) == suite.GROW_FLOOR_BYTES


def test_a_grow_that_does_not_fit_is_refused_before_anything_runs(tmp_path):
    args = suite.parse_args(["--grow-gb", "1000000", "--data-root", str(tmp_path)])
    reason = suite.disk_refusal(args)
    assert reason is not None
    assert "--grow-gb 1,000,000 needs" in reason
    assert suite.disk_refusal(suite.parse_args(["--data-root", str(tmp_path)])) is None


# --- the targets ------------------------------------------------------------------------------


def _result(
    workload: Any, *, ok: bool = True, msg_per_s: float = 0.0, **extra: Any
) -> dict[str, Any]:
    result = {
        "key": workload.key,
        "name": workload.name,
        "kind": workload.kind,
        "partitions": workload.partitions,
        "message_bytes": workload.message_bytes,
        "rate": workload.rate,
        "protocol": workload.protocol,
        "counterpart": workload.counterpart,
        "ok": ok,
        "phases": [],
        "broker_rss_max_mib": 100.0,
    }
    if ok:
        result["msg_per_s"] = msg_per_s
        result["latency_ms"] = extra.pop("latency_ms", {})
    if workload.kind == "backlog":
        result["backlog_messages"] = extra.pop("backlog_messages", 10_000_000)
    result.update(extra)
    return result


def _by_name(checks: list[dict[str, Any]], start: str) -> dict[str, Any]:
    return next(c for c in checks if c["name"].startswith(start))


def test_throughput_targets_take_the_better_partition_count():
    wl = suite.Workload
    workloads = [
        _result(wl("max-rate", 1, 100), msg_per_s=100_000, api="send_async"),
        _result(wl("max-rate", 1, 100, batch_api=True), msg_per_s=400_000, api="send_many_async"),
        _result(wl("max-rate", 16, 100, batch_api=True), msg_per_s=600_000, api="send_many_async"),
        _result(wl("max-rate", 1, 1024), msg_per_s=900_000),  # 1 KiB does not count
        _result(wl("backlog", 1, 100), msg_per_s=700_000),
        _result(wl("backlog", 16, 100), ok=False),
    ]
    checks = suite.checks(workloads, rss_bound_mib=512, grow=None)
    producer = _by_name(checks, "one producer")
    assert producer["verdict"] == "PASS"
    assert producer["workload"] == "max-16p-100B-batch"
    assert producer["api"] == "send_many_async"
    assert producer["measured_msg_per_s"] == 600_000
    # the best of each set of calls is kept beside it: per message and batch
    assert producer["per_api"] == {
        "send_async": {"workload": "max-1p-100B", "msg_per_s": 100_000},
        "send_many_async": {"workload": "max-16p-100B-batch", "msg_per_s": 600_000},
    }
    consumer = _by_name(checks, "one consumer")
    assert consumer["verdict"] == "MISS"
    assert consumer["workload"] == "backlog-1p-100B"
    assert "note" not in consumer


def test_a_small_backlog_is_judged_but_named():
    checks = suite.checks(
        [_result(suite.Workload("backlog", 1, 100), msg_per_s=900_000, backlog_messages=1000)],
        rss_bound_mib=512,
        grow=None,
    )
    consumer = _by_name(checks, "one consumer")
    assert consumer["verdict"] == "PASS"
    assert "1,000" in consumer["note"]


def test_latency_targets_must_hold_in_every_workload_of_the_rate_at_that_rate():
    wl = suite.Workload
    fast = {"p50": 2.0, "p99": 9.0}
    workloads = [
        _result(wl("fixed-rate", 1, 100, 2_000), msg_per_s=2_000, latency_ms=fast),
        _result(wl("fixed-rate", 16, 100, 2_000), msg_per_s=1_999, latency_ms=fast),
        _result(wl("fixed-rate", 1, 100, 50_000), msg_per_s=50_000, latency_ms={"p99": 15.0}),
        # fast enough, but it delivered a third of the rate
        _result(wl("fixed-rate", 16, 100, 50_000), msg_per_s=17_000, latency_ms={"p99": 15.0}),
    ]
    checks = suite.checks(workloads, rss_bound_mib=512, grow=None)
    at_2k = _by_name(checks, "end-to-end latency at 2,000")
    assert at_2k["verdict"] == "PASS"
    assert [e["verdict"] for e in at_2k["workloads"]] == ["PASS", "PASS"]
    at_50k = _by_name(checks, "end-to-end latency at 50,000")
    assert at_50k["verdict"] == "MISS"
    assert [e["verdict"] for e in at_50k["workloads"]] == ["PASS", "MISS"]
    assert "17,000 of 50,000" in at_50k["workloads"][1]["why"]


def test_one_slow_percentile_or_a_failed_run_misses_the_latency_target():
    wl = suite.Workload
    workloads = [
        _result(wl("fixed-rate", 1, 100, 2_000), msg_per_s=2_000, latency_ms={"p50": 2, "p99": 11}),
        _result(wl("fixed-rate", 1, 1024, 2_000), ok=False),
    ]
    check = _by_name(
        suite.checks(workloads, rss_bound_mib=512, grow=None), "end-to-end latency at 2,000"
    )
    assert check["verdict"] == "MISS"
    assert [e["verdict"] for e in check["workloads"]] == ["MISS", "MISS"]


def test_rss_bound_holds_for_every_max_rate_and_backlog_workload_only():
    wl = suite.Workload
    workloads = [
        _result(wl("max-rate", 1, 100), msg_per_s=1, broker_rss_max_mib=300.0),
        _result(wl("backlog", 1, 100), msg_per_s=1, broker_rss_max_mib=200.0),
        # a fixed-rate workload is not under the bound
        _result(wl("fixed-rate", 1, 100, 2_000), msg_per_s=1, broker_rss_max_mib=900.0),
    ]
    check = _by_name(suite.checks(workloads, rss_bound_mib=512, grow=None), "broker RSS")
    assert check["verdict"] == "PASS"
    assert check["measured_max_mib"] == 300.0
    assert check["workload"] == "max-1p-100B"
    check = _by_name(suite.checks(workloads, rss_bound_mib=256, grow=None), "broker RSS")
    assert check["verdict"] == "MISS"


def test_unselected_parts_are_not_run():
    checks = suite.checks([], rss_bound_mib=512, grow=None)
    assert [c["verdict"] for c in checks] == ["NOT RUN"] * 7


def test_the_grow_verdict_reads_the_ratio():
    grow = {
        "ok": True,
        "payload_gb": 20.0,
        "ratio": suite.grow_ratio(_seconds(*[100.0] * 10, *[95.0] * 10)),
    }
    check = _by_name(suite.checks([], rss_bound_mib=512, grow=grow), "throughput does not fall")
    assert check["verdict"] == "PASS"
    assert check["measured_ratio"] == pytest.approx(0.95)
    grow = {"ok": False, "error": "not enough disk space", "ratio": {}}
    check = _by_name(suite.checks([], rss_bound_mib=512, grow=grow), "throughput does not fall")
    assert check["verdict"] == "MISS"
    assert check["why"] == "not enough disk space"


def _pulsar_pair(pulsar_msg_per_s: float, grpc_msg_per_s: float) -> list[dict[str, Any]]:
    wl = suite.Workload
    cost = {"ms_per_message": {"broker_bookies": 0.5, "broker": 0.2}, "messages_per_entry": 40.0}
    return [
        _result(wl("max-rate", 1, 100), msg_per_s=grpc_msg_per_s, latency_ms={"p50": 1.0}),
        _result(
            wl("max-rate", 1, 100, protocol="pulsar"),
            msg_per_s=pulsar_msg_per_s,
            latency_ms={"p50": 2.0, "p99": 3.0},
            cost=cost,
        ),
    ]


def test_the_pulsar_port_passes_at_80_percent_of_the_grpc_port_at_max_rate():
    check = _by_name(
        suite.checks(_pulsar_pair(80_000, 100_000), rss_bound_mib=512, grow=None), "Pulsar port"
    )
    assert check["verdict"] == "PASS"
    assert check["measured_ratio"] == pytest.approx(0.8)
    assert check["pair"] == ["pulsar-produce", "max-1p-100B"]
    assert (check["pulsar_msg_per_s"], check["grpc_msg_per_s"]) == (80_000, 100_000)
    check = _by_name(
        suite.checks(_pulsar_pair(79_999, 100_000), rss_bound_mib=512, grow=None), "Pulsar port"
    )
    assert check["verdict"] == "MISS"


def test_the_pulsar_ratio_is_taken_within_one_run_or_not_at_all():
    grpc, pulsar = _pulsar_pair(50_000, 100_000)
    check = _by_name(suite.checks([pulsar], rss_bound_mib=512, grow=None), "Pulsar port")
    assert check["verdict"] == "NOT RUN"
    assert "max-1p-100B did not run in this run" in check["why"]
    failed = {**pulsar, "ok": False}
    check = _by_name(suite.checks([grpc, failed], rss_bound_mib=512, grow=None), "Pulsar port")
    assert check["verdict"] == "MISS"
    assert check["why"] == "pulsar-produce failed"
    check = _by_name(suite.checks([grpc], rss_bound_mib=512, grow=None), "Pulsar port")
    assert check["verdict"] == "NOT RUN"


def test_pulsar_port_workloads_are_not_judged_by_the_grpc_targets():
    wl = suite.Workload
    workloads = [
        # far over the producer target, and far over the latency limits: neither counts
        _result(wl("max-rate", 1, 100, protocol="pulsar"), msg_per_s=900_000),
        _result(
            wl("fixed-rate", 1, 100, 2_000, protocol="pulsar"),
            msg_per_s=2_000,
            latency_ms={"p50": 50.0, "p99": 90.0},
        ),
        _result(
            wl("fixed-rate", 1, 100, 2_000), msg_per_s=2_000, latency_ms={"p50": 1.0, "p99": 2.0}
        ),
    ]
    checks = suite.checks(workloads, rss_bound_mib=512, grow=None)
    assert _by_name(checks, "one producer")["verdict"] == "NOT RUN"
    at_2k = _by_name(checks, "end-to-end latency at 2,000")
    assert at_2k["verdict"] == "PASS"
    assert [e["workload"] for e in at_2k["workloads"]] == ["rate2000-1p-100B"]
    # the broker's RSS bound holds under the Pulsar port's max rate too
    assert _by_name(checks, "broker RSS")["per_workload_mib"] == {"pulsar-produce": 100.0}


def test_pairs_give_both_sides_and_their_ratio():
    (pair,) = suite.pulsar_pairs(_pulsar_pair(25_000, 100_000))
    assert pair["pulsar"] == "pulsar-produce"
    assert pair["grpc"] == "max-1p-100B"
    assert pair["throughput_ratio"] == pytest.approx(0.25)
    assert pair["pulsar_figures"] == {
        "msg_per_s": 25_000,
        "client_cpu_pct": None,  # no phase measured
        "broker_cpu_pct": None,
        "latency_ms": {"p50": 2.0, "p99": 3.0},
        "api": None,
        "cpu_ms_per_message": 0.5,
        "broker_cpu_ms_per_message": 0.2,
        "messages_per_entry": 40.0,
    }
    assert pair["grpc_figures"]["latency_ms"] == {"p50": 1.0, "p99": None}
    assert pair["grpc_figures"]["cpu_ms_per_message"] is None


# --- CPU per message and per entry -------------------------------------------------------------


def _cpu(**overrides: Any) -> dict[str, Any]:
    cpu = {
        "measured_s": 10.0,
        "broker_pct": 50.0,  # 5 s of a core over the 10 s window
        "bookies_pct": 80.0,
        "stored_entries": 5000.0,
        "window": "first progress line to summary line",
    }
    return {**cpu, **overrides}


def test_cpu_per_message_is_the_window_cpu_over_perf_rate_times_the_window():
    cost = suite.cpu_cost(_cpu(), {"msg_per_s": 2000.0, "messages": 30_000}, "end-to-end")
    assert cost["messages"] == pytest.approx(20_000)
    assert cost["cpu_ms"] == pytest.approx(
        {"broker": 5000.0, "bookies": 8000.0, "broker_bookies": 13_000.0}
    )
    assert cost["ms_per_message"] == pytest.approx(
        {"broker": 0.25, "bookies": 0.4, "broker_bookies": 0.65}
    )
    assert cost["entries"] == 5000.0
    assert cost["messages_per_entry"] == pytest.approx(4.0)
    assert cost["ms_per_entry"] == pytest.approx(
        {"broker": 1.0, "bookies": 1.6, "broker_bookies": 2.6}
    )


def test_a_window_from_the_process_start_counts_every_message_perf_counted():
    cpu = _cpu(window="process start to summary line (no progress line before it)")
    cost = suite.cpu_cost(cpu, {"msg_per_s": 9999.0, "messages": 1000}, "produce")
    assert cost["messages"] == 1000
    assert cost["ms_per_message"]["broker_bookies"] == pytest.approx(13.0)


def test_a_drain_has_no_per_entry_figure_and_no_window_no_figures_at_all():
    cost = suite.cpu_cost(_cpu(stored_entries=3.0), {"msg_per_s": 1000.0}, "consume")
    assert cost["ms_per_message"]["broker"] == pytest.approx(0.5)
    assert cost["entries"] is None
    assert cost["ms_per_entry"] is None
    assert cost["messages_per_entry"] is None
    assert suite.cost_cell(cost) == "0.500 / 0.800 / 1.30"
    tiny = {"ms_per_message": {"broker": 0.00123, "bookies": 0.000456, "broker_bookies": 0.001686}}
    assert suite.cost_cell(tiny) == "0.00123 / 0.000456 / 0.00169"
    assert suite.cpu_cost({}, {"msg_per_s": 1.0}, "produce") == {}
    assert suite.cpu_cost(_cpu(), None, "produce") == {}
    nothing_sent = suite.cpu_cost(_cpu(), {"msg_per_s": 0.0}, "produce")
    assert nothing_sent["ms_per_message"] is None
    assert suite.cost_cell(nothing_sent) == "-"


# --- the report -------------------------------------------------------------------------------


def _raw() -> dict[str, Any]:
    latency = {"p50_us": 50.0, "p99_us": 900.0, "p999_us": 2000.0}
    return {
        "append_fdatasync_4k": {"ops_per_s": 8000.0, "latency": latency},
        "append_fdatasync_1m": {"mb_per_s": 700.0, "latency": latency},
        "append_fdatasync_4m": {"mb_per_s": 900.0, "latency": latency},
        "grpc_unary_round_trip": {"calls_per_s": 3000.0, "latency": latency},
    }


def test_a_run_with_a_failed_workload_renders_with_its_error(tmp_path):
    wl = suite.Workload
    summary = {
        "mode": "produce",
        "api": "send_async",
        "messages": 1000,
        "duration_s": 2.0,
        "msg_per_s": 500.0,
        "mb_per_s": 0.05,
        "latency_ms": {"p50": 1.0, "p95": 2.0, "p99": 3.0, "p99_9": 4.0, "max": 5.0},
    }
    rss = {"samples": 3, "max_mib": 100.0, "peak_mib": 101.0, "interval_s": 0.2, "last_mib": 99.0}
    good_phase = {
        "phase": "produce",
        "command": "perf produce",
        "ok": True,
        "summary": summary,
        "broker_rss": rss,
        "progress": [{"t_s": 1.0, "msg_per_s": 500, "mb_per_s": 0.05}],
        "cost": suite.cpu_cost(_cpu(), {"msg_per_s": 2000.0}, "produce"),
    }
    bad_phase = {
        "phase": "end-to-end",
        "command": "perf end-to-end",
        "ok": False,
        "summary": None,
        "broker_rss": rss,
        "error": "perf exited with 1",
        "stderr_tail": "boom",
    }
    workloads = [
        _result(
            wl("max-rate", 1, 100),
            msg_per_s=500.0,
            latency_ms=summary["latency_ms"],
            phases=[good_phase],
            api="send_async",
        ),
        _result(
            wl("fixed-rate", 1, 100, 2_000),
            ok=False,
            error="end-to-end: perf exited with 1",
            phases=[bad_phase],
            broker_log_tail="broker said no",
        ),
    ]
    results = {
        **run_head("suite.py"),
        "quick": True,
        "parameters": {
            "bookies": 3,
            "broker_args": ["--x"],
            "quorum": "E3/Qw2/Qa2",
            "duration_s": 2.0,
            "backlog_messages": 100,
            "rss_bound_mib": 512,
        },
        "raw_limits": {"start": _raw(), "end": _raw()},
        "workloads": workloads,
        "grow": None,
    }
    results["checks"] = suite.checks(workloads, rss_bound_mib=512, grow=None)
    text = suite.render_markdown(results)
    assert "# Benchmark suite, 2026-01-01 (test)" in text
    assert "**PASS** one producer" not in text  # 500 msg/s
    assert "**MISS** one producer" in text
    assert "(max-1p-100B, `send_async`, 0.1% of the target)" in text
    assert "| max rate, 1 partition, 100 B, `send_async` |" in text
    assert "| client calls | `send_async` | |" in text
    assert "perf exited with 1" in text
    assert "boom" in text
    assert "broker said no" in text
    assert "suite-2026-01-01-test-throughput.png" in text
    header = next(line for line in text.splitlines() if line.startswith("| workload | msg/s"))
    raw_row = next(line for line in text.splitlines() if line.startswith("| *raw limit"))
    assert raw_row.count("|") == header.count("|")
    assert "CPU ms per message: broker / bookies / both (per entry)" in header
    row = next(line for line in text.splitlines() if line.startswith("| max rate, 1 partition"))
    assert row.count("|") == header.count("|")
    assert "| 0.250 / 0.400 / 0.650 (1.00 / 1.60 / 2.60) |" in row
    failed_row = next(line for line in text.splitlines() if "FAILED (below)" in line)
    assert failed_row.count("|") == header.count("|")
    assert (
        "| CPU ms per message: broker / bookies / broker + bookies (per entry) |"
        " 0.250 / 0.400 / 0.650 (1.00 / 1.60 / 2.60) | 4.0 messages per entry |"
    ) in text
    paths = suite.write_plots(results, tmp_path)
    assert [p.name for p in paths] == [
        "suite-2026-01-01-test-throughput.png",
        "suite-2026-01-01-test-latency.png",
    ]
    assert all(p.stat().st_size > 0 for p in paths)


def test_the_report_sets_the_pulsar_port_beside_the_grpc_port_with_the_load_average():
    wl = suite.Workload
    latency = {"p50": 1.0, "p95": 2.0, "p99": 3.0, "p99_9": 4.0, "max": 5.0}
    rss = {"samples": 3, "max_mib": 100.0, "peak_mib": 101.0, "interval_s": 0.2, "last_mib": 99.0}

    def phase(api: str, msg_per_s: float) -> dict[str, Any]:
        summary = {
            "mode": "produce",
            "api": api,
            "messages": 1000,
            "duration_s": 2.0,
            "msg_per_s": msg_per_s,
            "mb_per_s": 0.1,
            "latency_ms": latency,
        }
        cost = suite.cpu_cost(_cpu(), {"msg_per_s": 2000.0}, "produce")
        cpu = {
            "perf_pct": 91.4,
            "perf_event_loop_pct": 26.0,
            "broker_pct": 15.0,
            "broker_busiest_thread": {"broker-0": ["main", 14.0]},
            "bookies_pct": 5.0,
            "etcd_pct": 1.0,
            "machine_busy_pct": 150.0,
            "other_pct": 37.6,
            "machine_steal_pct": 0.0,
        }
        measured = {"cpu": cpu, "limits": ["none"]} if "pulsar" in api else {}
        return {"phase": "produce", "command": api, "ok": True, "summary": summary,
                "broker_rss": rss, "progress": [], "cost": cost, **measured}  # fmt: skip

    workloads = []
    pair = ((wl("max-rate", 1, 100), 100_000), (wl("max-rate", 1, 100, protocol="pulsar"), 25_000))
    for w, msg_per_s in pair:
        p = phase(w.api, msg_per_s)
        workloads.append(
            _result(w, msg_per_s=msg_per_s, latency_ms=latency, phases=[p], api=w.api,
                    cost=p["cost"], loadavg_before=[3.0, 2.0, 1.0], loadavg_after=[4.5, 2.0, 1.0])
        )  # fmt: skip
    results = {
        **run_head("suite.py"),
        "quick": True,
        "parameters": {
            "bookies": 3,
            "broker_args": ["--x"],
            "quorum": "E3/Qw2/Qa2",
            "duration_s": 2.0,
            "backlog_messages": 100,
            "rss_bound_mib": 512,
            "pulsar_client": "3.13.0",
        },
        "raw_limits": {"start": _raw(), "end": _raw()},
        "loadavg": {"start": [1.0, 2.0, 3.0], "end": [6.25, 5.0, 4.0]},
        "workloads": workloads,
        "grow": None,
    }
    results["checks"] = suite.checks(workloads, rss_bound_mib=512, grow=None)
    text = suite.render_markdown(results)
    assert "Load average (1 / 5 / 15 min): start 1.0 / 2.0 / 3.0; end 6.2 / 5.0 / 4.0." in text
    assert (
        "- **MISS** Pulsar port at max rate (pulsar-client) >= 80% of the gRPC port's"
        " (Magnetar's client), send_async per message, 100 B, 1 partition, same run: **25.0%**"
        " (25,000 msg/s (pulsar-produce) against 100,000 msg/s (max-1p-100B))."
    ) in text
    assert "## Pulsar port beside the gRPC port" in text
    assert "`pulsar-client` 3.13.0" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| workload | gRPC msg/s"))
    row = next(line for line in lines if line.startswith("| pulsar-produce / max-1p-100B"))
    assert row.count("|") == header.count("|")
    cells = [cell.strip() for cell in row.split("|")[2:-1]]
    assert cells == [
        "100,000",
        "25,000",
        "**25.0%**",
        "1.00 / 3.00 ms",
        "1.00 / 3.00 ms",
        "0.650",
        "0.650",
        "4.0",
        "4.0",
        "- / -",
        "91% / 15%",
        "3.0 -> 4.5",
        "3.0 -> 4.5",
    ]
    # both rows of the summary table carry the Pulsar / gRPC verdict
    summary_rows = [line for line in lines if line.startswith("| max rate, 1 partition, 100 B")]
    assert len(summary_rows) == 2
    assert "Pulsar port (pulsar-client), `pulsar-client send_async` |" in summary_rows[1]
    assert summary_rows[0].endswith("| MISS MISS (Pulsar / gRPC) |")  # and the producer target
    assert summary_rows[1].endswith("| MISS (Pulsar / gRPC) |")
