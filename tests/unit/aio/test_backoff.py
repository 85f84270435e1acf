"""Reconnection pauses, and their cap for a partition reported as moving."""

from __future__ import annotations

import random

import pytest

from magnetar.aio.backoff import Backoff
from magnetar.aio.stream import MOVING_RETRY_MAX_S, reconnect_delay_s
from magnetar.common.errors import (
    ClientConnectionError,
    MagnetarError,
    ServiceNotReadyError,
    TopicNotOwnedError,
)


def test_delays_double_up_to_the_maximum_and_reset() -> None:
    backoff = Backoff(50, 1000, jitter=0)
    assert [round(backoff.next_delay_s() * 1000) for _ in range(7)] == [
        50,
        100,
        200,
        400,
        800,
        1000,
        1000,
    ]
    assert backoff.attempts == 7
    backoff.reset()
    assert backoff.attempts == 0
    assert backoff.next_delay_s() == pytest.approx(0.05)


def test_jitter_stays_within_its_share() -> None:
    backoff = Backoff(100, 100, jitter=0.2, rng=random.Random(3))
    delays = [backoff.next_delay_s() for _ in range(200)]
    assert all(0.08 <= d <= 0.12 for d in delays)
    assert len(set(delays)) > 100


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="initial_ms"):
        Backoff(0, 10)
    with pytest.raises(ValueError, match="initial_ms"):
        Backoff(20, 10)


def test_a_partition_reported_moving_is_retried_at_least_every_quarter_second() -> None:
    def delays(error: MagnetarError, initial_ms: int = 50, max_ms: int = 1000) -> list[int]:
        backoff = Backoff(initial_ms, max_ms, jitter=0)
        return [round(reconnect_delay_s(error, backoff) * 1000) for _ in range(7)]

    assert MOVING_RETRY_MAX_S == 0.25
    for moving in (TopicNotOwnedError("moved"), ServiceNotReadyError("no session")):
        assert delays(moving) == [50, 100, 200, 250, 250, 250, 250]
        # a first pause configured longer than the cap is kept
        assert delays(moving, initial_ms=400) == [400] * 7
    # an unreachable broker backs off as configured
    assert delays(ClientConnectionError("refused")) == [50, 100, 200, 400, 800, 1000, 1000]
