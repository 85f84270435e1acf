"""Owner-only data on disk: directories 0700, files 0600.

Message payloads (a bookie's segments), the index, the metadata log and snapshots, identity and
key files are readable by the process's own user only, whatever the umask. Servers also set a
umask of 077 at start (:func:`restrict_umask`), so that anything else they create follows; the
helpers here make the data layers owner-only even when they run inside another program (a test,
an embedding application). An existing directory found more open is tightened, and said so.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import structlog

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "open_private",
    "private_dir",
    "restrict_umask",
    "write_private",
]

log = structlog.get_logger("magnetar.files")

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def restrict_umask() -> None:
    """Files and directories this process creates from now on are its user's only."""
    os.umask(0o077)


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) owner-only; tighten it if it exists more open."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, PRIVATE_DIR_MODE)
        log.warning(
            "data_directory_tightened", path=str(path), was=oct(mode), now=oct(PRIVATE_DIR_MODE)
        )
    return path


def open_private(path: Path, flags: int) -> int:
    """``os.open`` that creates the file owner-only (an existing file keeps its mode)."""
    return os.open(path, flags, PRIVATE_FILE_MODE)


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new owner-only file at ``path``, durably (fsync)."""
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())
