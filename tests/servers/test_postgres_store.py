"""PostgreSQL specifics: migrations, constraints, change notifications, the listener,
outages and password redaction, on the machine's real server.

Most tests share one migrated database (``postgres_url``, tests/conftest.py);
migration tests make their own. Password cases that need no server are in
test_postgres_passwords.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable, Iterator, Mapping
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.store import schema
from sidecar.store.cache import CachedStore, NullCacheObserver
from sidecar.store.change_poll import SqliteChangePoll
from sidecar.store.listener import ChangeListener
from sidecar.store.open import open_store
from sidecar.store.postgres import PostgresStore, migrate
from sidecar.store.schema import MigrationFailed
from sidecar.store.store import SchemaMismatch, StoreUnavailable
from sidecar.store.watch import change_watcher
from tests.fixtures.postgres import ADMIN_URL, fresh_database
from tests.fixtures.records import EFFECTIVE
from tests.fixtures.records import chunk_record as record
from tests.fixtures.stores import new_sqlite_store

pytestmark = pytest.mark.postgres

PASSWORD = "s3cret-Pw"


@pytest.fixture
def sql(postgres_url: str) -> Iterator[Callable[..., list[tuple[Any, ...]]]]:
    """Runs SQL as an operator's own tool would (autocommit, like psql)."""
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute("TRUNCATE chunks, electronic_signatures")

        def run(statement: str, *params: object) -> list[tuple[Any, ...]]:
            cursor = connection.execute(statement.encode(), params or None)
            return cursor.fetchall() if cursor.description else []

        yield run


def database_name(url: str) -> str:
    return url.rsplit("/", 1)[1]


def admin(statement: str, *params: object) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        connection.execute(statement.encode(), params or None)


def terminate(pids: Collection[int]) -> None:
    for pid in pids:
        admin("SELECT pg_terminate_backend(%s)", pid)


def backends(url: str, *, except_pids: Collection[int] = ()) -> list[int]:
    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (database_name(url), "retrieval-gate"),
        ).fetchall()
    return [pid for (pid,) in rows if pid not in except_pids]


async def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until ``condition()`` holds; a functional bound, not a timing assertion."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - the condition has no event to wait on
            await asyncio.sleep(0.01)


# --- migrations ----------------------------------------------------------------------------


def applied_versions(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as connection:
        rows = connection.execute("SELECT version, name FROM schema_migrations ORDER BY 1")
        return [(version, name) for version, name in rows.fetchall()]


def test_migrations_are_versioned_and_idempotent() -> None:
    with fresh_database() as database:
        with pytest.raises(SchemaMismatch, match=r"no retrieval-gate schema.*store migrate"):
            open_store(database)
        applied = migrate(database)
        shipped = [(1, "chunks"), (2, "electronic_signatures"), (3, "payload_sha256")]
        assert [(m.version, m.name) for m in applied] == shipped
        assert migrate(database) == []
        assert applied_versions(database) == shipped
        store = open_store(database)
        assert isinstance(store, PostgresStore)


def test_older_and_newer_schemas_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with fresh_database() as database:
        with monkeypatch.context() as older_build:
            first = schema.migrations()[:1]
            older_build.setattr(schema, "migrations", lambda: first)
            older_build.setattr(schema, "latest_version", lambda: 1)
            assert [m.version for m in migrate(database)] == [1]
        with pytest.raises(SchemaMismatch, match="version 1, this build needs version 3"):
            PostgresStore(database)
        assert [m.version for m in migrate(database)] == [2, 3]
        PostgresStore(database)
        with psycopg.connect(database, autocommit=True) as connection:
            connection.execute("INSERT INTO schema_migrations (version, name) VALUES (4, 'x')")
        with pytest.raises(SchemaMismatch, match="version 4, newer than"):
            PostgresStore(database)
        with pytest.raises(SchemaMismatch, match="newer"):
            migrate(database)


def test_a_failing_migration_is_rolled_back_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = schema.Migration(4, "broken", "CREATE TABLE half_done (x int); SELECT 1/0;")
    with fresh_database() as database:
        shipped = schema.migrations()
        monkeypatch.setattr(schema, "migrations", lambda: (*shipped, broken))
        monkeypatch.setattr(schema, "latest_version", lambda: 4)
        with pytest.raises(
            MigrationFailed, match=r"migration 0004 \(broken\) failed.*division by zero"
        ):
            migrate(database)
        assert [v for v, _ in applied_versions(database)] == [1, 2, 3]
        with psycopg.connect(database) as connection:
            row = connection.execute("SELECT to_regclass('half_done')").fetchone()
        assert row == (None,)


def test_payload_sha256_migration_upgrades_a_version_2_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with fresh_database() as database:
        with monkeypatch.context() as version_2_build:
            first_two = schema.migrations()[:2]
            version_2_build.setattr(schema, "migrations", lambda: first_two)
            version_2_build.setattr(schema, "latest_version", lambda: 2)
            migrate(database)
        with psycopg.connect(database, autocommit=True) as connection:
            # A row as a version 2 build wrote it (no payload_sha256 column yet).
            connection.execute(
                "INSERT INTO chunks (chunk_id, doc_id, version, tenant_id, allowed_principals,"
                " status, effective_at, sha256, text) VALUES"
                " ('c-1', 'doc', '1', 'acme', '{group:support}', 'approved', %s, %s, 'kept')",
                (EFFECTIVE, "ab" * 32),
            )
        assert [(m.version, m.name) for m in migrate(database)] == [(3, "payload_sha256")]
        store = PostgresStore(database)
        # Records from before the migration vouch for no payload field.
        assert store.get("c-1") == record("c-1", text="kept")
        store.upsert([record("c-2", payload_sha256="cd" * 32)])
        assert store.get("c-2") == record("c-2", payload_sha256="cd" * 32)
        with psycopg.connect(database, autocommit=True) as connection:
            with pytest.raises(psycopg.errors.CheckViolation):
                connection.execute("UPDATE chunks SET payload_sha256 = 'CD' WHERE chunk_id = 'c-1'")
            [(null_hashes,)] = connection.execute(
                "SELECT count(*) FROM chunks WHERE payload_sha256 IS NULL"
            ).fetchall()
        assert null_hashes == 1


# --- the table mirrors the record contract ------------------------------------------------


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("status", "published"),
        ("sha256", "AB" * 32),
        ("payload_sha256", "AB" * 32),
        ("payload_sha256", "a" * 63),
        ("tenant_id", "  "),
        ("allowed_principals", []),
        ("allowed_principals", ["group:qa", " "]),
        ("effective_at", "infinity"),
        ("expires_at", "2024-12-31T23:59:59Z"),  # before effective_at
        ("superseded_by", "c-1"),  # itself
    ],
)
def test_hand_edits_cannot_break_the_contract(
    postgres_url: str, sql: Callable[..., Any], column: str, value: object
) -> None:
    PostgresStore(postgres_url).upsert([record("c-1")])
    with pytest.raises(psycopg.errors.CheckViolation):
        sql(f"UPDATE chunks SET {column} = %s WHERE chunk_id = 'c-1'", value)


def test_upsert_error_does_not_quote_the_row(postgres_url: str, sql: Callable[..., Any]) -> None:
    store = PostgresStore(postgres_url)
    with pytest.raises(ValueError, match="chunks_sha256_format") as caught:
        store.upsert([record("c-1", sha256="f" * 63, text="secret chunk text")])
    assert "secret" not in str(caught.value)


# --- notifications ---------------------------------------------------------------------------


Notifications = Callable[[Callable[[], object]], list[str]]


@pytest.fixture
def notifications(postgres_url: str) -> Notifications:
    """``notifications(change)``: the payloads that ``change`` sends, in order."""

    def collect(change: Callable[[], object]) -> list[str]:
        end = "-- end of test --"
        with psycopg.connect(postgres_url, autocommit=True) as listen:
            listen.execute("LISTEN retrieval_gate_chunks")
            change()
            # Committed after the change, so delivered after its notifications.
            listen.execute("SELECT pg_notify('retrieval_gate_chunks', %s)", (end,))
            payloads: list[str] = []
            for notification in listen.notifies(timeout=10):
                if notification.payload == end:
                    return payloads
                payloads.append(notification.payload)
        raise AssertionError(f"no end marker; got {payloads}")

    return collect


def test_changes_notify_the_chunk_ids(
    postgres_url: str, sql: Callable[..., Any], notifications: Notifications
) -> None:
    store = PostgresStore(postgres_url)
    store.upsert([record("c-1"), record("c-2")])
    unchanged_and_changed = [record("c-1"), record("c-2", status=Status.REVOKED), record("c-3")]
    assert notifications(lambda: store.upsert(unchanged_and_changed)) == ["c-2", "c-3"]
    assert notifications(lambda: store.set_status("c-1", Status.QUARANTINED)) == ["c-1"]
    assert notifications(lambda: sql("DELETE FROM chunks WHERE chunk_id = 'c-3'")) == ["c-3"]
    renamed = notifications(
        lambda: sql("UPDATE chunks SET chunk_id = 'c-9' WHERE chunk_id = 'c-2'")
    )
    assert sorted(renamed) == ["c-2", "c-9"]
    assert notifications(lambda: sql("TRUNCATE chunks")) == [""]


def test_signature_changes_flush_every_cache(
    postgres_url: str, sql: Callable[..., Any], notifications: Notifications
) -> None:
    PostgresStore(postgres_url).upsert(
        [
            record("c-1", doc_id="sop", version="2"),
            record("c-2", doc_id="sop", version="2"),
            record("c-3", doc_id="sop", version="1", status=Status.SUPERSEDED, superseded_by="c-1"),
        ]
    )
    sign = (
        "INSERT INTO electronic_signatures (doc_id, version, signer, meaning, signed_at) "
        "VALUES ('sop', '2', 'user:qa', 'approval', now())"
    )
    # A flush, not the chunk ids: a chunk moved into this version by a
    # concurrent transaction would not be named (see the migration).
    assert notifications(lambda: sql(sign)) == [""]
    revoke = "UPDATE electronic_signatures SET is_valid = false"
    assert notifications(lambda: sql(revoke)) == [""]
    assert notifications(lambda: sql("TRUNCATE electronic_signatures")) == [""]


def test_an_id_too_long_for_a_payload_flushes_instead(
    postgres_url: str, sql: Callable[..., Any], notifications: Notifications
) -> None:
    long_id = "x" * 8000
    assert notifications(lambda: PostgresStore(postgres_url).upsert([record(long_id)])) == [""]


# --- the listener ------------------------------------------------------------------------------


class Events(NullCacheObserver):
    def __init__(self) -> None:
        self.invalidations = 0
        self.clears = 0

    def invalidated(self, n: int) -> None:
        self.invalidations += n

    def cleared(self) -> None:
        self.clears += 1


Scenario = Callable[[PostgresStore, CachedStore, ChangeListener, Events], Coroutine[Any, Any, None]]


def run_with_listener(url: str, scenario: Scenario, **listener_options: float) -> None:
    """Runs ``scenario`` with a cache (TTLs of an hour: only invalidation refreshes it)
    over a store, and a started listener."""

    async def main() -> None:
        store = PostgresStore(url, query_timeout_s=0.5)
        events = Events()
        cache = CachedStore(store, ttl=3600, negative_ttl=3600, observer=events)
        listener = ChangeListener(url, cache, **listener_options)
        await listener.start()
        try:
            assert await listener.wait_listening(10)
            await scenario(store, cache, listener, events)
        finally:
            await listener.stop()
            await cache.aclose()

    asyncio.run(main())


async def status(cache: CachedStore, chunk_id: str) -> Status | None:
    found: Mapping[str, ChunkRecord] = await cache.fetch([chunk_id])
    return found[chunk_id].status if chunk_id in found else None


async def has_status(cache: CachedStore, chunk_id: str, expected: Status | None) -> bool:
    return await status(cache, chunk_id) is expected


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    """Poll ``check`` until it holds; the cache's hour-long TTL means only an
    invalidation can make it hold."""
    async with asyncio.timeout(timeout_s):
        while not await check():  # noqa: ASYNC110 - polling what a response would see
            await asyncio.sleep(0.01)


def test_plain_sql_changes_reach_the_cache(postgres_url: str, sql: Callable[..., Any]) -> None:
    async def scenario(
        store: PostgresStore, cache: CachedStore, listener: ChangeListener, events: Events
    ) -> None:
        store.upsert([record("c-1", requires_signature=True)])
        assert await status(cache, "c-1") is Status.APPROVED
        assert await status(cache, "c-2") is None  # cached as absent

        sql("UPDATE chunks SET status = 'revoked' WHERE chunk_id = 'c-1'")
        await until(lambda: has_status(cache, "c-1", Status.REVOKED))

        sql(
            "INSERT INTO electronic_signatures (doc_id, version, signer, meaning, signed_at) "
            "VALUES ('doc', '1', 'user:qa', 'approval', now())"
        )

        async def signed() -> bool:
            return (await cache.fetch(["c-1"]))["c-1"].signature_valid

        await until(signed)

        sql(
            "INSERT INTO chunks (chunk_id, doc_id, tenant_id, allowed_principals, status, "
            "effective_at, sha256) VALUES ('c-2', 'doc', 'acme', '{group:qa}', 'approved', "
            "now(), repeat('ab', 32))"
        )
        await until(lambda: has_status(cache, "c-2", Status.APPROVED))

        sql("DELETE FROM chunks WHERE chunk_id = 'c-2'")
        await until(lambda: has_status(cache, "c-2", None))

        clears = events.clears
        sql("NOTIFY retrieval_gate_chunks")  # an operator's "forget everything"
        await eventually(lambda: events.clears > clears)

    run_with_listener(postgres_url, scenario)


def test_killed_listen_connection_clears_the_cache_and_listens_again(
    postgres_url: str, sql: Callable[..., Any]
) -> None:
    async def scenario(
        store: PostgresStore, cache: CachedStore, listener: ChangeListener, events: Events
    ) -> None:
        store.upsert([record("c-1")])
        assert await status(cache, "c-1") is Status.APPROVED
        first_pid = listener.backend_pid
        assert first_pid is not None
        clears = events.clears
        terminate([first_pid])
        # Cleared once when the loss is noticed, once more after LISTEN again.
        await eventually(lambda: listener.listening and events.clears >= clears + 2)
        assert listener.backend_pid not in (None, first_pid)
        sql("UPDATE chunks SET status = 'quarantined' WHERE chunk_id = 'c-1'")
        await until(lambda: has_status(cache, "c-1", Status.QUARANTINED))

    run_with_listener(postgres_url, scenario)


def test_change_missed_while_disconnected_leaves_no_stale_entry(
    postgres_url: str, sql: Callable[..., Any]
) -> None:
    async def scenario(
        store: PostgresStore, cache: CachedStore, listener: ChangeListener, events: Events
    ) -> None:
        store.upsert([record("c-1")])
        await cache.fetch(["c-1"])  # the pool now holds a live connection
        name = database_name(postgres_url)
        admin(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        try:
            assert listener.backend_pid is not None
            terminate([listener.backend_pid])
            await eventually(lambda: not listener.listening)
            # Meanwhile the pool still reads, and a change goes unannounced.
            assert await status(cache, "c-1") is Status.APPROVED
            sql("UPDATE chunks SET status = 'revoked' WHERE chunk_id = 'c-1'")
            # Nothing is cached while unannounced: the next read sees the change.
            assert await status(cache, "c-1") is Status.REVOKED
        finally:
            admin(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        await eventually(lambda: listener.listening)
        assert await status(cache, "c-1") is Status.REVOKED

    run_with_listener(postgres_url, scenario, backoff_initial_s=0.05, backoff_max_s=0.2)


def test_listener_logs_never_show_the_password(caplog: pytest.LogCaptureFixture) -> None:
    unreachable = f"postgresql://gate:{PASSWORD}@127.0.0.1:1/gate"

    class Cache:
        def invalidate(self, chunk_ids: Iterable[str]) -> None:
            raise AssertionError("nothing to invalidate")

        def clear(self) -> None:
            pass

        def suspend(self) -> None:
            return None

        def resume(self) -> None:
            return None

    async def main() -> None:
        listener = ChangeListener(unreachable, Cache(), backoff_initial_s=0.01)
        await listener.start()
        await eventually(lambda: len(caplog.records) >= 2)
        assert not listener.listening
        await listener.stop()

    with caplog.at_level(logging.WARNING, logger="sidecar.store.listener"):
        asyncio.run(main())
    assert "cannot connect" in caplog.text
    assert PASSWORD not in caplog.text


def test_each_store_kind_has_its_change_watcher(postgres_url: str, tmp_path: Any) -> None:
    store = PostgresStore(postgres_url)
    assert isinstance(change_watcher(store, CachedStore(store)), ChangeListener)
    sqlite = new_sqlite_store(tmp_path / "meta.db")
    assert isinstance(change_watcher(sqlite, CachedStore(sqlite)), SqliteChangePoll)
    sqlite.close()


# --- the pool through outages ------------------------------------------------------------------


def test_fetch_survives_killed_pool_connections(postgres_url: str, sql: Callable[..., Any]) -> None:
    async def main() -> None:
        store = PostgresStore(postgres_url)
        store.upsert([record("c-1")])
        try:
            assert set(await store.fetch(["c-1"])) == {"c-1"}
            terminate(backends(postgres_url))
            assert set(await store.fetch(["c-1"])) == {"c-1"}
        finally:
            await store.aclose()

    asyncio.run(main())


def test_unreachable_database_fails_closed_then_recovers(
    postgres_url: str, sql: Callable[..., Any]
) -> None:
    name = database_name(postgres_url)

    async def main() -> None:
        # One pooled connection, so none is being opened while access is revoked.
        store = PostgresStore(postgres_url, query_timeout_s=0.5, pool_max_size=1)
        store.upsert([record("c-1")])
        cache = CachedStore(store, ttl=0.01)
        try:
            assert set(await cache.fetch(["c-1"])) == {"c-1"}
            admin(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
            terminate(backends(postgres_url))
            await asyncio.sleep(0.02)  # the cached entry expires
            with pytest.raises(StoreUnavailable):
                await store.fetch(["c-1"])
            lookup = await cache.fetch_partial(["c-1"])
            assert lookup.records == {} and lookup.unavailable == {"c-1"}
            admin(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')

            async def answers() -> bool:
                try:
                    return set(await store.fetch(["c-1"])) == {"c-1"}
                except StoreUnavailable:
                    return False

            await until(answers, timeout_s=20)
        finally:
            admin(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
            await cache.aclose()

    asyncio.run(main())


# --- passwords -----------------------------------------------------------------------------------


def test_driver_messages_are_scrubbed() -> None:
    # The server echoes the database name, here equal to the password (trust
    # authentication ignores the password itself).
    admin_url = conninfo_to_dict(ADMIN_URL)
    host, port, user = admin_url["host"], admin_url.get("port", 5432), admin_url["user"]
    with pytest.raises(StoreUnavailable) as caught:
        PostgresStore(f"postgresql://{user}:{PASSWORD}@{host}:{port}/{PASSWORD}")
    assert PASSWORD not in str(caught.value)
    assert 'database "***" does not exist' in str(caught.value)
