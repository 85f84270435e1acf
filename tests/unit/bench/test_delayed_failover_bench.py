"""The report of ``bench/delayed_failover_bench.py``: a wait for the delayed messages to be held
aside again that ran out shows how many were held, and the arguments' limits."""

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
dfb: Any = importlib.import_module("delayed_failover_bench")


def _run(index: bool, kill_held_s: float | None) -> dict[str, Any]:
    sub = {"delayed_entries_loaded": 10_000 if index else 0}
    return {
        "index": index,
        "delayed": 10_000,
        "fill_s": 42.0,
        "unload_probe_s": 1.5,
        "unload_held_s": 2.25,
        "unload_held": 10_000,
        "after_unload": sub,
        "kill_probe_s": 3.0,
        "kill_held_s": kill_held_s,
        "kill_held": 10_000 if kill_held_s is not None else 4_321,
        "after_kill": sub,
    }


def test_a_wait_that_ran_out_reports_how_many_were_held():
    runs = [_run(True, 3.5), _run(False, None)]
    results = {**run_head("delayed_failover_bench.py"), "runs": runs}
    report = dfb.render_markdown(results)
    assert "| on | 10,000 | 42 | unload | 1.50 | 2.25 | 10,000 |" in report
    assert "| on | 10,000 | 42 | SIGKILL | 3.00 | 3.50 | 10,000 |" in report
    ran_out = "not all (held 4,321 at the timeout)"
    assert f"| off | 10,000 | 42 | SIGKILL | 3.00 | {ran_out} | 0 |" in report
    runs[1]["kill_held"] = None  # the stats never answered in the wait
    report = dfb.render_markdown(results)
    silent = "not known (its stats did not answer before the timeout)"
    assert f"| off | 10,000 | 42 | SIGKILL | 3.00 | {silent} | 0 |" in report


def test_quick_caps_the_delayed_messages_and_a_bad_count_is_refused(capsys):
    args = dfb.parse_args(["--quick", "--delayed", "50000"])
    assert (args.delayed, args.tag, args.held_timeout) == (10_000, "quick", 300.0)
    with pytest.raises(SystemExit):
        dfb.parse_args(["--delayed", "0"])
    assert "--delayed and --window must be >= 1" in capsys.readouterr().err
