"""Where a ledger's replicas go: pure choice of ensembles and of replacement bookies.

Only writable bookies are candidates. They are ranked by free space (in 1% steps, so that near
identical disks tie) and then by load (ledgers stored, plus ledgers this client placed since the
last registration refresh, so a burst of creations spreads out). Zones are honoured whenever
enough of them exist. With at least E zones, all replicas of a ledger are in distinct zones.
With at least Qw zones, every write quorum (the Qw consecutive positions that store one entry)
has distinct zones. With fewer zones, zones are ignored, since the requirement cannot be met.

**Under-striped ensembles.** Given ``min_ensemble_size`` (the ledger client passes Qw), a new
ledger gets as many bookies as are writable when that is fewer than E, down to that minimum:
each entry still goes to Qw bookies and needs Qa acknowledgements, so durability is unchanged;
only the striping (how many bookies share the load) is narrower. Below the minimum the error
names every bookie that could not be used and why (read-only with its disk usage, unreachable).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from magnetar.common.errors import NotEnoughBookiesError

_MAX_SEARCH_STEPS = 20_000


@dataclass(frozen=True, slots=True)
class BookieCandidate:
    bookie_id: str
    free_bytes: int = 0
    total_bytes: int = 0
    load: int = 0
    zone: str | None = None
    writable: bool = True

    @property
    def free_fraction(self) -> float:
        return self.free_bytes / self.total_bytes if self.total_bytes else 0.0


def _rank(candidate: BookieCandidate) -> tuple[float, int, str]:
    return (-round(candidate.free_fraction, 2), candidate.load, candidate.bookie_id)


def _usable(candidates: Iterable[BookieCandidate], exclude: Iterable[str]) -> list[BookieCandidate]:
    excluded = set(exclude)
    return sorted((c for c in candidates if c.writable and c.bookie_id not in excluded), key=_rank)


def _windows_ok(zones: Sequence[str | None], write_quorum: int, size: int) -> bool:
    """Every cyclic window of ``write_quorum`` positions fully placed has distinct zones."""
    if len(zones) < size:
        # partial arrangement: check only windows that lie inside the placed prefix
        for start in range(len(zones) - write_quorum + 1):
            window = zones[start : start + write_quorum]
            if len(set(window)) < write_quorum:
                return False
        return True
    for start in range(size):
        window = [zones[(start + k) % size] for k in range(write_quorum)]
        if len(set(window)) < write_quorum:
            return False
    return True


def describe_unusable(
    candidates: Iterable[BookieCandidate], unreachable: Iterable[str] = ()
) -> list[str]:
    """Why each bookie that cannot take writes cannot: ``bookie-0 read-only (disk 96% used)``,
    ``bookie-1 unreachable``, sorted by bookie id."""
    down = set(unreachable)
    reasons: dict[str, str] = {}
    for c in candidates:
        if c.bookie_id in down:
            continue
        if not c.writable:
            usage = f" (disk {1 - c.free_fraction:.0%} used)" if c.total_bytes else ""
            reasons[c.bookie_id] = f"{c.bookie_id} read-only{usage}"
    for bookie in down:
        reasons[bookie] = f"{bookie} unreachable"
    return [reasons[b] for b in sorted(reasons)]


def choose_ensemble(
    candidates: Iterable[BookieCandidate],
    ensemble_size: int,
    write_quorum: int,
    *,
    exclude: Iterable[str] = (),
    min_ensemble_size: int | None = None,
) -> list[str]:
    """E bookie ids for a new ledger, in ensemble order; with ``min_ensemble_size``, fewer
    (down to it) when fewer than E bookies are writable. ``exclude`` names bookies known to be
    unreachable."""
    candidates = list(candidates)
    excluded = list(exclude)
    usable = _usable(candidates, excluded)
    smallest = ensemble_size if min_ensemble_size is None else min(min_ensemble_size, ensemble_size)
    if len(usable) < smallest:
        names = ", ".join(c.bookie_id for c in usable) or "none"
        why = describe_unusable(candidates, excluded)
        needs = (
            f"need {smallest} (Qw={write_quorum}) for E{ensemble_size}/Qw{write_quorum}"
            if smallest < ensemble_size
            else f"need E={ensemble_size}"
        )
        raise NotEnoughBookiesError(
            f"not enough writable bookies for a new ledger: {len(usable)} writable ({names}),"
            f" {needs}" + (f"; {', '.join(why)}" if why else ""),
            context={"needed": smallest, "available": len(usable)},
        )
    ensemble_size = min(ensemble_size, len(usable))
    zones = {c.zone for c in usable}
    if None in zones or len(zones) < write_quorum:
        return [c.bookie_id for c in usable[:ensemble_size]]
    if len(zones) >= ensemble_size:
        chosen: list[BookieCandidate] = []
        used: set[str | None] = set()
        for candidate in usable:
            if candidate.zone not in used:
                chosen.append(candidate)
                used.add(candidate.zone)
                if len(chosen) == ensemble_size:
                    return [c.bookie_id for c in chosen]
    arranged = _arrange(usable, ensemble_size, write_quorum)
    if arranged is not None:
        return [c.bookie_id for c in arranged]
    return [c.bookie_id for c in usable[:ensemble_size]]


def _arrange(
    usable: list[BookieCandidate], ensemble_size: int, write_quorum: int
) -> list[BookieCandidate] | None:
    """Best-ranked arrangement whose every write quorum has distinct zones (or None)."""
    steps = 0
    chosen: list[BookieCandidate] = []

    def search() -> bool:
        nonlocal steps
        if len(chosen) == ensemble_size:
            return _windows_ok([c.zone for c in chosen], write_quorum, ensemble_size)
        for candidate in usable:
            steps += 1
            if steps > _MAX_SEARCH_STEPS:
                return False
            if candidate in chosen:
                continue
            chosen.append(candidate)
            if _windows_ok([c.zone for c in chosen], write_quorum, ensemble_size) and search():
                return True
            chosen.pop()
        return False

    return chosen if search() else None


def choose_replacement(
    candidates: Iterable[BookieCandidate],
    ensemble: Sequence[str],
    position: int,
    write_quorum: int,
    *,
    exclude: Iterable[str] = (),
) -> str:
    """A bookie to take over ``ensemble[position]``: not one of the other positions, not
    excluded, and in a zone none of its write-quorum neighbours use, when such a bookie exists.
    (The bookie being replaced may be chosen again if it is not excluded: a restarted bookie
    that kept its data.)"""
    others = [b for i, b in enumerate(ensemble) if i != position]
    usable = _usable(candidates, [*exclude, *others])
    if not usable:
        raise NotEnoughBookiesError(
            f"no writable bookie can replace {ensemble[position]}: every writable bookie is"
            " already in the ensemble or excluded",
            context={"needed": 1, "available": 0},
        )
    size = len(ensemble)
    by_id = {c.bookie_id: c for c in candidates}
    neighbour_zones = {
        by_id[ensemble[(position + k) % size]].zone
        for k in range(-(write_quorum - 1), write_quorum)
        if k and ensemble[(position + k) % size] in by_id
    }
    for candidate in usable:
        if candidate.zone is None or candidate.zone not in neighbour_zones:
            return candidate.bookie_id
    return usable[0].bookie_id
