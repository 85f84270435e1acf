"""A ledger's writer fails (not fenced): close it where it is confirmed (or recover it),
complete what is in it, move the rest.

Three bookies and E3/Qw2/Qa2: a writer that loses a bookie has no replacement, stops at once,
the ledger is closed at its last confirmed entry and the rest goes to a new ledger on the two
bookies left (under-striped). With a second bookie gone too, no ledger can be made (fewer than
Qw writable): the managed ledger says why, and goes on once a bookie is back.

With under-striped ledgers off and E=Qw=Qa=3, the writer fails every pending add after
``ensemble_change_timeout_ms`` and the ledger is recovered. Both ways an unconfirmed entry can
end are shown:

- one bookie down: entries sent during the outage reached the other two; recovery (once the
  bookie is back, so that re-adding them reaches Qa) finds them, so they complete in the old
  ledger;
- every bookie down: entries sent during the outage reached none; recovery closes the old ledger
  before them, so they are written again, same bytes and same offsets, to the new ledger.

Either way every append completes, once, with dense offsets in call order.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bookie.client.ledger_metadata import LedgerState
from broker.managed_ledger import AppendResult, ManagedLedger
from magnetar.common.errors import MagnetarError
from magnetar.testing.eventually import eventually
from tests.broker.managed_ledger.conftest import (
    FAST,
    Env,
    HeaderCodec,
    append,
    body_of,
)

pytestmark = pytest.mark.parametrize("ml_env", ["real"], indirect=True)
"""Stopping bookies and reading replicas: real bookies (see conftest)."""

QUORUMS = replace(FAST, ensemble_size=3, write_quorum=3, ack_quorum=3)


async def open_fragile(env: Env, **config: object) -> ManagedLedger:
    client = await env.new_client(
        ensemble_change_timeout_ms=300, add_timeout_ms=1000, read_timeout_ms=1000, **config
    )
    return await env.factory(client, config=QUORUMS).open("t")


async def check_log(ml: ManagedLedger, results: list[AppendResult], count: int) -> None:
    """Every append exactly once, in order, with the offsets its payload was built with."""
    assert [r.first_offset for r in results] == list(range(count))
    assert [r.position for r in results] == sorted(r.position for r in results)
    entries = await ml.read(ml.first_position, max_entries=10_000, max_bytes=1 << 30)
    assert [body_of(e.payload) for e in entries] == [b"m%d" % i for i in range(count)]
    assert [e.position for e in entries] == [r.position for r in results]
    codec = HeaderCodec()
    assert [codec.describe(e.payload).first_offset for e in entries] == list(range(count))


async def in_recovery(env: Env, ledger_id: int) -> bool:
    return (await env.client.ledgers.read(ledger_id)).state is LedgerState.IN_RECOVERY


async def test_entries_that_reached_some_bookies_complete_in_the_recovered_ledger(
    ml_env: Env,
) -> None:
    ml = await open_fragile(ml_env, under_striped_ledgers=False)
    before = [await f for f in [append(ml, b"m%d" % i) for i in range(20)]]
    failing = ml.ledgers[-1].ledger_id

    await ml_env.stop_bookie("b2")
    during = [append(ml, b"m%d" % i) for i in range(20, 30)]
    # the writer gives up on b2, the managed ledger starts recovering the ledger (which cannot
    # finish while b2 is away: re-added entries need all three acks)
    await eventually(lambda: in_recovery(ml_env, failing), what="recovery", interval_s=0.05)
    assert not any(f.done() for f in during)
    queued = [append(ml, b"m%d" % i) for i in range(30, 40)]  # go to the next ledger

    await ml_env.start_bookie("b2")  # same data, new port
    results = before + [await f for f in during + queued]

    assert all(r.position.ledger_id == failing for r in results[:30])
    assert all(r.position.ledger_id != failing for r in results[30:])
    metadata = await ml_env.client.ledgers.read(failing)
    assert metadata.closed
    assert metadata.last_entry_id == 29
    assert [lg.entries for lg in ml.ledgers][-2:] == [30, 10]
    await check_log(ml, results, 40)
    assert not ml.fenced.is_set()


async def test_entries_that_reached_no_bookie_move_to_a_new_ledger_unchanged(
    ml_env: Env,
) -> None:
    ml = await open_fragile(ml_env)
    before = [await f for f in [append(ml, b"m%d" % i) for i in range(20)]]
    failing = ml.ledgers[-1].ledger_id

    for bookie in ("b0", "b1", "b2"):
        await ml_env.stop_bookie(bookie)
    during = [append(ml, b"m%d" % i) for i in range(20, 35)]
    await eventually(
        lambda: ml.pending_appends == 15 and ml._life.state.value == "switching", interval_s=0.01
    )
    # recovery attempts fail (nothing to fence), and the managed ledger says so
    await eventually(lambda: ml.write_problem is not None, interval_s=0.01)
    assert not any(f.done() for f in during)

    for bookie in ("b0", "b1", "b2"):
        await ml_env.start_bookie(bookie)
    results = before + [await f for f in during]

    metadata = await ml_env.client.ledgers.read(failing)
    assert metadata.closed
    assert metadata.last_entry_id == 19  # nothing sent during the outage reached a bookie
    moved = results[20:]
    assert {r.position.ledger_id for r in moved} == {ml.ledgers[-1].ledger_id}
    assert [r.position.entry_id for r in moved] == list(range(15))
    assert [lg.entries for lg in ml.ledgers][-2:] == [20, 15]
    await check_log(ml, results, 35)


def problem_of(ml: ManagedLedger) -> MagnetarError | None:
    return ml.write_problem


async def test_a_lost_bookie_moves_writing_to_an_under_striped_ledger(ml_env: Env) -> None:
    client = await ml_env.new_client(add_timeout_ms=1000, read_timeout_ms=1000)
    # checks every 100 ms whether an under-striped ledger can be rolled to full width
    config = replace(FAST, ensemble_size=3, write_quorum=2, ack_quorum=2, trim_interval_ms=100)
    ml = await ml_env.factory(client, config=config).open("t")
    problems: list[str | None] = []
    ml.on_write_problem = lambda p: problems.append(p.message if p else None)
    before = [await f for f in [append(ml, b"m%d" % i) for i in range(20)]]
    first = ml.ledgers[-1].ledger_id
    assert not (await client.ledgers.read(first)).under_striped

    await ml_env.stop_bookie("b2")
    results = before + [await f for f in [append(ml, b"m%d" % i) for i in range(20, 40)]]
    second = ml.ledgers[-1].ledger_id
    assert second != first
    assert (await client.ledgers.read(first)).closed
    narrow = await client.ledgers.read(second)
    assert narrow.under_striped
    assert (narrow.ensemble_size, narrow.intended_ensemble_size) == (2, 3)
    assert (narrow.write_quorum, narrow.ack_quorum) == (2, 2)  # durability as before
    assert "b2" not in narrow.all_bookies()
    assert ml.write_problem is None
    await check_log(ml, results, 40)

    # below Qw: entries wait, and the managed ledger says why
    await ml_env.stop_bookie("b1")
    stuck = [append(ml, b"m%d" % i) for i in range(40, 50)]
    await eventually(lambda: ml.write_problem is not None, interval_s=0.01)
    assert not any(f.done() for f in stuck)
    problem = problem_of(ml)
    assert problem is not None
    assert "not enough writable bookies" in problem.message
    assert "1 writable (b0)" in problem.message
    assert "b1 unreachable" in problem.message
    assert ml.write_problem_since_ms > 0

    await ml_env.start_bookie("b1")
    results += [await f for f in stuck]
    assert ml.write_problem is None
    assert problems[0] is not None
    assert problems[-1] is None
    await check_log(ml, results, 50)

    # all three writable again: the under-striped ledger is rolled early, to full width
    await ml_env.start_bookie("b2")
    narrow_now = ml.ledgers[-1].ledger_id
    assert (await client.ledgers.read(narrow_now)).under_striped

    async def full_width() -> bool:
        current = ml.ledgers[-1].ledger_id
        return not (await client.ledgers.read(current)).under_striped

    await eventually(full_width, interval_s=0.01)
    assert (await client.ledgers.read(narrow_now)).closed
    results += [await f for f in [append(ml, b"m%d" % i) for i in range(50, 60)]]
    await check_log(ml, results, 60)
    assert (await client.ledgers.read(ml.ledgers[-1].ledger_id)).ensemble_size == 3
    assert not ml.fenced.is_set()
