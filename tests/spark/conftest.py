"""One SparkSession for every Spark test module (it takes about 10 s to start).

Nothing here registers the ``magnetar`` data source: Spark registers it by itself (from the
top-level module ``pyspark_magnetar``), and every test that uses ``format("magnetar")`` relies on
that, as a user's session does.
"""

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

    session = (
        SparkSession.builder.master("local[2,4]")  # 2 threads; a task may fail 3 times
        .appName("magnetar-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
