"""The embedded metadata store: durable, single-process, on local disk; standalone's default.

Layout of its directory::

    LOCK                  flock'd by the one process that has the store open (holds its pid)
    snapshot              the whole state at some revision (written aside, then renamed)
    log-0000000007        write-ahead log: one framed record per committed request

A write is acknowledged only after its record is written and fdatasync'd; concurrent writes
share one write and one fdatasync (the writer task of :mod:`metadata.local` batches them). Every
frame carries its length and a CRC32C. At open, the snapshot is loaded and the logs after it are
replayed. A torn record at the very end of the last log (a crash mid-write) is cut off. Damage
anywhere else is reported as :class:`MetadataCorruptError`, never skipped silently.

Leases do not outlive the process: the store is single-process (the flock), so when it is opened
again every lease of the previous incarnation has lost its holder, and its keys are deleted at
open, in one revision that watchers see like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import google_crc32c
import structlog

from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import MetadataCorruptError, MetadataStoreLockedError
from magnetar.common.files import open_private, private_dir, write_private
from metadata.config import MetadataStoreConfig
from metadata.local import (
    LocalCore,
    LocalMetadataStore,
    LogDelete,
    LogLeaseGrant,
    LogLeaseRevoke,
    LogOp,
    LogPut,
    LogRecord,
    StoredKey,
)
from proto.format.v1 import embedded_store_pb2 as pb

log = structlog.get_logger("magnetar.metadata.embedded")

_FRAME = struct.Struct("<II")  # body length, CRC32C of the body
_MAX_FRAME_BYTES = 1 << 30
_SNAPSHOT = "snapshot"
_LOG_PREFIX = "log-"
_FORMAT_VERSION = 1


def _frame(body: bytes) -> bytes:
    return _FRAME.pack(len(body), google_crc32c.value(body)) + body


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _encode_record(record: LogRecord) -> bytes:
    msg = pb.EmbeddedLogRecord(revision=record.revision)
    for op in record.ops:
        entry = msg.ops.add()
        if isinstance(op, LogPut):
            entry.put.key = op.key
            entry.put.value = op.value
            entry.put.lease_id = op.lease_id
        elif isinstance(op, LogDelete):
            entry.delete.key = op.key
        elif isinstance(op, LogLeaseGrant):
            entry.lease_grant.lease_id = op.lease_id
            entry.lease_grant.ttl_ms = op.ttl_s * 1000
        else:
            entry.lease_revoke.lease_id = op.lease_id
    return msg.SerializeToString()


def _decode_record(body: bytes) -> LogRecord:
    msg = pb.EmbeddedLogRecord.FromString(body)
    ops: list[LogOp] = []
    for entry in msg.ops:
        kind = entry.WhichOneof("op")
        if kind == "put":
            ops.append(LogPut(entry.put.key, entry.put.value, entry.put.lease_id))
        elif kind == "delete":
            ops.append(LogDelete(entry.delete.key))
        elif kind == "lease_grant":
            ttl_s = max(1, entry.lease_grant.ttl_ms // 1000)
            ops.append(LogLeaseGrant(entry.lease_grant.lease_id, ttl_s))
        elif kind == "lease_revoke":
            ops.append(LogLeaseRevoke(entry.lease_revoke.lease_id))
        else:
            raise ValueError(f"log record has an operation of unknown kind {kind!r}")
    return LogRecord(msg.revision, tuple(ops))


def _read_frames(data: bytes) -> tuple[list[bytes], int, str | None]:
    """Split ``data`` into frame bodies: (bodies, offset of the first bad frame, why it is bad)."""
    bodies: list[bytes] = []
    offset = 0
    while offset < len(data):
        if len(data) - offset < _FRAME.size:
            return bodies, offset, "a frame header is cut short"
        length, crc = _FRAME.unpack_from(data, offset)
        start = offset + _FRAME.size
        if length > _MAX_FRAME_BYTES or start + length > len(data):
            return bodies, offset, f"a frame of {length} bytes runs past the end of the file"
        body = data[start : start + length]
        if google_crc32c.value(body) != crc:
            return bodies, offset, "a frame's CRC32C does not match its bytes"
        bodies.append(body)
        offset = start + length
    return bodies, offset, None


def _valid_frame_at(data: bytes, offset: int) -> bool:
    if len(data) - offset < _FRAME.size:
        return False
    length, crc = _FRAME.unpack_from(data, offset)
    start = offset + _FRAME.size
    return start + length <= len(data) and bool(
        google_crc32c.value(data[start : start + length]) == crc
    )


class EmbeddedJournal:
    """The embedded store's files: log append with fdatasync, snapshots, recovery."""

    def __init__(self, directory: Path, config: MetadataStoreConfig) -> None:
        self.directory = directory
        self.config = config
        self._lock_fd: int | None = None
        self._log_fd: int | None = None
        self._log_sequence = 0
        self._log_bytes = 0

    # --- open / close -------------------------------------------------------------------

    def lock(self) -> None:
        private_dir(self.directory)
        lock_path = self.directory / "LOCK"
        fd = open_private(lock_path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_path.read_text().strip() or "unknown"
            os.close(fd)
            raise MetadataStoreLockedError(
                f"the embedded metadata store at {self.directory} is open in another process"
                f" (pid {holder}); only one process may use it",
                context={"path": str(self.directory), "pid": holder},
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def close(self) -> None:
        for fd in (self._log_fd, self._lock_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._log_fd = self._lock_fd = None

    def _log_path(self, sequence: int) -> Path:
        return self.directory / f"{_LOG_PREFIX}{sequence:010d}"

    def _log_sequences(self) -> list[int]:
        found = []
        for path in self.directory.glob(f"{_LOG_PREFIX}*"):
            suffix = path.name[len(_LOG_PREFIX) :]
            if suffix.isdigit():
                found.append(int(suffix))
        return sorted(found)

    # --- recovery ---------------------------------------------------------------------------

    def recover(self, core: LocalCore) -> None:
        """Load the snapshot and replay the logs after it into ``core``; open the log for append.

        Runs before the core's writer starts, so it may touch the core directly.
        """
        first_sequence = 1
        snapshot_path = self.directory / _SNAPSHOT
        if snapshot_path.exists():
            first_sequence = self._load_snapshot(snapshot_path, core)
        with contextlib.suppress(FileNotFoundError):
            (self.directory / f"{_SNAPSHOT}.tmp").unlink()
        sequences = self._log_sequences()
        for stale in [s for s in sequences if s < first_sequence]:
            self._log_path(stale).unlink()
        live = [s for s in sequences if s >= first_sequence]
        replayed = 0
        for index, sequence in enumerate(live):
            replayed += self._replay_log(sequence, core, last=index == len(live) - 1)
        self._log_sequence = live[-1] if live else first_sequence
        path = self._log_path(self._log_sequence)
        self._log_fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self._log_bytes = os.fstat(self._log_fd).st_size
        _fsync_dir(self.directory)
        log.info(
            "embedded_store_recovered",
            path=str(self.directory),
            revision=core.revision,
            keys=len(core.kvs),
            leases=len(core.leases),
            records_replayed=replayed,
        )

    def _load_snapshot(self, path: Path, core: LocalCore) -> int:
        data = path.read_bytes()
        bodies, offset, problem = _read_frames(data)
        if problem is not None or len(bodies) != 1:
            raise MetadataCorruptError(
                f"the embedded metadata snapshot {path} is damaged"
                f" ({problem or 'it does not hold exactly one frame'}, at byte {offset});"
                " snapshots are written aside and renamed, so this is not a torn write",
                context={"path": str(path), "offset": offset},
            )
        snap = pb.EmbeddedSnapshot.FromString(bodies[0])
        kvs = [
            (
                kv.key,
                StoredKey(kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease_id),
            )
            for kv in snap.kvs
        ]
        leases = [(lease.lease_id, max(1, lease.ttl_ms // 1000)) for lease in snap.leases]
        core.load(kvs, leases, snap.revision, snap.last_lease_id)
        return max(1, snap.next_log_sequence)

    def _replay_log(self, sequence: int, core: LocalCore, *, last: bool) -> int:
        path = self._log_path(sequence)
        data = path.read_bytes()
        bodies, offset, problem = _read_frames(data)
        if problem is not None:
            # A crash mid-append leaves a torn frame at the very end of the newest log. Anything
            # else - damage in an older log, or a good frame after the bad one - is corruption.
            length = _FRAME.unpack_from(data, offset)[0] if len(data) - offset >= 8 else 0
            followed = _valid_frame_at(data, offset + _FRAME.size + length)
            if not last or followed:
                raise MetadataCorruptError(
                    f"embedded metadata log {path} is damaged at byte {offset}: {problem}",
                    context={"path": str(path), "offset": offset},
                )
            log.warning(
                "embedded_store_torn_tail_cut",
                path=str(path),
                offset=offset,
                bytes_cut=len(data) - offset,
                reason=problem,
            )
            with open(path, "r+b") as f:
                f.truncate(offset)
                os.fsync(f.fileno())
        for body in bodies:
            try:
                record = _decode_record(body)
            except Exception as e:
                raise MetadataCorruptError(
                    f"embedded metadata log {path} holds a record that does not decode: {e}",
                    context={"path": str(path)},
                ) from e
            core.replay(record)
        return len(bodies)

    # --- Journal protocol ---------------------------------------------------------------------

    async def append(self, records: Sequence[LogRecord]) -> None:
        data = b"".join(_frame(_encode_record(r)) for r in records)
        # one thread hop for the whole batch: write, then fdatasync
        await asyncio.to_thread(self._write_and_sync, data)
        self._log_bytes += len(data)

    def _write_and_sync(self, data: bytes) -> None:
        fd = self._log_fd
        assert fd is not None, "the journal is not open"
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fdatasync(fd)

    async def after_commit(self, core: LocalCore) -> None:
        if self._log_bytes >= self.config.snapshot_after_log_bytes:
            await self.snapshot(core)

    async def snapshot(self, core: LocalCore) -> None:
        """Write the core's state as the snapshot and start a new log (inside the writer)."""
        next_sequence = self._log_sequence + 1
        snap = pb.EmbeddedSnapshot(
            format_version=_FORMAT_VERSION,
            revision=core.revision,
            last_lease_id=core.last_lease_id,
            next_log_sequence=next_sequence,
        )
        for key, kv in core.kvs.items():
            snap.kvs.add(
                key=key,
                value=kv.value,
                create_revision=kv.create_revision,
                mod_revision=kv.mod_revision,
                version=kv.version,
                lease_id=kv.lease_id,
            )
        for lease in core.leases.values():
            snap.leases.add(lease_id=lease.lease_id, ttl_ms=lease.ttl_s * 1000)
        data = _frame(snap.SerializeToString())
        await asyncio.to_thread(self._install_snapshot, data, next_sequence)
        log.info(
            "embedded_store_snapshot_written",
            revision=core.revision,
            keys=len(core.kvs),
            snapshot_bytes=len(data),
        )

    def _install_snapshot(self, data: bytes, next_sequence: int) -> None:
        tmp = self.directory / f"{_SNAPSHOT}.tmp"
        write_private(tmp, data)
        os.replace(tmp, self.directory / _SNAPSHOT)
        _fsync_dir(self.directory)
        new_fd = open_private(self._log_path(next_sequence), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        _fsync_dir(self.directory)
        old_fd, old_sequence = self._log_fd, self._log_sequence
        self._log_fd, self._log_sequence, self._log_bytes = new_fd, next_sequence, 0
        if old_fd is not None:
            os.close(old_fd)
        for sequence in self._log_sequences():
            if sequence <= old_sequence:
                self._log_path(sequence).unlink()


class EmbeddedMetadataStore(LocalMetadataStore):
    """Durable single-process store in a local directory (``embedded:///path``)."""

    def __init__(self, config: MetadataStoreConfig, core: LocalCore, journal: EmbeddedJournal):
        super().__init__(config, core)
        self._journal = journal

    @classmethod
    async def open(
        cls, directory: Path, config: MetadataStoreConfig, *, clock: Clock = SYSTEM_CLOCK
    ) -> EmbeddedMetadataStore:
        journal = EmbeddedJournal(directory, config)
        journal.lock()
        core = LocalCore(config, clock=clock, journal=journal)
        try:
            await asyncio.to_thread(journal.recover, core)
        except BaseException:
            journal.close()
            raise
        core.start()
        store = cls(config, core, journal)
        if core.leases:
            stale = sorted(core.leases)
            await core.revoke_leases(stale)
            log.info("embedded_store_stale_leases_revoked", leases=len(stale))
        return store

    @property
    def description(self) -> str:
        return f"embedded://{self._journal.directory}"

    async def snapshot(self) -> None:
        """Write a snapshot now (normally automatic once the log passes its size limit)."""
        # Go through the writer so the snapshot sees a consistent state between batches.
        await self.core.submit_barrier(self._journal.snapshot)

    async def _do_close(self) -> None:
        await super()._do_close()
        self._journal.close()
