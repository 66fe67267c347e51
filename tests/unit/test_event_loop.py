"""The event loop a sidecar process serves on (setting ``event_loop``)."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

from sidecar.config import ConfigError, EventLoopName, load_settings
from sidecar.runtime import event_loop


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_auto_serves_on_uvloop_where_it_is_installed() -> None:
    # uvloop is a dependency on Linux, where the tests run.
    assert event_loop.run(loop_module(), EventLoopName.AUTO).startswith("uvloop")
    assert event_loop.run(loop_module(), EventLoopName.UVLOOP).startswith("uvloop")


def test_asyncio_is_asyncio_s_own_loop() -> None:
    assert event_loop.run(loop_module(), EventLoopName.ASYNCIO).startswith("asyncio")


def without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "uvloop" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    without_uvloop(monkeypatch)
    assert event_loop.run(loop_module(), EventLoopName.AUTO).startswith("asyncio")


def test_uvloop_by_name_without_uvloop_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    without_uvloop(monkeypatch)
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        event_loop.loop_factory(EventLoopName.UVLOOP)


def test_the_setting_defaults_to_auto_and_names_the_choices() -> None:
    base = {"identity": "trusted-headers"}
    assert load_settings(None, base).listen.event_loop is EventLoopName.AUTO
    chosen = load_settings(None, {**base, "event_loop": "asyncio"})
    assert chosen.listen.event_loop is EventLoopName.ASYNCIO
    with pytest.raises(ConfigError, match="event_loop"):
        load_settings(None, {**base, "event_loop": "trio"})
