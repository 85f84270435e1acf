"""The connector's options: parsed and checked once, on the driver, with errors that name them.

Spark hands a data source its options as strings in a case-insensitive map. Everything here is
plain Python (no PySpark), so it is unit-tested without a Spark session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from magnetar.common.errors import InvalidArgumentError

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "ReadOptions",
    "WriteOptions",
    "client_settings",
    "parse_read_options",
    "parse_write_options",
]

EARLIEST = -2
"""In per-partition JSON offsets (as Kafka's): the first stored message."""
LATEST = -1
"""In per-partition JSON offsets (as Kafka's): the offset the next message will get."""

DEFAULT_SERVICE_URL = "magnetar://localhost:6650"
CLIENT_PREFIX = "client."
"""Options starting with this go to the client's settings (``client.operation_timeout_s``)."""
SECURITY_OPTIONS = ("tls.enabled", "tls.trustcertsfilepath", "auth.token", "auth.tokenfile")
"""Accepted names for the security work to come; until it lands, setting one is an error."""

ValueDecoding = Literal["binary", "utf8", "json"]


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends: ``earliest``, ``latest``, a time for every partition, or
    per-partition offsets/times (``{topic: {partition: value}}``; partitions left out take
    ``default``)."""

    kind: Literal["earliest", "latest", "offsets", "timestamp", "timestamps"]
    timestamp_ms: int = 0
    per_partition: dict[str, dict[int, int]] = field(default_factory=dict)
    default: Literal["earliest", "latest"] = "earliest"


@dataclass(frozen=True)
class ReadOptions:
    service_url: str
    topics: tuple[str, ...]
    topics_pattern: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    min_partitions: int
    max_records_per_trigger: int | None
    fail_on_data_loss: bool
    value_decoding: ValueDecoding
    value_schema: str | None
    read_timeout_s: float
    client: dict[str, Any]


@dataclass(frozen=True)
class WriteOptions:
    service_url: str
    topic: str | None
    client: dict[str, Any]
    producer: dict[str, Any]


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark's map is case-insensitive already; a plain dict (tests, users) is made so here
    lowered = {k.lower(): v for k, v in options.items()}
    value = lowered.get(name.lower())
    return None if value is None else str(value)


def _bool(options: Mapping[str, str], name: str, *, default: bool) -> bool:
    value = _get(options, name)
    if value is None:
        return default
    if value.strip().lower() in ("true", "1", "yes"):
        return True
    if value.strip().lower() in ("false", "0", "no"):
        return False
    raise InvalidArgumentError(f"option {name} is true or false, got {value!r}")


def _int(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    value = _get(options, name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgumentError(f"option {name} is a whole number, got {value!r}") from None
    if number < minimum:
        raise InvalidArgumentError(f"option {name} is at least {minimum}, got {number}")
    return number


def _check_security(options: Mapping[str, str]) -> None:
    for name in SECURITY_OPTIONS:
        if _get(options, name) is not None:
            raise InvalidArgumentError(
                f"option {name} is reserved for TLS and authentication, which Magnetar does not"
                " support yet; remove it to connect without"
            )


def client_settings(options: Mapping[str, str]) -> dict[str, Any]:
    """``client.*`` options as client settings, numbers parsed (``client.operation_timeout_s``
    -> ``operation_timeout_s=30.0``). Unknown names fail when the client is built."""
    settings: dict[str, Any] = {}
    for key, raw in options.items():
        if not key.lower().startswith(CLIENT_PREFIX):
            continue
        name = key[len(CLIENT_PREFIX) :]
        value: Any = raw
        for convert in (int, float):
            try:
                value = convert(raw)
                break
            except ValueError:
                continue
        if raw in ("true", "false"):
            value = raw == "true"
        settings[name] = value
    return settings


def _offsets_json(name: str, text: str, *, allow_latest: bool) -> dict[str, dict[int, int]]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgumentError(
            f"option {name} is 'earliest', 'latest' or JSON like"
            f' {{"my-topic": {{"0": 42, "1": -2}}}}; could not parse {text!r}: {e.msg}'
        ) from None
    if not isinstance(parsed, dict) or not parsed:
        raise InvalidArgumentError(
            f"option {name}: JSON offsets are an object of topics, got {text!r}"
        )
    result: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise InvalidArgumentError(
                f"option {name}: topic {topic!r} maps partition numbers to offsets, got"
                f" {partitions!r}"
            )
        per: dict[int, int] = {}
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except (TypeError, ValueError):
                raise InvalidArgumentError(
                    f"option {name}: partition {partition!r} of {topic!r} is not a number"
                ) from None
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise InvalidArgumentError(
                    f"option {name}: the offset of {topic!r} partition {number} is a whole"
                    f" number >= 0, or -2 (earliest) or -1 (latest); got {offset!r}"
                )
            if offset == LATEST and not allow_latest:
                raise InvalidArgumentError(
                    f"option {name}: -1 (latest) is not a starting offset for a batch query"
                )
            per[number] = offset
        result[str(topic)] = per
    return result


def _offset_spec(
    options: Mapping[str, str],
    prefix: str,
    *,
    default: Literal["earliest", "latest"],
    allow_latest: bool = True,
) -> OffsetSpec:
    offsets_name = f"{prefix}Offsets"
    by_time_name = f"{prefix}OffsetsByTimestamp"
    time_name = f"{prefix}Timestamp"
    given = [n for n in (offsets_name, by_time_name, time_name) if _get(options, n) is not None]
    if len(given) > 1:
        raise InvalidArgumentError(f"give at most one of {', '.join(given)}")
    if not given:
        return OffsetSpec(default)
    name = given[0]
    text = _get(options, name) or ""
    if name == time_name:
        value = _int(options, name, 0)
        assert value is not None
        return OffsetSpec("timestamp", timestamp_ms=value)
    if name == by_time_name:
        per = _offsets_json(name, text, allow_latest=True)
        for topic, partitions in per.items():
            for partition, ts in partitions.items():
                if ts < 0:
                    raise InvalidArgumentError(
                        f"option {name}: the time of {topic!r} partition {partition} is"
                        f" milliseconds since the epoch, got {ts}"
                    )
        return OffsetSpec("timestamps", per_partition=per, default=default)
    lowered = text.strip().lower()
    if lowered in ("earliest", "latest"):
        if lowered == "latest" and not allow_latest:
            raise InvalidArgumentError(
                f"option {name}: 'latest' is not a starting point for a batch query"
            )
        return OffsetSpec(lowered)  # type: ignore[arg-type]
    return OffsetSpec(
        "offsets",
        per_partition=_offsets_json(name, text, allow_latest=allow_latest),
        default=default,
    )


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check a read's options; raises :class:`InvalidArgumentError` naming the bad one."""
    _check_security(options)
    topic = _get(options, "topic")
    topics = _get(options, "topics")
    pattern = _get(options, "topicsPattern")
    given = [n for n, v in (("topic", topic), ("topics", topics), ("topicsPattern", pattern)) if v]
    if len(given) != 1:
        raise InvalidArgumentError(
            "give exactly one of the options topic, topics (comma-separated) and topicsPattern"
            f" (a regular expression over tenant/namespace/topic); got {given or 'none'}"
        )
    names: tuple[str, ...] = ()
    if topic:
        names = (topic.strip(),)
    elif topics:
        names = tuple(t.strip() for t in topics.split(",") if t.strip())
        if not names:
            raise InvalidArgumentError(f"option topics names no topic: {topics!r}")
    elif pattern:
        try:
            re.compile(pattern)
        except re.error as e:
            raise InvalidArgumentError(
                f"option topicsPattern is not a regular expression ({e}): {pattern!r}"
            ) from None
    starting = _offset_spec(
        options,
        "starting",
        default="latest" if streaming else "earliest",
        allow_latest=streaming,
    )
    if streaming:
        for name in ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"):
            if _get(options, name) is not None:
                raise InvalidArgumentError(
                    f"option {name} is for batch reads; a streaming query has no end"
                )
        ending = OffsetSpec("latest")
    else:
        ending = _offset_spec(options, "ending", default="latest")
        if ending.kind == "earliest":
            raise InvalidArgumentError("option endingOffsets: 'earliest' would read nothing")
    decoding = (_get(options, "valueFormat") or "binary").strip().lower()
    if decoding not in ("binary", "utf8", "json"):
        raise InvalidArgumentError(f"option valueFormat is binary, utf8 or json, got {decoding!r}")
    value_schema = _get(options, "valueSchema")
    if decoding == "json" and not value_schema:
        raise InvalidArgumentError(
            "option valueFormat=json needs valueSchema, the value's schema as a DDL string"
            " (for example 'user STRING, amount DOUBLE')"
        )
    max_records = _int(options, "maxRecordsPerTrigger", 1)
    if max_records is not None and not streaming:
        raise InvalidArgumentError("option maxRecordsPerTrigger is for streaming reads")
    timeout = _int(options, "readTimeoutMs", 1)
    return ReadOptions(
        service_url=_get(options, "serviceUrl") or DEFAULT_SERVICE_URL,
        topics=names,
        topics_pattern=pattern,
        starting=starting,
        ending=ending,
        min_partitions=_int(options, "minPartitions", 1) or 1,
        max_records_per_trigger=max_records,
        fail_on_data_loss=_bool(options, "failOnDataLoss", default=True),
        value_decoding=decoding,  # type: ignore[arg-type]
        value_schema=value_schema,
        read_timeout_s=(timeout or 30_000) / 1000,
        client=client_settings(options),
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check a write's options; raises :class:`InvalidArgumentError` naming the bad one."""
    _check_security(options)
    topic = _get(options, "topic")
    producer: dict[str, Any] = {}
    for name, setting in (
        ("batchingMaxMessages", "batching_max_messages"),
        ("batchingMaxPublishDelayMs", "batching_max_publish_delay_ms"),
        ("compression", "compression"),
    ):
        value = _get(options, name)
        if value is None:
            continue
        producer[setting] = value if setting == "compression" else _int(options, name, 0)
    return WriteOptions(
        service_url=_get(options, "serviceUrl") or DEFAULT_SERVICE_URL,
        topic=topic.strip() if topic else None,
        client=client_settings(options),
        producer=producer,
    )
