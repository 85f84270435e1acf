"""The latency histogram of ``magnetar perf`` against exact percentiles of sorted lists."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.cli.perf import LatencyHistogram, nearest_rank

PERCENTILES = ("0", "1", "50", "90", "95", "99", "99.9", "99.99", "100")

values = st.lists(st.integers(min_value=0, max_value=10**10), min_size=1, max_size=2000)


def exact_percentile(sorted_values: list[int], percentile: str) -> int:
    """Nearest rank, computed independently: the smallest value with at least ``percentile`` %
    of the values at or below it."""
    rank = max(1, math.ceil(Fraction(percentile) * len(sorted_values) / 100))
    return sorted_values[rank - 1]


def same_bucket(a: int, b: int) -> bool:
    return LatencyHistogram.bucket_index(a) == LatencyHistogram.bucket_index(b)


def histogram_of(data: list[int]) -> LatencyHistogram:
    histogram = LatencyHistogram()
    for value in data:
        histogram.record(value)
    return histogram


@given(values)
@settings(max_examples=200, deadline=None)
def test_percentiles_are_exact_to_the_bucket(data: list[int]) -> None:
    histogram = histogram_of(data)
    ordered = sorted(data)
    for percentile in PERCENTILES:
        got = histogram.percentile(float(percentile))
        want = exact_percentile(ordered, percentile)
        assert same_bucket(got, want), (percentile, got, want)
        assert want <= got <= want + want // 128, (percentile, got, want)
    assert histogram.percentile(100) == max(data)
    assert (histogram.count, histogram.min, histogram.max, histogram.total) == (
        len(data),
        min(data),
        max(data),
        sum(data),
    )


@given(values, st.lists(st.floats(min_value=0, max_value=100), min_size=1, max_size=8))
@settings(max_examples=100, deadline=None)
def test_several_percentiles_in_one_walk_match_one_at_a_time(
    data: list[int], wanted: list[float]
) -> None:
    histogram = histogram_of(data)
    assert histogram.percentiles(*wanted) == [histogram.percentile(p) for p in wanted]


def test_latency_like_data_is_within_one_percent() -> None:
    rng = random.Random(7)
    # microseconds: a log-normal body around 3 ms with a far tail
    data = [int(rng.lognormvariate(8, 1.2)) for _ in range(100_000)]
    histogram = histogram_of(data)
    ordered = sorted(data)
    for percentile in ("50", "95", "99", "99.9"):
        want = exact_percentile(ordered, percentile)
        got = histogram.percentile(float(percentile))
        assert abs(got - want) <= want / 100


@given(values, values)
@settings(max_examples=100, deadline=None)
def test_adding_histograms_is_recording_both(first: list[int], second: list[int]) -> None:
    added = histogram_of(first)
    added.add(histogram_of(second))
    both = histogram_of(first + second)
    assert (added.count, added.min, added.max, added.total) == (
        both.count,
        both.min,
        both.max,
        both.total,
    )
    assert added.percentiles(50, 99, 99.9) == both.percentiles(50, 99, 99.9)


def test_adding_an_empty_histogram_or_to_one() -> None:
    empty = LatencyHistogram()
    full = histogram_of([5, 900, 70_000])
    full.add(LatencyHistogram())
    assert (full.count, full.min, full.max) == (3, 5, 70_000)
    empty.add(full)
    assert (empty.count, empty.min, empty.max) == (3, 5, 70_000)
    assert same_bucket(empty.percentile(50), 900)


@given(st.integers(min_value=0, max_value=2**40 - 1))
def test_buckets_hold_their_values_and_are_narrow(value: int) -> None:
    index = LatencyHistogram.bucket_index(value)
    lowest, highest = LatencyHistogram.bucket_bounds(index)
    assert lowest <= value <= highest
    assert highest - lowest <= lowest // 128
    # buckets are numbered in value order without gaps
    assert LatencyHistogram.bucket_index(highest + 1) == index + 1
    if lowest:
        assert LatencyHistogram.bucket_index(lowest - 1) == index - 1


def test_small_values_are_exact_and_odd_inputs_are_clamped() -> None:
    histogram = LatencyHistogram(highest=10_000)
    for value in range(256):
        assert LatencyHistogram.bucket_bounds(LatencyHistogram.bucket_index(value)) == (
            value,
            value,
        )
    histogram.record(-5)
    histogram.record(10**9)
    assert (histogram.min, histogram.max) == (0, 10_000)
    assert histogram.percentile(100) == 10_000


def test_an_empty_histogram_answers_zero() -> None:
    histogram = LatencyHistogram()
    assert histogram.percentiles(50, 99) == [0, 0]
    assert histogram.mean() == 0.0


def test_nearest_rank_uses_decimal_percentiles() -> None:
    assert nearest_rank(99.9, 1000) == 999
    assert nearest_rank(50, 1) == 1
    assert nearest_rank(0, 10) == 1
    assert nearest_rank(100, 10) == 10
    with pytest.raises(ValueError, match="between 0 and 100"):
        nearest_rank(100.5, 10)


@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 50)), min_size=1, max_size=50))
def test_recording_a_value_n_times_at_once_is_recording_it_n_times(
    runs: list[tuple[int, int]],
) -> None:
    at_once = LatencyHistogram()
    one_by_one = LatencyHistogram()
    for value, count in runs:
        at_once.record(value, count)
        for _ in range(count):
            one_by_one.record(value)
    assert (at_once.count, at_once.min, at_once.max, at_once.total) == (
        one_by_one.count,
        one_by_one.min,
        one_by_one.max,
        one_by_one.total,
    )
    assert at_once.percentiles(*map(float, PERCENTILES)) == one_by_one.percentiles(
        *map(float, PERCENTILES)
    )
