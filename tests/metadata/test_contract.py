"""The metadata store contract: the same tests against memory, embedded and real etcd."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from magnetar.common.errors import (
    BadVersionError,
    InvalidArgumentError,
    KeyExistsError,
    LeaseNotFoundError,
    MetadataStoreClosedError,
    NoSuchKeyError,
    TransactionTooLargeError,
)
from magnetar.testing.eventually import eventually
from metadata import (
    ABSENT,
    NO_LEASE,
    Compare,
    DeleteOp,
    EventType,
    MetadataStore,
    PutOp,
    Watch,
    WatchEvent,
)

OpenStore = Callable[..., Awaitable[MetadataStore]]


async def next_events(watch: Watch, count: int, timeout_s: float = 10) -> list[WatchEvent]:
    events: list[WatchEvent] = []
    async with asyncio.timeout(timeout_s):
        while len(events) < count:
            events.append(await anext(watch))
    return events


async def no_event_within(watch: Watch, seconds: float) -> bool:
    try:
        async with asyncio.timeout(seconds):
            await anext(watch)
    except TimeoutError:
        return True
    return False


# --- single keys ------------------------------------------------------------------------------


async def test_get_of_missing_key_is_none(store: MetadataStore, ns: str) -> None:
    assert await store.get(f"{ns}/missing") is None


async def test_create_then_get(store: MetadataStore, ns: str) -> None:
    version = await store.create(f"{ns}/a", b"one")
    record = await store.get(f"{ns}/a")
    assert record is not None
    assert (record.key, record.value, record.version) == (f"{ns}/a", b"one", version)
    assert record.create_revision == version
    assert record.lease_id == NO_LEASE


async def test_create_refuses_an_existing_key(store: MetadataStore, ns: str) -> None:
    await store.create(f"{ns}/a", b"one")
    with pytest.raises(KeyExistsError, match="already exists") as info:
        await store.create(f"{ns}/a", b"two")
    assert info.value.context["key"] == f"{ns}/a"
    record = await store.get(f"{ns}/a")
    assert record is not None
    assert record.value == b"one"


async def test_every_write_gets_a_new_higher_version(store: MetadataStore, ns: str) -> None:
    versions = [await store.put(f"{ns}/a", str(i).encode()) for i in range(5)]
    assert versions == sorted(set(versions))
    record = await store.get(f"{ns}/a")
    assert record is not None
    assert (record.value, record.version) == (b"4", versions[-1])
    assert record.create_revision == versions[0]


async def test_put_with_expected_version_is_compare_and_swap(store: MetadataStore, ns: str) -> None:
    v1 = await store.create(f"{ns}/a", b"one")
    v2 = await store.put(f"{ns}/a", b"two", expected_version=v1)
    assert v2 > v1
    with pytest.raises(BadVersionError) as info:
        await store.put(f"{ns}/a", b"stale", expected_version=v1)
    assert info.value.context["expected_version"] == str(v1)
    assert info.value.context["actual_version"] == str(v2)
    record = await store.get(f"{ns}/a")
    assert record is not None
    assert record.value == b"two"


async def test_cas_on_a_missing_key_says_it_is_missing(store: MetadataStore, ns: str) -> None:
    with pytest.raises(NoSuchKeyError, match="does not exist"):
        await store.put(f"{ns}/nope", b"x", expected_version=5)
    assert await store.get(f"{ns}/nope") is None


async def test_concurrent_cas_has_exactly_one_winner(store: MetadataStore, ns: str) -> None:
    base = await store.create(f"{ns}/counter", b"0")

    async def attempt(i: int) -> int | None:
        try:
            return await store.put(f"{ns}/counter", f"w{i}".encode(), expected_version=base)
        except BadVersionError:
            return None

    results = await asyncio.gather(*(attempt(i) for i in range(8)))
    winners = [i for i, v in enumerate(results) if v is not None]
    assert len(winners) == 1
    record = await store.get(f"{ns}/counter")
    assert record is not None
    assert record.value == f"w{winners[0]}".encode()


async def test_recreated_key_does_not_match_its_old_version(store: MetadataStore, ns: str) -> None:
    # ABA: delete and re-create; a CAS holding the first incarnation's version must fail
    v1 = await store.create(f"{ns}/a", b"first")
    await store.delete(f"{ns}/a")
    v2 = await store.create(f"{ns}/a", b"second")
    assert v2 != v1
    with pytest.raises(BadVersionError):
        await store.put(f"{ns}/a", b"stale-writer", expected_version=v1)


async def test_delete(store: MetadataStore, ns: str) -> None:
    v1 = await store.create(f"{ns}/a", b"x")
    assert await store.delete(f"{ns}/missing") is False
    with pytest.raises(BadVersionError):
        await store.delete(f"{ns}/a", expected_version=v1 + 1000)
    assert await store.get(f"{ns}/a") is not None
    assert await store.delete(f"{ns}/a", expected_version=v1) is True
    assert await store.get(f"{ns}/a") is None
    with pytest.raises(NoSuchKeyError):
        await store.delete(f"{ns}/a", expected_version=v1)
    await store.create(f"{ns}/b", b"y")
    assert await store.delete(f"{ns}/b") is True


async def test_values_are_kept_byte_for_byte(store: MetadataStore, ns: str) -> None:
    value = bytes(range(256)) * 40
    await store.put(f"{ns}/bin", value)
    record = await store.get(f"{ns}/bin")
    assert record is not None
    assert record.value == value
    await store.put(f"{ns}/empty", b"")
    empty = await store.get(f"{ns}/empty")
    assert empty is not None
    assert empty.value == b""


async def test_unicode_keys(store: MetadataStore, ns: str) -> None:
    key = f"{ns}/tenant-ü/ns/tópico"
    await store.put(key, b"v")
    record = await store.get(key)
    assert record is not None
    assert record.key == key
    assert (await store.list(f"{ns}/tenant-ü/")).keys() == [key]


# --- listing ----------------------------------------------------------------------------------


async def test_list_returns_keys_under_the_prefix_in_order(store: MetadataStore, ns: str) -> None:
    for name in ["b/2", "a", "b/1", "c", "bb"]:
        await store.put(f"{ns}/{name}", name.encode())
    await store.put(f"{ns}x/outside", b"no")
    everything = await store.list(f"{ns}/")
    assert everything.keys() == [f"{ns}/{n}" for n in ["a", "b/1", "b/2", "bb", "c"]]
    assert [r.value for r in everything.records] == [b"a", b"b/1", b"b/2", b"bb", b"c"]
    # a folder prefix ends with '/': "b/" does not match "bb"
    assert (await store.list(f"{ns}/b/")).keys() == [f"{ns}/b/1", f"{ns}/b/2"]
    # a plain prefix matches like a string prefix, as in etcd
    assert (await store.list(f"{ns}/b")).keys() == [f"{ns}/b/1", f"{ns}/b/2", f"{ns}/bb"]
    assert (await store.list(f"{ns}/nothing/")).keys() == []
    assert everything.revision >= max(r.version for r in everything.records)


async def test_list_of_many_keys(store: MetadataStore, ns: str) -> None:
    # more than one etcd page
    await asyncio.gather(*(store.put(f"{ns}/k{i:05d}", b"v") for i in range(1500)))
    listing = await store.list(f"{ns}/")
    assert listing.keys() == [f"{ns}/k{i:05d}" for i in range(1500)]


# --- transactions -----------------------------------------------------------------------------


async def test_transaction_applies_all_or_nothing(store: MetadataStore, ns: str) -> None:
    va = await store.create(f"{ns}/a", b"a1")
    await store.create(f"{ns}/gone", b"x")
    result = await store.txn(
        [Compare(f"{ns}/a", va), Compare.absent(f"{ns}/b")],
        [PutOp(f"{ns}/a", b"a2"), PutOp(f"{ns}/b", b"b1"), DeleteOp(f"{ns}/gone")],
    )
    assert set(result.versions) == {f"{ns}/a", f"{ns}/b"}
    assert result.deleted == frozenset({f"{ns}/gone"})
    assert len({*result.versions.values(), result.revision}) == 1  # one revision for all
    a = await store.get(f"{ns}/a")
    b = await store.get(f"{ns}/b")
    assert a is not None
    assert b is not None
    assert (a.value, b.value) == (b"a2", b"b1")
    assert await store.get(f"{ns}/gone") is None

    # now the comparison on b fails: nothing of the second transaction happens
    with pytest.raises(BadVersionError) as info:
        await store.txn(
            [Compare(f"{ns}/a", result.versions[f"{ns}/a"]), Compare.absent(f"{ns}/b")],
            [PutOp(f"{ns}/a", b"a3"), PutOp(f"{ns}/c", b"c1")],
        )
    assert info.value.context["key"] == f"{ns}/b"
    assert info.value.context["expected_version"] == str(ABSENT)
    a = await store.get(f"{ns}/a")
    assert a is not None
    assert a.value == b"a2"
    assert await store.get(f"{ns}/c") is None


async def test_transaction_refuses_the_same_key_twice(store: MetadataStore, ns: str) -> None:
    with pytest.raises(InvalidArgumentError, match="written twice"):
        await store.txn([], [PutOp(f"{ns}/a", b"1"), DeleteOp(f"{ns}/a")])


async def test_transaction_size_limit_is_named(open_metadata, ns: str) -> None:
    store = await open_metadata(max_txn_ops=4)
    with pytest.raises(TransactionTooLargeError, match="at most 4"):
        await store.txn([], [PutOp(f"{ns}/k{i}", b"") for i in range(5)])


async def test_empty_delete_transaction_changes_nothing(store: MetadataStore, ns: str) -> None:
    await store.put(f"{ns}/a", b"x")
    before = (await store.list(f"{ns}/")).revision
    result = await store.txn([], [DeleteOp(f"{ns}/missing")])
    assert result.deleted == frozenset()
    assert result.revision >= before


# --- watches ----------------------------------------------------------------------------------


async def test_watch_delivers_every_change_in_order(store: MetadataStore, ns: str) -> None:
    async with await store.watch(f"{ns}/") as watch:
        v1 = await store.put(f"{ns}/a", b"1")
        v2 = await store.put(f"{ns}/b", b"2")
        await store.put(f"{ns}x/not-mine", b"?")
        v3 = await store.put(f"{ns}/a", b"3")
        await store.delete(f"{ns}/b")
        events = await next_events(watch, 4)
        assert [(e.type, e.key, e.value) for e in events] == [
            (EventType.PUT, f"{ns}/a", b"1"),
            (EventType.PUT, f"{ns}/b", b"2"),
            (EventType.PUT, f"{ns}/a", b"3"),
            (EventType.DELETE, f"{ns}/b", b""),
        ]
        assert [e.revision for e in events[:3]] == [v1, v2, v3]
        assert events[3].revision > v3
        assert await no_event_within(watch, 0.3)


async def test_watch_from_a_revision_replays_history(store: MetadataStore, ns: str) -> None:
    await store.put(f"{ns}/before", b"0")
    listing = await store.list(f"{ns}/")
    later = [await store.put(f"{ns}/k{i}", str(i).encode()) for i in range(5)]
    async with await store.watch(f"{ns}/", start_revision=listing.revision + 1) as watch:
        assert watch.start_revision == listing.revision + 1
        events = await next_events(watch, 5)
    assert [e.revision for e in events] == later
    assert [e.key for e in events] == [f"{ns}/k{i}" for i in range(5)]


async def test_watch_sees_concurrent_writes_without_gaps(store: MetadataStore, ns: str) -> None:
    async with await store.watch(f"{ns}/") as watch:

        async def writer(w: int) -> list[int]:
            return [await store.put(f"{ns}/w{w}/{i}", b"x") for i in range(25)]

        written = await asyncio.gather(*(writer(w) for w in range(4)))
        expected = sorted(v for versions in written for v in versions)
        events = await next_events(watch, len(expected))
    assert [e.revision for e in events] == expected


async def test_transaction_events_share_one_revision(store: MetadataStore, ns: str) -> None:
    async with await store.watch(f"{ns}/") as watch:
        result = await store.txn([], [PutOp(f"{ns}/a", b"1"), PutOp(f"{ns}/b", b"2")])
        events = await next_events(watch, 2)
    assert {e.key for e in events} == {f"{ns}/a", f"{ns}/b"}
    assert {e.revision for e in events} == {result.revision}


async def test_closing_a_watch_ends_iteration(store: MetadataStore, ns: str) -> None:
    watch = await store.watch(f"{ns}/")
    reader = asyncio.create_task(anext(watch))
    await asyncio.sleep(0.05)
    await watch.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(reader, 5)


# --- leases -----------------------------------------------------------------------------------


async def test_lease_bound_keys_vanish_on_revoke(store: MetadataStore, ns: str) -> None:
    lease = await store.grant_lease(30)
    assert lease.ttl_s >= 30
    await store.put(f"{ns}/owned/1", b"a", lease_id=lease.lease_id)
    await store.put(f"{ns}/owned/2", b"b", lease_id=lease.lease_id)
    await store.put(f"{ns}/free", b"c")
    record = await store.get(f"{ns}/owned/1")
    assert record is not None
    assert record.lease_id == lease.lease_id
    async with await store.watch(f"{ns}/") as watch:
        await store.revoke_lease(lease.lease_id)
        events = await next_events(watch, 2)
    assert {(e.type, e.key) for e in events} == {
        (EventType.DELETE, f"{ns}/owned/1"),
        (EventType.DELETE, f"{ns}/owned/2"),
    }
    assert (await store.list(f"{ns}/")).keys() == [f"{ns}/free"]
    with pytest.raises(LeaseNotFoundError):
        await store.keepalive(lease.lease_id)
    await store.revoke_lease(lease.lease_id)  # revoking twice is fine


async def test_put_with_an_unknown_lease_is_refused(store: MetadataStore, ns: str) -> None:
    with pytest.raises(LeaseNotFoundError):
        await store.put(f"{ns}/a", b"x", lease_id=987654321)
    assert await store.get(f"{ns}/a") is None


async def test_lease_expires_without_keepalive(store: MetadataStore, ns: str) -> None:
    lease = await store.grant_lease(1)  # etcd rounds this up to its minimum TTL
    await store.put(f"{ns}/ephemeral", b"x", lease_id=lease.lease_id)
    loop = asyncio.get_running_loop()
    granted_at = loop.time()

    async def expired() -> bool:
        return await store.get(f"{ns}/ephemeral") is None

    await eventually(expired, timeout_s=lease.ttl_s + 3, interval_s=0.05)
    assert loop.time() - granted_at >= lease.ttl_s - 0.2
    with pytest.raises(LeaseNotFoundError):
        await store.keepalive(lease.lease_id)


async def test_keepalive_keeps_a_lease(store: MetadataStore, ns: str, backend: str) -> None:
    # etcd's leases are coarser than a second; the in-process backends keep 1 s exactly
    lease = await store.grant_lease(2 if backend == "etcd" else 1)
    await store.put(f"{ns}/kept", b"x", lease_id=lease.lease_id)
    loop = asyncio.get_running_loop()
    end = loop.time() + lease.ttl_s * 2
    while loop.time() < end:
        assert await store.keepalive(lease.lease_id) == lease.ttl_s
        await asyncio.sleep(lease.ttl_s / 4)
    assert await store.get(f"{ns}/kept") is not None
    await store.revoke_lease(lease.lease_id)


# --- lifecycle --------------------------------------------------------------------------------


async def test_closing_the_store_ends_its_watches_loudly(open_metadata: OpenStore, ns: str) -> None:
    store = await open_metadata()
    watch = await store.watch(f"{ns}/")
    reader = asyncio.create_task(anext(watch))
    await asyncio.sleep(0.05)
    await store.close()
    with pytest.raises(MetadataStoreClosedError):
        await asyncio.wait_for(reader, 5)


async def test_writes_in_flight_at_close_complete_or_fail(
    open_metadata: OpenStore, ns: str
) -> None:
    store = await open_metadata()
    writes = [asyncio.create_task(store.put(f"{ns}/k{i}", b"x")) for i in range(200)]
    await asyncio.sleep(0)
    await store.close()
    outcomes = await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True), 10)
    assert all(isinstance(o, int | MetadataStoreClosedError) for o in outcomes), outcomes[:3]


async def test_closed_store_refuses_work(open_metadata: OpenStore, ns: str) -> None:
    store = await open_metadata()
    await store.put(f"{ns}/a", b"x")
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(MetadataStoreClosedError):
        await store.get(f"{ns}/a")
