"""SQLite metadata store: the embedded default backend.

One file holds table ``chunks`` (one column per record contract field, primary
key ``chunk_id``), table ``electronic_signatures`` (doc_id, version, signer,
meaning, signed_at, is_valid) and table ``schema_version`` (one row). Encodings,
which scripts reading the file may rely on:

- ``allowed_principals``: JSON array of strings, as text;
- ``effective_at``/``expires_at``/``signed_at``: RFC 3339 in UTC with exactly
  six fractional digits, ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (fixed width, so text
  order is time order); ``expires_at`` NULL means open-ended;
- ``status``: the lower-case status name; ``requires_signature`` and
  ``is_valid``: 0 or 1.

``fetch`` and ``get`` set ``signature_valid`` when a signature with
``is_valid = 1`` exists for the record's doc_id and version.

Only ``migrate`` (``retrieval-gate store migrate``) creates a file: opening a
path that does not exist, or a file without this schema, is refused
(StoreNotCreated, SchemaMismatch), so that a mistyped path cannot serve an
empty store that rejects everything. Older files are upgraded in place when
opened: version 1 lacks ``electronic_signatures``, version 2 the
``payload_sha256`` column (added as NULL: those records vouch for no payload
field).

Running gates learn of changes made by any process through ``data_version``
(``sidecar.store.change_poll``).

CHECK constraints guard these forms against hand edits. A row that still cannot
be decoded is logged and counts as absent (see ``rows.py``).
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import threading
from collections.abc import Collection, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import orjson

from sidecar.core.chunk_record import CONTRACT_FIELDS, ChunkRecord, Status
from sidecar.store.lifecycle import check_no_reinstatement, check_status_change, loosening_ids
from sidecar.store.preview import preview_load
from sidecar.store.rows import RowCodec
from sidecar.store.store import (
    LoadPreview,
    SchemaMismatch,
    StoreEndpoint,
    StoreNotCreated,
    StoreUnavailable,
)
from sidecar.store.versions import check_approval, check_no_version_overlap, touched_documents

SCHEMA_VERSION = 3
# SQLAlchemy's spelling: the file path follows, relative unless it starts with "/".
URL_PREFIX = "sqlite:///"

_COLUMNS = CONTRACT_FIELDS
_TIMESTAMP_GLOB = (
    "'[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9]"
    ".[0-9][0-9][0-9][0-9][0-9][0-9]Z'"
)
# Shared by CREATE TABLE and the version 2 -> 3 upgrade, so both files end up alike.
_PAYLOAD_SHA256_COLUMN = """payload_sha256 TEXT CHECK (
            payload_sha256 IS NULL
            OR (typeof(payload_sha256) = 'text' AND length(payload_sha256) = 64
                AND payload_sha256 NOT GLOB '*[^0-9a-f]*'))"""
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    f"""CREATE TABLE IF NOT EXISTS chunks (
        chunk_id TEXT NOT NULL PRIMARY KEY
            CHECK (typeof(chunk_id) = 'text' AND chunk_id <> ''),
        doc_id TEXT NOT NULL CHECK (typeof(doc_id) = 'text' AND trim(doc_id) <> ''),
        version TEXT NOT NULL CHECK (typeof(version) = 'text'),
        tenant_id TEXT NOT NULL CHECK (typeof(tenant_id) = 'text' AND trim(tenant_id) <> ''),
        allowed_principals TEXT NOT NULL CHECK (
            json_valid(allowed_principals)
            AND json_type(allowed_principals) = 'array'
            AND json_array_length(allowed_principals) > 0),
        status TEXT NOT NULL
            CHECK (status IN ('approved', 'draft', 'superseded', 'revoked', 'quarantined')),
        effective_at TEXT NOT NULL CHECK (effective_at GLOB {_TIMESTAMP_GLOB}),
        expires_at TEXT CHECK (
            expires_at IS NULL
            OR (expires_at GLOB {_TIMESTAMP_GLOB} AND expires_at > effective_at)),
        sha256 TEXT NOT NULL CHECK (length(sha256) = 64 AND sha256 NOT GLOB '*[^0-9a-f]*'),
        source_uri TEXT NOT NULL CHECK (typeof(source_uri) = 'text'),
        superseded_by TEXT CHECK (superseded_by IS NULL OR typeof(superseded_by) = 'text'),
        requires_signature INTEGER NOT NULL CHECK (requires_signature IN (0, 1)),
        text TEXT CHECK (text IS NULL OR typeof(text) = 'text'),
        {_PAYLOAD_SHA256_COLUMN}
    )""",
    f"""CREATE TABLE IF NOT EXISTS electronic_signatures (
        id INTEGER PRIMARY KEY,
        doc_id TEXT NOT NULL CHECK (typeof(doc_id) = 'text' AND trim(doc_id) <> ''),
        version TEXT NOT NULL CHECK (typeof(version) = 'text'),
        signer TEXT NOT NULL CHECK (typeof(signer) = 'text' AND trim(signer) <> ''),
        meaning TEXT NOT NULL CHECK (typeof(meaning) = 'text' AND trim(meaning) <> ''),
        signed_at TEXT NOT NULL CHECK (signed_at GLOB {_TIMESTAMP_GLOB}),
        is_valid INTEGER NOT NULL DEFAULT 1 CHECK (is_valid IN (0, 1))
    )""",
    """CREATE INDEX IF NOT EXISTS electronic_signatures_document
        ON electronic_signatures (doc_id, version) WHERE is_valid = 1""",
    # A write reads the approved versions of each document it touches (versions.py).
    "CREATE INDEX IF NOT EXISTS chunks_doc_id_version ON chunks (doc_id, version)",
)
# Schema versions this build opens. Version 1 lacks electronic_signatures, which
# the statements above create; versions 1 and 2 lack chunks.payload_sha256,
# which _ensure_schema adds. Upgrading is then recording the version.
_UPGRADABLE_VERSIONS = frozenset({1, 2, SCHEMA_VERSION})
_ADD_PAYLOAD_SHA256 = f"ALTER TABLE chunks ADD COLUMN {_PAYLOAD_SHA256_COLUMN}"
_COLUMN_LIST = ", ".join(_COLUMNS)
_SELECT = (
    "SELECT "  # noqa: S608 - column names come from the record contract, never from input
    + ", ".join(f"c.{column}" for column in _COLUMNS)
    + ", EXISTS (SELECT 1 FROM electronic_signatures AS s"
    " WHERE s.doc_id = c.doc_id AND s.version = c.version AND s.is_valid = 1)"
    " FROM chunks AS c"
)
_GET = _SELECT + " WHERE c.chunk_id = ?"
# The approved versions of documents, for the overlap check: no text, no signature
# lookup (neither takes part), in the row form RowCodec decodes.
_APPROVED_OF_DOCUMENTS = (
    "SELECT "  # noqa: S608 - column names come from the record contract, never from input
    + ", ".join("NULL" if column == "text" else column for column in _COLUMNS)
    + ", 0 FROM chunks WHERE status = 'approved' AND doc_id IN "
)
_SET_STATUS = "UPDATE chunks SET status = ?, superseded_by = ? WHERE chunk_id = ?"
_UPDATES = ", ".join(f"{column} = excluded.{column}" for column in _COLUMNS[1:])
# Column names come from ChunkRecord's fields, never from input; values are bound.
_PLACEHOLDERS = ", ".join("?" * len(_COLUMNS))
_UPSERT = (
    f"INSERT INTO chunks ({_COLUMN_LIST}) VALUES ({_PLACEHOLDERS}) "  # noqa: S608
    f"ON CONFLICT (chunk_id) DO UPDATE SET {_UPDATES}"
)
# SQLite builds before 3.32 allow at most 999 bound parameters per statement.
_MAX_IDS_PER_QUERY = 900
# fetch runs on the event loop; if the file is locked (rare in WAL mode), rather
# fail closed for one response than stall every request in the process.
_READ_BUSY_TIMEOUT_S = 0.1
_WRITE_BUSY_TIMEOUT_S = 5.0


class SqliteStore:
    """MetadataStore backed by one SQLite file that ``migrate`` created.

    Raises StoreNotCreated when there is no file at ``path``, SchemaMismatch
    when the file has no retrieval-gate schema or one of a version this code
    does not know, and StoreUnavailable when it cannot be opened.
    """

    endpoint = StoreEndpoint("sqlite")  # in process: no server to name

    def __init__(self, path: str | os.PathLike[str]) -> None:
        # Two connections: upsert (possibly a bulk load in a worker thread) holds
        # the writer while fetch keeps reading a consistent snapshot through the
        # reader, which WAL mode allows. Each may be used from any thread, so each
        # has a lock; uncontended, a lock costs well under a microsecond.
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        try:
            self._writer, self._reader = _open(path)
        except sqlite3.Error as exc:
            require_file(path)
            where = os.fspath(path)
            raise StoreUnavailable(f"cannot open SQLite metadata store {where!r}: {exc}") from exc

    async def fetch(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
        """Look up records by chunk id; absent ids are left out of the result.

        Raises StoreUnavailable on any SQLite error.
        """
        ids = list(dict.fromkeys(chunk_ids))
        if not ids:
            return {}
        # Synchronous on purpose: a primary-key lookup in a local file takes
        # microseconds, less than handing the work to a thread and back would
        # cost, and the event loop thread is normally the only user of the reader.
        try:
            with self._read_lock:
                selected = _select(self._reader, ids)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite metadata query failed: {exc}") from exc
        return _ROWS.decode_rows(selected, asked=len(ids))

    def upsert(self, records: Iterable[ChunkRecord], *, reinstate: bool = False) -> int:
        """Insert or replace records in one transaction (all or none); return the count.

        Raises ValueError when a record cannot be stored (naive datetime, or a
        value the table's constraints reject) and StoreUnavailable on any other
        SQLite error; in both cases nothing is written.
        """
        batch = list(records)
        # Encode first, so that a bad record fails before the transaction starts.
        encoded = [_ROWS.encode(record) for record in batch]
        try:
            with self._write_lock:
                _write(self._writer, batch, encoded, reinstate=reinstate)
        except sqlite3.IntegrityError as exc:
            raise ValueError(
                f"a record violates the chunks table constraints ({exc}); nothing was written"
            ) from exc
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite metadata upsert failed: {exc}") from exc
        return len(encoded)

    def preview(self, records: Iterable[ChunkRecord], *, reinstate: bool = False) -> LoadPreview:
        """What ``upsert`` would do, read in one read transaction; see
        ``MetadataStore.preview``."""
        batch = list(records)
        try:
            with self._read_lock:
                self._reader.execute("BEGIN")
                try:
                    stored = _ROWS.decode_rows(_select(self._reader, [r.chunk_id for r in batch]))
                    approved = _approved_of_documents(self._reader, touched_documents(batch))
                finally:
                    self._reader.rollback()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite metadata query failed: {exc}") from exc
        return preview_load(batch, stored=stored, approved=approved, reinstate=reinstate)

    def data_version(self) -> int:
        """A number that changes whenever another connection (this store's own writer,
        another process) commits a change to the file (``PRAGMA data_version``).

        Raises StoreUnavailable on any SQLite error.
        """
        try:
            with self._read_lock:
                row = self._reader.execute("PRAGMA data_version").fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite data_version failed: {exc}") from exc
        version: int = row[0]
        return version

    def get(self, chunk_id: str) -> ChunkRecord | None:
        """The record of one chunk (text included), or None.

        A row that cannot be decoded counts as absent (and is logged). Raises
        StoreUnavailable on any SQLite error.
        """
        try:
            with self._read_lock:
                row = self._reader.execute(_GET, (chunk_id,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite metadata query failed: {exc}") from exc
        return None if row is None else _ROWS.decode_or_log(row)

    def set_status(
        self, chunk_id: str, status: Status, superseded_by: str | None = None
    ) -> ChunkRecord:
        """Set status and successor in one write transaction; see ``MetadataStore.set_status``."""
        try:
            with self._write_lock:
                row = _change_status(self._writer, chunk_id, Status(status), superseded_by)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite metadata status change failed: {exc}") from exc
        record = _ROWS.decode_or_log(row)
        if record is None:
            raise StoreUnavailable(f"metadata row for chunk {chunk_id!r} cannot be decoded")
        return record

    def close(self) -> None:
        """Close both connections; later calls raise StoreUnavailable."""
        with self._write_lock, self._read_lock:
            self._reader.close()
            self._writer.close()

    async def aclose(self) -> None:
        """Same as ``close``: nothing here belongs to an event loop."""
        self.close()


def migrate(path: str | os.PathLike[str]) -> int | None:
    """Create the SQLite store at ``path`` (its directory must exist), or bring an
    existing file's schema to this build's version; return the version the file had
    (None: it was created, or had no schema).

    Raises SchemaMismatch for a schema newer than this build, StoreUnavailable
    when the file cannot be opened or written.
    """
    try:
        connection = _connect(path, _WRITE_BUSY_TIMEOUT_S, create=True)
    except sqlite3.Error as exc:
        where = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(where))
        reason = exc if os.path.isdir(directory) else f"directory {directory} does not exist"
        raise StoreUnavailable(f"cannot create SQLite metadata store {where!r}: {reason}") from exc
    try:
        return _ensure_schema(connection, path, create=True)
    except sqlite3.Error as exc:
        where = os.fspath(path)
        raise StoreUnavailable(f"cannot migrate SQLite metadata store {where!r}: {exc}") from exc
    finally:
        connection.close()


def _open(path: str | os.PathLike[str]) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    opened: list[sqlite3.Connection] = []
    try:
        writer = _connect(path, _WRITE_BUSY_TIMEOUT_S)
        opened.append(writer)
        _ensure_schema(writer, path, create=False)
        reader = _connect(path, _READ_BUSY_TIMEOUT_S)
        opened.append(reader)
        reader.execute("PRAGMA query_only = ON")
    except BaseException:
        for connection in opened:
            connection.close()
        raise
    return writer, reader


def _connect(
    path: str | os.PathLike[str], busy_timeout_s: float, *, create: bool = False
) -> sqlite3.Connection:
    # Opened by URI so that a missing file is an error rather than created
    # (mode=rw); the path is percent-encoded, so any file name works.
    uri = Path(path).absolute().as_uri() + ("?mode=rwc" if create else "?mode=rw")
    # isolation_level=None: no implicit transactions; every transaction is
    # explicit, so a read never holds a snapshot open between fetches.
    return sqlite3.connect(
        uri, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False, uri=True
    )


def _ensure_schema(
    connection: sqlite3.Connection, path: str | os.PathLike[str], *, create: bool
) -> int | None:
    """Check (and, if older, upgrade) the file's schema; with ``create``, create a
    missing one. The version found before, None if there was no schema."""
    if not create and not _has_schema(connection):
        # Checked before anything is written: a file that is not ours stays as it is.
        raise SchemaMismatch(
            f"SQLite metadata store {_where(path)} has no retrieval-gate schema; "
            f"create it with: {_migrate_command(path)}"
        )
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("BEGIN IMMEDIATE")
    try:
        # Each statement is IF NOT EXISTS: on a file at this version none writes,
        # so opening the store is no change that running gates would see.
        for statement in _SCHEMA:
            connection.execute(statement)
        versions = connection.execute("SELECT version FROM schema_version").fetchall()
        found: int | None = None
        if not versions:
            connection.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        elif len(versions) == 1 and versions[0][0] in _UPGRADABLE_VERSIONS:
            found = versions[0][0]
            columns = {row[1] for row in connection.execute("PRAGMA table_info(chunks)")}
            if "payload_sha256" not in columns:
                connection.execute(_ADD_PAYLOAD_SHA256)
            if found != SCHEMA_VERSION:
                connection.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        else:
            raise SchemaMismatch(
                f"SQLite metadata store {_where(path)} has schema version "
                f"{', '.join(str(version) for (version,) in versions)}; "
                f"this build supports only version {SCHEMA_VERSION}"
            )
        connection.execute("COMMIT")
    except BaseException:
        connection.rollback()
        raise
    return found


def _has_schema(connection: sqlite3.Connection) -> bool:
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    return connection.execute(query).fetchone() is not None


def _where(path: str | os.PathLike[str]) -> str:
    """The path as given, and where that is when it is relative."""
    given = os.fspath(path)
    if os.path.isabs(given):
        return given
    return f"{given} ({os.path.abspath(given)})"


def _migrate_command(path: str | os.PathLike[str]) -> str:
    return f"retrieval-gate store migrate --store {shlex.quote(URL_PREFIX + os.fspath(path))}"


def require_file(path: str | os.PathLike[str]) -> None:
    """Raise StoreNotCreated, saying how to create it, when there is no file at ``path``."""
    if not os.path.exists(path):
        raise StoreNotCreated(
            f"SQLite metadata store {_where(path)} does not exist; "
            f"create it with: {_migrate_command(path)}"
        )


def _select(connection: sqlite3.Connection, ids: list[str]) -> list[tuple[object, ...]]:
    batches = [
        ids[start : start + _MAX_IDS_PER_QUERY] for start in range(0, len(ids), _MAX_IDS_PER_QUERY)
    ]
    if len(batches) == 1:
        return connection.execute(_select_sql(len(ids)), ids).fetchall()
    if connection.in_transaction:  # the caller's snapshot
        return _select_batches(connection, batches)
    # One read transaction, so that every batch sees the same snapshot.
    connection.execute("BEGIN")
    try:
        return _select_batches(connection, batches)
    finally:
        connection.rollback()


def _select_batches(
    connection: sqlite3.Connection, batches: list[list[str]]
) -> list[tuple[object, ...]]:
    rows = []
    for batch in batches:
        rows += connection.execute(_select_sql(len(batch)), batch).fetchall()
    return rows


def _select_sql(count: int) -> str:
    placeholders = ", ".join("?" * count)
    # Only placeholders are interpolated; the ids are bound parameters.
    return f"{_SELECT} WHERE c.chunk_id IN ({placeholders})"


def _change_status(
    connection: sqlite3.Connection, chunk_id: str, status: Status, superseded_by: str | None
) -> tuple[object, ...]:
    # BEGIN IMMEDIATE takes the write lock first: nobody changes either row
    # between the check and the update.
    connection.execute("BEGIN IMMEDIATE")
    try:
        current = connection.execute(_GET, (chunk_id,)).fetchone()
        successor = None
        if superseded_by is not None:
            successor = connection.execute(_GET, (superseded_by,)).fetchone()
        record = None if current is None else _ROWS.decode_or_log(current)
        check_status_change(
            chunk_id,
            status,
            superseded_by,
            current=record,
            successor=None if successor is None else _ROWS.decode_or_log(successor),
        )
        if status is Status.APPROVED and record is not None:
            check_approval(record, _approved_of_documents(connection, [record.doc_id]))
        connection.execute(_SET_STATUS, (status.value, superseded_by, chunk_id))
        row: tuple[object, ...] = connection.execute(_GET, (chunk_id,)).fetchone()
        connection.execute("COMMIT")
    except BaseException:
        connection.rollback()
        raise
    return row


def _write(
    connection: sqlite3.Connection,
    batch: list[ChunkRecord],
    rows: list[tuple[object, ...]],
    *,
    reinstate: bool,
) -> None:
    # BEGIN IMMEDIATE takes the write lock first: what the checks read cannot
    # change (no revocation, no other version loaded) before the rows are written.
    connection.execute("BEGIN IMMEDIATE")
    try:
        if not reinstate:
            # The last record of an id wins, as if they were written one by one.
            loaded = {record.chunk_id: record.status for record in batch}
            check_no_reinstatement(loaded, _stored_statuses(connection, loosening_ids(loaded)))
        check_no_version_overlap(
            batch, _approved_of_documents(connection, touched_documents(batch))
        )
        connection.executemany(_UPSERT, rows)
        connection.execute("COMMIT")
    except BaseException:
        connection.rollback()
        raise


def _approved_of_documents(connection: sqlite3.Connection, doc_ids: list[str]) -> list[ChunkRecord]:
    """The stored approved records of these documents, without their text."""
    rows = []
    for start in range(0, len(doc_ids), _MAX_IDS_PER_QUERY):
        part = doc_ids[start : start + _MAX_IDS_PER_QUERY]
        marks = ", ".join("?" * len(part))
        query = f"{_APPROVED_OF_DOCUMENTS}({marks}) ORDER BY chunk_id"
        rows += connection.execute(query, part).fetchall()
    return list(_ROWS.decode_rows(rows).values())


def _stored_statuses(connection: sqlite3.Connection, chunk_ids: list[str]) -> dict[str, Status]:
    found: dict[str, Status] = {}
    # SQLite bounds the parameters of one statement; 500 stays well inside.
    for start in range(0, len(chunk_ids), 500):
        part = chunk_ids[start : start + 500]
        marks = ",".join("?" * len(part))
        query = f"SELECT chunk_id, status FROM chunks WHERE chunk_id IN ({marks})"  # noqa: S608
        found.update((row[0], Status(row[1])) for row in connection.execute(query, part))
    return found


class _SqliteRows(RowCodec):
    """Principals as a JSON array, timestamps as fixed-width RFC 3339 text in UTC."""

    def principals_out(self, principals: tuple[str, ...]) -> object:
        return orjson.dumps(list(principals)).decode()

    def timestamp_out(self, moment: datetime) -> object:
        # Aware: RowCodec.encode refuses naive timestamps first.
        return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"

    def principals_in(self, stored: object) -> object:
        if not isinstance(stored, str):
            raise TypeError("allowed_principals is not text")
        return orjson.loads(stored)

    def timestamp_in(self, stored: object) -> object:
        if not isinstance(stored, str):
            raise TypeError("timestamp is not text")
        return datetime.fromisoformat(stored)


_ROWS = _SqliteRows()
