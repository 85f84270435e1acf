"""Decommissioning a bookie with the real parts in this process: bookies serving real files, the
ledger client, and a real autorecovery instance that re-replicates what the lost bookie held."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from bookie.autorecovery.config import AutorecoveryConfig
from bookie.autorecovery.metrics import AutorecoveryMetrics
from bookie.autorecovery.worker import Autorecovery
from bookie.client.ledger_client import LedgerClient
from bookie.decommission import DecommissionProgress, decommission_bookie
from bookie.process import BookieProcess
from magnetar.testing.eventually import eventually
from magnetar.testing.inprocess import start_bookie_in_process
from metadata import layout, open_store


def payload(ledger_id: int, entry_id: int) -> bytes:
    return f"ledger {ledger_id} entry {entry_id}|".encode() * 8


async def until_metric(instance: Autorecovery, line: str) -> str:
    """Scrape until the exposition has ``line``; the text then."""
    metrics = AutorecoveryMetrics(instance)

    def showing() -> str | None:
        text = metrics.render().decode()
        return text if line in text else None

    text: str = await eventually(showing, timeout_s=10, what=repr(line), interval_s=0.05)
    return text


async def test_decommission_waits_for_autorecovery_then_frees_the_id(tmp_path: Path) -> None:
    async with contextlib.AsyncExitStack() as cleanup:
        store = await open_store("memory://")
        cleanup.push_async_callback(store.close)
        bookies: dict[str, BookieProcess] = {}

        async def stop_all() -> None:
            for process in bookies.values():
                await process.stop(grace_s=0)

        cleanup.push_async_callback(stop_all)
        for i in range(4):
            bookies[f"b{i}"] = await start_bookie_in_process(store, tmp_path / f"b{i}", f"b{i}")
        client = await LedgerClient.start(store)
        cleanup.push_async_callback(client.close)
        await eventually(lambda: len(client.view.bookies) >= 4, what="4 bookies in view")
        written = []
        for _ in range(3):
            ledger = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
            for entry_id in range(40):
                await ledger.add(payload(ledger.ledger_id, entry_id))
            written.append(await ledger.close())
        victim = written[0].segments[0].bookies[0]
        await bookies.pop(victim).stop(grace_s=0)  # gone for good, disk and all

        recovery = await Autorecovery(
            store, AutorecoveryConfig(lost_bookie_grace_s=0.2, check_interval_s=0.1)
        ).start()
        cleanup.push_async_callback(recovery.close)
        await asyncio.wait_for(recovery.active.wait(), 10)
        seen: list[DecommissionProgress] = []
        result = await decommission_bookie(
            store, victim, timeout_s=30, poll_interval_s=0.05, on_progress=seen.append
        )
        assert result.ledgers_at_start == sum(victim in m.all_bookies() for m in written) >= 1
        assert seen
        assert seen[0].autorecovery == "autorecovery"
        assert await store.get(layout.bookie_cookie(victim)) is None

        # what /metrics of `magnetar autorecovery` reports of that work (once a later pass
        # has seen the records cleared)
        text = await until_metric(
            recovery,
            'magnetar_autorecovery_under_replicated_ledgers{autorecovery="autorecovery"} 0.0',
        )
        holding = sum(victim in m.all_bookies() for m in written)
        assert f'replicated_ledgers_total{{autorecovery="autorecovery"}} {holding}.0' in text
        assert recovery.replicated_fragments >= holding
        assert recovery.copied_entries > 0
        assert 'reason="no_replacement"} 0.0' in text
        assert 'reason="ledger_error"} 0.0' in text

        # the copies are real: with one more original bookie down, every entry is still there
        for metadata in written:
            now = await client.ledgers.read(metadata.ledger_id)
            assert victim not in now.all_bookies()
        survivor_down = next(b for b in written[0].segments[0].bookies if b != victim)
        await bookies.pop(survivor_down).stop(grace_s=0)
        for metadata in written:
            reader = await client.open_ledger(metadata.ledger_id)
            entries = await reader.read(0, 39)
            assert [e.payload for e in entries] == [
                payload(metadata.ledger_id, i) for i in range(40)
            ]
            await reader.close()

        # a new bookie with an empty disk may now take the id
        bookies[victim] = await start_bookie_in_process(store, tmp_path / "fresh", victim)
        assert await store.get(layout.bookie_available(victim)) is not None
