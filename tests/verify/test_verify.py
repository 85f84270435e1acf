"""The short form of ``magnetar verify`` (docs/verify.md), run on every change, plain and secure.

A real cluster (3 etcd members, 4 bookies, 2 brokers plus one in its own network namespace
when root), a fixed seed and a fast pace, so that every fault kind this machine supports is
injected at least once in under a minute of faults. Any loss, reordering, unexplained duplicate
or unexplained redelivery after an ack fails the build, with the replay command and the path
of the report. The secure form runs the same schedule with TLS and authentication on every hop
and every certificate and the token key rotated halfway through the nemesis; it is the default
run's short form, and the plain one is a soak test (``-m soak``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from magnetar.testing.netns import netns_unsupported_reason
from magnetar.verify.nemesis import FAULT_KINDS

pytestmark = [pytest.mark.etcd, pytest.mark.slow]  # about 60 s each: the short forms

SEED = 2
"""Fixed: its first 8 faults are one of each kind (all in 30 s), and it passed when this test
was written."""
DURATION_S = 30
PACE = 0.3
ZOMBIE_S = 6
"""The first broker pause and etcd cut outlast the 4 s session TTL: a zombie broker each."""
TOKEN_EXPIRY_S = 5
"""Secure form: tokens this short are refreshed in band on every stream several times."""


@dataclass
class Run:
    summary: dict[str, Any]
    report: dict[str, Any]
    out: Path
    context: str


def run_bounded(
    command: list[str], tmp_path: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a session of its own. Past ``timeout_s`` it is interrupted (its cluster
    then stops and unmounts its disks), its whole session killed after a grace period, and any
    tmpfs left under ``tmp_path`` unmounted, so a hung run harms no later test."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its cluster's processes, if any are left
        for line in Path("/proc/mounts").read_text().splitlines():
            mount_point = line.split()[1]
            if mount_point.startswith(f"{tmp_path}/"):
                subprocess.run(["umount", "-l", mount_point], check=False)
        pytest.fail(f"`{' '.join(command[2:])}` ran over {timeout_s} s:\n{stderr[-5000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def run_short_form(tmp_path: Path, *extra: str) -> Run:
    """Run the short form (with ``extra`` flags) and check what every run must show."""
    out = tmp_path / "report"
    command = [
        sys.executable, "-m", "magnetar.cli", "verify",
        "--duration", str(DURATION_S), "--seed", str(SEED), "--pace", str(PACE),
        "--zombie-s", str(ZOMBIE_S), *extra,
        "--json", "--out", str(out), "--work-dir", str(tmp_path / "work"),
    ]  # fmt: skip
    result = run_bounded(command, tmp_path, timeout_s=280)
    replay = " ".join(command[2:])
    assert result.stdout.strip(), f"no summary from `{replay}`:\n{result.stderr[-3000:]}"
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    report = json.loads((out / "report.json").read_text())
    problems = report["verdict"]["problems"]
    context = (
        f"`{replay}` failed: {problems}\nsummary: {out / 'summary.md'}\n{result.stderr[-3000:]}"
    )

    assert result.returncode == 0, context
    assert summary["ok"] is True, context
    for count in ("lost", "duplicates", "reordered", "misplaced", "phantoms"):
        assert summary[count] == 0, f"{count}: {context}"
    assert summary["unexplained_redeliveries_after_ack"] == 0, context
    assert summary["acked"] > 1000, context  # the workload really ran
    assert sum(summary["delivered"].values()) >= 4 * summary["acked"], context

    # every kind the machine supports was injected, and as root that is all of them
    unsupported = report["config"]["unsupported"]
    supported = set(FAULT_KINDS) - set(unsupported)
    assert set(summary["fault_kinds"]) == supported, (summary["fault_kinds"], unsupported)
    assert summary["failed_faults"] == 0, report["faults"]
    if os.geteuid() == 0 and netns_unsupported_reason() is None:
        assert unsupported == {}
    assert summary["faults"] == sum(summary["fault_kinds"].values())

    # every partition recovered within the bound once the faults that could explain its
    # outages were healed (a late one fails the run above); the figures are in the report
    assert summary["late_recoveries"] == 0, context
    assert summary["recovery_bound_s"] == 5.0
    availability = report["verdict"]["availability"]
    assert availability["late"] == 0, context
    injected = {f["index"] for f in report["faults"] if f["started_at"] is not None}
    assert {r["fault"] for r in availability["recoveries"]} <= injected
    assert all(o["lateness_s"] <= 5.0 for o in availability["outages"]), context
    assert set(availability["by_kind"]) <= set(summary["fault_kinds"])
    assert availability["overall"]["after_heal"]["count"] == len(availability["recoveries"])

    # the report's other files are there: the plots and the one-page summary
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "availability.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "summary.md").read_text()
    assert "**PASSED**" in page
    assert f"--seed {SEED}" in page
    assert "## Recovery" in page
    assert "| all |" in page
    return Run(summary, report, out, context)


@pytest.mark.soak  # the secure form below runs the same schedule and checks in the default run
@pytest.mark.timeout(300)
def test_short_verify_run_loses_nothing_and_injects_every_kind(tmp_path: Path) -> None:
    run = run_short_form(tmp_path)
    assert run.summary["secure"] is False
    assert run.report["security"] == {}


@pytest.mark.timeout(300)
def test_short_secure_run_rotates_everything_and_loses_nothing(tmp_path: Path) -> None:
    """About 80 s: the same schedule with TLS and authentication on every hop."""
    run = run_short_form(tmp_path, "--secure", "--token-expiry-s", str(TOKEN_EXPIRY_S))
    summary, report, context = run.summary, run.report, run.context
    security = report["security"]
    assert summary["secure"] is True
    assert summary["security_problems"] == 0, context

    # the rotation came halfway through the nemesis, with the faults going on around it
    rotation = security["rotation"]
    phases = report["phases"]
    assert rotation["at"] == pytest.approx(phases["nemesis"] + DURATION_S / 2, abs=1.0)
    assert phases["nemesis"] < rotation["at"] < phases["healed"]
    assert summary["rotated_at_s"] == rotation["at"]
    faults = report["faults"]
    assert any(f["started_at"] > rotation["at"] for f in faults), "faults after the rotation"
    # every server certificate (3 etcd members, 4 bookies, 3 or 2 brokers) and etcd's client
    brokers = report["config"]["brokers"]
    assert len(rotation["certificates"]) == 3 + 4 + brokers + 1
    assert rotation["token_key_generation"] == 2
    # every TLS listener (gRPC and HTTPS of each bookie and broker, each etcd member)
    # presented its new certificate without a restart, and still does at the end
    presented = rotation["presented_new_after_s"]
    assert len(presented) == 3 + 2 * (4 + brokers)
    assert all(took is not None for took in presented.values()), presented
    assert all(security["final_certificates"].values()), security["final_certificates"]

    # open streams were challenged and refreshed in band; the new key signed what followed
    assert security["broker_log_events"]["stream_credentials_refreshed"] > 0, security
    assert security["broker_log_events"]["token_key_reloaded"] >= 1, security
    assert security["tokens_issued"] > rotation["tokens_issued_before"] > 0
    assert security["tokens_by_key"]["2"] > 0, security["tokens_by_key"]

    page = (run.out / "summary.md").read_text()
    assert "## Security" in page
    assert f"**Rotation** at {rotation['at']:.1f} s" in page
