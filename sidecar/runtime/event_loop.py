"""The event loop a sidecar process serves on: uvloop where it is installed, else asyncio's.

Each request is a gRPC stream of three or four messages, and the loop's own
bookkeeping per message is a measurable share of the sidecar's CPU; uvloop's
is smaller (docs/benchmarks.md, "Speed, round two"). The choice is the
``event_loop`` setting; ``auto`` falls back to asyncio's loop where uvloop is
not installed (it is a dependency on Linux and macOS only).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sidecar.config import ConfigError, EventLoopName

_T = TypeVar("_T")


def loop_factory(choice: EventLoopName) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the loop for ``choice``; None: asyncio's default. ConfigError when
    uvloop is asked for by name and is not installed."""
    if choice is EventLoopName.ASYNCIO:
        return None
    if importlib.util.find_spec("uvloop") is None:
        if choice is EventLoopName.UVLOOP:
            raise ConfigError("event_loop 'uvloop': uvloop is not installed (pip install uvloop)")
        return None
    import uvloop

    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, _T], choice: EventLoopName) -> _T:
    """``asyncio.run(main)`` on the loop ``choice`` names."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
