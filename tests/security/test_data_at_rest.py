"""Data at rest is its owner's only: message payloads, index, identity, metadata log."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import magnetar.aio
from bookie.storage.config import StorageConfig
from bookie.storage.engine import StorageEngine
from magnetar.common.files import private_dir
from magnetar.testing import StandaloneNode
from metadata import open_store

pytestmark = pytest.mark.timeout(120)


def modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (itself included) -> its permission bits."""
    found = {str(root): stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path)] = stat.S_IMODE(path.lstat().st_mode)
    return found


def open_to_others(root: Path) -> dict[str, str]:
    return {path: oct(mode) for path, mode in modes(root).items() if mode & 0o077}


async def test_a_standalone_writes_nothing_others_can_read(tmp_path: Path) -> None:
    data = tmp_path / "data"
    previous = os.umask(0o022)  # the usual umask: what was world-readable before
    try:
        async with (
            StandaloneNode(data, bookies=1) as node,
            magnetar.aio.Client(node.service_url) as client,
        ):
            producer = await client.create_producer("at-rest")
            for index in range(50):
                await producer.send(f"payload {index}".encode())
    finally:
        os.umask(previous)
    segments = list(data.rglob("seg-*.log"))
    assert segments, "the bookie wrote message payloads"
    assert list(data.rglob("BOOKIE")), "each bookie wrote its identity file"
    assert list((data / "metadata").iterdir()), "the metadata store wrote its log"
    assert open_to_others(data) == {}


async def test_the_data_layers_are_private_inside_another_program(tmp_path: Path) -> None:
    """Without a server's umask (a test, an embedding application), the storage engine and
    the embedded metadata store still create their files owner-only, and an existing data
    directory that is open to others is tightened."""
    previous = os.umask(0o022)
    try:
        (tmp_path / "opened").mkdir(mode=0o755)
        os.chmod(tmp_path / "opened", 0o755)
        private_dir(tmp_path / "opened")
        engine = await StorageEngine.open(tmp_path / "storage", StorageConfig())
        await engine.close()
        store = await open_store(f"embedded://{tmp_path / 'metadata'}")
        await store.put("/k", b"v")
        await store.close()
    finally:
        os.umask(previous)
    assert open_to_others(tmp_path / "storage") == {}
    assert open_to_others(tmp_path / "metadata") == {}
    assert stat.S_IMODE((tmp_path / "opened").stat().st_mode) == 0o700
