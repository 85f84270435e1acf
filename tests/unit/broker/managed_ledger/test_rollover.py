"""The rollover decision: limits, the minimum age, and age only for ledgers with entries."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.managed_ledger import ManagedLedgerConfig, RolloverPolicy, RollReason

POLICY = RolloverPolicy(max_entries=100, max_size_bytes=1000, max_age_ms=60_000, min_age_ms=10_000)


def test_each_limit_rolls_once_the_minimum_age_is_reached() -> None:
    assert POLICY.reason(entries=99, size_bytes=999, age_ms=59_999) is None
    assert POLICY.reason(entries=100, size_bytes=0, age_ms=10_000) is RollReason.ENTRIES
    assert POLICY.reason(entries=1, size_bytes=1000, age_ms=10_000) is RollReason.SIZE
    assert POLICY.reason(entries=1, size_bytes=1, age_ms=60_000) is RollReason.AGE


def test_nothing_rolls_before_the_minimum_age() -> None:
    assert POLICY.reason(entries=10_000, size_bytes=10**9, age_ms=9_999) is None


def test_an_empty_ledger_never_rolls_for_age() -> None:
    assert POLICY.reason(entries=0, size_bytes=0, age_ms=10**9) is None


@given(st.integers(0, 500), st.integers(0, 5000), st.integers(0, 200_000))
def test_the_decision_matches_the_rules(entries, size, age) -> None:
    reason = POLICY.reason(entries=entries, size_bytes=size, age_ms=age)
    due = age >= 10_000 and (entries >= 100 or size >= 1000 or (entries > 0 and age >= 60_000))
    assert (reason is not None) == due


def test_built_from_the_config() -> None:
    config = ManagedLedgerConfig(
        max_entries_per_ledger=7, max_ledger_size_bytes=8, max_ledger_age_ms=9, min_ledger_age_ms=1
    )
    assert RolloverPolicy.from_config(config) == RolloverPolicy(7, 8, 9, 1)
