"""A Spark driver for the restart test: a streaming query from a Magnetar topic to Parquet.

    python stream_driver.py SERVICE_URL TOPIC OUT CHECKPOINT MODE

MODE ``run`` reads 300 records per micro-batch, one batch a second, until killed, and prints
``batch N rows R`` as batches complete; ``finish`` (Trigger.AvailableNow) reads what is left and
exits. The Parquet sink is exactly-once: its log lives in the checkpoint. It does not register
the ``magnetar`` source: Spark finds it by itself, in this driver's JVM of its own.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession


def main() -> None:
    service_url, topic, out, checkpoint, mode = sys.argv[1:6]
    spark = (
        SparkSession.builder.master("local[2]")
        .appName(f"magnetar-restart-{mode}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    stream = (
        spark.readStream.format("magnetar")
        .option("serviceUrl", service_url)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "300")
        .load()
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
    )

    writer = stream.writeStream.format("parquet").option("path", out)
    writer = writer.option("checkpointLocation", checkpoint)
    if mode == "finish":
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        query = writer.trigger(processingTime="1 second").start()
        last = -1
        while query.isActive:
            progress = query.lastProgress
            if progress is not None and progress["batchId"] != last:
                last = progress["batchId"]
                print(f"batch {last} rows {progress['numInputRows']}", flush=True)
            time.sleep(0.2)
    spark.stop()


if __name__ == "__main__":
    main()
