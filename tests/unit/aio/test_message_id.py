"""Message ids: ordered like the partition stores messages, and stored by applications."""

from __future__ import annotations

import copy
import operator
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from magnetar.aio import MessageId
from magnetar.aio.message_id import make_message_id
from magnetar.common.errors import InvalidArgumentError


def test_ids_order_by_ledger_then_entry_then_batch_index() -> None:
    ids = [
        MessageId(2, 0, 0),
        MessageId(1, 5, 1),
        MessageId(1, 5, -1),
        MessageId(1, 5, 0),
        MessageId(1, 0, 9),
    ]
    assert sorted(ids) == [
        MessageId(1, 0, 9),
        MessageId(1, 5, -1),
        MessageId(1, 5, 0),
        MessageId(1, 5, 1),
        MessageId(2, 0, 0),
    ]


def test_batch_size_takes_no_part_in_equality_or_hashing() -> None:
    assert MessageId(1, 2, 3, 0, batch_size=10) == MessageId(1, 2, 3, 0)
    assert len({MessageId(1, 2, 3, 0, batch_size=10), MessageId(1, 2, 3, 0)}) == 1


def test_sentinels_bracket_every_real_id() -> None:
    real = MessageId(7, 3, 2, 0)
    assert MessageId.earliest < real < MessageId.latest
    assert MessageId.earliest.is_earliest()
    assert MessageId.latest.is_latest()
    assert not real.is_earliest()
    assert not real.is_latest()


def test_ids_survive_serialization() -> None:
    original = MessageId(123, 456, 7, 3, batch_size=10)
    again = MessageId.deserialize(original.serialize())
    assert again == original
    assert again.batch_size == 10
    assert MessageId.deserialize(MessageId.earliest.serialize()) == MessageId.earliest


def test_garbage_is_not_a_message_id() -> None:
    with pytest.raises(InvalidArgumentError):
        MessageId.deserialize(b"\xff\xff\xff")


def test_ids_are_immutable_and_printable() -> None:
    message_id = MessageId(1, 2, 3, 4)
    with pytest.raises(AttributeError):
        message_id.entry_id = 9  # type: ignore[misc]
    assert str(message_id) == "1:2:3:4"
    assert message_id.entry == (1, 2)


# --- a tuple underneath: what the rewrite must keep --------------------------------------------


def test_equality_and_hashing_ignore_batch_size_and_nothing_else() -> None:
    base = MessageId(1, 2, 3, 4, batch_size=5)
    assert base == MessageId(1, 2, 3, 4, batch_size=99)
    assert (base != MessageId(1, 2, 3, 4, batch_size=99)) is False
    assert hash(base) == hash(MessageId(1, 2, 3, 4))
    assert {base: "x"}[MessageId(1, 2, 3, 4, batch_size=0)] == "x"
    for other in (
        MessageId(9, 2, 3, 4, 5),
        MessageId(1, 9, 3, 4, 5),
        MessageId(1, 2, 9, 4, 5),
        MessageId(1, 2, 3, 9, 5),
    ):
        assert base != other
        assert (base == other) is False


def test_ids_order_by_ledger_entry_batch_index_then_partition_not_batch_size() -> None:
    ids = [
        MessageId(1, 1, 1, 2, batch_size=1),
        MessageId(1, 1, 1, 1, batch_size=9),
        MessageId(1, 1, 0, 9),
        MessageId(1, 0, 9, 9),
        MessageId(0, 9, 9, 9),
    ]
    assert sorted(ids) == list(reversed(ids))
    low, high = MessageId(1, 1, 1, 1, batch_size=9), MessageId(1, 1, 1, 2, batch_size=1)
    assert low < high
    assert low <= high
    assert high > low
    assert high >= low
    assert not low < MessageId(1, 1, 1, 1, batch_size=0)  # batch_size is no tie-breaker
    assert low <= MessageId(1, 1, 1, 1, batch_size=0)
    assert low >= MessageId(1, 1, 1, 1, batch_size=0)


def test_no_field_of_an_id_can_be_set() -> None:
    message_id = MessageId(1, 2, 3, 4, batch_size=5)
    for name in ("ledger_id", "entry_id", "batch_index", "partition", "batch_size", "other"):
        with pytest.raises(AttributeError):
            setattr(message_id, name, 9)
    with pytest.raises(TypeError):
        message_id[0] = 9  # type: ignore[index]
    assert tuple(message_id) == (1, 2, 3, 4, 5)


def test_fields_have_their_defaults_and_are_read_by_name() -> None:
    message_id = MessageId(1, 2)
    assert (message_id.batch_index, message_id.partition, message_id.batch_size) == (-1, -1, 0)
    full = MessageId(ledger_id=1, entry_id=2, batch_index=3, partition=4, batch_size=5)
    assert (full.ledger_id, full.entry_id, full.batch_index) == (1, 2, 3)
    assert (full.partition, full.batch_size, full.entry) == (4, 5, (1, 2))


@pytest.mark.parametrize(
    "round_trip",
    [
        lambda m: pickle.loads(pickle.dumps(m)),
        lambda m: pickle.loads(pickle.dumps(m, protocol=0)),
        copy.copy,
        copy.deepcopy,
        lambda m: copy.deepcopy({"ids": [m]})["ids"][0],
    ],
    ids=["pickle", "pickle-protocol-0", "copy", "deepcopy", "deepcopy-in-a-container"],
)
def test_pickling_and_copying_keep_every_field_and_the_type(
    round_trip: Callable[[MessageId], MessageId],
) -> None:
    original = MessageId(123, 456, 7, 3, batch_size=10)
    again = round_trip(original)
    assert type(again) is MessageId
    assert again == original
    assert tuple(again) == (123, 456, 7, 3, 10)
    assert again.batch_size == 10
    assert round_trip(MessageId.latest).is_latest()


def test_serialization_keeps_every_field_including_negative_ones() -> None:
    for original in (MessageId(1, 2), MessageId(1, 2, 3, 4, 5), MessageId.latest):
        again = MessageId.deserialize(original.serialize())
        assert type(again) is MessageId
        assert tuple(again) == tuple(original)


def test_repr_shows_every_field_and_str_the_compared_ones() -> None:
    message_id = MessageId(1, 2, 3, 4, batch_size=5)
    assert repr(message_id) == (
        "MessageId(ledger_id=1, entry_id=2, batch_index=3, partition=4, batch_size=5)"
    )
    assert str(MessageId(1, 2)) == "1:2:-1:-1"
    assert eval(repr(message_id)) == message_id  # a repr that reads back


def test_earliest_and_latest_are_whole_entries_at_either_end() -> None:
    assert tuple(MessageId.earliest) == (-1, -1, -1, -1, 0)
    assert tuple(MessageId.latest) == (2**63 - 1, 2**63 - 1, -1, -1, 0)
    assert MessageId(-1, -1, 5, 2).is_earliest()  # any id of that entry
    assert MessageId(2**63 - 1, 2**63 - 1, 0, 0).is_latest()
    assert not MessageId(-1, 0).is_earliest()


def test_the_fast_constructor_makes_the_same_id() -> None:
    fields = (1, 2, 3, 4, 5)
    made = make_message_id(fields)
    assert type(made) is MessageId
    assert made == MessageId(*fields)
    assert tuple(made) == fields
    assert made.batch_size == 5
    assert hash(made) == hash(MessageId(*fields))


@pytest.mark.parametrize("other", [None, 1, "1:2:3:4", 1.0, object(), [1, 2, 3, 4, 0]])
def test_comparing_with_something_else_is_unequal_and_unordered(other: Any) -> None:
    message_id = MessageId(1, 2, 3, 4)
    assert message_id != other
    assert (message_id == other) is False
    for compare in (operator.lt, operator.le, operator.gt, operator.ge):
        with pytest.raises(TypeError):
            compare(message_id, other)


@pytest.mark.parametrize("other", [(1, 2, 3, 4, 0), (1, 2, 3, 4), (5,)])
def test_a_plain_tuple_is_not_a_message_id_either(other: tuple[int, ...]) -> None:
    message_id = MessageId(1, 2, 3, 4)
    assert message_id != other
    assert (message_id == other) is False
    with pytest.raises(TypeError):
        _ = message_id < other
