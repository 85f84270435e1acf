"""Batch acknowledgement tracking and ack grouping: what the broker's entry-level cursor sees."""

from __future__ import annotations

from magnetar.aio.acks import AckGroup, BatchAckTracker

E1 = (10, 4)
E2 = (10, 5)
E3 = (11, 0)


def test_a_single_message_entry_is_acked_at_once() -> None:
    tracker = BatchAckTracker()
    assert tracker.delivered(E1, 1) == ([0], False)
    assert len(tracker) == 0
    assert tracker.ack(E1, 0)


def test_a_batch_is_acked_once_every_message_is() -> None:
    tracker = BatchAckTracker()
    assert tracker.delivered(E1, 3) == ([0, 1, 2], False)
    assert not tracker.ack(E1, 2)
    assert not tracker.ack(E1, 0)
    assert not tracker.ack(E1, 0)  # twice is once
    assert tracker.ack(E1, 1)
    assert len(tracker) == 0


def test_a_partial_delivery_needs_only_its_own_messages() -> None:
    tracker = BatchAckTracker()
    indexes, _ = tracker.delivered(E1, 5, batch_indexes=[3, 1, 1, 9])
    assert indexes == [1, 3]  # sorted, deduplicated, in range
    assert not tracker.ack(E1, 1)
    assert tracker.ack(E1, 3)


def test_a_redelivered_batch_hands_over_only_unacknowledged_messages() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 4)
    tracker.ack(E1, 0)
    tracker.ack(E1, 2)
    assert tracker.delivered(E1, 4) == ([1, 3], False)
    assert not tracker.ack(E1, 1)
    assert tracker.ack(E1, 3)


def test_a_redelivery_of_only_acknowledged_messages_is_acked_again_not_delivered() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 3)
    tracker.ack(E1, 0)
    assert tracker.delivered(E1, 3, batch_indexes=[0]) == ([], True)
    assert len(tracker) == 0
    # forgotten now: a later redelivery starts over
    assert tracker.delivered(E1, 3) == ([0, 1, 2], False)


def test_an_entry_level_id_or_unknown_entry_acks_the_whole_entry() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 3)
    assert tracker.ack(E1, -1)
    assert len(tracker) == 0
    assert tracker.ack((99, 99), 4)


def test_cumulative_ack_on_the_last_message_acks_its_entry() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 3)
    tracker.delivered(E2, 3)
    assert tracker.ack_cumulative(E2, 2) == E2
    assert len(tracker) == 0  # E1 is covered too


def test_cumulative_ack_inside_a_batch_acks_the_entry_delivered_before_it() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 1)
    tracker.delivered(E3, 3)  # the next ledger: E3 is entry 0
    assert tracker.ack_cumulative(E3, 1) == E1
    # the rest of the batch completes it
    assert tracker.ack(E3, 2)


def test_cumulative_ack_inside_a_batch_falls_back_to_the_previous_entry_id() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E2, 3)  # nothing delivered before it in this session
    assert tracker.ack_cumulative(E2, 0) == (10, 4)
    assert not tracker.ack(E2, 1)
    assert tracker.ack(E2, 2)


def test_cumulative_ack_inside_the_first_batch_of_a_ledger_sends_nothing_yet() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E3, 3)
    assert tracker.ack_cumulative(E3, 0) is None
    assert tracker.ack_cumulative(E3, 2) == E3


def test_cumulative_ack_covering_a_partial_delivery_completes_it() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 5, batch_indexes=[0, 2])
    assert tracker.ack_cumulative(E1, 2) == E1


def test_cumulative_ack_of_an_entry_level_id_acks_the_entry() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 5)
    assert tracker.ack_cumulative(E1, -1) == E1
    assert len(tracker) == 0


def test_clear_forgets_batches_and_history() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 1)
    tracker.delivered(E2, 3)
    tracker.clear()
    tracker.delivered(E3, 3)
    assert tracker.ack_cumulative(E3, 0) is None


def test_the_group_keeps_entries_once_and_the_highest_cumulative() -> None:
    group = AckGroup()
    group.add_individual(E1)
    group.add_individual(E1)
    group.add_individual(E2)
    group.set_cumulative(E2)
    group.set_cumulative(E1)
    assert len(group) == 3
    assert group.take() == ([E1, E2], E2, [])
    assert len(group) == 0
    assert group.take() == ([], None, [])


def test_an_ack_cancels_a_nack_of_the_same_entry_and_a_nack_never_overrides_an_ack() -> None:
    group = AckGroup()
    group.add_nack(E1)
    group.add_nack(E2)
    group.add_individual(E1)
    group.add_nack(E1)
    assert group.take() == ([E1], None, [E2])


def test_what_was_taken_can_be_put_back_for_the_next_stream() -> None:
    group = AckGroup()
    group.add_individual(E2)
    group.set_cumulative(E3)
    taken_individual, taken_cumulative, _ = group.take()
    group.add_individual(E1)
    group.extend(taken_individual, taken_cumulative)
    individual, cumulative, _ = group.take()
    assert sorted(individual) == [E1, E2]
    assert cumulative == E3
