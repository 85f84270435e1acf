"""Events -> Spark Structured Streaming -> per-user totals per minute, to Magnetar and Parquet.

One command against a running ``magnetar standalone`` (``bash scripts/standalone.sh``)::

    .venv/bin/python examples/spark_pipeline/pipeline.py --events 20000

It creates the topics ``events`` (4 partitions) and ``user-totals``, produces ``--events`` JSON
events (``{"user": ..., "amount": ...}``, with event times spread over ten minutes), then runs
two streaming queries on ``local[2]`` with ``Trigger.AvailableNow`` (so it ends when it has read
everything; drop ``--available-now`` to keep it running):

- per user and 1-minute event-time window: count and sum of amounts, written as JSON messages
  keyed by user to ``user-totals``;
- the same aggregates written to Parquet under ``--out``.

Both queries keep their offsets in their own checkpoint under ``--out``: run it again and it goes
on from where it stopped (new events only). docs/spark.md explains each step and how to run the
same job on a real Spark cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from magnetar.aio import Client
from magnetar.aio.admin import AdminClient
from magnetar.common.errors import TopicAlreadyExistsError
from magnetar.spark import register

EVENTS, TOTALS = "events", "user-totals"
USERS = [f"user-{i:02d}" for i in range(20)]
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: fixed, so runs are comparable


async def produce(service_url: str, count: int, seed: int) -> None:
    """``count`` events over ten minutes of event time, keyed by user."""
    rng = random.Random(seed)
    async with Client(service_url) as client:
        async with AdminClient(service_url) as admin:
            for topic, partitions in ((EVENTS, 4), (TOTALS, 2)):
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topic(topic, partitions=partitions)
        producer = await client.create_producer(EVENTS)
        sends = []
        for i in range(count):
            user = rng.choice(USERS)
            event = {"user": user, "amount": round(rng.uniform(1, 100), 2), "seq": i}
            sends.append(
                producer.send_async(
                    json.dumps(event).encode(),
                    partition_key=user,
                    event_timestamp=START_MS + rng.randrange(600_000),
                )
            )
            if len(sends) == 5_000:  # within the producer's max_pending_messages
                await asyncio.gather(*sends)
                sends.clear()
        await asyncio.gather(*sends)
        await producer.close()


def totals(spark: SparkSession, service_url: str) -> DataFrame:
    events = (
        spark.readStream.format("magnetar")
        .option("serviceUrl", service_url)
        .option("topic", EVENTS)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "50000")
        .option("valueFormat", "json")
        .option("valueSchema", "user STRING, amount DOUBLE, seq LONG")
        .load()
    )
    return (
        events.withWatermark("event_time", "1 minute")
        .groupBy(F.window("event_time", "1 minute"), F.col("value.user").alias("user"))
        .agg(F.count("*").alias("events"), F.round(F.sum("value.amount"), 2).alias("amount"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "user",
            "events",
            "amount",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-url", default="magnetar://127.0.0.1:6650")
    parser.add_argument("--events", type=int, default=20_000, help="events to produce first")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("/tmp/magnetar-spark-pipeline"))
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="run until stopped (Ctrl-C) instead of Trigger.AvailableNow",
    )
    args = parser.parse_args()
    if args.events:
        asyncio.run(produce(args.service_url, args.events, args.seed))
        print(f"produced {args.events:,} events to {EVENTS}", flush=True)

    spark = (
        SparkSession.builder.master(args.master)
        .appName("magnetar-pipeline")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    run(spark, args.service_url, args.out, keep_running=args.keep_running)
    written = spark.read.parquet(str(args.out / "totals"))
    print(f"windows closed so far: {written.count():,} (Parquet under {args.out / 'totals'})")
    written.orderBy("window_start", "user").show(5, truncate=False)
    results = (
        spark.read.format("magnetar")
        .option("serviceUrl", args.service_url)
        .option("topic", TOTALS)
        .load()
    )
    print(f"messages in {TOTALS}: {results.count():,}")
    spark.stop()


def run(spark: SparkSession, service_url: str, out: Path, *, keep_running: bool = False) -> None:
    """The two streaming queries: to the ``user-totals`` topic and to Parquet under ``out``."""
    aggregated = totals(spark, service_url)
    as_messages = aggregated.select(
        F.col("user").alias("key"),
        F.to_json(F.struct("window_start", "window_end", "user", "events", "amount")).alias(
            "value"
        ),
    )
    to_topic = (
        as_messages.writeStream.format("magnetar")
        .option("serviceUrl", service_url)
        .option("topic", TOTALS)
        .option("checkpointLocation", str(out / "checkpoints" / "topic"))
        .outputMode("append")
    )
    to_parquet = (
        aggregated.writeStream.format("parquet")
        .option("path", str(out / "totals"))
        .option("checkpointLocation", str(out / "checkpoints" / "parquet"))
        .outputMode("append")
    )
    if keep_running:
        to_topic.start()
        to_parquet.start()
        spark.streams.awaitAnyTermination()
        return
    queries = [
        to_topic.trigger(availableNow=True).start(),
        to_parquet.trigger(availableNow=True).start(),
    ]
    for query in queries:
        query.awaitTermination()


if __name__ == "__main__":
    main()
