"""A bookie over real gRPC: adds, reads, LAC long-poll, fencing, read-only mode, GC, bad input."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bookie.client.bookie_client import BookieClient
from bookie.entries import AddEntry, entry_checksum
from bookie.process import BookieProcess
from bookie.service.bookie import DiskUsage
from bookie.service.config import BookieConfig
from bookie.storage.config import StorageConfig
from magnetar.common.errors import (
    BookieReadOnlyError,
    ChecksumMismatchError,
    CorruptionError,
    EntryExistsError,
    EntryTooLargeError,
    InvalidArgumentError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from magnetar.testing.eventually import eventually
from metadata import MetadataStore, layout, open_store
from proto.common.v1 import types_pb2
from proto.format.v1 import cluster_pb2

StartBookie = Callable[..., Awaitable[BookieProcess]]


def entry(
    ledger: int,
    entry_id: int,
    payload: bytes | None = None,
    *,
    lac: int = -1,
    recovery: bool = False,
) -> AddEntry:
    data = payload if payload is not None else f"ledger {ledger} entry {entry_id}".encode()
    return AddEntry(
        ledger, entry_id, lac, data, entry_checksum(ledger, entry_id, lac, data), recovery
    )


class FakeDisk:
    """An injectable disk-usage probe: tests set the used fraction."""

    def __init__(self) -> None:
        self.used = 0.5

    def __call__(self) -> DiskUsage:
        total = 100 * 1024**3
        return DiskUsage(total, int(total * (1 - self.used)))


@pytest.fixture
async def metadata_store() -> AsyncIterator[MetadataStore]:
    store = await open_store("memory://")
    yield store
    await store.close()


@pytest.fixture
async def start_bookie(tmp_path: Path, metadata_store: MetadataStore) -> AsyncIterator[StartBookie]:
    running: list[BookieProcess] = []

    async def start(
        name: str = "b1", disk: FakeDisk | None = None, **overrides: object
    ) -> BookieProcess:
        settings: dict[str, object] = {
            "data_dir": tmp_path / name,
            "metadata": "memory://",
            "port": 0,
            "http_port": 0,
            "data_port": 0,
            "bind_host": "127.0.0.1",
            "advertised_host": "127.0.0.1",
            "storage": StorageConfig(gc_interval_s=0, max_group_wait_ms=0),
        }
        settings.update(overrides)
        config = BookieConfig(**settings)  # type: ignore[arg-type]
        process = await BookieProcess.start(config, store=metadata_store, disk_probe=disk)
        running.append(process)
        return process

    yield start
    for process in running:
        await process.stop(grace_s=0)


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[[BookieProcess], BookieClient]]:
    clients: list[BookieClient] = []

    def make(process: BookieProcess) -> BookieClient:
        client = BookieClient(f"127.0.0.1:{process.data_port}")
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


async def test_adds_from_many_ledgers_read_back(start_bookie: StartBookie, client_for) -> None:
    bookie = await start_bookie()
    client = client_for(bookie)
    results = await asyncio.gather(
        *(
            client.add_entries([entry(ledger, i, lac=i - 1) for i in range(50)])
            for ledger in range(4)
        )
    )
    assert results == [[], [], [], []]
    for ledger in range(4):
        read = await client.read_entries(ledger, 0, 49)
        assert [e.entry_id for e in read.entries] == list(range(50))
        assert all(
            e.crc32c == entry_checksum(ledger, e.entry_id, e.last_add_confirmed, e.payload)
            for e in read.entries
        )
        assert read.last_add_confirmed == 48  # as the writer last reported it
        assert not read.fenced


async def test_lac_long_poll(start_bookie: StartBookie, client_for) -> None:
    bookie = await start_bookie()
    client = client_for(bookie)
    await client.add_entries([entry(1, 0), entry(1, 1, lac=0)])
    now = await client.read_lac(1)
    assert now.last_add_confirmed == 0
    waiting = asyncio.create_task(
        client.read_lac(1, previous_lac=0, timeout_ms=10_000, include_entry=True)
    )
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await client.add_entries([entry(1, 2, lac=1)])
    result = await asyncio.wait_for(waiting, 5)
    assert result.last_add_confirmed == 1
    assert result.entry is not None
    assert result.entry.entry_id == 1
    # nothing new: the poll ends at its timeout with the same LAC
    quiet = await client.read_lac(1, previous_lac=1, timeout_ms=200)
    assert quiet.last_add_confirmed == 1
    # a ledger this bookie has never seen has no LAC yet
    assert (await client.read_lac(42)).last_add_confirmed == -1


async def test_bad_input_is_refused_per_entry_and_the_stream_goes_on(
    start_bookie: StartBookie, client_for
) -> None:
    bookie = await start_bookie(storage=StorageConfig(max_entry_bytes=10_000, gc_interval_s=0))
    client = client_for(bookie)
    corrupt = entry(1, 1)._replace(crc32c=12345)
    too_big = entry(1, 2, b"x" * 10_001)
    negative = entry(1, -3)
    failures = await client.add_entries([entry(1, 0), corrupt, too_big, negative, entry(1, 4)])
    by_entry = {f.entry_id: f.error for f in failures}
    assert set(by_entry) == {1, 2, -3}
    assert isinstance(by_entry[1], ChecksumMismatchError)
    assert isinstance(by_entry[2], EntryTooLargeError)
    assert "10,001 bytes" in by_entry[2].message
    assert "at most 10,000" in by_entry[2].message
    assert isinstance(by_entry[-3], InvalidArgumentError)
    # the good entries of the same request were stored, and the stream still works
    assert [e.entry_id for e in (await client.read_entries(1, 0, 0)).entries] == [0]
    assert [e.entry_id for e in (await client.read_entries(1, 4, 4)).entries] == [4]
    assert await client.add_entries([entry(1, 5)]) == []
    with pytest.raises(NoSuchLedgerError, match="ledger 99"):
        await client.read_entries(99, 0, 0)
    with pytest.raises(NoSuchEntryError, match="entry 3 of ledger 1"):
        await client.read_entries(1, 3, 3)
    with pytest.raises(InvalidArgumentError):
        await client.read_entries(1, 5, 2)


async def test_entries_are_write_once_over_the_wire_and_across_a_restart(
    start_bookie: StartBookie, client_for
) -> None:
    """Issue 23, finding 7: a second add of an entry replaced it, and recovery adds rewrote the
    entries of a fenced ledger, so a tampered message was read by a new subscription after a
    restart."""
    bookie = await start_bookie()
    client = client_for(bookie)
    original = [entry(7, 0, b"original 0"), entry(7, 1, b"original 1", lac=0)]
    assert await client.add_entries(original) == []
    # an identical add is an idempotent retry
    assert await client.add_entries(original) == []
    tampered = entry(7, 0, b"tampered")
    refused = await client.add_entries([tampered, entry(7, 2, lac=1)])
    assert [(f.entry_id, type(f.error)) for f in refused] == [(0, EntryExistsError)]
    assert "entry 0 of ledger 7 already exists" in refused[0].error.message
    assert refused[0].error.context == {"ledger": "7", "entry": "0"}
    # a fenced ledger: recovery adds fill missing entries only
    await client.fence(7)
    refused = await client.add_entries(
        [
            entry(7, 1, b"tampered 1", lac=0, recovery=True),
            entry(7, 3, lac=2, recovery=True),
        ]
    )
    assert [(f.entry_id, type(f.error)) for f in refused] == [(1, EntryExistsError)]

    async def payloads(client: BookieClient) -> list[bytes]:
        return [e.payload for e in (await client.read_entries(7, 0, 3)).entries]

    expected = [b"original 0", b"original 1", b"ledger 7 entry 2", b"ledger 7 entry 3"]
    assert await payloads(client) == expected
    metrics = bookie.bookie.metrics.render().decode()
    assert f'magnetar_bookie_adds_conflicting_total{{bookie="{bookie.bookie_id}"}} 2.0' in metrics
    await bookie.stop(grace_s=0)
    again = await start_bookie()
    client = client_for(again)
    assert await payloads(client) == expected
    retampered = await client.add_entries([tampered._replace(recovery=True)])  # (it is fenced)
    assert [type(f.error) for f in retampered] == [EntryExistsError]
    assert await payloads(client) == expected


async def test_a_last_add_confirmed_not_below_its_entry_is_refused(
    start_bookie: StartBookie, client_for
) -> None:
    """Issue 23, finding 8: an add whose LAC (2^40) was past its own id was stored, and after a
    broker crash recovery closed the ledger at 2^40: its topic could never be opened again."""
    bookie = await start_bookie()
    client = client_for(bookie)
    assert await client.add_entries([entry(8, i, lac=i - 1) for i in range(5)]) == []
    bad = [entry(8, 5, lac=1 << 40), entry(8, 6, lac=6), entry(8, 7, lac=-2)]
    refused = await client.add_entries([*bad, entry(8, 4, lac=3)])  # and a retry, accepted
    assert [(f.entry_id, type(f.error)) for f in refused] == [
        (5, InvalidArgumentError),
        (6, InvalidArgumentError),
        (7, InvalidArgumentError),
    ]
    assert await client.add_entries([entry(8, 5, lac=4)]) == []
    message = refused[0].error.message
    assert "entry 5 of ledger 8 carries last_add_confirmed 1099511627776" in message
    assert "from -1 (nothing confirmed yet) to 4" in message
    # nothing of them was stored, and the ledger's LAC is what the good adds said
    assert (await client.read_lac(8)).last_add_confirmed == 4
    assert [e.entry_id for e in (await client.read_entries(8, 0, 10)).entries] == list(range(6))


async def test_fencing_refuses_normal_adds_and_survives_restart(
    start_bookie: StartBookie, client_for
) -> None:
    bookie = await start_bookie()
    client = client_for(bookie)
    await client.add_entries([entry(5, 0), entry(5, 1, lac=0)])
    fenced = await client.fence(5)
    assert (fenced.last_add_confirmed, fenced.last_entry_id) == (0, 1)
    refused = await client.add_entries([entry(5, 2, lac=1)])
    assert [type(f.error) for f in refused] == [LedgerFencedError]
    assert await client.add_entries([entry(5, 2, lac=1, recovery=True)]) == []
    # fencing a ledger this bookie has not seen yet still fences it
    await client.fence(6)
    assert [type(f.error) for f in await client.add_entries([entry(6, 0)])] == [LedgerFencedError]

    await bookie.stop(grace_s=0)
    again = await start_bookie()
    client = client_for(again)
    assert (await client.read_entries(5, 0, 2)).fenced
    assert [type(f.error) for f in await client.add_entries([entry(5, 3)])] == [LedgerFencedError]
    assert [type(f.error) for f in await client.add_entries([entry(6, 0)])] == [LedgerFencedError]
    assert [e.entry_id for e in (await client.read_entries(5, 0, 2)).entries] == [0, 1, 2]


async def test_read_only_mode_follows_disk_usage_and_gc_still_runs(
    start_bookie: StartBookie, client_for, metadata_store: MetadataStore
) -> None:
    disk = FakeDisk()
    bookie = await start_bookie(
        disk=disk,
        storage=StorageConfig(max_segment_bytes=64 * 1024, max_entry_bytes=8192, gc_interval_s=0),
    )
    client = client_for(bookie)
    for i in range(40):
        await client.add_entries([entry(1, i, b"a" * 4000), entry(2, i, b"b" * 100)])

    async def registered_state() -> int:
        record = await metadata_store.get(layout.bookie_available(bookie.bookie_id))
        assert record is not None
        return int(cluster_pb2.BookieRegistration.FromString(record.value).state)

    def registered_as(state: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return await registered_state() == state

        return check

    assert await registered_state() == types_pb2.BOOKIE_STATE_WRITABLE
    disk.used = 0.96
    bookie.bookie.check_disk()
    refused = await client.add_entries([entry(2, 40)])
    assert [type(f.error) for f in refused] == [BookieReadOnlyError]
    assert "read-only" in refused[0].error.message
    assert (await client.info()).read_only
    await eventually(registered_as(types_pb2.BOOKIE_STATE_READ_ONLY), timeout_s=5, interval_s=0.05)
    # reads are served, recovery adds still close ledgers, and the bookie can dig itself out
    assert len((await client.read_entries(2, 0, 39)).entries) == 40
    assert await client.add_entries([entry(2, 40, recovery=True)]) == []
    before = bookie.storage.disk_bytes()
    await client.delete_ledger(1)
    result = await bookie.storage.collect_garbage()
    assert result.bytes_freed > 100_000
    assert bookie.storage.disk_bytes() < before
    # still read-only until usage falls below the lower mark
    disk.used = 0.92
    bookie.bookie.check_disk()
    assert bookie.bookie.read_only
    disk.used = 0.85
    bookie.bookie.check_disk()
    assert await client.add_entries([entry(2, 41)]) == []
    await eventually(registered_as(types_pb2.BOOKIE_STATE_WRITABLE), timeout_s=5, interval_s=0.05)


async def test_registration_health_and_metrics(
    start_bookie: StartBookie, client_for, metadata_store: MetadataStore
) -> None:
    bookie = await start_bookie(zone="zone-a")
    record = await metadata_store.get(layout.bookie_available(bookie.bookie_id))
    assert record is not None
    assert record.lease_id != 0
    registration = cluster_pb2.BookieRegistration.FromString(record.value)
    assert registration.address == f"127.0.0.1:{bookie.port}"
    assert registration.labels["zone"] == "zone-a"
    assert registration.total_disk_bytes > 0

    async with grpc.aio.insecure_channel(f"127.0.0.1:{bookie.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = await health.Check(  # type: ignore[attr-defined]
            health_pb2.HealthCheckRequest(service="magnetar.bookie.v1.BookieService")
        )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING

    client = client_for(bookie)
    await client.add_entries([entry(1, i, b"m" * 1000) for i in range(10)])
    await client.read_entries(1, 0, 9)
    url = f"http://127.0.0.1:{bookie.http_port}/metrics"
    text = (await asyncio.to_thread(lambda: urllib.request.urlopen(url).read())).decode()
    metrics = {
        line.split(" ")[0].split("{")[0]: float(line.split(" ")[-1])
        for line in text.splitlines()
        if line.startswith("magnetar_bookie") and "_bucket" not in line
    }
    assert metrics["magnetar_bookie_adds_total"] == 10
    assert metrics["magnetar_bookie_add_bytes_total"] == 10_000
    assert metrics["magnetar_bookie_read_entries_total"] == 10
    assert metrics["magnetar_bookie_fdatasync_seconds_count"] >= 1
    assert metrics["magnetar_bookie_group_commit_bytes_count"] >= 1
    assert metrics["magnetar_bookie_ledgers"] == 1
    assert metrics["magnetar_bookie_read_only"] == 0
    assert 0 < metrics["magnetar_bookie_disk_used_ratio"] < 1

    await bookie.stop(grace_s=0)
    assert await metadata_store.get(layout.bookie_available(bookie.bookie_id)) is None


async def test_a_bookie_is_its_data_not_its_address(
    start_bookie: StartBookie, client_for, metadata_store: MetadataStore
) -> None:
    first = await start_bookie("data-1")
    await client_for(first).add_entries([entry(3, 0)])
    bookie_id = first.bookie_id
    await first.stop(grace_s=0)
    again = await start_bookie("data-1", port=0)  # another port: same bookie
    assert again.bookie_id == bookie_id
    assert [e.entry_id for e in (await client_for(again).read_entries(3, 0, 0)).entries] == [0]
    await again.stop(grace_s=0)
    # an empty directory claiming the same id is refused with a message that says why
    with pytest.raises(Exception, match="wiped or replaced"):
        await start_bookie("empty", bookie_id=bookie_id)


async def test_a_request_larger_than_the_inflight_budget_still_goes_through(
    start_bookie: StartBookie, client_for
) -> None:
    bookie = await start_bookie(
        max_inflight_bytes_per_stream=6 * 1024 * 1024,
        storage=StorageConfig(max_entry_bytes=5 * 1024 * 1024, gc_interval_s=0),
    )
    client = client_for(bookie)
    big = [entry(1, i, bytes([i]) * 1_000_000) for i in range(8)]  # 8 MB in one call
    assert await client.add_entries(big) == []
    read = await client.read_entries(1, 0, 7, max_bytes=64 * 1024 * 1024)
    assert [e.payload[:1] for e in read.entries] == [bytes([i]) for i in range(8)]


async def test_a_flipped_byte_on_disk_reaches_the_reader_as_corruption(
    start_bookie: StartBookie, client_for
) -> None:
    bookie = await start_bookie()
    client = client_for(bookie)
    await client.add_entries([entry(9, i, bytes([65 + i]) * 500) for i in range(3)])
    segment = sorted((bookie.storage.directory).glob("seg-*.log"))[-1]
    data = bytearray(segment.read_bytes())
    data[data.index(b"B" * 500) + 250] ^= 0x20  # inside entry 1's payload
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptionError, match="entry 1 of ledger 9 is damaged"):
        await client.read_entries(9, 1, 1)
    # the entries around it are served, and the bookie keeps working
    assert [e.entry_id for e in (await client.read_entries(9, 0, 2)).entries] == [0]
    assert [e.entry_id for e in (await client.read_entries(9, 2, 2)).entries] == [2]
    assert await client.add_entries([entry(9, 3)]) == []


async def test_one_large_call_travels_in_several_messages(
    start_bookie: StartBookie, client_for
) -> None:
    bookie = await start_bookie()
    client: BookieClient = client_for(bookie)
    client.max_message_bytes = 100_000
    entries = [entry(3, i, bytes([i % 256]) * 30_000) for i in range(20)]  # 600 kB in one call
    bad = entry(3, 20, b"x" * 30_000)._replace(crc32c=1)
    failures = await client.add_entries([*entries, bad])
    # 630 kB at 100 kB per message: at least seven messages, answered as one call
    assert client.messages_sent >= 7
    assert [(f.entry_id, type(f.error)) for f in failures] == [(20, ChecksumMismatchError)]
    read = await client.read_entries(3, 0, 19, max_bytes=1 << 30)
    assert [e.payload for e in read.entries] == [e.payload for e in entries]
