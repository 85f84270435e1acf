"""The README's examples, copied and pasted as a new user would, against a real standalone.

Every ``python`` block of README.md runs as its own script with the venv's Python, and every
``.venv/bin/magnetar`` line of its ``bash`` blocks runs as a command, in order. The only change
is the address: the README says ``magnetar://localhost:6650``; here the standalone listens on a
free port (the Python blocks get it substituted, the commands through MAGNETAR_SERVICE_URL).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from magnetar.testing import StandaloneNode

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
BLOCK = re.compile(r"^```(?P<lang>\w+)\n(?P<body>.*?)^```$", re.M | re.S)
README_URL = "magnetar://localhost:6650"

pytestmark = [pytest.mark.timeout(180)]
module_loop = pytest.mark.asyncio(loop_scope="module")


def blocks(lang: str) -> list[str]:
    return [m["body"] for m in BLOCK.finditer(README.read_text()) if m["lang"] == lang]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StandaloneNode]:
    async with StandaloneNode(tmp_path_factory.mktemp("readme") / "data") as running:
        yield running


async def run(*command: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=REPO,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR", **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


def test_the_readme_starts_with_the_two_commands() -> None:
    first = blocks("bash")[0].splitlines()
    assert first[0].startswith("bash scripts/standalone.sh")
    assert first[1].startswith("bash scripts/test.sh")
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci


@module_loop
async def test_python_examples_run(node: StandaloneNode, tmp_path: Path) -> None:
    examples = blocks("python")
    assert len(examples) >= 2
    for i, body in enumerate(examples):
        assert README_URL in body, f"example {i} does not use {README_URL}"
        script = tmp_path / f"example_{i}.py"
        script.write_text(body.replace(README_URL, node.service_url))
        code, stdout, stderr = await run(sys.executable, str(script))
        assert code == 0, f"README example {i} failed:\n{stdout}\n{stderr}"
        assert "b'hello, " in stdout, stdout
        assert stderr == "", stderr  # the client is quiet by default


@module_loop
async def test_cli_examples_run(node: StandaloneNode) -> None:
    lines = [
        line.strip()
        for body in blocks("bash")[1:]
        for line in body.splitlines()
        if line.strip().startswith(".venv/bin/magnetar ")
    ]
    assert lines
    executable = Path(sys.executable).with_name("magnetar")
    for line in lines:
        # a quoted message is one argument
        command = [word.strip('"') for word in re.findall(r'"[^"]*"|\S+', line)]
        code, stdout, stderr = await run(
            str(executable), *command[1:], env={"MAGNETAR_SERVICE_URL": node.service_url}
        )
        assert code == 0, f"{line!r} failed ({code}):\n{stdout}\n{stderr}"
