"""``magnetar cluster ledger ID --metadata URL`` shows a ledger's properties, among them the one
ledger recovery leaves when it met a last-add-confirmed that no replica backed (issue 23)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from bookie.client.ledger_client import UNBACKED_LAC_PROPERTY
from bookie.client.ledger_metadata import INTENDED_ENSEMBLE_PROPERTY, LedgerMetadataStore
from metadata import open_store

ENV = {k: v for k, v in os.environ.items() if not k.startswith("MAGNETAR_")}


async def magnetar(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "magnetar.cli",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=ENV,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return await process.wait(), out.decode(errors="replace"), err.decode(errors="replace")


async def test_cluster_ledger_shows_the_property_an_unbacked_lac_leaves(tmp_path: Path) -> None:
    url = f"embedded://{tmp_path / 'metadata'}"
    store = await open_store(url)
    try:
        note = b"1099511627776 reported by b1; no replica held entry 1099511627776, closed at 9"
        created = await LedgerMetadataStore(store).create(
            3, 2, 2, ["b1", "b2", "b3"], custom={UNBACKED_LAC_PROPERTY: note}
        )
    finally:
        await store.close()
    code, out, err = await magnetar("cluster", "ledger", str(created.ledger_id), "--metadata", url)
    assert code == 0, err
    assert f"{UNBACKED_LAC_PROPERTY}=1099511627776 reported by b1" in out
    code, out, err = await magnetar(
        "cluster", "ledger", str(created.ledger_id), "--metadata", url, "--json"
    )
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["properties"] == f"{UNBACKED_LAC_PROPERTY}={note.decode()}"


async def test_cluster_ledgers_show_which_ledgers_are_under_striped(tmp_path: Path) -> None:
    url = f"embedded://{tmp_path / 'metadata'}"
    store = await open_store(url)
    try:
        ledgers = LedgerMetadataStore(store)
        full = await ledgers.create(3, 2, 2, ["b1", "b2", "b3"])
        narrow = await ledgers.create(
            2, 2, 2, ["b1", "b3"], custom={INTENDED_ENSEMBLE_PROPERTY: b"3"}
        )
    finally:
        await store.close()
    code, out, err = await magnetar("cluster", "ledgers", "--metadata", url, "--json")
    assert code == 0, err
    rows = {row["ledger"]: row for row in json.loads(out)}
    assert rows[full.ledger_id]["striping"] == "full"
    assert rows[narrow.ledger_id]["striping"] == "under-striped (2 of 3)"
    assert rows[narrow.ledger_id]["quorums"] == "E2/Qw2/Qa2"
