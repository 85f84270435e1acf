"""The etcd backend under faults: real etcd processes that the tests stop, kill and restart."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from magnetar.common.errors import MetadataUnavailableError
from magnetar.testing.etcd import EtcdCluster, EtcdServer
from magnetar.testing.eventually import eventually
from metadata import MetadataStore, MetadataStoreConfig, Watch, WatchEvent, open_store
from metadata.coordination import Session
from metadata.etcd import EtcdMetadataStore

pytestmark = pytest.mark.etcd

T = TypeVar("T")

# A process that holds a lease-bound key until it is killed.
HOLDER = """
import asyncio, sys
from magnetar.common.log import configure_logging
from metadata import open_store
from metadata.coordination import Session

async def main(url, key, ttl):
    configure_logging(mode="json", stream=sys.stderr)
    store = await open_store(url)
    session = await Session.start(store, ttl_s=int(ttl))
    await store.put(key, b"held", lease_id=session.lease_id)
    print("READY", session.lease_id, session.ttl_s, flush=True)
    await asyncio.Event().wait()

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture
async def etcd(tmp_path: Path) -> AsyncIterator[EtcdServer]:
    """An etcd of this test's own, which it may stop, kill and restart."""
    server = EtcdServer(data_dir=tmp_path / "etcd", name="faults")
    await server.start()
    yield server
    await server.aclose()


async def retrying(action: Callable[[], Awaitable[T]], timeout_s: float = 20) -> T:
    """Run ``action`` until it stops failing with MetadataUnavailableError (etcd coming back)."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                return await action()
            except MetadataUnavailableError:
                await asyncio.sleep(0.1)


async def next_events(watch: Watch, count: int, timeout_s: float = 20) -> list[WatchEvent]:
    events: list[WatchEvent] = []
    async with asyncio.timeout(timeout_s):
        while len(events) < count:
            events.append(await anext(watch))
    return events


@pytest.mark.parametrize("graceful", [True, False], ids=["stop", "sigkill"])
async def test_watch_resumes_after_etcd_restart(etcd: EtcdServer, ns: str, graceful: bool) -> None:
    store = await open_store(etcd.url)
    async with await store.watch(f"{ns}/") as watch:
        before = [await store.put(f"{ns}/before/{i}", b"x") for i in range(5)]
        # written, but not yet read from the watch when etcd goes away
        pending = [await store.put(f"{ns}/pending/{i}", b"x") for i in range(5)]
        await etcd.restart(graceful=graceful)
        after = [
            await retrying(lambda i=i: store.put(f"{ns}/after/{i}", b"x"))  # type: ignore[misc]
            for i in range(5)
        ]
        events = await next_events(watch, 15)
    assert [e.revision for e in events] == before + pending + after
    assert len({e.key for e in events}) == 15  # each change exactly once
    await store.close()


async def test_session_loss_is_signalled_when_etcd_stops(etcd: EtcdServer, ns: str) -> None:
    config = MetadataStoreConfig(url=etcd.url, request_timeout_ms=1000)
    store = await open_store(config)
    session = await Session.start(store, ttl_s=3)
    await store.put(f"{ns}/owned", b"x", lease_id=session.lease_id)
    await asyncio.sleep(0.5)
    assert session.alive
    loop = asyncio.get_running_loop()
    await etcd.stop()
    stopped_at = loop.time()
    error = await asyncio.wait_for(session.wait_lost(), session.ttl_s + 2)
    # it gives up before the lease could have expired on the server
    assert loop.time() - stopped_at < session.ttl_s
    assert "could not refresh" in str(error)
    await session.close()
    # and the store itself comes back with etcd
    await etcd.start()
    assert await retrying(lambda: store.get(f"{ns}/nothing")) is None
    await store.close()


async def test_lease_keys_vanish_within_the_ttl_after_their_owner_is_killed(
    etcd: EtcdServer, ns: str
) -> None:
    store = await open_store(etcd.url)
    key = f"{ns}/owned-by-child"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLDER,
        etcd.url,
        key,
        "3",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 30)
        assert line.startswith(b"READY"), line
        ttl_s = int(line.split()[2])
        assert await store.get(key) is not None
        loop = asyncio.get_running_loop()
        child.send_signal(signal.SIGKILL)
        killed_at = loop.time()
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()

    async def expired() -> bool:
        return await store.get(key) is None

    await eventually(expired, timeout_s=ttl_s + 5, interval_s=0.05)
    # the child refreshed its lease at most ttl/3 before it died; etcd checks expiry every 0.5 s
    assert loop.time() - killed_at <= ttl_s + 1.0
    await store.close()


async def test_requests_fail_clearly_while_etcd_is_down(etcd: EtcdServer, ns: str) -> None:
    store = await open_store(MetadataStoreConfig(url=etcd.url, request_timeout_ms=1000))
    await store.put(f"{ns}/a", b"x")
    await etcd.stop()
    with pytest.raises(MetadataUnavailableError, match=etcd.endpoint):
        await store.get(f"{ns}/a")
    with pytest.raises(MetadataUnavailableError, match=etcd.endpoint):
        await store.put(f"{ns}/b", b"x")
    await etcd.start()
    record = await retrying(lambda: store.get(f"{ns}/a"))
    assert record is not None
    assert record.value == b"x"
    await store.close()


@pytest.mark.slow
async def test_store_rides_over_the_loss_of_the_member_it_uses(tmp_path: Path, ns: str) -> None:
    cluster = EtcdCluster(data_dir=tmp_path / "cluster", size=3)
    await cluster.start()
    try:
        store: MetadataStore = await open_store(cluster.url)
        assert isinstance(store, EtcdMetadataStore)
        async with await store.watch(f"{ns}/") as watch:
            first = await store.put(f"{ns}/a", b"1")
            in_use = store.current_endpoint
            victim = next(m for m in cluster.members if m.endpoint == in_use)
            await victim.kill()
            second = await retrying(lambda: store.put(f"{ns}/b", b"2"))
            assert store.current_endpoint != in_use
            record = await store.get(f"{ns}/a")
            assert record is not None
            events = await next_events(watch, 2)
            assert [e.revision for e in events] == [first, second]
            await victim.start()
        await store.close()
    finally:
        await cluster.aclose()
