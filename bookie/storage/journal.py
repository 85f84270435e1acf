"""Segment files and the group-committing journal that appends to them.

Every write of the bookie (entries, fence and delete records, compaction's copies) goes through
one :class:`Journal`, as a two-stage pipeline in the spirit of BookKeeper's journal and
force-write threads:

- the **write stage** takes everything submitted since its last write (waiting at most
  ``max_group_wait_ms`` for more, or until ``max_group_bytes`` are waiting) and appends it to
  the head segment with one ``writev`` in a worker thread;
- the **sync stage** takes every group written since its last ``fdatasync``, makes them durable
  with one ``fdatasync`` in another worker thread, and only then completes their submitters'
  futures, in order.

The two overlap: while group N is being fdatasync'd, group N+1 is being copied into the file, so
the disk and the CPU both stay busy. An add is acknowledged only once an fdatasync that started
after its write returned; many adds from many ledgers share each one.

Each submission carries an ``on_durable`` callback that the sync stage calls with the segment and
offsets of its records right after the fdatasync, before anything else runs. The index is updated
there, so a checkpoint, taken through :meth:`Journal.at_boundary` once the pipeline is drained,
never covers a durable record the index does not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import structlog

from bookie.storage.config import StorageConfig
from bookie.storage.index import LogPosition
from bookie.storage.records import Frame, frame_size
from magnetar.common.errors import StorageClosedError, StorageError
from magnetar.common.files import open_private

log = structlog.get_logger("magnetar.bookie.journal")

T = TypeVar("T")

SEGMENT_PREFIX = "seg-"
SEGMENT_SUFFIX = ".log"

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024

OnDurable = Callable[[int, list[int]], None]
"""Called with (segment id, offset of each record) once a submission is durable."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _writev_all(fd: int, chunks: list[bytes], size: int) -> None:
    """Write every chunk, in order, without joining them first (no copy of the payloads)."""
    remaining = size
    start = 0
    while remaining > 0:
        written = os.writev(fd, chunks[start : start + IOV_MAX])
        remaining -= written
        # skip what was written; a partial write leaves the rest of a chunk to go again
        while start < len(chunks) and written >= len(chunks[start]):
            written -= len(chunks[start])
            start += 1
        if written:
            chunks[start] = chunks[start][written:]


class Segment:
    """A segment file opened for reading; closed once retired and no read is using it."""

    __slots__ = ("fd", "path", "readers", "retired", "segment_id")

    def __init__(self, segment_id: int, path: Path) -> None:
        self.segment_id = segment_id
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.readers = 0
        self.retired = False

    def close_if_unused(self) -> None:
        if self.retired and self.readers == 0 and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Segments:
    """The segment files of one storage directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._open: dict[int, Segment] = {}

    def path(self, segment_id: int) -> Path:
        return self.directory / f"{SEGMENT_PREFIX}{segment_id:010d}{SEGMENT_SUFFIX}"

    def ids(self) -> list[int]:
        found = []
        for path in self.directory.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"):
            digits = path.name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)]
            if digits.isdigit():
                found.append(int(digits))
        return sorted(found)

    def acquire(self, segment_id: int) -> Segment:
        """A readable segment; pair with :meth:`release`."""
        segment = self._open.get(segment_id)
        if segment is None or segment.retired:
            segment = Segment(segment_id, self.path(segment_id))
            self._open[segment_id] = segment
        segment.readers += 1
        return segment

    def release(self, segment: Segment) -> None:
        segment.readers -= 1
        segment.close_if_unused()

    def delete(self, segment_id: int) -> int:
        """Remove a segment file (reads already under way finish on their open descriptor)."""
        path = self.path(segment_id)
        size = path.stat().st_size if path.exists() else 0
        segment = self._open.pop(segment_id, None)
        if segment is not None:
            segment.retired = True
            segment.close_if_unused()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return size

    def close(self) -> None:
        for segment in self._open.values():
            segment.retired = True
            segment.readers = 0
            segment.close_if_unused()
        self._open.clear()


@dataclass(slots=True)
class _Submission:
    frames: Sequence[Frame]
    size: int
    on_durable: OnDurable | None
    future: asyncio.Future[None]


@dataclass(slots=True)
class _Boundary:
    action: Callable[[], Any]
    future: asyncio.Future[Any]


@dataclass(slots=True)
class JournalStats:
    """Counters the bookie exports as metrics."""

    groups: int = 0
    records: int = 0
    bytes: int = 0
    fdatasync_seconds: list[float] = field(default_factory=list)
    group_sizes: list[int] = field(default_factory=list)

    def drain(self) -> tuple[list[float], list[int]]:
        """Latencies and group sizes since the last drain (metrics pull them)."""
        latencies, sizes = self.fdatasync_seconds, self.group_sizes
        self.fdatasync_seconds, self.group_sizes = [], []
        return latencies, sizes


@dataclass(slots=True)
class _Written:
    """A group written to the file and waiting for its fdatasync."""

    batch: list[_Submission]
    segment_id: int
    offset: int
    size: int


INLINE_WRITE_MAX_BYTES = 64 * 1024
"""Groups up to this size are written on the event loop when no ``fdatasync`` is running:
copying them into the page cache takes microseconds, where a hop to a worker thread and back
costs ~0.2 ms here (an idle bookie then makes one hop per add instead of two). Larger groups, a
group that starts a new segment, and any group written while an ``fdatasync`` runs go to a
worker thread: an append that grows the file can wait there for the file system's own journal
commit (ext4), and that wait must not stop the event loop."""

MAX_UNSYNCED_GROUPS = 4
"""How far the write stage may run ahead of the sync stage."""


class Journal:
    """Appends records to the head segment with group commit, writing and syncing in parallel."""

    def __init__(
        self,
        segments: Segments,
        config: StorageConfig,
        head: LogPosition,
        *,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self.segments = segments
        self.config = config
        self._head_segment = head.segment_id
        self._written_offset = head.offset
        self._durable_offset = head.offset
        self._fd = open_private(
            segments.path(head.segment_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND
        )
        self._queue: deque[_Submission | _Boundary] = deque()
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._full = asyncio.Event()
        self._unsynced: deque[_Written] = deque()
        self._sync_wakeup = asyncio.Event()
        self._synced = asyncio.Event()
        self._sync_idle = asyncio.Event()
        self._sync_idle.set()
        self._task: asyncio.Task[None] | None = None
        self._sync_task: asyncio.Task[None] | None = None
        self._closed = False
        self._failure: StorageError | None = None
        self._on_batch = on_batch
        self.stats = JournalStats()

    @property
    def position(self) -> LogPosition:
        """The durable end of the log."""
        return LogPosition(self._head_segment, self._durable_offset)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="bookie-journal-write")
        self._sync_task = asyncio.create_task(self._sync(), name="bookie-journal-sync")

    # --- submitting ------------------------------------------------------------------------

    def submit(
        self, frames: Sequence[Frame], on_durable: OnDurable | None = None
    ) -> asyncio.Future[None]:
        """Queue records; the future completes once they are durable (or fails)."""
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise StorageClosedError("the storage engine is closed")
        size = sum(frame_size(f) for f in frames)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Submission(frames, size, on_durable, future))
        self._queued_bytes += size
        self._wakeup.set()
        if self._queued_bytes >= self.config.max_group_bytes:
            self._full.set()
        return future

    async def at_boundary(self, action: Callable[[], T]) -> T:
        """Run ``action`` between two groups, once every earlier record is durable."""
        if self._closed:
            raise StorageClosedError("the storage engine is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append(_Boundary(action, future))
        self._wakeup.set()
        return await future

    # --- the write stage ------------------------------------------------------------------------

    async def _run(self) -> None:
        wait_s = self.config.max_group_wait_ms / 1000
        while True:
            if not self._queue:
                if self._closed:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            head = self._queue[0]
            if isinstance(head, _Boundary):
                self._queue.popleft()
                await self._drain()
                self._run_boundary(head)
                continue
            if wait_s > 0 and self._queued_bytes < self.config.max_group_bytes and not self._closed:
                # give others a moment to join this group
                self._full.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), wait_s)
            while len(self._unsynced) >= MAX_UNSYNCED_GROUPS:
                self._synced.clear()
                await self._synced.wait()
            batch = self._take_batch()
            await self._write(batch)

    def _failed(self) -> StorageError | None:
        return self._failure

    async def _drain(self) -> None:
        """Wait until every written group is durable."""
        while not (self._sync_idle.is_set() and not self._unsynced):
            await self._sync_idle.wait()
            await asyncio.sleep(0)

    def _run_boundary(self, boundary: _Boundary) -> None:
        try:
            result = boundary.action()
        except Exception as e:  # noqa: BLE001 - the caller gets its own error back
            if not boundary.future.done():
                boundary.future.set_exception(e)
            return
        if not boundary.future.done():
            boundary.future.set_result(result)

    def _take_batch(self) -> list[_Submission]:
        batch: list[_Submission] = []
        size = 0
        while self._queue and isinstance(self._queue[0], _Submission):
            submission = self._queue[0]
            if batch and size + submission.size > self.config.max_group_bytes:
                break
            self._queue.popleft()
            batch.append(submission)
            size += submission.size
        self._queued_bytes -= size
        return batch

    async def _write(self, batch: list[_Submission]) -> None:
        size = sum(s.size for s in batch)
        if self._failure is not None:
            self._fail(batch, self._failure)
            return
        roll = (
            self._written_offset > 0 and self._written_offset + size > self.config.max_segment_bytes
        )
        if roll:
            # the old segment must be durable (and its fd done with) before the next one starts
            await self._drain()
            failure = self._failed()
            if failure is not None:
                self._fail(batch, failure)
                return
        chunks = [chunk for s in batch for frame in s.frames for chunk in frame]
        try:
            if roll or size > INLINE_WRITE_MAX_BYTES or not self._sync_idle.is_set():
                await asyncio.to_thread(self._write_chunks, chunks, size, roll)
            else:
                # small, and no fdatasync running: copied into the page cache at once
                _writev_all(self._fd, chunks, size)
        except OSError as e:
            self._handle_write_error(batch, e)
            return
        written = _Written(batch, self._head_segment, self._written_offset, size)
        self._written_offset += size
        self._unsynced.append(written)
        self._sync_idle.clear()
        self._sync_wakeup.set()

    def _write_chunks(self, chunks: list[bytes], size: int, roll: bool) -> None:
        if roll:
            new_id = self._head_segment + 1
            new_fd = open_private(
                self.segments.path(new_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND
            )
            fsync_dir(self.segments.directory)
            os.close(self._fd)
            self._fd, self._head_segment = new_fd, new_id
            self._written_offset = self._durable_offset = 0
            log.info("segment_rolled", segment=new_id)
        _writev_all(self._fd, chunks, size)

    # --- the sync stage -------------------------------------------------------------------------

    async def _sync(self) -> None:
        while True:
            if not self._unsynced:
                self._sync_idle.set()
                if self._closed and (self._task is None or self._task.done()):
                    return
                self._sync_wakeup.clear()
                await self._sync_wakeup.wait()
                continue
            group = list(self._unsynced)
            self._unsynced.clear()
            started = time.perf_counter()
            try:
                await asyncio.to_thread(os.fdatasync, self._fd)
            except OSError as e:
                # after a failed fdatasync nothing written since the last good one can be
                # trusted: stop taking writes for good
                self._failure = StorageError(
                    f"fdatasync failed ({e}); this bookie takes no more writes",
                    context={"errno": e.errno or 0},
                )
                log.exception("journal_sync_failed", error=str(e))
                for written in group:
                    self._fail(written.batch, self._failure)
                self._synced.set()
                continue
            size = sum(w.size for w in group)
            self.stats.fdatasync_seconds.append(time.perf_counter() - started)
            self.stats.group_sizes.append(size)
            self.stats.groups += 1
            self.stats.bytes += size
            for written in group:
                self._complete(written)
            self._synced.set()
            if self._on_batch is not None:
                self._on_batch(size)

    def _complete(self, written: _Written) -> None:
        offset = written.offset
        for submission in written.batch:
            offsets = []
            for frame in submission.frames:
                offsets.append(offset)
                offset += frame_size(frame)
            self.stats.records += len(offsets)
            if submission.on_durable is not None:
                submission.on_durable(written.segment_id, offsets)
            if not submission.future.done():
                submission.future.set_result(None)
        self._durable_offset = written.offset + written.size

    def _handle_write_error(self, batch: list[_Submission], error: OSError) -> None:
        # Cut whatever part of the group reached the file, so the log stays a clean sequence of
        # frames; if even that fails the journal cannot go on safely.
        try:
            os.ftruncate(self._fd, self._written_offset)
            os.fsync(self._fd)
        except OSError as cut_error:
            self._failure = StorageError(
                f"the journal could not write ({error}) nor cut the partial write ({cut_error});"
                " this bookie takes no more writes",
                context={"errno": error.errno or 0},
            )
            log.exception("journal_failed", error=str(error), cut_error=str(cut_error))
            self._fail(batch, self._failure)
            return
        reason = "the disk is full" if error.errno == errno.ENOSPC else str(error)
        log.error("journal_write_failed", error=str(error), records=len(batch))
        self._fail(
            batch,
            StorageError(f"the journal could not write: {reason}", context={"errno": error.errno}),
        )

    @staticmethod
    def _fail(batch: list[_Submission], error: StorageError) -> None:
        for submission in batch:
            if not submission.future.done():
                submission.future.set_exception(error)

    # --- closing -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Write and sync what was submitted, then stop."""
        self._closed = True
        self._wakeup.set()
        self._full.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sync_wakeup.set()
        if self._sync_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._sync_task
        for item in self._queue:
            if not item.future.done():
                item.future.set_exception(StorageClosedError("the storage engine was closed"))
        self._queue.clear()
        with contextlib.suppress(OSError):
            os.close(self._fd)
