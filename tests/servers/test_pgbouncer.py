"""The gate's PostgreSQL traffic through a real PgBouncer in transaction pooling mode.

Lookups are covered by the store contract suite (tests/servers/
test_store_contract.py, backend ``pgbouncer``). Here: audit shipping through
PgBouncer, and LISTEN, which needs a session of its own (``store.listen_url``).
Every PgBouncer here hands consecutive transactions different server
connections (two of them, used in turn), so whatever relies on session state
fails as it would under load in production.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sidecar.audit.jsonl import JsonlAuditSink
from sidecar.audit.postgres import PostgresAuditSink
from sidecar.audit.postgres_schema import ensure_schema
from sidecar.config.groups import StoreSettings
from sidecar.core.chunk_record import Status
from sidecar.runtime.metadata_store import open_metadata_store
from sidecar.store.cache import CachedStore
from sidecar.store.listener import ChangeListener
from sidecar.store.postgres import PostgresStore
from sidecar.store.watch import change_watcher
from tests.fixtures.pgbouncer import PgBouncer, running_pgbouncer
from tests.fixtures.records import chunk_record as record

pytestmark = [pytest.mark.timeout(60), pytest.mark.postgres, pytest.mark.pgbouncer]


@pytest.fixture(scope="module")
def bouncer(postgres_url: str) -> Iterator[PgBouncer]:
    with running_pgbouncer(pool_size=2, server_round_robin=True) as running:
        running.open_server_connections(postgres_url, 2)
        yield running


def _server_pids_seen(url: str, times: int) -> set[int]:
    with psycopg.connect(url, autocommit=True) as connection:
        return {
            row[0]
            for _ in range(times)
            if (row := connection.execute("SELECT pg_backend_pid()").fetchone())
        }


def test_the_bouncer_hands_out_different_server_connections(
    bouncer: PgBouncer, postgres_url: str
) -> None:
    # What makes the other tests here meaningful: one client, two server sessions.
    assert len(_server_pids_seen(bouncer.url(postgres_url), 4)) == 2


# --- audit shipping ----------------------------------------------------------------------------


def _ship_through(bouncer: PgBouncer, database: str, spool: Path, chain_id: str) -> list[int]:
    """Ship 40 spooled records through ``bouncer`` in batches of 2; the seqs stored."""
    with psycopg.connect(database) as connection:
        ensure_schema(connection)
    writer = JsonlAuditSink(spool)
    for i in range(40):
        writer.write({"decision_id": f"d{i}", "admitted": [f"c{i}"]})
    writer.close()
    # Twenty INSERTs on the shipper's one connection: more than psycopg's
    # prepare threshold (5).
    sink = PostgresAuditSink(spool, bouncer.url(database), chain_id=chain_id, batch_size=2)
    sink.start()
    deadline = time.monotonic() + 20
    while sink.backlog and time.monotonic() < deadline:
        time.sleep(0.02)
    sink.close()
    assert sink.failure is None
    with psycopg.connect(database) as connection:
        return [
            int(seq)
            for (seq,) in connection.execute(
                "SELECT seq FROM audit_records WHERE chain_id = %s ORDER BY seq", (chain_id,)
            )
        ]


def test_audit_records_ship_through_pgbouncer(
    bouncer: PgBouncer, postgres_url: str, tmp_path: Path
) -> None:
    assert _ship_through(bouncer, postgres_url, tmp_path / "spool.jsonl", "via-a") == list(
        range(1, 41)
    )


def test_audit_shipping_through_pgbouncer_fails_no_batch(
    bouncer: PgBouncer, postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="sidecar.audit.postgres"):
        _ship_through(bouncer, postgres_url, tmp_path / "spool.jsonl", "via-b")
    # A failed batch is retried, so the rows alone would not show it.
    assert [r.getMessage() for r in caplog.records if r.name == "sidecar.audit.postgres"] == []


# --- LISTEN needs a session of its own ---------------------------------------------------------


async def _invalidated_within(listener_url: str, store: PostgresStore, timeout_s: float) -> bool:
    """Whether a change to c-1 reaches a cache whose listener connects to ``listener_url``."""
    cache = CachedStore(store, ttl=3600, negative_ttl=3600)
    listener = ChangeListener(listener_url, cache)
    await listener.start()
    try:
        assert await listener.wait_listening(10)
        assert (await cache.fetch(["c-1"]))["c-1"].status is Status.APPROVED
        await asyncio.to_thread(store.set_status, "c-1", Status.REVOKED)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (await cache.fetch(["c-1"]))["c-1"].status is Status.REVOKED:
                return True
            await asyncio.sleep(0.01)
        return False
    finally:
        await listener.stop()
        await cache.aclose()


def test_listener_uses_the_listen_url_and_hears_changes(
    bouncer: PgBouncer, postgres_url: str
) -> None:
    store = PostgresStore(bouncer.url(postgres_url), pgbouncer=True, listen_url=postgres_url)
    # Approved again on purpose: another test of this module may have revoked it.
    store.upsert([record("c-1")], reinstate=True)
    cache = CachedStore(store)
    listener = change_watcher(store, cache)
    assert isinstance(listener, ChangeListener) and listener._url == store.listen_url
    assert str(store.listen_url) == postgres_url
    assert asyncio.run(_invalidated_within(postgres_url, store, timeout_s=5))


def test_listen_through_transaction_pooling_hears_nothing(
    bouncer: PgBouncer, postgres_url: str
) -> None:
    # Why store.listen_url exists: LISTEN succeeds through PgBouncer, but the
    # server session it ran in goes back to the pool and no change arrives.
    via = bouncer.url(postgres_url)
    store = PostgresStore(via, pgbouncer=True, listen_url=postgres_url)
    store.upsert([record("c-1")], reinstate=True)  # as above
    assert not asyncio.run(_invalidated_within(via, store, timeout_s=1))


# --- the serving sidecar's settings ------------------------------------------------------------


def test_the_sidecar_opens_its_store_with_the_store_settings(
    bouncer: PgBouncer, postgres_url: str
) -> None:
    settings = StoreSettings(
        url=bouncer.url(postgres_url),
        pool_min=0,
        pool_max=2,
        pgbouncer=True,
        listen_url=postgres_url,
    )
    store = open_metadata_store(settings)
    assert isinstance(store, PostgresStore)
    assert (store._pool.min_size, store._pool.max_size) == (0, 2)
    assert store.pgbouncer and str(store.listen_url) == postgres_url
    kwargs = store._pool.kwargs
    assert isinstance(kwargs, dict) and kwargs["prepare_threshold"] is None
    store.close()
    direct = open_metadata_store(StoreSettings(url=postgres_url))
    assert isinstance(direct, PostgresStore)
    assert (direct._pool.min_size, direct._pool.max_size) == (1, 4)
    assert direct.listen_url == direct.url
    assert isinstance(direct._pool.kwargs, dict) and "prepare_threshold" not in direct._pool.kwargs
    direct.close()
