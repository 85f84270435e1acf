"""The pure parts of ``bench/client_bench.py``: the patterns and their labels, the order of the
rounds, the per-round ratios against the best batch call, the verdicts, and the report."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.bench.machine import fake_machine

# The benchmarks are scripts that import each other as top-level modules (``python
# bench/client_bench.py`` puts bench/ on the path), so the test does the same.
_BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(_BENCH) not in sys.path:
    sys.path.insert(0, str(_BENCH))
cb: Any = importlib.import_module("client_bench")


def test_every_pattern_names_its_call_and_every_ratio_names_patterns_that_exist():
    keys = [p.key for p in cb.PATTERNS]
    assert len(keys) == len(set(keys))
    assert all(p.call for p in cb.PATTERNS)
    for ratio in cb.RATIOS:
        assert ratio.numerator in cb.PATTERN_BY_KEY
        assert not cb.PATTERN_BY_KEY[ratio.numerator].batch or ratio.target is None
        for key in ratio.denominators:
            assert cb.PATTERN_BY_KEY[key].batch  # measured against batch calls only
    # every per-message send or receive call is held to the ratio
    targeted = {r.numerator for r in cb.RATIOS if r.target == cb.PER_MESSAGE_MIN_RATIO}
    per_message = {
        p.key
        for p in cb.PATTERNS
        if not p.batch and p.direction in (cb.SEND, cb.RECEIVE) and p.client != cb.REDIS
    }
    assert targeted == per_message


def test_every_round_runs_every_pattern_once_and_no_pattern_always_goes_first():
    patterns = list(cb.PATTERNS)
    rounds = [cb.round_order(patterns, r) for r in range(len(patterns))]
    for order in rounds:
        assert sorted(p.key for p in order) == sorted(p.key for p in patterns)
    assert {order[0].key for order in rounds} == {p.key for p in patterns}
    assert cb.round_order([], 3) == []


def _run(
    pattern: str, round_index: int, msg_per_s: float = 0.0, *, ok: bool = True
) -> dict[str, Any]:
    return {"pattern": pattern, "round": round_index, "ok": ok, "msg_per_s": msg_per_s}


def test_a_ratio_is_over_the_best_batch_call_of_the_same_round():
    runs = [
        _run("sync-send-async", 0, 40.0),
        _run("sync-send-many", 0, 80.0),
        _run("aio-send-many-async", 0, 100.0),  # the best of round 0
        # the machine slowed down in round 1: every pattern alike
        _run("sync-send-async", 1, 30.0),
        _run("sync-send-many", 1, 60.0),  # the best of round 1: the other failed
        _run("aio-send-many-async", 1, ok=False),
        _run("sync-send-async", 2, 50.0),  # no batch call in round 2: left out
    ]
    (entry,) = [r for r in cb.ratios(runs, 3) if r["key"] == "sync-send-async/send-many"]
    assert entry["per_round"] == [pytest.approx(0.4), pytest.approx(0.5)]
    assert entry["best_denominator_per_round"] == ["aio-send-many-async", "sync-send-many"]
    assert entry["median"] == pytest.approx(0.45)
    assert entry["rounds_meeting"] == 2
    assert entry["verdict"] == "PASS"


def test_verdicts_fail_below_the_target_and_say_when_nothing_was_measured():
    runs = [_run("aio-receive-ack", r, 10.0) for r in range(3)]
    runs += [_run("aio-batch-receive-ack", r, 100.0) for r in range(3)]
    runs += [_run("sync-send-async", 0, 2_000.0), _run("redis-xadd", 0, 1_000.0)]
    skipped = {"sync-listener": "no message_listener yet"}
    by_key = {r["key"]: r for r in cb.ratios(runs, 3, skipped)}
    receive = by_key["aio-receive-ack/batch-drain"]
    assert receive["verdict"] == "FAIL"
    assert receive["median"] == pytest.approx(0.1)
    assert receive["rounds_meeting"] == 0
    redis = by_key["sync-send-async/redis"]
    assert redis["verdict"] == "FAIL"  # 2x, not 10x
    assert redis["median"] == pytest.approx(2.0)
    listener = by_key["sync-listener/batch-drain"]
    assert listener["verdict"] == "NOT RUN"
    assert listener["why"] == "sync-listener not measured: no message_listener yet"
    assert by_key["send-many/redis"]["verdict"] == "NOT RUN"
    assert by_key["send-many/redis"]["why"] == "no round measured both sides"


def test_the_summary_is_the_median_of_the_rounds_and_counts_failures():
    runs = [_run("sync-send-many", r, v) for r, v in enumerate((3.0, 1.0, 2.0))]
    runs.append(_run("sync-send-many", 3, ok=False))
    figures = cb.summarize(runs)["sync-send-many"]
    assert (figures["runs"], figures["ok_runs"]) == (4, 3)
    assert figures["msg_per_s"] == {"n": 3, "median": 2.0, "min": 1.0, "max": 3.0}
    assert cb.spread([]) == {"n": 0, "median": None, "min": None, "max": None}


def test_quick_mode_shortens_everything_and_tags_its_files():
    args = cb.parse_args(["--quick"])
    assert (args.rounds, args.messages, args.tag) == (2, 20_000, "quick")
    assert cb.parse_args([]).messages == 200_000
    with pytest.raises(SystemExit):
        cb.parse_args(["--only", "no-such-pattern"])
    with pytest.raises(SystemExit):
        cb.parse_args(["--messages", "0"])


def _results() -> dict[str, Any]:
    runs = []
    for r in range(2):
        for pattern in cb.PATTERNS:
            run = _run(pattern.key, r, 1_000.0 * (r + 1))
            run.update(
                client_us_per_msg=10.0,
                server_us_per_msg=5.0,
                client_cpu_pct=90.0,
                server_cpu_pct=50.0,
                machine_busy_pct=150.0,
                others_pct=10.0,
            )
            if pattern.key == "sync-send":
                run["latency_ms"] = {"p50": 2.0, "p99": 9.0, "max": 12.0, "mean": 2.5}
            runs.append(run)
    runs.append(
        {
            "pattern": "sync-listener",
            "round": 1,
            "ok": False,
            "error": "the worker exited with 1",
            "stderr_tail": "boom",
            "server_log_tail": "standalone said no",
        }
    )
    return {
        "date": "2026-01-01",
        "tag": "test",
        "command": "bench/client_bench.py --tag test",
        "started_at": "2026-01-01T00:00:00+00:00",
        "elapsed_s": 10.0,
        "machine": fake_machine(),
        "parameters": {
            "rounds": 2,
            "messages": 1000,
            "message_bytes": 100,
            "send_count": 100,
            "send_warmup": 10,
            "receiver_queue_size": 10_000,
            "tune_gc": False,
        },
        "redis": {"available": False, "note": "Redis skipped: --no-redis"},
        "skipped": {"redis-xadd": "Redis skipped: --no-redis"},
        "runs": runs,
    }


def test_the_report_labels_every_figure_with_its_call_and_shows_failures():
    results = _results()
    results["summary"] = cb.summarize(results["runs"])
    results["ratios"] = cb.ratios(results["runs"], 2)
    text = cb.render_markdown(results)
    assert "# Client calls benchmark, 2026-01-01 (test)" in text
    for pattern in cb.PATTERNS:
        assert f"`{pattern.call}`" in text
    # every pattern ran at the same rate: each per-message ratio is 1.0
    assert "**PASS** sync send_async loop / best send_many >= 0.4: **1.000**" in text
    assert "**FAIL** moonshot" in text
    assert "redis-xadd: Redis skipped: --no-redis" in text
    assert "latency p50 2.00 (2.00-2.00) ms" in text
    assert "boom" in text
    assert "standalone said no" in text
