"""Peer liveness: noticing that another broker's *process* died, and ending its session at once.

A broker that crashes leaves its registration and its ownership keys in the metadata store until
its session lease expires (``session_ttl_s``), and its partitions are unavailable that long. But
when only the process died and its host is up, the host says so at once: a TCP connection to
the dead broker's port is refused (the kernel answers with a reset, as nothing listens there).
Every broker therefore probes the service port of each live peer every
``peer_probe_interval_ms``; a refusal confirmed by a second probe, with the peer's registration
still bound to the lease seen when the probes began, makes it revoke that lease. Every key bound
to it, the registration and every ownership key, goes in one step, and the next lookup assigns
the partitions again. Lookups also check the owner they are about to name (:meth:`check`), so a
client reconnecting after the crash is sent to a live broker on its first try.

A peer this broker has never seen listening is not revoked either: if its advertised address
refuses connections from here from the start (a wrong ``advertised_host``, a port that only
clients outside can reach), that is a configuration problem, logged once, not a crash.

What is *not* a death: a probe that times out or finds the host unreachable (a network cut, a
paused process, a host that vanished) proves nothing, and the peer is left alone; a cut-off
broker stops serving on its own when its session lapses, as before. A probe that connects
means the peer lives. A registration bound to another lease is a new incarnation (a restart on
the same address) and is never revoked for the old one's death.

Safety does not rest on this: ledger fencing does. Revoking a live broker's lease by mistake
(say, its listener was briefly down) costs it its session, which it handles as any session loss:
it drops its partitions and registers again. Two brokers revoking the same lease is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import structlog

from magnetar.common.errors import MagnetarError, MetadataError
from metadata import MetadataStore, layout

log = structlog.get_logger("magnetar.broker.liveness")

CONFIRM_FRACTION = 0.2
"""The second probe follows the first refusal after this fraction of the probe interval."""

LOOKUP_FRESH_S = 0.05
"""A lookup does not probe a peer again that was seen alive this recently."""

LOOKUP_WAIT_S = 0.2
"""How long a lookup waits for the check of an owner it is about to name."""


class ProbeResult(enum.Enum):
    ALIVE = "alive"
    """A connection was accepted: the process listens."""
    REFUSED = "refused"
    """The host answered that nothing listens on the port (ECONNREFUSED)."""
    UNKNOWN = "unknown"
    """No answer in time, host or network unreachable, name not resolved: nothing is known."""


Probe = Callable[[str, int, float], Awaitable[ProbeResult]]
"""``probe(host, port, timeout_s)``."""


async def tcp_probe(host: str, port: int, timeout_s: float) -> ProbeResult:
    """Open a TCP connection to ``host:port`` and close it at once."""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return ProbeResult.REFUSED
    except (OSError, TimeoutError):
        # an address list of mixed failures also lands here: not a clear refusal
        return ProbeResult.UNKNOWN
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return ProbeResult.ALIVE


@dataclass(frozen=True, slots=True)
class Peer:
    """Another broker as its registration shows it."""

    broker_id: str
    host: str
    port: int
    lease_id: int
    """The lease its registration was bound to when it was listed."""


def parse_service_address(url: str) -> tuple[str, int] | None:
    """``magnetar://host:port`` (or ``magnetar+ssl://``, ``[v6]:port``) → ``(host, port)``."""
    _, _, address = url.rpartition("://")
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        return None
    port = int(port_text)
    if not 0 < port <= 65535:
        return None
    return host.removeprefix("[").removesuffix("]"), port


class PeerWatchdog:
    """Probes the live peers of one broker and revokes the lease of a peer whose process died.

    The broker hands it the peers it knows (:meth:`set_peers`, from its listing of live
    brokers); :meth:`run` probes them every ``interval_s``; :meth:`check` probes one now.
    """

    def __init__(
        self,
        store: MetadataStore,
        *,
        self_id: str,
        interval_s: float,
        probe: Probe = tcp_probe,
        on_revoked: Callable[[Peer], None] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"a probe interval is > 0 s, got {interval_s!r}")
        self.store = store
        self.self_id = self_id
        self.interval_s = interval_s
        self.timeout_s = interval_s
        self._probe = probe
        self._on_revoked = on_revoked
        self._peers: dict[str, Peer] = {}
        self._alive_at: dict[str, float] = {}
        self._seen_alive: set[Peer] = set()
        self._warned: set[Peer] = set()
        self._checking: dict[Peer, asyncio.Task[bool]] = {}
        self.revoked = 0
        """Leases this broker revoked because their broker's process was found dead."""

    @property
    def peers(self) -> dict[str, Peer]:
        return dict(self._peers)

    @property
    def watched(self) -> int:
        """Peers seen listening, whose death this broker would notice now."""
        return sum(1 for p in self._peers.values() if p in self._seen_alive)

    def set_peers(self, peers: Iterable[Peer]) -> None:
        """The peers to watch from now on (this broker itself is left out)."""
        fresh = {p.broker_id: p for p in peers if p.broker_id != self.self_id}
        for broker_id, peer in fresh.items():
            if self._peers.get(broker_id) != peer:
                # a new incarnation (another lease) starts with no history
                self._alive_at.pop(broker_id, None)
        self._peers = fresh
        known = set(fresh.values())
        self._seen_alive &= known
        self._warned &= known

    async def check(self, broker_id: str, *, wait_s: float | None = None) -> bool:
        """Probe ``broker_id`` now (unless it was seen alive just now); True when its process
        was found dead and its lease revoked, so what it owned is free.

        With ``wait_s``, False after that long: the check goes on in the background (a lookup
        must not wait a whole probe timeout on a peer behind a network cut)."""
        peer = self._peers.get(broker_id)
        if peer is None:
            return False
        seen = self._alive_at.get(broker_id)
        if seen is not None and asyncio.get_running_loop().time() - seen < LOOKUP_FRESH_S:
            return False
        try:
            async with asyncio.timeout(wait_s):
                return await self._check_once(peer)
        except TimeoutError:
            return False

    async def probe_all(self) -> list[Peer]:
        """One round over every peer; the peers whose lease was revoked."""
        peers = list(self._peers.values())
        results = await asyncio.gather(*(self._check_once(p) for p in peers))
        return [p for p, revoked in zip(peers, results, strict=True) if revoked]

    async def run(self) -> None:
        """Probe every peer each interval, until cancelled."""
        while True:
            try:
                await self.probe_all()
            except MagnetarError as e:  # pragma: no cover - _check handles its own errors
                log.info("peer_probe_round_failed", error=e.message)
            await asyncio.sleep(self.interval_s)

    async def _check_once(self, peer: Peer) -> bool:
        """One check of ``peer``, shared by every caller that asks while it runs."""
        running = self._checking.get(peer)
        if running is None:
            running = asyncio.get_running_loop().create_task(self._check(peer))
            self._checking[peer] = running
            running.add_done_callback(lambda _t: self._checking.pop(peer, None))
        return await asyncio.shield(running)

    async def _check(self, peer: Peer) -> bool:
        result = await self._probe(peer.host, peer.port, self.timeout_s)
        if result is ProbeResult.REFUSED:
            await asyncio.sleep(self.interval_s * CONFIRM_FRACTION)
            result = await self._probe(peer.host, peer.port, self.timeout_s)
        if result is ProbeResult.ALIVE:
            self._alive_at[peer.broker_id] = asyncio.get_running_loop().time()
            self._seen_alive.add(peer)
        if result is not ProbeResult.REFUSED:
            return False
        if peer not in self._seen_alive:
            if peer not in self._warned:
                self._warned.add(peer)
                log.warning(
                    "peer_refuses_probes",
                    peer=peer.broker_id,
                    address=f"{peer.host}:{peer.port}",
                    reason="its advertised address refused every connection from this broker;"
                    " check its advertised_host (its session is left alone)",
                )
            return False
        try:
            record = await self.store.get(layout.broker(peer.broker_id))
            if record is None or record.lease_id != peer.lease_id:
                # gone already, or registered again under a new session: nothing of the dead
                # incarnation is left to end
                self._forget(peer)
                return False
            await self.store.revoke_lease(peer.lease_id)
        except MetadataError as e:
            log.info("peer_revoke_failed", peer=peer.broker_id, lease=peer.lease_id, error=str(e))
            return False
        self.revoked += 1
        self._forget(peer)
        log.warning(
            "peer_lease_revoked",
            peer=peer.broker_id,
            lease=peer.lease_id,
            address=f"{peer.host}:{peer.port}",
            reason="connections to its port are refused: its process is gone",
        )
        if self._on_revoked is not None:
            self._on_revoked(peer)
        return True

    def _forget(self, peer: Peer) -> None:
        if self._peers.get(peer.broker_id) == peer:
            del self._peers[peer.broker_id]
        self._alive_at.pop(peer.broker_id, None)
        self._seen_alive.discard(peer)
        self._warned.discard(peer)
