"""The pure parts of ``bench/batching_bench.py``: its variants, their order, the medians over
rounds, and the report."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.bench.fake_results import run_head

_BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(_BENCH) not in sys.path:
    sys.path.insert(0, str(_BENCH))
batching: Any = importlib.import_module("batching_bench")


def test_variants_are_a_mode_and_a_delay_and_anything_else_is_named():
    assert batching.parse_variant("on:5") == ("on", 5.0)
    assert batching.parse_variant("off:1") == ("off", 1.0)
    for bad in ("maybe:1", "on", "on:-1", "on:soon"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            batching.parse_variant(bad)
    assert batching.variant_name(("on", 5.0)) == "on, 5 ms"
    assert (batching.rate_name(2000), batching.rate_name(0)) == ("2,000 msg/s", "max rate")


def test_the_order_of_the_variants_turns_round_every_other_round():
    variants = [("off", 1.0), ("on", 1.0), ("on", 5.0)]
    assert batching.run_order(variants, 1) == variants
    assert batching.run_order(variants, 2) == variants[::-1]
    args = batching.parse_args(["--quick"])
    assert (args.rounds, args.tag) == (1, "quick")
    names = [batching.variant_name(v) for v in args.variants]
    assert names == ["off, 1 ms", "on, 1 ms", "on, 5 ms"]


def _run(round_: int, variant: str, p50: float, broker_ms: float) -> dict[str, Any]:
    per = {"broker": broker_ms, "bookies": 1.0, "broker_bookies": 1 + broker_ms}
    return {
        "round": round_,
        "rate": 100,
        "variant": variant,
        "ok": True,
        "summary": {
            "msg_per_s": 100.0,
            "latency_ms": {"p50": p50, "p95": p50, "p99": 2 * p50, "p99_9": 3 * p50, "max": 9.0},
            "publish_latency_ms": {"p50": p50 / 2},
        },
        "cost": {"messages_per_entry": 1.0, "ms_per_message": per, "ms_per_entry": per},
        "cpu": {"stored_entries_per_s": 100.0, "perf_pct": 10.0, "machine_busy_pct": 50.0},
        "loadavg_before": [1.0, 1.0, 1.0],
        "loadavg_after": [1.5, 1.0, 1.0],
    }


def test_the_summary_is_the_median_of_each_figure_per_rate_and_variant_and_renders():
    runs = [
        _run(1, "off, 1 ms", 4.0, 0.5),
        _run(2, "off, 1 ms", 6.0, 0.7),
        _run(3, "off, 1 ms", 5.0, 0.9),
        _run(1, "on, 1 ms", 3.0, 0.4),
        {"round": 2, "rate": 100, "variant": "on, 1 ms", "ok": False, "error": "boom"},
    ]
    summary = batching.summarise(runs, ["off, 1 ms", "on, 1 ms"])
    off, on = summary
    assert (off["variant"], off["rounds"]) == ("off, 1 ms", 3)
    assert off["median"]["p50_ms"] == 5.0
    assert off["median"]["broker_ms_per_message"] == pytest.approx(0.7)
    assert off["each"]["p50_ms"] == [4.0, 6.0, 5.0]
    assert (on["rounds"], on["median"]["p99_ms"]) == (1, 6.0)
    results = {
        **run_head("batching_bench.py"),
        "parameters": {
            "bookies": 3,
            "brokers": 1,
            "quorum": "E3/Qw2/Qa2",
            "size": 100,
            "warmup_s": 1.0,
            "duration_s": 3.0,
            "rounds": 3,
            "variants": ["off, 1 ms", "on, 1 ms"],
        },
        "runs": runs,
        "summary": summary,
    }
    text = batching.render_markdown(results)
    lines = text.splitlines()
    median_header = next(line for line in lines if line.startswith("| rate |"))
    median_off = next(line for line in lines if line.startswith("| 100 msg/s | off, 1 ms | 3 |"))
    assert median_off.count("|") == median_header.count("|")
    assert "| 5.00 | 10.00 | 15.00 |" in median_off
    runs_header = next(line for line in lines if line.startswith("| round |"))
    failed = next(line for line in lines if "FAILED" in line)
    assert "boom" in failed
    assert failed.count("|") == runs_header.count("|")
    first = next(line for line in lines if line.startswith("| 1 | 100 msg/s | off, 1 ms"))
    assert first.count("|") == runs_header.count("|")
    assert "[1.0, 1.0, 1.0] -> [1.5, 1.0, 1.0]" in first
