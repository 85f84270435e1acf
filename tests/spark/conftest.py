"""One SparkSession for every Spark test module (it takes about 10 s to start)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="pip install magnetar[spark]")
    from pyspark.sql import SparkSession  # noqa: PLC0415 - only where Spark is installed

    from magnetar.spark import register  # noqa: PLC0415

    session = (
        SparkSession.builder.master("local[2,4]")  # 2 threads; a task may fail 3 times
        .appName("magnetar-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
