"""Magnetar topics as Spark DataFrames: batch and streaming reads and writes, in pure Python.

Install with ``pip install magnetar[spark]`` (PySpark >= 4.2) and the source is there, with no
set-up: Spark finds it by itself (through the top-level module ``pyspark_magnetar``)::

    df = spark.read.format("magnetar").option("serviceUrl", url).option("topic", "t").load()

:func:`register` is for setups where Spark's Python workers cannot see the installed package.
docs/spark.md lists every option and the guarantees.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Make ``format("magnetar")`` known to ``spark`` (a ``SparkSession``), unless it is already.

    Not needed where Magnetar is installed in the Python Spark runs (Spark registers the source
    by itself); harmless there, and when called again: the name already resolves to this very
    source, so nothing is replaced.
    """
    from magnetar.spark.source import MagnetarDataSource  # noqa: PLC0415 - PySpark only on use

    if not _resolves(spark, MagnetarDataSource.name()):
        spark.dataSource.register(MagnetarDataSource)


def _resolves(spark: Any, name: str) -> bool:
    """Whether ``name`` already names a Python data source in ``spark``, registered by Spark
    itself or by an earlier call; False when the session cannot say (Spark Connect)."""
    try:
        from py4j.protocol import Py4JError  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError:  # a Spark Connect client: no JVM session to ask
        return False
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        return bool(manager.dataSourceExists(name))
    except (AttributeError, Py4JError):
        return False
