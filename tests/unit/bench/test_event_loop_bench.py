"""The pure parts of ``bench/event_loop_bench.py``: the order of the loops per round, the figures
taken from a workload's result, their spread per loop, uvloop's ratio and the report."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.bench.fake_results import run_head

_BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(_BENCH) not in sys.path:
    sys.path.insert(0, str(_BENCH))
elb: Any = importlib.import_module("event_loop_bench")


def _result(key: str, loop: str, round_index: int, rate: float, p50: float, cpu: float | None):
    cost = {"ms_per_message": {"broker_bookies": cpu}} if cpu is not None else None
    result = {
        "key": key,
        "ok": True,
        "msg_per_s": rate,
        "latency_ms": {"p50": p50, "p99": 4 * p50},
        "cost": cost,
    }
    return {"round": round_index, "loop": loop, **result, "figures": elb.figures(result)}


def test_the_loops_alternate_which_goes_first():
    assert [elb.round_order(r) for r in range(3)] == [
        ("asyncio", "uvloop"),
        ("uvloop", "asyncio"),
        ("asyncio", "uvloop"),
    ]


def test_the_workloads_are_the_suites_own():
    assert [w.key for w in elb.workloads()] == list(elb.KEYS)
    assert [w.rate for w in elb.workloads()] == [2_000, 50_000, 0]


def test_a_failed_workload_has_no_figures_and_no_cost_is_none():
    assert elb.figures({"ok": False, "error": "x"}) == dict.fromkeys(elb.FIGURES)
    figures = elb.figures(
        {"ok": True, "msg_per_s": 10.0, "latency_ms": {"p50": 1.0, "p99": 2.0}, "cost": None}
    )
    assert figures == {"msg_per_s": 10.0, "p50_ms": 1.0, "p99_ms": 2.0, "cpu_ms_per_msg": None}


def _runs() -> list[dict[str, Any]]:
    runs = []
    for key in elb.KEYS:
        for r, (a, u) in enumerate([(2.0, 1.0), (4.0, 3.0), (3.0, 2.0)]):
            runs.append(_result(key, "asyncio", r, 1000.0, a, 0.5))
            runs.append(_result(key, "uvloop", r, 900.0, u, 0.4))
    return runs


def test_summary_spreads_each_loop_over_the_rounds_and_ratio_compares_medians():
    summary = elb.summarize(_runs())
    rate = summary["rate2000-1p-100B"]
    assert rate["asyncio"]["p50_ms"] == {"n": 3, "median": 3.0, "min": 2.0, "max": 4.0}
    assert rate["uvloop"]["p50_ms"] == {"n": 3, "median": 2.0, "min": 1.0, "max": 3.0}
    assert elb.ratio(rate, "p50_ms") == pytest.approx(2 / 3)
    assert elb.ratio(rate, "msg_per_s") == pytest.approx(0.9)
    assert elb.ratio(rate, "cpu_ms_per_msg") == pytest.approx(0.8)


def test_no_ratio_without_both_figures():
    runs = [r for r in _runs() if r["loop"] == "asyncio"]
    assert elb.ratio(elb.summarize(runs)["max-1p-100B"], "p50_ms") is None


def test_the_report_gives_each_loop_and_the_ratio_and_names_failed_runs():
    runs = _runs()
    runs.append(
        {
            "round": 1,
            "loop": "uvloop",
            "key": "max-1p-100B",
            "ok": False,
            "error": "perf exited 1",
            "figures": elb.figures({"ok": False}),
        }
    )
    results = {
        **run_head("event_loop_bench.py"),
        "quick": False,
        "parameters": {"rounds": 3, "duration_s": 10.0, "warmup_s": 1.0, "bookies": 3},
        "runs": runs,
        "summary": elb.summarize(runs),
    }
    report = elb.render_markdown(results)
    assert "| rate2000-1p-100B | asyncio | 1,000 (1,000-1,000) | 3.00 (2.00-4.00) |" in report
    assert "| rate2000-1p-100B | uvloop / asyncio | 0.90x | 0.67x | 0.67x | 0.80x |" in report
    assert "- round 2, uvloop, max-1p-100B: perf exited 1" in report


def test_arguments(capsys):
    args = elb.parse_args(["--quick"])
    assert (args.rounds, args.duration_s, args.tag) == (1, 4.0, None)
    with pytest.raises(SystemExit):
        elb.parse_args(["--rounds", "0"])
    assert "--rounds must be >= 1" in capsys.readouterr().err
