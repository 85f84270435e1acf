"""Which consumer of a subscription gets which messages: the decisions, without any I/O.

A :class:`Dispatcher` holds what a subscription knows about its consumers (:class:`Slot`: permits,
what each holds unacknowledged, limits) and about entries waiting to be delivered again
(``replay``) or later (``delayed``). The subscription reads entries and hands them to
:meth:`Dispatcher.assign`, which says who gets which messages; acks, negative acks and consumers
leaving come back through the methods below. Keeping this apart from the reads makes every rule
testable against a model (``tests/unit/broker/test_dispatch_model.py``).

The four subscription types:

- **exclusive**: one consumer; a second is refused (by the subscription).
- **failover**: many consumers, one *active* per partition: among those with the best (lowest)
  priority level, sorted by name, the one at ``partition % count``, so that the partitions of a
  topic spread over the consumers and every consumer computes the same choice. When the active
  consumer changes, the old one is told it is inactive, the new one that it is active, and the
  subscription rewinds to the first unacknowledged entry for the new one.
- **shared**: entries go round robin to consumers with permits; a consumer that leaves, nacks or
  asks for redelivery hands its unacknowledged entries to the others.
- **key_shared**: each message goes to the consumer its key hash maps to on a consistent-hash
  ring (100 points per consumer name, so a restarted consumer with the same name gets the same
  keys back). An entry whose messages have several keys is split (``batch_indexes``). When the
  set of consumers changes, keys move; a message whose key moved is held back until the consumer
  that holds earlier messages of that key acknowledges them or leaves (then they are redelivered
  first, in order), so per-key order holds and the other keys never wait. This is Pulsar 4's
  "draining hashes" rule; its older rule (new consumers wait for the whole subscription's
  mark-delete to pass their join point) is what got Pulsar key_shared subscriptions stuck when
  consumers restarted.

Whatever the type, a consumer holding ``max_unacked_per_consumer`` messages (and a subscription
at ``max_unacked_per_subscription``) gets nothing more until half are acknowledged, so a client
that never acknowledges cannot make the broker track an unbounded number of messages. A
non-durable reader acknowledges nothing and is tracked not at all (``track_unacked=False``): it
starts again from its own position when it reconnects.

Delayed delivery (``deliver_at_ms``) applies to shared and key_shared, as in Pulsar: such
entries wait in ``delayed`` until due (without taking permits, up to ``max_delayed_entries``,
after which no new entries are read); exclusive and failover deliver in log order at once. The
subscription tells its cursor how many wait (``parked_entries``), so that their holes do not
count towards the cursor's hole limit. Which of them are in which persisted bucket of the
subscription's delay index is :class:`~broker.service.delay_index.DelayIndex`'s to track:
every entry entering or leaving ``delayed`` is reported to it.

Redelivery counts are the cursor's (:class:`~broker.managed_ledger.RedeliveryCounts`, persisted
with it): an entry's count rises when it is taken back from a consumer, once per taking back
(``Held.counted`` marks a negative ack counted ahead of its delayed requeue).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from broker.managed_ledger import DelayedEntry, Position, RedeliveryCounts
from broker.service.delay_index import DelayIndex
from broker.service.streams import SubscriptionType
from magnetar.common.keys import expand_key_hashes

RING_POINTS = 100
"""Points each key_shared consumer has on the hash ring."""


@dataclass(slots=True)
class Held:
    """Messages of one entry a consumer holds unacknowledged."""

    indexes: frozenset[int] | None
    """The messages held (``None``: every message of the entry)."""
    count: int
    num_messages: int
    """Messages in the entry."""
    hashes: Sequence[int] = ()
    """key_shared: the key hash of every message of the entry (to release them on ack)."""
    counted: bool = False
    """Its redelivery count was already raised (a negative ack waiting out its delay)."""


@dataclass(slots=True)
class Pending:
    """Messages of one entry waiting to be delivered (again)."""

    indexes: frozenset[int] | None
    """``None``: every message of the entry."""
    hashes: frozenset[int] = frozenset()
    """key_shared: the key hashes of those messages."""
    first: int | None = None
    """key_shared: the key hash of the first of them (whole entries go by it)."""


@dataclass(slots=True, eq=False)
class Slot:
    """One consumer as the dispatcher sees it."""

    name: str
    priority: int = 0
    permits: int = 0
    unacked: dict[Position, Held] = field(default_factory=dict)
    unacked_messages: int = 0
    blocked: bool = False
    """Holding ``max_unacked_per_consumer`` messages: nothing more until half are acked."""
    backlogged: bool = False
    """Its stream holds ``max_consumer_buffer_bytes`` its client has not taken: nothing more
    until the client reads."""
    active: bool = True
    """Failover: this is the partition's active consumer (always true for the other types)."""
    closed: bool = False
    seq: int = 0
    """Join order (a tie-break between consumers of the same name)."""
    whole_entries: bool = False
    """Key_shared: takes entries whole (see :meth:`Dispatcher._assign_whole_by_key`)."""

    @property
    def available(self) -> bool:
        return (
            self.active
            and not self.blocked
            and not self.backlogged
            and not self.closed
            and self.permits > 0
        )


@dataclass(frozen=True, slots=True)
class Item:
    """An entry offered to :meth:`Dispatcher.assign`."""

    position: Position
    num_messages: int
    key_hashes: Sequence[int] = ()
    """As the entry carries them: none, one for all, or one per message."""
    indexes: frozenset[int] | None = None
    """The messages to deliver (``None``: all)."""
    fresh: bool = True
    """Read from the cursor for the first time (False: from ``replay``)."""
    deliver_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Assignment:
    slot: Slot
    position: Position
    indexes: frozenset[int] | None
    """``None``: every message of the entry."""
    count: int
    redelivery_count: int


@dataclass(slots=True)
class Plan:
    """What :meth:`Dispatcher.assign` decided."""

    assignments: list[Assignment] = field(default_factory=list)
    seek_back: Position | None = None
    """Fresh entries from here on were not taken: read them again later."""


class HashRing:
    """Consistent hashing of key hashes onto consumers."""

    def __init__(self) -> None:
        self._points: list[tuple[int, int]] = []  # (point, slot seq), sorted
        self._slots: dict[int, Slot] = {}

    def add(self, slot: Slot) -> None:
        self._slots[slot.seq] = slot
        for i in range(RING_POINTS):
            point = zlib.crc32(f"{slot.name}#{i}".encode())
            bisect.insort(self._points, (point, slot.seq))

    def remove(self, slot: Slot) -> None:
        self._slots.pop(slot.seq, None)
        self._points = [p for p in self._points if p[1] != slot.seq]

    def pick(self, key_hash: int) -> Slot | None:
        if not self._points:
            return None
        i = bisect.bisect_left(self._points, (key_hash, -1))
        return self._slots[self._points[i % len(self._points)][1]]


class Dispatcher:
    """The delivery rules of one subscription (see the module doc)."""

    def __init__(
        self,
        dispatch_type: SubscriptionType,
        *,
        partition: int = -1,
        max_unacked_per_consumer: int = 0,
        max_unacked_per_subscription: int = 0,
        max_replay_entries: int = 10_000,
        track_unacked: bool = True,
        max_delayed_entries: int = 200_000,
        redelivery_counts: RedeliveryCounts | None = None,
        delay_index: DelayIndex | None = None,
    ) -> None:
        self.type = dispatch_type
        self.track_unacked = track_unacked
        """False for a non-durable reader: what it was given is not tracked."""
        self.partition = partition
        self.max_unacked_per_consumer = max_unacked_per_consumer
        self.max_unacked_per_subscription = max_unacked_per_subscription
        self.max_replay_entries = max_replay_entries
        self.max_delayed_entries = max_delayed_entries
        self.slots: list[Slot] = []
        self.replay: dict[Position, Pending] = {}
        self.delayed: dict[Position, Item] = {}
        self._delay_heap: list[tuple[int, Position]] = []
        self.index = delay_index if delay_index is not None else DelayIndex(bucket_entries=0)
        """Which entries of ``delayed`` are in which bucket of the persisted delay index."""
        self.redelivery_counts = (
            redelivery_counts if redelivery_counts is not None else RedeliveryCounts(1 << 62)
        )
        """The cursor's (persisted with it), or the dispatcher's own for a reader."""
        self.holders: dict[int, tuple[Slot, int]] = {}
        """key_shared: key hash -> (consumer holding unacked messages of it, how many)."""
        self.blocked = False
        """The subscription holds ``max_unacked_per_subscription`` messages unacknowledged."""
        self.unacked_messages = 0
        self.msgs_redelivered = 0
        self._ring = HashRing()
        self._rr = 0
        self._seq = itertools.count()

    @property
    def shares(self) -> bool:
        """Shared or key_shared: several consumers receive at once."""
        return self.type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED)

    # --- consumers ------------------------------------------------------------------------------

    def add(
        self, name: str, priority: int = 0, *, whole_entries: bool = False
    ) -> tuple[Slot, list[tuple[Slot, bool]], bool]:
        """A consumer joins: its slot, who to tell of an active change, and whether to rewind."""
        slot = Slot(name, priority, seq=next(self._seq), whole_entries=whole_entries)
        self.slots.append(slot)
        if self.type is SubscriptionType.KEY_SHARED:
            self._ring.add(slot)
        if self.type is SubscriptionType.FAILOVER:
            slot.active = False
            changes, rewind = self._elect()
            if not any(s is slot for s, _ in changes):
                changes.append((slot, slot.active))
            return slot, changes, rewind
        return slot, [], False

    def remove(self, slot: Slot) -> tuple[list[tuple[Slot, bool]], bool]:
        """A consumer left: who to tell of an active change, and whether to rewind (exclusive
        and failover redeliver from the first unacknowledged entry; shared and key_shared move
        what it held to ``replay``)."""
        if slot not in self.slots:
            return [], False
        self.slots.remove(slot)
        slot.closed = True
        if self.type is SubscriptionType.KEY_SHARED:
            self._ring.remove(slot)
        if self.shares:
            self.requeue(slot, list(slot.unacked))
            return [], False
        held = slot.unacked_messages
        self._drop_held(slot)
        self.msgs_redelivered += held
        if self.type is SubscriptionType.FAILOVER:
            changes, rewind = self._elect()
            # an inactive consumer leaving leaves the active one as it was: a rewind would
            # deliver again what that one holds
            return changes, rewind or held > 0
        # the rewind reads again from the first unacknowledged entry, which brings what waits
        # in replay (requeued by a redelivery request) too: kept, it would come twice
        self.replay.clear()
        return [], True

    def _drop_held(self, slot: Slot) -> None:
        """Forget what an exclusive or failover consumer held (a rewind redelivers it)."""
        for position, held in slot.unacked.items():
            if not held.counted:
                self.redelivery_counts.increment(position)
        self.unacked_messages -= slot.unacked_messages
        slot.unacked.clear()
        slot.unacked_messages = 0
        slot.blocked = False
        self._update_blocked()

    def _elect(self) -> tuple[list[tuple[Slot, bool]], bool]:
        """Failover: choose the active consumer; the changes to tell and whether to rewind."""
        before = next((s for s in self.slots if s.active), None)
        for slot in self.slots:
            slot.active = False
        after: Slot | None = None
        if self.slots:
            best = min(s.priority for s in self.slots)
            ranked = sorted((s for s in self.slots if s.priority == best), key=_name_order)
            after = ranked[max(self.partition, 0) % len(ranked)]
            after.active = True
        if after is before:
            return [], False
        changes: list[tuple[Slot, bool]] = []
        rewind = False
        if before is not None:
            changes.append((before, False))
            if before.unacked:
                self.msgs_redelivered += before.unacked_messages
                self._drop_held(before)
            rewind = True
        if after is not None:
            changes.append((after, True))
            rewind = True
        self.replay.clear()
        return changes, rewind

    def flow(self, slot: Slot, permits: int) -> None:
        slot.permits += permits

    def active_slot(self) -> Slot | None:
        return next((s for s in self.slots if s.active and not s.closed), None)

    # --- what to read ---------------------------------------------------------------------------

    def can_dispatch(self) -> bool:
        """Some consumer could take a message now."""
        return not self.blocked and any(s.available for s in self.slots)

    def fresh_budget(self) -> int:
        """Messages to read from the cursor now (0: read nothing new)."""
        if self.blocked or len(self.replay) >= self.max_replay_entries or self.delayed_full:
            return 0
        return sum(s.permits for s in self.slots if s.available)

    def replay_candidates(self, limit: int) -> list[Position]:
        """Entries waiting in ``replay`` that some consumer can take now, in order."""
        if not self.replay or not self.can_dispatch():
            return []
        ordered = sorted(self.replay)
        if self.type is not SubscriptionType.KEY_SHARED:
            return ordered[:limit]
        chosen: list[Position] = []
        skipped: set[int] = set()  # hashes of earlier entries left waiting
        whole_entries = any(slot.whole_entries for slot in self.slots)
        for position in ordered:
            pending = self.replay[position]
            if whole_entries:
                # as _assign_whole_by_key decides: all of it to its first key's consumer, or
                # none (were it offered and kept, the dispatch loop would offer it for ever)
                open_ = self._open_whole(pending, skipped)
            else:
                open_ = any(self._open_for(h) and h not in skipped for h in pending.hashes)
            if open_:
                chosen.append(position)
                if len(chosen) >= limit:
                    break
            else:
                skipped |= pending.hashes
        return chosen

    def _open_whole(self, pending: Pending, skipped: set[int]) -> bool:
        if pending.first is None or not pending.hashes.isdisjoint(skipped):
            return False
        target = self._ring.pick(pending.first)
        if target is None or not target.available:
            return False
        return not any(self._held_elsewhere(h, target) for h in pending.hashes)

    def _open_for(self, key_hash: int) -> bool:
        target = self._ring.pick(key_hash)
        if target is None or not target.available:
            return False
        holder = self.holders.get(key_hash)
        return holder is None or holder[0] is target

    # --- assigning ------------------------------------------------------------------------------

    def assign(self, items: Sequence[Item], now_ms: int) -> Plan:
        """Decide who gets the ``items`` (in position order; replayed ones first)."""
        plan = Plan()
        if self.blocked:
            self._give_back(items, plan)
            return plan
        if self.shares:
            due: list[Item] = []
            for item in items:
                if item.deliver_at_ms > now_ms:
                    self._delay(item, now_ms)
                else:
                    due.append(item)
            items = due
        if self.type is SubscriptionType.KEY_SHARED:
            self._assign_by_key(items, plan)
        elif self.type is SubscriptionType.SHARED:
            self._assign_round_robin(items, plan)
        else:
            self._assign_single(items, plan)
        self._update_blocked()
        return plan

    def _give_back(self, items: Iterable[Item], plan: Plan) -> None:
        """Items not taken: fresh ones are read again, replayed ones keep waiting."""
        for item in items:
            if item.fresh:
                if plan.seek_back is None:
                    plan.seek_back = item.position
            else:
                self._pend(item.position, item.indexes, item.num_messages, item.key_hashes)

    def _assign_single(self, items: Sequence[Item], plan: Plan) -> None:
        slot = self.active_slot()
        for n, item in enumerate(items):
            if (
                slot is None
                or slot.blocked
                or slot.backlogged
                or (slot.permits <= 0 and plan.assignments)
            ):
                # at least one entry goes out per pass, even one larger than the permits
                self._give_back(items[n:], plan)
                return
            self._hand(slot, item, item.indexes, plan)

    def _assign_round_robin(self, items: Sequence[Item], plan: Plan) -> None:
        for n, item in enumerate(items):
            slot = self._next_round_robin()
            if slot is None:
                self._give_back(items[n:], plan)
                return
            self._hand(slot, item, item.indexes, plan)

    def _next_round_robin(self) -> Slot | None:
        count = len(self.slots)
        for step in range(count):
            slot = self.slots[(self._rr + step) % count]
            if slot.available:
                self._rr = (self._rr + step + 1) % count
                return slot
        return None

    def _assign_by_key(self, items: Sequence[Item], plan: Plan) -> None:
        # hashes with earlier messages still waiting in replay (not offered now) stay blocked;
        # entries waiting after an item (beyond the replay read's limit) must not block it
        offered = {item.position for item in items}
        waiting = sorted(p for p in self.replay if p not in offered)
        next_waiting = 0
        blocked: set[int] = set()
        permits = {slot.seq: slot.permits for slot in self.slots}
        whole_entries = any(slot.whole_entries for slot in self.slots)
        for item in items:
            while next_waiting < len(waiting) and waiting[next_waiting] < item.position:
                blocked |= self.replay[waiting[next_waiting]].hashes
                next_waiting += 1
            hashes = expand_key_hashes(item.key_hashes, item.num_messages)
            indexes = range(item.num_messages) if item.indexes is None else sorted(item.indexes)
            if whole_entries:
                self._assign_whole_by_key(
                    item, hashes, indexes, blocked=blocked, permits=permits, plan=plan
                )
                continue
            taken: dict[int, list[int]] = {}
            left: list[int] = []
            for i in indexes:
                h = hashes[i]
                target = None if h in blocked else self._ring.pick(h)
                if (
                    target is None
                    or not self._takes(target, permits)
                    or self._held_elsewhere(h, target)
                ):
                    blocked.add(h)
                    left.append(i)
                    continue
                permits[target.seq] -= 1
                taken.setdefault(target.seq, []).append(i)
            whole = not left and len(taken) == 1 and item.indexes is None
            for seq, chosen in taken.items():
                slot = next(s for s in self.slots if s.seq == seq)
                self._hand(slot, item, None if whole else frozenset(chosen), plan, hashes)
            if left:
                self._pend(item.position, frozenset(left), item.num_messages, item.key_hashes)

    def _assign_whole_by_key(
        self,
        item: Item,
        hashes: Sequence[int],
        indexes: Sequence[int],
        *,
        blocked: set[int],
        permits: dict[int, int],
        plan: Plan,
    ) -> None:
        """Key_shared with a consumer that takes entries whole (a Pulsar client): as Pulsar's
        broker does, every entry goes whole to the consumer its first message's key maps to,
        whatever keys its other messages have (Pulsar asks key_shared producers to batch by key,
        so that an entry has one). Per-key order still holds: an entry waits while any of its
        keys is blocked or held unacknowledged by another consumer."""
        keys = {hashes[i] for i in indexes}
        first = hashes[indexes[0]]
        target = None if first in blocked else self._ring.pick(first)
        if (
            target is None
            or not self._takes(target, permits)
            or not keys.isdisjoint(blocked)
            or any(self._held_elsewhere(h, target) for h in keys)
        ):
            blocked |= keys
            self._pend(item.position, item.indexes, item.num_messages, item.key_hashes)
            return
        permits[target.seq] -= len(indexes)
        self._hand(target, item, item.indexes, plan, hashes)

    @staticmethod
    def _takes(target: Slot, permits: dict[int, int]) -> bool:
        """Key_shared: whether ``target`` takes messages now (``permits``: what this
        assignment has left of each consumer's permits)."""
        return not (
            target.blocked or target.backlogged or target.closed or permits[target.seq] <= 0
        )

    def _held_elsewhere(self, key_hash: int, target: Slot) -> bool:
        """Whether a consumer other than ``target`` holds unacknowledged messages of the key."""
        holder = self.holders.get(key_hash)
        return holder is not None and holder[0] is not target and holder[1] > 0

    def _hand(
        self,
        slot: Slot,
        item: Item,
        indexes: frozenset[int] | None,
        plan: Plan,
        hashes: Sequence[int] = (),
    ) -> None:
        count = item.num_messages if indexes is None else len(indexes)
        slot.permits -= count
        if not self.track_unacked:
            plan.assignments.append(Assignment(slot, item.position, indexes, count, 0))
            return
        held = slot.unacked.get(item.position)
        if held is None:
            slot.unacked[item.position] = Held(indexes, count, item.num_messages, hashes)
        else:  # more messages of an entry it already holds (key_shared)
            if held.indexes is None or indexes is None:
                held.indexes = None
            else:
                held.indexes = held.indexes | indexes
            held.count += count
        if hashes:
            for i in range(item.num_messages) if indexes is None else indexes:
                h = hashes[i]
                current = self.holders.get(h)
                self.holders[h] = (slot, (current[1] if current else 0) + 1)
        slot.unacked_messages += count
        self.unacked_messages += count
        if 0 < self.max_unacked_per_consumer <= slot.unacked_messages:
            slot.blocked = True
        plan.assignments.append(
            Assignment(
                slot,
                item.position,
                indexes,
                count,
                self.redelivery_counts.get(item.position),
            )
        )

    def _pend(
        self,
        position: Position,
        indexes: frozenset[int] | None,
        num_messages: int,
        key_hashes: Sequence[int],
    ) -> None:
        current = self.replay.get(position)
        if current is not None:
            indexes = (
                None if current.indexes is None or indexes is None else current.indexes | indexes
            )
        hashes: frozenset[int] = frozenset()
        first: int | None = None
        if self.type is SubscriptionType.KEY_SHARED:
            per_message = expand_key_hashes(key_hashes, num_messages)
            wanted = range(num_messages) if indexes is None else sorted(indexes)
            hashes = frozenset(per_message[i] for i in wanted)
            first = per_message[wanted[0]] if wanted else None
        self.replay[position] = Pending(indexes, hashes, first)

    def _delay(self, item: Item, now_ms: int) -> None:
        if item.position in self.delayed:
            return  # read again (a read given back): it waits already
        self.delayed[item.position] = item
        heapq.heappush(self._delay_heap, (item.deliver_at_ms, item.position))
        self.index.add(
            DelayedEntry(
                item.position, item.deliver_at_ms, item.num_messages, tuple(item.key_hashes)
            ),
            now_ms,
        )

    def hold_indexed(self, bucket: str, entries: Iterable[DelayedEntry]) -> list[Position]:
        """Hold aside the entries of a persisted bucket of the delay index (a new owner loading
        it; the caller leaves out acknowledged ones); the positions now held for it. Held even
        past ``max_delayed_entries``: the owners before kept to it when they wrote them."""
        held: list[Position] = []
        for entry in entries:
            if entry.position in self.delayed:
                continue
            self.delayed[entry.position] = Item(
                entry.position,
                entry.num_messages,
                entry.key_hashes,
                deliver_at_ms=entry.deliver_at_ms,
            )
            heapq.heappush(self._delay_heap, (entry.deliver_at_ms, entry.position))
            held.append(entry.position)
        self.index.loaded(bucket, held)
        return held

    @property
    def delayed_full(self) -> bool:
        """``max_delayed_entries`` entries wait until they are due: no new entries are read
        (an entry read could be one more) until some are due."""
        return len(self.delayed) >= self.max_delayed_entries > 0

    def next_due_ms(self) -> int | None:
        """When the earliest delayed entry is due (None: none waits)."""
        while self._delay_heap and self._delay_heap[0][1] not in self.delayed:
            heapq.heappop(self._delay_heap)
        return self._delay_heap[0][0] if self._delay_heap else None

    def release_due(self, now_ms: int) -> int:
        """Move delayed entries that are due to ``replay``; how many moved."""
        moved = 0
        while self._delay_heap and self._delay_heap[0][0] <= now_ms:
            _, position = heapq.heappop(self._delay_heap)
            item = self.delayed.pop(position, None)
            if item is not None:
                self.index.released(position)
                self._pend(position, item.indexes, item.num_messages, item.key_hashes)
                moved += 1
        return moved

    # --- acknowledgements and redelivery -----------------------------------------------------

    def _holder_of(self, slot: Slot, position: Position) -> Slot | None:
        if position in slot.unacked:
            return slot
        # shared: any consumer may acknowledge what another received
        return next((s for s in self.slots if position in s.unacked), None)

    def acked(self, slot: Slot, position: Position) -> None:
        """An entry is acknowledged as a whole."""
        for holder in [s for s in self.slots if position in s.unacked] or [slot]:
            self._release(holder, position, None)
        self.replay.pop(position, None)
        if self.delayed.pop(position, None) is not None:
            self.index.released(position)
        self.redelivery_counts.discard(position)
        self._update_blocked()

    def acked_partly(
        self, slot: Slot, position: Position, indexes: frozenset[int], *, complete: bool
    ) -> None:
        """Some messages of an entry are acknowledged (``complete``: now all of them are)."""
        if complete:
            self.acked(slot, position)
            return
        holder = self._holder_of(slot, position)
        if holder is not None:
            self._release(holder, position, indexes)
        pending = self.replay.get(position)
        if pending is not None and pending.indexes is not None:
            rest = pending.indexes - indexes
            if rest:
                pending.indexes = rest
            else:
                del self.replay[position]
        self._update_blocked()

    def acked_through(self, slot: Slot, position: Position) -> None:
        """Exclusive and failover: everything up to ``position`` is acknowledged."""
        for held in [p for p in slot.unacked if p <= position]:
            self._release(slot, held, None)
            self.redelivery_counts.discard(held)
        for waiting in [p for p in self.replay if p <= position]:
            del self.replay[waiting]
        self._update_blocked()

    def forget_through(self, position: Position) -> None:
        """Everything up to ``position`` was acknowledged for the subscription (message TTL)."""
        for slot in self.slots:
            for held in [p for p in slot.unacked if p <= position]:
                self._release(slot, held, None)
        for waiting in [p for p in self.replay if p <= position]:
            del self.replay[waiting]
        for waiting in [p for p in self.delayed if p <= position]:
            del self.delayed[waiting]
            self.index.released(waiting)
        self.redelivery_counts.forget_through(position)
        self._update_blocked()

    def _release(self, slot: Slot, position: Position, indexes: frozenset[int] | None) -> None:
        """``slot`` no longer holds ``indexes`` of the entry (``None``: all it held)."""
        held = slot.unacked.get(position)
        if held is None:
            return
        # a whole entry released (the usual ack) builds no set of its indexes
        if held.indexes is None:
            mine: frozenset[int] | range = range(held.num_messages)
            asked = indexes if indexes is None else frozenset(i for i in indexes if i in mine)
        else:
            mine = held.indexes
            asked = indexes if indexes is None else indexes & mine
        if asked is None or len(asked) >= held.count:
            gone: Iterable[int] = mine
            count = held.count
            del slot.unacked[position]
        else:
            gone = asked
            count = len(asked)
            held.indexes = frozenset(mine).difference(asked)
            held.count -= count
        if held.hashes:
            for i in gone:
                self._unhold(slot, held.hashes[i])
        slot.unacked_messages -= count
        self.unacked_messages -= count
        if slot.blocked and slot.unacked_messages <= self.max_unacked_per_consumer // 2:
            slot.blocked = False

    def _unhold(self, slot: Slot, key_hash: int) -> None:
        current = self.holders.get(key_hash)
        if current is None or current[0] is not slot:
            return
        if current[1] <= 1:
            del self.holders[key_hash]
        else:
            self.holders[key_hash] = (slot, current[1] - 1)

    def count_redeliveries(self, slot: Slot, positions: Iterable[Position]) -> None:
        """Raise the redelivery counts of what ``slot`` holds of these entries now, ahead of a
        :meth:`requeue` that comes later (a negative ack's delay): a handover in between then
        keeps the raised count."""
        for position in positions:
            held = slot.unacked.get(position)
            if held is not None and not held.counted:
                held.counted = True
                self.redelivery_counts.increment(position)

    def requeue(self, slot: Slot, positions: Iterable[Position]) -> int:
        """What ``slot`` holds of these entries is delivered again (to any consumer, first);
        the number of messages requeued."""
        moved = 0
        for position in positions:
            held = slot.unacked.get(position)
            if held is None:
                continue
            self._release(slot, position, None)
            if not held.counted:
                self.redelivery_counts.increment(position)
            self._pend(position, held.indexes, held.num_messages, held.hashes)
            moved += held.count
        self.msgs_redelivered += moved
        self._update_blocked()
        return moved

    def reset(self) -> None:
        """Start over (seek, reset): nothing is held, waiting or delayed any more."""
        for slot in self.slots:
            slot.unacked.clear()
            slot.unacked_messages = 0
            slot.blocked = False
        self.unacked_messages = 0
        self.replay.clear()
        self.delayed.clear()
        self._delay_heap.clear()
        self.index.clear()
        self.redelivery_counts.clear()
        self.holders.clear()
        self.blocked = False

    def _update_blocked(self) -> None:
        limit = self.max_unacked_per_subscription
        if limit <= 0:
            self.blocked = False
        elif self.unacked_messages >= limit:
            self.blocked = True
        elif self.unacked_messages <= limit // 2:
            self.blocked = False


def _name_order(slot: Slot) -> tuple[str, int]:
    return slot.name, slot.seq
