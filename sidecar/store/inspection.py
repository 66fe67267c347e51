"""What a metadata store holds, read without changing it: its kind, schema version and
record count.

For ``retrieval-gate check`` and the start-up summary. Opening a store for
serving may change it (SQLite upgrades an older schema in place); inspecting
never does: nothing is written to a SQLite file, and one that is not there is
reported as opening it would (only ``store migrate`` creates one).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg.rows import TupleRow

from sidecar.postgres.dsn import parse_postgres_url
from sidecar.postgres.errors import describe_error
from sidecar.store.open import is_postgres_url
from sidecar.store.postgres import connect_options
from sidecar.store.schema import check_schema, latest_version
from sidecar.store.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from sidecar.store.sqlite import URL_PREFIX as SQLITE_PREFIX
from sidecar.store.sqlite import require_file
from sidecar.store.store import SchemaMismatch, StoreUnavailable

# Counting the records of a large PostgreSQL table reads all of it: bounded.
COUNT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class StoreSummary:
    """What a store is and holds; ``where`` is printable (a path, or a redacted URL)."""

    kind: str
    where: str
    schema_version: int
    records: int | None
    """None when counting took longer than COUNT_TIMEOUT_S."""
    note: str = ""
    """What holds for the schema beyond its version (e.g. upgraded when opened)."""


def inspect_store(url: str, *, pgbouncer: bool = False) -> StoreSummary:
    """The summary of the store at ``url``, read-only.

    Raises ValueError for a URL that names no store, SchemaMismatch for a
    schema this build cannot use (the message says what to run) and
    StoreUnavailable when the store cannot be reached or read (StoreNotCreated
    for a SQLite file that does not exist).
    """
    if is_postgres_url(url):
        return _inspect_postgres(url, pgbouncer=pgbouncer)
    if url[: len(SQLITE_PREFIX)].lower() != SQLITE_PREFIX or len(url) == len(SQLITE_PREFIX):
        raise ValueError("not a sqlite:///path or postgresql:// URL")
    return _inspect_sqlite(Path(url[len(SQLITE_PREFIX) :]))


def _inspect_sqlite(path: Path) -> StoreSummary:
    require_file(path)
    if not path.is_file():
        raise StoreUnavailable(f"SQLite metadata store {str(path)!r} is not a file")
    # mode=rw: never create the file (mode=ro cannot read a WAL file without its -shm).
    target = f"file:{quote(str(path.resolve()))}?mode=rw"
    try:
        connection = sqlite3.connect(target, uri=True, timeout=1.0)
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot open SQLite metadata store {str(path)!r}: {exc}") from exc
    try:
        versions = [row[0] for row in connection.execute("SELECT version FROM schema_version")]
        records = connection.execute("SELECT count(*) FROM chunks").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        if "no such table" not in str(exc) and "not a database" not in str(exc):
            raise StoreUnavailable(
                f"cannot read SQLite metadata store {str(path)!r}: {exc}"
            ) from exc
        raise SchemaMismatch(
            f"{str(path)!r} is not a retrieval-gate SQLite store ({exc}); name the right file, "
            "or create a store with: retrieval-gate store migrate --store sqlite:///NEW.db"
        ) from None
    finally:
        connection.close()
    if len(versions) != 1 or not isinstance(versions[0], int):
        raise SchemaMismatch(f"SQLite metadata store {str(path)!r} has no single schema version")
    version = versions[0]
    if version > SQLITE_SCHEMA_VERSION:
        raise SchemaMismatch(
            f"SQLite metadata store {str(path)!r} has schema version {version}, newer than the "
            f"version {SQLITE_SCHEMA_VERSION} this build knows; run a newer retrieval-gate"
        )
    upgraded = f"upgraded to {SQLITE_SCHEMA_VERSION} when the gate opens it"
    note = "" if version == SQLITE_SCHEMA_VERSION else upgraded
    return StoreSummary("sqlite", str(path), version, int(records), note)


def _inspect_postgres(url: str, *, pgbouncer: bool) -> StoreSummary:
    parsed = parse_postgres_url(url)
    try:
        with psycopg.connect(
            parsed.url, autocommit=True, **connect_options(parsed, pgbouncer=pgbouncer)
        ) as connection:
            check_schema(connection, parsed.redacted)
            records = _count(connection)
    except psycopg.Error as exc:
        raise StoreUnavailable(
            parsed.scrub(f"PostgreSQL metadata store {parsed}: {describe_error(exc)}")
        ) from None
    return StoreSummary("postgresql", parsed.redacted, latest_version(), records)


def _count(connection: psycopg.Connection[TupleRow]) -> int | None:
    """The number of records, or None when counting takes longer than COUNT_TIMEOUT_S."""
    try:
        with connection.transaction():
            # SET LOCAL: transaction state, which PgBouncer's transaction pooling keeps.
            connection.execute(f"SET LOCAL statement_timeout = {int(COUNT_TIMEOUT_S * 1000)}")
            row = connection.execute("SELECT count(*) FROM chunks").fetchone()
    except psycopg.errors.QueryCanceled:
        return None
    assert row is not None and isinstance(row[0], int)  # an aggregate always returns one row
    return row[0]
