"""Splitting offset ranges into tasks and sharing a per-trigger limit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magnetar.spark.planning import OffsetRange, share_limit, split_ranges


def test_each_partition_is_a_task_and_empty_ones_none() -> None:
    ranges = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 5, 5), OffsetRange("t", 2, 3, 9)]
    assert split_ranges(ranges, 1) == [ranges[0], ranges[2]]
    assert OffsetRange("t", 1, 0, 0).partition_topic == "t-partition-1"
    assert OffsetRange("t", -1, 0, 0).partition_topic == "t"


def test_min_partitions_cuts_ranges_by_size() -> None:
    pieces = split_ranges([OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 0, 100)], 10)
    assert len(pieces) == 10
    assert [p for p in pieces if p.partition == 1] == [OffsetRange("t", 1, 0, 100)]
    assert sum(p.size for p in pieces) == 1000


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=8),
    minimum=st.integers(min_value=1, max_value=64),
)
def test_split_ranges_cover_every_offset_once(sizes: list[int], minimum: int) -> None:
    ranges = [OffsetRange("t", i, 7, 7 + size) for i, size in enumerate(sizes)]
    pieces = split_ranges(ranges, minimum)
    for i, size in enumerate(sizes):
        mine = sorted((p.start, p.end) for p in pieces if p.partition == i)
        covered = [o for start, end in mine for o in range(start, end)]
        assert covered == list(range(7, 7 + size))


def test_a_limit_is_shared_by_backlog() -> None:
    assert share_limit({"a": 900, "b": 100}, 100) == {"a": 90, "b": 10}
    assert share_limit({"a": 5, "b": 3}, 100) == {"a": 5, "b": 3}  # under the limit: all
    assert share_limit({"a": 1, "b": 1, "c": 1}, 2) == {"a": 1, "b": 1, "c": 0}


@given(
    backlogs=st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 10**6), max_size=10),
    limit=st.integers(min_value=1, max_value=10**6),
)
def test_shares_add_up_and_never_pass_a_backlog(backlogs: dict[str, int], limit: int) -> None:
    shares = share_limit(backlogs, limit)
    assert set(shares) == set(backlogs)
    assert sum(shares.values()) == min(limit, sum(backlogs.values()))
    assert all(0 <= shares[k] <= backlogs[k] for k in backlogs)
