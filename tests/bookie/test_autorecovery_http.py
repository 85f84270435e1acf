"""``magnetar autorecovery``'s /health and /metrics as Kubernetes and Prometheus read them: the
real command in a subprocess, against a real etcd, on a free HTTP port."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from magnetar.testing.etcd import EtcdServer, free_port
from magnetar.testing.probes import http_get

pytestmark = pytest.mark.etcd

ENV = {k: v for k, v in os.environ.items() if not k.startswith("MAGNETAR_")} | {
    "GRPC_VERBOSITY": "ERROR"
}
READY = re.compile(r"^autorecovery (\S+) running \(metrics: http://\S+:(\d+)/metrics\)$")


def metric(text: str, name: str) -> float:
    """The value of the one sample of ``name`` (labels aside)."""
    found = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name}{{", f"{name} "))
    ]
    assert len(found) == 1, f"{name}: {found}\n{text}"
    return found[0]


class Autorecovery:
    """One ``magnetar autorecovery`` process; its JSON logs go to a file for failure messages."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path, http_port: int) -> None:
        self.process = process
        self.log = log
        self.http_port = http_port

    @classmethod
    async def start(cls, tmp_path: Path, url: str, name: str) -> Autorecovery:
        http_port = free_port()
        log = tmp_path / f"{name}.log"
        with log.open("wb") as err:
            process = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "magnetar.cli", "autorecovery"),
                *("--metadata", url, "--name", name, "--session-ttl-s", "2"),
                *("--http-port", str(http_port), "--bind-host", "127.0.0.1"),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env=ENV,
            )
        self = cls(process, log, http_port)
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = (await process.stdout.readline()).decode().strip()
        match = READY.match(line)
        assert match is not None, f"ready line {line!r}; log:\n{self.logs()}"
        assert match.groups() == (name, str(http_port))
        return self

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    async def health(self) -> tuple[int, str]:
        return await http_get(self.http_port, "/health")

    async def until_health(self, wanted: Callable[[int, str], bool], timeout_s: float) -> str:
        """Poll /health until ``wanted(status, body)``; the body then."""
        seen: tuple[int, str] | None = None
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    seen = await self.health()
                    if wanted(*seen):
                        return seen[1]
                    await asyncio.sleep(0.05)
        except TimeoutError:
            pytest.fail(f"/health still {seen} after {timeout_s} s; log:\n{self.logs()}")

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
                raise


@pytest.fixture
async def etcd(tmp_path: Path) -> AsyncIterator[EtcdServer]:
    server = EtcdServer(data_dir=tmp_path / "etcd")
    await server.start()
    yield server
    await server.aclose()


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[list[Autorecovery]]:
    """Processes a test started; each is stopped at the end."""
    processes: list[Autorecovery] = []
    yield processes
    for process in processes:
        await process.stop()


def is_ok(state: str) -> Callable[[int, str], bool]:
    return lambda status, body: (status, body) == (200, f"ok {state}\n")


async def test_one_instance_is_active_another_standby_and_takes_over(
    tmp_path: Path, etcd: EtcdServer, started: list[Autorecovery]
) -> None:
    first = await Autorecovery.start(tmp_path, etcd.url, "ar-1")
    started.append(first)
    await first.until_health(is_ok("active"), timeout_s=10)
    second = await Autorecovery.start(tmp_path, etcd.url, "ar-2")
    started.append(second)
    await second.until_health(is_ok("standby"), timeout_s=10)
    assert await first.health() == (200, "ok active\n")

    status, text = await http_get(first.http_port, "/metrics")
    assert status == 200
    assert 'magnetar_autorecovery_active{autorecovery="ar-1"} 1.0' in text
    # the first pass ran as soon as it led: nothing is lost in an empty cluster
    assert metric(text, "magnetar_autorecovery_last_audit_timestamp_seconds") > 0
    assert metric(text, "magnetar_autorecovery_lost_bookies") == 0
    assert metric(text, "magnetar_autorecovery_under_replicated_ledgers") == 0
    for counter in ("replicated_ledgers", "replicated_fragments", "copied_entries"):
        assert metric(text, f"magnetar_autorecovery_{counter}_total") == 0
    for reason in ("no_replacement", "ledger_error"):
        assert (
            f'magnetar_autorecovery_replication_failures_total{{autorecovery="ar-1",'
            f'reason="{reason}"}} 0.0'
        ) in text
    status, text = await http_get(second.http_port, "/metrics")
    assert status == 200
    assert metric(text, "magnetar_autorecovery_active") == 0
    assert metric(text, "magnetar_autorecovery_last_audit_timestamp_seconds") == 0
    assert (await http_get(second.http_port, "/nothing"))[0] == 404

    # SIGTERM: the active one resigns, and the standby takes over at once
    await first.stop()
    assert first.process.returncode == 0
    await second.until_health(is_ok("active"), timeout_s=5)
    _, text = await http_get(second.http_port, "/metrics")
    assert metric(text, "magnetar_autorecovery_active") == 1


async def test_health_fails_while_etcd_is_down_and_recovers_after(
    tmp_path: Path, etcd: EtcdServer, started: list[Autorecovery]
) -> None:
    instance = await Autorecovery.start(tmp_path, etcd.url, "ar-1")
    started.append(instance)
    await instance.until_health(is_ok("active"), timeout_s=10)

    await etcd.stop()
    # a 2 s session is given up 1.5 s after its last refresh; the probe answers all along
    body = await instance.until_health(lambda status, _: status == 503, timeout_s=5)
    assert body.startswith("no metadata session: "), body
    _, text = await http_get(instance.http_port, "/metrics")
    assert metric(text, "magnetar_autorecovery_active") == 0
    assert instance.process.returncode is None

    await etcd.start()
    # ready again as soon as it has a new session: standby until its old lease, which still
    # holds the leadership, expires on the restarted etcd (then active)
    body = await instance.until_health(lambda status, _: status == 200, timeout_s=20)
    assert body in ("ok standby\n", "ok active\n")
    _, text = await http_get(instance.http_port, "/metrics")
    assert metric(text, "magnetar_autorecovery_interruptions_total") >= 1
