"""Brokers and bookies in this process (real gRPC servers, real files, one memory metadata
store), for component tests of the broker. Fault tests use real processes instead
(magnetar.testing.LocalCluster)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from bookie.process import BookieProcess
from bookie.storage.config import StorageConfig
from broker.managed_ledger import ManagedLedgerConfig
from broker.process import BrokerProcess
from broker.service.config import BrokerConfig
from magnetar.testing.inprocess import start_bookie_in_process
from metadata import MetadataStore, open_store
from metadata.faults import FaultyMetadataStore
from proto.admin.v1 import admin_pb2_grpc
from proto.broker.v1 import broker_pb2_grpc


class Cluster:
    def __init__(self, root: Path, store: MetadataStore, broker_config: BrokerConfig) -> None:
        self.root = root
        self.store = store
        self.broker_config = broker_config
        self.bookies: list[BookieProcess] = []
        self.brokers: list[BrokerProcess] = []
        self._channels: list[grpc.aio.Channel] = []

    async def add_bookie(self, storage: StorageConfig | None = None) -> BookieProcess:
        index = len(self.bookies)
        process = await start_bookie_in_process(
            self.store, self.root / f"bookie-{index}", f"bookie-{index}", storage=storage
        )
        self.bookies.append(process)
        return process

    async def add_broker(self, **overrides: Any) -> BrokerProcess:
        config = replace(self.broker_config, broker_id=f"broker-{len(self.brokers)}", **overrides)
        process = await BrokerProcess.start(config, store=self.store)
        self.brokers.append(process)
        return process

    @property
    def service_url(self) -> str:
        return "magnetar://" + ",".join(b.address for b in self.brokers)

    def channel(self, broker: BrokerProcess | None = None) -> grpc.aio.Channel:
        channel = grpc.aio.insecure_channel(
            (broker or self.brokers[0]).address,
            options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
        )
        self._channels.append(channel)
        return channel

    def admin(self, broker: BrokerProcess | None = None) -> admin_pb2_grpc.AdminServiceAsyncStub:
        return admin_pb2_grpc.AdminServiceStub(self.channel(broker))

    def broker_stub(
        self, broker: BrokerProcess | None = None
    ) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        return broker_pb2_grpc.BrokerServiceStub(self.channel(broker))

    def broker_by_id(self, broker_id: str) -> BrokerProcess:
        return next(b for b in self.brokers if b.broker_id == broker_id)

    async def close(self) -> None:
        for channel in self._channels:
            with contextlib.suppress(Exception):
                await channel.close()
        for broker in self.brokers:
            with contextlib.suppress(Exception):
                await broker.stop(graceful=False, grace_s=0)
        for bookie in self.bookies:
            with contextlib.suppress(Exception):
                await bookie.stop(grace_s=0)


def broker_config(**overrides: Any) -> BrokerConfig:
    ml = overrides.pop("managed_ledger", ManagedLedgerConfig(cursor_persist_interval_ms=100))
    overrides.setdefault("pulsar_port", 0)
    overrides.setdefault("pulsar_tls_port", 0)  # opens only with TLS (tls_cert_file)
    return BrokerConfig(
        metadata="memory://",
        port=0,
        http_port=0,
        bind_host="127.0.0.1",
        advertised_host="127.0.0.1",
        session_ttl_s=4,
        load_report_interval_ms=500,
        load_shedding_enabled=False,
        managed_ledger=ml,
        **overrides,
    )


StartCluster = Callable[..., Awaitable[Cluster]]


@pytest.fixture
async def start_cluster(tmp_path: Path) -> AsyncIterator[StartCluster]:
    made: list[Cluster] = []
    stores: list[MetadataStore] = []

    async def start(
        *,
        bookies: int = 3,
        brokers: int = 1,
        storage: StorageConfig | None = None,
        **overrides: Any,
    ) -> Cluster:
        store = await open_store("memory://")
        stores.append(store)
        cluster = Cluster(tmp_path / f"cluster-{len(made)}", store, broker_config(**overrides))
        made.append(cluster)
        for _ in range(bookies):
            await cluster.add_bookie(storage)
        for _ in range(brokers):
            await cluster.add_broker()
        return cluster

    yield start
    for cluster in made:
        await cluster.close()
    for store in stores:
        await store.close()


@pytest.fixture
async def faulty_cluster(tmp_path: Path) -> AsyncIterator[tuple[Cluster, FaultyMetadataStore]]:
    """In-process brokers and bookies on a memory store that faults can be injected into;
    sessions of 2 s, so a lost one is noticed within about 1.5 s."""
    faulty = FaultyMetadataStore(await open_store("memory://"))
    cluster = Cluster(tmp_path, faulty, replace(broker_config(), session_ttl_s=2))
    yield cluster, faulty
    faulty.heal()
    await cluster.close()
    await faulty.close()
