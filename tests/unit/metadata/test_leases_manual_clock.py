"""Lease expiry and session timing in the memory store, with time moved by hand."""

from __future__ import annotations

import asyncio

from magnetar.common.clock import ManualClock
from metadata.api import Lease
from metadata.coordination import Session
from metadata.memory import MemoryMetadataStore


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_lease_expires_exactly_after_its_ttl() -> None:
    clock = ManualClock()
    store = MemoryMetadataStore(clock=clock)
    lease = await store.grant_lease(10)
    await store.put("/eph", b"x", lease_id=lease.lease_id)
    await clock.advance(9.9)
    await settle()
    assert await store.get("/eph") is not None
    assert await store.keepalive(lease.lease_id) == 10  # refreshed at t=9.9: now ends at 19.9
    await clock.advance(9.9)
    await settle()
    assert await store.get("/eph") is not None
    await clock.advance(0.2)
    await settle()
    for _ in range(50):
        if await store.get("/eph") is None:
            break
        await settle()
    assert await store.get("/eph") is None
    await store.close()


async def test_a_kept_session_outlives_many_ttls() -> None:
    clock = ManualClock()
    store = MemoryMetadataStore(clock=clock)
    session = await Session.start(store, ttl_s=3, clock=clock)
    await store.put("/member", b"x", lease_id=session.lease_id)
    for _ in range(30):  # 30 s of manual time, in steps shorter than the keepalive interval
        await clock.advance(0.5)
        await settle()
    assert session.alive
    assert await store.get("/member") is not None
    await session.close()
    assert await store.get("/member") is None
    await store.close()


class SlowGrantStore(MemoryMetadataStore):
    """Grants take 1.6 s of manual time, as after etcd comes back from a partition."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.manual_clock = clock

    async def _do_grant_lease(self, ttl_s: int) -> Lease:
        lease = await super()._do_grant_lease(ttl_s)
        await self.manual_clock.advance(1.6)
        return lease


async def test_a_slow_grant_is_refreshed_in_time_not_given_up() -> None:
    # the helper building the network-partition kit saw a broker lose its new session 5 s
    # after a partition healed: the first refresh was due ttl/3 after the slow grant returned,
    # past the moment the session gives up (TTL minus its margin, counted from the send)
    clock = ManualClock()
    store = SlowGrantStore(clock)
    session = await Session.start(store, ttl_s=3, clock=clock)
    for _ in range(20):
        await clock.advance(0.25)
        await settle()
    assert session.alive, session.lost_error
    await session.close()
    await store.close()
