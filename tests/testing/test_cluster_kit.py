"""Component tests of the multi-process test kit: real etcd, real ``magnetar bookie`` processes."""

from __future__ import annotations

import asyncio
import gc
import os
import time
import uuid
from pathlib import Path

import pytest

from magnetar.testing.cluster import BookieNode, LocalCluster
from magnetar.testing.etcd import EtcdCluster, EtcdServer
from metadata import layout, open_store
from proto.format.v1 import cluster_pb2

pytestmark = pytest.mark.etcd


def is_alive(pid: int) -> bool:
    """True while ``pid`` names a process (a zombie counts: it was not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def process_state(pid: int) -> str:
    """The kernel's one-letter state of a process: "T" while stopped by SIGSTOP."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def unique_prefix() -> str:
    return f"kit-{uuid.uuid4().hex[:8]}"


async def registrations(metadata_url: str) -> dict[str, cluster_pb2.BookieRegistration]:
    store = await open_store(metadata_url)
    try:
        listing = await store.list(layout.BOOKIES_AVAILABLE)
    finally:
        await store.close()
    return {
        record.key.removeprefix(layout.BOOKIES_AVAILABLE): (
            cluster_pb2.BookieRegistration.FromString(record.value)
        )
        for record in listing.records
    }


async def test_a_cluster_of_three_bookies_starts_registers_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, bookies=3, zones=["a", "b"])
    async with cluster:
        etcd = cluster.etcd
        assert isinstance(etcd, EtcdServer)
        assert cluster.metadata_url == etcd.url
        nodes = cluster.bookies
        assert [node.bookie_id for node in nodes] == ["bookie-0", "bookie-1", "bookie-2"]
        assert [node.data_dir for node in nodes] == [tmp_path / f"bookie-{i}" for i in range(3)]

        registered = await registrations(cluster.metadata_url)
        assert set(registered) == {"bookie-0", "bookie-1", "bookie-2"}
        for node, zone in zip(nodes, ["a", "b", "a"], strict=True):
            assert node.is_running
            assert node.address.startswith("127.0.0.1:")
            assert node.http_port > 0
            assert registered[node.bookie_id or ""].address == node.address
            assert registered[node.bookie_id or ""].labels["zone"] == zone
            # stderr (the JSON logs) went to the log file next to the data dir
            assert node.log_path == tmp_path / f"bookie-{nodes.index(node)}.log"
            assert "bookie_started" in node.log_path.read_text()

        pids = [node.pid for node in nodes]
        etcd_pid = etcd.pid
    assert etcd_pid is not None
    for pid in [*pids, etcd_pid]:
        assert pid is not None
        assert not is_alive(pid), f"process {pid} outlived aclose()"
    assert not any(node.is_running for node in cluster.bookies)
    assert not etcd.is_running


async def test_a_cluster_on_a_three_member_etcd(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path, bookies=1, etcd_members=3) as cluster:
        assert isinstance(cluster.etcd, EtcdCluster)
        assert cluster.metadata_url == cluster.etcd.url
        assert cluster.metadata_url.count(",") == 2
        (node,) = cluster.bookies
        assert (await cluster.available_bookies()) == {"bookie-0": node.address}
        members = cluster.etcd.members
    assert not any(member.is_running for member in members)


async def test_kill_restart_stop_and_add_on_a_shared_etcd(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    async with LocalCluster(
        tmp_path, bookies=2, metadata_url=etcd_server.url, bookie_id_prefix=prefix
    ) as cluster:
        assert cluster.etcd is None
        victim, other = cluster.bookies
        assert victim.bookie_id == f"{prefix}-0"

        # a crash, then the same data dir again: the same bookie, registered anew
        old_pid, old_address = victim.pid, victim.address
        await victim.kill()
        assert not victim.is_running
        assert victim.pid is None
        assert old_pid is not None
        assert not is_alive(old_pid)
        await victim.restart()
        assert victim.bookie_id == f"{prefix}-0"
        assert victim.pid != old_pid
        await cluster.wait_registered([f"{prefix}-0"], timeout_s=10)
        registered = await registrations(cluster.metadata_url)
        assert registered[f"{prefix}-0"].address == victim.address
        print(f"restarted {victim.bookie_id}: {old_address} -> {victim.address}")

        # SIGSTOP holds the process without ending it
        other_pid = other.pid
        assert other_pid is not None
        await other.pause()
        assert process_state(other_pid) == "T"
        assert other.is_paused
        await other.resume()
        assert process_state(other_pid) != "T"
        assert other.pid == other_pid

        # a graceful stop deregisters before the process exits
        started = time.monotonic()
        await other.stop()
        await cluster.wait_unregistered(f"{prefix}-1", timeout_s=3)
        assert time.monotonic() - started < 3
        assert f"{prefix}-1" not in await registrations(cluster.metadata_url)

        added = await cluster.add_bookie()
        assert added.bookie_id == f"{prefix}-2"
        assert added.data_dir == tmp_path / "bookie-2"
        assert (await cluster.available_bookies())[f"{prefix}-2"] == added.address
        pids = [node.pid for node in cluster.bookies if node.pid is not None]
        assert len(pids) == 2
    assert not any(is_alive(pid) for pid in pids)
    assert etcd_server.is_running  # a shared etcd is not the cluster's to stop
    assert not {f"{prefix}-0", f"{prefix}-2"} & set(await registrations(etcd_server.url))


async def test_a_bookie_that_cannot_start_raises_quoting_its_log(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    node = BookieNode(
        tmp_path / "bad",
        etcd_server.url,
        bookie_id=f"{unique_prefix()}-bad",
        extra_args=["--port", "99999"],
    )
    with pytest.raises(RuntimeError, match="before it was ready") as raised:
        await node.start(timeout_s=30)
    message = str(raised.value)
    assert "must be a port number from 0 to 65535, got 99999" in message
    assert str(tmp_path / "bad.log") in message
    assert not node.is_running
    assert node.pid is None


async def test_a_cluster_that_cannot_start_kills_what_it_started(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, bookies=2, bookie_args=["--session-ttl-s", "1"])
    with pytest.raises(RuntimeError, match="session_ttl_s"):
        await cluster.start()
    assert isinstance(cluster.etcd, EtcdServer)
    assert not cluster.etcd.is_running
    assert not any(node.is_running for node in cluster.bookies)


def test_a_node_outlives_its_event_loop_and_a_forgotten_one_is_killed(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    # started in one event loop, stopped from another: as a session fixture and its tests do
    node = BookieNode(tmp_path / "b", etcd_server.url, bookie_id=f"{unique_prefix()}-loops")
    asyncio.run(node.start())
    pid = node.pid
    assert pid is not None
    assert is_alive(pid)
    asyncio.run(node.stop())
    assert not is_alive(pid)

    # a node nobody stops is SIGKILLed and reaped when it is garbage-collected
    asyncio.run(node.start())
    pid = node.pid
    assert pid is not None
    del node
    gc.collect()
    assert not is_alive(pid)
