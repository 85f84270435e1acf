"""Magnetar topics as Spark DataFrames: batch and streaming reads and writes, in pure Python.

Install with ``pip install magnetar[spark]`` (PySpark >= 4.2), then::

    from magnetar.spark import register

    register(spark)  # once per SparkSession
    df = spark.read.format("magnetar").option("serviceUrl", url).option("topic", "t").load()

docs/spark.md lists every option and the guarantees.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Make ``format("magnetar")`` known to ``spark`` (a ``SparkSession``)."""
    from magnetar.spark.source import MagnetarDataSource  # noqa: PLC0415 - PySpark only on use

    spark.dataSource.register(MagnetarDataSource)
