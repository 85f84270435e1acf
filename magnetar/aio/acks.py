"""Acknowledgement state of one partition's consumer: batch tracking, grouping and ack timeouts.
Pure: no I/O, no clock of its own.

The broker's cursor tracks *entries*; a producer's batch of k messages is one entry. So the
client tracks the messages of each batch it delivered and acknowledges the entry only once every
one of them is acknowledged (:class:`BatchAckTracker`):

- individual ack of message ``(L, E, i)``: index ``i`` is marked; when every index delivered of
  the entry is marked, the entry is acked: as a whole when every message of the entry is marked,
  otherwise (it was delivered in part: a key_shared subscription split it over consumers by key,
  or the broker redelivered only some of its messages) as a *partial* ack naming the marked
  indexes and the batch size, which the broker adds to what it knows of the entry.
- cumulative ack of ``(L, E, i)``: everything before entry ``(L, E)`` is covered, and indexes
  ``0..i`` of ``(L, E)`` are marked. If that completes the entry, the client acks ``(L, E)``
  cumulatively. Otherwise it acks cumulatively the entry delivered just before ``(L, E)`` on
  this partition (or ``(L, E - 1)``, which exists since a ledger's entry ids are dense, when that
  is not known; nothing when ``E`` is 0 too: the broker accepts only stored positions, and what
  came before was acknowledged already or the broker would have delivered it first), and the
  entry is acked once its other messages are.
- an entry delivered again while tracked adds its indexes to those delivered before (the union):
  a key_shared subscription may hand this consumer more messages of an entry it already holds
  when keys move, and a redelivery names the messages the broker still waits for. Messages
  already acknowledged are not handed to the application again.

A message that is alone in its entry needs no tracking: its ack is the entry's ack.

Acks are not sent one by one: :class:`AckGroup` gathers entry acks, the highest cumulative ack
and negative acks until the consumer flushes them in one stream message.

:class:`UnackedMessages` remembers when each message was handed to the application, so that the
consumer can ask the broker to redeliver those not acknowledged within the ack timeout.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["AckGroup", "BatchAckTracker", "Entry", "EntryAck", "UnackedMessages"]

Entry = tuple[int, int]
"""``(ledger_id, entry_id)``: what the broker's cursor tracks."""


@dataclass(frozen=True, slots=True)
class EntryAck:
    """An individual acknowledgement of one entry, as the broker is told of it."""

    entry: Entry
    batch_indexes: tuple[int, ...] = ()
    """Empty: the whole entry. Otherwise only these messages of it (a partial ack)."""
    batch_size: int = 0
    """Messages in the entry (for a partial ack)."""
    dead_lettered: int = 0
    """How many of the acknowledged messages went to the dead-letter topic."""

    @property
    def partial(self) -> bool:
        return bool(self.batch_indexes)

    def merged(self, other: EntryAck) -> EntryAck:
        """Both acks of the same entry in one: a whole ack covers any partial one."""
        dead_lettered = self.dead_lettered + other.dead_lettered
        if not self.partial or not other.partial:
            return EntryAck(self.entry, dead_lettered=dead_lettered)
        indexes = tuple(sorted({*self.batch_indexes, *other.batch_indexes}))
        size = max(self.batch_size, other.batch_size)
        if len(indexes) >= size:
            return EntryAck(self.entry, dead_lettered=dead_lettered)
        return EntryAck(self.entry, indexes, size, dead_lettered)


@dataclass(slots=True)
class _TrackedBatch:
    batch_size: int
    delivered: frozenset[int] = frozenset()
    acked: set[int] = field(default_factory=set)
    previous: Entry | None = None
    """The entry delivered just before this one on the partition, when known."""
    dead_lettered: int = 0
    """Messages of it acknowledged because they went to the dead-letter topic."""

    def complete(self) -> bool:
        return self.delivered <= self.acked

    def ack_of(self, entry: Entry) -> EntryAck:
        """The acknowledgement of everything marked so far."""
        if len(self.acked) >= self.batch_size:
            return EntryAck(entry, dead_lettered=self.dead_lettered)
        return EntryAck(entry, tuple(sorted(self.acked)), self.batch_size, self.dead_lettered)


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
    ) -> list[int]:
        """An entry arrived: the indexes to hand to the application (none when every message
        delivered was acknowledged already: the entry is still waiting for others, delivered
        before, and is acked once they are).

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
            return wanted
        tracked.delivered = tracked.delivered | frozenset(wanted)
        return [i for i in wanted if i not in tracked.acked]

    def ack(
        self, entry: Entry, batch_index: int, *, dead_lettered: bool = False
    ) -> EntryAck | None:
        """Mark one message acknowledged; the entry's ack when it is now complete (None: the
        entry waits for other messages).

        An entry-level id (``batch_index`` -1) or an entry this tracker does not hold (a
        single-message entry, or one acknowledged already) is acked as a whole.
        ``dead_lettered``: the message was moved to the dead-letter topic (counted on the ack).
        """
        tracked = self._batches.get(entry)
        if tracked is None:
            return EntryAck(entry, dead_lettered=int(dead_lettered))
        if batch_index < 0:
            del self._batches[entry]
            return EntryAck(entry, dead_lettered=tracked.dead_lettered + int(dead_lettered))
        if batch_index < tracked.batch_size and batch_index not in tracked.acked:
            tracked.acked.add(batch_index)
            tracked.dead_lettered += int(dead_lettered)
        if tracked.complete():
            del self._batches[entry]
            return tracked.ack_of(entry)
        return None

    def ack_cumulative(self, entry: Entry, batch_index: int) -> Entry | None:
        """Mark every message up to ``(entry, batch_index)``; the entry to ack cumulatively
        (None: nothing to send yet)."""
        for earlier in [e for e in self._batches if e < entry]:
            del self._batches[earlier]
        tracked = self._batches.get(entry)
        if tracked is None or batch_index < 0:
            self._batches.pop(entry, None)
            return entry
        tracked.acked.update(range(min(batch_index + 1, tracked.batch_size)))
        if tracked.complete():
            del self._batches[entry]
            return entry
        if tracked.previous is not None:
            return tracked.previous
        ledger_id, entry_id = entry
        return (ledger_id, entry_id - 1) if entry_id > 0 else None

    def acked_so_far(self, entry: Entry) -> EntryAck | None:
        """A partial ack of the messages of a tracked entry acknowledged so far (None: none
        are, or the entry is not tracked). Sent before the entry is given back to the broker
        (negative ack, ack timeout), so that its redelivery leaves those messages out; carries
        no dead-letter count (the entry's final ack does)."""
        tracked = self._batches.get(entry)
        if tracked is None or not tracked.acked:
            return None
        return EntryAck(entry, tuple(sorted(tracked.acked)), tracked.batch_size)

    def partially_acked(self) -> list[EntryAck]:
        """Partial acks of every tracked entry with some messages acknowledged: what a closing
        consumer tells the broker, so that a restart does not redeliver them."""
        return [tracked.ack_of(entry) for entry, tracked in self._batches.items() if tracked.acked]

    def clear(self) -> None:
        """Forget everything (after a seek: what comes next is a new history)."""
        self._batches.clear()
        self._last_delivered = None


class AckGroup:
    """Acks and negative acks waiting to be sent, in the order they were made."""

    def __init__(self) -> None:
        self._individual: dict[Entry, EntryAck] = {}
        self._cumulative: Entry | None = None
        self._nacks: dict[Entry, None] = {}

    def __len__(self) -> int:
        return len(self._individual) + len(self._nacks) + (self._cumulative is not None)

    def add_individual(self, ack: EntryAck) -> None:
        """An entry's ack (whole or partial); acks of the same entry merge."""
        entry = ack.entry
        known = self._individual.get(entry)
        self._individual[entry] = ack if known is None else known.merged(ack)
        if not ack.partial:
            self._nacks.pop(entry, None)

    def set_cumulative(self, entry: Entry) -> None:
        """Only the highest cumulative ack matters: it covers every lower one."""
        if self._cumulative is None or entry > self._cumulative:
            self._cumulative = entry

    def add_nack(self, entry: Entry) -> None:
        """Ask for the entry again; moot when the whole entry is acknowledged (a partial ack
        of it is sent first and the rest comes again)."""
        known = self._individual.get(entry)
        if known is None or known.partial:
            self._nacks[entry] = None

    def extend(self, individual: Iterable[EntryAck], cumulative: Entry | None) -> None:
        """Put back the acks :meth:`take` returned (a flush that never reached the broker)."""
        for ack in individual:
            self.add_individual(ack)
        if cumulative is not None:
            self.set_cumulative(cumulative)

    def take(self) -> tuple[list[EntryAck], Entry | None, list[Entry]]:
        """Everything waiting: (individual acks, cumulative ack, negative acks); empties it."""
        taken = (list(self._individual.values()), self._cumulative, list(self._nacks))
        self._individual = {}
        self._cumulative = None
        self._nacks = {}
        return taken


class UnackedMessages:
    """Messages handed to the application and not acknowledged yet, oldest first.

    Redelivery is asked per entry (the broker tracks entries), so an entry comes back as a
    whole once its oldest unacknowledged message is older than the timeout, and all its
    messages leave this tracker then.
    """

    def __init__(self) -> None:
        self._since: dict[tuple[int, int, int], float] = {}
        """``(ledger_id, entry_id, batch_index)`` -> when handed out; insertion is time order."""
        self._entries: dict[Entry, set[int]] = {}

    def __len__(self) -> int:
        return len(self._since)

    def add(self, entry: Entry, batch_index: int, now: float) -> None:
        key = (*entry, batch_index)
        self._since.pop(key, None)  # handed out again: the clock starts over, at the end
        self._since[key] = now
        self._entries.setdefault(entry, set()).add(batch_index)

    def remove(self, entry: Entry, batch_index: int) -> None:
        """Acknowledged or negatively acknowledged (``batch_index`` -1: the whole entry)."""
        indexes = self._entries.get(entry)
        if indexes is None:
            return
        if batch_index < 0:
            self._drop_entry(entry)
            return
        if batch_index in indexes:
            indexes.discard(batch_index)
            del self._since[(*entry, batch_index)]
            if not indexes:
                del self._entries[entry]

    def remove_up_to(self, entry: Entry, batch_index: int) -> None:
        """A cumulative ack: everything before ``(entry, batch_index)`` and it."""
        for earlier in [e for e in self._entries if e < entry]:
            self._drop_entry(earlier)
        indexes = self._entries.get(entry)
        if indexes is None:
            return
        if batch_index < 0:
            self._drop_entry(entry)
            return
        for index in [i for i in indexes if i <= batch_index]:
            self.remove(entry, index)

    def expired(self, deadline: float) -> list[Entry]:
        """Entries with a message handed out at or before ``deadline``, oldest first; they
        leave the tracker."""
        found: dict[Entry, None] = {}
        for (ledger_id, entry_id, _), since in self._since.items():
            if since > deadline:
                break
            found[(ledger_id, entry_id)] = None
        for entry in found:
            self._drop_entry(entry)
        return list(found)

    def clear(self) -> None:
        self._since.clear()
        self._entries.clear()

    def _drop_entry(self, entry: Entry) -> None:
        for index in self._entries.pop(entry, ()):
            del self._since[(*entry, index)]
