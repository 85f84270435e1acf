"""The per-address connection bound, on gRPC's peer strings."""

from __future__ import annotations

import pytest

from magnetar.common.errors import ServiceUnavailableError
from magnetar.common.peer_limits import ConnectionsPerIp, split_peer


@pytest.mark.parametrize(
    ("peer", "split"),
    [
        ("ipv4:10.0.0.1:5432", ("10.0.0.1", "5432")),
        ("ipv6:[::1]:5432", ("[::1]", "5432")),
        ("ipv6:[2001:db8::7]:80", ("[2001:db8::7]", "80")),
        ("unix:/tmp/sock", None),
        ("ipv4:", None),
        ("", None),
    ],
)
def test_split_peer(peer: str, split: tuple[str, str] | None) -> None:
    assert split_peer(peer) == split


def test_connections_over_the_bound_are_refused_and_released_ones_make_room() -> None:
    limits = ConnectionsPerIp(2)
    assert limits.admit("ipv4:10.0.0.1:1")
    assert limits.admit("ipv4:10.0.0.1:1")  # a second call on the same connection
    assert limits.admit("ipv4:10.0.0.1:2")
    assert limits.admit("ipv4:10.0.0.2:1")  # another address has its own count
    with pytest.raises(ServiceUnavailableError, match=r"too many connections from 10\.0\.0\.1"):
        limits.admit("ipv4:10.0.0.1:3")
    assert limits.refused == 1
    limits.release("ipv4:10.0.0.1:1")
    assert limits.connections("10.0.0.1") == 2  # one call still open on it
    limits.release("ipv4:10.0.0.1:1")
    assert limits.connections("10.0.0.1") == 1
    assert limits.admit("ipv4:10.0.0.1:3")
    for peer in ("ipv4:10.0.0.1:2", "ipv4:10.0.0.1:3", "ipv4:10.0.0.2:1"):
        limits.release(peer)
    assert limits.connections("10.0.0.1") == limits.connections("10.0.0.2") == 0
    limits.release("ipv4:10.0.0.9:1")  # never counted: nothing happens


def test_no_bound_and_peers_without_an_address_are_not_counted() -> None:
    assert not ConnectionsPerIp(0).admit("ipv4:10.0.0.1:1")
    assert not ConnectionsPerIp(1).admit("unix:/tmp/sock")
