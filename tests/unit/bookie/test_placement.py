"""Ensemble placement and replacement choices."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookie.client.ledger_metadata import write_set_indexes
from bookie.client.placement import BookieCandidate, choose_ensemble, choose_replacement
from magnetar.common.errors import NotEnoughBookiesError

TB = 10**12


def bookie(
    name: str, *, free: float = 0.5, load: int = 0, zone: str | None = None, writable: bool = True
) -> BookieCandidate:
    return BookieCandidate(name, int(TB * free), TB, load, zone, writable)


def test_most_free_space_then_least_load_first() -> None:
    candidates = [
        bookie("full", free=0.1),
        bookie("busy", free=0.8, load=50),
        bookie("idle", free=0.8, load=1),
        bookie("roomy", free=0.9, load=99),
        bookie("readonly", free=0.99, writable=False),
    ]
    assert choose_ensemble(candidates, 3, 2) == ["roomy", "idle", "busy"]


def test_not_enough_bookies_names_both_numbers() -> None:
    with pytest.raises(NotEnoughBookiesError, match=r"2 writable \(a, b\), need E=3") as info:
        choose_ensemble([bookie("a"), bookie("b"), bookie("c", writable=False)], 3, 2)
    assert info.value.context == {"needed": "3", "available": "2"}


def test_fewer_writable_than_e_gives_an_under_striped_ensemble_down_to_qw() -> None:
    candidates = [bookie("a"), bookie("b"), bookie("c", writable=False)]
    assert sorted(choose_ensemble(candidates, 3, 2, min_ensemble_size=2)) == ["a", "b"]
    # an unreachable bookie is left out even while still registered as writable
    three = [bookie("a"), bookie("b"), bookie("c")]
    assert sorted(choose_ensemble(three, 3, 2, exclude=["b"], min_ensemble_size=2)) == ["a", "c"]
    # enough bookies: full width, whatever the minimum
    assert len(choose_ensemble([*three, bookie("d")], 3, 2, min_ensemble_size=2)) == 3


def test_below_qw_the_error_names_every_bookie_and_why() -> None:
    candidates = [bookie("bookie-2"), bookie("bookie-0", free=0.04, writable=False)]
    with pytest.raises(NotEnoughBookiesError) as info:
        choose_ensemble(candidates, 3, 2, exclude=["bookie-1"], min_ensemble_size=2)
    assert info.value.message == (
        "not enough writable bookies for a new ledger: 1 writable (bookie-2), need 2 (Qw=2)"
        " for E3/Qw2; bookie-0 read-only (disk 96% used), bookie-1 unreachable"
    )
    assert info.value.context == {"needed": "2", "available": "1"}


@given(
    writable=st.integers(min_value=0, max_value=6),
    e=st.integers(min_value=1, max_value=5),
    qw=st.integers(min_value=1, max_value=5),
)
def test_under_striped_size_is_available_capped_by_e_never_below_qw(
    writable: int, e: int, qw: int
) -> None:
    qw = min(qw, e)
    candidates = [bookie(f"b{i}") for i in range(writable)] + [bookie("ro", writable=False)]
    if writable < qw:
        with pytest.raises(NotEnoughBookiesError):
            choose_ensemble(candidates, e, qw, min_ensemble_size=qw)
        return
    ensemble = choose_ensemble(candidates, e, qw, min_ensemble_size=qw)
    assert len(ensemble) == min(e, writable)
    assert len(set(ensemble)) == len(ensemble)
    assert "ro" not in ensemble


def test_replicas_go_to_distinct_zones_when_enough_exist() -> None:
    candidates = [bookie(f"{z}{i}", zone=z, free=0.9 - i / 100) for z in "abc" for i in range(3)]
    ensemble = choose_ensemble(candidates, 3, 2)
    assert len({c.zone for c in candidates if c.bookie_id in ensemble}) == 3


@given(st.integers(3, 6), st.integers(2, 3), st.integers(2, 4), st.integers(2, 4))
def test_every_write_quorum_spans_distinct_zones_when_possible(e, qw, zones, per_zone) -> None:
    qw = min(qw, e)
    candidates = [bookie(f"z{z}-{i}", zone=f"z{z}") for z in range(zones) for i in range(per_zone)]
    if len(candidates) < e:
        with pytest.raises(NotEnoughBookiesError):
            choose_ensemble(candidates, e, qw)
        return
    ensemble = choose_ensemble(candidates, e, qw)
    assert len(set(ensemble)) == e
    zone_of = {c.bookie_id: c.zone for c in candidates}
    if zones >= e:
        assert len({zone_of[b] for b in ensemble}) == e
    distinct_windows = all(
        len({zone_of[ensemble[p]] for p in write_set_indexes(s, e, qw)}) == qw for s in range(e)
    )
    # where an arrangement exists it is found (E divisible by zones makes one easy to see)
    if zones >= qw and e % zones == 0:
        assert distinct_windows


def test_replacement_avoids_its_neighbours_zones() -> None:
    candidates = [
        bookie("a1", zone="a"),
        bookie("b1", zone="b"),
        bookie("c1", zone="c"),
        bookie("a2", zone="a", free=0.99),
        bookie("c2", zone="c", free=0.95),
        bookie("b2", zone="b", free=0.2),
    ]
    # replacing b1 (position 1), which shares a write quorum with a1 and with c1: a2 and c2
    # have more room, but only b2 keeps both quorums in distinct zones
    assert choose_replacement(candidates, ["a1", "b1", "c1"], 1, 2, exclude={"b1"}) == "b2"
    # with no such bookie, the roomiest one is the best there is
    without_b2 = candidates[:-1]
    assert choose_replacement(without_b2, ["a1", "b1", "c1"], 1, 2, exclude={"b1"}) == "a2"


def test_replacement_needs_a_bookie_outside_the_ensemble() -> None:
    with pytest.raises(NotEnoughBookiesError, match="no writable bookie can replace b"):
        choose_replacement(
            [bookie("a"), bookie("b"), bookie("c")], ["a", "b", "c"], 1, 2, exclude={"b"}
        )


def test_a_restarted_bookie_may_replace_itself() -> None:
    candidates = [bookie("a"), bookie("b"), bookie("c")]
    assert choose_replacement(candidates, ["a", "b", "c"], 1, 2) == "b"
