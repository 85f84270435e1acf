"""The collector settings our own processes use."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from magnetar.common.server.gc_tuning import THRESHOLDS, tune_gc_for_throughput


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("restored_gc")
def test_tuning_freezes_what_is_alive_and_makes_passes_rarer() -> None:
    tune_gc_for_throughput()
    assert gc.get_threshold() == THRESHOLDS
    assert gc.get_freeze_count() > 0
    assert THRESHOLDS[0] > 700  # rarer than CPython's default young-generation pass
