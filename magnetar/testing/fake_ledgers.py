"""An in-memory ledger client for managed-ledger and broker tests: ledgers without bookies.

:class:`FakeBookies` holds every ledger of one pretend cluster; each :meth:`FakeBookies.client`
is one broker's ledger client, with the shape of the managed ledger's port
(:class:`broker.managed_ledger.ports.LedgerClientApi`, which
``tests/unit/broker/managed_ledger/test_ports.py`` checks). It keeps the rules the managed
ledger relies on:

- one writer per ledger; adds are confirmed in order, each with the next entry id;
- opening a ledger with ``recovery=True`` (or :meth:`FakeLedgerClient.recover`) **fences** it:
  the writer's later adds and its close fail with ``LedgerFencedError``, and the ledger is
  closed at its last confirmed entry;
- a read handle reads up to its ``last_add_confirmed`` (``ReadBeyondLacError`` past it);
- deleting a ledger that does not exist raises ``LedgerNotFoundError``.

**Fault hooks**, in the spirit of BookKeeper's ``MockBookieClient``: :attr:`FakeBookies.add_hook`
and :attr:`FakeBookies.read_hook` are awaited before each add and each read, and may delay it
(``await asyncio.sleep(...)``), or fail it by raising a ``MagnetarError``. An add whose hook
raises ``EnsembleUnrepairableError`` leaves the ledger its writer's, as a real writer with no
replacement bookie does (its owner then calls ``close_confirmed``); any other error just fails
that add. :attr:`FakeBookies.writable` is what ``writable_bookies()`` answers.

What it does not model: bookies, ensembles, quorums, replicas, LAC piggybacking, network
errors. Tests of those run real bookies (``magnetar.testing.inprocess``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from bookie.client.ledger_metadata import LedgerState
from bookie.client.read_handle import check_readable
from magnetar.common.errors import (
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerNotFoundError,
    MagnetarError,
    NotEnoughBookiesError,
)

AddHook = Callable[[int, int, bytes], Awaitable[None]]
"""``(ledger_id, entry_id, payload)``: awaited before an add is confirmed."""
ReadHook = Callable[[int, int, int], Awaitable[None]]
"""``(ledger_id, first_entry_id, last_entry_id)``: awaited before a read returns."""


@dataclass(frozen=True, slots=True)
class FakeEntry:
    ledger_id: int
    entry_id: int
    payload: bytes


@dataclass(slots=True)
class FakeMetadata:
    """A ledger's metadata as the managed ledger (and tests) read it."""

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    custom: Mapping[str, bytes] = field(default_factory=dict)
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    intended_ensemble_size: int = 0

    @property
    def closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def under_striped(self) -> bool:
        return self.ensemble_size < self.intended_ensemble_size


@dataclass(slots=True)
class _Ledger:
    metadata: FakeMetadata
    entries: list[bytes] = field(default_factory=list)
    fenced: bool = False


class FakeBookies:
    """The ledgers of one pretend cluster, shared by every :meth:`client`."""

    def __init__(self, *, writable: int = 3) -> None:
        self._ledgers: dict[int, _Ledger] = {}
        self._ids = itertools.count(1)
        self.writable = writable
        self.add_hook: AddHook | None = None
        self.read_hook: ReadHook | None = None
        self.adds = 0
        self.reads = 0

    def client(self) -> FakeLedgerClient:
        return FakeLedgerClient(self)

    def ledger_ids(self) -> set[int]:
        return set(self._ledgers)

    def _get(self, ledger_id: int) -> _Ledger:
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            raise LedgerNotFoundError(
                f"ledger {ledger_id} does not exist", context={"ledger": ledger_id}
            )
        return ledger

    def _create(
        self, ensemble_size: int, write_quorum: int, ack_quorum: int, custom: Mapping[str, bytes]
    ) -> _Ledger:
        ledger_id = next(self._ids)
        got = min(ensemble_size, self.writable)
        if got < write_quorum:
            raise NotEnoughBookiesError(
                f"not enough writable bookies for a new ledger: {self.writable} writable,"
                f" need {write_quorum} (Qw={write_quorum})"
            )
        ledger = _Ledger(
            FakeMetadata(
                ledger_id,
                got,
                write_quorum,
                ack_quorum,
                dict(custom),
                intended_ensemble_size=ensemble_size,
            )
        )
        self._ledgers[ledger_id] = ledger
        return ledger

    def _fence(self, ledger_id: int) -> FakeMetadata:
        ledger = self._get(ledger_id)
        ledger.fenced = True
        ledger.metadata.state = LedgerState.CLOSED
        return ledger.metadata


class FakeLedgerClient:
    """One broker's ledger client over :class:`FakeBookies`."""

    def __init__(self, bookies: FakeBookies) -> None:
        self.bookies = bookies
        self.ledgers = _LedgerMetadataReader(bookies)
        """``read(ledger_id)`` and ``ledger_ids()``, as the real client's ``ledgers``."""

    async def create_ledger(
        self,
        *,
        ensemble_size: int | None = None,
        write_quorum: int | None = None,
        ack_quorum: int | None = None,
        custom: Mapping[str, bytes] | None = None,
    ) -> FakeWriter:
        e = ensemble_size or 3
        qw = write_quorum or min(2, e)
        qa = ack_quorum or qw
        if not 1 <= qa <= qw <= e:
            raise InvalidArgumentError(
                f"quorums must satisfy 1 <= Qa <= Qw <= E: E{e}/Qw{qw}/Qa{qa}"
            )
        ledger = self.bookies._create(e, qw, qa, custom or {})
        return FakeWriter(self.bookies, ledger)

    async def open_ledger(self, ledger_id: int, *, recovery: bool = True) -> FakeReader:
        ledger = self.bookies._get(ledger_id)
        if recovery and not ledger.metadata.closed:
            self.bookies._fence(ledger_id)
        return FakeReader(self.bookies, ledger)

    async def recover(self, ledger_id: int) -> FakeMetadata:
        ledger = self.bookies._get(ledger_id)
        if not ledger.metadata.closed:
            self.bookies._fence(ledger_id)
        return ledger.metadata

    async def delete_ledger(self, ledger_id: int) -> None:
        self.bookies._get(ledger_id)
        del self.bookies._ledgers[ledger_id]

    def writable_bookies(self) -> int:
        return self.bookies.writable

    async def close(self) -> None:
        pass


class _LedgerMetadataReader:
    def __init__(self, bookies: FakeBookies) -> None:
        self._bookies = bookies

    async def read(self, ledger_id: int) -> FakeMetadata:
        return self._bookies._get(ledger_id).metadata

    async def ledger_ids(self) -> list[int]:
        return sorted(self._bookies.ledger_ids())


class FakeWriter:
    """A write handle: adds confirmed in order (after the add hook), until fenced or closed."""

    def __init__(self, bookies: FakeBookies, ledger: _Ledger) -> None:
        self._bookies = bookies
        self._ledger = ledger
        self._tail: asyncio.Future[int] | None = None
        self._outstanding: set[asyncio.Future[int]] = set()
        self._next_entry_id = 0
        self._failed: MagnetarError | None = None
        self._failed_at = -1
        """The first add that failed: it and every later one fail, the earlier ones not."""

    @property
    def ledger_id(self) -> int:
        return self._ledger.metadata.ledger_id

    @property
    def metadata(self) -> FakeMetadata:
        return self._ledger.metadata

    def _fenced(self) -> LedgerFencedError:
        return LedgerFencedError(
            f"ledger {self.ledger_id} was fenced by a recovering client",
            context={"ledger": self.ledger_id},
        )

    async def add_async(self, payload: bytes) -> asyncio.Future[int]:
        return self.add_nowait(payload)

    def add_nowait(self, payload: bytes) -> asyncio.Future[int]:
        """Never full: the fake has no pending limits."""
        entry_id = self._next_entry_id
        self._next_entry_id += 1
        previous = self._tail
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._tail = done
        task = asyncio.ensure_future(self._add(entry_id, bytes(payload), previous))
        task.add_done_callback(lambda t: _settle(done, t))
        self._outstanding.add(task)
        task.add_done_callback(self._outstanding.discard)
        return done

    async def _add(
        self, entry_id: int, payload: bytes, previous: asyncio.Future[int] | None
    ) -> int:
        try:
            hook = self._bookies.add_hook
            if hook is not None:
                await hook(self.ledger_id, entry_id, payload)
            if previous is not None:
                # in order: nothing after a failed add is confirmed
                await asyncio.wait([previous])
            self._check_writable(entry_id)
        except MagnetarError as e:
            if self._failed is None or entry_id < self._failed_at:
                self._failed, self._failed_at = e, entry_id
            raise
        ledger = self._ledger
        if entry_id != len(ledger.entries):
            raise LedgerClosedError(f"ledger {self.ledger_id}: entry {entry_id} is out of order")
        ledger.entries.append(payload)
        ledger.metadata.last_entry_id = entry_id
        ledger.metadata.length += len(payload)
        self._bookies.adds += 1
        return entry_id

    def _check_writable(self, entry_id: int) -> None:
        if self._ledger.fenced:
            raise self._fenced()
        if self._ledger.metadata.closed:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
        if self._failed is not None and entry_id > self._failed_at:
            raise self._failed

    async def _settled(self) -> None:
        """Every add sent has ended (confirmed or failed)."""
        if self._outstanding:
            await asyncio.wait(list(self._outstanding))

    async def close(self) -> FakeMetadata:
        await self._settled()
        if self._ledger.fenced:
            raise self._fenced()
        if self._failed is not None:
            raise self._failed
        self._ledger.metadata.state = LedgerState.CLOSED
        return self._ledger.metadata

    async def close_confirmed(self) -> FakeMetadata:
        await self._settled()
        if self._ledger.fenced:
            raise self._fenced()
        self._ledger.metadata.state = LedgerState.CLOSED
        return self._ledger.metadata


def _settle(done: asyncio.Future[int], task: asyncio.Future[int]) -> None:
    if done.done():
        return
    if task.cancelled():
        done.cancel()
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(task.result())


class FakeReader:
    """A read handle: reads up to ``last_add_confirmed`` (after the read hook)."""

    def __init__(self, bookies: FakeBookies, ledger: _Ledger) -> None:
        self._bookies = bookies
        self._ledger = ledger
        self.last_add_confirmed = ledger.metadata.last_entry_id

    @property
    def ledger_id(self) -> int:
        return self._ledger.metadata.ledger_id

    @property
    def metadata(self) -> FakeMetadata:
        return self._ledger.metadata

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[FakeEntry]:
        check_readable(self.ledger_id, first_entry_id, last_entry_id, self.last_add_confirmed)
        hook = self._bookies.read_hook
        if hook is not None:
            await hook(self.ledger_id, first_entry_id, last_entry_id)
        if self.ledger_id not in self._bookies._ledgers:
            raise LedgerNotFoundError(f"ledger {self.ledger_id} does not exist")
        entries = self._ledger.entries
        self._bookies.reads += 1
        return [
            FakeEntry(self.ledger_id, i, entries[i])
            for i in range(first_entry_id, last_entry_id + 1)
        ]
