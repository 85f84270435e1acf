"""``magnetar cluster init | info | decommission-bookie`` as an operator (or a Kubernetes Job)
runs them: the real command in a subprocess against a real etcd and real bookie processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from bookie.client.ledger_client import LedgerClient
from magnetar.cli.support import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from magnetar.testing import LocalCluster
from magnetar.testing.etcd import EtcdServer
from magnetar.testing.eventually import eventually
from metadata import layout, open_store

ENV = {k: v for k, v in os.environ.items() if not k.startswith("MAGNETAR_")} | {
    "GRPC_VERBOSITY": "ERROR"
}
COMMAND = (sys.executable, "-m", "magnetar.cli")


@dataclass
class Run:
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


async def magnetar(*args: str, env: Mapping[str, str] | None = None) -> Run:
    process = await asyncio.create_subprocess_exec(
        *COMMAND,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**ENV, **(env or {})},
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 60)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    code = await process.wait()  # already ended: its exit code, as an int
    return Run(code, out.decode(errors="replace"), err.decode(errors="replace"))


class Background:
    """A ``magnetar`` command left running while the test acts; its stderr is read line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.err_lines: list[str] = []

    @classmethod
    async def start(cls, *args: str) -> Background:
        process = await asyncio.create_subprocess_exec(
            *COMMAND,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=ENV,
        )
        return cls(process)

    async def stderr_line(self, containing: str, timeout_s: float = 30) -> str:
        assert self.process.stderr is not None
        async with asyncio.timeout(timeout_s):
            while True:
                raw = await self.process.stderr.readline()
                if not raw:
                    raise AssertionError(f"no line with {containing!r}: {self.err_lines}")
                line = raw.decode(errors="replace").rstrip("\n")
                self.err_lines.append(line)
                if containing in line:
                    return line

    async def finish(self, timeout_s: float = 60) -> Run:
        try:
            out, err = await asyncio.wait_for(self.process.communicate(), timeout_s)
        finally:
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()
        code = await self.process.wait()  # already ended: its exit code, as an int
        earlier = "".join(line + "\n" for line in self.err_lines)
        return Run(
            code,
            out.decode(errors="replace"),
            earlier + err.decode(errors="replace"),
        )


@pytest.mark.etcd
async def test_init_waits_for_etcd_and_is_idempotent(tmp_path: Path) -> None:
    etcd = EtcdServer(data_dir=tmp_path / "etcd")  # not started yet, as when a Job runs early
    url = etcd.url
    try:
        init = await Background.start(
            "cluster", "init", "--metadata", url, "--cluster-name", "prod", "--wait-s", "30"
        )
        await init.stderr_line(f"waiting for the metadata store at {url}")
        await etcd.start()
        run = await init.finish()
        assert run.code == EXIT_OK, str(run)
        assert run.out.strip() == f"initialised cluster prod (metadata format 1) in {url}"

        info, as_json, again, other, bad = await asyncio.gather(
            magnetar("cluster", "info", "--metadata", url),
            magnetar("cluster", "info", "--json", env={"MAGNETAR_METADATA": url}),
            magnetar("cluster", "init", "--cluster-name", "prod", env={"MAGNETAR_METADATA": url}),
            magnetar("cluster", "init", "--metadata", url, "--cluster-name", "staging"),
            magnetar("cluster", "init", "--metadata", url, "--cluster-name", "prod/eu"),
        )
        assert info.code == EXIT_OK, str(info)
        header, row = info.out.splitlines()
        assert header.split() == ["CLUSTER_NAME", "FORMAT_VERSION", "CREATED"]
        assert row.split()[:2] == ["prod", "1"]
        assert as_json.code == EXIT_OK, str(as_json)
        body = json.loads(as_json.out)
        assert body["cluster_name"] == "prod"
        assert body["format_version"] == 1
        assert body["created"] == row.split()[2]

        assert again.code == EXIT_OK, str(again)
        assert "cluster prod is already initialised" in again.out
        assert other.code == EXIT_FAILED, str(other)
        assert "already initialised for cluster 'prod', not 'staging'" in other.err
        assert bad.code == EXIT_USAGE, str(bad)
        assert "invalid cluster name 'prod/eu'" in bad.err
    finally:
        await etcd.aclose()


async def test_info_of_a_store_nobody_initialised(tmp_path: Path) -> None:
    run = await magnetar("cluster", "info", "--metadata", f"embedded://{tmp_path}/metadata")
    assert run.code == EXIT_FAILED, str(run)
    assert run.out == ""
    assert "the cluster is not initialised" in run.err
    assert "magnetar cluster init --cluster-name NAME" in run.err


@pytest.mark.etcd
async def test_decommission_a_killed_bookie_then_reuse_its_id(tmp_path: Path) -> None:
    async with LocalCluster(
        tmp_path / "cluster", bookies=4, bookie_args=["--session-ttl-s", "2"]
    ) as cluster:
        url = cluster.metadata_url
        store = await open_store(url)
        client = await LedgerClient.start(store)
        autorecovery: asyncio.subprocess.Process | None = None
        try:
            await eventually(lambda: len(client.view.bookies) >= 4, interval_s=0.05)
            written = []
            for _ in range(4):
                ledger = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
                await asyncio.gather(*[await ledger.add_async(b"m%d" % i) for i in range(200)])
                written.append(await ledger.close())
            victim = written[0].segments[0].bookies[0]
            holding = sum(victim in m.all_bookies() for m in written)

            running = await magnetar("cluster", "decommission-bookie", victim, "--metadata", url)
            assert running.code == EXIT_FAILED, str(running)
            assert f"bookie {victim} is running" in running.err
            assert "stop it first" in running.err

            node = next(b for b in cluster.bookies if b.bookie_id == victim)
            await node.kill()
            await cluster.wait_unregistered(victim)

            # its disk is gone: a new bookie under its id is refused, and told what to run
            refused = await magnetar(
                "bookie",
                *("--data-dir", str(tmp_path / "refused"), "--bookie-id", victim),
                *("--metadata", url, "--port", "0", "--http-port", "0"),
            )
            assert refused.code == EXIT_FAILED, str(refused)
            assert f"magnetar cluster decommission-bookie {victim}" in refused.err

            decommission = await Background.start(
                "cluster",
                *("decommission-bookie", victim, "--metadata", url),
                *("--timeout-s", "60", "--poll-interval-s", "0.2"),
            )
            waiting = await decommission.stderr_line("still reference")
            assert waiting.startswith(f"waiting: {holding} ledger")
            assert f"still reference{'s' if holding == 1 else ''} {victim}" in waiting
            assert "no autorecovery instance is active" in waiting

            with open(tmp_path / "autorecovery.log", "wb") as log:
                autorecovery = await asyncio.create_subprocess_exec(
                    *(*COMMAND, "autorecovery", "--metadata", url, "--session-ttl-s", "2"),
                    *("--lost-bookie-grace-s", "0.5", "--check-interval-s", "0.2"),
                    *("--http-port", "0"),  # not the default 8001, which may be taken
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=log,
                    env=ENV,
                )
            run = await decommission.finish(timeout_s=60)
            assert run.code == EXIT_OK, str(run)
            assert run.out.startswith(f"decommissioned bookie {victim}: no ledger references it")
            assert f"({holding} did when this started" in run.out
            assert await store.get(layout.bookie_cookie(victim)) is None
            for metadata in written:
                assert victim not in (await client.ledgers.read(metadata.ledger_id)).all_bookies()

            # the id is free again: a bookie with an empty data dir starts under it
            fresh = await cluster.add_bookie(bookie_id=victim)
            assert fresh.data_dir != node.data_dir
            assert victim in await cluster.available_bookies()
        finally:
            if autorecovery is not None:
                autorecovery.send_signal(signal.SIGTERM)
                await asyncio.wait_for(autorecovery.wait(), 20)
            await client.close()
            await store.close()
