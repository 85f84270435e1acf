"""Topic names: parsing, validation and the names derived from them (broker and client alike).

A topic is ``tenant/namespace/topic``; a bare ``topic`` means ``public/default/topic`` and a
``persistent://`` prefix (what Pulsar users type) is accepted and dropped. A partitioned topic
with N partitions has partitions ``topic-partition-0`` .. ``topic-partition-{N-1}``; a
non-partitioned topic is its own single partition. Every name a user sends goes through
:func:`parse_topic`, so a bad one is refused once, with the rule it broke.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from magnetar.common.errors import InvalidArgumentError, InvalidTopicNameError

DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
PARTITION_SUFFIX = "-partition-"
MAX_NAME_CHARS = 200
_SEGMENT = re.compile(r"[A-Za-z0-9_=-][A-Za-z0-9._=-]*")
_PARTITION = re.compile(r"^(?P<base>.+)-partition-(?P<index>0|[1-9][0-9]{0,5})$")


@dataclass(frozen=True, slots=True)
class TopicName:
    """A parsed topic or partition name. ``partition`` is -1 for a topic (not one partition)."""

    tenant: str
    namespace: str
    local: str
    partition: int = -1

    @property
    def namespace_name(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @property
    def topic(self) -> str:
        """The topic's full name, without any partition suffix."""
        return f"{self.tenant}/{self.namespace}/{self.local}"

    @property
    def full(self) -> str:
        """This name in full: the topic, or ``topic-partition-N`` for a partition."""
        if self.partition < 0:
            return self.topic
        return f"{self.topic}{PARTITION_SUFFIX}{self.partition}"

    @property
    def is_partition(self) -> bool:
        return self.partition >= 0

    def partition_name(self, index: int) -> TopicName:
        return TopicName(self.tenant, self.namespace, self.local, index)

    def base(self) -> TopicName:
        return TopicName(self.tenant, self.namespace, self.local)

    def __str__(self) -> str:
        return self.full


SHOWN_CHARS = 40
"""Characters of a refused value an error shows: enough to recognise it, never a whole
oversized value (echoed into a gRPC trailer, a 10,000-character name would not fit)."""


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)``, cut to its first ``limit`` characters (and its length) when longer."""
    if isinstance(value, str | bytes) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value):,} {unit})"
    return repr(value)


def _bad(name: object, why: str) -> InvalidTopicNameError:
    return InvalidTopicNameError(
        f"invalid topic name {shown(name)}: {why}", context={"topic": shown(name)}
    )


def parse_topic(name: object) -> TopicName:
    """Parse a topic or partition name; raise :class:`InvalidTopicNameError` naming the rule."""
    if not isinstance(name, str):
        raise _bad(name, f"a topic name is a string, got {type(name).__name__}")
    text = name.removeprefix("persistent://")
    if not text:
        raise _bad(name, "it is empty")
    if len(text) > MAX_NAME_CHARS:
        raise _bad(name, f"it is {len(text):,} characters long; the limit is {MAX_NAME_CHARS}")
    parts = text.split("/")
    if len(parts) == 1:
        parts = [DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]]
    if len(parts) != 3:
        raise _bad(name, "use 'tenant/namespace/topic' or a bare 'topic'")
    for label, part in zip(("tenant", "namespace", "topic"), parts, strict=True):
        if not _SEGMENT.fullmatch(part):
            raise _bad(
                name,
                f"the {label} {part!r} may only hold letters, digits, '_', '-', '=' and '.'"
                " (not first)",
            )
    tenant, namespace, local = parts
    match = _PARTITION.match(local)
    if match is not None:
        return TopicName(tenant, namespace, match["base"], int(match["index"]))
    return TopicName(tenant, namespace, local)


def parse_base_topic(name: object) -> TopicName:
    """Parse a name that must name a topic, not one of its partitions."""
    topic = parse_topic(name)
    if topic.is_partition:
        raise _bad(
            name,
            f"names ending in '{PARTITION_SUFFIX}N' are reserved for the partitions of"
            f" {topic.topic!r}",
        )
    return topic


def check_tenant(name: object) -> str:
    """A tenant name; :class:`InvalidArgumentError` naming the rule when it is not one."""
    if not isinstance(name, str) or not _SEGMENT.fullmatch(name) or len(name) > MAX_NAME_CHARS:
        raise InvalidArgumentError(
            f"invalid tenant name {shown(name)}: it may only hold letters, digits, '_', '-', '='"
            f" and '.' (not first), up to {MAX_NAME_CHARS} characters",
            context={"tenant": shown(name)},
        )
    return name


def parse_namespace(name: object) -> tuple[str, str]:
    """``"tenant/namespace"`` as ``(tenant, namespace)``; :class:`InvalidArgumentError` naming
    the rule when it is not one."""
    text = name.strip("/") if isinstance(name, str) else name
    parts = text.split("/") if isinstance(text, str) else []
    if len(parts) != 2 or not all(_SEGMENT.fullmatch(p) for p in parts):
        raise InvalidArgumentError(
            f"invalid namespace {shown(name)}: a namespace is 'tenant/namespace', each part"
            " letters, digits, '_', '-', '=' and '.' (not first)",
            context={"namespace": shown(name)},
        )
    check_tenant(parts[0])
    return parts[0], parts[1]
