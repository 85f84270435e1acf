"""Segment files and the group-committing journal that appends to them.

Every write of the bookie (entries, fence and delete records, compaction's copies) goes through
one :class:`Journal`, which commits them in groups, one **thread hop per group commit**:

- it takes everything submitted since its last commit (waiting at most ``max_group_wait_ms``
  for more, or until ``max_group_bytes`` are waiting; by default it does not wait: a group
  forms from what arrives while the previous one is being made durable);
- in one worker thread it appends the group to the head segment with one ``writev`` and makes
  it durable with one ``fdatasync`` (starting a new segment first when the head one is full);
- back on the event loop it completes the submitters' futures, in order.

One hop instead of two (a write hop and a sync hop, overlapped): a hop to a worker thread and
back costs ~0.1-0.2 ms of CPU here, several times the copy into the page cache that overlapping
would hide, and an append that grows the file (which can wait for the file system's own journal
commit) still never runs on the event loop. An add is acknowledged only once the fdatasync after
its write returned; many adds from many ledgers share each one.

Each submission carries an ``on_durable`` callback that is called with the segment and offsets
of its records right after the fdatasync, before anything else runs. The index is updated
there, so a checkpoint, taken through :meth:`Journal.at_boundary` between two commits, never
covers a durable record the index does not know.
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


class _WriteFailed(Exception):  # noqa: N818 - internal: says which step failed
    """The ``writev`` of a group failed (its ``fdatasync`` failing raises the OSError itself)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class Journal:
    """Appends records to the head segment with group commit, one thread hop per group."""

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
        """Where the next group goes in the head segment (the durable end between commits)."""
        self._durable_offset = head.offset
        self._fd = open_private(
            segments.path(head.segment_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND
        )
        self._queue: deque[_Submission | _Boundary] = deque()
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._full = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._failure: StorageError | None = None
        self._on_batch = on_batch
        self.stats = JournalStats()

    @property
    def position(self) -> LogPosition:
        """The durable end of the log."""
        return LogPosition(self._head_segment, self._durable_offset)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="bookie-journal")

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

    # --- committing ----------------------------------------------------------------------------

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
                # every earlier group is durable: one commit at a time, each awaited
                self._queue.popleft()
                self._run_boundary(head)
                continue
            if wait_s > 0 and self._queued_bytes < self.config.max_group_bytes and not self._closed:
                # give others a moment to join this group
                self._full.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), wait_s)
            await self._commit(self._take_batch())

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

    async def _commit(self, batch: list[_Submission]) -> None:
        """Write and sync one group in one thread hop, then complete its submissions."""
        if self._failure is not None:
            self._fail(batch, self._failure)
            return
        size = sum(s.size for s in batch)
        roll = (
            self._written_offset > 0 and self._written_offset + size > self.config.max_segment_bytes
        )
        chunks = [chunk for s in batch for frame in s.frames for chunk in frame]
        try:
            segment_id, offset, sync_seconds = await asyncio.to_thread(
                self._write_and_sync, chunks, size, roll
            )
        except _WriteFailed as e:
            self._handle_write_error(batch, e.error)
            return
        except OSError as e:
            # after a failed fdatasync nothing written since the last good one can be
            # trusted: stop taking writes for good
            self._failure = StorageError(
                f"fdatasync failed ({e}); this bookie takes no more writes",
                context={"errno": e.errno or 0},
            )
            log.exception("journal_sync_failed", error=str(e))
            self._fail(batch, self._failure)
            return
        self.stats.fdatasync_seconds.append(sync_seconds)
        self.stats.group_sizes.append(size)
        self.stats.groups += 1
        self.stats.bytes += size
        self._complete(batch, segment_id, offset, size)
        if self._on_batch is not None:
            self._on_batch(size)

    def _write_and_sync(self, chunks: list[bytes], size: int, roll: bool) -> tuple[int, int, float]:
        """In the worker thread: (start a new segment,) append, fdatasync. Returns the segment
        and offset the group went to, and how long the fdatasync took. Nothing else touches the
        file meanwhile: the event loop awaits this before the next group."""
        try:
            if roll:
                # the old segment is durable (every group was synced before the next began)
                new_id = self._head_segment + 1
                new_fd = open_private(
                    self.segments.path(new_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND
                )
                fsync_dir(self.segments.directory)
                os.close(self._fd)
                self._fd, self._head_segment = new_fd, new_id
                self._written_offset = self._durable_offset = 0
                log.info("segment_rolled", segment=new_id)
            offset = self._written_offset
            _writev_all(self._fd, chunks, size)
        except OSError as e:
            raise _WriteFailed(e) from e
        self._written_offset = offset + size
        started = time.perf_counter()
        os.fdatasync(self._fd)
        return self._head_segment, offset, time.perf_counter() - started

    def _complete(self, batch: list[_Submission], segment_id: int, offset: int, size: int) -> None:
        self._durable_offset = offset + size
        for submission in batch:
            offsets = []
            for frame in submission.frames:
                offsets.append(offset)
                offset += frame_size(frame)
            self.stats.records += len(offsets)
            if submission.on_durable is not None:
                submission.on_durable(segment_id, offsets)
            if not submission.future.done():
                submission.future.set_result(None)

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
        for item in self._queue:
            if not item.future.done():
                item.future.set_exception(StorageClosedError("the storage engine was closed"))
        self._queue.clear()
        with contextlib.suppress(OSError):
            os.close(self._fd)
