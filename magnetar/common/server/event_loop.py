"""The event loop a server process runs on: the standard library's ``asyncio`` loop, or
uvloop (libuv, on PyPI), an optional speed-up.

``magnetar bookie|broker|standalone|autorecovery --event-loop uvloop`` (or
``MAGNETAR_EVENT_LOOP=uvloop``) runs the process on uvloop, which must be installed (the
``speedups`` extra: ``pip install 'magnetar[speedups]'``); ``auto`` takes uvloop when it is
installed and asyncio otherwise; ``asyncio``, the default, never uses it. Nothing else changes:
the same code runs on either loop, and the test suite runs on asyncio with a few tests on uvloop.
bench/event_loop_bench.py measures what it buys (docs/cli.md, "Event loop").
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from magnetar.common.errors import InvalidConfigError

T = TypeVar("T")

EVENT_LOOPS = ("asyncio", "uvloop", "auto")
"""The choices of ``--event-loop``."""

DEFAULT_EVENT_LOOP = "asyncio"


def loop_factory(choice: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """The loop ``choice`` names: its name (``"asyncio"`` or ``"uvloop"``) and a factory for
    :class:`asyncio.Runner` (``None``: the standard loop).

    Raises :class:`InvalidConfigError` for an unknown choice, and for ``uvloop`` when it is not
    installed, naming the extra that installs it."""
    if choice not in EVENT_LOOPS:
        raise InvalidConfigError(
            f"event_loop must be one of {', '.join(EVENT_LOOPS)}, not {choice!r}",
            context={"setting": "event_loop", "value": choice},
        )
    if choice == "asyncio":
        return "asyncio", None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "auto":
            return "asyncio", None
        raise InvalidConfigError(
            "event_loop is uvloop, but uvloop is not installed: install Magnetar's speedups"
            " extra (pip install 'magnetar[speedups]') or choose --event-loop asyncio",
            context={"setting": "event_loop", "value": choice},
        ) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return "uvloop", factory


def run_on(choice: str, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` to completion on the loop ``choice`` names, as :func:`asyncio.run` does."""
    _, factory = loop_factory(choice)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


def running_loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: what the running loop is, for the start log line."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
