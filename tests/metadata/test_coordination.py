"""Sessions, locks, leader election and id allocation, on every backend."""

from __future__ import annotations

import asyncio

import pytest

from magnetar.common.errors import (
    LockBusyError,
    MetadataUnavailableError,
    SessionLostError,
    WatchCompactedError,
)
from metadata import MetadataStore, MetadataStoreConfig, open_store
from metadata.coordination import IdAllocator, LeaderElection, LockManager, Session
from metadata.etcd import EtcdMetadataStore
from metadata.faults import FaultyMetadataStore

# --- sessions ---------------------------------------------------------------------------------


async def test_session_keeps_its_keys_past_the_ttl(
    store: MetadataStore, ns: str, backend: str
) -> None:
    # etcd's leases are coarser than a second; the in-process backends keep 1 s exactly
    async with await Session.start(store, ttl_s=2 if backend == "etcd" else 1) as session:
        await store.put(f"{ns}/member", b"me", lease_id=session.lease_id)
        loop = asyncio.get_running_loop()
        end = loop.time() + session.ttl_s * 2.5
        while loop.time() < end:
            assert await store.get(f"{ns}/member") is not None
            await asyncio.sleep(0.2)
        assert session.alive
    # closing revokes the lease: the key goes at once, not after the TTL
    assert await store.get(f"{ns}/member") is None


async def test_session_loss_is_signalled_when_its_lease_is_revoked(
    store: MetadataStore, ns: str
) -> None:
    session = await Session.start(store, ttl_s=2, name="victim")
    told: list[SessionLostError] = []
    session.on_lost(told.append)
    await store.revoke_lease(session.lease_id)  # what an operator or an expiry would do
    error = await asyncio.wait_for(session.wait_lost(), session.ttl_s + 2)
    assert "lost" in str(error)
    assert told == [error]
    assert not session.alive
    with pytest.raises(SessionLostError):
        session.check()
    await session.close()


async def test_session_gives_up_before_its_lease_can_expire(ns: str) -> None:
    # A session that cannot reach the store must declare itself lost *before* the server could
    # expire the lease and hand what it held to someone else.
    inner = await open_store("memory://")
    faulty = FaultyMetadataStore(inner)
    session = await Session.start(faulty, ttl_s=3)
    await inner.put(f"{ns}/held", b"x", lease_id=session.lease_id)
    faulty.fail("keepalive", MetadataUnavailableError("injected: metadata unreachable"))
    await asyncio.wait_for(session.wait_lost(), session.ttl_s + 1)
    # the server-side lease has not expired yet: nobody else could have taken the key
    assert await inner.get(f"{ns}/held") is not None
    assert faulty.injected["keepalive"] >= 1
    await session.close()
    await faulty.close()


async def test_session_survives_a_short_outage(ns: str) -> None:
    inner = await open_store("memory://")
    faulty = FaultyMetadataStore(inner)
    session = await Session.start(faulty, ttl_s=3)
    faulty.fail("keepalive", MetadataUnavailableError("injected"), times=2)
    await asyncio.sleep(session.ttl_s * 1.5)
    assert session.alive
    assert faulty.injected["keepalive"] == 2
    await session.close()
    await faulty.close()


# --- locks ------------------------------------------------------------------------------------


async def test_lock_is_exclusive_between_sessions(store: MetadataStore, ns: str) -> None:
    s1 = await Session.start(store, ttl_s=5)
    s2 = await Session.start(store, ttl_s=5)
    m1 = await LockManager(store, s1, f"{ns}/locks").start()
    m2 = await LockManager(store, s2, f"{ns}/locks").start()
    lock = await m1.acquire(f"{ns}/locks/partition-0", b"broker-1")
    with pytest.raises(LockBusyError, match="held by another session") as info:
        await m2.acquire(f"{ns}/locks/partition-0", b"broker-2")
    assert "broker-1" in str(info.value)
    # the same session may ask again and gets the lock it holds
    assert await m1.acquire(f"{ns}/locks/partition-0", b"broker-1") is lock
    await lock.update(b"broker-1 v2")
    record = await store.get(f"{ns}/locks/partition-0")
    assert record is not None
    assert record.value == b"broker-1 v2"
    await lock.release()
    assert not lock.held
    lock2 = await m2.acquire(f"{ns}/locks/partition-0", b"broker-2")
    assert lock2.held
    await asyncio.sleep(0.2)
    assert not lock2.lost.is_set()
    for manager in (m1, m2):
        await manager.close()
    for session in (s1, s2):
        await session.close()


async def test_lock_is_lost_with_its_session(store: MetadataStore, ns: str) -> None:
    s1 = await Session.start(store, ttl_s=2)
    s2 = await Session.start(store, ttl_s=5)
    m1 = await LockManager(store, s1, f"{ns}/locks").start()
    m2 = await LockManager(store, s2, f"{ns}/locks").start()
    lock = await m1.acquire(f"{ns}/locks/p", b"one")
    await store.revoke_lease(s1.lease_id)
    await asyncio.wait_for(lock.lost.wait(), 10)
    assert not lock.held
    with pytest.raises(LockBusyError, match="not held"):
        await lock.update(b"too late")
    taken = await m2.acquire(f"{ns}/locks/p", b"two")
    assert taken.held
    for manager in (m1, m2):
        await manager.close()
    for session in (s1, s2):
        await session.close()


async def test_lock_is_lost_when_its_key_is_removed_or_taken(store: MetadataStore, ns: str) -> None:
    session = await Session.start(store, ttl_s=5)
    manager = await LockManager(store, session, f"{ns}/locks").start()
    deleted = await manager.acquire(f"{ns}/locks/a", b"x")
    taken = await manager.acquire(f"{ns}/locks/b", b"x")
    untouched = await manager.acquire(f"{ns}/locks/c", b"x")
    await store.delete(f"{ns}/locks/a")
    await store.put(f"{ns}/locks/b", b"intruder")  # no lease: not ours any more
    await asyncio.wait_for(deleted.lost.wait(), 10)
    await asyncio.wait_for(taken.lost.wait(), 10)
    assert "deleted" in deleted.lost_reason
    assert "another session" in taken.lost_reason
    assert untouched.held
    await manager.close()
    await session.close()


# --- leader election --------------------------------------------------------------------------


async def test_one_leader_at_a_time_and_succession(store: MetadataStore, ns: str) -> None:
    sessions = [await Session.start(store, ttl_s=5, name=f"c{i}") for i in range(3)]
    elections = [
        LeaderElection(store, s, f"{ns}/leader", f"candidate-{i}".encode())
        for i, s in enumerate(sessions)
    ]
    campaigns = [asyncio.create_task(e.campaign()) for e in elections]
    done, _ = await asyncio.wait(campaigns, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1
    await asyncio.sleep(0.3)
    assert sum(e.is_leader for e in elections) == 1
    first = next(i for i, e in enumerate(elections) if e.is_leader)
    leader = await elections[first].leader()
    assert leader is not None
    assert leader.value == f"candidate-{first}".encode()

    # resigning hands over to exactly one other candidate
    await elections[first].resign()
    await asyncio.wait_for(
        asyncio.wait(
            [c for i, c in enumerate(campaigns) if i != first], return_when="FIRST_COMPLETED"
        ),
        10,
    )
    await asyncio.sleep(0.3)
    leaders = [i for i, e in enumerate(elections) if e.is_leader]
    assert len(leaders) == 1
    second = leaders[0]
    assert second != first

    # the second leader's session dies: the last candidate takes over
    await sessions[second].close()
    last = next(i for i in range(3) if i not in (first, second))
    await asyncio.wait_for(campaigns[last], 10)
    assert elections[last].is_leader
    leader = await elections[last].leader()
    assert leader is not None
    assert leader.value == f"candidate-{last}".encode()
    for election in elections:
        await election.close()
    for session in sessions:
        await session.close()


async def test_campaign_ends_when_the_session_is_lost(store: MetadataStore, ns: str) -> None:
    holder = await Session.start(store, ttl_s=5)
    waiter = await Session.start(store, ttl_s=2)
    leading = LeaderElection(store, holder, f"{ns}/leader", b"holder")
    await leading.campaign()
    waiting = LeaderElection(store, waiter, f"{ns}/leader", b"waiter")
    campaign = asyncio.create_task(waiting.campaign())
    await asyncio.sleep(0.2)
    await store.revoke_lease(waiter.lease_id)
    with pytest.raises(SessionLostError):
        await asyncio.wait_for(campaign, 10)
    assert leading.is_leader
    await leading.close()
    for session in (holder, waiter):
        await session.close()


# --- ids --------------------------------------------------------------------------------------


async def test_concurrent_id_allocators_never_collide(store: MetadataStore, ns: str) -> None:
    allocators = [IdAllocator(store, f"{ns}/ledger-ids") for _ in range(4)]

    async def allocate(allocator: IdAllocator) -> list[int]:
        return [await allocator.next_id() for _ in range(1000)]

    results = await asyncio.gather(*(allocate(a) for a in allocators))
    all_ids = [i for ids in results for i in ids]
    assert len(all_ids) == 4000
    assert len(set(all_ids)) == 4000
    for ids in results:
        assert ids == sorted(ids)  # each allocator sees increasing ids
    # and an id allocated after all of them is larger than every one
    assert await allocators[0].next_id() > max(all_ids)


# --- history compaction -----------------------------------------------------------------------


async def test_watch_from_compacted_history_fails_loudly(open_metadata, ns: str) -> None:
    store = await open_metadata(watch_history_events=10)
    first = await store.put(f"{ns}/k", b"0")
    last = first
    for i in range(40):
        last = await store.put(f"{ns}/k", str(i).encode())
    if isinstance(store, EtcdMetadataStore):
        await store.compact(last)
    with pytest.raises(WatchCompactedError, match="list again"):
        await store.watch(f"{ns}/", start_revision=first)
    # a watch from the current listing works
    listing = await store.list(f"{ns}/")
    async with await store.watch(f"{ns}/", start_revision=listing.revision + 1) as watch:
        version = await store.put(f"{ns}/k", b"after")
        event = await asyncio.wait_for(anext(watch), 10)
    assert event.revision == version


async def test_lagging_local_watch_fails_rather_than_skipping(ns: str) -> None:
    store = await open_store(MetadataStoreConfig(url="memory://", watch_history_events=10))
    async with await store.watch(f"{ns}/") as watch:
        for i in range(40):
            await store.put(f"{ns}/k{i}", b"x")
        with pytest.raises(WatchCompactedError):
            await asyncio.wait_for(anext(watch), 5)
    await store.close()
