"""scripts/bootstrap.sh decides what to install into .venv, and when: the real script, run in a
copy of the repository whose .venv/bin/python only writes down how it was called (so pip never
runs and nothing is downloaded)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNTIME = "-c constraints/pinned.txt -e ."
FULL = "-c constraints/pinned.txt -e .[dev,spark,helm,speedups]"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    for name in ("scripts/bootstrap.sh", "pyproject.toml", "constraints/pinned.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tmp_path / name)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "$*" >> "$(dirname "$0")/../../pip-calls.log"\n')
    python.chmod(0o755)
    return tmp_path


def bootstrap(checkout: Path, *args: str, path: str | None = None) -> list[str]:
    """The pip installs one run asked for (each after upgrading pip)."""
    log = checkout / "pip-calls.log"
    log.unlink(missing_ok=True)
    subprocess.run(
        ["bash", checkout / "scripts" / "bootstrap.sh", *args],
        env={**os.environ, "PYTHON": sys.executable, "PATH": path or os.environ["PATH"]},
        check=True,
        capture_output=True,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    upgrades = [c for c in calls if c.endswith("--upgrade pip")]
    installs = [c.split("--disable-pip-version-check ", 1)[1] for c in calls if c not in upgrades]
    assert len(upgrades) == len(installs)
    return installs


def test_the_standalone_installs_the_runtime_and_the_tests_add_the_rest(checkout: Path) -> None:
    assert bootstrap(checkout, "--runtime") == [RUNTIME]
    assert bootstrap(checkout, "--runtime") == []  # installed already
    assert bootstrap(checkout) == [FULL]  # the tests after the standalone: the rest
    assert bootstrap(checkout, "--runtime") == []  # the standalone after the tests: nothing
    assert bootstrap(checkout) == []


def test_a_changed_pyproject_installs_again(checkout: Path) -> None:
    assert bootstrap(checkout) == [FULL]
    with (checkout / "pyproject.toml").open("a") as pyproject:
        pyproject.write("\n# changed\n")
    assert bootstrap(checkout, "--runtime") == [RUNTIME]
    assert bootstrap(checkout, "--runtime") == []
    assert bootstrap(checkout) == [FULL]
    (checkout / "constraints" / "pinned.txt").write_text("grpcio==1.85.3\n")
    assert bootstrap(checkout) == [FULL]
    assert bootstrap(checkout, "--runtime") == []


def test_the_runtime_alone_cannot_serve_the_tests(checkout: Path) -> None:
    result = subprocess.run(
        ["bash", checkout / "scripts" / "bootstrap.sh", "--runtime", "--etcd"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "drop --runtime" in result.stderr


def test_the_tests_get_the_npm_packages_when_a_lock_file_changes(checkout: Path) -> None:
    # the Node.js example's packages (tests/interop) and the buf CLI (scripts/buf.sh)
    example = checkout / "examples" / "node" / "package-lock.json"
    buf = checkout / "tools" / "buf" / "package-lock.json"
    for lock in (example, buf):
        lock.parent.mkdir(parents=True)
        shutil.copy2(REPO / lock.relative_to(checkout), lock)
    # stand-ins that only write down how they were called (etcd and java: already installed)
    tools = checkout / "fakebin"
    tools.mkdir()
    calls = checkout / "npm-calls.log"
    for tool, script in {
        "npm": f'echo "$(pwd) $*" >> {calls}\nmkdir -p node_modules\n',
        "etcd": "",
        "java": "",
    }.items():
        (tools / tool).write_text(f"#!/bin/sh\n{script}")
        (tools / tool).chmod(0o755)
    path = f"{tools}:{os.environ['PATH']}"

    def npm_calls() -> list[str]:
        found = calls.read_text().splitlines() if calls.exists() else []
        calls.unlink(missing_ok=True)
        return found

    def npm_ci(lock: Path) -> str:
        return f"{lock.parent} ci --no-audit --no-fund --loglevel=error"

    assert bootstrap(checkout, path=path) == [FULL]
    assert npm_calls() == []  # only the tests need Node.js
    bootstrap(checkout, "--etcd", path=path)
    assert npm_calls() == [npm_ci(example), npm_ci(buf)]
    bootstrap(checkout, "--etcd", path=path)
    assert npm_calls() == []  # installed already
    for lock in (example, buf):
        with lock.open("a") as changed:
            changed.write("\n")
        bootstrap(checkout, "--etcd", path=path)
        assert npm_calls() == [npm_ci(lock)]  # that one only
