"""Service URLs and topic names as the client reads them.

A service URL is ``magnetar://host:port[,host:port...]`` (the port defaults to 6650; IPv6 hosts
go in brackets), or ``magnetar+ssl://host:port[,...]`` for TLS (the port defaults to 6651). A
topic is ``tenant/namespace/topic``; a bare ``topic`` means ``public/default/topic``, and a
``persistent://`` prefix (what Pulsar users type) is dropped. The partitions of a partitioned
topic are ``topic-partition-N``. Topic names are parsed by :mod:`magnetar.common.names`, the
same rules the broker applies, so a bad name fails early.
"""

from __future__ import annotations

import re

from magnetar.common.errors import InvalidServiceUrlError
from magnetar.common.names import PARTITION_SUFFIX, TopicName, parse_topic

__all__ = [
    "DEFAULT_BROKER_PORT",
    "DEFAULT_BROKER_TLS_PORT",
    "PARTITION_SUFFIX",
    "TopicName",
    "parse_broker_url",
    "parse_service_url",
    "parse_topic",
    "uses_tls",
]

DEFAULT_BROKER_PORT = 6650
DEFAULT_BROKER_TLS_PORT = 6651
SCHEME = "magnetar://"
TLS_SCHEME = "magnetar+ssl://"

_HOST = re.compile(
    r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+))(?::(?P<port>\d+))?$"
)


def _bad_url(url: object, why: str) -> InvalidServiceUrlError:
    return InvalidServiceUrlError(
        f"invalid service URL {url!r}: {why}; expected 'magnetar://host:port[,host:port...]'"
        " (or magnetar+ssl:// for TLS)",
        context={"service_url": repr(url)},
    )


def parse_service_url(url: object) -> tuple[str, ...]:
    """The brokers of a service URL as gRPC targets (``host:port``), in the order given."""
    if not isinstance(url, str):
        raise _bad_url(url, f"a service URL is a string, got {type(url).__name__}")
    if url.startswith(SCHEME):
        rest, default_port = url[len(SCHEME) :], DEFAULT_BROKER_PORT
    elif url.startswith(TLS_SCHEME):
        rest, default_port = url[len(TLS_SCHEME) :], DEFAULT_BROKER_TLS_PORT
    else:
        raise _bad_url(url, f"it must start with {SCHEME!r} or {TLS_SCHEME!r}")
    rest = rest.rstrip("/")
    if not rest:
        raise _bad_url(url, "it names no broker")
    targets: list[str] = []
    for part in rest.split(","):
        match = _HOST.match(part.strip())
        if match is None:
            raise _bad_url(url, f"{part!r} is not host[:port]")
        port = int(match["port"]) if match["port"] else default_port
        if not 0 < port < 65536:
            raise _bad_url(url, f"port {port} is out of range")
        host = f"[{match['ipv6']}]" if match["ipv6"] else match["host"]
        target = f"{host}:{port}"
        if target not in targets:
            targets.append(target)
    return tuple(targets)


def uses_tls(url: str) -> bool:
    """Whether a (valid) service URL asks for TLS: ``magnetar+ssl://``."""
    return url.startswith(TLS_SCHEME)


def parse_broker_url(url: str) -> str:
    """The gRPC target of one broker URL from a lookup answer (``magnetar://host:port``)."""
    targets = parse_service_url(url)
    if len(targets) != 1:
        raise _bad_url(url, "a broker URL names exactly one broker")
    return targets[0]
