"""Acknowledgement state of one partition's consumer: batch tracking and grouping. Pure: no I/O.

The broker's cursor tracks *entries*; a producer's batch of k messages is one entry. So the
client tracks the messages of each batch it delivered and acknowledges the entry only once every
one of them is acknowledged (:class:`BatchAckTracker`):

- individual ack of message ``(L, E, i)``: index ``i`` is marked; when every index of the entry's
  latest delivery is marked, entry ``(L, E)`` is acked individually.
- cumulative ack of ``(L, E, i)``: everything before entry ``(L, E)`` is covered, and indexes
  ``0..i`` of ``(L, E)`` are marked. If that completes the entry, the client acks ``(L, E)``
  cumulatively. Otherwise it acks cumulatively the entry delivered just before ``(L, E)`` on
  this partition (or ``(L, E - 1)``, which exists since a ledger's entry ids are dense, when that
  is not known; nothing when ``E`` is 0 too: the broker accepts only stored positions, and what
  came before was acknowledged already or the broker would have delivered it first), and the
  entry is acked once its other messages are.
- when an entry is delivered again (a redelivery after a nack, a reconnect or a seek), the
  messages already acknowledged are not handed to the application again.

A message that is alone in its entry needs no tracking: its ack is the entry's ack.

Acks are not sent one by one: :class:`AckGroup` gathers entry acks, the highest cumulative ack
and negative acks until the consumer flushes them in one stream message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["AckGroup", "BatchAckTracker", "Entry"]

Entry = tuple[int, int]
"""``(ledger_id, entry_id)``: what the broker's cursor tracks."""


@dataclass(slots=True)
class _TrackedBatch:
    batch_size: int
    delivered: frozenset[int] = frozenset()
    acked: set[int] = field(default_factory=set)
    previous: Entry | None = None
    """The entry delivered just before this one on the partition, when known."""

    def complete(self) -> bool:
        return self.delivered <= self.acked


class BatchAckTracker:
    """Which messages of each delivered multi-message entry are still unacknowledged."""

    def __init__(self) -> None:
        self._batches: dict[Entry, _TrackedBatch] = {}
        self._last_delivered: Entry | None = None

    def __len__(self) -> int:
        """Entries with unacknowledged messages."""
        return len(self._batches)

    def delivered(
        self, entry: Entry, batch_size: int, batch_indexes: Sequence[int] = ()
    ) -> tuple[list[int], bool]:
        """An entry arrived: the indexes to hand to the application, and whether the entry is
        already fully acknowledged (then the caller acks it again and hands nothing over).

        ``batch_indexes`` empty means every message of the entry is for this consumer.
        """
        if batch_indexes:
            wanted = sorted({i for i in batch_indexes if 0 <= i < batch_size})
        else:
            wanted = list(range(batch_size))
        previous = self._last_delivered
        if previous is None or entry > previous:
            self._last_delivered = entry
        else:
            previous = None  # a redelivery: what came before it is not known
        tracked = self._batches.get(entry)
        if tracked is None:
            if batch_size > 1:
                self._batches[entry] = _TrackedBatch(
                    batch_size, frozenset(wanted), previous=previous
                )
            return wanted, False
        tracked.delivered = frozenset(wanted)
        fresh = [i for i in wanted if i not in tracked.acked]
        if not fresh:
            del self._batches[entry]
            return [], True
        return fresh, False

    def ack(self, entry: Entry, batch_index: int) -> bool:
        """Mark one message acknowledged; True when its entry should now be acked.

        An entry-level id (``batch_index`` -1) or an entry this tracker does not hold (a
        single-message entry, or one acknowledged already) is acked as a whole.
        """
        tracked = self._batches.get(entry)
        if tracked is None:
            return True
        if batch_index < 0:
            del self._batches[entry]
            return True
        tracked.acked.add(batch_index)
        if tracked.complete():
            del self._batches[entry]
            return True
        return False

    def ack_cumulative(self, entry: Entry, batch_index: int) -> Entry | None:
        """Mark every message up to ``(entry, batch_index)``; the entry to ack cumulatively
        (None: nothing to send yet)."""
        for earlier in [e for e in self._batches if e < entry]:
            del self._batches[earlier]
        tracked = self._batches.get(entry)
        if tracked is None or batch_index < 0:
            self._batches.pop(entry, None)
            return entry
        tracked.acked.update(range(batch_index + 1))
        if tracked.complete():
            del self._batches[entry]
            return entry
        if tracked.previous is not None:
            return tracked.previous
        ledger_id, entry_id = entry
        return (ledger_id, entry_id - 1) if entry_id > 0 else None

    def clear(self) -> None:
        """Forget everything (after a seek: what comes next is a new history)."""
        self._batches.clear()
        self._last_delivered = None


class AckGroup:
    """Acks and negative acks waiting to be sent, in the order they were made."""

    def __init__(self) -> None:
        self._individual: dict[Entry, None] = {}
        self._cumulative: Entry | None = None
        self._nacks: dict[Entry, None] = {}

    def __len__(self) -> int:
        return len(self._individual) + len(self._nacks) + (self._cumulative is not None)

    def add_individual(self, entry: Entry) -> None:
        self._individual[entry] = None
        self._nacks.pop(entry, None)

    def set_cumulative(self, entry: Entry) -> None:
        """Only the highest cumulative ack matters: it covers every lower one."""
        if self._cumulative is None or entry > self._cumulative:
            self._cumulative = entry

    def add_nack(self, entry: Entry) -> None:
        if entry not in self._individual:
            self._nacks[entry] = None

    def extend(
        self, individual: Iterable[Entry], cumulative: Entry | None, nacks: Iterable[Entry] = ()
    ) -> None:
        """Put back what :meth:`take` returned (a flush that never reached the broker)."""
        for entry in individual:
            self._individual.setdefault(entry, None)
        if cumulative is not None:
            self.set_cumulative(cumulative)
        for entry in nacks:
            self.add_nack(entry)

    def take(self) -> tuple[list[Entry], Entry | None, list[Entry]]:
        """Everything waiting: (individual acks, cumulative ack, negative acks); empties it."""
        taken = (list(self._individual), self._cumulative, list(self._nacks))
        self._individual = {}
        self._cumulative = None
        self._nacks = {}
        return taken
