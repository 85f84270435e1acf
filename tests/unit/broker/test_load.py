"""The load policy: where unowned partitions go and what shedding moves."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.service.load import (
    BrokerLoadInfo,
    Move,
    PartitionLoadInfo,
    choose_least_loaded,
    load_shares,
    plan_shedding,
)


def broker(broker_id: str, partitions: int, rate: float = 0.0) -> BrokerLoadInfo:
    return BrokerLoadInfo(
        broker_id,
        {f"{broker_id}/p{i}": PartitionLoadInfo(rate, 0) for i in range(partitions)},
    )


def apply(brokers: list[BrokerLoadInfo], moves: list[Move]) -> dict[str, int]:
    counts = {b.broker_id: len(b.partitions) for b in brokers}
    for move in moves:
        counts[move.source] -= 1
        counts[move.target] += 1
    return counts


def test_new_partitions_go_to_the_least_loaded_broker() -> None:
    brokers = [broker("a", 3), broker("b", 1), broker("c", 2)]
    assert choose_least_loaded(brokers) == "b"
    assert choose_least_loaded(brokers, exclude=["b"]) == "c"
    assert choose_least_loaded([]) is None


def test_a_burst_of_assignments_is_spread() -> None:
    brokers = [broker("a", 0), broker("b", 0), broker("c", 0)]
    promised: dict[str, int] = {}
    for _ in range(9):
        chosen = choose_least_loaded(brokers, extra=promised)
        assert chosen is not None
        promised[chosen] = promised.get(chosen, 0) + 1
    assert promised == {"a": 3, "b": 3, "c": 3}


def test_busy_partitions_weigh_more() -> None:
    hot = BrokerLoadInfo("hot", {"x": PartitionLoadInfo(1000.0, 0)})
    cold = BrokerLoadInfo("cold", {"y": PartitionLoadInfo(0.0, 0), "z": PartitionLoadInfo(0.0, 0)})
    shares = load_shares([hot, cold])
    assert shares["hot"] > shares["cold"]
    assert choose_least_loaded([hot, cold]) == "cold"


def test_scale_out_spreads_eight_partitions_over_three_brokers() -> None:
    brokers = [broker("a", 8), broker("b", 0), broker("c", 0)]
    moves = plan_shedding(
        brokers, threshold=0.2, max_moves=16, min_ownership_ms=0, now_ms=1_000_000
    )
    assert sorted(apply(brokers, moves).values()) == [2, 3, 3]
    assert all(m.source == "a" for m in moves)


def test_balanced_cluster_moves_nothing() -> None:
    brokers = [broker("a", 3), broker("b", 3), broker("c", 2)]
    assert plan_shedding(brokers, threshold=0.2, max_moves=16, min_ownership_ms=0, now_ms=0) == []


def test_recently_acquired_partitions_stay() -> None:
    young = BrokerLoadInfo("a", {f"p{i}": PartitionLoadInfo(0.0, 10_000) for i in range(4)})
    moves = plan_shedding(
        [young, broker("b", 0)], threshold=0.2, max_moves=16, min_ownership_ms=5_000, now_ms=12_000
    )
    assert moves == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=12), min_size=2, max_size=5),
    st.integers(min_value=1, max_value=20),
)
def test_shedding_never_widens_the_spread(counts: list[int], max_moves: int) -> None:
    brokers = [broker(f"b{i}", n) for i, n in enumerate(counts)]
    moves = plan_shedding(brokers, threshold=0.2, max_moves=max_moves, min_ownership_ms=0, now_ms=0)
    assert len(moves) <= max_moves
    after = apply(brokers, moves)
    assert max(after.values()) - min(after.values()) <= max(counts) - min(counts)
    assert sum(after.values()) == sum(counts)
