"""Reconnection pauses: exponential, capped, with a little jitter, reset after a success.

Jitter keeps the producers and consumers of many clients from reconnecting in lock step after a
broker fails (they all notice at the same moment).
"""

from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    """``next_delay_s()`` gives initial, 2x, 4x ... up to the maximum, each within +-jitter."""

    def __init__(
        self,
        initial_ms: float,
        max_ms: float,
        *,
        multiplier: float = 2.0,
        jitter: float = 0.1,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial_ms <= max_ms:
            raise ValueError(f"need 0 < initial_ms <= max_ms, got {initial_ms}, {max_ms}")
        self._initial_ms = initial_ms
        self._max_ms = max_ms
        self._multiplier = multiplier
        self._jitter = jitter
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._next_ms = initial_ms
        self.attempts = 0
        """Delays handed out since the last reset."""

    @property
    def initial_s(self) -> float:
        """The first pause, without jitter."""
        return self._initial_ms / 1000.0

    def next_delay_s(self) -> float:
        base = self._next_ms
        self._next_ms = min(self._max_ms, self._next_ms * self._multiplier)
        self.attempts += 1
        spread = base * self._jitter
        return max(0.0, base + self._rng.uniform(-spread, spread)) / 1000.0

    def reset(self) -> None:
        self._next_ms = self._initial_ms
        self.attempts = 0
