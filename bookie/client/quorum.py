"""Pure quorum logic of the ledger client: ack tracking, LAC, and recovery decisions.

No I/O here: these classes decide, and the handles do the sending and receiving.

**Acks and LAC.** Entry ``e`` is complete once ``Qa`` bookies of its current write set have
acknowledged it. The last add confirmed (LAC) is the highest entry such that it and every
earlier one are complete. Entries complete in order: an entry that reached Qa before an earlier
one waits for it.

**Fencing.** A recovering client must be sure that the old writer can no longer reach Qa
acknowledgements for any new entry. Each write quorum (the Qw bookies starting at each position
of the ensemble) must have at least ``Qw - Qa + 1`` fenced members, so that fewer than Qa
unfenced ones remain in it.

**Recovery reads.** After fencing, an entry past the LAC is *found* if any replica returns it
intact. It is *absent* if at least ``Qw - Qa + 1`` replicas of its write set say they do not
hold it: then it cannot have reached Qa acks, so the writer never acknowledged it. Anything in
between is *unknown*, and recovery must wait and retry rather than guess.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from bookie.client.ledger_metadata import write_set_indexes


@dataclass(slots=True)
class _Acks:
    write_set: frozenset[str]
    acked: set[str] = field(default_factory=set)


class AckTracker:
    """Acks of the entries in flight and the LAC they add up to."""

    def __init__(self, ack_quorum: int, last_add_confirmed: int = -1) -> None:
        self.ack_quorum = ack_quorum
        self.last_add_confirmed = last_add_confirmed
        self._pending: dict[int, _Acks] = {}

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def pending(self) -> list[int]:
        return sorted(self._pending)

    def track(self, entry_id: int, write_set: Iterable[str]) -> None:
        """Start waiting for ``entry_id``'s acks from ``write_set``."""
        if entry_id <= self.last_add_confirmed or entry_id in self._pending:
            raise ValueError(f"entry {entry_id} is already tracked or complete")
        self._pending[entry_id] = _Acks(frozenset(write_set))

    def write_set(self, entry_id: int) -> frozenset[str]:
        return self._pending[entry_id].write_set

    def ack(self, entry_id: int, bookie: str) -> bool:
        """Record an ack; False if it does not count (entry done, or bookie not in its set)."""
        acks = self._pending.get(entry_id)
        if acks is None or bookie not in acks.write_set:
            return False
        acks.acked.add(bookie)
        return True

    def is_complete(self, entry_id: int) -> bool:
        """Whether ``entry_id`` has its Qa acks (or is at or below the LAC)."""
        acks = self._pending.get(entry_id)
        if acks is None:
            return entry_id <= self.last_add_confirmed
        return len(acks.acked) >= self.ack_quorum

    def advance(self) -> list[int]:
        """Move the LAC over every entry now complete in order; returns those entries."""
        done: list[int] = []
        while True:
            following = self.last_add_confirmed + 1
            acks = self._pending.get(following)
            if acks is None or len(acks.acked) < self.ack_quorum:
                return done
            del self._pending[following]
            self.last_add_confirmed = following
            done.append(following)

    def replace_bookie(self, from_entry: int, old: str, new: str) -> list[int]:
        """Entries >= ``from_entry`` now go to ``new`` instead of ``old`` (an ensemble change):
        ``old``'s acks no longer count for them. Returns the entries to send to ``new``."""
        moved = []
        for entry_id, acks in self._pending.items():
            if entry_id >= from_entry and old in acks.write_set:
                acks.write_set = (acks.write_set - {old}) | {new}
                acks.acked.discard(old)
                moved.append(entry_id)
        return sorted(moved)

    def unacked_by(self, bookie: str) -> list[int]:
        """Pending entries ``bookie`` is asked to store and has not acknowledged."""
        return sorted(
            e
            for e, acks in self._pending.items()
            if bookie in acks.write_set and bookie not in acks.acked
        )


def fencing_complete(
    ensemble_size: int, write_quorum: int, ack_quorum: int, fenced: Iterable[int]
) -> bool:
    """Whether the fenced ensemble positions leave no write quorum able to reach Qa."""
    fenced_set = set(fenced)
    needed = write_quorum - ack_quorum + 1
    return all(
        len(set(write_set_indexes(start, ensemble_size, write_quorum)) & fenced_set) >= needed
        for start in range(ensemble_size)
    )


def fencing_impossible(
    ensemble_size: int, write_quorum: int, ack_quorum: int, failed: Iterable[int]
) -> bool:
    """Whether too many positions failed for fencing to ever complete."""
    failed_set = set(failed)
    needed = write_quorum - ack_quorum + 1
    return any(
        write_quorum - len(set(write_set_indexes(start, ensemble_size, write_quorum)) & failed_set)
        < needed
        for start in range(ensemble_size)
    )


class EntryFate(enum.Enum):
    FOUND = "found"
    ABSENT = "absent"
    UNKNOWN = "unknown"


def entry_fate(write_quorum: int, ack_quorum: int, *, found: bool, not_held: int) -> EntryFate:
    """What recovery may conclude about one entry past the LAC (see the module docstring)."""
    if found:
        return EntryFate.FOUND
    if not_held >= write_quorum - ack_quorum + 1:
        return EntryFate.ABSENT
    return EntryFate.UNKNOWN
