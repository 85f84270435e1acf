"""The PySpark data source ``magnetar``: batch and streaming reads and writes.

Spark registers it by itself (from the top-level module ``pyspark_magnetar``), so::

    df = spark.read.format("magnetar").option("topic", "events").load()
    stream = spark.readStream.format("magnetar").option("topic", "events").load()
    df.write.format("magnetar").option("topic", "out").save()

Offsets are the per-partition message offsets the broker assigns (dense, from 0). A streaming
query keeps its offsets only in Spark's checkpoint, as Spark's Kafka source does: a restarted
query goes on exactly where its last committed batch ended.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from magnetar.aio.message import Message
from magnetar.common.errors import InvalidArgumentError
from magnetar.spark import io
from magnetar.spark.options import (
    ReadOptions,
    WriteOptions,
    parse_read_options,
    parse_write_options,
)
from magnetar.spark.planning import OffsetRange, share_limit, split_ranges

__all__ = ["SCHEMA", "MagnetarDataSource"]

SCHEMA = StructType(
    [
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        StructField("message_id", StringType(), nullable=False),
        StructField("key", StringType(), nullable=True),
        StructField("value", BinaryType(), nullable=True),
        StructField("publish_time", TimestampType(), nullable=False),
        StructField("event_time", TimestampType(), nullable=True),
        StructField("properties", MapType(StringType(), StringType()), nullable=False),
        StructField("producer_name", StringType(), nullable=False),
    ]
)
"""Every read returns these columns; ``valueFormat`` changes only the type of ``value``."""


def _time(ms: int) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=UTC) if ms > 0 else None


def _json_converter(data_type: DataType) -> Any:
    """A function turning parsed JSON into what Spark expects for ``data_type``."""
    if isinstance(data_type, StructType):
        fields = [(f.name, _json_converter(f.dataType)) for f in data_type.fields]

        def struct(value: Any) -> Any:
            if not isinstance(value, dict):
                return None
            return tuple(convert(value.get(name)) for name, convert in fields)

        return struct
    if isinstance(data_type, ArrayType):
        element = _json_converter(data_type.elementType)
        return lambda value: [element(v) for v in value] if isinstance(value, list) else None
    if isinstance(data_type, MapType):
        element = _json_converter(data_type.valueType)
        return lambda value: (
            {str(k): element(v) for k, v in value.items()} if isinstance(value, dict) else None
        )
    return lambda value: value


@dataclass(frozen=True)
class _RowBuilder:
    """Turns a message into a row of :data:`SCHEMA` (picklable: it travels to executors)."""

    topic: str
    partition: int
    decoding: str
    value_type: DataType

    def build(self) -> Any:
        topic, partition = self.topic, self.partition
        decode: Any
        if self.decoding == "utf8":

            def decode(data: bytes) -> Any:
                return data.decode("utf-8", errors="replace")

        elif self.decoding == "json":
            convert = _json_converter(self.value_type)

            def decode(data: bytes) -> Any:
                try:
                    return convert(json.loads(data))
                except ValueError:
                    return None

        else:

            def decode(data: bytes) -> Any:
                return data

        def row(message: Message) -> tuple[Any, ...]:
            offset, message_id, key, data, published, event, properties, producer = _fields(message)
            return (
                topic,
                partition,
                offset,
                message_id,
                key,
                decode(data),
                _time(published),
                _time(event),
                properties,
                producer,
            )

        return row


class _Range(InputPartition):
    def __init__(self, r: OffsetRange) -> None:
        super().__init__((r.topic, r.partition, r.start, r.end))
        self.range = r


def _fields(message: Message) -> tuple[Any, ...]:
    """What a row needs of a message, as cheaply as it can be had."""
    return (
        message.offset(),
        str(message.message_id()),
        message.partition_key(),
        message.data(),
        message.publish_timestamp(),
        message.event_timestamp(),
        message.properties(),
        message.producer_name(),
    )


_ARROW_TIME = pa.timestamp("us", tz="UTC")


def _arrow_schema(value: pa.DataType) -> pa.Schema:
    return pa.schema(
        [
            pa.field("topic", pa.string(), nullable=False),
            pa.field("partition", pa.int32(), nullable=False),
            pa.field("offset", pa.int64(), nullable=False),
            pa.field("message_id", pa.string(), nullable=False),
            pa.field("key", pa.string()),
            pa.field("value", value),
            pa.field("publish_time", _ARROW_TIME, nullable=False),
            pa.field("event_time", _ARROW_TIME),
            pa.field("properties", pa.map_(pa.string(), pa.string()), nullable=False),
            pa.field("producer_name", pa.string(), nullable=False),
        ]
    )


def _times(ms: Sequence[int], *, zero_is_null: bool) -> pa.Array:
    values = [m * 1000 if m > 0 else None for m in ms] if zero_is_null else [m * 1000 for m in ms]
    return pa.array(values, pa.int64()).cast(_ARROW_TIME)


def _arrow_batches(r: OffsetRange, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Binary and UTF-8 values: a chunk of messages as one Arrow batch. Spark takes it as it is,
    where a tuple per row would be converted a row at a time (several times slower)."""
    text = options.value_decoding == "utf8"
    schema = _arrow_schema(pa.string() if text else pa.binary())
    for chunk in io.read_chunks(r, options, _fields):
        offsets, ids, keys, data, published, events, properties, producers = zip(
            *chunk, strict=True
        )
        n = len(chunk)
        values: list[Any] = list(data)
        if text:
            values = [d.decode("utf-8", errors="replace") for d in data]
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([r.topic] * n, pa.string()),
                pa.array([r.partition] * n, pa.int32()),
                pa.array(offsets, pa.int64()),
                pa.array(ids, pa.string()),
                pa.array(keys, pa.string()),
                pa.array(values, schema.field("value").type),
                _times(published, zero_is_null=False),
                _times(events, zero_is_null=True),
                pa.array(
                    [list(p.items()) if p else [] for p in properties],
                    schema.field("properties").type,
                ),
                pa.array(producers, pa.string()),
            ],
            schema=schema,
        )


def _read(partition: _Range, options: ReadOptions, value_type: DataType) -> Iterator[Any]:
    r = partition.range
    if options.value_decoding != "json":
        yield from _arrow_batches(r, options)
        return
    build = _RowBuilder(r.topic, r.partition, options.value_decoding, value_type).build()
    yield from io.read_range(r, options, build)


# --- batch read ------------------------------------------------------------------------------


class _BatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions, value_type: DataType) -> None:
        self.options = options
        self.value_type = value_type

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        found = io.discover(options)
        if not found:
            raise InvalidArgumentError(f"no topic matches topicsPattern {options.topics_pattern!r}")
        io.check_offsets_exist(options.starting, found)
        io.check_offsets_exist(options.ending, found)
        starts = io.resolve(options, found, options.starting)
        ends = io.resolve(options, found, options.ending)
        ranges: list[OffsetRange] = []
        for p in found:
            start, end = starts[p.key], min(ends[p.key], p.next)
            if start < p.earliest:
                message = (
                    f"{p.topic} partition {p.partition}: the query starts at offset {start} but"
                    f" offsets before {p.earliest} are gone"
                )
                io.report_loss(message, fail=options.fail_on_data_loss)
                start = p.earliest
            if start > p.next:
                raise InvalidArgumentError(
                    f"{p.topic} partition {p.partition}: the starting offset {start} is past"
                    f" the end of the partition ({p.next})"
                )
            ranges.append(OffsetRange(p.topic, p.partition, start, max(start, end)))
        pieces = split_ranges(ranges, options.min_partitions)
        return [_Range(r) for r in pieces] or [_Range(OffsetRange("", -1, 0, 0))]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Range)
        yield from _read(partition, self.options, self.value_type)


# --- streaming read ----------------------------------------------------------------------------


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"<topic>|<partition>": next offset to read}``, in the checkpoint only."""

    def __init__(self, options: ReadOptions, value_type: DataType) -> None:
        self.options = options
        self.value_type = value_type
        self._target: dict[str, int] | None = None
        self._latest: dict[str, int] | None = None
        """The partitions' ends as the last :meth:`latestOffset` found them."""
        """With Trigger.AvailableNow: where the query stops (the end when it started)."""

    def _now(self) -> tuple[list[io.PartitionOffsets], dict[str, int]]:
        found = io.discover(self.options)
        return found, {p.key: p.next for p in found}

    def initialOffset(self) -> dict[str, int]:
        found, _ = self._now()
        io.check_offsets_exist(self.options.starting, found)
        return io.resolve(self.options, found, self.options.starting)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        _, latest = self._now()
        self._target = latest

    def reportLatestOffset(self) -> dict[str, int] | None:
        # what the last latestOffset saw: asking the brokers again would add a round trip a
        # trigger for a status figure
        return self._latest

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        found, latest = self._now()
        self._latest = latest
        if self._target is not None:
            latest = {k: min(v, self._target[k]) for k, v in latest.items() if k in self._target}
        # a partition the start does not know (added while the query ran) is read from its
        # first stored message
        earliest = {p.key: p.earliest for p in found}
        begin = {k: start.get(k, earliest[k]) for k in latest}
        end = dict(latest)
        if isinstance(limit, ReadMaxRows):
            backlogs = {k: max(0, latest[k] - begin[k]) for k in latest}
            shares = share_limit(backlogs, limit.max_rows)
            end = {k: begin[k] + shares[k] for k in latest}
        # keep every known partition in the offsets, even one that vanished
        return {**start, **{k: max(v, start.get(k, v)) for k, v in end.items()}}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        found = {p.key: p for p in io.discover(self.options)}
        ranges: list[OffsetRange] = []
        for key, stop in end.items():
            topic, partition = io.split_key(key)
            now = found.get(key)
            first = start.get(key)
            if first is None:
                first = now.earliest if now is not None else 0
            if now is not None and first < now.earliest:
                io.report_loss(
                    f"{topic} partition {partition}: the checkpoint resumes at offset {first}"
                    f" but offsets before {now.earliest} are gone",
                    fail=self.options.fail_on_data_loss,
                )
                first = now.earliest
            if stop > first:
                ranges.append(OffsetRange(topic, partition, first, stop))
        return [_Range(r) for r in split_ranges(ranges, self.options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Range)
        yield from _read(partition, self.options, self.value_type)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in Magnetar."""


# --- writes ----------------------------------------------------------------------------------


@dataclass
class _Written(WriterCommitMessage):
    partition: int
    written: int
    skipped: int


def _task_partition() -> tuple[int, Any]:
    context = TaskContext.get()
    if context is None:
        return 0, None
    return context.partitionId(), context


def _rows(iterator: Iterator[Any]) -> Iterator[dict[str, Any]]:
    for row in iterator:
        yield row.asDict() if hasattr(row, "asDict") else dict(row)


def _check_write_schema(schema: StructType, options: WriteOptions) -> None:
    names = {f.name for f in schema.fields}
    if "value" not in names:
        raise InvalidArgumentError(
            "writing to Magnetar needs a value column (binary or string); the DataFrame has"
            f" {sorted(names)}"
        )
    if "topic" not in names and options.topic is None:
        raise InvalidArgumentError("writing to Magnetar needs the option topic, or a topic column")
    allowed = {"value", "key", "properties", "topic"}
    extra = sorted(names - allowed)
    if extra:
        raise InvalidArgumentError(
            f"columns {extra} cannot be written: a Magnetar message takes value, key,"
            " properties and topic (select those first)"
        )


class _BatchWriter(DataSourceWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        # one name per write job, made on the driver: every task and every retry of it shares it
        self.job = f"spark-write-{uuid.uuid4().hex[:12]}"

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        partition, _ = _task_partition()
        result = io.write_rows(
            _rows(iterator),
            self.options,
            producer_name=f"{self.job}-{partition}",
            sequence_base=0,
            spark_partition=partition,
        )
        return _Written(partition, result.written, result.skipped)


class _StreamWriter(DataSourceStreamWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        partition, context = _task_partition()
        query = batch = None
        if context is not None:
            query = context.getLocalProperty("sql.streaming.queryId")
            batch = context.getLocalProperty("streaming.sql.batchId")
        if query is None or batch is None:
            raise InvalidArgumentError(
                "the streaming writer found no query id or batch id in its task; it runs only"
                " inside a Spark streaming query"
            )
        result = io.write_rows(
            _rows(iterator),
            self.options,
            # the query id survives restarts from the checkpoint; a replayed batch keeps its id
            producer_name=f"spark-{query}-{partition}",
            sequence_base=int(batch) * io.SEQUENCE_STRIDE,
            spark_partition=partition,
        )
        return _Written(partition, result.written, result.skipped)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: every message is durable when its task ends."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: a replay of the batch writes only what is missing."""


def _value(schema: StructType) -> DataType:
    return schema["value"].dataType


# --- the data source ---------------------------------------------------------------------------


class MagnetarDataSource(DataSource):
    """``spark.read.format("magnetar")`` and friends; see the module docs for the options."""

    @classmethod
    def name(cls) -> str:
        return "magnetar"

    def schema(self) -> StructType | str:
        decoding = (self.options.get("valueFormat") or "binary").lower()
        if decoding == "binary":
            return SCHEMA
        # as DDL: Spark parses it (the Python worker that asks has no session to parse with)
        value = "STRING"
        if decoding == "json":
            value = f"STRUCT<{self.options.get('valueSchema') or ''}>"
        return (
            "topic STRING NOT NULL, partition INT NOT NULL, offset BIGINT NOT NULL,"
            f" message_id STRING NOT NULL, key STRING, value {value},"
            " publish_time TIMESTAMP NOT NULL, event_time TIMESTAMP,"
            " properties MAP<STRING, STRING> NOT NULL, producer_name STRING NOT NULL"
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(parse_read_options(self.options, streaming=False), _value(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(parse_read_options(self.options, streaming=True), _value(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return _BatchWriter(_prepare_write(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return _StreamWriter(_prepare_write(self.options, schema))


def _prepare_write(given: Mapping[str, str], schema: StructType) -> WriteOptions:
    """A write's options, checked on the driver, its ``topic`` made to exist: created as a
    producer would create it when the brokers allow that, or a clear error before any task
    starts. Topics of a ``topic`` column are made so by the tasks that meet them."""
    options = parse_write_options(given)
    _check_write_schema(schema, options)
    if options.topic is not None and "topic" not in schema.fieldNames():
        io.ensure_topic(options, options.topic)
    return options
