"""Seeking and the lifecycle, on a log in memory: no bookies, no metadata store.

:class:`Seeker` gets its entries through a ``read_one`` callable; here it reads from a list and
counts the reads, so the tests see which answers come without a read (offset hints) and which
need one.
"""

from __future__ import annotations

import pytest
import structlog

from broker.managed_ledger.cache import EntryCache
from broker.managed_ledger.ledger_list import LedgerList, LedgerRecord
from broker.managed_ledger.seeking import Seeker
from broker.managed_ledger.state import Lifecycle, LogState, State
from broker.managed_ledger.types import Entry, Position
from magnetar.common.errors import (
    InvalidArgumentError,
    ManagedLedgerClosedError,
    ManagedLedgerFencedError,
)

NAME = "t/ns/seek-partition-0"
# messages per entry of each ledger; the last ledger is the one being written (empty)
LAYOUT = {10: [1, 2, 3], 12: [1, 2], 15: []}


class Log:
    def __init__(self, trimmed: int = 0) -> None:
        self.entries: dict[Position, Entry] = {}
        records = []
        offset = 0
        publish = 1_000
        for ledger_id, sizes in LAYOUT.items():
            record = LedgerRecord(ledger_id, offset, created_ms=0)
            for entry_id, n in enumerate(sizes):
                position = Position(ledger_id, entry_id)
                self.entries[position] = Entry(position, b"x" * n, offset, n, publish)
                record.entries += 1
                record.size_bytes += n
                record.messages += n
                record.last_publish_time_ms = publish
                offset += n
                publish += 10
            records.append(record)
        self.next_offset = offset
        self.last = max(self.entries)
        self.life = Lifecycle(NAME, structlog.get_logger("test"))
        self.state = LogState(LedgerList(records[trimmed:]), self.last, offset)
        self.reads = 0
        self.seeker = Seeker(
            NAME,
            life=self.life,
            log_state=self.state,
            cache=EntryCache(1 << 20),
            read_one=self.read_one,
        )

    async def read_one(self, position: Position) -> Entry:
        self.reads += 1
        return self.entries[position]


async def test_every_offset_is_found_in_the_entry_holding_it() -> None:
    log = Log()
    for position, entry in log.entries.items():
        for offset in range(entry.first_offset, entry.last_offset + 1):
            assert await log.seeker.position_for_offset(offset) == position
    # not written yet: where the next entry goes
    assert await log.seeker.position_for_offset(log.next_offset) == Position(15, 0)
    assert await log.seeker.position_for_offset(10**9) == Position(15, 0)


async def test_trimmed_offsets_give_the_first_stored_entry() -> None:
    log = Log(trimmed=1)
    assert log.seeker.earliest_offset == 6
    assert log.seeker.first_position == Position(12, 0)
    for offset in range(6):
        assert await log.seeker.position_for_offset(offset) == Position(12, 0)
    assert await log.seeker.position_for_offset(7) == Position(12, 1)


async def test_publish_times_find_the_first_entry_at_or_after() -> None:
    log = Log()
    for position, entry in log.entries.items():
        assert await log.seeker.position_for_publish_time(entry.publish_time_ms) == position
        assert await log.seeker.position_for_publish_time(entry.publish_time_ms - 5) == position
    last = log.entries[log.last].publish_time_ms
    assert await log.seeker.position_for_publish_time(last + 1) == Position(15, 0)
    assert await log.seeker.position_for_publish_time(0) == Position(10, 0)


async def test_bad_offsets_and_times_are_refused_by_name() -> None:
    log = Log()
    with pytest.raises(InvalidArgumentError, match="offset"):
        await log.seeker.position_for_offset(-1)
    with pytest.raises(InvalidArgumentError, match="publish time"):
        await log.seeker.position_for_publish_time("yesterday")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="cursor starts at"):
        log.seeker.start_hint("middle")  # type: ignore[arg-type]


async def test_cursor_starts_and_their_offsets() -> None:
    log = Log()
    seeker = log.seeker
    assert seeker.start_hint("earliest") == (Position(10, -1), -1, Position(10, 0))
    assert seeker.start_hint("latest") == (Position(12, 1), 8, Position(15, 0))
    # past the end: as latest
    assert seeker.start_hint(Position(99, 0)) == (Position(12, 1), 8, Position(15, 0))
    # at a ledger's first entry: the offset before it is known without a read
    assert seeker.start_hint(Position(12, 0)) == (Position(12, -1), 5, Position(12, 0))
    # in the middle of a ledger, nothing cached: unknown until read
    assert seeker.start_hint(Position(10, 2)) == (Position(10, 1), None, Position(10, 2))
    assert log.reads == 0
    assert await seeker.start_state(Position(10, 2)) == (Position(10, 1), 2, Position(10, 2))
    assert log.reads == 1


async def test_offset_hints_and_offsets_through_positions() -> None:
    log = Log()
    seeker = log.seeker
    assert seeker.offset_hint(Position(1, 0)) == -1  # before everything stored
    assert seeker.offset_hint(Position(12, 1)) == 8  # the last confirmed entry
    assert seeker.offset_hint(Position(10, 2)) == 5  # a ledger's last entry
    assert seeker.offset_hint(Position(12, -1)) == 5  # just before a ledger
    assert seeker.offset_hint(Position(10, 1)) is None
    assert await seeker.offset_through(Position(10, 1)) == 2
    assert log.reads == 1
    assert seeker.offset_floor(Position(10, 1)) == -1
    assert seeker.offset_floor(Position(12, 1)) == 5


async def test_only_confirmed_entries_are_ackable() -> None:
    log = Log()
    assert log.seeker.check_ackable((10, 1)) == Position(10, 1)
    with pytest.raises(InvalidArgumentError, match="past the last confirmed entry"):
        log.seeker.check_ackable(Position(15, 0))
    with pytest.raises(InvalidArgumentError, match="not an entry"):
        log.seeker.check_ackable(Position(11, 0))


async def test_fencing_tells_once_and_every_check_fails_from_then_on() -> None:
    log = Log()
    told: list[ManagedLedgerFencedError] = []
    log.life.on_fenced = told.append
    live_before = log.life.live
    log.life.check_usable()
    log.life.fence("the info changed")
    log.life.fence("again")
    assert live_before
    assert len(told) == 1
    assert log.life.fenced.is_set()
    assert (log.life.live, log.life.stopped) == (False, True)
    with pytest.raises(ManagedLedgerFencedError, match="another owner"):
        log.life.check_usable()
    log.life.check_readable()  # a fenced managed ledger still reads
    log.life.state = State.CLOSED
    with pytest.raises(ManagedLedgerClosedError, match="is closed"):
        await log.seeker.position_for_offset(0)
