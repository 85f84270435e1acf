"""Waiting in tests for what cannot be awaited directly: one polling rule for the whole suite.

A test that waits for an effect it cannot await (a metric, a stat, a process's state) polls a
condition with :func:`eventually` (async) or :func:`eventually_sync` (from a synchronous test,
such as one driving the blocking client), never a fixed sleep: the wait ends as soon as the
effect shows, and on a slow machine it waits longer instead of failing.

The condition is called until it returns something truthy, which is returned; it may be a
coroutine function for :func:`eventually`. On timeout an ``AssertionError`` names what was
awaited (``what``, else the condition's name).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def _named(check: Callable[..., Any], what: str | None) -> str:
    return what or str(getattr(check, "__name__", repr(check)))


async def eventually(
    check: Callable[[], Any],
    *,
    timeout_s: float = 10.0,
    what: str | None = None,
    interval_s: float = 0.02,
) -> Any:
    """Poll ``check()`` (a function, or one returning an awaitable) every ``interval_s`` until
    it returns something truthy, and return that; ``AssertionError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {_named(check, what)}"
            )
        await asyncio.sleep(interval_s)


def eventually_sync(
    check: Callable[[], Any],
    *,
    timeout_s: float = 10.0,
    what: str | None = None,
    interval_s: float = 0.02,
) -> Any:
    """:func:`eventually` for synchronous tests: blocks between calls."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {_named(check, what)}"
            )
        time.sleep(interval_s)
