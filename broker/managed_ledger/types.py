"""The managed ledger's plain values: positions, entries, append results, ledger summaries.

These are what the broker sees; the persisted protobuf forms live in
:mod:`broker.managed_ledger.persistence` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from magnetar.common.errors import InvalidArgumentError


class Position(NamedTuple):
    """Where an entry lives: ordered by ``(ledger_id, entry_id)``.

    ``Position(-1, -1)`` is "before everything". ``Position(L, -1)`` is "just before the first
    entry of ledger L" (what a cursor that starts at the earliest entry has as mark-delete).
    """

    ledger_id: int
    entry_id: int


BEFORE_EVERYTHING = Position(-1, -1)

StartAt = Position | Literal["earliest", "latest"]
"""Where a new cursor starts reading: a position, the earliest stored entry, or the next one."""


@dataclass(frozen=True, slots=True)
class EntryMeta:
    """What the managed ledger needs to know of an entry's payload."""

    first_offset: int
    """Offset of the entry's first message."""
    num_messages: int
    """Messages in the entry (a batch holds several)."""
    publish_time_ms: int
    """Broker clock when the entry was appended."""
    key_hashes: tuple[int, ...] = ()
    """Routing hashes of the messages' keys: none, one for all, or one per message."""
    deliver_at_ms: int = 0
    """Deliver no earlier than this (ms since the epoch; 0: at once)."""
    payload_format: int = 0
    """How the payload is encoded, as the codec tags it (opaque here; 0: the codec's usual)."""


class EntryCodec(Protocol):
    """Describes entry payloads; the managed ledger never looks inside them otherwise."""

    def describe(self, payload: bytes) -> EntryMeta: ...


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry as read back: where it is, its bytes, and what the codec said of them."""

    position: Position
    payload: bytes
    first_offset: int
    num_messages: int
    publish_time_ms: int
    key_hashes: tuple[int, ...] = ()
    deliver_at_ms: int = 0
    payload_format: int = 0

    @property
    def last_offset(self) -> int:
        return self.first_offset + self.num_messages - 1


@dataclass(frozen=True, slots=True)
class DelayedEntry:
    """An entry a subscription holds aside until its delivery time, as its delay index keeps
    it: enough to deliver it when due without having read it again before."""

    position: Position
    deliver_at_ms: int
    num_messages: int
    key_hashes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an appended entry landed, once it is confirmed."""

    position: Position
    first_offset: int
    publish_time_ms: int


@dataclass(frozen=True, slots=True)
class LedgerInfo:
    """One ledger of a managed ledger, as persisted (the current ledger: its live counts)."""

    ledger_id: int
    entries: int
    size_bytes: int
    first_offset: int
    messages: int
    created_ms: int
    last_publish_time_ms: int


@dataclass(frozen=True, slots=True)
class ManagedLedgerSnapshot:
    """A managed ledger as its metadata describes it, for stats of one that is not open here.

    The counts of the last ledger are those last persisted (at its creation, a roll, a trim or
    a close); while an owner is writing it they lag behind.
    """

    name: str
    ledgers: tuple[LedgerInfo, ...]
    cursors: tuple[str, ...]
    terminated: bool = False
    exists: bool = True
    """False: no managed ledger of that name (never opened, or deleted); nothing else is set."""

    @property
    def storage_size_bytes(self) -> int:
        return sum(ledger.size_bytes for ledger in self.ledgers)

    @property
    def earliest_offset(self) -> int:
        return self.ledgers[0].first_offset if self.ledgers else 0

    @property
    def next_offset(self) -> int:
        if not self.ledgers:
            return 0
        last = self.ledgers[-1]
        return last.first_offset + last.messages


def check_position(position: object, what: str = "position") -> Position:
    """``position`` as a :class:`Position`, or a clear :class:`InvalidArgumentError`."""
    if (
        not isinstance(position, tuple)
        or len(position) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in position)
    ):
        raise InvalidArgumentError(
            f"{what} must be a Position(ledger_id, entry_id) of two ints, got {position!r}",
            context={"position": repr(position)},
        )
    ledger_id, entry_id = position
    if ledger_id < -1 or entry_id < -1:
        raise InvalidArgumentError(
            f"{what} {tuple(position)} is invalid: ledger and entry ids are >= -1",
            context={"position": repr(position)},
        )
    return Position(ledger_id, entry_id)
