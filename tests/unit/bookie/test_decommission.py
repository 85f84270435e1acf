"""Decommissioning a bookie against the memory metadata store: who is refused, what it waits
for (ledgers whose ensembles name the bookie), and that the cookie goes only at the end.

Here the test plays autorecovery's part with the same compare-and-swap it does
(``LedgerMetadata.replacing``); tests/bookie/test_decommission.py runs the real one."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from bookie.client.ledger_metadata import LedgerMetadata, LedgerMetadataStore, LedgerState
from bookie.decommission import (
    DecommissionProgress,
    decommission_bookie,
    describe_progress,
)
from bookie.service.registration import establish_identity
from magnetar.common.errors import (
    BookieIdentityError,
    BookieNotFoundError,
    BookieStillRunningError,
    OperationTimeoutError,
)
from magnetar.testing.eventually import eventually
from magnetar.testing.inprocess import start_bookie_in_process
from metadata import MetadataStore, layout, open_store

VICTIM = "bk-3"


@pytest.fixture
async def store(tmp_path: Path) -> MetadataStore:
    """A cluster that knows bookies bk-0 .. bk-4 (none running)."""
    store = await open_store("memory://")
    for i in range(5):
        await establish_identity(store, tmp_path / f"bk-{i}", f"bk-{i}")
    return store


async def closed_ledger(ledgers: LedgerMetadataStore, *bookies: str) -> LedgerMetadata:
    created = await ledgers.create(3, 2, 2, bookies)
    return await ledgers.write(replace(created, state=LedgerState.CLOSED, last_entry_id=99))


async def cookie_exists(store: MetadataStore, bookie_id: str) -> bool:
    return await store.get(layout.bookie_cookie(bookie_id)) is not None


async def test_an_unknown_bookie_is_refused_naming_the_known_ones(store: MetadataStore) -> None:
    with pytest.raises(BookieNotFoundError, match="knows no bookie bk-9") as e:
        await decommission_bookie(store, "bk-9", timeout_s=5)
    assert "known bookies: bk-0, bk-1, bk-2, bk-3, bk-4" in e.value.message


async def test_a_running_bookie_is_refused_until_it_stops(
    store: MetadataStore, tmp_path: Path
) -> None:
    running = await start_bookie_in_process(store, tmp_path / VICTIM, VICTIM)
    try:
        with pytest.raises(BookieStillRunningError, match=r"is running .*: stop it first"):
            await decommission_bookie(store, VICTIM, timeout_s=5)
        assert await cookie_exists(store, VICTIM)
    finally:
        await running.stop(grace_s=0)
    # stopped, and named by no ledger: decommissioned at once
    result = await decommission_bookie(store, VICTIM, timeout_s=5)
    assert result.ledgers_at_start == 0
    assert not await cookie_exists(store, VICTIM)


async def test_waits_until_no_ledger_names_the_bookie_then_deletes_its_cookie(
    store: MetadataStore, tmp_path: Path
) -> None:
    ledgers = LedgerMetadataStore(store)
    replicated = await closed_ledger(ledgers, "bk-0", "bk-1", VICTIM)
    deleted = await closed_ledger(ledgers, VICTIM, "bk-1", "bk-2")
    await closed_ledger(ledgers, "bk-0", "bk-1", "bk-2")  # never on the victim
    # an open ledger that moved off the victim at entry 50: only its sealed segment names it
    moved = await ledgers.create(3, 2, 2, ["bk-0", VICTIM, "bk-2"])
    moved = await ledgers.write(moved.with_segment(50, ["bk-0", "bk-4", "bk-2"]))

    seen: list[DecommissionProgress] = []
    task = asyncio.create_task(
        decommission_bookie(
            store, VICTIM, timeout_s=20, poll_interval_s=0.02, on_progress=seen.append
        )
    )
    await eventually(lambda: seen, timeout_s=5, what="a progress report", interval_s=0.01)
    assert set(seen[0].ledgers) == {replicated.ledger_id, deleted.ledger_id, moved.ledger_id}
    assert seen[0].open_ledgers == ()  # the open one's current ensemble is clean
    assert seen[0].autorecovery is None
    assert "3 ledgers still reference bk-3" in describe_progress(seen[0])
    assert "no autorecovery instance is active" in describe_progress(seen[0])

    # what autorecovery does: swap the bookie in each fragment by compare-and-swap
    await ledgers.write(replicated.replacing(0, ["bk-0", "bk-1", "bk-4"]))
    await ledgers.write(moved.replacing(0, ["bk-0", "bk-1", "bk-2"]))
    await asyncio.sleep(0.1)
    assert not task.done(), "one ledger still names the bookie"
    assert await cookie_exists(store, VICTIM)
    assert [p.ledgers for p in seen][-1] == (deleted.ledger_id,)
    await ledgers.delete(await ledgers.read(deleted.ledger_id))  # a deleted ledger names nobody

    async with asyncio.timeout(5):
        result = await task
    assert result.bookie_id == VICTIM
    assert result.ledgers_at_start == 3
    assert not await cookie_exists(store, VICTIM)
    assert all([await cookie_exists(store, f"bk-{i}") for i in (0, 1, 2, 4)])
    # the id is free: a bookie with an empty disk may now take it
    with pytest.raises(BookieIdentityError):
        await establish_identity(store, tmp_path / "fresh-bk-0", "bk-0")  # still a member
    await establish_identity(store, tmp_path / "fresh-bk-3", VICTIM)


async def test_times_out_keeping_the_cookie_and_names_what_still_needs_the_bookie(
    store: MetadataStore,
) -> None:
    ledgers = LedgerMetadataStore(store)
    stuck = await ledgers.create(3, 2, 2, ["bk-0", VICTIM, "bk-2"])  # open: its writer's job
    seen: list[DecommissionProgress] = []
    with pytest.raises(OperationTimeoutError) as e:
        await decommission_bookie(
            store, VICTIM, timeout_s=0.3, poll_interval_s=0.05, on_progress=seen.append
        )
    assert f"1 ledger still references bookie bk-3 ({stuck.ledger_id})" in e.value.message
    assert "Autorecovery must be running" in e.value.message
    assert e.value.context["ledgers"] == "1"
    assert await cookie_exists(store, VICTIM)
    assert seen[-1].open_ledgers == (stuck.ledger_id,)
    assert "open with it in their current ensemble" in describe_progress(seen[-1])
    assert seen[-1].elapsed_s >= 0.25


async def test_a_bookie_that_starts_again_while_waiting_keeps_its_cookie(
    store: MetadataStore, tmp_path: Path
) -> None:
    ledgers = LedgerMetadataStore(store)
    await closed_ledger(ledgers, "bk-0", "bk-1", VICTIM)
    task = asyncio.create_task(
        decommission_bookie(store, VICTIM, timeout_s=20, poll_interval_s=0.02)
    )
    await asyncio.sleep(0.1)
    back = await start_bookie_in_process(store, tmp_path / VICTIM, VICTIM)  # its own disk
    try:
        with pytest.raises(BookieStillRunningError, match="started again"):
            async with asyncio.timeout(5):
                await task
        assert await cookie_exists(store, VICTIM)
    finally:
        await back.stop(grace_s=0)
