"""Crossing between the application's threads and the client's event loop, in runs.

The sync client (:mod:`magnetar.client`) runs the asyncio client on a loop of its own thread.
Crossing to that thread and back costs tens of microseconds (a wake-up, a context switch, the
GIL handed over twice), so a per-message call must not cross on its own:

- :class:`Handoff` carries calls to the loop: the calling thread appends to a list under a
  lock and wakes the loop only when no wake-up is pending already; the loop takes everything
  waiting at once. A loop of ``acknowledge`` calls thus reaches the loop as runs of hundreds.
- :class:`ThreadReceiveQueue` holds received messages where any thread can take them under a
  plain lock, without the loop. What the threads took is reported back to the loop in groups
  (the permits it frees, the unacknowledged messages to track).
- :class:`SendFuture` is one message's outcome: a few slots, set on the loop, read from any
  thread; a waiter's event is made only when someone waits before it is done.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from magnetar.common.errors import MagnetarError, ReceiveTimeoutError
from magnetar.common.log import get_library_logger

if TYPE_CHECKING:
    from magnetar.aio.message import Message
    from magnetar.aio.message_id import MessageId

__all__ = [
    "Handoff",
    "SendFuture",
    "ThreadReceiveQueue",
    "in_client_thread",
    "mark_client_thread",
    "refuse_wait_in_client_thread",
]

log = get_library_logger("magnetar.aio.handoff", component="client")

T = TypeVar("T")
_PENDING, _DONE, _FAILED = 0, 1, 2
_LOCK = threading.Lock()
"""Guards the rare paths of every SendFuture: waiters and done-callbacks joining one."""
_THREAD = threading.local()
_REPORT_EVERY = 64
"""Messages taken by the application before the loop is told, unless the queue ran empty."""


def mark_client_thread() -> None:
    """Called by a sync client's loop thread once: waits there would never end."""
    _THREAD.client = True


def in_client_thread() -> bool:
    """Whether the caller is a sync client's loop thread (a callback running there)."""
    return getattr(_THREAD, "client", False)


def refuse_wait_in_client_thread(what: str) -> None:
    """Raise instead of waiting for the client's loop on that very loop's thread."""
    if getattr(_THREAD, "client", False):
        raise RuntimeError(
            f"{what} would wait on the client's own thread, which runs the callbacks (a"
            " send_async callback, on_active_change?) and must not block: use the"
            " magnetar.aio client there, or hand the work to another thread"
        )


class Handoff(Generic[T]):
    """Items from any thread, taken on the loop in runs by ``take(items)``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, take: Callable[[list[T]], None]) -> None:
        self._loop = loop
        self._take = take
        self._items: list[T] = []
        self._lock = threading.Lock()
        self._scheduled = False

    def put(self, item: T) -> None:
        """Queue ``item`` for the loop (from any thread; never waits for the loop). Raises
        RuntimeError when the loop is closed."""
        with self._lock:
            self._items.append(item)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self.drain)
        except RuntimeError:  # the loop is closed: so is every later put
            with self._lock:
                self._scheduled = False
            raise

    def drain(self) -> None:
        """Take what is waiting now (on the loop; also called directly before a flush)."""
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        if items:
            self._take(items)


class SendFuture:
    """The outcome of one message sent by the sync client's ``send_async``.

    ``result(timeout)`` waits for the message id (or raises the send's error); ``done()``,
    ``exception(timeout)`` and ``add_done_callback(fn)`` behave as a
    ``concurrent.futures.Future``'s (it is not one: it costs a fraction of one, and
    ``concurrent.futures.wait`` does not take it). The send's own ``callback(error,
    message_id)`` runs on the client's thread when the broker answered, before any
    done-callback.
    """

    __slots__ = ("_callback", "_callbacks", "_event", "_state", "_value")

    def __init__(
        self, callback: Callable[[MagnetarError | None, MessageId | None], None] | None = None
    ) -> None:
        self._callback = callback
        self._state = _PENDING
        self._value: Any = None
        self._event: threading.Event | None = None
        self._callbacks: list[Callable[[SendFuture], object]] | None = None

    # --- set once, on the loop (or in the caller when the message never got queued) --------

    def confirmed(self, message_id: MessageId) -> None:
        self._value = message_id
        self._state = _DONE
        if self._callback is not None:
            _call(self._callback, None, message_id)
        if self._event is not None or self._callbacks is not None:
            self._wake()

    def failed(self, error: MagnetarError) -> None:
        self._value = error
        self._state = _FAILED
        if self._callback is not None:
            _call(self._callback, error, None)
        if self._event is not None or self._callbacks is not None:
            self._wake()

    def _wake(self) -> None:
        # A waiter that made its event after we looked sees the state set before we looked
        # (every step here is atomic under the GIL), so nobody sleeps for ever.
        event = self._event
        if event is not None:
            event.set()
        if self._callbacks is not None:
            self._run_done_callbacks()

    def _run_done_callbacks(self) -> None:
        with _LOCK:  # the loop and a late add_done_callback may both get here: run them once
            callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            _call(callback, self)

    # --- read from any thread ----------------------------------------------------------------

    def done(self) -> bool:
        return self._state != _PENDING

    def running(self) -> bool:
        return self._state == _PENDING

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        """A message handed to the client cannot be called back: False."""
        return False

    def _wait(self, timeout: float | None) -> None:
        if self._state != _PENDING:
            return
        refuse_wait_in_client_thread("waiting for a send's result")
        with _LOCK:
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        if self._state != _PENDING:
            return
        if not event.wait(timeout):
            raise TimeoutError(f"the message was not confirmed within {timeout} s")

    def result(self, timeout: float | None = None) -> MessageId:
        """The message id, once the broker stored the message durably (waits up to
        ``timeout`` seconds; None: as long as it takes, bounded by ``send_timeout_ms``)."""
        self._wait(timeout)
        if self._state == _FAILED:
            raise self._value
        message_id: MessageId = self._value
        return message_id

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._value if self._state == _FAILED else None

    def add_done_callback(self, fn: Callable[[SendFuture], object]) -> None:
        """``fn(future)`` once done: at once (in this thread) if it is, else on the client's
        thread."""
        with _LOCK:
            added = self._state == _PENDING
            if added:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
        if not added:
            _call(fn, self)
        elif self._state != _PENDING:
            self._run_done_callbacks()  # it completed while we added: the loop may not see it

    def __repr__(self) -> str:
        state = {_PENDING: "pending", _DONE: "done", _FAILED: "failed"}[self._state]
        return f"<SendFuture {state}>"


def _call(callback: Callable[..., object], *args: object) -> None:
    try:
        callback(*args)
    except Exception:  # an application callback must not break the client
        log.exception("send_callback_failed")


class TakenReport(Protocol):
    """What a :class:`ThreadReceiveQueue` tells a partition consumer on the loop."""

    @property
    def generation(self) -> int: ...

    def taken(self, messages: list[Message]) -> None: ...


class _Taken:
    """Messages ``start:end`` of one delivered run, taken by the application."""

    __slots__ = ("end", "generation", "messages", "owner", "start")

    def __init__(
        self, owner: TakenReport, generation: int, messages: list[Message], start: int
    ) -> None:
        self.owner = owner
        self.generation = generation
        self.messages = messages
        self.start = start
        self.end = start


class ThreadReceiveQueue:
    """Received messages of every partition in arrival order, taken by any thread without the
    event loop: the sync consumer's (and its listener thread's) receive queue.

    The loop puts whole runs (a delivery each) under the lock; a taker waits on a condition only
    when the queue is empty. What was taken goes back to the loop in groups (every
    ``_REPORT_EVERY`` messages, when the queue runs empty, and before any acknowledgement,
    seek, purge or ack-timeout check is applied there): each partition hears what the
    application took, which returns its permits and tracks its unacknowledged messages, unless
    the partition's stream changed since (those messages come again on the new stream; the new
    stream was granted a whole queue of permits).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._runs: deque[tuple[TakenReport, int, list[Message]]] = deque()
        self._head = 0
        self._count = 0
        self._error: MagnetarError | None = None
        self._lock = threading.Lock()
        self._nonempty = threading.Condition(self._lock)
        self._waiting = 0
        self._taken: list[_Taken] = []
        self._unreported = 0
        self._report_scheduled = False

    def __len__(self) -> int:
        return self._count

    # --- on the loop -----------------------------------------------------------------------

    def put(self, owner: TakenReport, messages: list[Message]) -> None:
        with self._lock:
            self._runs.append((owner, owner.generation, messages))
            self._count += len(messages)
            if self._waiting:
                self._nonempty.notify()

    def purge(self, owner: TakenReport) -> int:
        """Drop the queued messages of one partition; how many. What the application took
        before is reported first (a reader's position, the permits of the old stream)."""
        with self._lock:
            taken, self._taken = self._taken, []
            self._unreported = 0
            before = self._count
            if before:
                if self._runs[0][0] is owner:
                    self._head = 0
                self._runs = deque(run for run in self._runs if run[0] is not owner)
                self._count = sum(len(run[2]) for run in self._runs) - self._head
            dropped = before - self._count
        self._apply(taken)
        return dropped

    def fail(self, error: MagnetarError) -> None:
        """After what is queued, every take raises ``error``."""
        with self._lock:
            if self._error is None:
                self._error = error
            self._nonempty.notify_all()

    def flush_taken(self) -> None:
        """Tell the partitions now what the application took (on the loop)."""
        with self._lock:
            taken, self._taken = self._taken, []
            self._unreported = 0
            self._report_scheduled = False
        self._apply(taken)

    @staticmethod
    def _apply(taken: list[_Taken]) -> None:
        for part in taken:
            owner = part.owner
            if part.generation == owner.generation:
                messages = part.messages
                if part.start or part.end < len(messages):
                    messages = messages[part.start : part.end]
                owner.taken(messages)

    # --- on any thread -----------------------------------------------------------------------

    def take_one(self, timeout_s: float | None) -> Message:
        """The next message, waiting up to ``timeout_s`` (None: for ever);
        :class:`ReceiveTimeoutError` when none came, the queue's error once it failed and is
        empty."""
        with self._lock:
            if not self._count:
                self._wait_locked(timeout_s)
            owner, generation, messages = self._runs[0]
            head = self._head
            message = messages[head]
            self._note_taken(owner, generation, messages, head, head + 1)
            if head + 1 == len(messages):
                self._runs.popleft()
                self._head = 0
            else:
                self._head = head + 1
            self._count -= 1
            schedule = self._should_report()
        if schedule:
            self._loop.call_soon_threadsafe(self.flush_taken)
        return message

    def take(
        self,
        limit: int,
        timeout_s: float | None,
        *,
        max_bytes: int | None = None,
        wait_for_more: bool = False,
    ) -> list[Message]:
        """Up to ``limit`` messages, waiting up to ``timeout_s`` (None: for ever) for the
        first; :class:`ReceiveTimeoutError` when none came. With ``wait_for_more`` the messages
        of several deliveries are gathered until ``limit`` or ``max_bytes`` or the timeout
        (a batch receive); then an empty list is no error. The first message is taken even
        when it is over ``max_bytes`` on its own."""
        taken: list[Message] = []
        size = 0
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while len(taken) < limit:
                if not self._count:
                    if taken and (not wait_for_more or in_client_thread()):
                        break  # (the client's thread must not wait for more)
                    remaining = None if deadline is None else deadline - time.monotonic()
                    try:
                        self._wait_locked(remaining)
                    except ReceiveTimeoutError:
                        if taken or wait_for_more:
                            break
                        raise ReceiveTimeoutError(
                            f"no message within {(timeout_s or 0) * 1000:.0f} ms",
                            context={"timeout_ms": round((timeout_s or 0) * 1000)},
                        ) from None
                    except MagnetarError:
                        if taken:
                            break  # the error comes again on the next call, after these
                        raise
                before = len(taken)
                size = self._take_locked(taken, limit, max_bytes, size)
                if len(taken) == before:
                    break  # the next message is over what is left of max_bytes
                if max_bytes is not None and size >= max_bytes:
                    break
            schedule = self._should_report()
        if schedule:
            self._loop.call_soon_threadsafe(self.flush_taken)
        return taken

    def _wait_locked(self, timeout_s: float | None) -> None:
        """Until the queue holds a message (lock held); raises the queue's error once it failed
        and is empty, :class:`ReceiveTimeoutError` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._count:
            if self._error is not None:
                raise self._error
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise ReceiveTimeoutError(
                    f"no message within {(timeout_s or 0) * 1000:.0f} ms",
                    context={"timeout_ms": round((timeout_s or 0) * 1000)},
                )
            refuse_wait_in_client_thread("receiving")
            if self._unreported and not self._report_scheduled:
                # the queue ran empty: the permits of what was taken must reach the broker
                self._report_scheduled = True
                self._loop.call_soon_threadsafe(self.flush_taken)
            self._waiting += 1
            try:
                self._nonempty.wait(remaining)
            finally:
                self._waiting -= 1

    def _note_taken(
        self, owner: TakenReport, generation: int, messages: list[Message], start: int, end: int
    ) -> None:
        taken = self._taken
        last = taken[-1] if taken else None
        if last is not None and last.messages is messages and last.end == start:
            last.end = end
        else:
            part = _Taken(owner, generation, messages, start)
            part.end = end
            taken.append(part)
        self._unreported += end - start

    def _should_report(self) -> bool:
        if self._report_scheduled or not self._unreported:
            return False
        if self._count and self._unreported < _REPORT_EVERY:
            return False
        self._report_scheduled = True
        return True

    def _take_locked(
        self, taken: list[Message], limit: int, max_bytes: int | None, size: int
    ) -> int:
        """Move messages of the first run into ``taken``; the payload bytes taken so far."""
        owner, generation, messages = self._runs[0]
        head = self._head
        end = min(len(messages), head + limit - len(taken))
        if max_bytes is not None:
            for index in range(head, end):
                message_size = messages[index].size()
                if size + message_size > max_bytes and (taken or index > head):
                    end = index
                    break
                size += message_size
        if end <= head:
            return size
        taken.extend(messages[head:end] if head or end < len(messages) else messages)
        self._note_taken(owner, generation, messages, head, end)
        if end == len(messages):
            self._runs.popleft()
            self._head = 0
        else:
            self._head = end
        self._count -= end - head
        return size
