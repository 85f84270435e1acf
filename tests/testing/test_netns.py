"""Network partitions and full disks from the test kit: :class:`IsolatedHost` on its own, then a
:class:`LocalCluster` whose last broker runs in one (cut from etcd, cut from the bookies),
brokers on fixed ports, and bookies on tmpfs file systems of their own.

Needs root (network namespaces, tmpfs mounts); skipped, saying why, where the machine cannot.
Every wait is a condition polled up to a generous deadline, never a fixed pause.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from magnetar.aio import Client, Consumer, Producer
from magnetar.common.errors import MagnetarError, ReceiveTimeoutError
from magnetar.testing import (
    BookieNode,
    EtcdCluster,
    IsolatedHost,
    LocalCluster,
    netns_unsupported_reason,
)
from magnetar.testing.eventually import eventually
from magnetar.testing.netns import LINKS
from metadata import layout, open_store
from proto.common.v1 import types_pb2
from proto.format.v1 import cluster_pb2

UNSUPPORTED = netns_unsupported_reason()

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.skipif(UNSUPPORTED is not None, reason=f"{UNSUPPORTED}"),
]

BROKER_ARGS = [
    "--session-ttl-s", "3",
    "--load-report-interval-ms", "500",
    "--load-shedding-enabled", "false",
    # a writer whose bookies are all cut off gives up on them (and recovers onto a new ledger
    # once they are back) after seconds rather than the default half minute
    "--ledger-add-timeout-ms", "2000",
    "--ledger-ensemble-change-timeout-ms", "2000",
]  # fmt: skip

# One process inside the namespace tries each (host, port) and prints what happened to each.
PROBE = """
import json, socket, sys
results = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
        results[target] = "ok"
    except TimeoutError:
        results[target] = "timeout"
    except OSError as e:
        results[target] = f"errno {e.errno}"
print(json.dumps(results))
"""

# A server inside the namespace, for connections from this machine to the inside.
INSIDE_SERVER = """
import socket
server = socket.create_server(("0.0.0.0", 0))
print(server.getsockname()[1], flush=True)
while True:
    server.accept()[0].close()
"""

ENETUNREACH = f"errno {errno.ENETUNREACH}"
EHOSTUNREACH = f"errno {errno.EHOSTUNREACH}"


async def probe_from_inside(host: IsolatedHost, targets: dict[str, str]) -> dict[str, str]:
    """Connect from inside ``host`` to each ``name -> "ip:port"``; ``name -> outcome``."""
    result = await asyncio.to_thread(
        subprocess.run,
        [*host.command_prefix, sys.executable, "-c", PROBE, *targets.values()],
        capture_output=True,
        text=True,
        check=True,
    )
    outcomes = json.loads(result.stdout)
    return {name: outcomes[target] for name, target in targets.items()}


async def connect_from_here(address: str) -> str:
    host, port = address.rsplit(":", 1)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 10)
    except TimeoutError:
        return "timeout"
    except OSError as e:
        return f"errno {e.errno}"
    writer.close()
    await writer.wait_closed()
    return "ok"


def start_inside_server(host: IsolatedHost) -> subprocess.Popen[str]:
    """A server inside ``host``; it prints its port, then accepts until killed."""
    return subprocess.Popen(
        [*host.command_prefix, sys.executable, "-c", INSIDE_SERVER],
        stdout=subprocess.PIPE,
        text=True,
    )


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def namespaces() -> str:
    return ip("netns", "list")


def host_links() -> str:
    return ip("-o", "link")


def host_routes() -> str:
    return ip("route")


# -- IsolatedHost on its own -------------------------------------------------------------------


async def test_each_link_is_cut_and_healed_on_its_own() -> None:
    servers: list[asyncio.Server] = []

    async def serve(address: str) -> str:
        server = await asyncio.start_server(lambda _r, w: w.close(), address, 0)
        servers.append(server)
        return f"{address}:{server.sockets[0].getsockname()[1]}"

    host = IsolatedHost()
    with pytest.raises(RuntimeError, match="no addresses until it is created"):
        host.gateway("etcd")
    await host.create()
    inside: subprocess.Popen[str] | None = None
    try:
        assert host.name.startswith("mgv-")
        assert host.name in namespaces()
        assert host.command_prefix == ["ip", "netns", "exec", host.name]
        assert host.address == host.inside_address("clients")
        assert len({host.subnet(link) for link in LINKS}) == 3
        with pytest.raises(ValueError, match="clients, etcd, bookies"):
            host.gateway("metadata")
        with pytest.raises(ValueError, match="unknown link 'metadata'"):
            await host.cut("metadata")

        gateways = {link: await serve(host.gateway(link)) for link in LINKS}
        assert await probe_from_inside(host, gateways) == dict.fromkeys(LINKS, "ok")
        inside = start_inside_server(host)
        assert inside.stdout is not None
        inside_port = (await asyncio.to_thread(inside.stdout.readline)).strip()
        inside_address = f"{host.address}:{inside_port}"
        assert await connect_from_here(inside_address) == "ok"

        for link in LINKS:
            await host.cut(link)
            assert host.is_cut(link)
            outcomes = await probe_from_inside(host, gateways)
            # fails at once (no route inside), rather than waiting for a timeout
            assert outcomes == {name: ENETUNREACH if name == link else "ok" for name in LINKS}
            # this machine still reaches every gateway: they are its own addresses
            for address in gateways.values():
                assert await connect_from_here(address) == "ok"
            if link == "clients":
                # ... but not the inside, and it says so at once
                assert await connect_from_here(inside_address) == EHOSTUNREACH
            await host.heal(link)
            assert not host.is_cut(link)
            assert await probe_from_inside(host, gateways) == dict.fromkeys(LINKS, "ok")
        assert await connect_from_here(inside_address) == "ok"
    finally:
        if inside is not None:
            inside.kill()
            inside.wait()
            assert inside.stdout is not None
            inside.stdout.close()
        for server in servers:
            server.close()
        await host.close()
    await host.close()  # idempotent
    assert host.name not in namespaces()
    assert host.name.removeprefix("mgv-") not in host_links()
    assert not any(host.subnet(link) in host_routes() for link in LINKS)
    with pytest.raises(RuntimeError, match="not created"):
        await host.heal("etcd")


async def test_a_host_left_by_a_killed_process_is_swept_by_the_next_one() -> None:
    crash = (
        "import asyncio, os, signal\n"
        "from magnetar.testing.netns import IsolatedHost\n"
        "host = IsolatedHost()\n"
        "asyncio.run(host.create())\n"
        "print(host.name, host.subnet('etcd'), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", crash], capture_output=True, text=True
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    name, subnet = result.stdout.split()
    assert name in namespaces()
    assert subnet in host_routes()
    async with IsolatedHost():
        assert name not in namespaces()
        assert subnet not in host_routes()


# -- a cluster with an isolated broker ---------------------------------------------------------


@asynccontextmanager
async def isolated_cluster(root: Path, *, etcd_members: int = 1) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(
        root,
        etcd_members=etcd_members,
        bookies=3,
        brokers=1,
        isolated_brokers=1,
        fixed_broker_ports=True,
        bookie_tmpfs_mb=64,
        broker_args=BROKER_ARGS,
    ) as cluster:
        yield cluster
    assert cluster.isolated_host is None


async def read_prefix(metadata_url: str, prefix: str) -> dict[str, bytes]:
    store = await open_store(metadata_url)
    try:
        listing = await store.list(prefix)
    finally:
        await store.close()
    return {record.key.removeprefix(prefix): record.value for record in listing.records}


async def owners(metadata_url: str) -> dict[str, str]:
    """partition -> broker id, from etcd itself (whatever the brokers can reach)."""
    return {
        partition: cluster_pb2.OwnershipRecord.FromString(value).broker_id
        for partition, value in (await read_prefix(metadata_url, layout.OWNERSHIP)).items()
    }


async def bookie_registrations(metadata_url: str) -> dict[str, cluster_pb2.BookieRegistration]:
    return {
        bookie_id: cluster_pb2.BookieRegistration.FromString(value)
        for bookie_id, value in (await read_prefix(metadata_url, layout.BOOKIES_AVAILABLE)).items()
    }


class Sender:
    """Sends numbered messages to one partition, one at a time, and remembers what was
    acknowledged and what failed (a failed send may still have been stored)."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.acked: set[int] = set()
        self.failed: dict[int, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            try:
                await self.producer.send(str(number).encode())
            except MagnetarError as e:
                self.failed[number] = repr(e)
            else:
                self.acked.add(number)
            number += 1
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


async def receive_all(consumer: Consumer, expected: set[int]) -> set[int]:
    """Receive (and acknowledge) until every ``expected`` message came, then whatever else
    the subscription still has; gives up on ``expected`` after 30 s of silence."""
    received: set[int] = set()
    while True:
        quiet_ms = 30_000 if expected - received else 300
        try:
            message = await consumer.receive(timeout_millis=quiet_ms)
        except ReceiveTimeoutError:
            return received
        received.add(int(message.data()))
        await consumer.acknowledge(message)


async def partition_of(cluster: LocalCluster, client: Client, topic: str, broker_id: str) -> str:
    """A partition of a new 4-partition ``topic`` that ``broker_id`` owns.

    New partitions go to the least loaded brokers, so with both brokers known to the load
    manager (their load reports are in) each takes two.
    """
    broker_ids = {broker.broker_id for broker in cluster.brokers}

    async def both_reported() -> bool:
        return broker_ids <= set(await read_prefix(cluster.metadata_url, layout.LOAD))

    await eventually(
        both_reported, what="every broker's load report", timeout_s=30, interval_s=0.05
    )
    async with client.admin() as admin:
        await admin.create_topic(topic, partitions=4)
    producer = await client.create_producer(topic)  # the lookup assigns every partition
    await producer.close()
    owned = await owners(cluster.metadata_url)
    mine = sorted(p for p, b in owned.items() if b == broker_id and topic in p)
    assert mine, f"{broker_id} owns no partition of {topic}: {owned}"
    return mine[0]


async def test_a_broker_cut_from_etcd_hands_its_partition_over_and_rejoins(
    tmp_path: Path,
) -> None:
    async with isolated_cluster(tmp_path) as cluster:
        host, isolated = cluster.isolated_host, cluster.isolated_broker
        assert host is not None
        assert isolated is not None
        assert isolated is cluster.brokers[-1]
        assert isolated.broker_id == "broker-1"
        assert isolated.address == f"{host.address}:{isolated.port}"
        assert isolated.service_url.removeprefix("magnetar://") in cluster.service_url
        assert all(b.address.startswith(host.gateway("bookies")) for b in cluster.bookies)
        (other,) = (b for b in cluster.brokers if b is not isolated)

        client = Client(cluster.service_url, operation_timeout_s=30)
        try:
            partition = await partition_of(cluster, client, "orders", "broker-1")
            consumer = await client.subscribe(partition, "check", initial_position="earliest")
            sender = Sender(await client.create_producer(partition, send_timeout_ms=10_000))
            sender.start()
            await eventually(
                lambda: len(sender.acked) >= 20,
                what="20 sends through broker-1",
                timeout_s=30,
                interval_s=0.05,
            )

            await host.cut("etcd")
            assert host.is_cut("etcd")

            async def taken_over() -> bool:
                return (await owners(cluster.metadata_url)).get(partition) == other.broker_id

            await eventually(
                taken_over,
                what=f"{other.broker_id} owning {partition}",
                timeout_s=30,
                interval_s=0.05,
            )
            assert "broker-1" not in await cluster.registered_brokers()
            at_takeover = len(sender.acked)
            await eventually(
                lambda: len(sender.acked) >= at_takeover + 20,
                what="20 more sends, through the new owner",
                timeout_s=30,
                interval_s=0.05,
            )

            await host.heal("etcd")
            await cluster.wait_brokers_registered(["broker-1"], timeout_s=30)
            await sender.stop()

            received = await receive_all(consumer, sender.acked)
            assert sender.acked <= received, sorted(sender.acked - received)[:20]
            assert received <= sender.acked | set(sender.failed)
        finally:
            await client.close()
        log = isolated.log_path.read_text()
        assert "broker_session_lost" in log
        assert "ownership_lost" in log


async def test_a_broker_cut_from_the_bookies_fails_writes_and_recovers(tmp_path: Path) -> None:
    async with isolated_cluster(tmp_path) as cluster:
        host = cluster.isolated_host
        assert host is not None
        client = Client(cluster.service_url, operation_timeout_s=30)
        try:
            partition = await partition_of(cluster, client, "payments", "broker-1")
            consumer = await client.subscribe(partition, "check", initial_position="earliest")
            sender = Sender(await client.create_producer(partition, send_timeout_ms=3000))
            sender.start()
            await eventually(
                lambda: len(sender.acked) >= 20,
                what="20 sends through broker-1",
                timeout_s=30,
                interval_s=0.05,
            )

            await host.cut("bookies")
            await eventually(
                lambda: len(sender.failed) > 0, what="a send to fail", timeout_s=30, interval_s=0.05
            )
            # still the owner: it is cut from the bookies, not from etcd
            assert (await owners(cluster.metadata_url))[partition] == "broker-1"

            await host.heal("bookies")
            at_heal = len(sender.acked)
            await eventually(
                lambda: len(sender.acked) >= at_heal + 20,
                what="20 sends after the heal",
                timeout_s=60,
                interval_s=0.05,
            )
            await sender.stop()

            received = await receive_all(consumer, sender.acked)
            assert sender.acked <= received, sorted(sender.acked - received)[:20]
            assert received <= sender.acked | set(sender.failed)
            assert (await owners(cluster.metadata_url))[partition] == "broker-1"
        finally:
            await client.close()


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")


def is_mount(path: Path) -> bool:
    return os.path.ismount(path)


async def test_brokers_keep_their_ports_across_restarts_and_the_cluster_across_stop(
    tmp_path: Path,
) -> None:
    # three etcd members: the isolated broker reaches each of them through its etcd link
    async with isolated_cluster(tmp_path, etcd_members=3) as cluster:
        assert isinstance(cluster.etcd, EtcdCluster)
        assert cluster.isolated_broker is not None
        gateway = cluster.isolated_broker.metadata_url.removeprefix("etcd://").split(",")
        assert len(gateway) == 3
        assert all(
            endpoint.startswith(f"{cluster.etcd.extra_client_hosts[0]}:") for endpoint in gateway
        )
        service_url = cluster.service_url
        addresses = [broker.address for broker in cluster.brokers]
        assert all(broker.port != 0 for broker in cluster.brokers)
        isolated = cluster.isolated_broker
        assert isolated is not None

        # `ip netns exec` execs: the pid is the broker's own, so signals reach it
        pid = isolated.pid
        assert pid is not None
        assert "magnetar.cli" in command_line(pid)
        await isolated.pause()
        assert process_state(pid) == "T"
        await isolated.resume()
        assert process_state(pid) != "T"

        await cluster.brokers[0].restart()
        await isolated.kill()
        assert isolated.exit_code == -signal.SIGKILL
        await isolated.start()
        assert isolated.pid != pid
        assert [broker.address for broker in cluster.brokers] == addresses
        assert cluster.service_url == service_url
        await cluster.wait_brokers_registered(timeout_s=30)

        # a client still using the old service URL finds both brokers
        async with Client(service_url, operation_timeout_s=30) as client:
            partition = await partition_of(cluster, client, "restarts", "broker-1")
            producer = await client.create_producer(partition)
            sent = await producer.send(b"after the restarts")
            consumer = await client.subscribe(partition, "check", initial_position="earliest")
            message = await consumer.receive(timeout_millis=30_000)
            assert message.data() == b"after the restarts"
            assert message.message_id() == sent

        # stop() heals a cut link first (the broker's graceful stop needs etcd), and keeps the
        # isolated host and the bookies' file systems: start() brings the same cluster back
        host = cluster.isolated_host
        assert host is not None
        await host.cut("etcd")
        await cluster.stop()
        assert not host.is_cut("etcd")
        assert [broker.exit_code for broker in cluster.brokers] == [0, 0]
        await cluster.start()
        assert cluster.isolated_host is host
        assert cluster.service_url == service_url


async def metric(node: BookieNode, name: str) -> float:
    url = f"http://{node.http_address}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in {url}")


async def test_a_full_bookie_disk_turns_it_read_only_and_a_killed_bookie_keeps_its_data(
    tmp_path: Path,
) -> None:
    async with isolated_cluster(tmp_path) as cluster:
        bookie = cluster.bookies[0]
        assert bookie.tmpfs is not None
        assert bookie.tmpfs.mount_point == tmp_path / "bookie-0.fs"
        assert is_mount(bookie.tmpfs.mount_point)
        assert bookie.data_dir == tmp_path / "bookie-0.fs" / "data"
        assert bookie.log_path == tmp_path / "bookie-0.log"

        async with Client(cluster.service_url, operation_timeout_s=30) as client:
            producer = await client.create_producer("kept")
            for n in range(10):
                await producer.send(str(n).encode())
            await producer.close()
        stored = {
            name: await metric(bookie, name)
            for name in ("magnetar_bookie_ledgers", "magnetar_bookie_data_bytes")
        }
        assert all(value > 0 for value in stored.values()), stored

        # a SIGKILLed bookie restarts on the same tmpfs, with its data (and so its identity)
        await bookie.restart(graceful=False)
        await cluster.wait_registered(["bookie-0"])
        for name, value in stored.items():
            assert await metric(bookie, name) >= value, name

        async def state_is(state: int) -> bool:
            registration = (await bookie_registrations(cluster.metadata_url))["bookie-0"]
            return registration.state == state

        filled = [bookie.disk_filled]
        written = bookie.fill_disk()
        assert written > 0
        filled.append(bookie.disk_filled)
        assert bookie.tmpfs.free_bytes() <= 1 << 20
        assert not (bookie.data_dir / "filler").exists()
        await eventually(
            lambda: state_is(types_pb2.BOOKIE_STATE_READ_ONLY),
            what="read-only",
            timeout_s=30,
            interval_s=0.05,
        )
        assert await metric(bookie, "magnetar_bookie_read_only") == 1

        bookie.free_disk()
        filled.append(bookie.disk_filled)
        assert filled == [False, True, False]
        await eventually(
            lambda: state_is(types_pb2.BOOKIE_STATE_WRITABLE),
            what="writable again",
            timeout_s=30,
            interval_s=0.05,
        )
        assert await metric(bookie, "magnetar_bookie_read_only") == 0
        mount_point = bookie.tmpfs.mount_point
    assert not is_mount(mount_point)


def test_fault_options_refuse_what_they_cannot_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="isolated_brokers must be 0 or 1"):
        LocalCluster(tmp_path, isolated_brokers=2)
    with pytest.raises(ValueError, match="needs the cluster's own etcd"):
        LocalCluster(tmp_path, isolated_brokers=1, metadata_url="etcd://127.0.0.1:2379")
    with pytest.raises(ValueError, match="bookie_tmpfs_mb must be at least 1"):
        LocalCluster(tmp_path, bookie_tmpfs_mb=0)
    plain = BookieNode(tmp_path / "bookie", "etcd://127.0.0.1:2379")
    with pytest.raises(RuntimeError, match="no file system of its own"):
        plain.fill_disk()
    assert not plain.disk_filled
