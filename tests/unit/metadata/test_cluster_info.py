"""The cluster's record at /magnetar/cluster: init writes it once, create-only, and is safe to
repeat; it waits for a store that is not reachable yet, and gives up when it said it would."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from magnetar.common.clock import ManualClock
from magnetar.common.errors import (
    ClusterNameConflictError,
    InvalidArgumentError,
    InvalidMetadataUrlError,
    KeyExistsError,
    OperationTimeoutError,
)
from magnetar.testing.etcd import free_port
from metadata import MetadataStore, layout, open_store
from metadata.cluster_info import (
    FORMAT_VERSION,
    ClusterInfo,
    initialize_cluster,
    initialize_cluster_waiting,
    read_cluster_info,
)


@pytest.fixture
async def store() -> MetadataStore:
    return await open_store("memory://")


async def test_init_writes_the_record_once(store: MetadataStore) -> None:
    assert await read_cluster_info(store) is None
    clock = ManualClock(start_time_ms=1_790_000_000_000)
    result = await initialize_cluster(store, "prod-eu.1", clock=clock)
    assert result.created
    assert result.info == ClusterInfo("prod-eu.1", FORMAT_VERSION, 1_790_000_000_000)
    assert await read_cluster_info(store) == result.info
    # the record itself is create-only: nobody else's write can replace it by accident
    with pytest.raises(KeyExistsError):
        await store.create(layout.CLUSTER, b"")


async def test_init_again_with_the_same_name_changes_nothing(store: MetadataStore) -> None:
    first = await initialize_cluster(store, "prod")
    record = await store.get(layout.CLUSTER)
    again = await initialize_cluster(store, "prod")
    assert not again.created
    assert again.info == first.info  # the first creation time, not this call's
    assert await store.get(layout.CLUSTER) == record


async def test_init_with_another_name_is_refused_naming_both(store: MetadataStore) -> None:
    await initialize_cluster(store, "prod")
    with pytest.raises(ClusterNameConflictError, match="for cluster 'prod', not 'staging'") as e:
        await initialize_cluster(store, "staging")
    assert e.value.context["cluster_name"] == "prod"
    info = await read_cluster_info(store)
    assert info is not None
    assert info.cluster_name == "prod"


@pytest.mark.parametrize("name", ["", " prod", "prod cluster", "a/b", "-prod", "é", "x" * 64])
async def test_bad_names_are_refused_with_the_rule(store: MetadataStore, name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="1-63 letters, digits"):
        await initialize_cluster(store, name)
    assert await read_cluster_info(store) is None


async def test_waiting_init_on_a_reachable_store_is_idempotent(tmp_path: Path) -> None:
    url = f"embedded://{tmp_path}/metadata"
    told: list[str] = []
    first = await initialize_cluster_waiting(url, "prod", wait_s=5, on_wait=told.append)
    again = await initialize_cluster_waiting(url, "prod", wait_s=5, on_wait=told.append)
    assert first.created
    assert not again.created
    assert again.info == first.info
    assert told == []  # nothing was waited for
    with pytest.raises(ClusterNameConflictError):
        await initialize_cluster_waiting(url, "other", wait_s=5)


async def test_waiting_init_says_what_it_waits_for_then_gives_up() -> None:
    url = f"etcd://127.0.0.1:{free_port()}"  # nothing listens there
    told: list[str] = []
    started = time.monotonic()
    with pytest.raises(OperationTimeoutError, match=r"could not be reached within 1 s") as e:
        await initialize_cluster_waiting(
            url, "prod", wait_s=1, on_wait=told.append, retry_interval_s=0.2, report_interval_s=0.5
        )
    took = time.monotonic() - started
    assert 1 <= took < 10  # it waited, and gave up long before the 15 s a store connect may take
    assert "cluster is not initialised" in e.value.message
    assert told
    assert all(m.startswith(f"waiting for the metadata store at {url}") for m in told)
    assert len(told) < 5  # reported every 0.5 s, not at every 0.2 s attempt


async def test_waiting_init_fails_at_once_on_what_waiting_cannot_cure() -> None:
    started = time.monotonic()
    with pytest.raises(InvalidMetadataUrlError):
        await initialize_cluster_waiting("zookeeper://zk:2181", "prod", wait_s=30)
    with pytest.raises(InvalidArgumentError, match="invalid cluster name"):
        await initialize_cluster_waiting(f"etcd://127.0.0.1:{free_port()}", "a b", wait_s=30)
    assert time.monotonic() - started < 15  # at once: not the 30 s it was told to wait
