"""Which change watcher keeps a gate's cache in step with its store.

PostgreSQL announces changes (``listener.ChangeListener``, LISTEN/NOTIFY: at
once); a SQLite file is polled (``change_poll.SqliteChangePoll``: within
``change_poll.APPLIED_WITHIN_SECONDS``). While a watcher cannot see changes it
suspends the cache, so staleness is bounded by the watcher, not the cache TTL.
"""

from __future__ import annotations

from typing import Protocol

from sidecar.store.change_poll import APPLIED_WITHIN_SECONDS, POLL_SECONDS, SqliteChangePoll
from sidecar.store.listener import HEARTBEAT_SECONDS, ChangeListener, Invalidatable
from sidecar.store.open import is_postgres_url
from sidecar.store.postgres import PostgresStore
from sidecar.store.sqlite import SqliteStore
from sidecar.store.store import MetadataStore


class ChangeWatcher(Protocol):
    """Keeps a cache in step with a store; runs on the event loop that uses the cache."""

    @property
    def listening(self) -> bool:
        """True while changes are seen as they happen."""
        ...

    async def start(self) -> None:
        """Start watching in the background."""
        ...

    async def wait_listening(self, timeout_s: float) -> bool:
        """Wait until changes are seen; False if not within ``timeout_s``."""
        ...

    async def stop(self) -> None:
        """Stop watching."""
        ...


def change_watcher(store: MetadataStore, cache: Invalidatable) -> ChangeWatcher | None:
    """The watcher that keeps ``cache`` in step with ``store``; None for a store of
    another kind (none in this build), whose changes only the cache TTL bounds."""
    if isinstance(store, PostgresStore):
        return ChangeListener(store.listen_url, cache)
    if isinstance(store, SqliteStore):
        return SqliteChangePoll(store, cache)
    return None


def propagation_bound(url: str) -> str:
    """How soon running gates apply a change written to the store at ``url``, as a
    sentence for an operator (``store revoke`` prints it), from the watchers' own
    settings."""
    if is_postgres_url(url):
        return (
            "running gates apply the change at once (PostgreSQL notification); a gate whose LISTEN "
            f"connection broke unnoticed, within {2 * HEARTBEAT_SECONDS:g} s (listener "
            f"heartbeat every {HEARTBEAT_SECONDS:g} s)"
        )
    return (
        f"running gates apply the change within {APPLIED_WITHIN_SECONDS:g} s (each checks the "
        f"SQLite file for changes every {POLL_SECONDS:g} s)"
    )
