"""Message ids: ordered like the partition stores messages, and stored by applications."""

from __future__ import annotations

import pytest

from magnetar.aio import MessageId
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
