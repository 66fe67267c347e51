"""Live cache invalidation for a SQLite store: its ``data_version``, polled.

SQLite sends no notifications. Every ``POLL_SECONDS`` the poll asks the
store's file for ``PRAGMA data_version``, which changes whenever a connection
other than the asking one commits a change: `store revoke` or `store load` in
another process, a script with sqlite3, a hand edit. On a change the whole
cache is dropped, so a running gate stops serving a revoked chunk within
``APPLIED_WITHIN_SECONDS`` rather than the cache TTL. Everything is dropped,
not the changed ids: SQLite does not say which rows changed, and a cold cache
costs one lookup in a local file per response (docs/postgresql.md, "SQLite:
the change poll").

The poll is a task on the event loop that uses the cache, not work done per
request; each worker process runs its own. A poll that fails suspends the
cache (nothing is cached, every lookup goes to the file) and logs a warning
until a poll succeeds again, so a broken poll never keeps stale records in
service; the cache observer's ``watching`` (the gauge
``retrieval_gate_store_changes_watched``) shows it.
"""

from __future__ import annotations

import asyncio
import logging

from sidecar.store.listener import Invalidatable, cancel_and_wait
from sidecar.store.sqlite import SqliteStore

# How often a running gate asks the file whether it changed.
POLL_SECONDS = 0.5
# How soon a running gate applies a change (store revoke prints it): one
# interval, plus what delays a poll on a busy event loop and a response whose
# lookup came just before the change (bench/revocation.py --store sqlite: p50
# 0.50 s, max 0.64 s with the poll just missed every round, on a busy machine).
APPLIED_WITHIN_SECONDS = 2 * POLL_SECONDS

_log = logging.getLogger(__name__)


class SqliteChangePoll:
    """Polls ``store``'s data_version and clears ``cache`` when it changes.

    Run it on the event loop that uses the cache: ``await start()`` after the
    loop runs, ``await stop()`` before it ends.
    """

    def __init__(
        self, store: SqliteStore, cache: Invalidatable, *, interval_s: float = POLL_SECONDS
    ) -> None:
        self._store = store
        self._cache = cache
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._version: int | None = None
        # None until the first poll; then whether the last one succeeded.
        self._working: bool | None = None

    @property
    def listening(self) -> bool:
        """True while the last poll succeeded (changes are seen)."""
        return self._working is True

    async def start(self) -> None:
        """Take the file's version now (the cache starts empty) and poll from then on."""
        if self._task is None:
            self._poll()
            self._task = asyncio.create_task(self._run(), name="retrieval-gate-sqlite-poll")
            self._task.add_done_callback(self._ended)

    async def wait_listening(self, timeout_s: float) -> bool:
        """Whether the first poll succeeded (it ran in ``start``; nothing to wait for)."""
        return self.listening

    async def stop(self) -> None:
        """Stop polling."""
        task, self._task = self._task, None
        if task is not None:
            task.remove_done_callback(self._ended)
            await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self._poll()

    def _poll(self) -> None:
        try:
            version = self._store.data_version()
        except Exception as exc:  # whatever broke, no change can be seen now
            if self._working is not False:
                _log.warning(
                    "SQLite change poll failed (%s: %s); caching no metadata until it works again",
                    type(exc).__name__,
                    exc,
                )
                self._working = False
                self._cache.suspend()
            return
        if self._working is not True:
            if self._working is False:
                _log.info("SQLite change poll works again; caching metadata again")
            # Whatever was cached may predate a change nobody saw: start from empty.
            self._cache.resume()
            self._working = True
        elif version != self._version:
            self._cache.clear()
        self._version = version

    def _ended(self, task: asyncio.Task[None]) -> None:
        # The loop catches every Exception, so only something worse ends it early.
        self._working = False
        self._cache.suspend()
        error = None if task.cancelled() else task.exception()
        _log.error("SQLite change poll stopped (%r); caching no metadata from now on", error)
