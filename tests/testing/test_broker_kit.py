"""Component tests of the test kit's brokers: real etcd, real ``magnetar broker`` processes."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from magnetar.testing.cluster import BrokerNode, LocalCluster
from magnetar.testing.etcd import EtcdServer
from metadata import layout, open_store
from proto.format.v1 import cluster_pb2

pytestmark = pytest.mark.etcd

# peer probes off: a killed broker then lingers until its session expires, as the kit documents
SHORT_SESSION = ("--session-ttl-s", "2", "--peer-probe-interval-ms", "0")


def is_alive(pid: int) -> bool:
    """True while ``pid`` names a process (a zombie counts: it was not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def unique_prefix() -> str:
    return f"kit-{uuid.uuid4().hex[:8]}"


async def broker_registrations(metadata_url: str) -> dict[str, cluster_pb2.BrokerRegistration]:
    store = await open_store(metadata_url)
    try:
        listing = await store.list(layout.BROKERS)
    finally:
        await store.close()
    return {
        record.key.removeprefix(layout.BROKERS): (
            cluster_pb2.BrokerRegistration.FromString(record.value)
        )
        for record in listing.records
    }


async def http_get(port: int, path: str) -> str:
    def get() -> str:
        url = f"http://127.0.0.1:{port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    return await asyncio.to_thread(get)


def event_time(log_path: Path, event: str) -> str:
    """The ISO timestamp of the last ``event`` in a JSON log (sortable as text)."""
    times = [
        record["timestamp"]
        for line in log_path.read_text().splitlines()
        if line.startswith("{") and (record := json.loads(line))["event"] == event
    ]
    assert times, f"no {event} in {log_path}"
    return str(times[-1])


async def test_brokers_start_after_the_bookies_register_and_stop_first(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    bookie_prefix, broker_prefix = unique_prefix(), unique_prefix()
    cluster = LocalCluster(
        tmp_path,
        bookies=1,
        brokers=2,
        metadata_url=etcd_server.url,
        bookie_id_prefix=bookie_prefix,
        broker_id_prefix=broker_prefix,
    )
    async with cluster:
        brokers = cluster.brokers
        assert [b.broker_id for b in brokers] == [f"{broker_prefix}-0", f"{broker_prefix}-1"]
        assert cluster.service_url == f"magnetar://{brokers[0].address},{brokers[1].address}"

        registered = await broker_registrations(cluster.metadata_url)
        for index, node in enumerate(brokers):
            assert node.is_running
            assert node.address.startswith("127.0.0.1:")
            assert node.service_url == f"magnetar://{node.address}"
            record = registered[node.broker_id or ""]
            assert record.broker_id == node.broker_id
            assert record.service_url == node.service_url
            assert record.http_address == f"127.0.0.1:{node.http_port}"
            assert node.log_path == tmp_path / f"broker-{index}.log"
            assert "broker_serving" in node.log_path.read_text()
        assert await cluster.registered_brokers() == {
            node.broker_id: node.service_url for node in brokers
        }
        # the ready line's metrics port is the broker's HTTP server
        assert (await http_get(brokers[0].http_port, "/health")).startswith("ok")

        pids = [node.pid for node in brokers]
    for node, pid in zip(brokers, pids, strict=True):
        assert pid is not None
        assert not is_alive(pid), f"broker {node.broker_id} outlived aclose()"
        assert node.exit_code == 0  # SIGTERM was a graceful shutdown, not a SIGKILL
    assert not {b.broker_id for b in brokers} & set(await broker_registrations(etcd_server.url))
    (bookie,) = cluster.bookies
    assert not bookie.is_running
    # brokers went first: both had finished before the bookie began to shut down
    bookie_stopping = event_time(bookie.log_path, "session_closed")
    for node in brokers:
        assert event_time(node.log_path, "broker_process_stopped") < bookie_stopping
    with pytest.raises(RuntimeError, match="no running broker"):
        _ = cluster.service_url


async def test_a_killed_broker_lingers_until_its_session_expires_and_comes_back(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    async with LocalCluster(
        tmp_path,
        bookies=0,
        brokers=2,
        metadata_url=etcd_server.url,
        broker_args=SHORT_SESSION,
        broker_id_prefix=prefix,
    ) as cluster:
        victim, other = cluster.brokers
        victim_id = f"{prefix}-0"
        # each broker's Pulsar listener, on a free port of its own, from its ready line
        pulsar_urls = {victim.pulsar_url, other.pulsar_url}
        assert len(pulsar_urls) == 2
        assert all(url.startswith("pulsar://127.0.0.1:") for url in pulsar_urls)

        # SIGKILL: the registration stays until the 2 s session lease runs out
        old_url = victim.service_url
        killed_at = time.monotonic()
        await victim.kill()
        assert victim.exit_code == -9
        assert not victim.is_running
        assert victim_id in await cluster.registered_brokers()
        assert cluster.service_url == other.service_url
        await cluster.wait_broker_unregistered(victim_id, timeout_s=10)
        expired_after = time.monotonic() - killed_at
        assert 1 < expired_after < 6, f"registration went {expired_after:.1f}s after SIGKILL"

        # the same broker id again, on a new port
        await victim.restart()
        assert victim.broker_id == victim_id
        await cluster.wait_brokers_registered([victim_id], timeout_s=5)
        assert (await cluster.registered_brokers())[victim_id] == victim.service_url
        print(f"restarted {victim_id}: {old_url} -> {victim.service_url}")

        # a paused broker runs, but is left out of the service URL
        await other.pause()
        assert other.is_paused
        assert cluster.service_url == victim.service_url
        await other.resume()
        assert cluster.service_url == f"magnetar://{victim.address},{other.address}"

        # a graceful stop deregisters before the process exits, and exits 0
        await other.stop()
        assert other.exit_code == 0
        assert f"{prefix}-1" not in await cluster.registered_brokers()

        added = await cluster.add_broker(extra_args=["--load-shedding-interval-ms", "2000"])
        assert added.broker_id == f"{prefix}-2"
        assert added.log_path == tmp_path / "broker-2.log"
        harness_line = added.log_path.read_text().splitlines()[0]
        assert harness_line.endswith(
            "--session-ttl-s 2 --peer-probe-interval-ms 0 --load-shedding-interval-ms 2000"
        )
        assert cluster.service_url == f"magnetar://{victim.address},{added.address}"


async def test_a_broker_that_cannot_start_raises_quoting_its_log(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    node = BrokerNode(
        etcd_server.url,
        log_path=tmp_path / "bad.log",
        broker_id=f"{unique_prefix()}-bad",
        extra_args=["--port", "99999"],
    )
    with pytest.raises(RuntimeError, match="before it was ready") as raised:
        await node.start(timeout_s=30)
    message = str(raised.value)
    assert "must be a port number from 0 to 65535, got 99999" in message
    assert str(tmp_path / "bad.log") in message
    assert not node.is_running
    assert node.pid is None
    assert node.exit_code == 1


async def test_a_cluster_whose_broker_cannot_start_kills_its_bookies(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    cluster = LocalCluster(
        tmp_path,
        bookies=1,
        brokers=1,
        metadata_url=etcd_server.url,
        bookie_id_prefix=unique_prefix(),
        broker_id_prefix=unique_prefix(),
        broker_args=["--session-ttl-s", "1"],
    )
    with pytest.raises(RuntimeError, match="session_ttl_s"):
        await cluster.start()
    assert cluster.bookies
    assert not any(node.is_running for node in [*cluster.bookies, *cluster.brokers])
    assert cluster.bookies[0].exit_code == -9


async def test_a_broker_without_an_id_names_itself_after_its_address(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    async with BrokerNode(etcd_server.url, log_path=tmp_path / "anon.log") as node:
        assert node.broker_id == node.address.replace(":", "-")
        assert node.broker_id in await broker_registrations(etcd_server.url)
    assert node.exit_code == 0
