"""The storage engine on real files: durability, recovery, corruption, fencing, GC."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bookie.entries import entry_checksum
from bookie.storage.config import StorageConfig
from bookie.storage.engine import EntryToStore, StorageEngine
from magnetar.common.errors import (
    CorruptionError,
    EntryExistsError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StorageError,
)

SMALL = StorageConfig(
    max_segment_bytes=64 * 1024,
    max_entry_bytes=8 * 1024,
    max_group_wait_ms=0,
    gc_interval_s=0,
)


def entry(
    ledger: int,
    entry_id: int,
    payload: bytes | None = None,
    lac: int = -1,
    *,
    recovery: bool = False,
) -> EntryToStore:
    data = payload if payload is not None else f"L{ledger}E{entry_id}".encode() * 10
    crc = entry_checksum(ledger, entry_id, lac, data)
    return EntryToStore(ledger, entry_id, lac, crc, data, recovery)


async def open_engine(path: Path, config: StorageConfig = SMALL) -> StorageEngine:
    return await StorageEngine.open(path, config)


def segment_files(path: Path) -> list[Path]:
    return sorted(path.glob("seg-*.log"))


async def test_entries_read_back_in_ranges(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    await engine.add_entries([entry(1, i, lac=i - 1) for i in range(10)])
    await engine.add_entries([entry(2, i) for i in range(3)])
    got = await engine.read_entries(1, 2, 5)
    assert [r.entry_id for r in got] == [2, 3, 4, 5]
    assert got[0].payload == b"L1E2" * 10
    assert got[0].crc32c == entry_checksum(1, 2, 1, got[0].payload)
    # a range running past the last entry stops there; max_bytes cuts it short
    assert [r.entry_id for r in await engine.read_entries(1, 8, 20)] == [8, 9]
    assert len(await engine.read_entries(1, 0, 9, max_bytes=1)) == 1
    state = engine.ledger_state(1)
    assert state is not None
    assert (state.last_add_confirmed, state.last_entry_id, state.entries) == (8, 9, 10)
    with pytest.raises(NoSuchLedgerError):
        await engine.read_entries(3, 0, 0)
    with pytest.raises(NoSuchEntryError):
        await engine.read_entries(2, 7, 9)
    await engine.close()


async def test_concurrent_adds_share_group_commits(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    await asyncio.gather(*(engine.add_entries([entry(i % 7, i // 7)]) for i in range(700)))
    stats = engine.journal.stats
    assert stats.records == 700
    assert stats.groups < 700  # many adds per fdatasync
    for ledger in range(7):
        assert len(await engine.read_entries(ledger, 0, 99)) == 100
    await engine.close()


@pytest.mark.parametrize("clean", [True, False], ids=["closed", "crashed"])
async def test_restart_keeps_everything(tmp_path: Path, clean: bool) -> None:
    engine = await open_engine(tmp_path)
    for batch in range(20):  # several segments' worth
        await engine.add_entries(
            [entry(batch % 3, batch // 3 * 10 + i, b"r" * 1000) for i in range(10)]
        )
    await engine.fence(1)
    await engine.close(checkpoint=clean)
    assert len(segment_files(tmp_path)) > 1
    engine = await open_engine(tmp_path)
    assert engine.recovery is not None
    if not clean:
        assert engine.recovery.records_replayed > 0
    for ledger in range(3):
        records = await engine.read_entries(ledger, 0, 1000, max_bytes=1 << 30)
        assert len(records) == len([b for b in range(20) if b % 3 == ledger]) * 10
    fenced = engine.ledger_state(1)
    assert fenced is not None
    assert fenced.fenced
    state0 = engine.ledger_state(0)
    assert state0 is not None
    assert not state0.fenced
    await engine.close()


async def test_torn_tail_is_cut_without_losing_earlier_entries(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    await engine.add_entries([entry(1, i) for i in range(5)])
    await engine.close(checkpoint=False)
    head = segment_files(tmp_path)[-1]
    good_size = head.stat().st_size
    with open(head, "ab") as f:  # a crash mid-append
        f.write((500).to_bytes(4, "little") + b"\x01\x02\x03\x04" + b"partial")
    engine = await open_engine(tmp_path)
    assert engine.recovery is not None
    assert engine.recovery.bytes_cut == 15
    assert head.stat().st_size == good_size
    assert len(await engine.read_entries(1, 0, 10)) == 5
    await engine.add_entries([entry(1, 5)])
    assert len(await engine.read_entries(1, 0, 10)) == 6
    await engine.close()


async def test_flipped_byte_is_reported_on_read_not_served(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    await engine.add_entries([entry(1, i, b"x" * 100) for i in range(3)])
    segment = segment_files(tmp_path)[-1]
    data = bytearray(segment.read_bytes())
    frame = len(data) // 3
    data[frame + 80] ^= 0x01  # inside entry 1's payload
    segment.write_bytes(bytes(data))
    assert [r.entry_id for r in await engine.read_entries(1, 0, 0)] == [0]
    with pytest.raises(CorruptionError, match="entry 1 of ledger 1 is damaged"):
        await engine.read_entries(1, 1, 1)
    # a range stops before the damaged entry; reading it then reports it
    assert [r.entry_id for r in await engine.read_entries(1, 0, 2)] == [0]
    await engine.close(checkpoint=False)
    # replay after a crash keeps the damaged entry indexed as damaged, and the ones after it
    engine = await open_engine(tmp_path)
    assert engine.recovery is not None
    assert engine.recovery.corrupt_records == 1
    with pytest.raises(CorruptionError):
        await engine.read_entries(1, 1, 1)
    assert [r.entry_id for r in await engine.read_entries(1, 2, 2)] == [2]
    await engine.close()


async def test_delete_and_gc_return_space(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    payload = b"p" * 4000
    for i in range(60):  # ledger 1 then ledger 2, each filling whole segments
        await engine.add_entries([entry(1, i, payload)])
    for i in range(60):
        await engine.add_entries([entry(2, i, payload)])
    await engine.checkpoint()
    before = engine.disk_bytes()
    assert await engine.delete_ledger(1)
    result = await engine.collect_garbage()
    after = engine.disk_bytes()
    assert result.segments_deleted >= 2
    assert before - after >= 200_000
    with pytest.raises(NoSuchLedgerError):
        await engine.read_entries(1, 0, 0)
    assert len(await engine.read_entries(2, 0, 100, max_bytes=1 << 30)) == 60
    await engine.close()
    engine = await open_engine(tmp_path)
    assert engine.ledger_state(1) is None
    assert len(await engine.read_entries(2, 0, 100, max_bytes=1 << 30)) == 60
    await engine.close()


async def test_compaction_moves_live_entries_out_of_mostly_dead_segments(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    payload = b"q" * 3000
    for i in range(80):  # interleaved: every segment holds both ledgers
        await engine.add_entries([entry(1, i, payload), entry(2, i, payload), entry(3, i, payload)])
    await engine.delete_ledger(1)
    await engine.delete_ledger(2)
    *sealed, head_at_gc = segment_files(tmp_path)
    result = await engine.collect_garbage()
    assert result.segments_compacted >= 3
    assert result.entries_moved > 0
    # every sealed segment was compacted away; the head at GC time is kept
    assert not set(sealed) & set(segment_files(tmp_path))
    assert head_at_gc in segment_files(tmp_path)
    got = await engine.read_entries(3, 0, 100, max_bytes=1 << 30)
    assert [r.entry_id for r in got] == list(range(80))
    assert all(r.payload == payload for r in got)
    await engine.close(checkpoint=False)
    engine = await open_engine(tmp_path)
    assert len(await engine.read_entries(3, 0, 100, max_bytes=1 << 30)) == 80
    await engine.close()


async def test_an_identical_add_is_a_retry_that_writes_nothing(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    assert await engine.add_entries([entry(1, 0, b"a" * 50)]) == [None]
    records = engine.journal.stats.records
    assert await engine.add_entries([entry(1, 0, b"a" * 50)]) == [None]
    assert await engine.add_entries([entry(1, 0, b"a" * 50, recovery=True)]) == [None]
    assert engine.journal.stats.records == records  # nothing written again
    state = engine.ledger_state(1)
    assert state is not None
    assert state.entries == 1
    assert sum(engine.index.live_bytes.values()) == state.stored_bytes
    await engine.close()


@pytest.mark.parametrize("clean", [True, False], ids=["closed", "crashed"])
async def test_an_add_that_would_change_a_stored_entry_is_refused(
    tmp_path: Path, clean: bool
) -> None:
    """Issue 23, finding 7: a second add replaced the stored entry, recovery adds included."""
    engine = await open_engine(tmp_path)
    original = entry(1, 3, b"the original", lac=2)
    assert await engine.add_entries([original]) == [None]
    tampered = [
        entry(1, 3, b"tampered", lac=2),  # other payload
        entry(1, 3, b"the original", lac=1),  # same payload, other LAC (so other checksum)
        original._replace(crc32c=original.crc32c ^ 1),  # same fields, other checksum
        entry(1, 3, b"tampered", lac=2, recovery=True),  # recovery only fills missing entries
    ]
    outcomes = await engine.add_entries([*tampered, entry(1, 4, lac=3)])
    assert [type(o) for o in outcomes] == [EntryExistsError] * 4 + [type(None)]
    error = outcomes[0]
    assert error is not None
    assert "entry 3 of ledger 1 already exists" in error.message
    assert "write-once" in error.message
    assert error.context == {"ledger": "1", "entry": "3"}

    async def read_back(engine: StorageEngine) -> tuple[bytes, int]:
        (record,) = await engine.read_entries(1, 3, 3)
        return record.payload, record.last_add_confirmed

    assert await read_back(engine) == (b"the original", 2)
    await engine.close(checkpoint=clean)
    engine = await open_engine(tmp_path)
    assert await read_back(engine) == (b"the original", 2)
    # and it stays write-once after the restart
    (refused,) = await engine.add_entries([entry(1, 3, b"tampered", lac=2, recovery=True)])
    assert isinstance(refused, EntryExistsError)
    assert await engine.add_entries([original]) == [None]
    assert await read_back(engine) == (b"the original", 2)
    await engine.close()


async def test_racing_adds_of_one_entry_store_one_copy(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    first, same, other = entry(1, 0, b"first"), entry(1, 0, b"first"), entry(1, 0, b"other")
    # all three are decided before the first is durable: the in-flight copy is what counts
    results = await asyncio.gather(
        engine.add_entries([first]), engine.add_entries([same]), engine.add_entries([other])
    )
    assert list(results[:2]) == [[None], [None]]
    assert isinstance(results[2][0], EntryExistsError)
    # and within one request
    (ok, ok_again, refused) = await engine.add_entries(
        [entry(1, 1, b"x"), entry(1, 1, b"x"), entry(1, 1, b"y")]
    )
    assert (ok, ok_again) == (None, None)
    assert isinstance(refused, EntryExistsError)
    assert engine.journal.stats.records == 2
    assert [r.payload for r in await engine.read_entries(1, 0, 1)] == [b"first", b"x"]
    await engine.close()


async def test_a_fence_while_a_retry_is_compared_still_refuses_the_new_entries(
    tmp_path: Path,
) -> None:
    # a retry of a stored entry makes the add read it (an await); a fence in that window must
    # not let the new entries of the same add land after the fence record
    engine = await open_engine(tmp_path)
    stored = entry(1, 5, lac=4)
    await engine.add_entries([stored])
    adding = asyncio.ensure_future(
        engine.add_entries([stored, entry(1, 6, lac=5), entry(1, 7, lac=5, recovery=True)])
    )
    await asyncio.sleep(0)  # the add is now reading entry 5's stored copy
    fenced = await engine.fence(1)
    assert fenced.last_entry_id == 5
    retry, new, recovery = await adding
    assert isinstance(retry, LedgerFencedError)
    assert isinstance(new, LedgerFencedError)
    assert recovery is None
    held = await engine.read_entries(1, 5, 7, entry_ids=[5, 6, 7])
    assert [r.entry_id for r in held] == [5, 7]
    await engine.close()


async def test_only_a_recovery_add_replaces_a_damaged_copy(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    await engine.add_entries([entry(1, i, b"x" * 100) for i in range(3)])
    segment = segment_files(tmp_path)[-1]
    data = bytearray(segment.read_bytes())
    data[len(data) // 3 + 80] ^= 0x01  # inside entry 1's payload
    segment.write_bytes(bytes(data))
    (refused,) = await engine.add_entries([entry(1, 1, b"x" * 100)])
    assert isinstance(refused, CorruptionError)
    assert "only a recovery add may replace it" in refused.message
    assert await engine.add_entries([entry(1, 1, b"x" * 100, recovery=True)]) == [None]
    assert [r.entry_id for r in await engine.read_entries(1, 0, 2)] == [0, 1, 2]
    state = engine.ledger_state(1)
    assert state is not None
    assert state.entries == 3
    await engine.close(checkpoint=False)
    engine = await open_engine(tmp_path)  # the repair is the later copy in the log: it wins
    assert [r.payload for r in await engine.read_entries(1, 0, 2)] == [b"x" * 100] * 3
    await engine.close()


async def test_a_very_sparse_entry_id_does_not_allocate_a_huge_array(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    await engine.add_entries([entry(1, 0), entry(1, 10**12)])
    ledger = engine.index.ledger(1)
    assert ledger is not None
    assert ledger.memory_bytes() < 1024
    assert [r.entry_id for r in await engine.read_entries(1, 10**12, 10**12)] == [10**12]
    await engine.close(checkpoint=True)
    engine = await open_engine(tmp_path)
    assert [r.entry_id for r in await engine.read_entries(1, 10**12, 10**12)] == [10**12]
    await engine.close()


async def test_each_group_commit_is_one_thread_hop_whatever_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops: list[str] = []
    real_to_thread = asyncio.to_thread

    async def counting_to_thread(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(func, "__name__", repr(func)))
        return await real_to_thread(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting_to_thread)
    config = StorageConfig(max_group_wait_ms=0, gc_interval_s=0)
    engine = await open_engine(tmp_path, config)
    hops.clear()
    await engine.add_entries([entry(1, 0)])
    assert hops == ["_write_and_sync"]  # write and fdatasync in the same hop
    hops.clear()
    big = b"x" * (256 * 1024)
    await engine.add_entries([entry(1, 1, big, lac=0)])
    assert hops == ["_write_and_sync"]
    # adds that arrive while a commit runs share the next one: one more hop for all of them
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        time.sleep(0.3)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    hops.clear()
    first = asyncio.ensure_future(engine.add_entries([entry(1, 2, lac=1)]))
    await asyncio.sleep(0.1)  # its fdatasync is running
    await asyncio.gather(*(engine.add_entries([entry(1, e, lac=e - 1)]) for e in range(3, 8)))
    await first
    assert hops == ["_write_and_sync", "_write_and_sync"]
    assert engine.journal.stats.group_sizes[-1] > engine.journal.stats.group_sizes[-2]
    await engine.close()
    reopened = await open_engine(tmp_path, config)
    got = [r.payload for r in await reopened.read_entries(1, 0, 7)]
    assert got == [b"L1E0" * 10, big] + [f"L1E{e}".encode() * 10 for e in range(2, 8)]
    await reopened.close()


async def test_an_add_of_new_entries_is_committed_without_a_task(tmp_path: Path) -> None:
    engine = await open_engine(tmp_path)
    adding = engine.try_add_entries([entry(1, 0), entry(1, 1, lac=0)])
    assert adding is not None
    assert await adding == [None, None]
    # a retry of a stored entry compares the stored bytes first, which awaits a read
    assert engine.try_add_entries([entry(1, 0)]) is None
    assert await engine.add_entries([entry(1, 0)]) == [None]
    # a retry of an entry on its way to the disk waits for that write, no read needed
    first = engine.try_add_entries([entry(1, 2, lac=1)])
    again = engine.try_add_entries([entry(1, 2, lac=1)])
    other = engine.try_add_entries([entry(1, 2, b"other", lac=1)])
    assert first is not None
    assert again is not None
    assert other is not None
    again.cancel()  # giving up an answer cancels no write
    assert await first == [None]
    (refused,) = await other
    assert isinstance(refused, EntryExistsError)
    assert [r.payload for r in await engine.read_entries(1, 2, 2)] == [b"L1E2" * 10]
    assert engine.journal.stats.records == 3  # the retries wrote nothing
    await engine.close()


async def test_a_failed_write_is_cut_and_refused_a_failed_fdatasync_stops_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = StorageConfig(max_group_wait_ms=0, gc_interval_s=0)
    engine = await open_engine(tmp_path, config)
    await engine.add_entries([entry(1, 0)])
    real_writev = os.writev

    def half_then_full(fd: int, chunks: list[bytes]) -> int:
        real_writev(fd, [chunks[0][:10]])  # a torn start of the group reaches the file
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", half_then_full)
    with pytest.raises(StorageError, match="the disk is full"):
        await engine.add_entries([entry(1, 1, lac=0)])
    monkeypatch.setattr(os, "writev", real_writev)
    # the torn bytes were cut: the journal goes on, and the log reads back clean
    assert await engine.add_entries([entry(1, 1, lac=0)]) == [None]

    def failing_fdatasync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    with pytest.raises(StorageError, match="fdatasync failed"):
        await engine.add_entries([entry(1, 2, lac=1)])
    with pytest.raises(StorageError, match="takes no more writes"):
        await engine.add_entries([entry(1, 3, lac=2)])
    await engine.close(checkpoint=False)
    monkeypatch.undo()
    reopened = await open_engine(tmp_path, config)
    assert [r.entry_id for r in await reopened.read_entries(1, 0, 1)] == [0, 1]
    await reopened.close()
