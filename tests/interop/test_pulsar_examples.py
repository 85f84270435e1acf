"""Programs written for Apache Pulsar (examples/pulsar), run as they are, with the real
``pulsar-client``, against a standalone listening on Pulsar's own port, 6650: the synchronous
producer and consumer of Pulsar's documentation, and an asyncio client (``pulsar.asyncio``)."""

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
EXAMPLES = REPO / "examples" / "pulsar"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ (INFO|WARN|ERROR|DEBUG) ")

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def standalone(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StandaloneNode]:
    # Pulsar's default port, which the programs hard-code (the gRPC port stays a free one)
    args = ["--pulsar-port", "6650"]
    async with StandaloneNode(
        tmp_path_factory.mktemp("examples") / "data", bookies=1, extra_args=args
    ) as node:
        assert node.pulsar_url == "pulsar://127.0.0.1:6650"
        yield node


async def run_example(name: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / name),
        cwd=REPO,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, (
        f"{name} exited {process.returncode}:\n{stderr.decode()[-3000:]}"
    )
    # the client's own log lines go to stdout too (Pulsar's default logger): the program's are
    # the others
    return "\n".join(line for line in stdout.decode().splitlines() if not LOG_LINE.match(line))


async def test_the_documented_producer_and_consumer(standalone: StandaloneNode) -> None:
    def received(out: str) -> tuple[list[str], set[str]]:
        lines = out.splitlines()
        return [line.split("'")[1] for line in lines], {line.split("'")[3] for line in lines}

    expected = [f"hello-pulsar-{i}" for i in range(10)]
    assert (await run_example("producer.py")).splitlines() == [f"sent {m}" for m in expected]
    first, first_ids = received(await run_example("consumer.py"))
    assert first == expected
    # acknowledged: run again, the consumer gets the ten new messages, none of the first ten
    await run_example("producer.py")
    second, second_ids = received(await run_example("consumer.py"))
    assert second == expected
    assert len(second_ids) == 10
    assert not first_ids & second_ids


async def test_the_asyncio_client(standalone: StandaloneNode) -> None:
    out = await run_example("async_client.py")
    got = sorted(line.split("'")[1] for line in out.splitlines())
    assert got == sorted(f"hello-{n}" for n in range(100))
