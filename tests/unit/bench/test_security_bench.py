"""The pure parts of ``bench/security_bench.py``: the order of the rounds, the perf arguments of a
run, the servers of each ``--hops`` mode and the every-hop TLS flags, the per-round ratios and
differences, the targets' verdicts, and the report."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from bookie.service.config import BookieConfig
from broker.service.config import BrokerConfig
from magnetar.cli import build_parser, perf
from magnetar.common.config import config_overrides_from_args, load_config
from magnetar.testing.security import TestPki
from tests.unit.bench.machine import fake_machine

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


def test_every_hop_variants_differ_in_tls_alone_each_on_its_own_server():
    variants = sb.HOPS[sb.EVERY_HOP].variants
    assert variants == sb.EVERY_HOP_VARIANTS
    rounds = [sb.round_order(r, variants) for r in range(len(variants))]
    assert {order[0].key for order in rounds} == {v.key for v in variants}
    assert all(len(order) == len(variants) for order in rounds)
    (base, other), *more = sb.EVERY_HOP_PAIRS
    assert not more
    base_variant, tls_variant = sb.VARIANT_BY_KEY[base], sb.VARIANT_BY_KEY[other]
    assert (base_variant.tls, tls_variant.tls) == (False, True)
    assert not base_variant.auth
    assert not tls_variant.auth
    assert base_variant.server != tls_variant.server
    assert tls_variant.name == "TLS on every hop"
    assert base_variant.name == "plaintext on every hop"
    assert sb.HOPS[sb.EVERY_HOP].auth_pairs == ()


@pytest.mark.parametrize("hops", [sb.CLIENT_HOP, sb.EVERY_HOP])
def test_every_variant_runs_on_one_of_two_servers_and_only_every_hop_tls_is_tls_throughout(
    hops: str,
):
    mode = sb.HOPS[hops]
    plans = sb.server_plans(mode)
    assert len(plans) == 2
    by_name = {plan.name: plan for plan in plans}
    for variant in mode.variants:
        plan = by_name[variant.server]
        assert plan.auth == variant.auth
        assert plan.every_hop_tls == (variant.every_hop and variant.tls)
    if hops == sb.CLIENT_HOP:
        assert [(p.name, p.auth, p.every_hop_tls) for p in plans] == [
            ("auth-off", False, False),
            ("auth-on", True, False),
        ]
    else:
        assert [(p.name, p.auth, p.every_hop_tls) for p in plans] == [
            ("all-plaintext", False, False),
            ("all-tls", False, True),
        ]


def _common_name(cert_file: Path) -> str:
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_every_hop_flags_are_mutual_tls_to_the_bookies_as_the_servers_parse_them(tmp_path: Path):
    pki = TestPki(tmp_path / "pki")
    hop = sb.every_hop_tls(pki)

    bookie_argv = ["bookie", "--data-dir", str(tmp_path / "b"), "--metadata", "etcd://h:1"]
    bookie_args = build_parser(bookie_argv).parse_args([*bookie_argv, *hop.bookie_args])
    bookie = load_config(
        BookieConfig, env={}, overrides=config_overrides_from_args(bookie_args, BookieConfig)
    )
    assert bookie.tls_cert_file is not None
    assert bookie.tls_key_file is not None
    assert bookie.tls_trust_certs_file == pki.ca_file  # mutual: clients present a certificate
    assert bookie.authentication_enabled
    assert bookie.authentication_providers == ("tls",)  # the role is the certificate's CN
    assert bookie.bookie_client_roles == (sb.BOOKIE_CLIENT_ROLE,)

    broker_argv = ["broker", "--metadata", "etcd://h:1"]
    broker_args = build_parser(broker_argv).parse_args([*broker_argv, *hop.broker_args])
    broker = load_config(
        BrokerConfig, env={}, overrides=config_overrides_from_args(broker_args, BrokerConfig)
    )
    ledger = broker.ledger
    assert ledger.tls_enabled
    assert ledger.tls_trust_certs_file == pki.ca_file
    assert ledger.tls_cert_file is not None
    assert ledger.tls_key_file is not None
    # the broker's certificate towards the bookies names a role they let in
    assert _common_name(ledger.tls_cert_file) in bookie.bookie_client_roles

    etcd = hop.etcd_tls
    assert etcd.client_cert_auth
    assert etcd.ca_file == pki.ca_file
    assert etcd.client_cert_file is not None
    assert etcd.client_key_file is not None
    assert _common_name(etcd.client_cert_file) != sb.BOOKIE_CLIENT_ROLE


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


def test_every_hop_mode_is_asked_for_tags_its_own_files_and_needs_clusters():
    default = sb.parse_args([])
    assert (default.hops, default.tag) == (sb.CLIENT_HOP, None)
    every = sb.parse_args(["--hops", "every"])
    assert (every.hops, every.tag, every.rounds) == (sb.EVERY_HOP, "every-hop", default.rounds)
    assert sb.parse_args(["--hops", "every", "--quick"]).tag == "every-hop-quick"
    assert sb.parse_args(["--hops", "every", "--tag", "mine"]).tag == "mine"
    with pytest.raises(SystemExit):
        sb.parse_args(["--hops", "every", "--server", "standalone"])


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
    variants: tuple[Any, ...] = sb.VARIANTS,
) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        for v in variants:
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


def _every_hop_checks(**changes: Any) -> dict[str, dict[str, Any]]:
    runs = _all_runs(variants=sb.EVERY_HOP_VARIANTS, **changes)
    mode = sb.HOPS[sb.EVERY_HOP]
    found = sb.comparisons(runs, mode)
    return {c["key"]: c for c in sb.checks(found, sb.summarize(runs, sb.EVERY_HOP_VARIANTS), mode)}


def test_every_hop_targets_are_80_per_cent_and_2_ms_on_the_one_pair():
    met = _every_hop_checks(tls_factor=0.82, tls_p99_extra_ms=1.9)
    assert {k: c["verdict"] for k, c in met.items()} == {
        "tls-throughput": "PASS",
        "tls-latency": "PASS",
    }  # no authentication target in this mode
    throughput = met["tls-throughput"]
    assert throughput["name"] == (
        "TLS on every hop (client -> broker -> bookies, and etcd): produce throughput >= 80% of"
        " plaintext"
    )
    # both produce loops, one pair
    assert [(r["workload"], r["baseline"], r["variant"]) for r in throughput["rows"]] == [
        (PRODUCE, "plain-hops", "tls-hops"),
        (PER_MESSAGE, "plain-hops", "tls-hops"),
    ]
    assert throughput["rows"][0]["measured"] == pytest.approx(0.82)
    assert "<= plaintext's + 2 ms" in met["tls-latency"]["name"]
    assert met["tls-latency"]["rows"][0]["measured"] == pytest.approx(1.9)
    # what passes the client-only targets' thresholds may not: 85% / +1 ms there
    missed = _every_hop_checks(tls_factor=0.79, tls_p99_extra_ms=2.1)
    assert {k: c["verdict"] for k, c in missed.items()} == dict.fromkeys(missed, "FAIL")
    assert missed["tls-throughput"]["rows"][1]["rounds_meeting"] == 0


def test_targets_are_recorded_per_mode():
    assert sb.targets(sb.HOPS[sb.EVERY_HOP]) == {
        "tls_min_throughput_ratio": 0.80,
        "tls_max_p99_increase_ms": 2.0,
        "rate_reached_fraction": sb.RATE_REACHED_FRACTION,
    }
    assert sb.targets(sb.HOPS[sb.CLIENT_HOP])["auth_min_throughput_ratio"] == 0.95
    assert sb.hops_of({"parameters": {}}) is sb.HOPS[sb.CLIENT_HOP]  # runs from before --hops
    assert sb.hops_of({"parameters": {"hops": "every"}}) is sb.HOPS[sb.EVERY_HOP]


def test_a_pair_that_never_ran_fails():
    runs = [r for r in _all_runs() if r["variant"] != "tls-auth"]
    checks = {c["key"]: c for c in sb.checks(sb.comparisons(runs), sb.summarize(runs))}
    assert checks["tls-throughput"]["verdict"] == "FAIL"
    assert any("no round" in r.get("why", "") for r in checks["tls-throughput"]["rows"])


# --- the report ---------------------------------------------------------------------------------


def _results(runs: list[dict[str, Any]], *, server: str, hops: str) -> dict[str, Any]:
    mode = sb.HOPS[hops]
    results: dict[str, Any] = {
        "date": "2026-01-01",
        "tag": "test",
        "command": "bench/security_bench.py --tag test",
        "started_at": "2026-01-01T00:00:00+00:00",
        "elapsed_s": 10.0,
        "machine": fake_machine(),
        "parameters": {
            "rounds": 3,
            "server": server,
            "hops": hops,
            "cluster_broker_args": ["--load-shedding-enabled", "false"],
            "bookies": 3,
            "message_bytes": 100,
            "warmup_s": 1.0,
            "duration_s": {PRODUCE: 5.0, PER_MESSAGE: 4.0, E2E: 8.0},
        },
        "runs": runs,
        "summary": sb.summarize(runs, mode.variants),
        "comparisons": sb.comparisons(runs, mode),
    }
    results["checks"] = sb.checks(results["comparisons"], results["summary"], mode)
    return results


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
    text = sb.render_markdown(_results(runs, server=server, hops=sb.CLIENT_HOP))
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


def test_the_every_hop_report_says_what_is_encrypted_and_judges_the_security_ii_targets():
    runs = _all_runs(variants=sb.EVERY_HOP_VARIANTS, tls_factor=0.75, tls_p99_extra_ms=1.0)
    results = _results(runs, server="cluster", hops=sb.EVERY_HOP)
    text = sb.render_markdown(results)
    assert "From the Security II issue" in text
    assert (
        "**FAIL** TLS on every hop (client -> broker -> bookies, and etcd): produce throughput"
        " >= 80% of plaintext" in text
    )
    assert (
        "**PASS** TLS on every hop (client -> broker -> bookies, and etcd): end-to-end p99" in text
    )
    assert "**0.750**" in text
    assert "+1.00 ms" in text
    assert "authentication + authorization on" not in text  # not this mode's target
    assert "mutual TLS" in text
    assert "--ledger-tls-cert-file" in text
    assert "--client-cert-auth" in text
    assert "between client and broker only" not in text
    for variant in sb.EVERY_HOP_VARIANTS:
        assert f"| {variant.name} |" in text
    for variant in sb.VARIANTS:
        assert f"| {variant.name} |" not in text
