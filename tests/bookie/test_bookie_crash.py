"""SIGKILL a real bookie process mid-stream, many times: nothing acknowledged is ever lost."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bookie.client.bookie_client import BookieClient
from bookie.entries import AddEntry, entry_checksum
from magnetar.common.errors import MagnetarError, NoSuchEntryError, NoSuchLedgerError
from magnetar.testing.cluster import BookieNode
from magnetar.testing.etcd import EtcdServer

pytestmark = pytest.mark.etcd

LEDGERS = 4
KILLS = 20
SEED = 20261121
# small segments and frequent checkpoints, so the kills also land around rollovers and checkpoints
STORAGE_ARGS = (
    "--storage-max-segment-bytes",
    str(4 * 1024 * 1024),
    "--storage-max-entry-bytes",
    str(64 * 1024),
    "--storage-checkpoint-after-bytes",
    str(2 * 1024 * 1024),
)


def payload_of(ledger: int, entry: int) -> bytes:
    rng = random.Random(ledger * 1_000_003 + entry)
    return rng.randbytes(rng.randint(16, 1500))


def add_of(ledger: int, entry: int) -> AddEntry:
    data = payload_of(ledger, entry)
    lac = entry - 1
    return AddEntry(ledger, entry, lac, data, entry_checksum(ledger, entry, lac, data))


@dataclass
class Ledger:
    next_entry: int = 0
    acked: set[int] = field(default_factory=set)


async def write_until_killed(
    client: BookieClient, ledgers: dict[int, Ledger], rng: random.Random
) -> None:
    """Pipelined adds into every ledger; records what the bookie acknowledged."""

    async def one_call(ledger_id: int, entries: list[int]) -> bool:
        try:
            failures = await client.add_entries([add_of(ledger_id, e) for e in entries])
        except MagnetarError:
            return False
        refused = {f.entry_id for f in failures}
        ledgers[ledger_id].acked.update(e for e in entries if e not in refused)
        return True

    async def writer(ledger_id: int) -> None:
        in_flight: set[asyncio.Task[bool]] = set()
        state = ledgers[ledger_id]
        while True:
            count = rng.randint(1, 20)
            entries = list(range(state.next_entry, state.next_entry + count))
            state.next_entry += count
            in_flight.add(asyncio.create_task(one_call(ledger_id, entries)))
            if len(in_flight) >= 4:
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                if not all(t.result() for t in done):
                    break
        for task in in_flight:
            await task

    await asyncio.gather(*(writer(ledger_id) for ledger_id in ledgers))


async def check(
    client: BookieClient, ledgers: dict[int, Ledger], since: dict[int, int] | None = None
) -> tuple[int, int]:
    """Every acknowledged entry (from ``since``) is intact; every other one intact or absent."""
    intact = absent_unacked = 0
    for ledger_id, state in ledgers.items():
        entry = since[ledger_id] if since else 0
        while entry < state.next_entry:
            try:
                result = await client.read_entries(
                    ledger_id, entry, state.next_entry - 1, max_bytes=4 * 1024 * 1024
                )
            except (NoSuchEntryError, NoSuchLedgerError):
                assert entry not in state.acked, f"acknowledged entry {ledger_id}/{entry} lost"
                absent_unacked += 1
                entry += 1
                continue
            for stored in result.entries:
                assert stored.entry_id == entry
                assert stored.payload == payload_of(ledger_id, entry), (
                    f"entry {ledger_id}/{entry} reads back different bytes"
                )
                assert stored.crc32c == entry_checksum(
                    ledger_id, entry, stored.last_add_confirmed, stored.payload
                )
                intact += 1
                entry += 1
    return intact, absent_unacked


@pytest.mark.soak  # 30 s; tests/verify/test_verify.py SIGKILLs bookies under load on every run
async def test_no_acknowledged_entry_is_lost_over_many_sigkills(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    ledgers = {1000 + i: Ledger() for i in range(LEDGERS)}
    bookie = BookieNode(
        tmp_path / "bookie",
        etcd_server.url,
        log_path=tmp_path / "bookie.log",
        extra_args=STORAGE_ARGS,
    )
    await bookie.start()
    totals = []
    checked_up_to = dict.fromkeys(ledgers, 0)
    try:
        for round_number in range(KILLS):
            client = BookieClient(bookie.data_address)
            writing = asyncio.create_task(write_until_killed(client, ledgers, rng))
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            await bookie.kill()
            await asyncio.wait_for(writing, 30)
            await client.close()

            await bookie.start()
            client = BookieClient(bookie.data_address)
            # what this round wrote, each time; everything from the start every fifth round,
            # so that earlier entries are shown to survive the later crashes too
            everything = round_number % 5 == 4
            intact, absent = await check(client, ledgers, None if everything else checked_up_to)
            checked_up_to = {ledger_id: s.next_entry for ledger_id, s in ledgers.items()}
            await client.close()
            acked = sum(len(s.acked) for s in ledgers.values())
            totals.append((round_number, acked, intact, absent))
            if everything:
                assert intact >= acked
    finally:
        await bookie.stop()
    acked_total = sum(len(s.acked) for s in ledgers.values())
    # the kills landed while adds were flowing: there were acknowledged entries to lose
    assert acked_total > 1000, totals
    print(f"{KILLS} SIGKILLs; acknowledged entries: {acked_total}; rounds: {totals}")
