"""The SQLite metadata store and open_store, on real files."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.store.loader import RecordsInvalid, load_jsonl
from sidecar.store.open import open_store
from sidecar.store.sqlite import SCHEMA_VERSION, SqliteStore, migrate
from sidecar.store.store import MetadataStore, SchemaMismatch, StoreNotCreated, StoreUnavailable
from tests.fixtures.records import chunk_record as record
from tests.fixtures.stores import new_sqlite_store

CHUNKS_JSONL = """\
{"chunk_id": "c-1", "doc_id": "refunds", "version": "3", "tenant_id": "acme", "allowed_principals": ["group:support", "user:ann"], "status": "approved", "effective_at": "2025-01-01T09:00:00+09:00", "expires_at": null, "sha256": "03b2b5e9cd5bab6f5e4a3d0e2f0ca5c52fb6fa43b2e7dd0fea2b4e2d1c9b4a5d", "source_uri": "https://docs.example/refunds", "requires_signature": true}

{"chunk_id": "c-2", "doc_id": "refunds", "version": "2", "tenant_id": "acme", "allowed_principals": ["group:support"], "status": "superseded", "effective_at": "2024-01-01T00:00:00Z", "expires_at": "2025-01-01T00:00:00.000001Z", "sha256": "f4d505bf7a1ad4696471db78fa54fc05752b48b95e3b2e1e244727a4039cc4c2", "superseded_by": "c-1", "text": "Caf\\u00e9 menu\\r\\n"}
"""  # noqa: E501


def run(store: MetadataStore, ids: Collection[str]) -> Mapping[str, ChunkRecord]:
    return asyncio.run(store.fetch(ids))


def load_fixture(tmp_path: Path, text: str = CHUNKS_JSONL) -> list[ChunkRecord]:
    path = tmp_path / "chunks.jsonl"
    path.write_text(text)
    return load_jsonl(path)


def test_loaded_records_round_trip(tmp_path: Path, sqlite_store: SqliteStore) -> None:
    records = load_fixture(tmp_path)
    assert sqlite_store.upsert(records) == 2
    fetched = run(sqlite_store, ["c-1", "c-2"])
    assert fetched == {r.chunk_id: r for r in records}
    first, second = fetched["c-1"], fetched["c-2"]
    assert first.effective_at == datetime(2025, 1, 1, 0, 0, tzinfo=UTC)
    assert first.effective_at.utcoffset() is not None
    assert first.expires_at is None
    assert first.text is None
    assert first.requires_signature is True
    assert first.allowed_principals == ("group:support", "user:ann")
    assert second.expires_at == datetime(2025, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
    assert second.status is Status.SUPERSEDED
    assert second.superseded_by == "c-1"
    assert second.text == "Caf\u00e9 menu\r\n"


def test_timestamps_are_stored_as_fixed_width_utc(
    sqlite_path: Path, sqlite_store: SqliteStore
) -> None:
    moment = datetime.fromisoformat("0999-03-04T05:06:07.5+01:00")
    sqlite_store.upsert([record("c-1", effective_at=moment)])
    with sqlite3.connect(sqlite_path) as raw:
        row = raw.execute(
            "SELECT effective_at, expires_at, allowed_principals, requires_signature FROM chunks"
        ).fetchone()
    assert row == ("0999-03-04T04:06:07.500000Z", None, '["group:support"]', 0)


def test_every_status_round_trips(sqlite_store: SqliteStore) -> None:
    records = [record(f"c-{status}", status=status) for status in Status]
    sqlite_store.upsert(records)
    assert run(sqlite_store, [r.chunk_id for r in records]) == {r.chunk_id: r for r in records}


def test_absent_ids_are_left_out(sqlite_store: SqliteStore) -> None:
    sqlite_store.upsert([record("c-1")])
    assert run(sqlite_store, ["c-1", "nope", "c-1"]) == {"c-1": record("c-1")}
    assert run(sqlite_store, ["nope"]) == {}
    assert run(sqlite_store, []) == {}


def test_fetch_is_one_query_per_900_ids(sqlite_store: SqliteStore) -> None:
    records = [record(f"c-{n}") for n in range(2000)]
    sqlite_store.upsert(records)
    statements: list[str] = []
    sqlite_store._reader.set_trace_callback(statements.append)
    ids = [r.chunk_id for r in records] + ["absent-1", "absent-2"]
    assert len(run(sqlite_store, ids)) == 2000
    selects = [s for s in statements if s.startswith("SELECT")]
    assert len(selects) == 3  # 2002 ids: 900 + 900 + 202
    statements.clear()
    assert len(run(sqlite_store, ids[:50])) == 50
    assert [s.split()[0] for s in statements] == ["SELECT"]


def test_upsert_replaces_existing_records(sqlite_store: SqliteStore) -> None:
    sqlite_store.upsert([record("c-1"), record("c-2")])
    sqlite_store.upsert([record("c-1", status=Status.REVOKED)])
    fetched = run(sqlite_store, ["c-1", "c-2"])
    assert fetched["c-1"].status is Status.REVOKED
    assert fetched["c-2"] == record("c-2")


def test_upsert_is_all_or_none(sqlite_store: SqliteStore) -> None:
    sqlite_store.upsert([record("c-1")])
    batch = [
        record("c-1", status=Status.REVOKED),
        record("c-2"),
        record("c-3", sha256="NOT-A-HASH"),  # violates the table's CHECK constraint
    ]
    with pytest.raises(ValueError, match="nothing was written"):
        sqlite_store.upsert(batch)
    assert run(sqlite_store, ["c-1", "c-2", "c-3"]) == {"c-1": record("c-1")}
    sqlite_store.upsert([record("c-2")])  # the writer is usable after the rollback
    assert set(run(sqlite_store, ["c-2"])) == {"c-2"}


def test_upsert_refuses_naive_timestamps(sqlite_store: SqliteStore) -> None:
    batch = [record("c-1"), record("c-2", expires_at=datetime(2026, 1, 1))]
    with pytest.raises(ValueError, match="no time zone"):
        sqlite_store.upsert(batch)
    assert run(sqlite_store, ["c-1", "c-2"]) == {}


def test_invalid_file_loads_nothing(tmp_path: Path, sqlite_store: SqliteStore) -> None:
    text = CHUNKS_JSONL.replace('"status": "approved"', '"status": "live"')
    with pytest.raises(RecordsInvalid):
        sqlite_store.upsert(load_fixture(tmp_path, text))
    assert run(sqlite_store, ["c-1", "c-2"]) == {}


def test_data_survives_reopening(sqlite_path: Path) -> None:
    first = new_sqlite_store(sqlite_path)
    first.upsert([record("c-1")])
    first.close()
    second = SqliteStore(sqlite_path)
    try:
        assert run(second, ["c-1"]) == {"c-1": record("c-1")}
    finally:
        second.close()
    with sqlite3.connect(sqlite_path) as raw:
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)


# The schema as version 2 builds created it: no chunks.payload_sha256.
_GLOB = (
    "'[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9]"
    ".[0-9][0-9][0-9][0-9][0-9][0-9]Z'"
)
VERSION_2_CHUNKS = f"""CREATE TABLE chunks (
    chunk_id TEXT NOT NULL PRIMARY KEY CHECK (typeof(chunk_id) = 'text' AND chunk_id <> ''),
    doc_id TEXT NOT NULL CHECK (typeof(doc_id) = 'text' AND trim(doc_id) <> ''),
    version TEXT NOT NULL CHECK (typeof(version) = 'text'),
    tenant_id TEXT NOT NULL CHECK (typeof(tenant_id) = 'text' AND trim(tenant_id) <> ''),
    allowed_principals TEXT NOT NULL CHECK (
        json_valid(allowed_principals)
        AND json_type(allowed_principals) = 'array'
        AND json_array_length(allowed_principals) > 0),
    status TEXT NOT NULL
        CHECK (status IN ('approved', 'draft', 'superseded', 'revoked', 'quarantined')),
    effective_at TEXT NOT NULL CHECK (effective_at GLOB {_GLOB}),
    expires_at TEXT CHECK (
        expires_at IS NULL OR (expires_at GLOB {_GLOB} AND expires_at > effective_at)),
    sha256 TEXT NOT NULL CHECK (length(sha256) = 64 AND sha256 NOT GLOB '*[^0-9a-f]*'),
    source_uri TEXT NOT NULL CHECK (typeof(source_uri) = 'text'),
    superseded_by TEXT CHECK (superseded_by IS NULL OR typeof(superseded_by) = 'text'),
    requires_signature INTEGER NOT NULL CHECK (requires_signature IN (0, 1)),
    text TEXT CHECK (text IS NULL OR typeof(text) = 'text')
)"""
VERSION_2_SIGNATURES = f"""CREATE TABLE electronic_signatures (
    id INTEGER PRIMARY KEY,
    doc_id TEXT NOT NULL CHECK (typeof(doc_id) = 'text' AND trim(doc_id) <> ''),
    version TEXT NOT NULL CHECK (typeof(version) = 'text'),
    signer TEXT NOT NULL CHECK (typeof(signer) = 'text' AND trim(signer) <> ''),
    meaning TEXT NOT NULL CHECK (typeof(meaning) = 'text' AND trim(meaning) <> ''),
    signed_at TEXT NOT NULL CHECK (signed_at GLOB {_GLOB}),
    is_valid INTEGER NOT NULL DEFAULT 1 CHECK (is_valid IN (0, 1))
)"""
OLD_ROW = (
    "INSERT INTO chunks VALUES ('c-1', 'doc', '1', 'acme', '[\"group:support\"]', 'approved',"
    " '2025-01-01T00:00:00.000000Z', NULL, ?, '', NULL, 0, 'old text')"
)


def old_file(path: Path, version: int) -> None:
    """A file as a version 1 or 2 build left it, holding chunk c-1."""
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        raw.execute("INSERT INTO schema_version VALUES (?)", (version,))
        raw.execute(VERSION_2_CHUNKS)
        if version == 2:
            raw.execute(VERSION_2_SIGNATURES)
        raw.execute(OLD_ROW, ("ab" * 32,))
    raw.close()


@pytest.mark.parametrize("version", [1, 2])
def test_older_files_are_upgraded_in_place(sqlite_path: Path, version: int) -> None:
    old_file(sqlite_path, version)
    store = SqliteStore(sqlite_path)
    # Records from before the upgrade vouch for no payload field.
    assert run(store, ["c-1"]) == {"c-1": record("c-1", text="old text")}
    store.upsert([record("c-2", payload_sha256="cd" * 32)])
    assert run(store, ["c-2"]) == {"c-2": record("c-2", payload_sha256="cd" * 32)}
    store.close()
    SqliteStore(sqlite_path).close()  # opening an upgraded file again changes nothing
    with sqlite3.connect(sqlite_path) as raw:
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [(3,)]
        assert raw.execute("SELECT count(*) FROM electronic_signatures").fetchone() == (0,)
        # The added column carries the same constraint as in a new file.
        with pytest.raises(sqlite3.IntegrityError):
            raw.execute("UPDATE chunks SET payload_sha256 = 'CD' WHERE chunk_id = 'c-1'")
    raw.close()


def test_payload_sha256_column_is_the_same_in_new_and_upgraded_files(
    tmp_path: Path, sqlite_path: Path
) -> None:
    old_file(sqlite_path, 2)
    SqliteStore(sqlite_path).close()
    migrate(tmp_path / "new.db")

    def columns(path: Path) -> list[tuple[object, ...]]:
        with sqlite3.connect(path) as raw:
            found = raw.execute("PRAGMA table_info(chunks)").fetchall()
        raw.close()
        return found

    assert columns(sqlite_path) == columns(tmp_path / "new.db")
    assert columns(sqlite_path)[-1][1:4] == ("payload_sha256", "TEXT", 0)


def test_unknown_schema_version_is_refused(sqlite_path: Path) -> None:
    migrate(sqlite_path)
    with sqlite3.connect(sqlite_path) as raw:
        raw.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(SchemaMismatch, match="schema version 99"):
        SqliteStore(sqlite_path)
    with pytest.raises(SchemaMismatch, match="schema version 99"):
        migrate(sqlite_path)


def test_unopenable_file_is_store_unavailable(tmp_path: Path) -> None:
    not_a_db = tmp_path / "notes.txt"
    not_a_db.write_text("this is not a database, just some text " * 100)
    with pytest.raises(StoreUnavailable, match="cannot open"):
        SqliteStore(not_a_db)
    with pytest.raises(StoreUnavailable, match=r"cannot create .* directory .*missing-dir does"):
        migrate(tmp_path / "missing-dir" / "meta.db")


def test_sqlite_errors_during_fetch_are_store_unavailable(
    sqlite_path: Path, sqlite_store: SqliteStore
) -> None:
    sqlite_store.upsert([record("c-1", text="secret chunk text")])
    with sqlite3.connect(sqlite_path) as raw:
        raw.execute("DROP TABLE chunks")
    with pytest.raises(StoreUnavailable) as caught:
        run(sqlite_store, ["c-1"])
    assert "secret" not in str(caught.value)


def test_fetch_after_close_is_store_unavailable(sqlite_path: Path) -> None:
    store = new_sqlite_store(sqlite_path)
    store.close()
    with pytest.raises(StoreUnavailable):
        run(store, ["c-1"])
    with pytest.raises(StoreUnavailable):
        store.upsert([record("c-1")])


def test_undecodable_row_makes_only_that_chunk_missing(
    sqlite_path: Path, sqlite_store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    sqlite_store.upsert([record("c-1"), record("c-2", text="secret chunk text")])
    with sqlite3.connect(sqlite_path) as raw:
        # Someone bypasses the CHECK constraints while editing by hand.
        raw.execute("PRAGMA ignore_check_constraints = ON")
        raw.execute("UPDATE chunks SET allowed_principals = '[1]' WHERE chunk_id = 'c-2'")
    with caplog.at_level(logging.WARNING, logger="sidecar.store.rows"):
        assert run(sqlite_store, ["c-1", "c-2"]) == {"c-1": record("c-1")}
    [message] = [r.getMessage() for r in caplog.records]
    assert "'c-2'" in message
    assert "allowed_principals" in message
    assert "secret" not in message


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("status", "'published'"),
        ("effective_at", "'yesterday'"),
        ("expires_at", "'2026-01-01T00:00:00'"),
        ("requires_signature", "2"),
        ("allowed_principals", "'not json'"),
        ("doc_id", "X'6869'"),  # a BLOB, not text
        ("payload_sha256", "X'6869'"),
    ],
)
def test_each_bad_column_is_detected(
    sqlite_path: Path, sqlite_store: SqliteStore, column: str, value: str
) -> None:
    sqlite_store.upsert([record("c-1")])
    with sqlite3.connect(sqlite_path) as raw:
        raw.execute("PRAGMA ignore_check_constraints = ON")
        raw.execute(f"UPDATE chunks SET {column} = {value}")
    assert run(sqlite_store, ["c-1"]) == {}


def test_upsert_from_another_thread_is_seen_by_fetch(sqlite_store: SqliteStore) -> None:
    worker = threading.Thread(target=sqlite_store.upsert, args=([record("c-1")],))
    worker.start()
    worker.join()
    assert run(sqlite_store, ["c-1"]) == {"c-1": record("c-1")}


def test_open_store_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    migrate("relative.db")
    store = open_store("sqlite:///relative.db")
    try:
        store.upsert([record("c-1")])
    finally:
        store.close()
    assert (tmp_path / "relative.db").is_file()


def test_open_store_absolute_path(tmp_path: Path) -> None:
    path = tmp_path / "absolute.db"
    assert str(path).startswith("/")
    migrate(path)
    store = open_store(f"sqlite:///{path}")  # three slashes + "/tmp/...": four in all
    try:
        assert isinstance(store, SqliteStore)
    finally:
        store.close()
    assert path.is_file()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://gate:s3cret/x@db/gate", "password in PostgreSQL URL .* is ambiguous"),
        ("mysql://db/gate", "unsupported metadata store URL scheme 'mysql'"),
        ("/var/lib/gate/meta.db", "no scheme"),
        ("sqlite://meta.db", "three slashes"),
        ("sqlite:///", "names no file"),
        ("sqlite:///:memory:", "in-memory"),
        ("sqlite:///meta.db?mode=ro", "query parameters"),
    ],
)
def test_open_store_rejects(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        open_store(url)
    assert "s3cret" not in str(caught.value)


# --- only `store migrate` creates a store --------------------------------------------------


def test_a_path_that_does_not_exist_is_refused_not_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreNotCreated) as caught:
        open_store("sqlite:///gaet.db")
    assert str(caught.value) == (
        f"SQLite metadata store gaet.db ({tmp_path / 'gaet.db'}) does not exist; "
        "create it with: retrieval-gate store migrate --store sqlite:///gaet.db"
    )
    missing = tmp_path / "my stores" / "gate.db"
    with pytest.raises(StoreNotCreated) as caught:
        SqliteStore(missing)
    # Absolute: four slashes; quoted for the shell where the path needs it.
    assert str(caught.value) == (
        f"SQLite metadata store {missing} does not exist; "
        f"create it with: retrieval-gate store migrate --store 'sqlite:///{missing}'"
    )
    assert not (tmp_path / "gaet.db").exists() and not missing.parent.exists()


def test_a_file_without_the_schema_is_refused_and_left_alone(sqlite_path: Path) -> None:
    with sqlite3.connect(sqlite_path) as raw:
        raw.execute("CREATE TABLE notes (body TEXT)")
    raw.close()
    with pytest.raises(SchemaMismatch, match="has no retrieval-gate schema; create it with: "):
        SqliteStore(sqlite_path)
    with sqlite3.connect(sqlite_path) as raw:
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
        assert tables == {"notes"}
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    raw.close()


def test_migrate_creates_then_reports_and_upgrades(tmp_path: Path, sqlite_path: Path) -> None:
    assert migrate(sqlite_path) is None  # created
    assert migrate(sqlite_path) == SCHEMA_VERSION  # already there: nothing to do
    old = tmp_path / "old.db"
    old_file(old, 2)
    assert migrate(old) == 2
    assert migrate(old) == SCHEMA_VERSION


def test_opening_a_store_writes_nothing_running_gates_would_see(sqlite_path: Path) -> None:
    migrate(sqlite_path)
    watcher = new_sqlite_store(sqlite_path)
    try:
        before = watcher.data_version()
        SqliteStore(sqlite_path).close()  # e.g. `store show` in another process
        assert watcher.data_version() == before
        writer = SqliteStore(sqlite_path)
        writer.upsert([record("c-1")])
        writer.close()
        assert watcher.data_version() != before
    finally:
        watcher.close()
