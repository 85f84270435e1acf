"""The dispatcher against a reference model, driven as the subscription drives it.

Each machine owns a real :class:`Dispatcher`, a small in-memory log and a :class:`Glue` that
repeats, step by step, what ``Subscription._dispatch_once`` does with them: replay candidates are
re-read (minus what the cursor already acknowledged) and offered with ``fresh=False``; otherwise
the next entries in log order are read as far as the permits go and offered with ``fresh=True``;
``plan.seek_back`` moves the read position back. The test plays the clients too: it remembers
what every consumer received and acknowledges, negatively acknowledges or leaves with it.

After every step the model checks that nothing is lost or held twice and that the dispatcher's
own books (what each consumer holds, key holders) agree with what the clients hold. Settling
(running the loop until nothing changes) checks that nothing deliverable is left undelivered,
and draining (permits for all, acknowledging everything) that every message is delivered and
acknowledged in the end, including the redelivered ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from broker.managed_ledger import Position, RedeliveryCounts
from broker.service.dispatch import Dispatcher, Item, Plan, Slot
from broker.service.streams import SubscriptionType
from magnetar.common.keys import batch_key_hashes, expand_key_hashes

Msg = tuple[int, int]
"""(entry number in the log, index of the message in the entry)."""

NAMES = ["c0", "c1", "c2"]
KEYS = ["k0", "k1", "k3", None]
"""Chosen so that, on the hash ring, every consumer of every set of ``NAMES`` gets some key."""
MAX_LIVE_CONSUMERS = 4
NOW_MS = 1_000

MACHINE_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def position(entry: int) -> Position:
    return Position(0, entry)


@dataclass(frozen=True, slots=True)
class LogEntry:
    keys: tuple[str | None, ...]

    @property
    def num_messages(self) -> int:
        return len(self.keys)

    @property
    def key_hashes(self) -> tuple[int, ...]:
        """As the producer's batch carries them (none, one for all, or one per message)."""
        return tuple(batch_key_hashes(self.keys))

    @property
    def hashes(self) -> tuple[int, ...]:
        return tuple(expand_key_hashes(self.key_hashes, self.num_messages))


class Glue:
    """The subscription's dispatch loop over an in-memory log, and the clients' side of it."""

    def __init__(self, dispatcher: Dispatcher, *, max_entries: int) -> None:
        self.d = dispatcher
        self.max_entries = max_entries
        self.log: list[LogEntry] = []
        self.read_pos = 0
        """The cursor's read position (an entry number)."""
        self.acked: set[Msg] = set()
        """Acknowledged messages (the cursor's state, message by message)."""
        self.largest = 0.0
        self.slots: dict[int, Slot] = {}
        """Consumers attached now, by join order (``Slot.seq``)."""
        self.held: dict[int, dict[int, set[int]]] = {}
        """What each attached consumer received and has not acknowledged or given back."""
        self.delivered: set[Msg] = set()
        """Delivered at least once."""
        self.last_first_delivery: dict[int, Msg] = {}
        """key_shared: per key hash, the latest message delivered for the first time."""
        self.owed: set[Msg] = set()
        """Requeued, or held by a consumer that left: to be delivered again."""
        self.blocked: dict[int, bool] = {}
        """shared: consumers at ``max_unacked_per_consumer``, until they are down to half."""
        self.whole_entries = False
        """key_shared: consumers join taking entries whole (Pulsar's clients)."""

    # --- the log and the cursor -----------------------------------------------------------------

    def append(self, keys: Iterable[str | None]) -> None:
        self.log.append(LogEntry(tuple(keys)))

    def messages(self) -> Iterable[Msg]:
        for entry, e in enumerate(self.log):
            for index in range(e.num_messages):
                yield entry, index

    def entry_acked(self, entry: int) -> bool:
        return all((entry, i) in self.acked for i in range(self.log[entry].num_messages))

    def acked_indexes(self, entry: int) -> frozenset[int]:
        """As ``ManagedCursor.acked_indexes``: empty for an entry acknowledged as a whole."""
        if self.entry_acked(entry):
            return frozenset()
        return frozenset(i for i in range(self.log[entry].num_messages) if (entry, i) in self.acked)

    def first_unacked(self) -> int:
        """Where ``ManagedCursor.rewind`` puts the read position."""
        n = 0
        while n < len(self.log) and self.entry_acked(n):
            n += 1
        return n

    def rewind(self) -> None:
        self.read_pos = self.first_unacked()

    # --- consumers --------------------------------------------------------------------------------

    def holder_of(self, msg: Msg) -> list[int]:
        entry, index = msg
        return [seq for seq, held in self.held.items() if index in held.get(entry, ())]

    def in_replay(self, msg: Msg) -> bool:
        entry, index = msg
        pending = self.d.replay.get(position(entry))
        return pending is not None and (pending.indexes is None or index in pending.indexes)

    def join(self, name: str, priority: int = 0) -> tuple[Slot, list[tuple[Slot, bool]], bool]:
        slot, changes, rewind = self.d.add(name, priority, whole_entries=self.whole_entries)
        self.slots[slot.seq] = slot
        self.held[slot.seq] = {}
        self.blocked[slot.seq] = False
        self.after_change(changes, rewind)
        return slot, changes, rewind

    def leave(self, seq: int) -> tuple[list[tuple[Slot, bool]], bool]:
        slot = self.slots.pop(seq)
        held = self.held.pop(seq)
        del self.blocked[seq]
        if self.d.shares:
            self.owed |= {(entry, i) for entry, indexes in held.items() for i in indexes}
        changes, rewind = self.d.remove(slot)
        self.after_change(changes, rewind)
        return changes, rewind

    def after_change(self, changes: list[tuple[Slot, bool]], rewind: bool) -> None:
        for slot, active in changes:
            if not active and slot.seq in self.held:
                # an inactive failover consumer's messages go to the new active one (the client
                # drops what it had queued)
                self.held[slot.seq] = {}
        if rewind:
            self.rewind()

    def flow(self, seq: int, permits: int) -> None:
        self.d.flow(self.slots[seq], permits)

    def held_count(self, seq: int) -> int:
        return sum(len(indexes) for indexes in self.held[seq].values())

    def relax(self) -> None:
        """Consumers down to half the unacknowledged limit are unblocked."""
        for seq in self.blocked:
            if self.held_count(seq) <= self.d.max_unacked_per_consumer // 2:
                self.blocked[seq] = False

    def ack(self, seq: int, entry: int, indexes: set[int]) -> None:
        """The consumer acknowledges some of the messages of ``entry`` it holds."""
        held = self.held[seq][entry]
        assert indexes <= held
        n = self.log[entry].num_messages
        whole = held == set(range(n)) and indexes == held
        self.acked |= {(entry, i) for i in indexes}
        held -= indexes
        if not held:
            del self.held[seq][entry]
        if whole:
            self.d.acked(self.slots[seq], position(entry))
        else:
            self.d.acked_partly(
                self.slots[seq],
                position(entry),
                frozenset(indexes),
                complete=self.entry_acked(entry),
            )
        self.relax()

    def ack_through(self, seq: int, entry: int) -> None:
        """Cumulative acknowledgement (exclusive and failover)."""
        self.acked |= {m for m in self.messages() if m[0] <= entry}
        for held in self.held.values():
            for e in [e for e in held if e <= entry]:
                del held[e]
        self.d.acked_through(self.slots[seq], position(entry))
        self.relax()

    def requeue(self, seq: int, entries: list[int]) -> None:
        held = self.held[seq]
        given_back = {(entry, i) for entry in entries for i in held.pop(entry, set())}
        self.owed |= given_back
        moved = self.d.requeue(self.slots[seq], [position(entry) for entry in entries])
        assert moved == len(given_back)
        self.relax()

    # --- the dispatch loop ------------------------------------------------------------------------

    def dispatch_once(self) -> bool:
        """One pass of ``Subscription._dispatch_once``; whether anything changed."""
        d = self.d
        if not d.can_dispatch():
            return False
        before = (self.read_pos, dict(d.replay))
        candidates = d.replay_candidates(self.max_entries)
        items: list[Item] = []
        if candidates:
            for p in candidates:
                if self.entry_acked(p.entry_id):
                    continue
                pending = d.replay.pop(p, None)
                if pending is None:
                    continue
                e = self.log[p.entry_id]
                indexes = pending.indexes
                acked = self.acked_indexes(p.entry_id)
                if acked:
                    indexes = (indexes or frozenset(range(e.num_messages))) - acked
                    if not indexes:
                        continue
                items.append(Item(p, e.num_messages, e.key_hashes, indexes, fresh=False))
        else:
            budget = d.fresh_budget()
            if budget <= 0 or self.read_pos >= len(self.log):
                return False
            wanted = budget // math.ceil(self.largest) if self.largest else 1
            limit = max(1, min(wanted, self.max_entries))
            while len(items) < limit and self.read_pos < len(self.log):
                entry = self.read_pos
                self.read_pos += 1
                if self.entry_acked(entry):
                    continue  # the cursor skips acknowledged entries
                e = self.log[entry]
                acked = self.acked_indexes(entry)
                indexes = frozenset(range(e.num_messages)) - acked if acked else None
                items.append(Item(position(entry), e.num_messages, e.key_hashes, indexes))
        permits = {seq: slot.permits for seq, slot in self.slots.items()}
        plan = d.assign(items, NOW_MS)
        if plan.seek_back is not None:
            self.read_pos = plan.seek_back.entry_id
        if d.type is SubscriptionType.SHARED:
            self.check_round_robin(plan, permits)
        if candidates and items:
            # what replay_candidates offers, assign must take some of: the subscription's loop
            # offers the candidates again at once, and would spin for ever
            assert plan.assignments, f"replay candidates {candidates} offered and none taken"
        self.deliver(plan)
        return bool(plan.assignments) or before != (self.read_pos, d.replay)

    def check_round_robin(self, plan: Plan, permits: dict[int, int]) -> None:
        """shared: each entry goes to the next consumer (in join order, wrapping around) that
        has permits left and is not blocked."""
        held = {seq: self.held_count(seq) for seq in self.slots}
        blocked = dict(self.blocked)
        order = [s.seq for s in self.d.slots]
        previous: int | None = None
        for a in plan.assignments:
            seq = a.slot.seq
            assert permits[seq] > 0, f"{a} goes to a consumer without permits"
            assert not blocked[seq], f"{a} goes to a blocked consumer"
            if previous is not None:
                i = order.index(previous)
                rotation = order[i + 1 :] + order[: i + 1]
                due = next(s for s in rotation if permits[s] > 0 and not blocked[s])
                assert seq == due, f"{a} goes to consumer {seq}, not to {due} (round robin)"
            previous = seq
            permits[seq] -= a.count
            held[seq] += a.count
            if held[seq] >= self.d.max_unacked_per_consumer > 0:
                blocked[seq] = True

    def deliver(self, plan: Plan) -> None:
        for a in plan.assignments:
            seq = a.slot.seq
            assert seq in self.slots, f"{a} goes to a consumer that left"
            assert not self.blocked[seq], f"{a} goes to a blocked consumer"
            e = self.log[a.position.entry_id]
            indexes = range(e.num_messages) if a.indexes is None else sorted(a.indexes)
            if self.whole_entries:
                entry = a.position.entry_id
                left = {i for i in range(e.num_messages) if (entry, i) not in self.acked}
                assert set(indexes) == left, f"{a} hands out part of entry {entry} ({left} left)"
            for index in indexes:
                msg = (a.position.entry_id, index)
                assert msg not in self.acked, f"{msg} delivered after it was acknowledged"
                assert not self.holder_of(msg), f"{msg} delivered to {seq} while held"
                if msg in self.delivered:
                    assert a.redelivery_count >= 1, f"{msg} redelivered with count 0"
                if self.d.type is SubscriptionType.KEY_SHARED:
                    self.check_key_order(seq, msg)
                self.held[seq].setdefault(msg[0], set()).add(index)
                self.delivered.add(msg)
                self.owed.discard(msg)
            self.largest = max(float(e.num_messages), self.largest * 0.99)
            limit = self.d.max_unacked_per_consumer
            if self.d.shares and 0 < limit <= self.held_count(seq):
                self.blocked[seq] = True

    def check_key_order(self, seq: int, msg: Msg) -> None:
        h = self.log[msg[0]].hashes[msg[1]]
        for other, held in self.held.items():
            if other == seq:
                continue
            for entry, indexes in held.items():
                for i in indexes:
                    assert self.log[entry].hashes[i] != h, (
                        f"{msg} goes to consumer {seq} while consumer {other} holds {(entry, i)}"
                        " of the same key"
                    )
        if msg not in self.delivered:
            last = self.last_first_delivery.get(h)
            assert last is None or last < msg, (
                f"{msg} is delivered for the first time after {last} of the same key"
            )
            self.last_first_delivery[h] = msg

    def settle(self) -> None:
        """Run the loop until it changes nothing (it must not spin for ever)."""
        for _ in range(10_000):
            if not self.dispatch_once():
                return
        raise AssertionError("the dispatch loop never settles")

    def drain(self) -> None:
        """Permits for everyone, acknowledge everything, until all is acknowledged."""
        if not self.slots:
            self.join(NAMES[0])
        for _ in range(1_000):
            for seq in self.slots:
                self.flow(seq, 1_000)
            self.settle()
            progress = False
            for seq, held in self.held.items():
                for entry in sorted(held):
                    if self.d.type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED):
                        self.ack(seq, entry, set(held[entry]))
                    else:
                        self.ack_through(seq, entry)
                    progress = True
            if not progress:
                break
        missing = sorted(m for m in self.messages() if m not in self.acked)
        assert not missing, f"never delivered although every consumer had permits: {missing}"
        assert not self.owed, f"given back and never delivered again: {sorted(self.owed)}"

    # --- invariants -------------------------------------------------------------------------------

    def check_nothing_lost(self) -> None:
        """Every message is in exactly one place: acknowledged, held by one consumer, waiting in
        replay, or not read yet."""
        for msg in self.messages():
            places = []
            if msg in self.acked:
                places.append("acked")
            places += [f"held by {seq}" for seq in self.holder_of(msg)]
            if self.in_replay(msg):
                places.append("replay")
            if msg[0] >= self.read_pos and msg not in self.acked:
                places.append("unread")  # (after a rewind, acknowledged ones are skipped)
            assert len(places) == 1, f"{msg} is in {places or 'no place'}"
        for p in self.d.replay:
            assert 0 <= p.entry_id < len(self.log), f"replay holds {p}, which is no entry"

    def check_books(self) -> None:
        """The dispatcher's view of what each consumer holds is the clients' view."""
        d = self.d
        assert {s.seq for s in d.slots} == set(self.slots)
        total = 0
        for seq, slot in self.slots.items():
            held = {e: idx for e, idx in self.held[seq].items() if idx}
            seen = {p.entry_id: record for p, record in slot.unacked.items()}
            assert set(seen) == set(held), f"consumer {seq}: dispatcher {seen}, client {held}"
            for entry, record in seen.items():
                n = self.log[entry].num_messages
                indexes = set(range(n)) if record.indexes is None else set(record.indexes)
                assert indexes == held[entry], f"consumer {seq} entry {entry}: {record} vs {held}"
                assert record.count == len(indexes)
            count = sum(len(idx) for idx in held.values())
            assert slot.unacked_messages == count
            assert slot.blocked == self.blocked[seq], f"consumer {seq} holding {count}: {slot}"
            total += count
        assert d.unacked_messages == total
        if d.type is SubscriptionType.KEY_SHARED:
            holding: dict[int, tuple[int, int]] = {}
            for seq, client in self.held.items():
                for entry, indexes in client.items():
                    for i in indexes:
                        h = self.log[entry].hashes[i]
                        owner, n = holding.get(h, (seq, 0))
                        assert owner == seq, f"key hash {h} held by {owner} and {seq}"
                        holding[h] = (seq, n + 1)
            assert {h: (s.seq, n) for h, (s, n) in d.holders.items()} == holding
            for p, pending in d.replay.items():
                e = self.log[p.entry_id]
                waiting = range(e.num_messages) if pending.indexes is None else pending.indexes
                assert {e.hashes[i] for i in waiting} <= pending.hashes


# --- key_shared -----------------------------------------------------------------------------------


entries_st = st.lists(st.sampled_from(KEYS), min_size=1, max_size=4)


class SharingMachine(RuleBasedStateMachine):
    """The rules and checks shared and key_shared subscriptions have in common: consumers
    join, leave, flow, dispatch, ack and nack; nothing is lost and the books agree."""

    glue: Glue

    @property
    def live(self) -> list[int]:
        return sorted(self.glue.slots)

    @property
    def holding(self) -> list[int]:
        return sorted(seq for seq, held in self.glue.held.items() if held)

    @precondition(lambda self: len(self.live) < MAX_LIVE_CONSUMERS)
    @rule(name=st.sampled_from(NAMES), permits=st.integers(0, 6))
    def join(self, name: str, permits: int) -> None:
        slot, _, _ = self.glue.join(name)
        self.glue.flow(slot.seq, permits)  # a client's first flow request follows at once

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        self.glue.leave(data.draw(st.sampled_from(self.live)))

    @precondition(lambda self: self.live)
    @rule(data=st.data(), permits=st.integers(1, 6))
    def flow(self, data: st.DataObject, permits: int) -> None:
        self.glue.flow(data.draw(st.sampled_from(self.live)), permits)

    @rule()
    def dispatch(self) -> None:
        self.glue.dispatch_once()

    @precondition(lambda self: self.holding)
    @rule(data=st.data(), everything=st.booleans())
    def ack(self, data: st.DataObject, everything: bool) -> None:
        seq = data.draw(st.sampled_from(self.holding))
        held = self.glue.held[seq]
        entry = data.draw(st.sampled_from(sorted(held)))
        one = {data.draw(st.sampled_from(sorted(held[entry])))}
        self.glue.ack(seq, entry, set(held[entry]) if everything else one)

    @precondition(lambda self: self.holding)
    @rule(data=st.data(), everything=st.booleans())
    def nack(self, data: st.DataObject, everything: bool) -> None:
        seq = data.draw(st.sampled_from(self.holding))
        held = sorted(self.glue.held[seq])
        entries = held if everything else [data.draw(st.sampled_from(held))]
        self.glue.requeue(seq, entries)

    @rule()
    def drain(self) -> None:
        self.glue.drain()

    @invariant()
    def nothing_lost(self) -> None:
        self.glue.check_nothing_lost()

    @invariant()
    def books_agree(self) -> None:
        self.glue.check_books()

    def teardown(self) -> None:
        self.glue.drain()


class KeySharedMachine(SharingMachine):
    """A key_shared subscription: per-key order, nothing lost, no stall, redelivery."""

    def __init__(self) -> None:
        super().__init__()
        self.glue = Glue(Dispatcher(SubscriptionType.KEY_SHARED), max_entries=3)

    @rule(keys=entries_st, count=st.integers(1, 3))
    def append(self, keys: list[str | None], count: int) -> None:
        for _ in range(count):
            self.glue.append(keys)

    @rule()
    def settle(self) -> None:
        glue = self.glue
        glue.settle()
        d = glue.d
        # (c) no stall: a key whose consumer could take a message and that no other consumer
        # holds has nothing left undelivered (waiting in replay or not read yet); (d) this
        # covers messages given back (nacked, or held by a consumer that left) too
        for msg in glue.messages():
            if msg in glue.acked or glue.holder_of(msg):
                continue
            h = glue.log[msg[0]].hashes[msg[1]]
            target = d._ring.pick(h)
            if target is None or not target.available:
                continue
            others = {
                seq
                for seq, held in glue.held.items()
                for entry, indexes in held.items()
                for i in indexes
                if glue.log[entry].hashes[i] == h and seq != target.seq
            }
            assert others, (
                f"{msg} (key hash {h}) is left undelivered although consumer {target.seq}"
                f" has {target.permits} permits and nobody else holds that key"
                f" (replay: {sorted(d.replay)}, read position {glue.read_pos})"
            )


KeySharedMachine.TestCase.settings = settings(MACHINE_SETTINGS, max_examples=300)
test_key_shared = KeySharedMachine.TestCase


class WholeEntryKeySharedMachine(SharingMachine):
    """A key_shared subscription of consumers that take entries whole (Pulsar's clients): every
    delivery is all of what is left of its entry, and still per-key order, nothing lost, no
    stall (the drains deliver everything)."""

    def __init__(self) -> None:
        super().__init__()
        self.glue = Glue(Dispatcher(SubscriptionType.KEY_SHARED), max_entries=3)
        self.glue.whole_entries = True

    @rule(keys=entries_st, count=st.integers(1, 3))
    def append(self, keys: list[str | None], count: int) -> None:
        for _ in range(count):
            self.glue.append(keys)

    @rule()
    def settle(self) -> None:
        self.glue.settle()


WholeEntryKeySharedMachine.TestCase.settings = settings(MACHINE_SETTINGS, max_examples=200)
test_key_shared_whole_entries = WholeEntryKeySharedMachine.TestCase


def test_whole_entries_go_by_their_first_key_and_wait_for_a_key_held_elsewhere() -> None:
    """An entry of several keys goes whole to the consumer of its first message's key; a later
    entry one of whose keys that consumer holds waits until it acknowledges them."""
    d = Dispatcher(SubscriptionType.KEY_SHARED)
    c0, _, _ = d.add("c0", whole_entries=True)
    c1, _, _ = d.add("c1", whole_entries=True)
    d.flow(c0, 10)
    d.flow(c1, 10)
    keys = {}
    for k in ("k0", "k1", "k3"):
        (h,) = batch_key_hashes([k])
        owner = d._ring.pick(h)
        assert owner is not None
        keys[owner.name] = k
    mine, theirs = keys["c0"], keys["c1"]
    mixed = tuple(batch_key_hashes([mine, theirs, theirs]))
    plan = d.assign([Item(position(0), 3, mixed)], NOW_MS)
    assert [(a.slot, a.indexes, a.count) for a in plan.assignments] == [(c0, None, 3)]
    later = tuple(batch_key_hashes([theirs]))
    plan = d.assign([Item(position(1), 1, later)], NOW_MS)
    assert plan.assignments == []
    assert list(d.replay) == [position(1)]
    # and it is not offered again until c0 lets go of that key (a real subscription's loop
    # would offer it again at once, for ever: it did, and the broker hung)
    assert d.replay_candidates(10) == []
    d.acked(c0, position(0))
    assert d.replay_candidates(10) == [position(1)]


# --- shared ---------------------------------------------------------------------------------------

PER_CONSUMER_LIMIT = 4


class SharedMachine(SharingMachine):
    """A shared subscription with a small per-consumer unacknowledged limit."""

    def __init__(self) -> None:
        super().__init__()
        self.glue = Glue(
            Dispatcher(SubscriptionType.SHARED, max_unacked_per_consumer=PER_CONSUMER_LIMIT),
            max_entries=3,
        )

    @rule(size=st.integers(1, 3), count=st.integers(1, 3))
    def append(self, size: int, count: int) -> None:
        for _ in range(count):
            self.glue.append([None] * size)

    @rule()
    def settle(self) -> None:
        glue = self.glue
        glue.settle()
        if any(slot.available for slot in glue.slots.values()):
            waiting = [m for m in glue.messages() if m not in glue.acked and not glue.holder_of(m)]
            assert not waiting, f"{waiting} wait although a consumer could take them"


SharedMachine.TestCase.settings = settings(MACHINE_SETTINGS, max_examples=100)
test_shared = SharedMachine.TestCase


# --- failover -------------------------------------------------------------------------------------


class FailoverMachine(RuleBasedStateMachine):
    """A failover subscription: which consumer is active, what it is told, and the rewinds."""

    def __init__(self) -> None:
        super().__init__()
        self.glue = Glue(Dispatcher(SubscriptionType.FAILOVER), max_entries=3)

    @initialize(partition=st.integers(0, 3))
    def partition(self, partition: int) -> None:
        self.glue.d.partition = partition

    @property
    def live(self) -> list[int]:
        return sorted(self.glue.slots)

    def expected_active(self) -> Slot | None:
        slots = list(self.glue.slots.values())
        if not slots:
            return None
        best = min(s.priority for s in slots)
        ranked = sorted((s for s in slots if s.priority == best), key=lambda s: (s.name, s.seq))
        return ranked[self.glue.d.partition % len(ranked)]

    def active(self) -> Slot | None:
        active = [s for s in self.glue.slots.values() if s.active]
        assert len(active) <= 1, f"several active consumers: {active}"
        return active[0] if active else None

    def check_change(
        self,
        before: Slot | None,
        changes: list[tuple[Slot, bool]],
        rewind: bool,
        *,
        joined: Slot | None = None,
    ) -> None:
        after = self.active()
        assert after is self.expected_active(), f"{after} is active"
        expected: list[tuple[Slot, bool]] = []
        if after is not before:
            if before is not None and before.seq in self.glue.slots:
                expected.append((before, False))
            if after is not None:
                expected.append((after, True))
        if joined is not None and joined is not after:
            expected.append((joined, False))
        assert [(s.seq, a) for s, a in changes] == [(s.seq, a) for s, a in expected]
        if after is not None:
            # a new active consumer starts from the first unacknowledged entry; the same one
            # keeps what it holds (a rewind would deliver that to it again)
            assert rewind == (after is not before), (
                f"rewind={rewind} although the active consumer went from {before} to {after}"
            )

    @rule(size=st.integers(1, 3), count=st.integers(1, 3))
    def append(self, size: int, count: int) -> None:
        for _ in range(count):
            self.glue.append([None] * size)

    @precondition(lambda self: len(self.live) < MAX_LIVE_CONSUMERS)
    @rule(name=st.sampled_from(NAMES), priority=st.integers(0, 1))
    def join(self, name: str, priority: int) -> None:
        before = self.active()
        slot, changes, rewind = self.glue.join(name, priority)
        self.check_change(before, changes, rewind, joined=slot)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.live))
        before = self.active()
        changes, rewind = self.glue.leave(seq)
        self.check_change(before, changes, rewind)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), permits=st.integers(1, 6))
    def flow(self, data: st.DataObject, permits: int) -> None:
        self.glue.flow(data.draw(st.sampled_from(self.live)), permits)

    @rule()
    def dispatch(self) -> None:
        glue = self.glue
        held_before = {seq: dict(held) for seq, held in glue.held.items()}
        glue.dispatch_once()
        active = self.active()
        for seq, held in glue.held.items():
            if active is None or seq != active.seq:
                assert held == held_before[seq], f"inactive consumer {seq} received messages"

    @precondition(lambda self: any(self.glue.held.values()))
    @rule(data=st.data(), cumulative=st.booleans())
    def ack(self, data: st.DataObject, cumulative: bool) -> None:
        seq = data.draw(st.sampled_from([s for s, held in self.glue.held.items() if held]))
        held = self.glue.held[seq]
        entry = data.draw(st.sampled_from(sorted(held)))
        if cumulative:
            self.glue.ack_through(seq, entry)
        else:
            self.glue.ack(seq, entry, set(held[entry]))

    @rule()
    def settle(self) -> None:
        glue = self.glue
        glue.settle()
        active = self.active()
        if active is not None and active.available:
            assert glue.read_pos == len(glue.log), "the active consumer has permits but waits"

    @invariant()
    def one_active(self) -> None:
        assert self.active() is self.expected_active(), f"{self.active()} is active"
        for seq, held in self.glue.held.items():
            slot = self.glue.slots[seq]
            assert slot.active or not held, f"inactive consumer {seq} holds {held}"

    @invariant()
    def nothing_lost(self) -> None:
        self.glue.check_nothing_lost()

    @invariant()
    def books_agree(self) -> None:
        self.glue.check_books()

    def teardown(self) -> None:
        self.glue.drain()


FailoverMachine.TestCase.settings = settings(MACHINE_SETTINGS, max_examples=100)
test_failover = FailoverMachine.TestCase


# --- what the machines found ----------------------------------------------------------------------


def test_key_shared_replay_longer_than_one_read_goes_out() -> None:
    """A consumer leaves holding more entries of one key than the subscription reads from replay
    at a time: the first read's entries go out, the rest (of the same key, later) do not hold
    them back. (They did: the loop re-read the same entries for ever.)"""
    d = Dispatcher(SubscriptionType.KEY_SHARED)
    first, _, _ = d.add("c0")
    d.flow(first, 4)
    k0 = tuple(batch_key_hashes(["k0"]))
    plan = d.assign([Item(position(i), 1, k0) for i in range(4)], NOW_MS)
    assert [a.position for a in plan.assignments] == [position(i) for i in range(4)]
    d.remove(first)
    second, _, _ = d.add("c0")
    d.flow(second, 4)
    candidates = d.replay_candidates(3)
    assert candidates == [position(0), position(1), position(2)]
    replayed = [Item(p, 1, k0, d.replay.pop(p).indexes, fresh=False) for p in candidates]
    plan = d.assign(replayed, NOW_MS)
    assert [(a.slot, a.position) for a in plan.assignments] == [(second, p) for p in candidates]
    assert list(d.replay) == [position(3)]


def test_failover_standby_leaving_does_not_rewind() -> None:
    """An inactive failover consumer leaving changes nothing for the active one: no rewind,
    which would deliver again what the active consumer holds."""
    d = Dispatcher(SubscriptionType.FAILOVER, partition=0)
    active, _, _ = d.add("c0")
    standby, changes, rewind = d.add("c1")
    assert [(s, a) for s, a in changes] == [(standby, False)]
    assert not rewind
    d.flow(active, 1)
    plan = d.assign([Item(position(0), 1)], NOW_MS)
    assert [a.slot for a in plan.assignments] == [active]
    assert d.remove(standby) == ([], False)
    assert position(0) in active.unacked
    changes, rewind = d.remove(active)  # what the active one held must go out again
    assert changes == []
    assert rewind


def test_an_exclusive_consumer_leaving_after_a_redelivery_request_gets_no_entry_twice() -> None:
    """Entries requeued by a redelivery request (Pulsar's client sends one for every negative
    ack on an exclusive subscription) and not yet delivered again when the consumer leaves come
    back with the rewind, once: they are not also left waiting in replay. (They were: the next
    consumer got them twice.)"""
    d = Dispatcher(SubscriptionType.EXCLUSIVE)
    slot, _, _ = d.add("c0")
    d.flow(slot, 10)
    d.assign([Item(position(i), 1) for i in range(3)], NOW_MS)
    d.acked(slot, position(0))
    assert d.requeue(slot, list(slot.unacked)) == 2
    assert sorted(d.replay) == [position(1), position(2)]
    assert d.remove(slot) == ([], True)  # the rewind reads 1 and 2 again
    assert not d.replay


@pytest.mark.parametrize("kind", [SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER])
def test_exclusive_and_failover_consumers_stop_at_the_unacked_limits(
    kind: SubscriptionType,
) -> None:
    """A consumer that never acknowledges gets nothing past ``max_unacked_per_consumer``, and a
    cumulative ack down to half the limit lets it go on; the subscription's limit holds too."""
    d = Dispatcher(kind, max_unacked_per_consumer=4, max_unacked_per_subscription=6)
    slot, _, _ = d.add("c0")
    d.flow(slot, 100)
    plan = d.assign([Item(position(i), 1) for i in range(4)], NOW_MS)
    assert len(plan.assignments) == 4
    blocked = []  # whether the consumer, then the subscription, is blocked after each step
    blocked.append((slot.blocked, d.can_dispatch(), d.fresh_budget()))
    d.acked_through(slot, position(0))  # 3 held: over half the limit
    blocked.append((slot.blocked, d.can_dispatch(), d.fresh_budget()))
    d.acked_through(slot, position(1))  # 2 held: half
    blocked.append((slot.blocked, d.can_dispatch(), d.fresh_budget()))
    assert blocked == [(True, False, 0), (True, False, 0), (False, True, 100 - 4)]
    d = Dispatcher(kind, max_unacked_per_subscription=3)
    slot, _, _ = d.add("c0")
    d.flow(slot, 100)
    d.assign([Item(position(i), 1) for i in range(3)], NOW_MS)
    held = [(d.blocked, d.can_dispatch())]
    d.acked_through(slot, position(0))  # 2 held: over half the limit
    held.append((d.blocked, d.can_dispatch()))
    d.acked_through(slot, position(1))  # 1 held
    held.append((d.blocked, d.can_dispatch()))
    assert held == [(True, False), (True, False), (False, True)]


def test_a_reader_is_not_tracked() -> None:
    """A non-durable reader acknowledges nothing: what it is given is not held, so it is never
    blocked and the dispatcher's memory does not grow with what it reads."""
    d = Dispatcher(
        SubscriptionType.EXCLUSIVE,
        max_unacked_per_consumer=4,
        max_unacked_per_subscription=4,
        track_unacked=False,
    )
    slot, _, _ = d.add("reader")
    d.flow(slot, 1000)
    plan = d.assign([Item(position(i), 3) for i in range(100)], NOW_MS)
    assert len(plan.assignments) == 100
    assert slot.permits == 700
    assert not slot.unacked
    assert slot.unacked_messages == d.unacked_messages == 0
    assert not slot.blocked
    assert not d.blocked


# --- redelivery counts and delayed entries ------------------------------------------------------


def test_a_delayed_negative_ack_is_counted_once_even_if_its_consumer_leaves_first() -> None:
    """A negative ack raises the count at once (a handover before the delay ends keeps it);
    the requeue when the delay ends, or the consumer leaving before it, does not raise it
    again."""
    counts = RedeliveryCounts(100)
    d = Dispatcher(SubscriptionType.SHARED, redelivery_counts=counts)
    first, _, _ = d.add("c0")
    d.flow(first, 10)
    d.assign([Item(position(0), 1), Item(position(1), 1)], NOW_MS)
    d.count_redeliveries(first, [position(0), position(1)])
    d.count_redeliveries(first, [position(0)])  # asked twice: still counted once
    assert counts.items() == [(position(0), 1), (position(1), 1)]
    d.requeue(first, [position(0)])  # its delay ended
    d.remove(first)  # left before position 1's delay ended
    assert counts.items() == [(position(0), 1), (position(1), 1)]
    second, _, _ = d.add("c1")
    d.flow(second, 10)
    replayed = [Item(p, 1, (), d.replay.pop(p).indexes, fresh=False) for p in sorted(d.replay)]
    plan = d.assign(replayed, NOW_MS)
    assert [(a.position, a.redelivery_count) for a in plan.assignments] == [
        (position(0), 1),
        (position(1), 1),
    ]
    d.remove(second)  # left holding both, not counted yet: both rise
    assert counts.items() == [(position(0), 2), (position(1), 2)]
    d.acked(second, position(0))
    assert counts.items() == [(position(1), 2)]


def test_delayed_entries_are_held_aside_up_to_a_bound_without_taking_permits() -> None:
    d = Dispatcher(SubscriptionType.SHARED, max_delayed_entries=3)
    consumer, _, _ = d.add("c0")
    d.flow(consumer, 2)
    later = NOW_MS + 3_600_000
    items = [Item(position(i), 1, deliver_at_ms=later) for i in range(3)]
    plan = d.assign([*items, Item(position(3), 1)], NOW_MS)
    # the due entry goes out; the delayed ones wait aside, taking no permits
    assert [a.position for a in plan.assignments] == [position(3)]
    assert consumer.permits == 1
    assert sorted(d.delayed) == [position(0), position(1), position(2)]
    full_before = d.delayed_full
    assert full_before
    assert d.fresh_budget() == 0  # at the bound: nothing new is read until some are due
    assert d.next_due_ms() == later
    assert d.release_due(later) == 3
    assert not d.delayed_full
    assert sorted(d.replay) == [position(0), position(1), position(2)]
    unbounded = Dispatcher(SubscriptionType.SHARED, max_delayed_entries=0)
    unbounded.assign([Item(position(0), 1, deliver_at_ms=later)], NOW_MS)
    assert not unbounded.delayed_full
