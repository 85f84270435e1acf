"""Choosing a server's event loop: asyncio, uvloop (the speedups extra) or auto, and the error
when uvloop is asked for but not installed."""

from __future__ import annotations

import asyncio
import importlib
from types import ModuleType

import pytest

from magnetar.common.errors import InvalidConfigError
from magnetar.common.server.event_loop import loop_factory, run_on, running_loop_name


def _without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def import_module(name: str, package: str | None = None) -> ModuleType:
        if name == "uvloop":
            raise ImportError("No module named 'uvloop'")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)


async def _which() -> str:
    return running_loop_name()


def test_asyncio_is_the_standard_loop() -> None:
    assert loop_factory("asyncio") == ("asyncio", None)
    assert run_on("asyncio", _which) == "asyncio"


def test_uvloop_and_auto_run_on_uvloop_when_it_is_installed() -> None:
    uvloop = importlib.import_module("uvloop")  # the test install has the speedups extra
    for choice in ("uvloop", "auto"):
        name, factory = loop_factory(choice)
        assert (name, factory) == ("uvloop", uvloop.new_event_loop)
        assert run_on(choice, _which) == "uvloop"
    # and the standard loop is back for what runs next
    assert asyncio.run(_which()) == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without_uvloop(monkeypatch)
    assert loop_factory("auto") == ("asyncio", None)
    with pytest.raises(InvalidConfigError) as refused:
        loop_factory("uvloop")
    assert "uvloop is not installed" in refused.value.message
    assert "magnetar[speedups]" in refused.value.message
    assert "--event-loop asyncio" in refused.value.message


def test_an_unknown_loop_is_refused_naming_the_choices() -> None:
    with pytest.raises(InvalidConfigError) as refused:
        loop_factory("trio")
    assert refused.value.message == "event_loop must be one of asyncio, uvloop, auto, not 'trio'"


def test_run_on_returns_what_main_returns_and_raises_what_it_raises() -> None:
    async def fails() -> int:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run_on("uvloop", fails)

    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert run_on("uvloop", answer) == 42
