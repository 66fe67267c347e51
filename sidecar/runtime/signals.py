"""Running until SIGINT or SIGTERM, or until a supervised process exits on its own.

``serve``, ``serve`` with workers and ``proxy`` all run the same way: install
the handlers first (a signal during start-up then stops cleanly once started,
instead of killing the parent and orphaning its children), start, wait, stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Mapping
from types import TracebackType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOPPED = 0  # the process exit status after a requested stop
DIED = 1  # ... after a supervised process (Envoy, a worker) exited on its own

log = logging.getLogger(__name__)


class StopSignals:
    """While inside ``with``, SIGINT and SIGTERM set :attr:`stop` instead of ending the process.

    ``stop`` may also be set by the caller (the demo stops its proxy that way).
    Where handlers cannot be installed (not the main thread), only ``stop`` stops.
    """

    def __init__(self, stop: asyncio.Event | None = None) -> None:
        self.stop = stop if stop is not None else asyncio.Event()
        self._installed: list[signal.Signals] = []

    def __enter__(self) -> StopSignals:
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self.stop.set)
                self._installed.append(signum)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        for signum in self._installed:
            loop.remove_signal_handler(signum)
        self._installed.clear()

    async def wait(self, exits: Mapping[str, Awaitable[int]] | None = None) -> int:
        """Wait for a stop or for the first of ``exits`` (name -> its exit code) to finish.

        Returns STOPPED after a stop; DIED, having logged what exited, when
        one of ``exits`` finished first, or together with the stop (the
        failure must not be lost).
        """
        watched = {name: asyncio.ensure_future(waiter) for name, waiter in (exits or {}).items()}
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({stopped, *watched.values()}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stopped, *watched.values()):
                task.cancel()
        for name, task in watched.items():
            if task.done() and not task.cancelled():
                log.error("%s exited with code %s; stopping", name, task.result())
                return DIED
        return STOPPED
