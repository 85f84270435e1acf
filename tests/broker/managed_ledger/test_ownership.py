"""Ownership changes: a new owner recovers the last ledger, goes on densely, fences the old one."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from bookie.client.ledger_metadata import LedgerState
from broker.managed_ledger import BEFORE_EVERYTHING, ManagedLedgerFactory, Position
from magnetar.common.errors import ManagedLedgerFencedError
from magnetar.testing.eventually import eventually
from metadata.faults import FaultyMetadataStore
from tests.broker.managed_ledger.conftest import (
    FAST,
    Env,
    HeaderCodec,
    append,
    append_all,
    body_of,
)


@pytest.mark.parametrize("ml_env", ["fake", "real"], indirect=True)
async def test_a_new_owner_recovers_continues_and_fences_the_old_one(ml_env: Env) -> None:
    old_factory = ml_env.factory(config=replace(FAST, max_entries_per_ledger=30))
    old = await old_factory.open("public/default/t-partition-0")
    first = await append_all(old, [b"a%d" % i for i in range(45)], num_messages=2)
    old_last_ledger = old.ledgers[-1].ledger_id
    assert (await ml_env.client.ledgers.read(old_last_ledger)).state is LedgerState.OPEN

    # another broker (its own ledger client) takes over without the old one closing anything
    new_factory = ml_env.factory(await ml_env.new_client())
    new = await new_factory.open("public/default/t-partition-0")

    recovered = await ml_env.client.ledgers.read(old_last_ledger)
    assert recovered.state is LedgerState.CLOSED
    assert recovered.last_entry_id == 14  # entries 30..44 of the managed ledger
    assert [lg.ledger_id for lg in new.ledgers][:-1] == [lg.ledger_id for lg in old.ledgers]
    assert new.ledgers[-2].entries == 15
    assert new.ledgers[-2].messages == 30
    assert new.ledgers[-1].ledger_id > old_last_ledger  # a new ledger, empty
    assert new.ledgers[-1].entries == 0
    assert new.next_offset == 90
    assert new.last_confirmed == first[-1].position

    # offsets go on densely with the new owner
    more = await append_all(new, [b"b%d" % i for i in range(5)], num_messages=2)
    assert [r.first_offset for r in more] == [90, 92, 94, 96, 98]
    assert all(r.position.ledger_id == new.ledgers[-1].ledger_id for r in more)

    # the old owner learns on its next append: the bookies refuse it as fenced
    with pytest.raises(ManagedLedgerFencedError, match="taken over"):
        await append(old, b"too late")
    assert old.fenced.is_set()
    with pytest.raises(ManagedLedgerFencedError):
        append(old, b"and now it knows synchronously")

    # every entry once, in order
    entries = await new.read(new.first_position, max_entries=1000, max_bytes=1 << 30)
    assert [body_of(e.payload) for e in entries] == [b"a%d" % i for i in range(45)] + [
        b"b%d" % i for i in range(5)
    ]
    assert [e.first_offset for e in entries] == list(range(0, 100, 2))


async def test_an_idle_old_owner_is_fenced_by_its_next_metadata_write(ml_env: Env) -> None:
    old = await ml_env.factory().open("t")
    await append_all(old, [b"x"] * 3)
    cursor = await old.open_cursor("sub", start="earliest")
    new = await ml_env.factory(await ml_env.new_client()).open("t")
    assert "sub" in new.cursors
    # the old owner's cursor write compares the info version, which the new owner changed
    cursor.ack([old.first_position])
    with pytest.raises(ManagedLedgerFencedError):
        await cursor.flush()
    assert old.fenced.is_set()
    # the new owner's state was not touched
    assert new.cursors["sub"].mark_delete < old.first_position
    await new.cursors["sub"].flush()


async def test_two_owners_opening_at_once_one_wins(ml_env: Env) -> None:
    factories = [ml_env.factory(await ml_env.new_client()) for _ in range(2)]
    await (await factories[0].open("t")).close()
    results = await asyncio.gather(*(f.open("t") for f in factories), return_exceptions=True)
    winners = [r for r in results if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, BaseException)]
    assert len(winners) >= 1
    assert all(isinstance(e, ManagedLedgerFencedError) for e in losers)
    # whichever won last owns it; at most one instance can still write
    writable = []
    for ml in winners:
        try:
            await append(ml, b"probe")
            writable.append(ml)
        except ManagedLedgerFencedError:
            pass
    assert len(writable) == 1


async def test_an_empty_last_ledger_is_dropped_and_offsets_survive(ml_env: Env) -> None:
    factory = ml_env.factory()
    ml = await factory.open("t")
    await append_all(ml, [b"x"] * 4, num_messages=5)
    await ml.close()
    # closed with an empty current ledger? no: the one written holds the 4 entries
    ml = await factory.open("t")  # new (empty) ledger; closed again without writing
    empty_ledger = ml.ledgers[-1].ledger_id
    await ml.close()
    ml = await factory.open("t")
    assert empty_ledger not in [lg.ledger_id for lg in ml.ledgers]
    assert empty_ledger not in await ml_env.ledgers_in_metadata()
    assert [lg.entries for lg in ml.ledgers] == [4, 0]
    assert ml.next_offset == 20
    assert (await append(ml, b"y")).first_offset == 20


async def test_a_brand_new_managed_ledger_and_its_reopen_without_entries(ml_env: Env) -> None:
    factory = ml_env.factory()
    assert not await factory.exists("fresh")
    ml = await factory.open("fresh")
    assert await factory.exists("fresh")
    assert ml.last_confirmed == BEFORE_EVERYTHING
    assert ml.first_position == Position(ml.ledgers[0].ledger_id, 0)
    assert ml.next_position(ml.last_confirmed) == ml.first_position
    await ml.close()
    again = await factory.open("fresh")
    assert again.next_offset == 0
    assert len(again.ledgers) == 1


async def test_a_managed_ledger_still_closing_is_not_handed_out_again(ml_env: Env) -> None:
    # a broker that loses its session and wins the partition back at once (its new session
    # registers straight away) opens it again while the forced close of the old one is still
    # flushing: it must get a new instance, not the one about to be closed under it
    faulty = FaultyMetadataStore(ml_env.store)
    factory = ManagedLedgerFactory(faulty, ml_env.client, codec=HeaderCodec(), config=FAST)
    ml_env.factories.append(factory)
    first = await factory.open("t")
    await append_all(first, [b"x"] * 3)
    faulty.stall("txn", 0.5)
    closing = asyncio.create_task(first.close())
    await eventually(
        lambda: faulty.injected["txn"] > 0, interval_s=0.01
    )  # the close is held at its write
    faulty.heal()
    assert not first.closed

    second = await factory.open("t")
    await closing
    assert second is not first
    assert not second.closed
    assert (await append(second, b"y")).first_offset == 3


async def test_a_forced_close_given_up_during_the_reopen_still_yields_a_new_instance(
    ml_env: Env,
) -> None:
    faulty = FaultyMetadataStore(ml_env.store)
    factory = ManagedLedgerFactory(faulty, ml_env.client, codec=HeaderCodec(), config=FAST)
    ml_env.factories.append(factory)
    first = await factory.open("t")
    await append_all(first, [b"x"] * 3)
    faulty.stall("txn", 2.0)
    # a dropped partition gives its managed ledger a short while to close, then gives up
    forced = asyncio.create_task(asyncio.wait_for(first.close(), 0.3))
    await eventually(lambda: faulty.injected["txn"] > 0, interval_s=0.01)
    faulty.heal()

    second = await factory.open("t")
    with pytest.raises(TimeoutError):
        await forced
    assert first.closed
    assert second is not first
    assert not second.closed
    assert (await append(second, b"y")).first_offset == 3
