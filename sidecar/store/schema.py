"""Versioned schema migrations for the PostgreSQL metadata store.

Migrations are the files ``migrations/NNNN_name.sql`` shipped with the package,
numbered from 1 without gaps. ``apply_migrations`` runs the pending ones in
order, each in its own transaction together with its row in
``schema_migrations`` (version, name, applied_at), so a failed migration leaves
the schema at the previous version. Running it again applies nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files

import psycopg
from psycopg.rows import TupleRow

from sidecar.postgres.errors import describe_error
from sidecar.store.store import SchemaMismatch, StoreUnavailable

# Serialises concurrent `store migrate` runs (an arbitrary constant: "rgmigr8").
_LOCK_KEY = 0x7267_6D69_6772_38
_FILE_NAME = re.compile(r"(?P<version>[0-9]{4})_(?P<name>[a-z0-9_]+)\.sql")
_CREATE_TABLE = """
    CREATE TABLE IF NOT EXISTS schema_migrations (
        version integer PRIMARY KEY,
        name text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
    )
"""
_MIGRATE_COMMAND = "retrieval-gate store migrate --store URL"


class MigrationFailed(StoreUnavailable):
    """A migration's SQL failed; its transaction was rolled back."""


@dataclass(frozen=True)
class Migration:
    """One schema version: the SQL that reaches it from the version before."""

    version: int
    name: str
    sql: str = field(repr=False)


@cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped with this build, in version order."""
    found = []
    for entry in (files("sidecar.store") / "migrations").iterdir():
        match = _FILE_NAME.fullmatch(entry.name)
        if match is not None:
            sql = entry.read_text(encoding="utf-8")
            found.append(Migration(int(match["version"]), match["name"], sql))
    found.sort(key=lambda migration: migration.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError("packaged schema migrations are not numbered 1, 2, 3, ...")
    return tuple(found)


def latest_version() -> int:
    """The schema version this build needs."""
    return migrations()[-1].version


def current_version(connection: psycopg.Connection[TupleRow]) -> int | None:
    """The highest applied version; None when the database has no ``schema_migrations``."""
    row = connection.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return None
    row = connection.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    assert row is not None and isinstance(row[0], int)  # an aggregate always returns one row
    return row[0]


def check_schema(connection: psycopg.Connection[TupleRow], where: str) -> None:
    """Raise SchemaMismatch unless the schema is at exactly this build's version.

    ``where`` names the database in the message (a redacted URL).
    """
    version = current_version(connection)
    latest = latest_version()
    if version is None or version == 0:
        raise SchemaMismatch(
            f"PostgreSQL metadata store {where} has no retrieval-gate schema; "
            f"create it with: {_MIGRATE_COMMAND}"
        )
    if version < latest:
        raise SchemaMismatch(
            f"PostgreSQL metadata store {where} has schema version {version}, this build "
            f"needs version {latest}; upgrade it with: {_MIGRATE_COMMAND}"
        )
    if version > latest:
        raise SchemaMismatch(
            f"PostgreSQL metadata store {where} has schema version {version}, newer than "
            f"the version {latest} this build knows; run a newer retrieval-gate"
        )


def apply_migrations(connection: psycopg.Connection[TupleRow], where: str) -> list[Migration]:
    """Apply the pending migrations, each in its own transaction; return those applied.

    ``where`` names the database in messages (a redacted URL).

    Raises SchemaMismatch if the database is at a newer version than this
    build knows, MigrationFailed if a migration fails (that one is rolled
    back; those before it stay applied), and psycopg.Error if the connection
    fails.
    """
    applied: list[Migration] = []
    for migration in migrations():
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            connection.execute(_CREATE_TABLE)
            version = current_version(connection) or 0
            if version > latest_version():
                raise SchemaMismatch(
                    f"PostgreSQL metadata store {where} has schema version {version}, newer "
                    f"than the version {latest_version()} this build knows; run a newer "
                    "retrieval-gate"
                )
            if migration.version <= version:
                continue
            try:
                # The text comes from the package's own files, never from input.
                connection.execute(migration.sql.encode())
            except psycopg.DatabaseError as exc:
                raise MigrationFailed(
                    f"{where}: migration {migration.version:04d} ({migration.name}) failed and was "
                    f"rolled back: {describe_error(exc)}"
                ) from exc
            connection.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
        applied.append(migration)
    return applied
