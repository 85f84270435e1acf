"""scripts/buf.sh, the .proto checks CI runs: the real script and the pinned buf CLI, in a scratch
git repository holding a copy of buf.yaml and the .proto files (so tags and commits made here
touch nothing of the checkout).

buf comes from tools/buf/node_modules; the first test runs the checkout's buf.sh once, which
installs it with npm ci when it is missing (scripts/bootstrap.sh --etcd does it too)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def run(cwd: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def buf_installed() -> None:
    if shutil.which("npm") is None:
        pytest.fail("buf comes from npm: install Node.js and npm (bootstrap.sh --etcd does)")
    result = run(REPO, "bash", "scripts/buf.sh", "--version")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def repo(tmp_path: Path, buf_installed: None) -> Path:
    for name in ("buf.yaml", "scripts/buf.sh", "tools/buf/package.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tmp_path / name)
    shutil.copy2(REPO / "tools/buf/package-lock.json", tmp_path / "tools/buf/package-lock.json")
    (tmp_path / "tools/buf/node_modules").symlink_to(REPO / "tools/buf/node_modules")
    shutil.copytree(REPO / "proto" / "magnetar", tmp_path / "proto" / "magnetar")
    for command in (("git", "init", "-q"), ("git", "add", "."), ("git", "commit", "-qm", "one")):
        assert run(tmp_path, *command).returncode == 0
    return tmp_path


def buf_sh(repo: Path) -> subprocess.CompletedProcess[str]:
    return run(repo, "bash", "scripts/buf.sh")


def commit(repo: Path, message: str) -> None:
    result = run(repo, "git", "commit", "-qam", message)
    assert result.returncode == 0, result.stderr


def test_the_files_pass_and_breaking_is_skipped_before_a_release(repo: Path) -> None:
    result = buf_sh(repo)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no release tag (v*)" in result.stdout


def test_a_breaking_change_since_the_release_tag_fails(repo: Path) -> None:
    assert run(repo, "git", "tag", "v0.1.0").returncode == 0
    broker = repo / "proto/magnetar/broker/v1/broker.proto"
    text = broker.read_text()
    assert "  string producer_name = " in text
    broker.write_text(text.replace("  string producer_name = ", "  string producer = ", 1))
    commit(repo, "rename a field")
    result = buf_sh(repo)
    assert result.returncode == 1
    assert "breaking changes since v0.1.0" in result.stdout
    assert 'changed name from "producer_name" to "producer"' in result.stdout


def test_a_lint_or_format_finding_fails(repo: Path) -> None:
    types = repo / "proto/magnetar/common/v1/types.proto"
    # an enum without an *_UNSPECIFIED zero value, written on one line
    types.write_text(types.read_text() + "\nenum Colour { RED = 0; }\n")
    commit(repo, "an enum against the rules")
    result = buf_sh(repo)
    assert result.returncode == 1
    assert 'Enum zero value name "RED" should be suffixed with "_UNSPECIFIED"' in result.stdout
    assert "+enum Colour {" in result.stdout  # the format check's diff
