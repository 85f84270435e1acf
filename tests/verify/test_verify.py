"""The short form of ``magnetar verify`` (docs/verify.md), run on every change.

A real cluster (3 etcd members, 4 bookies, 2 brokers plus one in its own network namespace
when root), a fixed seed and a fast pace, so that every fault kind this machine supports is
injected at least once in under a minute of faults. Any loss, reordering, unexplained duplicate
or unexplained redelivery after an ack fails the build, with the replay command and the path
of the report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from magnetar.testing.netns import netns_unsupported_reason
from magnetar.verify.nemesis import FAULT_KINDS

pytestmark = [pytest.mark.etcd, pytest.mark.slow]  # about 80 s: the CI's short form

SEED = 2
"""Fixed: its first 8 faults are one of each kind, and it passed when this test was written."""
DURATION_S = 40
PACE = 0.3
ZOMBIE_S = 6
"""The first broker pause and etcd cut outlast the 4 s session TTL: a zombie broker each."""


@pytest.mark.timeout(300)
def test_short_verify_run_loses_nothing_and_injects_every_kind(tmp_path: Path) -> None:
    out = tmp_path / "report"
    command = [
        sys.executable, "-m", "magnetar.cli", "verify",
        "--duration", str(DURATION_S), "--seed", str(SEED), "--pace", str(PACE),
        "--zombie-s", str(ZOMBIE_S),
        "--json", "--out", str(out), "--work-dir", str(tmp_path / "work"),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=280, check=False)
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

    # the report's other two files are there: the timeline and the one-page summary
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "summary.md").read_text()
    assert "**PASSED**" in page
    assert f"--seed {SEED}" in page
