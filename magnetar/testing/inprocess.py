"""Servers inside the test's own process: real gRPC servers and real files, sharing one
metadata store (usually ``memory://``). Quicker than :class:`LocalCluster`'s processes, for
component tests that need no SIGKILL."""

from __future__ import annotations

from pathlib import Path

from bookie.process import BookieProcess
from bookie.service.config import BookieConfig
from bookie.storage.config import StorageConfig
from metadata import MetadataStore

__all__ = ["start_bookie_in_process"]


async def start_bookie_in_process(
    store: MetadataStore,
    data_dir: Path,
    bookie_id: str,
    *,
    zone: str | None = None,
    storage: StorageConfig | None = None,
) -> BookieProcess:
    """A bookie on 127.0.0.1 (any free port) registered in ``store``; garbage collection off
    unless ``storage`` says otherwise."""
    config = BookieConfig(
        data_dir=data_dir,
        metadata="memory://",
        port=0,
        http_port=0,
        data_port=0,
        bind_host="127.0.0.1",
        advertised_host="127.0.0.1",
        bookie_id=bookie_id,
        zone=zone,
        storage=storage or StorageConfig(gc_interval_s=0),
    )
    return await BookieProcess.start(config, store=store)
