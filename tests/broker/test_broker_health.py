"""The broker's gRPC health service, as Kubernetes probes read it: ``""`` is readiness (a live
metadata session, not stopping), the broker's service names are liveness (the process runs).

Each test asks the real gRPC health service with ``Check``. The metadata store is wrapped in
:class:`FaultyMetadataStore` to take etcd away and to hold a graceful stop at its first metadata
write; the last test does the same with real processes and a real etcd that is stopped."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.process import LIVENESS_SERVICE, READINESS_SERVICE, SERVICE_NAMES
from broker.service.catalog import read_handover, read_owner
from magnetar.common.errors import MetadataUnavailableError
from magnetar.testing import LocalCluster
from magnetar.testing.eventually import eventually
from magnetar.testing.probes import NOT_SERVING, SERVING, http_get
from metadata.faults import FaultyMetadataStore
from proto.admin.v1 import admin_pb2 as admin
from proto.broker.v1 import broker_pb2 as pb
from tests.broker.conftest import Cluster, StartCluster


class Health:
    """``grpc.health.v1.Health/Check`` against one server, as a probe would ask it."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = health_pb2_grpc.HealthStub(self._channel)

    async def status(self, service: str) -> int:
        answer = await self._stub.Check(  # type: ignore[attr-defined]
            health_pb2.HealthCheckRequest(service=service), timeout=2
        )
        return int(answer.status)

    async def is_(self, service: str, status: int) -> bool:
        return await self.status(service) == status

    async def close(self) -> None:
        await self._channel.close()


async def http_status(port: int) -> int:
    return (await http_get(port))[0]


async def test_a_started_broker_is_ready_and_live(start_cluster: StartCluster) -> None:
    cluster = await start_cluster(bookies=0)
    health = Health(cluster.brokers[0].address)
    try:
        assert READINESS_SERVICE == ""
        assert LIVENESS_SERVICE == "magnetar.broker.v1.BrokerService"
        for service in (READINESS_SERVICE, *SERVICE_NAMES):
            assert await health.status(service) == SERVING, service
        assert await http_status(cluster.brokers[0].http_port) == 200
    finally:
        await health.close()


async def test_readiness_follows_the_metadata_session_and_liveness_does_not(
    faulty_cluster: tuple[Cluster, FaultyMetadataStore],
) -> None:
    cluster, faulty = faulty_cluster
    broker = await cluster.add_broker()
    health = Health(broker.address)
    try:
        assert await health.status(READINESS_SERVICE) == SERVING

        # etcd is gone: keepalives fail and no new session can be had
        outage = MetadataUnavailableError("injected: the metadata store cannot be reached")
        faulty.fail("keepalive", outage)
        faulty.fail("grant_lease", outage)
        await eventually(
            lambda: health.is_(READINESS_SERVICE, NOT_SERVING), timeout_s=5, interval_s=0.05
        )
        assert broker.broker.sessions_lost == 1
        for service in SERVICE_NAMES:
            assert await health.status(service) == SERVING, service
        assert await http_status(broker.http_port) == 503
        # still unready while the outage lasts (the broker keeps trying for a new session)
        await asyncio.sleep(0.5)
        assert await health.status(READINESS_SERVICE) == NOT_SERVING
        assert await health.status(LIVENESS_SERVICE) == SERVING

        # etcd is back: the broker starts a new session and is ready again
        faulty.heal()
        await eventually(
            lambda: health.is_(READINESS_SERVICE, SERVING), timeout_s=8, interval_s=0.05
        )
        assert broker.broker.serving
        assert await http_status(broker.http_port) == 200
        for service in SERVICE_NAMES:
            assert await health.status(service) == SERVING, service
    finally:
        await health.close()


async def test_a_graceful_stop_is_unready_before_any_partition_is_handed_over(
    faulty_cluster: tuple[Cluster, FaultyMetadataStore],
) -> None:
    cluster, faulty = faulty_cluster
    for _ in range(3):
        await cluster.add_bookie()
    leaving = await cluster.add_broker()
    await cluster.admin(leaving).CreateTopic(admin.CreateTopicRequest(topic="moves", partitions=3))
    lookup = await cluster.broker_stub(leaving).Lookup(pb.LookupRequest(topic="moves"))
    partitions = [o.partition_topic for o in lookup.owners]
    assert {o.broker_id for o in lookup.owners} == {leaving.broker_id}
    staying = await cluster.add_broker()
    health = Health(leaving.address)
    try:
        # every metadata write waits 2 s: a graceful stop cannot hand anything over before then
        faulty.stall("txn", 2.0)
        stopping = asyncio.create_task(leaving.stop(graceful=True))
        await eventually(
            lambda: health.is_(READINESS_SERVICE, NOT_SERVING), timeout_s=1.0, interval_s=0.05
        )
        owners = [await read_owner(faulty.inner, p) for p in partitions]
        assert [o.broker_id if o else None for o in owners] == [leaving.broker_id] * 3
        assert [await read_handover(faulty.inner, p, 0) for p in partitions] == [None] * 3
        # from a stop on, the liveness names say NOT_SERVING too, for good
        assert await health.status(LIVENESS_SERVICE) == NOT_SERVING
        assert staying.broker.serving

        faulty.heal()
        await asyncio.wait_for(stopping, timeout=20)
        hints = [await read_handover(faulty.inner, p, 0) for p in partitions]
        assert [h.broker_id if h else None for h in hints] == [staying.broker_id] * 3
        for p in partitions:
            owner = await read_owner(faulty.inner, p)
            assert owner is None or owner.broker_id != leaving.broker_id
    finally:
        await health.close()


@pytest.mark.etcd
@pytest.mark.timeout(60)
async def test_real_processes_against_a_real_etcd_that_stops(tmp_path: Path) -> None:
    """A broker and a bookie as OS processes: etcd stopped, then started again."""
    ttl = ["--session-ttl-s", "2"]
    async with LocalCluster(
        tmp_path, bookies=1, brokers=1, bookie_args=ttl, broker_args=ttl
    ) as cluster:
        assert cluster.etcd is not None
        broker = Health(cluster.brokers[0].address)
        bookie = Health(cluster.bookies[0].address)
        try:
            for health in (broker, bookie):
                await eventually(
                    partial(health.is_, READINESS_SERVICE, SERVING), timeout_s=5, interval_s=0.05
                )
            await cluster.etcd.stop()
            for health in (broker, bookie):
                await eventually(
                    partial(health.is_, READINESS_SERVICE, NOT_SERVING),
                    timeout_s=6,
                    interval_s=0.05,
                )
            assert await broker.status(LIVENESS_SERVICE) == SERVING
            assert await bookie.status("magnetar.bookie.v1.BookieService") == SERVING
            await cluster.etcd.start()
            for health in (broker, bookie):
                await eventually(
                    partial(health.is_, READINESS_SERVICE, SERVING),
                    timeout_s=15,
                    interval_s=0.05,
                )
            assert await broker.status(LIVENESS_SERVICE) == SERVING
        finally:
            await broker.close()
            await bookie.close()
