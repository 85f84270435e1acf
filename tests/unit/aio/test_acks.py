"""Batch acknowledgement tracking, ack grouping and ack timeouts: what the broker's entry-level
cursor sees."""

from __future__ import annotations

from magnetar.aio.acks import AckGroup, BatchAckTracker, EntryAck, UnackedMessages

E1 = (10, 4)
E2 = (10, 5)
E3 = (11, 0)


def test_a_single_message_entry_is_acked_at_once() -> None:
    tracker = BatchAckTracker()
    assert tracker.delivered(E1, 1) == [0]
    assert len(tracker) == 0
    assert tracker.ack(E1, 0) == EntryAck(E1)


def test_a_batch_is_acked_once_every_message_is() -> None:
    tracker = BatchAckTracker()
    assert tracker.delivered(E1, 3) == [0, 1, 2]
    assert tracker.ack(E1, 2) is None
    assert tracker.ack(E1, 0) is None
    assert tracker.ack(E1, 0) is None  # twice is once
    assert tracker.ack(E1, 1) == EntryAck(E1)
    assert len(tracker) == 0


def test_a_partial_delivery_needs_only_its_own_messages_and_is_acked_in_part() -> None:
    tracker = BatchAckTracker()
    indexes = tracker.delivered(E1, 5, batch_indexes=[3, 1, 1, 9])
    assert indexes == [1, 3]  # sorted, deduplicated, in range
    assert tracker.ack(E1, 1) is None
    assert tracker.ack(E1, 3) == EntryAck(E1, batch_indexes=(1, 3), batch_size=5)
    assert len(tracker) == 0


def test_more_of_a_tracked_entry_adds_to_what_was_delivered() -> None:
    # key_shared: keys moved, and this consumer now gets other messages of the same entry
    tracker = BatchAckTracker()
    assert tracker.delivered(E1, 6, batch_indexes=[0, 1]) == [0, 1]
    assert tracker.ack(E1, 0) is None
    assert tracker.delivered(E1, 6, batch_indexes=[3, 4]) == [3, 4]
    assert tracker.ack(E1, 3) is None
    assert tracker.ack(E1, 4) is None  # 1 is still out
    assert tracker.ack(E1, 1) == EntryAck(E1, batch_indexes=(0, 1, 3, 4), batch_size=6)


def test_each_completed_part_of_an_entry_is_acked_in_part() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 3, batch_indexes=[0])
    assert tracker.ack(E1, 0) == EntryAck(E1, (0,), 3)
    assert tracker.delivered(E1, 3, batch_indexes=[1, 2]) == [1, 2]
    tracker.ack(E1, 1)
    # the broker puts the parts together
    assert tracker.ack(E1, 2) == EntryAck(E1, (1, 2), 3)


def test_a_partial_delivery_completed_by_a_later_one_is_acked_whole() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 3, batch_indexes=[0, 1])
    tracker.ack(E1, 0)
    assert tracker.delivered(E1, 3, batch_indexes=[2]) == [2]
    tracker.ack(E1, 1)
    assert tracker.ack(E1, 2) == EntryAck(E1)


def test_a_redelivered_batch_hands_over_only_unacknowledged_messages() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 4)
    tracker.ack(E1, 0)
    tracker.ack(E1, 2)
    assert tracker.delivered(E1, 4) == [1, 3]
    assert tracker.ack(E1, 1) is None
    assert tracker.ack(E1, 3) == EntryAck(E1)


def test_a_redelivery_of_only_acknowledged_messages_hands_nothing_over() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 3)
    tracker.ack(E1, 0)
    assert tracker.delivered(E1, 3, batch_indexes=[0]) == []
    # the entry still waits for the messages delivered before
    assert len(tracker) == 1
    assert tracker.ack(E1, 1) is None
    assert tracker.ack(E1, 2) == EntryAck(E1)


def test_an_entry_level_id_or_unknown_entry_acks_the_whole_entry() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 3)
    assert tracker.ack(E1, -1) == EntryAck(E1)
    assert len(tracker) == 0
    assert tracker.ack((99, 99), 4) == EntryAck((99, 99))


def test_dead_lettered_messages_are_counted_on_their_entry_ack() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 3)
    assert tracker.ack(E1, 0, dead_lettered=True) is None
    assert tracker.ack(E1, 1, dead_lettered=True) is None
    assert tracker.ack(E1, 2) == EntryAck(E1, dead_lettered=2)
    assert tracker.ack(E2, 0, dead_lettered=True) == EntryAck(E2, dead_lettered=1)


def test_acked_in_part_lists_entries_with_some_messages_acknowledged() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E1, 4)
    tracker.delivered(E2, 3)
    tracker.delivered(E3, 2, batch_indexes=[1])
    tracker.ack(E1, 2, dead_lettered=True)
    tracker.ack(E1, 0)
    assert tracker.partially_acked() == [
        EntryAck(E1, batch_indexes=(0, 2), batch_size=4, dead_lettered=1)
    ]
    # before an entry is given back, what was acknowledged of it, without the count
    assert tracker.acked_so_far(E1) == EntryAck(E1, batch_indexes=(0, 2), batch_size=4)
    assert tracker.acked_so_far(E2) is None
    assert tracker.acked_so_far((99, 99)) is None


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
    assert tracker.ack(E3, 2) == EntryAck(E3)


def test_cumulative_ack_inside_a_batch_falls_back_to_the_previous_entry_id() -> None:
    tracker = BatchAckTracker()
    tracker.delivered(E2, 3)  # nothing delivered before it in this session
    assert tracker.ack_cumulative(E2, 0) == (10, 4)
    assert tracker.ack(E2, 1) is None
    assert tracker.ack(E2, 2) == EntryAck(E2)


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
    group.add_individual(EntryAck(E1))
    group.add_individual(EntryAck(E1))
    group.add_individual(EntryAck(E2))
    group.set_cumulative(E2)
    group.set_cumulative(E1)
    assert len(group) == 3
    assert group.take() == ([EntryAck(E1), EntryAck(E2)], E2, [])
    assert len(group) == 0
    assert group.take() == ([], None, [])


def test_the_group_merges_acks_of_one_entry() -> None:
    group = AckGroup()
    group.add_individual(EntryAck(E1, (0,), 4))
    group.add_individual(EntryAck(E1, (2,), 4, dead_lettered=1))
    group.add_individual(EntryAck(E2, (0, 1), 3))
    group.add_individual(EntryAck(E2, (2,), 3))  # together: every message of E2
    group.add_individual(EntryAck(E3, (0,), 2))
    group.add_individual(EntryAck(E3, dead_lettered=1))  # a whole ack covers a partial one
    assert group.take() == (
        [
            EntryAck(E1, (0, 2), 4, dead_lettered=1),
            EntryAck(E2),
            EntryAck(E3, dead_lettered=1),
        ],
        None,
        [],
    )


def test_an_ack_cancels_a_nack_of_the_same_entry_and_a_nack_never_overrides_an_ack() -> None:
    group = AckGroup()
    group.add_nack(E1)
    group.add_nack(E2)
    group.add_individual(EntryAck(E1))
    group.add_nack(E1)
    assert group.take() == ([EntryAck(E1)], None, [E2])


def test_a_partial_ack_travels_with_a_nack_of_the_rest_of_its_entry() -> None:
    group = AckGroup()
    group.add_individual(EntryAck(E1, (0,), 3))
    group.add_nack(E1)
    assert group.take() == ([EntryAck(E1, (0,), 3)], None, [E1])


def test_what_was_taken_can_be_put_back_for_the_next_stream() -> None:
    group = AckGroup()
    group.add_individual(EntryAck(E2))
    group.set_cumulative(E3)
    taken_individual, taken_cumulative, _ = group.take()
    group.add_individual(EntryAck(E1))
    group.extend(taken_individual, taken_cumulative)
    individual, cumulative, _ = group.take()
    assert sorted(a.entry for a in individual) == [E1, E2]
    assert cumulative == E3


def test_unacknowledged_messages_expire_by_entry_oldest_first() -> None:
    unacked = UnackedMessages()
    unacked.add(E2, 0, now=1.0)
    unacked.add(E1, 0, now=2.0)
    unacked.add(E1, 1, now=3.0)
    unacked.add(E3, 0, now=9.0)
    assert unacked.expired(0.5) == []
    # one expired message brings its whole entry back
    assert unacked.expired(2.0) == [E2, E1]
    assert len(unacked) == 1
    assert unacked.expired(9.0) == [E3]
    assert len(unacked) == 0


def test_acknowledged_and_nacked_messages_leave_the_ack_timeout_tracker() -> None:
    unacked = UnackedMessages()
    unacked.add(E1, 0, now=1.0)
    unacked.add(E1, 1, now=1.0)
    unacked.add(E2, 0, now=1.0)
    unacked.add(E3, 0, now=1.0)
    unacked.add(E3, 1, now=1.0)
    unacked.remove(E1, 0)
    unacked.remove(E1, 1)
    unacked.remove(E2, -1)  # an entry-level id: the whole entry
    unacked.remove((99, 99), 0)  # unknown: nothing happens
    assert unacked.expired(5.0) == [E3]


def test_a_cumulative_ack_clears_everything_up_to_it() -> None:
    unacked = UnackedMessages()
    for entry in (E1, E2, E3):
        for index in range(3):
            unacked.add(entry, index, now=1.0)
    unacked.remove_up_to(E2, 1)
    assert len(unacked) == 4  # E2:2 and E3:0..2
    assert unacked.expired(5.0) == [E2, E3]


def test_a_message_handed_out_again_restarts_its_clock() -> None:
    unacked = UnackedMessages()
    unacked.add(E1, 0, now=1.0)
    unacked.add(E2, 0, now=2.0)
    unacked.add(E1, 0, now=3.0)
    assert unacked.expired(2.5) == [E2]
    assert unacked.expired(3.0) == [E1]
