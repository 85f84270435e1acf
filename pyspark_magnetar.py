"""Where Spark finds the ``magnetar`` data source by itself: no ``register()`` call needed.

PySpark (4.0 and later), the first time a session resolves a data source, starts a Python worker
that imports every top-level module on the Python path whose name starts with ``pyspark_``, and
registers the ``DefaultSource`` each defines (a ``pyspark.sql.datasource.DataSource`` subclass)
under its ``name()``, for every session of that Spark driver. This module is that entry point
for ``format("magnetar")``; its ``DefaultSource`` is :class:`magnetar.spark.source.
MagnetarDataSource` itself, so :func:`magnetar.spark.register` names the very same source.

Spark imports all those modules in one pass, and one that fails to import makes Spark skip every
Python data source, not only this one. So a connector that cannot load (Magnetar installed
without its ``spark`` extra) is replaced by a stand-in that says why when it is used.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

__all__ = ["DefaultSource"]


class MagnetarUnavailable(DataSource):
    """Stands in for the connector when it cannot be imported: ``format("magnetar")`` then fails
    naming what is missing, and the other Python data sources stay usable."""

    reason = ""
    """The import error that stopped the connector from loading."""

    @classmethod
    def name(cls) -> str:
        return "magnetar"

    def __init__(self, options: dict[str, str]) -> None:  # noqa: ARG002 - Spark's signature
        raise ModuleNotFoundError(
            f"the magnetar data source cannot load ({self.reason}): install it with"
            " pip install 'magnetar[spark]' on the driver and on every executor"
        )


def _source() -> type[DataSource]:
    try:
        from magnetar.spark.source import MagnetarDataSource  # noqa: PLC0415
    except ImportError as e:
        MagnetarUnavailable.reason = str(e)
        return MagnetarUnavailable
    return MagnetarDataSource


DefaultSource = _source()
"""What Spark registers as ``magnetar``."""
