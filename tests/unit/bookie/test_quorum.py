"""Striping, ack tracking and recovery decisions: the pure logic of the ledger client."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.client.ledger_metadata import write_set_indexes
from bookie.client.quorum import (
    AckTracker,
    EntryFate,
    entry_fate,
    fencing_complete,
    fencing_impossible,
)

quorums = st.integers(1, 6).flatmap(
    lambda e: st.integers(1, e).flatmap(
        lambda qw: st.tuples(st.just(e), st.just(qw), st.integers(1, qw))
    )
)


@given(quorums, st.integers(0, 10_000))
def test_write_sets_are_qw_consecutive_positions_from_entry_mod_e(q, entry_id) -> None:
    e, qw, _ = q
    indexes = write_set_indexes(entry_id, e, qw)
    assert len(indexes) == len(set(indexes)) == qw
    assert indexes[0] == entry_id % e
    assert all((b - a) % e == 1 for a, b in itertools.pairwise(indexes))


@given(quorums)
def test_striping_spreads_entries_evenly(q) -> None:
    e, qw, _ = q
    # over E consecutive entries every position stores exactly Qw of them
    counts = [0] * e
    for entry_id in range(e):
        for position in write_set_indexes(entry_id, e, qw):
            counts[position] += 1
    assert counts == [qw] * e


@settings(max_examples=300)
@given(
    quorums,
    st.integers(1, 30),
    st.data(),
)
def test_lac_is_the_longest_fully_acked_prefix(q, entries, data) -> None:
    e, qw, qa = q
    bookies = [f"b{i}" for i in range(e)]
    tracker = AckTracker(qa)
    write_sets = {
        entry: [bookies[p] for p in write_set_indexes(entry, e, qw)] for entry in range(entries)
    }
    for entry, write_set in write_sets.items():
        tracker.track(entry, write_set)
    acks = [(entry, bookie) for entry, ws in write_sets.items() for bookie in ws]
    order = data.draw(st.permutations(acks))
    delivered = data.draw(st.integers(0, len(order)))
    completed: list[int] = []
    acked: dict[int, set[str]] = {entry: set() for entry in range(entries)}
    for entry, bookie in order[:delivered]:
        assert tracker.ack(entry, bookie) == (entry > tracker.last_add_confirmed)
        acked[entry].add(bookie)
        completed += tracker.advance()
    expected = -1
    while expected + 1 < entries and len(acked[expected + 1]) >= qa:
        expected += 1
    assert tracker.last_add_confirmed == expected
    assert completed == list(range(expected + 1))  # in order, each once


def test_acks_from_outside_the_write_set_do_not_count() -> None:
    tracker = AckTracker(2)
    tracker.track(0, ["a", "b"])
    assert not tracker.ack(0, "c")
    assert tracker.ack(0, "a")
    assert tracker.advance() == []
    assert tracker.ack(0, "b")
    assert tracker.advance() == [0]
    with pytest.raises(ValueError, match="already tracked or complete"):
        tracker.track(0, ["a", "b"])


def test_replacing_a_bookie_drops_its_acks_and_names_what_to_resend() -> None:
    tracker = AckTracker(2, last_add_confirmed=4)
    for entry in range(5, 9):
        tracker.track(entry, ["a", "b"])
    tracker.ack(5, "a")
    tracker.ack(5, "b")
    tracker.ack(6, "a")
    tracker.ack(7, "b")
    assert tracker.advance() == [5]
    assert tracker.unacked_by("a") == [7, 8]
    # from entry 7 on, "a" is replaced by "c": 7 and 8 must go to c; 6 stays with a
    assert tracker.replace_bookie(7, "a", "c") == [7, 8]
    assert not tracker.ack(7, "a")
    assert tracker.write_set(7) == frozenset({"b", "c"})
    assert tracker.write_set(6) == frozenset({"a", "b"})


def brute_fencing(e: int, qw: int, qa: int, fenced: set[int]) -> bool:
    # definition: in no write quorum can Qa unfenced members still acknowledge
    for start in range(e):
        quorum = set(write_set_indexes(start, e, qw))
        if len(quorum - fenced) >= qa:
            return False
    return True


@given(quorums, st.data())
def test_fencing_complete_matches_its_definition(q, data) -> None:
    e, qw, qa = q
    fenced = data.draw(st.sets(st.integers(0, e - 1)))
    assert fencing_complete(e, qw, qa, fenced) == brute_fencing(e, qw, qa, fenced)


@given(quorums, st.data())
def test_fencing_is_impossible_exactly_when_no_superset_of_survivors_suffices(q, data) -> None:
    e, qw, qa = q
    failed = data.draw(st.sets(st.integers(0, e - 1)))
    survivors = set(range(e)) - failed
    assert fencing_impossible(e, qw, qa, failed) == (not brute_fencing(e, qw, qa, survivors))


def test_one_bookie_down_still_fences_e3_qw2_qa2() -> None:
    for down in range(3):
        alive = {0, 1, 2} - {down}
        assert fencing_complete(3, 2, 2, alive)
        assert not fencing_impossible(3, 2, 2, {down})
    assert fencing_impossible(3, 2, 2, {0, 1})


@pytest.mark.parametrize(
    ("qw", "qa", "found", "not_held", "fate"),
    [
        (2, 2, True, 0, EntryFate.FOUND),
        (2, 2, False, 1, EntryFate.ABSENT),  # one replica lacks it: Qa=2 was never reached
        (2, 2, False, 0, EntryFate.UNKNOWN),  # nobody answered
        (3, 2, False, 1, EntryFate.UNKNOWN),  # the two others might both hold it
        (3, 2, False, 2, EntryFate.ABSENT),
        (3, 1, False, 2, EntryFate.UNKNOWN),
        (3, 1, False, 3, EntryFate.ABSENT),
    ],
)
def test_entry_fate(qw, qa, found, not_held, fate) -> None:
    assert entry_fate(qw, qa, found=found, not_held=not_held) is fate


@given(quorums, st.integers(0, 6), st.booleans())
def test_absent_means_the_entry_could_not_have_been_confirmed(q, not_held, found) -> None:
    _, qw, qa = q
    not_held = min(not_held, qw)
    if entry_fate(qw, qa, found=found, not_held=not_held) is EntryFate.ABSENT:
        assert qw - not_held < qa  # the replicas that might hold it are fewer than Qa
