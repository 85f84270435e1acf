"""The ledger client and autorecovery against real bookie processes killed with SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bookie.autorecovery.config import AutorecoveryConfig
from bookie.autorecovery.records import list_under_replicated
from bookie.autorecovery.worker import Autorecovery
from bookie.client.bookie_client import BookieClient
from bookie.client.config import LedgerClientConfig
from bookie.client.ledger_client import LedgerClient
from bookie.client.ledger_metadata import LedgerMetadata, LedgerState, write_set_indexes
from bookie.entries import entry_checksum
from magnetar.common.errors import (
    EnsembleUnrepairableError,
    LedgerClosedError,
    LedgerFencedError,
    NotEnoughBookiesError,
)
from magnetar.testing import BookieNode, LocalCluster
from magnetar.testing.eventually import eventually
from metadata import MetadataStore, open_store

pytestmark = pytest.mark.etcd


def payload(i: int) -> bytes:
    return f"payload-{i:06d}|".encode() * (1 + i % 5)


@pytest.fixture
async def local_cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    cluster = LocalCluster(tmp_path / "cluster", bookies=4)
    await cluster.start()
    yield cluster
    await cluster.aclose()


async def connect(cluster: LocalCluster, **config: object) -> tuple[MetadataStore, LedgerClient]:
    store = await open_store(cluster.metadata_url)
    client = await LedgerClient.start(store, LedgerClientConfig(**config))  # type: ignore[arg-type]
    await eventually(
        lambda: len(client.view.bookies) >= sum(b.is_running for b in cluster.bookies),
        what="every running bookie in the client's view",
        interval_s=0.05,
    )
    return store, client


def node(cluster: LocalCluster, bookie_id: str) -> BookieNode:
    return next(b for b in cluster.bookies if b.bookie_id == bookie_id)


async def replicas_agree(cluster: LocalCluster, metadata: LedgerMetadata) -> None:
    """Read every entry of a closed ledger from every bookie of its write set: all the same."""
    for index, segment in enumerate(metadata.segments):
        end = metadata.segment_end(index)
        assert end is not None
        for position, bookie in enumerate(segment.bookies):
            owed = [
                e
                for e in range(segment.first_entry_id, end + 1)
                if position in write_set_indexes(e, metadata.ensemble_size, metadata.write_quorum)
            ]
            if not owed:
                continue
            client = BookieClient(node(cluster, bookie).data_address)
            try:
                held: dict[int, bytes] = {}
                for start in range(0, len(owed), 1000):
                    chunk = owed[start : start + 1000]
                    result = await client.read_entries(
                        metadata.ledger_id, chunk[0], chunk[-1], entry_ids=chunk, max_bytes=1 << 30
                    )
                    for e in result.entries:
                        assert e.crc32c == entry_checksum(
                            metadata.ledger_id, e.entry_id, e.last_add_confirmed, e.payload
                        )
                        held[e.entry_id] = e.payload
            finally:
                await client.close()
            missing = [e for e in owed if e not in held]
            assert not missing, f"{bookie} lacks entries {missing[:5]} of segment {index}"
            assert all(held[e] == payload(e) for e in owed)


async def test_writer_rides_over_a_sigkilled_bookie(local_cluster: LocalCluster) -> None:
    store, client = await connect(local_cluster)
    ledger = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    victim = ledger.metadata.last_segment.bookies[0]
    futures = []
    for i in range(10_000):
        futures.append(await ledger.add_async(payload(i)))
        if i == 5_000:
            await node(local_cluster, victim).kill()
    results = await asyncio.gather(*futures, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == [], errors[:3]  # the writer never saw an error
    assert results == list(range(10_000))
    assert ledger.ensemble_changes >= 1
    assert victim not in ledger.metadata.last_segment.bookies
    closed = await ledger.close()
    reader = await client.open_ledger(closed.ledger_id)
    entries = await reader.read(0, 9_999)
    assert [e.payload for e in entries] == [payload(i) for i in range(10_000)]
    await client.close()
    await store.close()


async def test_a_hung_bookie_is_replaced_once_its_adds_time_out(
    local_cluster: LocalCluster,
) -> None:
    # SIGSTOP: the connection stays up and nothing breaks it; only the add timeout can tell
    store, client = await connect(local_cluster, add_timeout_ms=1_000)
    ledger = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    futures = [await ledger.add_async(payload(i)) for i in range(200)]
    await asyncio.gather(*futures)
    victim = ledger.metadata.last_segment.bookies[0]
    hung = node(local_cluster, victim)
    await hung.pause()
    try:
        futures += [await ledger.add_async(payload(i)) for i in range(200, 400)]
        async with asyncio.timeout(20):
            results = await asyncio.gather(*futures, return_exceptions=True)
        assert results == list(range(400))  # no error reached the writer
        assert ledger.ensemble_changes >= 1
        assert victim not in ledger.metadata.last_segment.bookies
    finally:
        await hung.resume()
    closed = await ledger.close()
    reader = await client.open_ledger(closed.ledger_id)
    assert [e.payload for e in await reader.read(0, 399)] == [payload(i) for i in range(400)]
    await client.close()
    await store.close()


async def test_with_three_bookies_the_writer_waits_for_the_killed_one_to_return(
    tmp_path: Path,
) -> None:
    # with under-striped ledgers off; on (the default) the writer stops at once: next test
    async with LocalCluster(tmp_path / "three", bookies=3) as cluster:
        store, client = await connect(
            cluster, ensemble_change_timeout_ms=60_000, under_striped_ledgers=False
        )
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        victim = ledger.metadata.last_segment.bookies[1]
        futures = [await ledger.add_async(payload(i)) for i in range(5_000)]
        await asyncio.gather(*futures)
        await node(cluster, victim).kill()  # midway through 10,000 entries
        futures += [await ledger.add_async(payload(i)) for i in range(5_000, 10_000)]
        await asyncio.sleep(1.0)
        await node(cluster, victim).start()  # same bookie, same data, a new address
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert results == list(range(10_000))  # no error ever reached the writer
        assert ledger.ensemble_changes >= 1
        closed = await ledger.close()
        assert len(closed.segments) >= 2  # a new ensemble from the LAC at the kill
        reader = await client.open_ledger(closed.ledger_id)
        entries = await reader.read(0, 9_999)
        assert [e.payload for e in entries] == [payload(i) for i in range(10_000)]
        await replicas_agree(cluster, closed)
        await client.close()
        await store.close()


async def test_with_three_bookies_the_writer_stops_and_the_next_ledger_is_under_striped(
    tmp_path: Path,
) -> None:
    async with LocalCluster(tmp_path / "three", bookies=3) as cluster:
        store, client = await connect(cluster)
        # on a busy machine a first connection may time out, which now ends a writer at once
        for _ in range(5):
            client._quarantine.clear()
            ledger = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
            futures = [await ledger.add_async(payload(i)) for i in range(2_000)]
            if not any(
                isinstance(r, Exception)
                for r in await asyncio.gather(*futures, return_exceptions=True)
            ):
                break
        victim = ledger.metadata.last_segment.bookies[1]
        await node(cluster, victim).kill()
        with contextlib.suppress(NotEnoughBookiesError, LedgerClosedError):
            futures += [await ledger.add_async(payload(i)) for i in range(2_000, 4_000)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        confirmed = [r for r in results if not isinstance(r, BaseException)]
        failed = [r for r in results if isinstance(r, BaseException)]
        assert confirmed == list(range(len(confirmed)))  # a prefix, in order
        assert failed, "entries owed to the killed bookie cannot all have been confirmed"
        assert all(isinstance(e, EnsembleUnrepairableError) for e in failed), failed[:3]
        assert f"no writable bookie can replace {victim}" in str(failed[0])
        closed = await ledger.close_confirmed()
        assert closed.state is LedgerState.CLOSED
        assert closed.last_entry_id == len(confirmed) - 1  # exactly what the writer confirmed
        reader = await client.open_ledger(closed.ledger_id)
        entries = await reader.read(0, closed.last_entry_id)
        assert [e.payload for e in entries] == [payload(i) for i in range(len(confirmed))]

        # the killed bookie may still be registered (its lease outlives it): it is not chosen
        narrow = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        assert narrow.metadata.ensemble_size == 2
        assert narrow.metadata.under_striped
        assert victim not in narrow.metadata.last_segment.bookies
        assert len(client.under_striped_open) == 1
        assert [await narrow.add(payload(i)) for i in range(3)] == [0, 1, 2]
        await narrow.close()
        assert client.under_striped_open == set()

        await node(cluster, victim).start()  # registers again: out of quarantine
        await eventually(
            lambda: victim in client.view.bookies and victim not in client.unreachable(),
            timeout_s=30,
            what="the victim back in view and reachable",
            interval_s=0.05,
        )
        full = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        assert full.metadata.ensemble_size == 3
        assert not full.metadata.under_striped
        await full.close()
        await client.close()
        await store.close()


async def test_second_writer_recovers_and_fences_the_first(local_cluster: LocalCluster) -> None:
    store_a, writer_a = await connect(local_cluster)
    ledger = await writer_a.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    acked: list[int] = []
    refused: list[BaseException] = []

    def outcome(future: asyncio.Future[int]) -> None:
        error = future.exception()
        if error is None:
            acked.append(future.result())
        else:
            refused.append(error)

    async def keep_writing() -> None:
        i = 0
        while not refused:
            future = await ledger.add_async(payload(i))
            future.add_done_callback(outcome)
            i += 1
            if i % 50 == 0:
                await asyncio.sleep(0)
            if ledger.closed:
                break

    writing = asyncio.create_task(keep_writing())
    while len(acked) < 2_000:
        await asyncio.sleep(0.01)
    store_b, writer_b = await connect(local_cluster)
    recovered = await writer_b.recover(ledger.ledger_id)
    with contextlib.suppress(LedgerFencedError):
        await asyncio.wait_for(writing, 10)
    with pytest.raises(LedgerFencedError):
        await ledger.add(b"after the takeover")
    assert recovered.state is LedgerState.CLOSED
    assert max(acked) <= recovered.last_entry_id  # everything A confirmed survived
    assert sorted(acked) == list(range(len(acked)))
    await replicas_agree(local_cluster, recovered)
    for client, store in ((writer_a, store_a), (writer_b, store_b)):
        await client.close()
        await store.close()


async def test_recovery_after_the_writer_and_a_bookie_die(local_cluster: LocalCluster) -> None:
    store, writer = await connect(local_cluster, add_timeout_ms=2_000)
    ledger = await writer.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    futures = [await ledger.add_async(payload(i)) for i in range(3_000)]
    await node(local_cluster, ledger.metadata.last_segment.bookies[2]).kill()
    # the writer "dies" here: its pending adds are abandoned mid-flight
    confirmed = ledger.last_add_confirmed
    recovery_store, recoverer = await connect(local_cluster, add_timeout_ms=2_000)
    recovered = await recoverer.recover(ledger.ledger_id)
    await recoverer.close()
    await recovery_store.close()
    assert recovered.last_entry_id >= confirmed
    reader = await writer.open_ledger(ledger.ledger_id)
    entries = await reader.read(0, recovered.last_entry_id)
    assert [e.payload for e in entries] == [payload(i) for i in range(recovered.last_entry_id + 1)]
    for future in futures:
        future.cancel()
    await writer.close()
    await store.close()


@pytest.mark.slow
async def test_autorecovery_restores_copies_of_a_lost_bookie_even_across_its_restart(
    local_cluster: LocalCluster,
) -> None:
    store, client = await connect(local_cluster)
    ledgers = []
    for _ in range(4):
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        await asyncio.gather(*[await ledger.add_async(payload(i)) for i in range(800)])
        ledgers.append(await ledger.close())
    used = set.intersection(*(m.all_bookies() for m in ledgers))
    victim = sorted(used)[0] if used else ledgers[0].segments[0].bookies[0]
    await node(local_cluster, victim).kill()
    await local_cluster.wait_unregistered(victim, timeout_s=30)

    config = AutorecoveryConfig(
        metadata=local_cluster.metadata_url, lost_bookie_grace_s=1.0, check_interval_s=0.3
    )
    first = await Autorecovery(store, config).start()
    # stop the first instance as soon as it has fixed one fragment: the rest is left for the next
    await eventually(lambda: first.replicated_fragments >= 1, timeout_s=60, interval_s=0.05)
    await first.close()
    pending = await list_under_replicated(store)
    cli = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "magnetar.cli",
            "cluster",
            "under-replicated",
            "--metadata",
            local_cluster.metadata_url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    for record in pending:
        assert str(record.ledger_id) in cli.stdout

    second = await Autorecovery(store, config).start()

    async def still_on_victim() -> list[int]:
        return [
            m.ledger_id
            for m in ledgers
            if victim in (await client.ledgers.read(m.ledger_id)).all_bookies()
        ]

    try:
        # well inside the test's own timeout, so a stall fails with what is left to do
        async with asyncio.timeout(60):
            while await list_under_replicated(store) or await still_on_victim():
                await asyncio.sleep(0.2)
    except TimeoutError:
        left = await list_under_replicated(store)
        pytest.fail(
            f"not re-replicated in 60 s: records {left}, on {victim}: {await still_on_victim()}"
        )
    finally:
        async with asyncio.timeout(20):
            await second.close()
    for metadata in ledgers:
        final = await client.ledgers.read(metadata.ledger_id)
        assert victim not in final.all_bookies()
        await replicas_agree(local_cluster, final)  # Qw copies again, read bookie by bookie
    await client.close()
    await store.close()


async def test_a_hung_replica_does_not_hold_up_readers(local_cluster: LocalCluster) -> None:
    # a replica that accepts connections but never answers (SIGSTOP): with a 60 s read timeout
    # only the speculative read to the next replica can finish this read in time
    store, client = await connect(
        local_cluster, read_timeout_ms=60_000, speculative_read_delay_ms=100
    )
    ledger = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    await asyncio.gather(*[await ledger.add_async(payload(i)) for i in range(300)])
    closed = await ledger.close()
    hung = node(local_cluster, closed.segments[0].bookies[0])
    await hung.pause()
    try:
        reader = await client.open_ledger(closed.ledger_id)
        async with asyncio.timeout(20):
            entries = await reader.read(0, 299)
        assert [e.payload for e in entries] == [payload(i) for i in range(300)]
    finally:
        await hung.resume()
    await client.close()
    await store.close()
