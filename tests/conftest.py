"""Shared fixtures: a real etcd for the whole session, and metadata stores of every backend.

The metadata contract tests take the ``store`` fixture and so run once per backend: memory,
embedded (a real directory under tmp_path) and etcd (the session's real etcd server; each test
works under its own key prefix, ``ns``, so tests never see each other's keys).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
import pytest_asyncio
from hypothesis import settings

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from magnetar.testing.etcd import EtcdServer
from metadata import MetadataStore, MetadataStoreConfig, open_store

# no timing thresholds in tests (the house rule): Hypothesis's 200 ms per example is one, and
# a loaded 2-core machine crosses it without anything being wrong
settings.register_profile("magnetar", deadline=None)
settings.load_profile("magnetar")

BACKENDS = ["memory", "embedded", pytest.param("etcd", marks=pytest.mark.etcd)]

OpenStore = Callable[..., Awaitable[MetadataStore]]


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EtcdServer]:
    """One real etcd (Debian's etcd-server) on free ports, shared by the whole session."""
    server = EtcdServer(data_dir=tmp_path_factory.mktemp("etcd-shared"), name="shared")
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def ns() -> str:
    """A key prefix of this test's own."""
    return f"/test/{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backend_url(backend: str, request: pytest.FixtureRequest, tmp_path: object) -> Iterator[str]:
    if backend == "memory":
        yield "memory://"
    elif backend == "embedded":
        yield f"embedded://{tmp_path}/metadata"
    else:
        server: EtcdServer = request.getfixturevalue("etcd_server")
        yield server.url


@pytest.fixture
async def open_metadata(backend_url: str) -> AsyncIterator[OpenStore]:
    """Opens stores of this test's backend (with config overrides); closes them afterwards."""
    opened: list[MetadataStore] = []

    async def _open(**overrides: object) -> MetadataStore:
        config = MetadataStoreConfig(url=backend_url, **overrides)  # type: ignore[arg-type]
        store = await open_store(config)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        await store.close()


@pytest.fixture
async def store(open_metadata: OpenStore) -> MetadataStore:
    return await open_metadata()
