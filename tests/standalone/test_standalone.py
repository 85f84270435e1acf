"""`magnetar standalone` as a user runs it: one process, ready line, produce and consume, Ctrl-C,
and a restart that keeps topics, messages and subscription positions."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from magnetar.aio import Client, ReceiveTimeoutError

READY = re.compile(r"^magnetar standalone ready in [0-9.]+ s: service URL (?P<url>\S+) ")


@asynccontextmanager
async def standalone(data_dir: Path, *extra: str) -> AsyncIterator[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "magnetar.cli",
        "standalone",
        "--data-dir",
        str(data_dir),
        "--port",
        "0",
        "--http-port",
        "0",
        "--pulsar-port",
        "0",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode().strip()
        match = READY.match(line)
        assert match, f"no ready line; got {line!r}"
        yield match["url"]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)  # Ctrl-C
            try:
                await asyncio.wait_for(process.wait(), 60)
            except TimeoutError:
                process.kill()
                raise
    assert process.stderr is not None
    stderr = (await process.stderr.read()).decode()
    assert process.returncode == 0, stderr[-2000:]


async def test_restart_keeps_topics_messages_and_positions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with standalone(data) as url, Client(url) as client:
        producer = await client.create_producer("laptop")
        for i in range(10):
            await producer.send(f"m{i}".encode())
        consumer = await client.subscribe(
            "laptop", "app", initial_position="earliest", ack_receipts=True
        )
        for i in range(6):
            message = await consumer.receive(timeout_millis=10_000)
            assert message.data() == f"m{i}".encode()
            await consumer.acknowledge(message)
        await consumer.close()
        await producer.close()

    async with standalone(data) as url, Client(url) as client:
        consumer = await client.subscribe("laptop", "app")
        resumed = [(await consumer.receive(timeout_millis=10_000)).data() for _ in range(4)]
        assert resumed == [f"m{i}".encode() for i in range(6, 10)]
        with pytest.raises(ReceiveTimeoutError):
            await consumer.receive(timeout_millis=300)
        reader = await client.create_reader("laptop", "earliest")
        everything = [(await reader.read_next(timeout_millis=10_000)) for _ in range(10)]
        assert [m.data() for m in everything] == [f"m{i}".encode() for i in range(10)]
        assert [m.offset() for m in everything] == list(range(10))
        producer = await client.create_producer("laptop")
        await producer.send(b"after-restart")
        assert (await consumer.receive(timeout_millis=10_000)).data() == b"after-restart"


async def test_one_bookie_and_a_bad_flag(tmp_path: Path) -> None:
    async with standalone(tmp_path / "one", "--bookies", "1") as url, Client(url) as client:
        producer = await client.create_producer("single")
        message_id = await producer.send(b"x")
        reader = await client.create_reader("single", "earliest")
        message = await reader.read_next(timeout_millis=10_000)
        assert message.message_id() == message_id
    bad = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "magnetar.cli",
        "standalone",
        "--bookies",
        "0",
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await bad.communicate()
    assert bad.returncode != 0
    assert b"bookies" in stderr
    assert b"must be from 1 to 9" in stderr


async def test_a_taken_port_is_refused_not_shared(tmp_path: Path) -> None:
    # gRPC would share a port between servers (SO_REUSEPORT) and split clients between them
    async with standalone(tmp_path / "first") as url:
        port = url.rsplit(":", 1)[1]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "magnetar.cli",
            "standalone",
            "--data-dir",
            str(tmp_path / "second"),
            "--port",
            port,
            "--http-port",
            "0",
            "--pulsar-port",
            "0",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 1
        assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in stderr.decode()
        assert b"ready" not in stdout
