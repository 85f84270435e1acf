"""Component tests of the real-etcd harness, run against the etcd binary itself."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import aetcd
import grpc
import pytest

from magnetar.testing import etcd as etcd_module
from magnetar.testing.etcd import (
    EtcdCluster,
    EtcdServer,
    find_etcd_binary,
    free_port,
    require_etcd_binary,
)

# Errors a client sees while etcd restarts, loses a member or elects a leader.
TRANSIENT_ERRORS = (aetcd.exceptions.ClientError, grpc.aio.AioRpcError)

T = TypeVar("T")


@pytest.fixture
async def etcd(tmp_path: Path) -> AsyncIterator[EtcdServer]:
    async with EtcdServer(data_dir=tmp_path / "etcd") as server:
        yield server


@pytest.fixture
async def etcd_cluster(tmp_path: Path) -> AsyncIterator[EtcdCluster]:
    async with EtcdCluster(data_dir=tmp_path / "cluster", size=3) as cluster:
        yield cluster


@asynccontextmanager
async def client_of(server: EtcdServer) -> AsyncIterator[aetcd.Client]:
    client = aetcd.Client(host="127.0.0.1", port=server.client_port, timeout=5)
    try:
        yield client
    finally:
        await client.close()


async def eventually(action: Callable[[], Awaitable[T]], *, timeout_s: float = 15) -> T:
    """Run ``action`` until it stops failing with a transient client error, up to a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await action()
        except TRANSIENT_ERRORS:
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(0.1)


async def read_value(client: aetcd.Client, key: bytes, *, serializable: bool = False) -> bytes:
    result = await client.get(key, serializable=serializable)
    assert result is not None, f"{key!r} is missing"
    value: bytes = result.value
    return value


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_binary_is_found() -> None:
    binary = find_etcd_binary()

    assert binary is not None
    assert require_etcd_binary() == binary
    assert os.access(binary, os.X_OK)


def test_missing_binary_error_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(etcd_module, "_WELL_KNOWN_PATHS", (tmp_path / "etcd",))

    assert find_etcd_binary() is None
    with pytest.raises(RuntimeError, match="apt-get") as raised:
        require_etcd_binary()
    assert "scripts/test.sh" in str(raised.value)


def test_free_port_can_be_bound() -> None:
    port = free_port()

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.etcd
async def test_server_starts_healthy_and_serves_put_get(etcd: EtcdServer) -> None:
    assert etcd.is_running
    assert await etcd.is_healthy()
    assert etcd.endpoint == f"127.0.0.1:{etcd.client_port}"
    assert etcd.client_url == f"http://127.0.0.1:{etcd.client_port}"
    assert etcd.url == f"etcd://127.0.0.1:{etcd.client_port}"
    assert etcd.peer_url == f"http://127.0.0.1:{etcd.peer_port}"
    assert etcd.client_port != etcd.peer_port
    status = await etcd.status()
    assert status.leader_id == status.member_id

    async with client_of(etcd) as client:
        await client.put(b"greeting", b"hello")
        assert await read_value(client, b"greeting") == b"hello"


@pytest.mark.etcd
@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "sigkill"])
async def test_data_survives_restart_on_the_same_address(etcd: EtcdServer, graceful: bool) -> None:
    endpoint, old_pid = etcd.endpoint, etcd.pid
    async with client_of(etcd) as client:
        await client.put(b"durable", b"yes")

        await etcd.restart(graceful=graceful)

        assert etcd.endpoint == endpoint
        assert etcd.pid is not None
        assert etcd.pid != old_pid
        assert old_pid is not None
        assert not process_exists(old_pid)
        # the client made before the restart reconnects to the same address
        assert await eventually(lambda: read_value(client, b"durable")) == b"yes"


@pytest.mark.etcd
async def test_kill_leaves_no_process(etcd: EtcdServer) -> None:
    pid = etcd.pid
    assert pid is not None

    await etcd.kill()

    assert not etcd.is_running
    assert etcd.pid is None
    assert not process_exists(pid)
    assert not accepts_connections(etcd.client_port)
    assert not await etcd.is_healthy()


@pytest.mark.etcd
async def test_pause_stops_answers_until_resume(etcd: EtcdServer) -> None:
    async with client_of(etcd) as client:
        await client.put(b"before-pause", b"1")

        await etcd.pause()

        assert (etcd.is_running, etcd.is_paused) == (True, True)
        assert not await etcd.is_healthy(timeout_s=0.3)

        await etcd.resume()
        await etcd.wait_healthy(timeout_s=10)

        assert (etcd.is_running, etcd.is_paused) == (True, False)
        await eventually(lambda: client.put(b"after-pause", b"2"))
        assert await read_value(client, b"before-pause") == b"1"
        assert await read_value(client, b"after-pause") == b"2"


@pytest.mark.etcd
async def test_stop_of_a_paused_server_ends_it(etcd: EtcdServer) -> None:
    pid = etcd.pid
    assert pid is not None
    await etcd.pause()

    await etcd.stop(timeout_s=5)

    assert not process_exists(pid)


@pytest.mark.etcd
async def test_forgotten_server_is_killed_when_collected(tmp_path: Path) -> None:
    server = EtcdServer(data_dir=tmp_path / "forgotten")
    await server.start()
    pid = server.pid
    assert pid is not None

    del server
    gc.collect()

    assert not process_exists(pid)


@pytest.mark.etcd
async def test_start_failure_names_the_cause_and_leaves_no_process(tmp_path: Path) -> None:
    server = EtcdServer(data_dir=tmp_path / "bad", extra_args=["--no-such-flag"])

    with pytest.raises(RuntimeError, match="no-such-flag"):
        await server.start(timeout_s=10)

    assert not server.is_running
    assert server.log_path.exists()


@pytest.mark.etcd
async def test_start_moves_to_other_ports_when_picked_ones_were_taken(tmp_path: Path) -> None:
    server = EtcdServer(data_dir=tmp_path / "etcd")
    taken = server.client_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()

        async with server:
            assert server.client_port != taken
            assert await server.is_healthy()


@pytest.mark.etcd
async def test_given_port_in_use_fails_clearly(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = EtcdServer(data_dir=tmp_path / "etcd", client_port=taken)

        with pytest.raises(RuntimeError, match="address already in use"):
            await server.start(timeout_s=10)

    assert not server.is_running


@pytest.mark.etcd
async def test_server_without_data_dir_uses_and_removes_a_temporary_one() -> None:
    async with EtcdServer() as server:
        data_dir = server.data_dir
        assert (data_dir / "member").is_dir()

    assert not data_dir.exists()


@pytest.mark.etcd
async def test_cluster_elects_a_leader_and_survives_losing_it(etcd_cluster: EtcdCluster) -> None:
    members = etcd_cluster.members
    assert len(members) == 3
    assert len({m.client_port for m in members} | {m.peer_port for m in members}) == 6
    assert etcd_cluster.endpoints == [m.endpoint for m in members]
    assert etcd_cluster.url == "etcd://" + ",".join(m.endpoint for m in members)
    leader = await etcd_cluster.leader()
    statuses = [await m.status() for m in members]
    assert {s.leader_id for s in statuses} == {(await leader.status()).member_id}

    async with client_of(leader) as client:
        await client.put(b"before", b"1")
    await leader.kill()
    survivors = [m for m in members if m is not leader]

    new_leader = await etcd_cluster.leader()

    assert new_leader in survivors
    async with client_of(survivors[0]) as writer, client_of(survivors[1]) as reader:
        await eventually(lambda: writer.put(b"during", b"2"))
        assert await eventually(lambda: read_value(reader, b"during")) == b"2"
        assert await read_value(reader, b"before") == b"1"

    await leader.start()

    assert leader.is_running
    assert (await leader.status()).leader_id == (await new_leader.status()).member_id
    async with client_of(leader) as rejoined:
        # a local (serializable) read proves the rejoined member caught up by itself
        local = await eventually(lambda: read_value(rejoined, b"during", serializable=True))
        assert local == b"2"


@pytest.mark.etcd
async def test_cluster_restart_keeps_data_and_addresses(etcd_cluster: EtcdCluster) -> None:
    url = etcd_cluster.url
    first = etcd_cluster.members[0]
    async with client_of(first) as client:
        await client.put(b"kept", b"yes")

    await etcd_cluster.restart(graceful=False)

    assert etcd_cluster.url == url
    assert all(member.is_running for member in etcd_cluster.members)
    await etcd_cluster.leader()
    async with client_of(etcd_cluster.members[2]) as client:
        assert await eventually(lambda: read_value(client, b"kept")) == b"yes"
