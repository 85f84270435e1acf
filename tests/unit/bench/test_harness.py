"""The pure parts of ``bench/harness.py`` (the benchmarks' shared measurement and report code),
and ``PerfOutput`` reading a real child process that prints as ``magnetar perf`` does."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

# The benchmarks are scripts that import each other as top-level modules (``python
# bench/suite.py`` puts bench/ on the path), so the test does the same.
_BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(_BENCH) not in sys.path:
    sys.path.insert(0, str(_BENCH))
harness: Any = importlib.import_module("harness")


def test_percentiles_are_nearest_rank_and_the_summary_is_in_microseconds():
    values = [float(v) for v in range(1, 101)]
    assert harness.percentile(values, 50) == 50.0
    assert harness.percentile(values, 99) == 99.0
    assert harness.percentile(values, 99.9) == 100.0
    assert harness.percentile([7.0], 1) == 7.0
    summary = harness.latency_summary([0.003, 0.001, 0.002])
    assert summary["samples"] == 3
    assert summary["p50_us"] == pytest.approx(2000)
    assert summary["max_us"] == pytest.approx(3000)
    assert summary["mean_us"] == pytest.approx(2000)
    empty = harness.latency_summary([])
    assert empty["samples"] == 0
    assert empty["p50_us"] != empty["p50_us"]  # NaN: nothing to rest on


def test_a_spread_skips_missing_values_and_its_cell_shows_median_and_range():
    assert harness.spread([3.0, None, 1.0, 2.0]) == {"n": 3, "median": 2.0, "min": 1.0, "max": 3.0}
    assert harness.spread_cell(harness.spread([3.0, 1.0, 2.0])) == "2 (1-3)"
    assert harness.spread_cell(harness.spread([1234.5])) == "1,234"
    assert harness.spread_cell(harness.spread([None])) == "-"
    assert harness.spread_cell(None) == "-"


def test_sizes_and_optional_figures_read_as_the_reports_print_them():
    assert [harness.size_name(n) for n in (100, 1024, 65536, 4 * 2**20)] == [
        "100 B",
        "1 KiB",
        "64 KiB",
        "4 MiB",
    ]
    assert harness.ms(1500.0) == "1.50 ms"
    assert harness.opt(None) == "-"
    assert harness.opt(2.5, ".1f") == "2.5"


def _raw(ops: float) -> dict[str, Any]:
    return {
        "append_fdatasync_4k": {"ops_per_s": ops, "latency": {"p50_us": 900.0}},
        "grpc_unary_round_trip": {"latency": {"p50_us": 250.0}},
    }


def test_the_raw_limits_table_shows_start_and_end_and_a_dash_for_what_is_missing():
    results = {"raw_limits": {"start": _raw(1000.0), "end": _raw(1500.0)}}
    assert harness.raw_pair(results, "append_fdatasync_4k", "latency.p50_us") == "900 / 900"
    assert harness.raw_pair(results, "append_fdatasync_1m", "mb_per_s") == "- / -"
    two = harness.raw_limits_table(results, (harness.RAW_4K_OPS, harness.RAW_RTT_P50))
    assert two[0] == "## Raw limits of this machine (same run)"
    assert "| 4 KiB append + fdatasync | 1,000 ops/s | 1,500 ops/s |" in two
    one = harness.raw_limits_table(results, (harness.RAW_4K_OPS,), one_column=True)
    assert one[-1] == "| 4 KiB append + fdatasync | 1,000 / 1,500 ops/s |"


def _results() -> dict[str, Any]:
    return {
        "command": "bench/x.py --quick",
        "started_at": "2026-11-28T00:00:00+00:00",
        "elapsed_s": 12.0,
        "machine": {
            "cpu_count": 2,
            "cpu_model": "cpu",
            "memory_bytes": 4 * 2**30,
            "kernel": "6.1",
            "python": "3.11.9",
            "grpcio": "1.72.1",
            "git_commit": "0123456789abcdef",
            "git_dirty": False,
            "filesystem": {
                "device": "/dev/sda1",
                "type": "ext4",
                "mount_point": "/",
                "free_bytes": 50e9,
                "total_bytes": 100e9,
            },
        },
    }


def test_the_preamble_speaks_of_raw_limits_only_where_they_were_measured():
    with_raw = harness.report_preamble(_results())
    without = harness.report_preamble(_results(), raw_limits=False)
    assert with_raw[:3] == without[:3]
    assert with_raw[0] == "Command: `bench/x.py --quick`  "
    assert without[-1] == "Data file system: /dev/sda1 (ext4) on /, 50 GB free of 100 GB."
    raw_text = " Raw limits and bookie data are in the same directory tree."
    assert with_raw[-1] == without[-1] + raw_text


def test_the_failed_runs_section_lists_only_failed_runs_with_their_tails():
    runs = [
        {"ok": True, "name": "a"},
        {"ok": False, "name": "b", "error": "boom", "stderr_tail": "err", "server_log_tail": "log"},
    ]
    lines = harness.failed_runs_section(runs, lambda r: f"run {r['name']}")
    assert lines[:3] == ["## Failed runs", "", "- run b: boom"]
    assert "err" in lines
    assert "log" in lines
    assert harness.failed_runs_section(runs[:1], lambda r: r["name"]) == []


# A child that prints what perf prints: progress lines on stderr (the first in the warm-up),
# other lines on both streams, and its JSON summary on stdout.
_CHILD = """
import json, sys
def progress(t, rate, warmup):
    print(json.dumps({"progress": True, "t_s": t, "msg_per_s": rate, "warmup": warmup}),
          file=sys.stderr, flush=True)
progress(1.0, 10, True)
print("a stray line", file=sys.stderr, flush=True)
progress(2.0, 20, False)
progress(3.0, 30, False)
print("not json", flush=True)
print(json.dumps({"mode": "produce", "msg_per_s": 25, "errors": 2}), flush=True)
"""


def test_perf_output_reads_both_streams_and_snapshots_the_measured_window():
    async def main() -> Any:
        process = await harness.spawn_piped(sys.executable, "-c", _CHILD)
        snaps: list[int] = []

        async def snap() -> int:
            # which progress line the snapshot came after
            snaps.append(len(out.progress))
            return snaps[-1]

        seen: list[dict[str, Any]] = []
        out = harness.PerfOutput(snap, tail_lines=5, started=0.0, on_progress=seen.append)
        await asyncio.wait_for(out.read(process), 60)
        assert await process.wait() == 0
        return out, seen, snaps

    out, seen, snaps = asyncio.run(main())
    assert [p["t_s"] for p in out.progress] == [1.0, 2.0, 3.0]
    assert seen == out.progress
    assert all("at_s" in p for p in out.progress)  # stamped, since ``started`` was given
    assert out.summary == {"mode": "produce", "msg_per_s": 25, "errors": 2}
    assert list(out.stderr_tail) == ["a stray line"]
    assert list(out.stdout_other) == ["not json"]
    # the window opens at the first progress line after the warm-up (the second line), and
    # closes at the summary (after the third)
    assert out.first == 2
    assert out.last == 3
    assert snaps == [2, 3]
    assert harness.summary_errors(out.summary, "perf") == ["2 messages failed"]
    assert harness.summary_errors(None, "perf") == ["perf printed no summary"]
    assert json.loads(json.dumps(out.progress))  # the results file takes them as they are
