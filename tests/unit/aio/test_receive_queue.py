"""The consumer's receive queue: runs of messages as they arrived, taken whole or in part."""

from __future__ import annotations

from typing import Any, cast

import pytest

from magnetar.aio.consumer import _ReceiveQueue
from magnetar.aio.message import EntryFacts, Message
from magnetar.common.errors import ConsumerClosedError, ReceiveTimeoutError
from proto.format.v1 import entry_pb2


def run(owner: str, first: int, count: int, size: int = 10) -> list[Message]:
    facts = EntryFacts(
        ledger_id=1,
        entry_id=first,
        partition=0,
        batch_size=count,
        first_offset=first,
        publish_time_ms=0,
        redelivery_count=0,
        topic=owner,
        producer_name="p",
        sequence_id=first,
    )
    return [
        Message(facts, entry_pb2.BatchedMessage(value=b"x" * size), index) for index in range(count)
    ]


def offsets(messages: list[Message]) -> list[int]:
    return [m.offset() for m in messages]


async def test_runs_are_taken_in_order_whole_or_in_part_without_mixing_owners() -> None:
    queue = _ReceiveQueue()
    a, b = cast(Any, "a"), cast(Any, "b")
    queue.put(a, run("a", 0, 5))
    queue.put(b, run("b", 100, 3))
    queue.put(a, run("a", 5, 2))
    assert len(queue) == 10
    owner, taken, _ = queue.take(2)
    assert (owner, offsets(taken)) == (a, [0, 1])
    owner, taken, _ = queue.take(10)  # the rest of the first run only: never two owners
    assert (owner, offsets(taken)) == (a, [2, 3, 4])
    await queue.wait(None)
    owner, one = queue.take_one()
    assert (owner, one.offset()) == (b, 100)
    assert len(queue) == 4


async def test_a_byte_limit_cuts_a_run_but_the_first_message_always_goes() -> None:
    queue = _ReceiveQueue()
    owner = cast(Any, "a")
    queue.put(owner, run("a", 0, 5, size=10))
    _, taken, used = queue.take(5, 25)
    assert (offsets(taken), used) == ([0, 1], 20)
    _, taken, used = queue.take(5, 5)  # larger than the budget, but the first goes
    assert (offsets(taken), used) == ([2], 10)
    _, taken, used = queue.take(5, 5, at_least_one=False)
    assert (taken, used) == ([], 0)
    assert len(queue) == 2


async def test_purging_a_partition_keeps_the_others_and_the_place_in_a_partly_taken_run() -> None:
    queue = _ReceiveQueue()
    a, b = cast(Any, "a"), cast(Any, "b")
    queue.put(a, run("a", 0, 4))
    queue.put(b, run("b", 100, 3))
    queue.put(a, run("a", 4, 2))
    queue.take(1)  # the first run of a is partly taken
    assert queue.purge(b) == 3
    assert len(queue) == 5
    _, taken, _ = queue.take(10)
    assert offsets(taken) == [1, 2, 3]  # the place in the partly taken run is kept
    queue.put(b, run("b", 103, 2))
    queue.take(1)  # partly take a's second run, then drop all of a
    assert queue.purge(a) == 1
    _, taken, _ = queue.take(10)
    assert offsets(taken) == [103, 104]  # the next run starts whole
    assert len(queue) == 0


async def test_an_empty_queue_times_out_and_a_failed_one_raises_after_what_it_holds() -> None:
    queue = _ReceiveQueue()
    with pytest.raises(ReceiveTimeoutError):
        await queue.wait(0.01)
    owner = cast(Any, "a")
    queue.put(owner, run("a", 0, 1))
    queue.fail(ConsumerClosedError("closed"))
    await queue.wait(0)
    _, message = queue.take_one()
    assert message.offset() == 0
    with pytest.raises(ConsumerClosedError):
        await queue.wait(0)
