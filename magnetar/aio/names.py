"""Service URLs and topic names as the client reads them.

A service URL is ``magnetar://host:port[,host:port...]`` (the port defaults to 6650; IPv6 hosts
go in brackets). A topic is ``tenant/namespace/topic``; a bare ``topic`` means
``public/default/topic``, and a ``persistent://`` prefix (what Pulsar users type) is dropped. The
partitions of a partitioned topic are ``topic-partition-N``. The broker checks names fully; the
client only normalizes them so that it can name partitions and report errors early.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from magnetar.common.errors import InvalidServiceUrlError, InvalidTopicNameError

__all__ = [
    "DEFAULT_BROKER_PORT",
    "TopicName",
    "parse_broker_url",
    "parse_service_url",
    "parse_topic",
]

DEFAULT_BROKER_PORT = 6650
SCHEME = "magnetar://"
PARTITION_SUFFIX = "-partition-"

_HOST = re.compile(
    r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+))(?::(?P<port>\d+))?$"
)
_SEGMENT = re.compile(r"[A-Za-z0-9_=-][A-Za-z0-9._=-]*")
_PARTITION = re.compile(r"^(?P<base>.+)-partition-(?P<index>0|[1-9][0-9]{0,5})$")


def _bad_url(url: object, why: str) -> InvalidServiceUrlError:
    return InvalidServiceUrlError(
        f"invalid service URL {url!r}: {why}; expected 'magnetar://host:port[,host:port...]'",
        context={"service_url": repr(url)},
    )


def parse_service_url(url: object) -> tuple[str, ...]:
    """The brokers of a service URL as gRPC targets (``host:port``), in the order given."""
    if not isinstance(url, str):
        raise _bad_url(url, f"a service URL is a string, got {type(url).__name__}")
    if not url.startswith(SCHEME):
        raise _bad_url(url, f"it must start with {SCHEME!r}")
    rest = url[len(SCHEME) :].rstrip("/")
    if not rest:
        raise _bad_url(url, "it names no broker")
    targets: list[str] = []
    for part in rest.split(","):
        match = _HOST.match(part.strip())
        if match is None:
            raise _bad_url(url, f"{part!r} is not host[:port]")
        port = int(match["port"]) if match["port"] else DEFAULT_BROKER_PORT
        if not 0 < port < 65536:
            raise _bad_url(url, f"port {port} is out of range")
        host = f"[{match['ipv6']}]" if match["ipv6"] else match["host"]
        target = f"{host}:{port}"
        if target not in targets:
            targets.append(target)
    return tuple(targets)


def parse_broker_url(url: str) -> str:
    """The gRPC target of one broker URL from a lookup answer (``magnetar://host:port``)."""
    targets = parse_service_url(url)
    if len(targets) != 1:
        raise _bad_url(url, "a broker URL names exactly one broker")
    return targets[0]


@dataclass(frozen=True, slots=True)
class TopicName:
    """A normalized topic or partition name; ``partition`` is -1 for a whole topic."""

    tenant: str
    namespace: str
    local: str
    partition: int = -1

    @property
    def topic(self) -> str:
        """The topic's full name, without any partition suffix."""
        return f"{self.tenant}/{self.namespace}/{self.local}"

    @property
    def full(self) -> str:
        """This name in full: the topic, or ``topic-partition-N`` for one partition."""
        if self.partition < 0:
            return self.topic
        return f"{self.topic}{PARTITION_SUFFIX}{self.partition}"

    @property
    def is_partition(self) -> bool:
        return self.partition >= 0

    def partition_name(self, index: int) -> TopicName:
        return TopicName(self.tenant, self.namespace, self.local, index)

    def __str__(self) -> str:
        return self.full


def _bad_topic(name: object, why: str) -> InvalidTopicNameError:
    return InvalidTopicNameError(
        f"invalid topic name {name!r}: {why}", context={"topic": repr(name)}
    )


def parse_topic(name: object) -> TopicName:
    """Normalize a topic or partition name; raise :class:`InvalidTopicNameError` naming the rule."""
    if not isinstance(name, str):
        raise _bad_topic(name, f"a topic name is a string, got {type(name).__name__}")
    text = name.removeprefix("persistent://")
    parts = text.split("/")
    if len(parts) == 1:
        parts = ["public", "default", parts[0]]
    if len(parts) != 3:
        raise _bad_topic(name, "use 'tenant/namespace/topic' or a bare 'topic'")
    for label, part in zip(("tenant", "namespace", "topic"), parts, strict=True):
        if not _SEGMENT.fullmatch(part):
            raise _bad_topic(
                name,
                f"the {label} {part!r} may only hold letters, digits, '_', '-', '=' and '.'"
                " (not first)",
            )
    tenant, namespace, local = parts
    match = _PARTITION.match(local)
    if match is not None:
        return TopicName(tenant, namespace, match["base"], int(match["index"]))
    return TopicName(tenant, namespace, local)
