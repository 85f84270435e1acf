"""Rows per second from Magnetar into Spark (local[2]), next to Parquet in the same run.

    .venv/bin/python bench/spark_bench.py                    # 1,000,000 messages, ~3 minutes
    .venv/bin/python bench/spark_bench.py --messages 200000  # quicker

Starts a ``magnetar standalone`` of its own and produces ``--messages`` 100 B messages (keys,
no properties) to a 4-partition topic. Then, on one SparkSession (``local[2]``), each workload
runs ``--repeats`` times and the best and median are kept:

- **batch, Magnetar:** ``spark.read.format("magnetar")`` of every message, all columns,
  into the ``noop`` sink (everything is materialized, nothing is written);
- **batch, Parquet:** the same rows, written once to Parquet before the timing, read the same
  way;
- **streaming, Magnetar:** ``readStream`` with ``Trigger.AvailableNow`` and
  ``maxRecordsPerTrigger`` = a quarter of the messages, into ``noop``, from a fresh checkpoint;
- **streaming, Parquet:** ``readStream.parquet`` of the same files, ``maxFilesPerTrigger`` 1,
  ``Trigger.AvailableNow``, into ``noop``.

Writes ``bench/results/spark-<date>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession

from magnetar.aio import Client
from magnetar.aio.admin import AdminClient
from magnetar.spark import register
from magnetar.testing import StandaloneNode

TOPIC = "spark-bench"
PARTITIONS = 4


async def produce(url: str, count: int) -> float:
    async with AdminClient(url) as admin:
        await admin.create_topic(TOPIC, partitions=PARTITIONS)
    started = time.perf_counter()
    async with Client(url) as client:
        producer = await client.create_producer(TOPIC)
        payload = b"x" * 100
        for first in range(0, count, 5_000):
            await asyncio.gather(
                *(
                    producer.send_async(payload, partition_key=f"k{i % 1000}")
                    for i in range(first, min(first + 5_000, count))
                )
            )
        await producer.close()
    return time.perf_counter() - started


def timed(run: Any, repeats: int) -> dict[str, float]:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return {"best_s": min(seconds), "median_s": statistics.median(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "messages": args.messages,
        "partitions": PARTITIONS,
        "message_bytes": 100,
        "master": "local[2]",
        "workloads": {},
    }

    async def run() -> None:
        async with StandaloneNode(root / "magnetar") as node:
            url = node.service_url
            results["produce_s"] = await produce(url, args.messages)
            await asyncio.to_thread(measure, url)

    def measure(url: str) -> None:
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("magnetar-spark-bench")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)  # type: ignore[union-attr]
        results["pyspark"] = spark.version
        register(spark)
        source = spark.read.format("magnetar").option("serviceUrl", url).option("topic", TOPIC)
        parquet = str(root / "parquet")
        source.load().write.parquet(parquet)
        schema = spark.read.parquet(parquet).schema
        n = args.messages
        per_trigger = str(max(1, n // 4))
        workloads = {
            "batch, Magnetar": lambda: source.load().write.format("noop").mode("overwrite").save(),
            "batch, Parquet": lambda: (
                spark.read.parquet(parquet).write.format("noop").mode("overwrite").save()
            ),
        }

        def stream_magnetar() -> None:
            checkpoint = tempfile.mkdtemp(dir=root)
            query = (
                spark.readStream.format("magnetar")
                .option("serviceUrl", url)
                .option("topic", TOPIC)
                .option("startingOffsets", "earliest")
                .option("maxRecordsPerTrigger", per_trigger)
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            rows = sum(p["numInputRows"] for p in query.recentProgress)
            assert rows == n, f"the stream read {rows} rows of {n}"

        def stream_parquet() -> None:
            checkpoint = tempfile.mkdtemp(dir=root)
            query = (
                spark.readStream.schema(schema)
                .option("maxFilesPerTrigger", 1)
                .parquet(parquet)
                .writeStream.format("noop")
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()

        workloads["streaming, Magnetar"] = stream_magnetar
        workloads["streaming, Parquet"] = stream_parquet
        assert source.load().count() == n
        for name, workload in workloads.items():
            figures = timed(workload, args.repeats)
            figures["rows_per_s_best"] = n / figures["best_s"]
            figures["rows_per_s_median"] = n / figures["median_s"]
            results["workloads"][name] = figures
            print(
                f"{name}: {figures['rows_per_s_best']:,.0f} rows/s best,"
                f" {figures['rows_per_s_median']:,.0f} median",
                flush=True,
            )
        spark.stop()

    try:
        asyncio.run(run())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"spark-{results['date']}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        f"# Spark: Magnetar vs Parquet, {results['date']}",
        "",
        (
            f"`{' '.join(['.venv/bin/python', 'bench/spark_bench.py', *sys.argv[1:]])}`: a fresh"
            f" `magnetar standalone`, {n_fmt(args.messages)} messages of 100 B over"
            f" {PARTITIONS} partitions (produced in {results['produce_s']:.1f} s), PySpark"
            f" {results.get('pyspark')} on `local[2]`, {os.cpu_count()} CPUs. Every workload reads"
            " all rows and all columns into the `noop` sink; best and median of"
            f" {args.repeats} runs. The Parquet files hold the same rows, written from Magnetar"
            " before the timing."
        ),
        "",
        "| workload | rows/s (best) | rows/s (median) | seconds (best) |",
        "|---|---|---|---|",
    ]
    for name, f in results["workloads"].items():
        lines.append(
            f"| {name} | **{f['rows_per_s_best']:,.0f}** | {f['rows_per_s_median']:,.0f}"
            f" | {f['best_s']:.2f} |"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json and .md")


def n_fmt(n: int) -> str:
    return f"{n:,}"


if __name__ == "__main__":
    main()
