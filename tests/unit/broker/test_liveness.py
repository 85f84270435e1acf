"""The peer watchdog's decisions, with a scripted probe and the memory metadata store: a refusal
confirmed twice revokes the lease of a peer seen alive before (and so every key bound to it); a
timeout, an unreachable host, a connection, a new incarnation under another lease, or a peer
that never answered revokes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
import structlog

from broker.service.config import BrokerConfig
from broker.service.liveness import (
    LOOKUP_FRESH_S,
    Peer,
    PeerWatchdog,
    ProbeResult,
    parse_service_address,
    tcp_probe,
)
from magnetar.common.errors import InvalidConfigError
from metadata import layout
from metadata.memory import MemoryMetadataStore

ALIVE, REFUSED, UNKNOWN = ProbeResult.ALIVE, ProbeResult.REFUSED, ProbeResult.UNKNOWN


class ScriptedProbe:
    """Answers each probe of an address with the next result of its script (the last one
    repeats); records every probe."""

    def __init__(self, scripts: dict[tuple[str, int], Iterable[ProbeResult]]) -> None:
        self._scripts = {address: list(results) for address, results in scripts.items()}
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int, timeout_s: float) -> ProbeResult:
        assert timeout_s > 0
        self.calls.append((host, port))
        await asyncio.sleep(0)
        script = self._scripts[(host, port)]
        return script.pop(0) if len(script) > 1 else script[0]


async def registered_peer(
    store: MemoryMetadataStore, broker_id: str, port: int
) -> tuple[Peer, str]:
    """A peer registered under a lease of its own, owning one partition; the ownership key."""
    lease = await store.grant_lease(60)
    await store.put(layout.broker(broker_id), b"registration", lease_id=lease.lease_id)
    owned = layout.ownership(f"public/default/{broker_id}-topic")
    await store.put(owned, broker_id.encode(), lease_id=lease.lease_id)
    return Peer(broker_id, "10.0.0.1", port, lease.lease_id), owned


def watchdog(
    store: MemoryMetadataStore, probe: ScriptedProbe, revoked: list[Peer] | None = None
) -> PeerWatchdog:
    return PeerWatchdog(
        store,
        self_id="me",
        interval_s=0.01,
        probe=probe,
        on_revoked=None if revoked is None else revoked.append,
    )


async def test_a_refusal_confirmed_twice_ends_the_peers_session_and_frees_its_partitions() -> None:
    store = MemoryMetadataStore()
    dead, owned = await registered_peer(store, "dead", 1)
    alive, alive_owned = await registered_peer(store, "alive", 2)
    probe = ScriptedProbe({("10.0.0.1", 1): [ALIVE, REFUSED], ("10.0.0.1", 2): [ALIVE]})
    told: list[Peer] = []
    dog = watchdog(store, probe, told)
    dog.set_peers([dead, alive])
    assert dog.watched == 0
    assert await dog.probe_all() == []  # both seen alive
    assert dog.watched == 2

    assert await dog.probe_all() == [dead]

    assert await store.get(layout.broker("dead")) is None
    assert await store.get(owned) is None
    assert await store.get(layout.broker("alive")) is not None
    assert await store.get(alive_owned) is not None
    assert probe.calls.count(("10.0.0.1", 1)) == 3  # the first refusal was confirmed
    assert dog.revoked == 1
    assert told == [dead]
    assert set(dog.peers) == {"alive"}
    assert dog.watched == 1
    await store.close()


@pytest.mark.parametrize(
    ("script", "why"),
    [
        ([UNKNOWN], "a timeout or unreachable host is a network problem, not a death"),
        ([ALIVE], "it listens"),
        ([REFUSED, ALIVE], "its listener was back for the second probe"),
        ([REFUSED, UNKNOWN], "the confirmation found nothing clear"),
        ([UNKNOWN, REFUSED], "one refusal alone is not enough"),
    ],
)
async def test_anything_but_two_refusals_revokes_nothing(
    script: list[ProbeResult], why: str
) -> None:
    store = MemoryMetadataStore()
    peer, owned = await registered_peer(store, "peer", 1)
    dog = watchdog(store, ScriptedProbe({("10.0.0.1", 1): [ALIVE, *script]}))
    dog.set_peers([peer])
    assert await dog.probe_all() == []  # seen alive

    assert await dog.probe_all() == [], why

    assert await store.get(layout.broker("peer")) is not None, why
    assert await store.get(owned) is not None, why
    assert dog.revoked == 0
    assert set(dog.peers) == {"peer"}
    await store.close()


async def test_a_new_incarnation_under_another_lease_is_not_revoked_for_the_old_ones_death() -> (
    None
):
    store = MemoryMetadataStore()
    old, _ = await registered_peer(store, "peer", 1)
    dog = watchdog(store, ScriptedProbe({("10.0.0.1", 1): [ALIVE, REFUSED]}))
    dog.set_peers([old])
    assert await dog.probe_all() == []  # seen alive
    # the old incarnation's session ended and the broker registered again (same id, same
    # address) before the watchdog listed the brokers again
    await store.revoke_lease(old.lease_id)
    new, new_owned = await registered_peer(store, "peer", 1)
    assert new.lease_id != old.lease_id

    assert await dog.probe_all() == []

    record = await store.get(layout.broker("peer"))
    assert record is not None
    assert record.lease_id == new.lease_id
    assert await store.get(new_owned) is not None
    assert dog.revoked == 0
    assert dog.peers == {}  # the old incarnation is forgotten; the next listing names the new
    await store.close()


async def test_a_peer_gone_already_is_not_counted() -> None:
    store = MemoryMetadataStore()
    peer, _ = await registered_peer(store, "peer", 1)
    dog = watchdog(store, ScriptedProbe({("10.0.0.1", 1): [ALIVE, REFUSED]}))
    dog.set_peers([peer])
    assert await dog.probe_all() == []  # seen alive
    await store.revoke_lease(peer.lease_id)  # expired, or another broker was quicker
    assert await dog.probe_all() == []
    assert dog.revoked == 0
    await store.close()


async def test_lookups_asking_together_share_one_check_and_a_live_peer_is_not_probed_again() -> (
    None
):
    store = MemoryMetadataStore()
    dead, _ = await registered_peer(store, "dead", 1)
    alive, _ = await registered_peer(store, "alive", 2)
    probe = ScriptedProbe({("10.0.0.1", 1): [ALIVE, REFUSED], ("10.0.0.1", 2): [ALIVE]})
    dog = watchdog(store, probe)
    dog.set_peers([dead, alive])
    assert await dog.check("dead") is False  # seen alive
    await asyncio.sleep(LOOKUP_FRESH_S)

    assert await asyncio.gather(*(dog.check("dead") for _ in range(5))) == [True] * 5
    assert probe.calls.count(("10.0.0.1", 1)) == 3
    assert dog.revoked == 1
    assert await dog.check("dead") is False  # forgotten: nothing left to check

    assert await dog.check("alive") is False
    assert await dog.check("alive") is False  # seen alive just now: no second probe
    assert probe.calls.count(("10.0.0.1", 2)) == 1
    assert await dog.check("unknown-broker") is False
    await store.close()


async def test_a_lookup_waits_a_bounded_time_while_the_check_goes_on() -> None:
    store = MemoryMetadataStore()
    peer, owned = await registered_peer(store, "peer", 1)
    answer: asyncio.Future[ProbeResult] = asyncio.get_running_loop().create_future()

    async def slow_probe(host: str, port: int, timeout_s: float) -> ProbeResult:
        return await answer

    dog = PeerWatchdog(store, self_id="me", interval_s=0.01, probe=slow_probe)
    dog.set_peers([peer])
    assert await dog.check("peer", wait_s=0.01) is False  # gave up waiting, not a verdict
    answer.set_result(ALIVE)
    assert await dog.check("peer", wait_s=1.0) is False
    assert dog.watched == 1  # the first check went on and saw it alive
    assert await store.get(owned) is not None
    await store.close()


async def test_a_peer_never_seen_listening_is_left_alone_and_reported_once() -> None:
    store = MemoryMetadataStore()
    peer, owned = await registered_peer(store, "peer", 1)
    dog = watchdog(store, ScriptedProbe({("10.0.0.1", 1): [REFUSED]}))
    dog.set_peers([peer])
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            assert await dog.probe_all() == []
    assert [e["event"] for e in logs] == ["peer_refuses_probes"]
    assert dog.watched == 0
    assert "advertised_host" in logs[0]["reason"]
    assert await store.get(owned) is not None
    assert dog.revoked == 0
    await store.close()


async def test_the_broker_itself_is_never_watched() -> None:
    store = MemoryMetadataStore()
    me, _ = await registered_peer(store, "me", 1)
    dog = watchdog(store, ScriptedProbe({("10.0.0.1", 1): [REFUSED]}))
    dog.set_peers([me])
    assert dog.peers == {}
    assert await dog.check("me") is False
    await store.close()


async def test_the_tcp_probe_tells_a_listener_from_a_closed_port() -> None:
    server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    assert await tcp_probe("127.0.0.1", port, 2.0) is ALIVE
    server.close()
    await server.wait_closed()
    assert await tcp_probe("127.0.0.1", port, 2.0) is REFUSED
    # a name that does not resolve proves nothing about the process
    assert await tcp_probe("no-such-host.invalid", port, 2.0) is UNKNOWN


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("magnetar://broker-0.magnetar:6650", ("broker-0.magnetar", 6650)),
        ("magnetar+ssl://10.1.2.3:6651", ("10.1.2.3", 6651)),
        ("magnetar://[::1]:6650", ("::1", 6650)),
        ("magnetar://host", None),
        ("magnetar://host:http", None),
        ("magnetar://host:0", None),
        ("", None),
    ],
)
def test_service_addresses_are_parsed_or_skipped(
    url: str, expected: tuple[str, int] | None
) -> None:
    assert parse_service_address(url) == expected


def test_a_probe_interval_out_of_range_is_refused_by_name() -> None:
    with pytest.raises(InvalidConfigError, match="peer_probe_interval_ms"):
        BrokerConfig(metadata="memory://", peer_probe_interval_ms=5)
    assert BrokerConfig(metadata="memory://", peer_probe_interval_ms=0).peer_probe_interval_ms == 0
