"""A bound on the connections one IP address may use at once (Pulsar's
``brokerMaxConnectionsPerIp``).

gRPC Python shows a server nothing of a connection until a call arrives on it, so the bound counts
what a client can make a server hold: connections with at least one call or stream open. A call
on a further connection from an address that already has ``limit`` such connections is refused
with :class:`ServiceUnavailableError` (gRPC status UNAVAILABLE, which clients retry with backoff),
naming the address and the setting; calls on the connections it already uses go on. Connections
that open no call are bounded otherwise: ``connection_handshake_timeout_ms`` closes one that never
speaks, ``max_connection_idle_ms`` one left idle, and ``max_connections`` bounds them all.
"""

from __future__ import annotations

from magnetar.common.errors import ServiceUnavailableError


def split_peer(peer: str) -> tuple[str, str] | None:
    """gRPC's peer string (``ipv4:10.0.0.1:5432``, ``ipv6:[::1]:5432``) as (address, port);
    None for a peer that has no IP address (``unix:...``) or a string not in that form."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    address, sep, port = rest.rpartition(":")
    if not sep or not address or not port:
        return None
    return address, port


class ConnectionsPerIp:
    """Counts, per IP address, the connections with calls open; refuses past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        """Connections with calls open per address at most (0: no bound)."""
        self._open: dict[str, dict[str, int]] = {}
        """address -> port of each connection with calls open -> how many calls."""
        self.refused = 0
        """Calls refused so far."""

    def admit(self, peer: str) -> bool:
        """Count a call from ``peer``; True when it must be released with :meth:`release`.
        Raises :class:`ServiceUnavailableError` when it would open one connection too many."""
        if self.limit <= 0:
            return False
        split = split_peer(peer)
        if split is None:
            return False
        address, port = split
        connections = self._open.setdefault(address, {})
        calls = connections.get(port)
        if calls is None and len(connections) >= self.limit:
            self.refused += 1
            raise ServiceUnavailableError(
                f"too many connections from {address}: {len(connections)} already have calls"
                f" open (max_connections_per_ip = {self.limit}); use fewer connections, or"
                " close some and retry",
                context={"address": address, "max_connections_per_ip": self.limit},
            )
        connections[port] = (calls or 0) + 1
        return True

    def release(self, peer: str) -> None:
        """A call counted by :meth:`admit` ended."""
        split = split_peer(peer)
        if split is None:
            return
        address, port = split
        connections = self._open.get(address)
        if connections is None or port not in connections:
            return
        if connections[port] <= 1:
            del connections[port]
            if not connections:
                del self._open[address]
        else:
            connections[port] -= 1

    def connections(self, address: str) -> int:
        """Connections from ``address`` with calls open now."""
        return len(self._open.get(address, ()))
