"""Crossing between application threads and the client's loop: Handoff, SendFuture and the
ThreadReceiveQueue, driven from real threads against a real event loop on a thread of its own
(as the sync client runs one).

Nothing here measures time: waits have generous timeouts, and where a test needs a thread to be
waiting before it acts it looks for the waiter's trace (a report the queue sends when a taker
waits on it empty, or the waiter's slot being filled) rather than sleeping.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import pytest
from structlog.testing import capture_logs

from magnetar.aio.handoff import (
    Handoff,
    SendFuture,
    ThreadReceiveQueue,
    in_client_thread,
    mark_client_thread,
    refuse_wait_in_client_thread,
)
from magnetar.aio.message import EntryFacts, Message
from magnetar.aio.message_id import MessageId
from magnetar.common.errors import (
    ConsumerClosedError,
    MagnetarError,
    ProducerClosedError,
    ReceiveTimeoutError,
)
from magnetar.testing.eventually import eventually_sync
from proto.format.v1 import entry_pb2

T = TypeVar("T")

WAIT_S = 10.0
"""How long a test waits for something that should happen at once: only a hang reaches it."""

REFUSED = "would wait on the client's own thread"


# --- threads and a loop of their own ----------------------------------------------------------


class LoopThread:
    """A real event loop running on a thread of its own, as the sync client's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="test-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the loop after whatever it was given before; its result."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as e:
                done.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return done.result(timeout=WAIT_S)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=WAIT_S)
        self.loop.close()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    runner = LoopThread()
    yield runner
    runner.stop()


def in_thread(
    fn: Callable[..., T], *args: Any, client: bool = False
) -> concurrent.futures.Future[T]:
    """Run ``fn(*args)`` on a new thread (marked as a sync client's loop thread when
    ``client``); its outcome as a future."""
    outcome: concurrent.futures.Future[T] = concurrent.futures.Future()

    def main() -> None:
        if client:
            mark_client_thread()
        try:
            outcome.set_result(fn(*args))
        except BaseException as e:
            outcome.set_exception(e)

    threading.Thread(target=main, daemon=True).start()
    return outcome


# --- Handoff ---------------------------------------------------------------------------------


class SteppedLoop:
    """Stands in for the loop where a test runs the wake-ups itself: what was scheduled, in
    order. (Only ``call_soon_threadsafe`` is what a Handoff asks of its loop.)"""

    def __init__(self) -> None:
        self.scheduled: list[Callable[[], object]] = []

    def call_soon_threadsafe(self, callback: Callable[[], object]) -> None:
        self.scheduled.append(callback)

    def run_scheduled(self) -> None:
        callbacks, self.scheduled = self.scheduled, []
        for callback in callbacks:
            callback()


def stepped_handoff() -> tuple[SteppedLoop, Handoff[str], list[list[str]]]:
    loop = SteppedLoop()
    runs: list[list[str]] = []
    return loop, Handoff(cast(Any, loop), runs.append), runs


def test_items_put_from_several_threads_reach_the_loop_in_each_threads_order(
    loop_thread: LoopThread,
) -> None:
    threads, per_thread = 8, 2000
    runs: list[list[tuple[int, int]]] = []
    taken_on: set[int | None] = set()
    all_taken = threading.Event()

    def take(items: list[tuple[int, int]]) -> None:
        taken_on.add(threading.get_ident())
        runs.append(items)
        if sum(map(len, runs)) == threads * per_thread:
            all_taken.set()

    handoff: Handoff[tuple[int, int]] = Handoff(loop_thread.loop, take)
    start = threading.Barrier(threads)

    def put_all(thread: int) -> None:
        start.wait(WAIT_S)
        for index in range(per_thread):
            handoff.put((thread, index))

    putters = [in_thread(put_all, thread) for thread in range(threads)]
    for putter in putters:
        putter.result(WAIT_S)
    assert all_taken.wait(WAIT_S)
    assert taken_on == {loop_thread.ident}
    items = [item for run in runs for item in run]
    assert sorted(items) == [(t, i) for t in range(threads) for i in range(per_thread)]
    for thread in range(threads):
        assert [i for t, i in items if t == thread] == list(range(per_thread))


def test_a_put_while_a_wake_up_is_pending_joins_its_run_instead_of_waking_again() -> None:
    loop, handoff, runs = stepped_handoff()
    handoff.put("a")
    handoff.put("b")
    handoff.put("c")
    assert len(loop.scheduled) == 1
    loop.run_scheduled()
    assert runs == [["a", "b", "c"]]
    handoff.put("d")  # the run was taken: the next put wakes the loop again
    assert len(loop.scheduled) == 1
    loop.run_scheduled()
    assert runs == [["a", "b", "c"], ["d"]]


def test_what_piles_up_while_the_loop_is_busy_is_taken_in_one_run(
    loop_thread: LoopThread,
) -> None:
    runs: list[list[int]] = []
    handoff: Handoff[int] = Handoff(loop_thread.loop, runs.append)
    busy = threading.Event()
    loop_thread.loop.call_soon_threadsafe(busy.wait, WAIT_S)  # the loop blocks until released
    for putter in [in_thread(handoff.put, n) for n in range(3)]:
        putter.result(WAIT_S)
    busy.set()
    loop_thread.call(lambda: None)  # every callback given before this one has run
    assert len(runs) == 1
    assert sorted(runs[0]) == [0, 1, 2]


def test_drain_called_directly_takes_what_is_waiting_and_the_pending_wake_up_finds_nothing() -> (
    None
):
    loop, handoff, runs = stepped_handoff()
    handoff.drain()
    assert runs == []  # nothing waiting: take is not called with an empty run
    handoff.put("a")
    handoff.put("b")
    handoff.drain()  # as before a flush or a seek, without waiting for the wake-up
    assert runs == [["a", "b"]]
    loop.run_scheduled()
    assert runs == [["a", "b"]]
    handoff.put("c")
    assert len(loop.scheduled) == 1
    loop.run_scheduled()
    assert runs == [["a", "b"], ["c"]]


def test_a_put_on_a_closed_loop_raises() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    handoff: Handoff[str] = Handoff(loop, lambda items: None)
    with pytest.raises(RuntimeError):
        handoff.put("late")


def test_every_put_on_a_closed_loop_raises_not_only_the_first() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    handoff: Handoff[str] = Handoff(loop, lambda items: None)
    with pytest.raises(RuntimeError):
        handoff.put("first")
    with pytest.raises(RuntimeError):
        handoff.put("second")


# --- SendFuture ------------------------------------------------------------------------------

MESSAGE_ID = MessageId(7, 3, 1, 0, batch_size=4)


def complete(future: SendFuture, outcome: MessageId | MagnetarError) -> None:
    if isinstance(outcome, MessageId):
        future.confirmed(outcome)
    else:
        future.failed(outcome)


def waiting(future: SendFuture) -> bool:
    """Whether a thread waits on ``future`` (a waiter makes the future's event first)."""
    return future._event is not None


@pytest.mark.parametrize("wait_first", [True, False], ids=["wait-first", "complete-first"])
def test_a_result_waited_for_in_another_thread_is_the_confirmed_message_id(
    wait_first: bool,
) -> None:
    future = SendFuture()
    if not wait_first:
        in_thread(future.confirmed, MESSAGE_ID).result(WAIT_S)
    result = in_thread(future.result, WAIT_S)
    exception = in_thread(future.exception, WAIT_S)
    if wait_first:
        eventually_sync(
            lambda: waiting(future), what="the waiters to wait", timeout_s=WAIT_S, interval_s=0.001
        )
        in_thread(future.confirmed, MESSAGE_ID).result(WAIT_S)
    assert result.result(WAIT_S) == MESSAGE_ID
    assert result.result(WAIT_S).batch_size == 4
    assert exception.result(WAIT_S) is None
    assert future.done()
    assert not future.running()
    assert repr(future) == "<SendFuture done>"


@pytest.mark.parametrize("wait_first", [True, False], ids=["wait-first", "complete-first"])
def test_a_failed_send_raises_its_error_in_the_thread_that_waits(wait_first: bool) -> None:
    future = SendFuture()
    error = ProducerClosedError("closed")
    if not wait_first:
        in_thread(future.failed, error).result(WAIT_S)
    result = in_thread(future.result, WAIT_S)
    exception = in_thread(future.exception, WAIT_S)
    if wait_first:
        eventually_sync(
            lambda: waiting(future), what="the waiters to wait", timeout_s=WAIT_S, interval_s=0.001
        )
        in_thread(future.failed, error).result(WAIT_S)
    assert result.exception(WAIT_S) is error
    assert exception.result(WAIT_S) is error
    assert repr(future) == "<SendFuture failed>"


def test_a_wait_that_runs_out_raises_timeout_error_and_the_future_still_completes() -> None:
    future = SendFuture()
    with pytest.raises(TimeoutError, match=r"not confirmed within 0\.01 s"):
        future.result(0.01)
    with pytest.raises(TimeoutError):
        future.exception(0)
    assert future.running()
    assert not future.done()
    assert repr(future) == "<SendFuture pending>"
    future.confirmed(MESSAGE_ID)
    assert future.result(0) == MESSAGE_ID


def test_a_message_handed_to_the_client_cannot_be_cancelled() -> None:
    future = SendFuture()
    assert future.cancel() is False
    assert future.cancelled() is False
    future.confirmed(MESSAGE_ID)
    assert future.cancel() is False
    assert future.cancelled() is False


@pytest.mark.parametrize(
    "outcome", [MESSAGE_ID, ProducerClosedError("closed")], ids=["confirmed", "failed"]
)
def test_the_send_callback_runs_before_every_done_callback(
    outcome: MessageId | MagnetarError,
) -> None:
    heard: list[object] = []
    future = SendFuture(lambda error, message_id: heard.append(("send", error, message_id)))
    future.add_done_callback(lambda f: heard.append(("done", 1, f.done())))
    future.add_done_callback(lambda f: heard.append(("done", 2, f.done())))
    complete(future, outcome)
    expected = (None, outcome) if isinstance(outcome, MessageId) else (outcome, None)
    assert heard == [("send", *expected), ("done", 1, True), ("done", 2, True)]


def test_done_callbacks_run_once_each_whether_added_before_or_after_completion() -> None:
    heard: list[tuple[str, int | None]] = []
    future = SendFuture()

    def note(name: str) -> Callable[[SendFuture], None]:
        return lambda f: heard.append((name, threading.get_ident()))

    future.add_done_callback(note("before-1"))
    future.add_done_callback(note("before-2"))
    assert heard == []
    completer = in_thread(future.confirmed, MESSAGE_ID)  # as the client's thread does
    completer.result(WAIT_S)
    future.add_done_callback(note("after"))  # runs at once, in the thread that adds it
    names = [name for name, _ in heard]
    assert names == ["before-1", "before-2", "after"]
    assert heard[2][1] == threading.get_ident()
    assert heard[0][1] != threading.get_ident()


def test_a_done_callback_added_while_the_future_completes_runs_exactly_once() -> None:
    """Races add_done_callback in one thread against completion in another, many times."""
    rounds = 3000
    futures = [SendFuture() for _ in range(rounds)]
    calls = [[0, 0] for _ in range(rounds)]
    lock = threading.Lock()
    both = threading.Barrier(2)

    def counter(round_: int, slot: int) -> Callable[[SendFuture], None]:
        def count(_future: SendFuture) -> None:
            with lock:
                calls[round_][slot] += 1

        return count

    def add_callbacks() -> None:
        for round_, future in enumerate(futures):
            future.add_done_callback(counter(round_, 0))  # before: the completer runs it
            both.wait(WAIT_S)
            future.add_done_callback(counter(round_, 1))  # racing the completion

    def complete_all() -> None:
        for future in futures:
            both.wait(WAIT_S)
            future.confirmed(MESSAGE_ID)

    adder, completer = in_thread(add_callbacks), in_thread(complete_all)
    adder.result(WAIT_S * 3)
    completer.result(WAIT_S * 3)
    assert [i for i, counts in enumerate(calls) if counts != [1, 1]] == []


def test_a_callback_that_raises_is_logged_and_the_others_still_run() -> None:
    heard: list[str] = []

    def broken(*_args: object) -> None:
        raise ValueError("application bug")

    # structlog's capture, whatever an earlier test in this process configured logging to
    with capture_logs() as logs:
        future = SendFuture(broken)
        future.add_done_callback(broken)
        future.add_done_callback(lambda f: heard.append("second"))
        future.confirmed(MESSAGE_ID)
        future.add_done_callback(broken)
        future.add_done_callback(lambda f: heard.append("after"))
    assert heard == ["second", "after"]
    assert future.result(0) == MESSAGE_ID
    failures = [e for e in logs if e["event"] == "send_callback_failed"]
    assert len(failures) == 3  # the send callback, and the two broken done-callbacks
    assert all(e.get("exc_info") for e in failures)


def test_waiting_on_the_clients_own_thread_is_refused_unless_the_future_is_done() -> None:
    pending = SendFuture()
    for wait in (pending.result, pending.exception):
        with pytest.raises(RuntimeError, match=REFUSED):
            in_thread(wait, WAIT_S, client=True).result(WAIT_S)
    done = SendFuture()
    done.confirmed(MESSAGE_ID)
    assert in_thread(done.result, None, client=True).result(WAIT_S) == MESSAGE_ID
    failed = SendFuture()
    error = ProducerClosedError("closed")
    failed.failed(error)
    assert in_thread(failed.exception, None, client=True).result(WAIT_S) is error


def test_only_a_marked_thread_counts_as_the_clients_thread() -> None:
    assert not in_client_thread()
    refuse_wait_in_client_thread("anything")  # not the client's thread: no objection
    assert in_thread(in_client_thread, client=True).result(WAIT_S)
    assert not in_thread(in_client_thread).result(WAIT_S)
    with pytest.raises(RuntimeError, match=f"seeking {REFUSED}"):
        in_thread(refuse_wait_in_client_thread, "seeking", client=True).result(WAIT_S)


# --- ThreadReceiveQueue ------------------------------------------------------------------------


class Partition:
    """A fake partition consumer: its stream's generation, and the messages it heard the
    application took (offsets, one list per report)."""

    def __init__(self, name: str, events: list[object] | None = None) -> None:
        self.name = name
        self.generation = 0
        self.reports: list[list[int]] = []
        self.report_threads: set[int] = set()
        self._events = events
        self._heard = threading.Condition()

    def taken(self, messages: list[Message]) -> None:
        with self._heard:
            self.reports.append(offsets(messages))
            self.report_threads.add(threading.get_ident())
            if self._events is not None:
                self._events.append((f"{self.name} taken", offsets(messages)))
            self._heard.notify_all()

    def reported(self) -> list[int]:
        with self._heard:
            return [offset for report in self.reports for offset in report]

    def wait_reported(self, expected: list[int]) -> None:
        """Until the reports add up to ``expected``."""
        with self._heard:
            assert self._heard.wait_for(lambda: self.reported() == expected, WAIT_S), (
                f"{self.name} heard {self.reports}, not {expected}"
            )


def run(first: int, count: int, size: int = 10, topic: str = "t") -> list[Message]:
    """``count`` messages of one delivered entry of ``topic``, offsets ``first ..``."""
    facts = EntryFacts(
        ledger_id=1,
        entry_id=first,
        partition=0,
        batch_size=count,
        first_offset=first,
        publish_time_ms=0,
        redelivery_count=0,
        topic=topic,
        producer_name="p",
        sequence_id=first,
    )
    return [
        Message(facts, entry_pb2.BatchedMessage(value=b"x" * size), index) for index in range(count)
    ]


def offsets(messages: list[Message]) -> list[int]:
    return [m.offset() for m in messages]


@pytest.fixture
def queue(loop_thread: LoopThread) -> ThreadReceiveQueue:
    return ThreadReceiveQueue(loop_thread.loop)


def test_messages_are_taken_in_arrival_order_across_runs_and_partitions(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    a, b = Partition("a"), Partition("b")
    loop_thread.call(queue.put, a, run(0, 3))
    loop_thread.call(queue.put, b, run(100, 3))
    loop_thread.call(queue.put, a, run(3, 2))
    assert len(queue) == 8
    assert queue.take_one(WAIT_S).offset() == 0
    assert offsets(queue.take(3, WAIT_S)) == [1, 2, 100]
    assert len(queue) == 4
    assert offsets(queue.take(10, None)) == [101, 102, 3, 4]  # what is queued, without waiting
    assert len(queue) == 0
    loop_thread.call(queue.flush_taken)
    assert (a.reported(), b.reported()) == ([0, 1, 2, 3, 4], [100, 101, 102])
    assert a.report_threads | b.report_threads == {loop_thread.ident}


def test_a_take_stops_at_max_bytes_but_the_first_message_always_goes(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    a, b = Partition("a"), Partition("b")
    loop_thread.call(queue.put, a, run(0, 5, size=10))
    loop_thread.call(queue.put, b, run(100, 2, size=10))
    assert offsets(queue.take(10, WAIT_S, max_bytes=25)) == [0, 1]
    assert offsets(queue.take(10, WAIT_S, max_bytes=5)) == [2]  # over the budget on its own
    assert offsets(queue.take(10, WAIT_S, max_bytes=30)) == [3, 4, 100]  # across runs
    assert offsets(queue.take(1, WAIT_S, max_bytes=1000)) == [101]  # the limit comes first


def test_a_gathering_take_collects_several_deliveries_until_its_limit(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    a = Partition("a")
    loop_thread.call(queue.put, a, run(0, 2))
    taker = in_thread(lambda: queue.take(5, None, wait_for_more=True))
    # A taker that empties the queue and waits for more reports what it took: then it waits.
    a.wait_reported([0, 1])
    loop_thread.call(queue.put, a, run(2, 1))
    a.wait_reported([0, 1, 2])
    loop_thread.call(queue.put, a, run(3, 4))
    assert offsets(taker.result(WAIT_S)) == [0, 1, 2, 3, 4]
    assert offsets(queue.take(5, WAIT_S)) == [5, 6]


def test_a_gathering_take_gives_what_it_has_when_the_time_is_up_without_raising(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    assert queue.take(5, 0.01, wait_for_more=True) == []
    assert queue.take(5, 0, wait_for_more=True) == []
    loop_thread.call(queue.put, Partition("a"), run(0, 2))
    assert offsets(queue.take(5, 0.01, wait_for_more=True)) == [0, 1]


def test_nothing_to_take_within_the_timeout_is_a_receive_timeout(
    queue: ThreadReceiveQueue,
) -> None:
    with pytest.raises(ReceiveTimeoutError, match="no message within 10 ms"):
        queue.take_one(0.01)
    with pytest.raises(ReceiveTimeoutError):
        queue.take(5, 0.01)
    with pytest.raises(ReceiveTimeoutError):
        queue.take_one(0)


def test_a_failed_queue_gives_what_it_holds_then_raises_its_first_error(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    a = Partition("a")
    loop_thread.call(queue.put, a, run(0, 3))
    closed = ConsumerClosedError("closed")
    loop_thread.call(queue.fail, closed)
    loop_thread.call(queue.fail, ConsumerClosedError("again"))
    assert offsets(queue.take(2, WAIT_S)) == [0, 1]
    assert offsets(queue.take(5, None, wait_for_more=True)) == [2]  # the error comes next time
    for take in (
        lambda: queue.take_one(None),
        lambda: queue.take(5, None),
        lambda: queue.take(5, None, wait_for_more=True),
    ):
        with pytest.raises(ConsumerClosedError) as raised:
            take()
        assert raised.value is closed


def test_failing_the_queue_wakes_a_waiting_taker(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    a = Partition("a")
    loop_thread.call(queue.put, a, run(0, 1))
    gathering = in_thread(lambda: queue.take(5, None, wait_for_more=True))
    a.wait_reported([0])  # it took the one message and waits for more
    single = in_thread(queue.take_one, None)
    eventually_sync(
        lambda: queue._waiting == 2,
        what="the second taker to wait",
        timeout_s=WAIT_S,
        interval_s=0.001,
    )
    loop_thread.call(queue.fail, ConsumerClosedError("closed"))
    assert offsets(gathering.result(WAIT_S)) == [0]
    with pytest.raises(ConsumerClosedError):
        single.result(WAIT_S)


def test_purging_a_partition_drops_only_its_messages_after_reporting_what_was_taken(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    events: list[object] = []
    a, b = Partition("a", events), Partition("b", events)
    loop_thread.call(queue.put, a, run(0, 4))
    loop_thread.call(queue.put, b, run(100, 3))
    loop_thread.call(queue.put, a, run(4, 2))
    assert offsets(queue.take(2, WAIT_S)) == [0, 1]  # a's first run is partly taken
    loop_thread.call(lambda: events.append(("purged b", queue.purge(b))))
    assert events == [("a taken", [0, 1]), ("purged b", 3)]
    assert len(queue) == 4
    assert offsets(queue.take(10, WAIT_S)) == [2, 3, 4, 5]  # the place in the run is kept
    loop_thread.call(lambda: None)  # the report of the queue running empty has come
    assert a.reported() == [0, 1, 2, 3, 4, 5]

    events.clear()
    loop_thread.call(queue.put, a, run(6, 4))
    loop_thread.call(queue.put, b, run(103, 2))
    assert queue.take_one(WAIT_S).offset() == 6
    loop_thread.call(lambda: events.append(("purged a", queue.purge(a))))
    assert events == [("a taken", [6]), ("purged a", 3)]
    assert len(queue) == 2
    assert offsets(queue.take(10, WAIT_S)) == [103, 104]  # b's run starts whole
    assert loop_thread.call(queue.purge, a) == 0


def test_takes_are_reported_to_the_loop_in_groups_not_one_by_one(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    a = Partition("a")
    for first in range(0, 1000, 100):
        loop_thread.call(queue.put, a, run(first, 100))
    taken = [queue.take_one(WAIT_S).offset() for _ in range(1000)]
    loop_thread.call(queue.flush_taken)  # after every report the takes scheduled
    assert taken == list(range(1000))
    assert a.reported() == list(range(1000))
    # one report per few dozen messages at most (plus one per run border crossed)
    assert len(a.reports) < 50


def test_a_report_for_a_stream_that_was_replaced_is_dropped(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    a = Partition("a")
    loop_thread.call(queue.put, a, run(0, 5))
    assert offsets(queue.take(2, WAIT_S)) == [0, 1]

    def reconnect() -> None:
        a.generation += 1  # a new stream: those messages come again on it

    loop_thread.call(reconnect)
    loop_thread.call(queue.flush_taken)
    assert a.reports == []
    loop_thread.call(queue.put, a, run(10, 3))
    assert offsets(queue.take(10, WAIT_S)) == [2, 3, 4, 10, 11, 12]
    loop_thread.call(queue.flush_taken)
    assert a.reported() == [10, 11, 12]


def test_a_queue_that_runs_empty_reports_what_was_taken_without_being_asked(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    a = Partition("a")
    loop_thread.call(queue.put, a, run(0, 3))
    assert offsets(queue.take(10, WAIT_S)) == [0, 1, 2]
    a.wait_reported([0, 1, 2])  # no flush_taken: the permits flow back on their own
    loop_thread.call(queue.put, a, run(3, 1))
    assert queue.take_one(WAIT_S).offset() == 3
    a.wait_reported([0, 1, 2, 3])


def test_flush_taken_reports_what_was_taken_so_far_once(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    a = Partition("a")
    loop_thread.call(queue.put, a, run(0, 5))
    assert offsets(queue.take(2, WAIT_S)) == [0, 1]
    loop_thread.call(lambda: None)
    assert a.reports == []  # three still queued, two taken: not yet worth a report
    loop_thread.call(queue.flush_taken)
    assert a.reports == [[0, 1]]
    loop_thread.call(queue.flush_taken)
    assert a.reports == [[0, 1]]
    assert queue.take_one(WAIT_S).offset() == 2
    loop_thread.call(queue.flush_taken)
    assert a.reports == [[0, 1], [2]]


def test_two_threads_taking_at_once_get_every_message_exactly_once(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    a, b = Partition("a"), Partition("b")
    runs, size = 200, 50

    def take_all(one_by_one: bool) -> list[tuple[str, int]]:
        got: list[tuple[str, int]] = []
        while True:
            try:
                messages = [queue.take_one(None)] if one_by_one else queue.take(7, None)
            except ConsumerClosedError:
                return got
            got.extend((m.topic_name(), m.offset()) for m in messages)

    takers = [in_thread(take_all, True), in_thread(take_all, False)]
    for index in range(runs):
        owner, name = (a, "a") if index % 2 == 0 else (b, "b")
        first = (index // 2) * size
        loop_thread.call(queue.put, owner, run(first, size, topic=name))
    loop_thread.call(queue.fail, ConsumerClosedError("done"))
    got = [taker.result(WAIT_S * 3) for taker in takers]
    expected = {(name, offset) for name in "ab" for offset in range(runs // 2 * size)}
    everything = got[0] + got[1]
    assert len(everything) == len(expected)
    assert set(everything) == expected
    for mine in got:  # each taker sees each partition's messages in order
        for name in "ab":
            seen = [offset for owner, offset in mine if owner == name]
            assert seen == sorted(seen)
    loop_thread.call(queue.flush_taken)
    assert a.reported() == list(range(runs // 2 * size))
    assert b.reported() == list(range(runs // 2 * size))


def test_a_taker_on_the_clients_own_thread_is_refused_rather_than_wait(
    loop_thread: LoopThread, queue: ThreadReceiveQueue
) -> None:
    for take in (lambda: queue.take_one(None), lambda: queue.take(5, WAIT_S)):
        with pytest.raises(RuntimeError, match=REFUSED):
            in_thread(take, client=True).result(WAIT_S)
    loop_thread.call(queue.put, Partition("a"), run(0, 3))
    assert in_thread(queue.take_one, None, client=True).result(WAIT_S).offset() == 0
    assert offsets(in_thread(queue.take, 5, None, client=True).result(WAIT_S)) == [1, 2]


def test_a_gathering_take_on_the_clients_own_thread_is_refused_rather_than_block_the_loop(
    queue: ThreadReceiveQueue,
) -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        in_thread(lambda: queue.take(5, 0.2, wait_for_more=True), client=True).result(WAIT_S)
