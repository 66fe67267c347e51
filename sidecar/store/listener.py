"""Live cache invalidation from PostgreSQL notifications.

Triggers on ``chunks`` and ``electronic_signatures`` (migrations 0001, 0002)
send ``NOTIFY retrieval_gate_chunks`` with a changed chunk id as payload, for
changes by any tool: our CLI, psql, an ETL job. ``ChangeListener`` holds one
dedicated connection that LISTENs on that channel and drops each named id from
the cache; an empty payload drops everything.

A notification sent while the listener is not connected is lost, so every
connection loss clears the cache at once, and the cache is cleared again once
LISTEN is re-established: whatever was fetched in between may predate a change
nobody told us about. Reconnection backs off exponentially with jitter (at
most ``backoff_max_s``, 1 s by default). A heartbeat query finds a silently
dead connection (e.g. a network partition).

LISTEN needs a session that stays the listener's: through PgBouncer in
transaction pooling mode the LISTEN statement succeeds, but the server
connection goes back to the pool when it ends and no notification ever
arrives. So the listener connects to ``store.listen_url`` (a direct
connection to PostgreSQL, or a session-mode pool), by default ``store.url``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterable
from typing import Protocol

import psycopg
from psycopg.rows import TupleRow

from sidecar.postgres.dsn import PostgresUrl, parse_postgres_url
from sidecar.store.postgres import connect_options

CHANNEL = "retrieval_gate_chunks"
# How long the listener waits for a notification before it checks that its
# connection still answers (and how long it gives that check): a connection
# that broke unnoticed is found within twice this, and the cache suspended.
HEARTBEAT_SECONDS = 5.0
FLUSH_PAYLOAD = ""  # chunk ids are never blank, so this cannot name one

_log = logging.getLogger(__name__)


class Invalidatable(Protocol):
    """What the listener needs of a cache (CachedStore has it)."""

    def invalidate(self, chunk_ids: Iterable[str]) -> None:
        """Forget these ids."""

    def clear(self) -> None:
        """Forget everything."""

    def suspend(self) -> None:
        """Forget everything and cache nothing until ``resume``."""

    def resume(self) -> None:
        """Cache again, from empty."""


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Cancel a watcher's background ``task`` and wait for it to end; a cancellation
    of the caller itself still propagates."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


class ChangeListener:
    """Keeps a LISTEN connection open and invalidates ``cache`` per notification.

    Run it on the event loop that uses the cache: ``await start()`` after the
    loop runs, ``await stop()`` before it ends. ``url`` is a URL of the store's
    database that gives a session of its own (``PostgresStore.listen_url``),
    given as a string or parsed; it is never logged unredacted.
    """

    def __init__(
        self,
        url: str | PostgresUrl,
        cache: Invalidatable,
        *,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 1.0,
        heartbeat_s: float = HEARTBEAT_SECONDS,
    ) -> None:
        self._url = url if isinstance(url, PostgresUrl) else parse_postgres_url(url)
        self._cache = cache
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._heartbeat_s = heartbeat_s
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._backend_pid: int | None = None

    @property
    def listening(self) -> bool:
        """True while LISTEN is established (and the cache was cleared after it)."""
        return self._listening.is_set()

    @property
    def backend_pid(self) -> int | None:
        """The server process of the LISTEN connection, while there is one."""
        return self._backend_pid

    async def start(self) -> None:
        """Start listening in a background task; returns at once (connects on its own)."""
        if self._task is None:
            # Until LISTEN is up, a change would go unannounced: cache nothing.
            self._cache.suspend()
            self._task = asyncio.create_task(self._run(), name="retrieval-gate-listener")

    async def wait_listening(self, timeout_s: float) -> bool:
        """Wait until LISTEN is established; False if it is not within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._listening.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        """Stop listening and close the connection."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _run(self) -> None:
        backoff = self._backoff_initial_s
        try:
            while True:
                try:
                    await self._listen()
                except Exception as exc:  # whatever broke: reconnect
                    lost = self.listening
                    if lost:  # it worked until now: retry soon
                        backoff = self._backoff_initial_s
                    self._disconnected()
                    _log.warning(
                        "metadata change listener %s: %s",
                        "lost its connection" if lost else "cannot connect",
                        self._url.scrub(f"{type(exc).__name__}: {exc}".strip()),
                    )
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, self._backoff_max_s)
        finally:
            self._disconnected()

    def _disconnected(self) -> None:
        self._listening.clear()
        self._backend_pid = None
        # Changes may be happening unannounced from now on: cache nothing meanwhile.
        self._cache.suspend()

    async def _listen(self) -> None:
        options = connect_options(self._url) | {"autocommit": True}
        connection = await psycopg.AsyncConnection.connect(self._url.url, **options)
        async with connection:
            # CHANNEL, spelled out: LISTEN takes no bound parameters.
            await connection.execute("LISTEN retrieval_gate_chunks")
            # Anything cached so far may predate a change made while we were
            # not listening; from here on every change is announced.
            self._cache.resume()
            self._backend_pid = connection.info.backend_pid
            self._listening.set()
            _log.info(
                "listening for metadata changes on %s (backend pid %d)",
                self._url,
                self._backend_pid,
            )
            while True:
                async for notification in connection.notifies(timeout=self._heartbeat_s):
                    self._apply(notification.payload)
                await self._heartbeat(connection)

    async def _heartbeat(self, connection: psycopg.AsyncConnection[TupleRow]) -> None:
        # Notifications arriving meanwhile are buffered by psycopg and
        # delivered by the next notifies().
        async with asyncio.timeout(self._heartbeat_s):
            await connection.execute("SELECT 1")

    def _apply(self, payload: str) -> None:
        if payload == FLUSH_PAYLOAD:
            self._cache.clear()
        else:
            self._cache.invalidate([payload])
