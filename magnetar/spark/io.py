"""What the connector does against Magnetar, in plain Python: find partitions and their offsets
(driver), read an offset range (executor task), write rows idempotently (executor task).

Spark calls a Python data source synchronously, in driver and worker processes of its own, so
each call runs the asyncio client on a private event loop (:class:`Loop`). Every client is made
with :func:`client_arguments`: the ``client.*`` settings, TLS and credentials.
"""

from __future__ import annotations

import asyncio
import re
import socket
import warnings
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from magnetar.aio.admin import AdminClient
from magnetar.aio.auth import Authentication, AuthenticationTLS, AuthenticationToken
from magnetar.aio.client import Client
from magnetar.aio.message import Message
from magnetar.aio.producer import Producer
from magnetar.aio.routing import key_partition
from magnetar.common.errors import (
    InvalidArgumentError,
    MagnetarError,
    OperationTimeoutError,
    ReceiveTimeoutError,
    TopicNotFoundError,
)
from magnetar.common.names import parse_topic
from magnetar.spark.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    ReadOptions,
    Security,
    WriteOptions,
)
from magnetar.spark.planning import OffsetRange

__all__ = [
    "DataLossError",
    "Loop",
    "PartitionOffsets",
    "WriteResult",
    "client_arguments",
    "create_as_producer",
    "discover",
    "ensure_topic",
    "read_chunks",
    "read_range",
    "report_loss",
    "resolve",
    "write_rows",
]

R = TypeVar("R")

READ_CHUNK = 2_000
"""Messages a task takes off its reader per hop into the event loop."""


class DataLossError(MagnetarError):
    """Messages a query still needed were removed by retention before it read them."""


class Loop:
    """A private event loop for synchronous callers (Spark's driver and worker code)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    def __enter__(self) -> Loop:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass(frozen=True)
class PartitionOffsets:
    """One partition as the broker reports it now."""

    topic: str
    partition: int
    earliest: int
    """The first offset still stored (retention may have removed those before)."""
    next: int
    """The offset the next message will get."""

    @property
    def key(self) -> str:
        return offset_key(self.topic, self.partition)


def offset_key(topic: str, partition: int) -> str:
    """How a partition is named in the offsets a streaming query checkpoints."""
    return f"{topic}|{partition}"


def split_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition("|")
    return topic, int(partition)


@dataclass(frozen=True)
class TokenFile:
    """Reads the token from ``path`` each time the client asks (every new call or stream, and
    when a broker says a stream's token expired): a token rotated on disk is picked up."""

    path: str

    def __call__(self) -> str:
        return Path(self.path).read_text(encoding="utf-8").strip()


def _check_files(security: Security) -> None:
    # here, where the client is made: on the driver and on every executor, which may be other
    # machines than the one the query was written on
    for name, path in security.files():
        try:
            text = Path(path).read_bytes()
        except OSError as e:
            raise InvalidArgumentError(
                f"option {name}: cannot read {path} on host {socket.gethostname()}"
                f" ({e.strerror or type(e).__name__}); the file must be on the driver and on"
                " every executor",
                context={"option": name, "file": path},
            ) from None
        if not text.strip():
            raise InvalidArgumentError(
                f"option {name}: {path} on host {socket.gethostname()} is empty",
                context={"option": name, "file": path},
            )


def _authentication(security: Security) -> Authentication | None:
    if security.token is not None:
        return AuthenticationToken(security.token.reveal())
    if security.token_file is not None:
        return AuthenticationToken(TokenFile(security.token_file))
    if security.cert_file is not None and security.key_file is not None:
        return AuthenticationTLS(security.cert_file, security.key_file)
    return None


def _transport_certificate(security: Security) -> dict[str, str]:
    """With a token, a client certificate only opens the connection (brokers that require
    mutual TLS); the token's role counts."""
    has_token = security.token is not None or security.token_file is not None
    if not has_token or security.cert_file is None or security.key_file is None:
        return {}
    return {
        "tls_certificate_file_path": security.cert_file,
        "tls_private_key_file_path": security.key_file,
    }


def client_arguments(options: ReadOptions | WriteOptions) -> dict[str, Any]:
    """The keyword arguments of every client the connector makes (``Client`` and
    ``AdminClient``): the ``client.*`` settings, the TLS settings and the credentials. Files
    the options name are checked here, on the host that makes the client."""
    security = options.security
    _check_files(security)
    arguments: dict[str, Any] = dict(options.client)
    if security.trust_certs_file is not None:
        arguments["tls_trust_certs_file_path"] = security.trust_certs_file
    if security.validate_hostname is not None:
        arguments["tls_validate_hostname"] = security.validate_hostname
    authentication = _authentication(security)
    if authentication is not None:
        arguments["authentication"] = authentication
    arguments.update(_transport_certificate(security))
    return arguments


async def _topics(admin: AdminClient, options: ReadOptions) -> list[str]:
    if options.topics:
        return [parse_topic(t).topic for t in options.topics]
    assert options.topics_pattern is not None
    pattern = re.compile(options.topics_pattern)
    listed = await admin.list_topics("")
    return sorted(
        {
            parse_topic(t["topic"]).topic
            for t in listed
            if pattern.fullmatch(parse_topic(t["topic"]).topic)
        }
    )


async def _discover(options: ReadOptions) -> list[PartitionOffsets]:
    async with AdminClient(options.service_url, **client_arguments(options)) as admin:
        found: list[PartitionOffsets] = []
        for topic in await _topics(admin, options):
            try:
                stats = await admin.topic_stats(topic)
            except TopicNotFoundError:
                if options.topics:
                    raise TopicNotFoundError(
                        f"topic {topic} does not exist (create it first, or check the name)",
                        context={"topic": topic},
                    ) from None
                continue  # deleted after it was listed
            found.extend(
                PartitionOffsets(
                    topic,
                    parse_topic(p["partition_topic"]).partition,
                    int(p["earliest_offset"]),
                    int(p["next_offset"]),
                )
                for p in stats["partitions"]
            )
        return found


def discover(options: ReadOptions) -> list[PartitionOffsets]:
    """Every partition of the query's topics with its earliest and next offsets, now."""
    with Loop() as loop:
        result: list[PartitionOffsets] = loop.run(_discover(options))
        return result


async def _offset_at_time(client: Client, p: PartitionOffsets, time_ms: int, wait_s: float) -> int:
    """The offset of the first message published at or after ``time_ms`` (``next`` if none)."""
    if p.next <= p.earliest:
        return p.next
    topic = OffsetRange(p.topic, p.partition, 0, 0).partition_topic
    reader = await client.create_reader(topic, start_publish_time_ms=time_ms, receiver_queue_size=1)
    try:
        try:
            message = await reader.read_next(timeout_millis=int(min(wait_s, 2.0) * 1000))
        except ReceiveTimeoutError:
            return p.next
        return min(message.offset(), p.next)
    finally:
        await reader.close()


async def _resolve(
    options: ReadOptions, partitions: Sequence[PartitionOffsets], spec: OffsetSpec
) -> dict[str, int]:
    result: dict[str, int] = {}
    times: dict[str, int] = {}
    for p in partitions:
        if spec.kind == "earliest":
            result[p.key] = p.earliest
        elif spec.kind == "latest":
            result[p.key] = p.next
        elif spec.kind == "timestamp":
            times[p.key] = spec.timestamp_ms
        else:
            given = spec.per_partition.get(p.topic, {}).get(p.partition)
            if given is None:
                # by the topic name the user wrote, too
                for name, per in spec.per_partition.items():
                    if parse_topic(name).topic == p.topic and p.partition in per:
                        given = per[p.partition]
            if given is None:
                result[p.key] = p.earliest if spec.default == "earliest" else p.next
            elif spec.kind == "timestamps":
                times[p.key] = given
            elif given == EARLIEST:
                result[p.key] = p.earliest
            elif given == LATEST:
                result[p.key] = p.next
            else:
                result[p.key] = given
    if times:
        by_key = {p.key: p for p in partitions}
        async with Client(options.service_url, **client_arguments(options)) as client:
            for key, time_ms in times.items():
                result[key] = await _offset_at_time(
                    client, by_key[key], time_ms, options.read_timeout_s
                )
    return result


def resolve(
    options: ReadOptions, partitions: Sequence[PartitionOffsets], spec: OffsetSpec
) -> dict[str, int]:
    """Offsets for a start or end spec, per partition key (times are looked up by reading)."""
    with Loop() as loop:
        result: dict[str, int] = loop.run(_resolve(options, partitions, spec))
        return result


def check_offsets_exist(spec: OffsetSpec, found: Sequence[PartitionOffsets]) -> None:
    """Per-partition JSON that names a topic or partition the query does not read is a mistake."""
    if spec.kind not in ("offsets", "timestamps"):
        return
    known = {(p.topic, p.partition) for p in found}
    for name, per in spec.per_partition.items():
        topic = parse_topic(name).topic
        for partition in per:
            if (topic, partition) not in known:
                raise InvalidArgumentError(
                    f"offsets name partition {partition} of {name}, which this query does not"
                    f" read (its partitions: {sorted(p for t, p in known if t == topic) or 'none'})"
                )


# --- reading ------------------------------------------------------------------------------------


def report_loss(message: str, *, fail: bool) -> None:
    """Data the query needed is gone: raise :class:`DataLossError`, or warn and go on."""
    if fail:
        raise DataLossError(
            message + ". Retention removed them before this query read them; set"
            " failOnDataLoss=false to skip what is gone (with a warning) instead."
        )
    warnings.warn(message + "; skipped (failOnDataLoss=false)", stacklevel=2)


async def _read_chunks(
    client: Client, r: OffsetRange, options: ReadOptions, to_row: Callable[[Message], R]
) -> AsyncGenerator[list[R], None]:
    reader = await client.create_reader(
        r.partition_topic, start_offset=r.start, receiver_queue_size=min(10_000, max(100, r.size))
    )
    try:
        expected = r.start
        timeout_ms = int(options.read_timeout_s * 1000)
        while expected < r.end:
            rows: list[R] = []
            try:
                messages = await reader.read_available(
                    min(READ_CHUNK, r.end - expected), timeout_millis=timeout_ms
                )
            except ReceiveTimeoutError:
                raise OperationTimeoutError(
                    f"reading {r.partition_topic}: no message at offset {expected} within"
                    f" {options.read_timeout_s:g} s (the range ends at {r.end}); is the"
                    " broker reachable? (option readTimeoutMs)"
                ) from None
            for message in messages:
                offset = message.offset()
                if offset < expected:
                    continue  # before the range (a message of a batch that starts earlier)
                if offset > expected:
                    report_loss(
                        f"{r.partition_topic}: offsets {expected}..{offset - 1} are gone",
                        fail=options.fail_on_data_loss,
                    )
                if offset >= r.end:
                    expected = r.end
                    break
                rows.append(to_row(message))
                expected = offset + 1
            yield rows
    finally:
        await reader.close()


def read_chunks(
    r: OffsetRange, options: ReadOptions, to_row: Callable[[Message], R]
) -> Iterator[list[R]]:
    """Every message of ``r`` as a row, in offset order, a chunk (up to :data:`READ_CHUNK`
    rows) at a time: one Spark task's work."""
    if r.size <= 0:
        return
    with Loop() as loop:

        async def open_client() -> Client:
            return Client(options.service_url, **client_arguments(options))

        client: Client = loop.run(open_client())
        try:
            chunks = _read_chunks(client, r, options, to_row)
            try:
                while True:
                    try:
                        rows = loop.run(chunks.__anext__())
                    except StopAsyncIteration:
                        break
                    if rows:
                        yield rows
            finally:
                loop.run(chunks.aclose())
        finally:
            loop.run(client.close())


def read_range(r: OffsetRange, options: ReadOptions, to_row: Callable[[Message], R]) -> Iterator[R]:
    """Every message of ``r`` as a row, in offset order."""
    for rows in read_chunks(r, options, to_row):
        yield from rows


# --- writing ------------------------------------------------------------------------------------


@dataclass
class WriteResult:
    """What one task wrote: sent now, and skipped because an earlier attempt had stored them."""

    written: int = 0
    skipped: int = 0
    per_topic: dict[str, int] = field(default_factory=dict)


@dataclass
class _Target:
    topic: str
    partitions: int
    producers: dict[int, Producer] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    """Rows routed to each partition so far (the next one's number within this task)."""
    stored: dict[int, int] = field(default_factory=dict)
    """The last sequence id the broker had for each partition's producer when it opened."""


async def create_as_producer(client: Client, topic: str) -> int:
    """Look ``topic`` up as a producer does, which creates it when it does not exist and the
    brokers allow it (``allow_auto_topic_creation``, with ``auto_topic_partitions``
    partitions); its number of partitions (0: not partitioned). Raises
    :class:`TopicNotFoundError` saying what to do when the brokers do not create topics."""
    try:
        found = await client.get_topic_partitions(topic)
    except TopicNotFoundError:
        raise TopicNotFoundError(
            f"topic {topic} does not exist, and the brokers do not create topics on first use"
            " (their setting allow_auto_topic_creation is off): create it before writing to it"
            f" (magnetar topics create {topic} --partitions N), or turn"
            " allow_auto_topic_creation on",
            context={"topic": topic},
        ) from None
    return sum(1 for name in found if parse_topic(name).is_partition)


async def _ensure_topic(options: WriteOptions, topic: str) -> int:
    async with (
        Client(options.service_url, **client_arguments(options)) as client,
        client.admin() as admin,
    ):
        try:
            return await admin.get_partitions(topic)
        except TopicNotFoundError:
            return await create_as_producer(client, topic)


def ensure_topic(options: WriteOptions, topic: str) -> int:
    """``topic``'s number of partitions, the topic created first as a producer would create it
    (see :func:`create_as_producer`): the driver's check before a write's tasks start."""
    with Loop() as loop:
        result: int = loop.run(_ensure_topic(options, parse_topic(topic).topic))
        return result


SEQUENCE_STRIDE = 1 << 32
"""A streaming batch's messages are numbered from ``batch_id * SEQUENCE_STRIDE``."""


async def _write(
    rows: Iterator[Mapping[str, Any]],
    options: WriteOptions,
    producer_name: str,
    sequence_base: int,
    spark_partition: int,
) -> WriteResult:
    result = WriteResult()
    targets: dict[str, _Target] = {}
    pending: list[asyncio.Future[Any]] = []
    async with Client(options.service_url, **client_arguments(options)) as client:
        admin = client.admin()
        try:

            async def target_of(name: str) -> _Target:
                full = parse_topic(name).topic
                target = targets.get(full)
                if target is None:
                    try:
                        partitions = await admin.get_partitions(full)
                    except TopicNotFoundError:
                        partitions = await create_as_producer(client, full)
                    target = targets[full] = _Target(full, partitions)
                return target

            async def producer_of(target: _Target, partition: int) -> Producer:
                producer = target.producers.get(partition)
                if producer is None:
                    topic = (
                        target.topic if partition < 0 else f"{target.topic}-partition-{partition}"
                    )
                    producer = await client.create_producer(
                        topic,
                        producer_name=producer_name,
                        initial_sequence_id=sequence_base - 1,
                        **options.producer,
                    )
                    target.producers[partition] = producer
                    target.stored[partition] = producer.last_sequence_id
                return producer

            for index, row in enumerate(rows):
                topic = row.get("topic") or options.topic
                if not topic:
                    raise InvalidArgumentError(
                        "a row to write has no topic: give the option topic, or a topic column"
                    )
                value = row.get("value")
                if value is None:
                    raise InvalidArgumentError(
                        f"row {index} of Spark partition {spark_partition} has no value (the"
                        " value column is required and not null)"
                    )
                if isinstance(value, str):
                    value = value.encode()
                elif isinstance(value, bytearray | memoryview):
                    value = bytes(value)
                elif not isinstance(value, bytes):
                    raise InvalidArgumentError(
                        f"the value column is binary or string, got {type(value).__name__}"
                    )
                key = row.get("key")
                if key is not None and not isinstance(key, str):
                    key = key.decode() if isinstance(key, bytes | bytearray) else str(key)
                properties = row.get("properties") or None
                target = await target_of(topic)
                if target.partitions == 0:
                    partition = -1
                elif key is not None:
                    partition = key_partition(key, target.partitions)
                else:
                    # deterministic round robin: a retried task routes every row as before
                    partition = (spark_partition + index) % target.partitions
                producer = await producer_of(target, partition)
                number = target.counts.get(partition, 0)
                target.counts[partition] = number + 1
                if sequence_base + number <= target.stored[partition]:
                    result.skipped += 1  # stored by an earlier attempt of this task
                    continue
                pending.append(producer.send_async(value, properties=properties, partition_key=key))
                result.written += 1
                result.per_topic[target.topic] = result.per_topic.get(target.topic, 0) + 1
                if len(pending) >= 5_000:
                    await asyncio.gather(*pending)
                    pending.clear()
            await asyncio.gather(*pending)
            for target in targets.values():
                for producer in target.producers.values():
                    await producer.close()
        finally:
            await admin.close()
    return result


def write_rows(
    rows: Iterator[Mapping[str, Any]],
    options: WriteOptions,
    *,
    producer_name: str,
    sequence_base: int,
    spark_partition: int,
) -> WriteResult:
    """Send ``rows`` (dicts with value, optional key, properties and topic) under producer
    ``producer_name``, numbering each partition's messages from ``sequence_base``; what an
    earlier attempt with the same name and base stored is skipped, so a retry writes each row
    once (given the same rows in the same order, which Spark's retries of a task give)."""
    with Loop() as loop:
        result: WriteResult = loop.run(
            _write(rows, options, producer_name, sequence_base, spark_partition)
        )
        return result
