"""Magnetar: a Pulsar-style messaging system in Python.

The client API (``magnetar.Client``, ``magnetar.aio.Client``) lands with the client issue; this
package also holds the CLI (``magnetar.cli``), the shared kernel (``magnetar.common``) and the
public test kit (``magnetar.testing``).
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("magnetar")
except _metadata.PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
