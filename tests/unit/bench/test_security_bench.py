"""The pure parts of ``bench/security_bench.py``: the order of the rounds, the perf arguments of a
run, the per-round ratios and differences, the targets' verdicts, and the report."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from magnetar import perf

# The benchmarks are scripts that import each other as top-level modules (``python
# bench/security_bench.py`` puts bench/ on the path), so the test does the same.
_BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(_BENCH) not in sys.path:
    sys.path.insert(0, str(_BENCH))
sb: Any = importlib.import_module("security_bench")

PRODUCE, PER_MESSAGE, E2E = "produce", "produce-per-message", "e2e-2000"


# --- variants, rounds and perf arguments --------------------------------------------------------


def test_every_round_runs_every_variant_once_and_no_variant_always_goes_first():
    rounds = [sb.round_order(r) for r in range(len(sb.VARIANTS))]
    for order in rounds:
        assert sorted(v.key for v in order) == sorted(v.key for v in sb.VARIANTS)
    assert {order[0].key for order in rounds} == {v.key for v in sb.VARIANTS}


def test_the_pairs_compare_one_thing_at_a_time():
    variants = sb.VARIANT_BY_KEY
    for base, other in sb.TLS_PAIRS:
        assert variants[base].auth == variants[other].auth  # the same server
        assert (variants[base].tls, variants[other].tls) == (False, True)
    for base, other in sb.AUTH_PAIRS:
        assert variants[base].tls == variants[other].tls  # the same transport
        assert (variants[base].auth, variants[other].auth) == (False, True)
        assert variants[base].server != variants[other].server


def _parse(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="magnetar")
    perf.add_perf_command(parser.add_subparsers(dest="command"))
    return parser.parse_args(["perf", *args])


def test_perf_arguments_are_the_suites_workloads_and_parse_with_perfs_own_parser():
    topic = sb.topic_name(sb.WORKLOAD_BY_KEY[PRODUCE], sb.VARIANT_BY_KEY["tls"], 3)
    assert topic == "bench/security/produce-tls-r3"
    produce = _parse(
        sb.perf_args(
            sb.WORKLOAD_BY_KEY[PRODUCE], topic, "magnetar+ssl://h:1", duration_s=5, warmup_s=1
        )
    )
    assert (produce.perf_mode, produce.rate, produce.size) == ("produce", 0, 100)
    assert (produce.duration, produce.warmup_s) == (5, 1)
    assert produce.batch_api  # send_many_async runs, as when that was perf's default
    assert produce.json
    assert produce.json_progress
    assert produce.service_url == "magnetar+ssl://h:1"
    per_message = _parse(
        sb.perf_args(sb.WORKLOAD_BY_KEY[PER_MESSAGE], topic, "u", duration_s=4, warmup_s=0)
    )
    assert not per_message.batch_api
    assert per_message.warmup_s == 0
    e2e = _parse(sb.perf_args(sb.WORKLOAD_BY_KEY[E2E], topic, "u", duration_s=8, warmup_s=1))
    assert (e2e.perf_mode, e2e.rate) == ("end-to-end", 2000)
    assert e2e.batch_api


def test_help_renders(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        sb.parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "--quiet-pct" in capsys.readouterr().out


def test_quick_mode_shortens_everything_and_tags_its_files():
    args = sb.parse_args(["--quick"])
    assert args.rounds == 2
    assert args.tag == "quick"
    assert max(args.produce_s, args.per_message_s, args.e2e_s) <= 3
    with pytest.raises(SystemExit):
        sb.parse_args(["--rounds", "0"])


# --- figures ------------------------------------------------------------------------------------


def test_cpu_is_per_cent_of_a_core_and_others_is_what_the_benchmark_did_not_use():
    before = sb.Cpu(
        10.0, server=1.0, server_parts={"broker-0": 0.4}, other_server=0.5, client=2.0,
        harness=1.0, machine_busy=100.0, machine_steal=0.0,
    )  # fmt: skip
    after = sb.Cpu(
        12.0, server=2.5, server_parts={"broker-0": 1.4}, other_server=0.5, client=2.5,
        harness=1.2, machine_busy=103.6, machine_steal=0.1,
    )  # fmt: skip
    cpu = sb.cpu_between(before, after)
    assert cpu["server_pct"] == pytest.approx(75.0)
    assert cpu["client_pct"] == pytest.approx(25.0)
    assert cpu["machine_busy_pct"] == pytest.approx(180.0)
    assert cpu["harness_pct"] == pytest.approx(10.0)
    assert cpu["others_pct"] == pytest.approx(70.0)
    assert cpu["server_parts_pct"] == {"broker-0": pytest.approx(50.0)}


def test_cpu_per_message_is_the_share_of_a_core_over_the_rate():
    figures = sb.run_figures(
        sb.WORKLOAD_BY_KEY[PRODUCE],
        {"msg_per_s": 200_000.0, "latency_ms": {"p50": 10.0, "p99": 20.0}},
        {"server_pct": 100.0, "client_pct": 50.0, "server_parts_pct": {"broker-0": 40.0}},
    )
    assert figures["server_us_per_msg"] == pytest.approx(5.0)
    assert figures["broker_us_per_msg"] == pytest.approx(2.0)
    assert figures["client_us_per_msg"] == pytest.approx(2.5)
    assert figures["p99_ms"] == 20.0
    slow = sb.run_figures(sb.WORKLOAD_BY_KEY[E2E], {"msg_per_s": 1_800.0}, {})
    assert slow["rate_reached"] == 0.0
    assert sb.run_figures(sb.WORKLOAD_BY_KEY[E2E], {"msg_per_s": 1_990.0}, {})["rate_reached"]


def _run(workload: str, variant: str, round_index: int, ok: bool = True, **figures: float):
    return {
        "workload": workload,
        "variant": variant,
        "round": round_index,
        "ok": ok,
        "figures": figures if ok else {},
    }


def test_ratios_are_taken_within_each_round_where_both_ran():
    runs = [
        _run(PRODUCE, "plain", 0, msg_per_s=100.0),
        _run(PRODUCE, "tls", 0, msg_per_s=90.0),
        # the machine slowed down in round 1: both variants alike
        _run(PRODUCE, "plain", 1, msg_per_s=50.0),
        _run(PRODUCE, "tls", 1, msg_per_s=40.0),
        _run(PRODUCE, "plain", 2, msg_per_s=80.0),
        _run(PRODUCE, "tls", 2, ok=False),  # left out: no pair in round 2
    ]
    value = sb.paired(runs, PRODUCE, ("plain", "tls"), "msg_per_s", sb.ratio)
    assert value["by_round"] == {0: pytest.approx(0.9), 1: pytest.approx(0.8)}
    assert value["median"] == pytest.approx(0.85)
    assert (value["min"], value["max"], value["n"]) == (pytest.approx(0.8), 0.9, 2)
    latency = sb.paired(
        [_run(E2E, "plain", 0, p99_ms=5.0), _run(E2E, "tls", 0, p99_ms=5.5)],
        E2E,
        ("plain", "tls"),
        "p99_ms",
        sb.difference,
    )
    assert latency["median"] == pytest.approx(0.5)


def test_the_summary_is_the_median_of_the_rounds_and_counts_failures():
    runs = [_run(PRODUCE, "plain", r, msg_per_s=v) for r, v in enumerate((3.0, 1.0, 2.0))]
    runs.append(_run(PRODUCE, "plain", 3, ok=False))
    plain = sb.summarize(runs)[PRODUCE]["plain"]
    assert (plain["runs"], plain["ok_runs"]) == (4, 3)
    assert plain["msg_per_s"] == {"n": 3, "median": 2.0, "min": 1.0, "max": 3.0}
    assert sb.spread([None]) == {"n": 0, "median": None, "min": None, "max": None}


# --- verdicts -----------------------------------------------------------------------------------


def _all_runs(
    *,
    rounds: int = 3,
    tls_factor: float = 0.9,
    auth_factor: float = 0.97,
    tls_p99_extra_ms: float = 0.5,
    e2e_rate: float = 2_000.0,
) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        for v in sb.VARIANTS:
            factor = (tls_factor if v.tls else 1.0) * (auth_factor if v.auth else 1.0)
            runs.extend(
                _run(w, v.key, r, msg_per_s=100_000 * factor, server_us_per_msg=5.0)
                for w in (PRODUCE, PER_MESSAGE)
            )
            p99 = 10.0 + (tls_p99_extra_ms if v.tls else 0.0)
            runs.append(
                _run(
                    E2E,
                    v.key,
                    r,
                    msg_per_s=e2e_rate,
                    p50_ms=3.0,
                    p99_ms=p99,
                    p99_9_ms=p99 * 2,
                    server_cpu_pct=80.0,
                    rate_reached=float(e2e_rate >= 1_900),
                )
            )
    return runs


def _verdicts(runs: list[dict[str, Any]]) -> dict[str, str]:
    found = sb.comparisons(runs)
    return {c["key"]: c["verdict"] for c in sb.checks(found, sb.summarize(runs))}


def test_targets_met_pass():
    assert _verdicts(_all_runs()) == {
        "tls-throughput": "PASS",
        "tls-latency": "PASS",
        "auth-throughput": "PASS",
    }


def test_a_missed_target_fails_and_says_which_pair():
    runs = _all_runs(tls_factor=0.8, auth_factor=0.9, tls_p99_extra_ms=1.5)
    found = sb.comparisons(runs)
    checks = {c["key"]: c for c in sb.checks(found, sb.summarize(runs))}
    assert {k: c["verdict"] for k, c in checks.items()} == dict.fromkeys(checks, "FAIL")
    rows = checks["tls-throughput"]["rows"]
    assert len(rows) == 4  # two servers x two produce loops
    assert all(r["measured"] == pytest.approx(0.8) for r in rows)
    assert rows[0]["rounds_meeting"] == 0
    assert checks["tls-latency"]["rows"][0]["measured"] == pytest.approx(1.5)
    assert checks["auth-throughput"]["rows"][0]["measured"] == pytest.approx(0.9)


def test_latency_does_not_count_when_the_rate_was_not_delivered():
    runs = _all_runs(e2e_rate=1_500.0)
    checks = {c["key"]: c for c in sb.checks(sb.comparisons(runs), sb.summarize(runs))}
    latency = checks["tls-latency"]
    assert latency["verdict"] == "FAIL"
    assert "delivered 1,500 of 2,000 msg/s" in latency["rows"][0]["why"]


def test_a_pair_that_never_ran_fails():
    runs = [r for r in _all_runs() if r["variant"] != "tls-auth"]
    checks = {c["key"]: c for c in sb.checks(sb.comparisons(runs), sb.summarize(runs))}
    assert checks["tls-throughput"]["verdict"] == "FAIL"
    assert any("no round" in r.get("why", "") for r in checks["tls-throughput"]["rows"])


# --- the report ---------------------------------------------------------------------------------


@pytest.mark.parametrize("server", ["cluster", "standalone"])
def test_the_report_has_every_variant_the_ratios_and_the_verdicts(server: str):
    runs = _all_runs(tls_factor=0.8)
    runs.append(
        {
            "workload": E2E,
            "variant": "plain",
            "round": 9,
            "ok": False,
            "error": "the client exited with 1",
            "stderr_tail": "boom",
            "server_log_tail": "broker said no",
        }
    )
    results = {
        "date": "2026-01-01",
        "tag": "test",
        "command": "bench/security_bench.py --tag test",
        "started_at": "2026-01-01T00:00:00+00:00",
        "elapsed_s": 10.0,
        "machine": {
            "cpu_count": 2,
            "cpu_model": "cpu",
            "memory_bytes": 2**30,
            "kernel": "6",
            "python": "3",
            "grpcio": "1",
            "git_commit": "0" * 40,
            "git_dirty": False,
            "filesystem": {
                "device": "/dev/x",
                "type": "ext4",
                "mount_point": "/",
                "free_bytes": 10**10,
                "total_bytes": 10**11,
            },
        },
        "parameters": {
            "rounds": 3,
            "server": server,
            "cluster_broker_args": ["--load-shedding-enabled", "false"],
            "bookies": 3,
            "message_bytes": 100,
            "warmup_s": 1.0,
            "duration_s": {PRODUCE: 5.0, PER_MESSAGE: 4.0, E2E: 8.0},
        },
        "runs": runs,
        "summary": sb.summarize(runs),
        "comparisons": sb.comparisons(runs),
    }
    results["checks"] = sb.checks(results["comparisons"], results["summary"])
    text = sb.render_markdown(results)
    assert "# Security benchmark, 2026-01-01 (test)" in text
    assert "**FAIL** TLS on: produce throughput >= 85% of plaintext" in text
    assert "**PASS** authentication + authorization on" in text
    assert "**0.800**" in text
    for variant in sb.VARIANTS:
        assert f"| {variant.name} |" in text
    assert "the client exited with 1" in text
    assert "broker said no" in text
    assert ("LocalCluster" in text) == (server == "cluster")
    assert "s waited" in text
    header = next(line for line in text.splitlines() if line.startswith("| variant | msg/s"))
    row = next(line for line in text.splitlines() if line.startswith("| TLS, auth off | 80,000"))
    assert row.count("|") == header.count("|")
