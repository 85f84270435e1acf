"""What the jobs of one managed ledger share: its lifecycle and its log as confirmed.

A :class:`~broker.managed_ledger.managed_ledger.ManagedLedger` is a facade over collaborators,
one per job (:mod:`.writing`, :mod:`.reading`, :mod:`.seeking`, :mod:`.retention`, and
:mod:`.metadata_writes` which the writer and retention write through). The first four import
none of one another; the facade wires them together with the two objects below and a few
callbacks:

- :class:`Lifecycle`: the state (writing, switching, fenced, closed) every job checks, the
  errors that state means, fencing, and the background tasks;
- :class:`LogState`: the ledger list (replaced by each compare-and-swap of the info) and the
  confirmed end (moved by the writer), which readers never go past.
"""

from __future__ import annotations

import asyncio
import enum
import functools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from structlog.typing import FilteringBoundLogger

from broker.managed_ledger.ledger_list import LedgerList
from broker.managed_ledger.types import Position
from magnetar.common.errors import (
    ManagedLedgerClosedError,
    ManagedLedgerFencedError,
)

_T = TypeVar("_T")


class State(enum.Enum):
    WRITING = "writing"  # a current ledger takes adds
    SWITCHING = "switching"  # closing / recovering the current ledger, starting the next
    FENCED = "fenced"  # another owner took over
    CLOSED = "closed"


@dataclass(slots=True, eq=False)
class LogState:
    """The ledgers and the confirmed end of the log."""

    ledgers: LedgerList
    """Oldest first; the last one is being written (its counts are the confirmed ones)."""
    last_confirmed: Position
    """The last appended and confirmed entry (``Position(-1, -1)`` if none ever was)."""
    confirmed_next_offset: int
    """One past the offset of the last confirmed message."""


class Lifecycle:
    """The state of one managed ledger, its fencing and its background tasks."""

    def __init__(self, name: str, log: FilteringBoundLogger) -> None:
        self.name = name
        self.state = State.WRITING
        self.closing = False
        """True from the moment a close begins."""
        self.fenced = asyncio.Event()
        self.on_fenced: Callable[[ManagedLedgerFencedError], None] | None = None
        """Called once fenced, with the error every waiting and later call gets."""
        self.tasks: set[asyncio.Task[Any]] = set()
        self._log = log

    @property
    def live(self) -> bool:
        """Writing or switching ledgers: neither fenced nor closed."""
        return self.state is State.WRITING or self.state is State.SWITCHING

    @property
    def stopped(self) -> bool:
        """Fenced or closed."""
        return self.state is State.FENCED or self.state is State.CLOSED

    def check_readable(self) -> None:
        if self.state is State.CLOSED:
            raise ManagedLedgerClosedError(
                f"managed ledger {self.name!r} is closed", context={"name": self.name}
            )

    def check_usable(self) -> None:
        self.check_readable()
        if self.state is State.FENCED:
            raise self.fenced_error()

    def check_not_closing(self) -> None:
        if self.closing:
            raise ManagedLedgerClosedError(
                f"managed ledger {self.name!r} is closing", context={"name": self.name}
            )

    def fenced_error(self) -> ManagedLedgerFencedError:
        return ManagedLedgerFencedError(
            f"managed ledger {self.name!r} was taken over by another owner; this instance may"
            " no longer write it",
            context={"name": self.name},
        )

    def fence(self, reason: str) -> None:
        """Another owner took over: from now on every write fails."""
        if self.stopped:
            return
        self.state = State.FENCED
        self.fenced.set()
        self._log.warning("managed_ledger_fenced", reason=reason)
        if self.on_fenced is not None:
            self.on_fenced(self.fenced_error())

    def spawn(self, coro: Coroutine[Any, Any, _T], what: str) -> asyncio.Task[_T]:
        """Run ``coro`` in the background until it ends or the managed ledger closes."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(functools.partial(self._task_done, what))
        return task

    def _task_done(self, what: str, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._log.error("managed_ledger_task_failed", task=what, error=repr(error))

    def cancel_tasks(self) -> None:
        current = asyncio.current_task()
        for task in list(self.tasks):
            if task is not current:
                task.cancel()
