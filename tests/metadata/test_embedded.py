"""The embedded store on real files: SIGKILL, torn tails, corruption, snapshots, the lock."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from magnetar.common.errors import (
    MetadataCorruptError,
    MetadataStoreLockedError,
    WatchCompactedError,
)
from metadata import MetadataStoreConfig, open_store
from metadata.embedded import EmbeddedMetadataStore

# Writes unique keys from many tasks, printing each acknowledged one, until it is killed. Also
# holds a lease-bound key. Snapshots are frequent so that the kill can land in one.
WRITER = """
import asyncio, sys
from magnetar.common.log import configure_logging
from metadata import MetadataStoreConfig, open_store
from metadata.coordination import Session

async def writer(store, w):
    i = 0
    while True:
        key = f"/w/{w}/{i:06d}"
        version = await store.put(key, f"value-{w}-{i}".encode())
        sys.stdout.write(f"ACK {key} {version}\\n")
        sys.stdout.flush()
        i += 1

async def main(path):
    configure_logging(mode="json", stream=sys.stderr)
    config = MetadataStoreConfig(url=f"embedded://{path}", snapshot_after_log_bytes=16384)
    store = await open_store(config)
    session = await Session.start(store, ttl_s=30)
    await store.put("/ephemeral/me", b"alive", lease_id=session.lease_id)
    print("READY", flush=True)
    await asyncio.gather(*(writer(store, w) for w in range(8)))

asyncio.run(main(sys.argv[1]))
"""


def url(path: Path, **overrides: object) -> MetadataStoreConfig:
    return MetadataStoreConfig(url=f"embedded://{path}", **overrides)  # type: ignore[arg-type]


def log_files(path: Path) -> list[Path]:
    return sorted(path.glob("log-*"))


async def test_every_acknowledged_write_survives_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "meta"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        WRITER,
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
    )
    acked: dict[str, int] = {}
    try:
        assert child.stdout is not None
        assert (await asyncio.wait_for(child.stdout.readline(), 30)).strip() == b"READY"
        async with asyncio.timeout(60):
            while len(acked) < 1500:
                _, acked_key, acked_version = (await child.stdout.readline()).split()
                acked[acked_key.decode()] = int(acked_version)
    finally:
        child.send_signal(signal.SIGKILL)
    # acknowledgements already printed before the kill count too
    for line in (await child.stdout.read()).splitlines():
        parts = line.split()
        if len(parts) == 3:
            acked[parts[1].decode()] = int(parts[2])
    await child.wait()

    store = await open_store(url(path))
    listing = await store.list("/w/")
    present = {r.key: r for r in listing.records}
    missing = sorted(set(acked) - set(present))
    assert missing == [], f"{len(missing)} acknowledged writes lost, e.g. {missing[:5]}"
    for key, version in acked.items():
        w, i = key.split("/")[2:]
        assert present[key].value == f"value-{w}-{int(i)}".encode()
        assert present[key].version == version
    # the dead process's lease-bound key is gone, and the store takes new writes
    assert await store.get("/ephemeral/me") is None
    await store.put("/after/restart", b"ok")
    await store.close()


async def test_a_torn_tail_is_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "meta"
    store = await open_store(url(path))
    versions = {f"/k/{i}": await store.put(f"/k/{i}", str(i).encode()) for i in range(10)}
    await store.close()
    # a crash mid-append: a frame header promising 100 bytes, and only 10 of them
    with open(log_files(path)[-1], "ab") as f:
        f.write((100).to_bytes(4, "little") + (12345).to_bytes(4, "little") + b"x" * 10)
    store = await open_store(url(path))
    listing = await store.list("/k/")
    assert {r.key: r.version for r in listing.records} == versions
    later = await store.put("/k/after", b"x")
    assert later > max(versions.values())
    await store.close()
    store = await open_store(url(path))
    assert await store.get("/k/after") is not None
    await store.close()


async def test_damage_before_the_tail_is_reported_not_skipped(tmp_path: Path) -> None:
    path = tmp_path / "meta"
    store = await open_store(url(path))
    for i in range(10):
        await store.put(f"/k/{i}", b"v" * 50)
    await store.close()
    log = log_files(path)[-1]
    data = bytearray(log.read_bytes())
    data[20] ^= 0xFF  # inside the first record; nine good records follow it
    log.write_bytes(bytes(data))
    with pytest.raises(MetadataCorruptError, match=r"damaged at byte 0") as info:
        await open_store(url(path))
    assert str(log) in str(info.value)
    # the failed open released the directory
    with pytest.raises(MetadataCorruptError):
        await open_store(url(path))


async def test_snapshot_and_log_replay_rebuild_the_same_state(tmp_path: Path) -> None:
    path = tmp_path / "meta"
    store = await open_store(url(path, snapshot_after_log_bytes=4096))
    expected: dict[str, bytes] = {}
    for i in range(300):
        key = f"/k/{i % 120:03d}"
        if i % 7 == 0 and key in expected:
            await store.delete(key)
            del expected[key]
        else:
            value = f"v{i}".encode() * 10
            await store.put(key, value)
            expected[key] = value
    before = await store.list("/")
    await store.close()
    assert (path / "snapshot").exists()
    assert len(log_files(path)) == 1  # logs covered by the snapshot are gone

    store = await open_store(url(path))
    after = await store.list("/")
    assert {r.key: r.value for r in after.records} == expected
    assert after.records == before.records
    assert after.revision == before.revision
    # history before the snapshot is gone, and said so; new changes are watchable
    with pytest.raises(WatchCompactedError):
        await store.watch("/k/", start_revision=1)
    async with await store.watch("/k/") as watch:
        version = await store.put("/k/new", b"x")
        event = await asyncio.wait_for(anext(watch), 5)
    assert event.revision == version
    await store.close()


async def test_watch_history_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "meta"
    store = await open_store(url(path))
    start = (await store.list("/")).revision + 1
    versions = [await store.put(f"/k/{i}", b"x") for i in range(5)]
    await store.close()
    store = await open_store(url(path))
    async with await store.watch("/k/", start_revision=start) as watch:
        events = [await asyncio.wait_for(anext(watch), 5) for _ in range(5)]
    assert [e.revision for e in events] == versions
    await store.close()


async def test_explicit_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "meta"
    store = await open_store(url(path))
    assert isinstance(store, EmbeddedMetadataStore)
    await store.put("/a", b"1")
    await store.snapshot()
    await store.put("/b", b"2")
    await store.close()
    store = await open_store(url(path))
    assert [r.key for r in (await store.list("/")).records] == ["/a", "/b"]
    await store.close()


async def test_only_one_process_may_open_the_store(tmp_path: Path) -> None:
    path = tmp_path / "meta"
    store = await open_store(url(path))
    with pytest.raises(MetadataStoreLockedError, match=f"pid {os.getpid()}"):
        await open_store(url(path))
    probe = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import asyncio, sys\n"
        "from metadata import open_store\n"
        "from magnetar.common.errors import MetadataStoreLockedError\n"
        "try:\n"
        "    asyncio.run(open_store(sys.argv[1]))\n"
        "except MetadataStoreLockedError as e:\n"
        "    print(e)\n",
        f"embedded://{path}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await probe.communicate()
    assert b"open in another process" in out
    await store.close()
    reopened = await open_store(url(path))  # closing released it
    await reopened.close()
