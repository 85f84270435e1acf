"""Magnetar installed as users install it, at both ends of its dependency ranges.

pyproject.toml gives ranges, not pins, so that Magnetar installs into environments that already
have their own grpcio, protobuf and the rest. For each end of the ranges a virtualenv under
.cache/deprange/ gets the runtime dependencies at exact versions:

- ``lowest``: every floor, as constraints/lowest.txt pins it;
- ``highest``: the newest releases the ranges allow, as the package index has them today.

pip resolves the set on every run (so ``highest`` follows new releases); a virtualenv is made
anew only when its set changed, and otherwise re-used. Magnetar goes in as a wheel built from the
checkout, and tests/install/roundtrip.py runs there, away from the checkout: imports with
warnings as errors, ``magnetar standalone``, a produce/consume round trip with the sync client.
The first run downloads the packages (a minute or two); later runs take seconds per end.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOWEST = REPO / "constraints" / "lowest.txt"
CACHE = REPO / ".cache" / "deprange"
ROUNDTRIP = Path(__file__).with_name("roundtrip.py")
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def runtime_requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a constraints file, by canonical name."""
    found: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            found[canonicalize_name(name)] = version.strip()
    return found


def resolve(end: str, work: Path) -> dict[str, str]:
    """Every package (dependencies of dependencies too) that the runtime requirements bring at
    this end of the ranges, with its exact version, as pip resolves them today."""
    report = work / f"{end}-resolution.json"
    constraints = ["-c", str(LOWEST)] if end == "lowest" else []
    resolve_only = ["install", "--dry-run", "--ignore-installed", "-q", "--report", str(report)]
    subprocess.run([*PIP, *resolve_only, *constraints, *runtime_requirements()], check=True)
    installs = json.loads(report.read_text())["install"]
    return {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in installs
    }


def virtualenv(end: str, work: Path) -> tuple[Path, dict[str, str]]:
    """The Python of this end's virtualenv, and every package it holds with its version.

    ``lowest`` is fixed by constraints/lowest.txt: its virtualenv is re-used while that file,
    the requirements and Python stay the same, without asking the package index. ``highest``
    moves with new releases: pip resolves it on every run, and the virtualenv is made anew when
    the result changed."""
    venv = CACHE / end
    python = venv / "bin" / "python"
    stamp = venv / ".stamp.json"
    resolved = None if end == "lowest" else resolve(end, work)
    key = {
        "python": sys.version,
        "requirements": runtime_requirements(),
        "constraints": LOWEST.read_text() if end == "lowest" else None,
        "packages": resolved,
    }
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f".{end}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another checkout's run may be making it
        if python.exists() and stamp.exists():
            saved = json.loads(stamp.read_text())
            if saved["key"] == key:
                return python, dict(saved["packages"])
        versions = resolved or resolve(end, work)
        shutil.rmtree(venv, ignore_errors=True)
        # no pip, no setuptools: as bare as an environment can be (setuptools' pkg_resources
        # is gone from Python 3.12's virtualenvs, and from setuptools 81)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        packages = [f"{name}=={version}" for name, version in sorted(versions.items())]
        install = ["--python", str(python), "install", "-q", "--no-deps", *packages]
        subprocess.run([*PIP, *install], check=True)
        stamp.write_text(json.dumps({"key": key, "packages": versions}, indent=1))
    return python, versions


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Magnetar's wheel, built from a copy of the checkout's sources (a build in the checkout
    would write build/ and *.egg-info into a tree others work in)."""
    source = tmp_path_factory.mktemp("source")
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {pattern.rstrip("*.") for pattern in setuptools["packages"]["find"]["include"]}
    top_files = ("pyproject.toml", "README.md")
    for path in REPO.iterdir():
        if path.is_file() and (path.suffix == ".py" or path.name in top_files):
            shutil.copy2(path, source / path.name)
        elif path.is_dir() and path.name in packages:
            shutil.copytree(path, source / path.name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    # .venv's setuptools (the dev extra pins it) builds it: no isolated build env to download
    build = ["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)]
    subprocess.run([*PIP, *build], check=True)
    (built,) = out.glob("magnetar-*.whl")
    return built


def test_the_lowest_constraints_pin_every_floor_of_the_ranges() -> None:
    floors: dict[str, str] = {}
    for line in runtime_requirements():
        requirement = Requirement(line)
        lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        assert lower, f"{line!r} in pyproject.toml has no floor (>=)"
        floors[canonicalize_name(requirement.name)] = lower[0]
    assert pins(LOWEST) == floors


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first run downloads every package of both ends
@pytest.mark.parametrize("end", ["lowest", "highest"])
def test_magnetar_installs_and_works_at_each_end_of_its_ranges(
    end: str, wheel: Path, tmp_path: Path
) -> None:
    python, versions = virtualenv(end, tmp_path)
    if end == "lowest":
        wanted = pins(LOWEST)
        assert {name: versions.get(name) for name in wanted} == wanted
    install = [*PIP, "--python", str(python), "install", "-q", "--no-deps", "--force-reinstall"]
    subprocess.run([*install, str(wheel)], check=True)
    # Magnetar's own requirements (the wheel's metadata) hold for what is installed
    subprocess.run([*PIP, "--python", python, "check"], check=True)

    (tmp_path / "data").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    process = subprocess.Popen(
        [python, ROUNDTRIP, tmp_path / "data"],
        cwd=tmp_path,  # not the checkout: magnetar must come from the wheel
        env={**env, "GRPC_VERBOSITY": "ERROR"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the standalone it started too
        stdout, stderr = process.communicate()
    log = tmp_path / "standalone.log"
    server_log = log.read_text()[-3000:] if log.exists() else ""
    assert process.returncode == 0, f"{end}: {versions}\n{stderr[-4000:]}\n{server_log}"
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["magnetar"].startswith(str(python.parents[1])), result
    assert {name: versions[name] for name in result["versions"]} == result["versions"]
    print(f"{end}: {result['versions']}")
