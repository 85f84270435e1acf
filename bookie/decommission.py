"""Decommissioning a bookie: wait until no ledger needs it, then forget its identity.

A bookie that is gone for good (its disk failed, its machine was retired) stays a member of the
cluster through its cookie at ``/magnetar/bookies/cookies/<bookie_id>``. That cookie is what lets
autorecovery count it as lost (known, but missing from ``/magnetar/bookies/available/`` for
longer than the grace period) and so re-replicate every ledger fragment it held. It is also what
stops a bookie with an empty disk from rejoining under that id and claiming replicas it lost.

So decommissioning is, as in BookKeeper's ``decommissionbookie``: refuse a bookie that is
unknown or still running; wait until no ledger's ensembles name the bookie (autorecovery
replaces it in every segment whose end is known, an open ledger's writer replaces it at its next
ensemble change, a deleted ledger names nobody); then delete the cookie, so a fresh bookie with
an empty disk may take the id. The cookie is deleted only if the bookie has not come back,
checked in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bookie.autorecovery.records import LEADER as AUTORECOVERY_LEADER
from bookie.client.ledger_metadata import LedgerMetadata
from magnetar.common.clock import SYSTEM_CLOCK, Clock
from magnetar.common.errors import (
    BadVersionError,
    BookieNotFoundError,
    BookieStillRunningError,
    OperationTimeoutError,
)
from metadata import Compare, DeleteOp, MetadataStore, Record, layout
from proto.format.v1 import cluster_pb2

_LISTED_LEDGERS = 10
"""How many ledger ids a message names before it says 'and N more'."""


@dataclass(frozen=True, slots=True)
class DecommissionProgress:
    """One look at what still holds the decommission up."""

    bookie_id: str
    ledgers: tuple[int, ...]
    """Ledgers whose ensembles still name the bookie."""
    open_ledgers: tuple[int, ...]
    """Those of them whose open end (not yet sealed) names it: autorecovery leaves these to the
    ledger's writer, which replaces the bookie at its next write, or to whoever closes it."""
    autorecovery: str | None
    """The active autorecovery instance, or None if none is running."""
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class DecommissionResult:
    bookie_id: str
    ledgers_at_start: int
    """How many ledgers named the bookie when the command started."""
    waited_s: float


def _ledgers_reference(count: int) -> str:
    return f"{count} ledger still references" if count == 1 else f"{count} ledgers still reference"


def _ledger_list(ledgers: tuple[int, ...]) -> str:
    shown = ", ".join(str(i) for i in ledgers[:_LISTED_LEDGERS])
    more = len(ledgers) - _LISTED_LEDGERS
    return f"{shown} and {more} more" if more > 0 else shown


def describe_progress(progress: DecommissionProgress) -> str:
    """One line for the operator: what still names the bookie, and who will fix it."""
    line = (
        f"{_ledgers_reference(len(progress.ledgers))} {progress.bookie_id}"
        f" ({_ledger_list(progress.ledgers)})"
    )
    if progress.open_ledgers:
        line += (
            f"; {len(progress.open_ledgers)} of them open with it in their current ensemble"
            f" ({_ledger_list(progress.open_ledgers)}): their writers replace it at their next"
            " write, autorecovery once they are closed"
        )
    if progress.autorecovery is None:
        line += "; no autorecovery instance is active (start magnetar autorecovery)"
    else:
        line += f"; autorecovery active: {progress.autorecovery}"
    return f"{line} [{progress.elapsed_s:.0f} s]"


async def _available_record(store: MetadataStore, bookie_id: str) -> Record | None:
    return await store.get(layout.bookie_available(bookie_id))


def _still_running(bookie_id: str, record: Record, *, came_back: bool) -> BookieStillRunningError:
    address = cluster_pb2.BookieRegistration.FromString(record.value).address
    if came_back:
        what = f"bookie {bookie_id} started again (at {address}) while decommissioning waited"
    else:
        what = f"bookie {bookie_id} is running (registered as available at {address})"
    return BookieStillRunningError(
        f"{what}: stop it first, then run decommission-bookie again. A bookie killed just now"
        " stays registered until its metadata session expires (its session_ttl_s, 10 s by"
        " default).",
        context={"bookie": bookie_id, "address": address},
    )


async def _look(
    store: MetadataStore, bookie_id: str, elapsed_s: float
) -> tuple[DecommissionProgress, Record | None]:
    """The ledgers that name the bookie, read in one listing at one revision (a ledger deleted
    since is not in it), and the bookie's registration if it is running."""
    listing = await store.list(layout.LEDGERS)
    ledgers: list[int] = []
    open_ledgers: list[int] = []
    for record in listing.records:
        ledger_id = int(record.key.rsplit("/", 1)[1])
        metadata = LedgerMetadata.from_bytes(ledger_id, record.value, record.version)
        if bookie_id not in metadata.all_bookies():
            continue
        ledgers.append(ledger_id)
        if not metadata.closed and bookie_id in metadata.last_segment.bookies:
            open_ledgers.append(ledger_id)
    leader = await store.get(AUTORECOVERY_LEADER)
    progress = DecommissionProgress(
        bookie_id=bookie_id,
        ledgers=tuple(ledgers),
        open_ledgers=tuple(open_ledgers),
        autorecovery=leader.value.decode(errors="replace") if leader is not None else None,
        elapsed_s=elapsed_s,
    )
    return progress, await _available_record(store, bookie_id)


async def decommission_bookie(
    store: MetadataStore,
    bookie_id: str,
    *,
    timeout_s: float,
    poll_interval_s: float = 2.0,
    on_progress: Callable[[DecommissionProgress], None] = lambda _progress: None,
    clock: Clock = SYSTEM_CLOCK,
) -> DecommissionResult:
    """Wait until no ledger names ``bookie_id``, then delete its cookie.

    Raises BookieNotFoundError if the cluster does not know the bookie, BookieStillRunningError
    if it is running (or starts again while this waits), and OperationTimeoutError, keeping the
    cookie, if ledgers still name it after ``timeout_s``. ``on_progress`` gets every look at
    the ledgers (every ``poll_interval_s``).
    """
    cookie_key = layout.bookie_cookie(bookie_id)
    cookie = await store.get(cookie_key)
    if cookie is None:
        cookies = await store.list(layout.BOOKIE_COOKIES)
        known = sorted(r.key.rsplit("/", 1)[1] for r in cookies.records)
        raise BookieNotFoundError(
            f"the cluster knows no bookie {bookie_id} (no cookie at {cookie_key}); known bookies:"
            f" {', '.join(known) if known else 'none'}",
            context={"bookie": bookie_id, "key": cookie_key},
        )
    running = await _available_record(store, bookie_id)
    if running is not None:
        raise _still_running(bookie_id, running, came_back=False)

    start = clock.monotonic()
    deadline = start + timeout_s
    ledgers_at_start: int | None = None
    while True:
        progress, running = await _look(store, bookie_id, clock.monotonic() - start)
        if running is not None:
            raise _still_running(bookie_id, running, came_back=True)
        if ledgers_at_start is None:
            ledgers_at_start = len(progress.ledgers)
        if not progress.ledgers:
            break
        on_progress(progress)
        if clock.monotonic() >= deadline:
            raise OperationTimeoutError(
                f"after {timeout_s:g} s, {_ledgers_reference(len(progress.ledgers))} bookie"
                f" {bookie_id} ({_ledger_list(progress.ledgers)}), so its cookie is kept."
                " Autorecovery must be running (magnetar autorecovery, or bookies started with"
                " --autorecovery) with enough other bookies to re-replicate them; check"
                " magnetar cluster under-replicated, then run decommission-bookie again.",
                context={"bookie": bookie_id, "ledgers": len(progress.ledgers)},
            )
        await clock.sleep(min(poll_interval_s, max(0.0, deadline - clock.monotonic())))

    try:
        # only that cookie (not a new incarnation's), and only while the bookie stays away
        await store.txn(
            [
                Compare(cookie_key, cookie.version),
                Compare.absent(layout.bookie_available(bookie_id)),
            ],
            [DeleteOp(cookie_key)],
        )
    except BadVersionError as e:
        running = await _available_record(store, bookie_id)
        if running is not None:
            raise _still_running(bookie_id, running, came_back=True) from None
        raise BadVersionError(
            f"the cookie of bookie {bookie_id} changed while decommissioning waited (another"
            f" decommission, or a new bookie took the id): {e.message}",
            context={"bookie": bookie_id, "key": cookie_key},
        ) from None
    return DecommissionResult(bookie_id, ledgers_at_start, clock.monotonic() - start)
