"""The SQLite change poll: a change committed by another connection empties the cache at
the next poll; a poll that fails, or stops, suspends the cache and says so."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.config import IdentityMode
from sidecar.core.chunk_record import Status
from sidecar.metrics import GateMetrics
from sidecar.runtime.server import Sidecar
from sidecar.store.cache import CachedStore
from sidecar.store.change_poll import POLL_SECONDS, SqliteChangePoll
from sidecar.store.sqlite import SqliteStore
from tests.fixtures.records import chunk_record as record
from tests.fixtures.settings import settings_of, with_values
from tests.fixtures.stores import new_sqlite_store, new_sqlite_url

# Short, so that the tests wait little; the poll's cadence is not what they check.
INTERVAL_S = 0.02


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[SqliteStore, SqliteStore]]:
    """The gate's store and, on the same file, another writer (as `store revoke` is)."""
    gate = new_sqlite_store(tmp_path / "gate.db")
    gate.upsert([record("c-1"), record("c-2")])
    writer = SqliteStore(tmp_path / "gate.db")
    yield gate, writer
    writer.close()
    gate.close()


def value(metrics: GateMetrics, name: str) -> float:
    """A sample of the gate's metrics, 0 when absent."""
    return metrics.registry.get_sample_value(name) or 0.0


def _deny_pragmas(action: int, *_: object) -> int:
    return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_PRAGMA else sqlite3.SQLITE_OK


async def _until(condition: object, timeout_s: float = 5.0) -> float:
    """Wait (polling the event loop) until ``condition()`` holds; the seconds it took."""
    started = time.monotonic()
    while not condition():  # type: ignore[operator]
        assert time.monotonic() - started < timeout_s, "condition not met in time"
        await asyncio.sleep(0.005)
    return time.monotonic() - started


def test_a_change_by_another_connection_empties_the_cache_at_the_next_poll(
    stores: tuple[SqliteStore, SqliteStore],
) -> None:
    gate, writer = stores
    metrics = GateMetrics()
    cache = CachedStore(gate, ttl=3600.0, observer=metrics)
    poll = SqliteChangePoll(gate, cache, interval_s=INTERVAL_S)

    async def main() -> None:
        await poll.start()
        assert poll.listening and await poll.wait_listening(0)
        assert value(metrics, "retrieval_gate_store_changes_watched") == 1
        assert (await cache.fetch(["c-1"]))["c-1"].status is Status.APPROVED
        writer.set_status("c-1", Status.REVOKED)
        # Cached (an hour's TTL): until the poll sees the change, the old record.
        assert (await cache.fetch(["c-1"]))["c-1"].status is Status.APPROVED

        async def revoked() -> bool:
            return (await cache.fetch(["c-1"]))["c-1"].status is Status.REVOKED

        started = time.monotonic()
        while not await revoked():
            assert time.monotonic() - started < 5.0, "the revocation never reached the cache"
            await asyncio.sleep(0.005)
        # Fetching from the cache again: a poll that finds nothing new drops nothing.
        flushes = value(metrics, "retrieval_gate_cache_flushes_total")
        await asyncio.sleep(INTERVAL_S * 5)
        await cache.fetch(["c-1", "c-2"])
        assert value(metrics, "retrieval_gate_cache_flushes_total") == flushes
        await poll.stop()

    asyncio.run(main())


def test_a_failing_poll_caches_nothing_and_says_so_until_it_works_again(
    stores: tuple[SqliteStore, SqliteStore], caplog: pytest.LogCaptureFixture
) -> None:
    gate, writer = stores
    metrics = GateMetrics()
    cache = CachedStore(gate, ttl=3600.0, observer=metrics)
    poll = SqliteChangePoll(gate, cache, interval_s=INTERVAL_S)

    async def main() -> None:
        await poll.start()
        await cache.fetch(["c-1"])
        gate._reader.set_authorizer(_deny_pragmas)  # PRAGMA data_version now fails
        await _until(lambda: not poll.listening)
        assert value(metrics, "retrieval_gate_store_changes_watched") == 0
        # Suspended: every lookup goes to the file, so a change is seen at once.
        writer.set_status("c-1", Status.REVOKED)
        assert (await cache.fetch(["c-1"]))["c-1"].status is Status.REVOKED
        misses = value(metrics, "retrieval_gate_cache_misses_total")
        await cache.fetch(["c-1"])
        assert value(metrics, "retrieval_gate_cache_misses_total") == misses + 1
        gate._reader.set_authorizer(None)
        await _until(lambda: poll.listening)
        assert value(metrics, "retrieval_gate_store_changes_watched") == 1
        await poll.stop()

    with caplog.at_level(logging.INFO, logger="sidecar.store.change_poll"):
        asyncio.run(main())
    messages = [r.getMessage() for r in caplog.records]
    failed = [m for m in messages if m.startswith("SQLite change poll failed")]
    # Once per failure, not once per poll.
    assert failed == [
        "SQLite change poll failed (StoreUnavailable: SQLite data_version failed: not "
        "authorized); caching no metadata until it works again"
    ]
    assert "SQLite change poll works again; caching metadata again" in messages


def test_a_poll_that_stops_unexpectedly_leaves_the_cache_suspended(
    stores: tuple[SqliteStore, SqliteStore], caplog: pytest.LogCaptureFixture
) -> None:
    gate, _ = stores
    metrics = GateMetrics()
    cache = CachedStore(gate, ttl=3600.0, observer=metrics)
    poll = SqliteChangePoll(gate, cache, interval_s=INTERVAL_S)

    async def main() -> None:
        await poll.start()
        (task,) = [t for t in asyncio.all_tasks() if t.get_name() == "retrieval-gate-sqlite-poll"]
        task.cancel()  # e.g. something cancelled every task but the server
        await _until(task.done)
        await asyncio.sleep(0)  # the done callbacks
        assert not poll.listening
        assert value(metrics, "retrieval_gate_store_changes_watched") == 0
        await cache.fetch(["c-1"])
        await cache.fetch(["c-1"])
        assert value(metrics, "retrieval_gate_cache_hits_total") == 0  # nothing kept
        await poll.stop()

    with caplog.at_level(logging.ERROR, logger="sidecar.store.change_poll"):
        asyncio.run(main())
    assert "SQLite change poll stopped" in caplog.text


def test_every_sidecar_on_sqlite_polls_for_changes(tmp_path: Path) -> None:
    # Each worker process builds its own Sidecar from the settings: each gets a poll.
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
    )
    sidecar = Sidecar.from_settings(settings)
    try:
        assert isinstance(sidecar.listener, SqliteChangePoll)
        assert POLL_SECONDS <= 0.5
    finally:
        asyncio.run(sidecar.aclose())
