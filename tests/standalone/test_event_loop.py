"""Servers on uvloop (``--event-loop uvloop``, the speedups extra): the standalone, and a cluster
of separate bookie and broker processes (etcd, the framed data protocol between broker and
bookies) that loses a bookie mid-stream. Everything else in the suite runs on asyncio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from magnetar.aio import Client
from magnetar.testing import LocalCluster, StandaloneNode

UVLOOP = ["--event-loop", "uvloop"]


def _loops(log: Path) -> list[str]:
    lines = log.read_text().splitlines()
    return [json.loads(ln[ln.index("{") :])["loop"] for ln in lines if '"event_loop"' in ln]


async def _round_trip(url: str, topic: str, count: int, *, between: object = None) -> None:
    async with Client(url) as client:
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        producer = await client.create_producer(topic)
        for i in range(count):
            await producer.send_async(f"m{i}".encode())
            if i == count // 2 and callable(between):
                await between()
        await producer.flush()
        got: list[str] = []
        while len(got) < count:
            message = await consumer.receive(timeout_millis=30_000)
            got.append(message.data().decode())
            await consumer.acknowledge(message)
        assert got == [f"m{i}" for i in range(count)]


async def test_the_standalone_serves_on_uvloop(tmp_path: Path) -> None:
    log = tmp_path / "standalone.log"
    args = [*UVLOOP, "--log-format", "json", "--log-level", "info"]
    async with StandaloneNode(tmp_path / "data", extra_args=args, log_path=log) as node:
        await _round_trip(node.service_url, "on-uvloop", 2_000)
    assert _loops(log) == ["uvloop"]


@pytest.mark.etcd
@pytest.mark.timeout(180)
async def test_a_cluster_on_uvloop_loses_a_bookie_and_loses_nothing(tmp_path: Path) -> None:
    async with LocalCluster(
        tmp_path, bookies=4, brokers=1, bookie_args=UVLOOP, broker_args=UVLOOP
    ) as cluster:
        victim = cluster.bookies[0]

        async def kill_a_bookie() -> None:
            await victim.kill()

        await _round_trip(cluster.service_url, "on-uvloop", 3_000, between=kill_a_bookie)
        for node in [*cluster.bookies[1:], *cluster.brokers]:
            assert _loops(node.log_path) == ["uvloop"], node
        assert _loops(victim.log_path) == ["uvloop"]


def test_an_unknown_event_loop_is_refused_before_anything_starts() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "magnetar.cli", "bookie", "--event-loop", "trio"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--event-loop: invalid choice: 'trio'" in result.stderr
