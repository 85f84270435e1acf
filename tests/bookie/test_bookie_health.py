"""The bookie's gRPC health service, as Kubernetes probes read it: ``""`` is readiness (registered
under a live metadata session, not stopping), ``magnetar.bookie.v1.BookieService`` is liveness
(the process runs). Each test asks the real gRPC health service with ``Check``; faults are
injected into the metadata store with :class:`FaultyMetadataStore`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bookie.client.bookie_client import BookieClient
from bookie.entries import AddEntry, entry_checksum
from bookie.process import LIVENESS_SERVICE, READINESS_SERVICE, BookieProcess
from bookie.service.config import BookieConfig
from bookie.storage.config import StorageConfig
from magnetar.common.errors import MetadataUnavailableError
from magnetar.testing.eventually import eventually
from magnetar.testing.probes import NOT_SERVING, SERVING, grpc_health, http_get
from metadata import layout, open_store
from metadata.faults import FaultyMetadataStore


async def health_status(bookie: BookieProcess, service: str) -> int:
    return await grpc_health(f"127.0.0.1:{bookie.port}", service)


async def http_status(bookie: BookieProcess) -> int:
    return (await http_get(bookie.http_port))[0]


def entry(ledger: int, entry_id: int) -> AddEntry:
    data = f"ledger {ledger} entry {entry_id}".encode()
    return AddEntry(ledger, entry_id, -1, data, entry_checksum(ledger, entry_id, -1, data), False)


@pytest.fixture
async def faulty() -> AsyncIterator[FaultyMetadataStore]:
    store = FaultyMetadataStore(await open_store("memory://"))
    yield store
    store.heal()
    await store.close()


@pytest.fixture
async def bookie(tmp_path: Path, faulty: FaultyMetadataStore) -> AsyncIterator[BookieProcess]:
    """A bookie with a 2 s session (a lost one is noticed within about 1.5 s)."""
    config = BookieConfig(
        data_dir=tmp_path / "b1",
        metadata="memory://",
        port=0,
        http_port=0,
        data_port=0,
        bind_host="127.0.0.1",
        advertised_host="127.0.0.1",
        session_ttl_s=2,
        registration_refresh_s=0.5,
        storage=StorageConfig(gc_interval_s=0, max_group_wait_ms=0),
    )
    process = await BookieProcess.start(config, store=faulty)
    yield process
    await process.stop(grace_s=0)


async def test_a_started_bookie_is_ready_and_live(bookie: BookieProcess) -> None:
    assert READINESS_SERVICE == ""
    assert LIVENESS_SERVICE == "magnetar.bookie.v1.BookieService"
    assert await health_status(bookie, READINESS_SERVICE) == SERVING
    assert await health_status(bookie, LIVENESS_SERVICE) == SERVING
    assert await http_status(bookie) == 200


async def test_readiness_follows_the_registration_session_and_liveness_does_not(
    bookie: BookieProcess, faulty: FaultyMetadataStore
) -> None:
    key = layout.bookie_available(bookie.bookie_id)
    first = await faulty.inner.get(key)
    assert first is not None

    outage = MetadataUnavailableError("injected: the metadata store cannot be reached")
    faulty.fail("keepalive", outage)
    faulty.fail("grant_lease", outage)
    await eventually(
        lambda: _is(bookie, READINESS_SERVICE, NOT_SERVING), timeout_s=5, interval_s=0.05
    )
    assert await health_status(bookie, LIVENESS_SERVICE) == SERVING
    assert await http_status(bookie) == 503
    # unready is not dead: it still takes writes and reads
    client = BookieClient(f"127.0.0.1:{bookie.data_port}")
    try:
        assert await client.add_entries([entry(1, 0)]) == []
        read = await client.read_entries(1, 0, 0)
        assert [e.payload for e in read.entries] == [entry(1, 0).payload]
    finally:
        await client.close()

    faulty.heal()
    await eventually(lambda: _is(bookie, READINESS_SERVICE, SERVING), timeout_s=5, interval_s=0.05)
    again = await faulty.inner.get(key)
    assert again is not None
    assert again.lease_id != first.lease_id
    assert await health_status(bookie, LIVENESS_SERVICE) == SERVING
    assert await http_status(bookie) == 200


async def test_a_stopping_bookie_is_unready_before_it_leaves_the_cluster(
    bookie: BookieProcess, faulty: FaultyMetadataStore
) -> None:
    key = layout.bookie_available(bookie.bookie_id)
    # leaving (revoking the registration's lease) waits 2 s
    faulty.stall("revoke_lease", 2.0)
    stopping = asyncio.create_task(bookie.stop(grace_s=0))
    await eventually(
        lambda: _is(bookie, READINESS_SERVICE, NOT_SERVING), timeout_s=1.0, interval_s=0.05
    )
    assert await faulty.inner.get(key) is not None
    assert await health_status(bookie, LIVENESS_SERVICE) == NOT_SERVING
    await asyncio.wait_for(stopping, timeout=10)
    assert await faulty.inner.get(key) is None


async def _is(bookie: BookieProcess, service: str, status: int) -> bool:
    return await health_status(bookie, service) == status
