"""A last-add-confirmed that no replica backs never leaves a managed ledger unopenable.

Issue 23, finding 8: an add whose LAC (2^40) was far past its own entry id was stored; after a
broker crash, recovery closed the ledger at 2^40 and the topic could never be opened again.
"""

from __future__ import annotations

import pytest

from bookie.client.bookie_client import BookieClient
from bookie.client.ledger_client import UNBACKED_LAC_PROPERTY
from bookie.client.ledger_metadata import LedgerState
from bookie.entries import AddEntry, entry_checksum
from magnetar.common.errors import InvalidArgumentError
from tests.broker.managed_ledger.conftest import Env, append_all, body_of, encode

pytestmark = pytest.mark.parametrize("ml_env", ["real"], indirect=True)
"""Stopping bookies and reading replicas: real bookies (see conftest)."""

FAR = 1 << 40


def stray(ledger_id: int, entry_id: int, lac: int) -> AddEntry:
    payload = encode(10**9, 1, 0, b"stray")
    return AddEntry(
        ledger_id, entry_id, lac, payload, entry_checksum(ledger_id, entry_id, lac, payload)
    )


async def test_a_stray_lac_neither_is_stored_nor_makes_the_topic_unopenable(ml_env: Env) -> None:
    old = await ml_env.factory().open("public/default/stray-lac")
    await append_all(old, [b"m%d" % i for i in range(5)])
    ledger_id = old.ledgers[-1].ledger_id
    metadata = await ml_env.client.ledgers.read(ledger_id)
    replica = ml_env.bookies[metadata.write_set(5)[0]]
    direct = BookieClient(replica.data_address)
    try:
        # the add of finding 8, as a buggy client would send it next: refused
        (refused,) = await direct.add_entries([stray(ledger_id, 5, FAR)])
        assert isinstance(refused.error, InvalidArgumentError)
        # one that passes that check, and still claims a LAC that nothing backs
        far_replica = ml_env.bookies[metadata.write_set(FAR + 1)[0]]
        far_client = BookieClient(far_replica.data_address)
        try:
            assert await far_client.add_entries([stray(ledger_id, FAR + 1, FAR)]) == []
        finally:
            await far_client.close()
    finally:
        await direct.close()

    # the owner "crashes" (closes nothing); another broker opens the topic
    new = await ml_env.factory(await ml_env.new_client()).open("public/default/stray-lac")
    recovered = await ml_env.client.ledgers.read(ledger_id)
    assert recovered.state is LedgerState.CLOSED
    assert recovered.last_entry_id == 4
    assert UNBACKED_LAC_PROPERTY in recovered.custom
    assert new.next_offset == 5
    entries = await new.read(new.first_position, max_entries=100, max_bytes=1 << 20)
    assert [body_of(e.payload) for e in entries] == [b"m%d" % i for i in range(5)]
    more = await append_all(new, [b"after"])
    assert more[0].first_offset == 5
