"""The Spark connector against a real ``magnetar standalone`` and real Spark on ``local[2]``.

One SparkSession for the whole run (``spark``, in conftest.py: it takes seconds to start).
Spark's calls block, so they run in a thread (``spark_call``): the test's event loop keeps
reading the servers' output meanwhile.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

pyspark = pytest.importorskip("pyspark", reason="pip install magnetar[spark]")

from pyspark import TaskContext  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402, N812
from pyspark.sql.types import BinaryType  # noqa: E402

from magnetar.aio import Client  # noqa: E402
from magnetar.aio.admin import AdminClient  # noqa: E402
from magnetar.aio.message import Message  # noqa: E402
from magnetar.aio.routing import key_partition  # noqa: E402
from magnetar.common.errors import TopicNotFoundError  # noqa: E402
from magnetar.spark import io  # noqa: E402
from magnetar.spark.options import parse_read_options, parse_write_options  # noqa: E402
from magnetar.spark.planning import OffsetRange  # noqa: E402
from magnetar.testing import LocalCluster, StandaloneNode  # noqa: E402
from magnetar.testing.eventually import eventually  # noqa: E402

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

T = TypeVar("T")
HERE = Path(__file__).parent
EVENT_TIME_BASE = 1_700_000_000_000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StandaloneNode]:
    async with StandaloneNode(tmp_path_factory.mktemp("spark") / "data") as running:
        yield running


async def spark_call(fn: Callable[[], T], session: SparkSession | None = None) -> T:
    def call() -> T:
        # Spark looks up a Python data source for a write (df.write...save()) in the thread's
        # active session, and a fresh thread has none
        active = session or SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
        active._jvm.SparkSession.setActiveSession(active._jsparkSession)  # type: ignore[union-attr]
        return fn()

    return await asyncio.to_thread(call)


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def produce(
    url: str,
    topic: str,
    count: int,
    *,
    partitions: int,
    start: int = 0,
    create: bool = True,
) -> None:
    """``count`` messages: value ``v<i>``, key ``k<i % 100>``, property ``i``, event time."""
    async with Client(url) as client:
        if create:
            async with AdminClient(url) as admin:
                await admin.create_topic(topic, partitions=partitions)
        producer = await client.create_producer(topic)
        for first in range(start, start + count, 10_000):
            await asyncio.gather(
                *(
                    producer.send_async(
                        f"v{i}".encode(),
                        properties={"i": str(i)},
                        partition_key=f"k{i % 100}",
                        event_timestamp=EVENT_TIME_BASE + i,
                    )
                    for i in range(first, min(first + 10_000, start + count))
                )
            )
        await producer.close()


def read(spark: SparkSession, url: str, **options: str) -> Any:
    reader = spark.read.format("magnetar").option("serviceUrl", url)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


# --- batch reads ------------------------------------------------------------------------------


async def test_a_batch_read_returns_every_message_with_its_columns(
    spark: SparkSession, node: StandaloneNode
) -> None:
    topic = unique("batch")
    produced_from = time.time()
    await produce(node.service_url, topic, 100_000, partitions=4)
    produced_to = time.time()
    df = read(spark, node.service_url, topic=topic)
    rows = await spark_call(df.collect)
    assert len(rows) == 100_000
    by_index = {int(r["properties"]["i"]): r for r in rows}
    assert sorted(by_index) == list(range(100_000))
    offsets: dict[int, list[int]] = {}
    ids = set()
    for i, r in by_index.items():
        assert r["topic"] == f"public/default/{topic}"
        assert r["value"] == f"v{i}".encode()
        assert r["key"] == f"k{i % 100}"
        assert r["partition"] == key_partition(r["key"], 4)
        assert r["event_time"].timestamp() * 1000 == pytest.approx(EVENT_TIME_BASE + i)
        # the broker's clock, while the messages were being produced
        assert produced_from - 1 <= r["publish_time"].timestamp() <= produced_to + 1
        assert r["producer_name"]
        offsets.setdefault(r["partition"], []).append(r["offset"])
        ids.add(r["message_id"])
    assert len(ids) == 100_000
    for partition, found in offsets.items():
        assert sorted(found) == list(range(len(found))), f"partition {partition} has gaps"
    assert sorted(offsets) == [0, 1, 2, 3]

    # finer splits read the same messages
    finer = read(spark, node.service_url, topic=topic, minPartitions="10")
    assert await spark_call(finer.rdd.getNumPartitions) >= 10
    assert await spark_call(finer.count) == 100_000


async def test_batch_reads_between_offsets_and_from_a_time(
    spark: SparkSession, node: StandaloneNode
) -> None:
    topic = unique("ranges")
    await produce(node.service_url, topic, 2_000, partitions=2)
    stats = [
        (p.partition, p.next)
        for p in await asyncio.to_thread(io.discover, _read_options(node.service_url, topic))
    ]
    total = dict(stats)
    assert sum(total.values()) == 2_000
    start = json.dumps({topic: {"0": 10, "1": -2}})
    end = json.dumps({topic: {"0": 110, "1": -1}})
    df = read(spark, node.service_url, topic=topic, startingOffsets=start, endingOffsets=end)
    got = await spark_call(lambda: df.groupBy("partition").count().collect())
    assert {r["partition"]: r["count"] for r in got} == {0: 100, 1: total[1]}

    # a time: only what was published at or after it
    await asyncio.sleep(0.05)
    middle = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    await produce(node.service_url, topic, 500, partitions=2, start=2_000, create=False)
    later = read(spark, node.service_url, topic=topic, startingTimestamp=str(middle))
    indexes = await spark_call(lambda: [int(r["properties"]["i"]) for r in later.collect()])
    assert sorted(indexes) == list(range(2_000, 2_500))


async def test_bad_options_fail_with_a_message_naming_them(
    spark: SparkSession, node: StandaloneNode
) -> None:
    cases = {
        "startingOffsets": ("{not json", "startingOffsets"),
        "minPartitions": ("zero", "minPartitions"),
        "failOnDataLoss": ("maybe", "failOnDataLoss"),
    }
    for name, (value, expected) in cases.items():
        df = read(spark, node.service_url, topic="anything", **{name: value})
        with pytest.raises(Exception, match=expected):
            await spark_call(df.count)
    missing = read(spark, node.service_url, topic=unique("missing"))
    with pytest.raises(Exception, match="does not exist"):
        await spark_call(missing.count)


async def test_values_decode_as_utf8_or_json(spark: SparkSession, node: StandaloneNode) -> None:
    url = node.service_url
    topic = unique("json")
    async with Client(url) as client:
        producer = await client.create_producer(topic)
        for i in range(20):
            await producer.send(json.dumps({"user": f"u{i % 3}", "amount": i * 1.5}).encode())
        await producer.send(b"not json")
        await producer.close()
    text = read(spark, url, topic=topic, valueFormat="utf8").select("value")
    assert (await spark_call(text.collect))[-1]["value"] == "not json"
    parsed = read(
        spark, url, topic=topic, valueFormat="json", valueSchema="user STRING, amount DOUBLE"
    ).select("offset", "value.user", "value.amount", "value")
    rows = sorted(await spark_call(parsed.collect), key=lambda r: r["offset"])
    assert [(r["user"], r["amount"]) for r in rows[:3]] == [("u0", 0.0), ("u1", 1.5), ("u2", 3.0)]
    assert rows[-1]["value"] is None  # a value that is not JSON reads as null


def _read_options(url: str, topic: str) -> Any:
    return parse_read_options({"serviceUrl": url, "topic": topic}, streaming=False)


# --- streaming reads ----------------------------------------------------------------------------


@pytest.mark.timeout(300)  # two Spark drivers start in turn, about a minute on a busy machine
async def test_a_killed_driver_restarts_from_its_checkpoint_exactly_once(
    node: StandaloneNode, tmp_path: Path
) -> None:
    topic = unique("restart")
    await produce(node.service_url, topic, 1_500, partitions=3)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = [str(HERE / "stream_driver.py"), node.service_url, topic, str(out), str(checkpoint)]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent)}
    driver = await asyncio.create_subprocess_exec(
        sys.executable, *args, "run", stdout=asyncio.subprocess.PIPE, env=env
    )
    assert driver.stdout is not None
    batches = 0
    async with asyncio.timeout(120):
        while batches < 2:
            line = (await driver.stdout.readline()).decode()
            assert line, "the driver ended before it was killed"
            if line.startswith("batch "):
                batches += 1
    # SIGKILL the driver's whole process group would also take Spark's JVM; the JVM is its
    # child and dies with it (its stdin closes)
    driver.send_signal(signal.SIGKILL)
    await driver.wait()
    await asyncio.sleep(2)  # its JVM exits when its stdin (the killed driver) closes
    finish = await asyncio.create_subprocess_exec(sys.executable, *args, "finish", env=env)
    async with asyncio.timeout(180):
        assert await finish.wait() == 0

    def collect() -> list[tuple[int, int, str]]:
        session = SparkSession.builder.getOrCreate()
        return [
            (r["partition"], r["offset"], r["value"])
            for r in session.read.parquet(str(out)).collect()
        ]

    rows = await spark_call(collect)
    values = sorted(int(v[1:]) for _, _, v in rows)
    assert values == list(range(1_500)), "every message exactly once"
    assert len({(p, o) for p, o, _ in rows}) == 1_500


async def test_a_partition_added_while_the_query_runs_is_read_from_its_start(
    spark: SparkSession, node: StandaloneNode, tmp_path: Path
) -> None:
    topic = unique("grow")
    url = node.service_url
    await produce(url, topic, 200, partitions=2)
    name = topic.replace("-", "_")
    query = (
        spark.readStream.format("magnetar")
        .option("serviceUrl", url)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        await spark_call(query.processAllAvailable)
        assert await spark_call(lambda: spark.table(name).count()) == 200
        async with AdminClient(url) as admin:
            assert await admin.update_partitions(topic, 3) == 3
        async with Client(url) as client:
            producer = await client.create_producer(f"{topic}-partition-2")
            for i in range(50):
                await producer.send(f"new{i}".encode())
            await producer.close()
        await produce(url, topic, 100, partitions=3, start=200, create=False)
        async with asyncio.timeout(60):
            while await spark_call(lambda: spark.table(name).count()) < 350:
                await spark_call(query.processAllAvailable)
        rows = await spark_call(
            lambda: spark.table(name).where("partition = 2").select("offset", "value").collect()
        )
        new = sorted((r["offset"], r["value"]) for r in rows if r["value"].startswith(b"new"))
        assert [o for o, _ in new] == list(range(50))  # from the partition's first message
        assert [v for _, v in new] == [f"new{i}".encode() for i in range(50)]
        assert await spark_call(lambda: spark.table(name).count()) == 350
    finally:
        await spark_call(query.stop)


async def test_max_records_per_trigger_is_shared_by_backlog_and_available_now_stops(
    spark: SparkSession, node: StandaloneNode, tmp_path: Path
) -> None:
    topic = unique("limit")
    await produce(node.service_url, topic, 1_000, partitions=2)
    name = topic.replace("-", "_")
    query = (
        spark.readStream.format("magnetar")
        .option("serviceUrl", node.service_url)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "150")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    await spark_call(query.awaitTermination)
    progress = query.recentProgress
    sizes = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert sum(sizes) == 1_000
    assert max(sizes) <= 150
    assert len(sizes) >= 7
    assert await spark_call(lambda: spark.table(name).count()) == 1_000


# --- writes -------------------------------------------------------------------------------------


def _values(r: OffsetRange, options: Any) -> list[bytes]:
    return list(io.read_range(r, options, Message.data))


async def read_values(url: str, topic: str) -> list[bytes]:
    """Every value stored in ``topic`` (all partitions), by a reader from the start."""
    options = _read_options(url, topic)
    found = await asyncio.to_thread(io.discover, options)
    values: list[bytes] = []
    for p in found:
        r = OffsetRange(p.topic, p.partition, p.earliest, p.next)
        values += await asyncio.to_thread(_values, r, options)
    return values


async def test_a_retried_writer_task_writes_each_row_once(
    node: StandaloneNode, tmp_path: Path
) -> None:
    url = node.service_url
    target = unique("retry-direct")
    async with AdminClient(url) as admin:
        await admin.create_topic(target, partitions=2)
    options = parse_write_options({"serviceUrl": url, "topic": target})

    def rows(fail_at: int | None) -> Iterator[dict[str, Any]]:
        for i in range(12_000):
            if i == fail_at:
                raise RuntimeError("the task dies here")
            yield {"value": f"r{i}".encode()}

    with pytest.raises(RuntimeError, match="dies here"):
        await asyncio.to_thread(
            io.write_rows,
            rows(7_000),
            options,
            producer_name="retry-test-0",
            sequence_base=0,
            spark_partition=0,
        )
    again = await asyncio.to_thread(
        io.write_rows,
        rows(None),
        options,
        producer_name="retry-test-0",
        sequence_base=0,
        spark_partition=0,
    )
    assert again.skipped >= 5_000  # what the first attempt stored was not sent again
    assert again.skipped + again.written == 12_000
    values = await read_values(url, target)
    assert sorted(values) == sorted(f"r{i}".encode() for i in range(12_000))


async def test_a_streaming_write_with_a_failed_task_leaves_no_duplicates(
    spark: SparkSession, node: StandaloneNode, tmp_path: Path
) -> None:
    url = node.service_url
    source, target = unique("src"), unique("dst")
    await produce(url, source, 4_000, partitions=2)
    async with AdminClient(url) as admin:
        await admin.create_topic(target, partitions=3)
    marker = tmp_path / "failed-once"

    def fail_once(value: bytes) -> bytes:
        context = TaskContext.get()
        if value == b"v3000" and context is not None and context.attemptNumber() == 0:
            marker.write_text("failed")
            raise RuntimeError("a task fails once, after writing part of its rows")
        return value

    udf = F.udf(fail_once, BinaryType(), useArrow=False)
    query = (
        spark.readStream.format("magnetar")
        .option("serviceUrl", url)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .load()
        .select(udf(F.col("value")).alias("value"), "key")
        .writeStream.format("magnetar")
        .option("serviceUrl", url)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    await spark_call(query.awaitTermination)
    assert marker.exists(), "the task did not fail: the retry was not exercised"
    values = await read_values(url, target)
    assert len(values) == 4_000
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(4_000))


async def test_a_batch_write_routes_by_key_and_to_a_topic_column(
    spark: SparkSession, node: StandaloneNode
) -> None:
    url = node.service_url
    first, second = unique("w1"), unique("w2")
    async with AdminClient(url) as admin:
        await admin.create_topic(first, partitions=3)
        await admin.create_topic(second)
    rows = [
        (f"value-{i}", f"key-{i % 10}", first if i % 2 else second, {"n": str(i)})
        for i in range(500)
    ]
    df = spark.createDataFrame(
        rows, "value STRING, key STRING, topic STRING, properties MAP<STRING,STRING>"
    )
    await spark_call(
        lambda: df.write.format("magnetar").option("serviceUrl", url).mode("append").save()
    )
    back = read(spark, url, topics=f"{first},{second}")
    got = await spark_call(
        lambda: back.select("topic", "partition", "key", "value", "properties").collect()
    )
    assert len(got) == 500
    for r in got:
        i = int(r["properties"]["n"])
        assert r["value"] == f"value-{i}".encode()
        assert r["key"] == f"key-{i % 10}"
        if i % 2:
            assert r["topic"] == f"public/default/{first}"
            assert r["partition"] == key_partition(r["key"], 3)
        else:
            assert r["topic"] == f"public/default/{second}"
    pattern = read(spark, url, topicsPattern=f"public/default/({first}|{second})")
    assert await spark_call(pattern.count) == 500
    bad = spark.createDataFrame([(1,)], "number INT")
    with pytest.raises(Exception, match="value column"):
        await spark_call(
            lambda: (
                bad.write.format("magnetar")
                .option("serviceUrl", url)
                .option("topic", first)
                .mode("append")
                .save()
            )
        )


# --- no set-up: Spark finds the source, and a write creates its topic ---------------------------


def spark_found_by_itself(session: SparkSession) -> set[str]:
    """The Python data sources Spark registered by itself: those its lookup worker (a Python
    process of its own, importing every top-level ``pyspark_*`` module on its path) found. Spark
    keeps them once per JVM; nothing this process registers is among them."""
    package = session._jvm.org.apache.spark.sql.execution.datasources  # type: ignore[union-attr]
    found = getattr(getattr(package, "DataSourceManager$"), "MODULE$").dataSourceBuilders()
    if not found.isDefined():
        return set()
    return set(found.get().keys().mkString(",").split(","))


async def test_format_magnetar_needs_no_registration_and_a_write_creates_its_topic(
    spark: SparkSession, node: StandaloneNode, tmp_path: Path
) -> None:
    # a new session has no registrations of its own (the shared one has none either: conftest
    # does not register), so only what Spark's workers found can resolve "magnetar"
    fresh = spark.newSession()
    url = node.service_url
    first, second = unique("made"), unique("made-by-tasks")
    rows = [(f"v{i}", f"k{i % 5}") for i in range(200)]
    df = fresh.createDataFrame(rows, "value STRING, key STRING")
    await spark_call(
        lambda: (
            df.write.format("magnetar")
            .option("serviceUrl", url)
            .option("topic", first)
            .mode("append")
            .save()
        ),
        fresh,
    )
    assert "magnetar" in spark_found_by_itself(fresh)
    # created as a producer's lookup creates it: the broker's auto_topic_partitions (0 here)
    async with AdminClient(url) as admin:
        assert await admin.get_partitions(first) == 0
    back = read(fresh, url, topic=first)
    got = await spark_call(lambda: back.select("partition", "key", "value").collect(), fresh)
    assert sorted((r["key"], r["value"]) for r in got) == sorted((k, v.encode()) for v, k in rows)
    assert {r["partition"] for r in got} == {-1}

    # a topic named by a topic column is created by the tasks that meet it
    by_column = fresh.createDataFrame([("x", second), ("y", second)], "value STRING, topic STRING")
    await spark_call(
        lambda: by_column.write.format("magnetar").option("serviceUrl", url).mode("append").save(),
        fresh,
    )
    assert sorted(await read_values(url, second)) == [b"x", b"y"]

    # and a streaming read, in the same fresh session
    name = first.replace("-", "_")
    query = (
        fresh.readStream.format("magnetar")
        .option("serviceUrl", url)
        .option("topic", first)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    await spark_call(query.awaitTermination, fresh)
    assert await spark_call(lambda: fresh.table(name).count(), fresh) == 200

    # a topic that exists keeps its partitions: the lookup counts them, creates nothing
    partitioned = unique("three")
    async with AdminClient(url) as admin:
        await admin.create_topic(partitioned, partitions=3)
    async with Client(url) as client:
        assert await io.create_as_producer(client, partitioned) == 3


async def test_register_still_works_and_names_the_same_source(
    spark: SparkSession, node: StandaloneNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyspark_magnetar  # noqa: PLC0415 - what Spark imports, here only to compare
    from magnetar import spark as magnetar_spark  # noqa: PLC0415
    from magnetar.spark.source import MagnetarDataSource  # noqa: PLC0415

    # one source, whichever way it was registered
    assert pyspark_magnetar.DefaultSource is MagnetarDataSource
    assert MagnetarDataSource.name() == "magnetar"
    url = node.service_url
    topic = unique("legacy")
    await produce(url, topic, 30, partitions=2)

    # where Spark registered it: register() sees the name resolves and leaves it, however often
    legacy = spark.newSession()
    assert magnetar_spark._resolves(legacy, "magnetar")
    assert not magnetar_spark._resolves(legacy, "no-such-source")
    magnetar_spark.register(legacy)
    magnetar_spark.register(legacy)
    assert await spark_call(read(legacy, url, topic=topic).count, legacy) == 30

    # where Spark's workers did not find it (an older setup): register() registers it
    monkeypatch.setattr(magnetar_spark, "_resolves", lambda *_: False)
    older = spark.newSession()
    magnetar_spark.register(older)
    assert await spark_call(read(older, url, topic=topic).count, older) == 30


async def test_a_connector_that_cannot_load_leaves_other_sources_alone() -> None:
    # Spark imports every pyspark_* module in one pass: one that raised would hide them all
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"  # as if installed without the extra
        "import pyspark_magnetar\n"
        "source = pyspark_magnetar.DefaultSource\n"
        "print(source.name())\n"
        "source({})\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        cwd=HERE.parent.parent,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 1
    assert out.decode().split() == ["magnetar"]
    assert "the magnetar data source cannot load" in err.decode()
    assert "pip install 'magnetar[spark]'" in err.decode()


@pytest.mark.etcd
async def test_a_write_to_a_missing_topic_fails_clearly_where_brokers_create_none(
    spark: SparkSession, tmp_path: Path
) -> None:
    args = ["--allow-auto-topic-creation", "false"]
    async with LocalCluster(
        tmp_path / "cluster", bookies=1, brokers=1, broker_args=args
    ) as cluster:
        url = cluster.service_url
        topic = unique("absent")
        full = f"public/default/{topic}"
        df = spark.createDataFrame([("a",), ("b",)], "value STRING")
        with pytest.raises(Exception, match="allow_auto_topic_creation is off") as failure:
            await spark_call(
                lambda: (
                    df.write.format("magnetar")
                    .option("serviceUrl", url)
                    .option("topic", topic)
                    .mode("append")
                    .save()
                )
            )
        message = str(failure.value)
        assert f"topic {full} does not exist" in message
        assert f"magnetar topics create {full} --partitions N" in message
        # a topic of a topic column: the task says the same
        options = parse_write_options({"serviceUrl": url})
        with pytest.raises(TopicNotFoundError, match=f"topic {full} does not exist, and the"):
            await asyncio.to_thread(
                io.write_rows,
                iter([{"value": b"a", "topic": topic}]),
                options,
                producer_name="absent-test",
                sequence_base=0,
                spark_partition=0,
            )
        async with AdminClient(url) as admin:
            with pytest.raises(TopicNotFoundError):
                await admin.get_partitions(topic)


# --- retention --------------------------------------------------------------------------------


@pytest.mark.etcd
async def test_data_the_checkpoint_needed_is_gone_fail_or_skip(
    spark: SparkSession, tmp_path: Path
) -> None:
    # small ledgers and quick trimming: a standalone's broker settings are fixed, so a cluster
    args = [
        *("--managed-ledger-max-entries-per-ledger", "5"),
        *("--managed-ledger-min-ledger-age-ms", "0"),
        *("--managed-ledger-trim-interval-ms", "200"),
    ]
    async with LocalCluster(
        tmp_path / "cluster", bookies=3, brokers=1, broker_args=args
    ) as cluster:
        url = cluster.service_url
        topic = unique("trimmed")
        async with Client(url) as client:
            async with AdminClient(url) as admin:
                await admin.create_topic(topic)
                # held by a subscription until the query has read the first 20
                await admin.create_subscription(topic, "hold", "earliest")
            producer = await client.create_producer(topic, batching_max_messages=1)
            for i in range(20):
                await producer.send(f"a{i}".encode())
            checkpoint, out = str(tmp_path / "checkpoint"), str(tmp_path / "out")

            def run_once(fail: str) -> Any:
                query = (
                    spark.readStream.format("magnetar")
                    .option("serviceUrl", url)
                    .option("topic", topic)
                    .option("startingOffsets", "earliest")
                    .option("failOnDataLoss", fail)
                    .load()
                    .select("offset", "value")
                    .writeStream.format("parquet")
                    .option("path", out)
                    .option("checkpointLocation", checkpoint)
                    .trigger(availableNow=True)
                    .start()
                )
                query.awaitTermination()
                return query

            def written() -> list[int]:
                return sorted(r["offset"] for r in spark.read.parquet(out).collect())

            await spark_call(lambda: run_once("true"))
            assert await spark_call(written) == list(range(20))
            # the query is stopped; more are written and, once no subscription holds them,
            # every ledger but the last is trimmed, including messages the checkpoint has not read
            for i in range(30):
                await producer.send(f"b{i}".encode())
            async with AdminClient(url) as admin:
                await admin.delete_subscription(topic, "hold")
            # 3 more start a new ledger: every full one before it (offsets 0..49) is trimmed,
            # and the trimming is over once the earliest offset is 50 (a fixed point to test
            # against, where waiting for "past 20" raced with the trimming still going on)
            for i in range(3):
                await producer.send(f"c{i}".encode())
            await producer.close()
            options = _read_options(url, topic)

            async def trimmed() -> bool:
                return (await asyncio.to_thread(io.discover, options))[0].earliest >= 50

            await eventually(trimmed, timeout_s=30, interval_s=0.2)
        with pytest.raises(Exception, match="failOnDataLoss"):
            await spark_call(lambda: run_once("true"))
        await spark_call(lambda: run_once("false"))
        expected = [*range(20), 50, 51, 52]
        assert await spark_call(written) == expected, "skipped what was gone, read the rest"


# --- the example --------------------------------------------------------------------------------


async def test_the_example_pipeline_writes_the_same_totals_to_the_topic_and_to_parquet(
    spark: SparkSession, node: StandaloneNode, tmp_path: Path
) -> None:
    path = HERE.parent.parent / "examples" / "spark_pipeline" / "pipeline.py"
    spec = importlib.util.spec_from_file_location("spark_pipeline_example", path)
    assert spec is not None
    assert spec.loader is not None
    pipeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pipeline)
    url = node.service_url
    await pipeline.produce(url, 3_000, 7)
    await spark_call(lambda: pipeline.run(spark, url, tmp_path / "out"))

    def results() -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
        parquet = {
            (str(r["window_start"]), r["user"], r["events"], r["amount"])
            for r in spark.read.parquet(str(tmp_path / "out" / "totals")).collect()
        }
        messages = read(spark, url, topic=pipeline.TOTALS).selectExpr(
            "key",
            "from_json(CAST(value AS STRING), 'window_start TIMESTAMP, user STRING,"
            " events BIGINT, amount DOUBLE') AS t",
        )
        topic = {
            (str(r["t"]["window_start"]), r["t"]["user"], r["t"]["events"], r["t"]["amount"])
            for r in messages.collect()
        }
        return parquet, topic

    parquet, topic = await spark_call(results)
    assert parquet == topic
    assert len(parquet) >= 100  # closed one-minute windows of 20 users (the last stay open)
    assert sum(events for _, _, events, _ in parquet) <= 3_000
