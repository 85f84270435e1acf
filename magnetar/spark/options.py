"""The connector's options: parsed and checked once, on the driver, with errors that name them.

Spark hands a data source its options as strings in a case-insensitive map. Everything here is
plain Python (no PySpark), so it is unit-tested without a Spark session.

The ``tls.*`` and ``auth.*`` options become a :class:`Security`. A token given as ``auth.token``
is kept in a :class:`Secret`, which prints as ``***``: no repr, log line or error message the
connector makes shows it. ``auth.tokenFile`` is better still: only the path travels, and the
file is read where each client is made (the driver and every executor).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from magnetar.aio.names import uses_tls
from magnetar.common.errors import InvalidArgumentError

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "ReadOptions",
    "Secret",
    "Security",
    "WriteOptions",
    "client_settings",
    "parse_read_options",
    "parse_security",
    "parse_write_options",
]

EARLIEST = -2
"""In per-partition JSON offsets (as Kafka's): the first stored message."""
LATEST = -1
"""In per-partition JSON offsets (as Kafka's): the offset the next message will get."""

DEFAULT_SERVICE_URL = "magnetar://localhost:6650"
CLIENT_PREFIX = "client."
"""Options starting with this go to the client's settings (``client.operation_timeout_s``)."""
TOKEN = "auth.token"  # noqa: S105 - option names, not tokens
TOKEN_FILE = "auth.tokenFile"  # noqa: S105
TLS_ENABLED = "tls.enabled"
TRUST_CERTS_FILE = "tls.trustCertsFilePath"
VALIDATE_HOSTNAME = "tls.validateHostname"
CERT_FILE = "tls.certFilePath"
KEY_FILE = "tls.keyFilePath"
SECURITY_OPTIONS = (
    TOKEN,
    TOKEN_FILE,
    TLS_ENABLED,
    TRUST_CERTS_FILE,
    VALIDATE_HOSTNAME,
    CERT_FILE,
    KEY_FILE,
)
"""Every ``tls.*`` and ``auth.*`` option; any other name under those prefixes is an error (a
misspelt security option must not quietly connect without it)."""
CLIENT_SECURITY_SETTINGS = {
    "authentication": f"{TOKEN}, {TOKEN_FILE} or {CERT_FILE} with {KEY_FILE}",
    "tls_trust_certs_file_path": TRUST_CERTS_FILE,
    "tls_validate_hostname": VALIDATE_HOSTNAME,
    "tls_certificate_file_path": CERT_FILE,
    "tls_private_key_file_path": KEY_FILE,
}
"""Client settings the connector sets from its own options, so ``client.<name>`` is refused."""

ValueDecoding = Literal["binary", "utf8", "json"]


class Secret:
    """A string that prints as ``***`` (in ``repr``, ``str`` and f-strings); :meth:`reveal`
    gives the value, for the one place that sends it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        # pickled to Spark's executors inside the reader and writer
        return Secret, (self._value,)


@dataclass(frozen=True, kw_only=True)
class Security:
    """How every client the connector makes connects: TLS and credentials."""

    token: Secret | None = None
    """``auth.token``: the token itself (prints as ``***``)."""
    token_file: str | None = None
    """``auth.tokenFile``: a file holding the token, read where each client is made and again
    for each new call or stream (a rotated token is picked up)."""
    trust_certs_file: str | None = None
    """``tls.trustCertsFilePath``: PEM CA certificates that sign the brokers' (None: the
    system's CAs)."""
    validate_hostname: bool | None = None
    """``tls.validateHostname``: refuse a broker whose certificate does not name its host
    (None: the client's default, true)."""
    cert_file: str | None = None
    """``tls.certFilePath``: a client certificate (PEM) for mutual TLS: the role, or with a
    token, only the transport (the token's role counts)."""
    key_file: str | None = None
    """``tls.keyFilePath``: the client certificate's private key (PEM)."""

    def files(self) -> list[tuple[str, str]]:
        """``(option, path)`` of every file given, to check where a client is made."""
        given = (
            (TOKEN_FILE, self.token_file),
            (TRUST_CERTS_FILE, self.trust_certs_file),
            (CERT_FILE, self.cert_file),
            (KEY_FILE, self.key_file),
        )
        return [(name, path) for name, path in given if path]


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
    security: Security = field(default_factory=Security)


@dataclass(frozen=True)
class WriteOptions:
    service_url: str
    topic: str | None
    client: dict[str, Any]
    producer: dict[str, Any]
    security: Security = field(default_factory=Security)


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


def _check_security_names(options: Mapping[str, str]) -> None:
    known = {name.lower(): name for name in SECURITY_OPTIONS}
    for key in options:
        lowered = key.lower()
        if lowered.startswith(CLIENT_PREFIX):
            setting = lowered[len(CLIENT_PREFIX) :]
            if setting in CLIENT_SECURITY_SETTINGS:
                raise InvalidArgumentError(
                    f"option {key} is not passed to the client: give"
                    f" {CLIENT_SECURITY_SETTINGS[setting]} instead"
                )
            continue
        if not lowered.startswith(("tls.", "auth.")) or lowered in known:
            continue
        # compared without case, "_" and "-": auth.token_file is close to auth.tokenFile
        squashed = {re.sub("[_-]", "", k): v for k, v in known.items()}
        close = difflib.get_close_matches(re.sub("[_-]", "", lowered), list(squashed), n=1)
        hint = f"; did you mean {squashed[close[0]]}?" if close else "."
        raise InvalidArgumentError(
            f"unknown option {key}{hint} The TLS and authentication options are"
            f" {', '.join(SECURITY_OPTIONS)}."
        )


def parse_security(options: Mapping[str, str], service_url: str) -> Security:
    """The ``tls.*`` and ``auth.*`` options, checked against each other and the service URL;
    raises :class:`InvalidArgumentError` naming the option (never quoting a token)."""
    _check_security_names(options)
    token = _get(options, TOKEN)
    token_file = _get(options, TOKEN_FILE)
    cert_file = _get(options, CERT_FILE)
    key_file = _get(options, KEY_FILE)
    trust = _get(options, TRUST_CERTS_FILE)
    if token is not None and token_file is not None:
        raise InvalidArgumentError(
            f"give one of the options {TOKEN} and {TOKEN_FILE}, not both ({TOKEN_FILE} keeps"
            " the token out of the query plan)"
        )
    if token is not None and not token.strip():
        raise InvalidArgumentError(f"option {TOKEN} is empty")
    for name, value in ((TOKEN_FILE, token_file), (TRUST_CERTS_FILE, trust)):
        if value is not None and not value.strip():
            raise InvalidArgumentError(f"option {name} is a file path, got an empty one")
    if (cert_file is None) != (key_file is None):
        given, missing = (CERT_FILE, KEY_FILE) if key_file is None else (KEY_FILE, CERT_FILE)
        raise InvalidArgumentError(
            f"option {given} needs {missing} too: a client certificate is a certificate file"
            " and its private key file"
        )
    validate = None
    if _get(options, VALIDATE_HOSTNAME) is not None:
        validate = _bool(options, VALIDATE_HOSTNAME, default=True)
    enabled = None
    if _get(options, TLS_ENABLED) is not None:
        enabled = _bool(options, TLS_ENABLED, default=True)
    tls = uses_tls(service_url.strip())
    if not tls:
        tls_given = [
            name
            for name, value in (
                (TRUST_CERTS_FILE, trust),
                (VALIDATE_HOSTNAME, validate),
                (CERT_FILE, cert_file),
                (KEY_FILE, key_file),
            )
            if value is not None
        ]
        if enabled:
            raise InvalidArgumentError(
                f"option {TLS_ENABLED}=true, but serviceUrl {service_url!r} is not TLS: use"
                " magnetar+ssl://host:port (the brokers' TLS port)"
            )
        if tls_given:
            raise InvalidArgumentError(
                f"option {tls_given[0]} is for TLS connections, but serviceUrl {service_url!r}"
                " is not TLS: use magnetar+ssl://host:port (the brokers' TLS port)"
            )
    elif enabled is False:
        raise InvalidArgumentError(
            f"option {TLS_ENABLED}=false, but serviceUrl {service_url!r} is TLS: give a"
            " magnetar:// URL to connect without TLS"
        )
    return Security(
        token=Secret(token.strip()) if token is not None else None,
        token_file=token_file.strip() if token_file is not None else None,
        trust_certs_file=trust.strip() if trust is not None else None,
        validate_hostname=validate,
        cert_file=cert_file.strip() if cert_file is not None else None,
        key_file=key_file.strip() if key_file is not None else None,
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
    service_url = _get(options, "serviceUrl") or DEFAULT_SERVICE_URL
    security = parse_security(options, service_url)
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
        service_url=service_url,
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
        security=security,
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check a write's options; raises :class:`InvalidArgumentError` naming the bad one."""
    service_url = _get(options, "serviceUrl") or DEFAULT_SERVICE_URL
    security = parse_security(options, service_url)
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
        service_url=service_url,
        topic=topic.strip() if topic else None,
        client=client_settings(options),
        producer=producer,
        security=security,
    )
