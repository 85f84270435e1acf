"""Finding positions in a managed ledger: by offset, by publish time, where a cursor starts,
and the offset a position stands at (known without a read where it can be)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from broker.managed_ledger.cache import EntryCache
from broker.managed_ledger.state import Lifecycle, LogState
from broker.managed_ledger.types import Entry, Position, StartAt, check_position
from magnetar.common.errors import InvalidArgumentError


class Seeker:
    """Finds positions and offsets of one managed ledger."""

    def __init__(
        self,
        name: str,
        *,
        life: Lifecycle,
        log_state: LogState,
        cache: EntryCache,
        read_one: Callable[[Position], Awaitable[Entry]],
    ) -> None:
        self._name = name
        self._life = life
        self._log_state = log_state
        self._cache = cache
        self._read_one = read_one

    @property
    def first_position(self) -> Position:
        return self._log_state.ledgers.first_position()

    @property
    def earliest_offset(self) -> int:
        """The first offset still stored (the next offset when nothing is stored)."""
        ledgers = self._log_state.ledgers
        return ledgers[0].first_offset if ledgers else self._log_state.confirmed_next_offset

    async def position_for_offset(self, offset: int) -> Position:
        """See :meth:`ManagedLedger.position_for_offset`."""
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidArgumentError(
                f"an offset is an int >= 0, got {offset!r}", context={"offset": repr(offset)}
            )
        self._life.check_readable()
        if offset >= self._log_state.confirmed_next_offset:
            return self._log_state.ledgers.next_write_position()
        if offset < self.earliest_offset:
            return self.first_position
        ledger = self._log_state.ledgers.holding_offset(offset)
        if ledger is None:
            return self.first_position
        ledger_id = ledger.ledger_id
        lo, hi = 0, ledger.entries - 1
        while lo < hi:  # the last entry whose first offset is <= offset
            mid = (lo + hi + 1) // 2
            entry = await self._read_one(Position(ledger_id, mid))
            if entry.first_offset <= offset:
                lo = mid
            else:
                hi = mid - 1
        return Position(ledger_id, lo)

    async def position_for_publish_time(self, time_ms: int) -> Position:
        """See :meth:`ManagedLedger.position_for_publish_time`."""
        if not isinstance(time_ms, int) or isinstance(time_ms, bool):
            raise InvalidArgumentError(
                f"a publish time is an int of ms since the epoch, got {time_ms!r}",
                context={"time_ms": repr(time_ms)},
            )
        self._life.check_readable()
        for ledger in list(self._log_state.ledgers):
            if ledger.entries == 0 or ledger.last_publish_time_ms < time_ms:
                continue
            ledger_id = ledger.ledger_id
            lo, hi = 0, ledger.entries - 1
            while lo < hi:  # publish times never decrease: the first one >= time_ms
                mid = (lo + hi) // 2
                entry = await self._read_one(Position(ledger_id, mid))
                if entry.publish_time_ms >= time_ms:
                    hi = mid
                else:
                    lo = mid + 1
            return Position(ledger_id, lo)
        return self._log_state.ledgers.next_write_position()

    def offset_hint(self, position: Position) -> int | None:
        """The offset of the last message at or before ``position``, if known without a read."""
        if position < self.first_position:
            return self.earliest_offset - 1
        if position >= self._log_state.last_confirmed:
            return self._log_state.confirmed_next_offset - 1
        ledgers = self._log_state.ledgers
        i = ledgers.find(position.ledger_id)
        if i is not None:
            ledger = ledgers[i]
            if position.entry_id < 0:
                return ledger.first_offset - 1
            if position.entry_id == ledger.entries - 1:
                return ledger.first_offset + ledger.messages - 1
        entry = self._cache.peek(position)
        return entry.last_offset if entry is not None else None

    async def offset_through(self, position: Position) -> int:
        """The offset of the last message at or before ``position`` (reads an entry if needed)."""
        hint = self.offset_hint(position)
        if hint is not None:
            return hint
        if self._log_state.ledgers.is_entry(position):
            return (await self._read_one(position)).last_offset
        ledgers = self._log_state.ledgers
        located = ledgers.locate(position)
        if located is None:
            return self._log_state.confirmed_next_offset - 1
        i, at = located
        ledger = ledgers[i]
        if at.entry_id >= ledger.entries:
            return ledger.first_offset + ledger.messages - 1
        return (await self._read_one(at)).first_offset - 1

    def start_hint(self, start: StartAt) -> tuple[Position, int | None, Position]:
        """Mark-delete, its offset (if known without a read) and the read position of a cursor
        that starts at ``start``."""
        ledgers = self._log_state.ledgers
        if start == "latest":
            mark_delete = self._log_state.last_confirmed
            return (
                mark_delete,
                self._log_state.confirmed_next_offset - 1,
                ledgers.next_position(mark_delete),
            )
        first = self.first_position
        if start == "earliest":
            position = first
        elif isinstance(start, tuple):
            position = check_position(start, "start")
        else:
            raise InvalidArgumentError(
                f"a cursor starts at a Position, 'earliest' or 'latest', got {start!r}",
                context={"start": repr(start)},
            )
        if position <= first:
            return Position(first.ledger_id, first.entry_id - 1), self.earliest_offset - 1, first
        if position > self._log_state.last_confirmed:
            mark_delete = self._log_state.last_confirmed
            return (
                mark_delete,
                self._log_state.confirmed_next_offset - 1,
                ledgers.next_position(mark_delete),
            )
        located = ledgers.locate(position)
        assert located is not None  # position <= last_confirmed, which is in a ledger
        _, position = located
        mark_delete = Position(position.ledger_id, position.entry_id - 1)
        return mark_delete, self.offset_hint(mark_delete), position

    async def start_state(self, start: StartAt) -> tuple[Position, int, Position]:
        """As :meth:`start_hint`, with the offset exact (read if needed)."""
        mark_delete, offset, read_position = self.start_hint(start)
        if offset is None:
            offset = await self.offset_through(mark_delete)
        return mark_delete, offset, read_position

    def offset_floor(self, position: Position) -> int:
        """A lower bound of the offset of the last message at or before ``position``."""
        ledgers = self._log_state.ledgers
        i = ledgers.find(position.ledger_id)
        return (ledgers[i].first_offset if i is not None else self.earliest_offset) - 1

    def check_ackable(self, position: object) -> Position:
        """``position`` as a Position, if it is a confirmed entry (or before the first stored
        one); else :class:`InvalidArgumentError`."""
        self._life.check_readable()
        checked = check_position(position)
        last_confirmed = self._log_state.last_confirmed
        if checked > last_confirmed:
            raise InvalidArgumentError(
                f"position {tuple(checked)} is past the last confirmed entry"
                f" {tuple(last_confirmed)} of {self._name!r}",
                context={"name": self._name, "position": tuple(checked)},
            )
        if checked >= self.first_position and not self._log_state.ledgers.is_entry(checked):
            raise InvalidArgumentError(
                f"position {tuple(checked)} is not an entry of {self._name!r}",
                context={"name": self._name, "position": tuple(checked)},
            )
        return checked
