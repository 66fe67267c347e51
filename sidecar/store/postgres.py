"""PostgreSQL metadata store: the production backend, shared by many sidecars.

Table ``chunks`` has one column per record field (``allowed_principals`` as
``text[]``, timestamps as ``timestamptz``, ``requires_signature`` as
``boolean``) and CHECK constraints that mirror the record contract; table
``electronic_signatures`` holds signatures per document version. Both are
created by the versioned migrations in ``schema.py``; a store refuses to open
a database whose schema is not at this build's version.

``fetch`` (the sidecar's hot path) runs on an asyncio connection pool and asks
for all ids of a response in one statement, ``signature_valid`` included. The
synchronous operations (``upsert``, ``get``, ``set_status``; the CLI's) each
use a short-lived connection of their own.

Every statement is a transaction of its own or runs inside an explicit one,
and the only session state is the time zone (a parameter PgBouncer carries
over to whichever server connection it assigns), so the store works through
PgBouncer in transaction pooling mode; ``pgbouncer=True`` turns off psycopg's
server-side prepared statements, which such a pool would hand to the wrong
server connection. LISTEN does not survive transaction pooling:
``listen_url`` names where the change listener connects instead.

After an outage the pool reconnects on demand rather than on psycopg_pool's
schedule (attempts 1, 2, 4, 8... s apart): an attempt that keeps failing is
given up after ``RECONNECT_WINDOW_S`` and the next lookup starts a new one, so
lookups succeed again within a fraction of a second of the server's return.

The connection URL may carry a password; every message this module produces
or passes on is scrubbed of it (see ``dsn.py``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.postgres.dsn import PostgresUrl, parse_postgres_url
from sidecar.postgres.errors import describe_error
from sidecar.store.lifecycle import check_no_reinstatement, check_status_change, loosening_ids
from sidecar.store.preview import preview_load
from sidecar.store.rows import RowCodec
from sidecar.store.schema import Migration, apply_migrations, check_schema
from sidecar.store.store import LoadPreview, StoreEndpoint, StoreUnavailable
from sidecar.store.versions import check_approval, check_no_version_overlap, touched_documents

_SELECT = """
    SELECT c.chunk_id, c.doc_id, c.version, c.tenant_id, c.allowed_principals, c.status,
           c.effective_at, c.expires_at, c.sha256, c.source_uri, c.superseded_by,
           c.requires_signature, c.text, c.payload_sha256,
           EXISTS (SELECT 1 FROM electronic_signatures AS s
                   WHERE s.doc_id = c.doc_id AND s.version = c.version AND s.is_valid)
    FROM chunks AS c
"""
_FETCH = _SELECT + " WHERE c.chunk_id = ANY(%s)"
_GET = _SELECT + " WHERE c.chunk_id = %s"
# Both rows locked, in a fixed order so that two status changes cannot deadlock.
_LOCK = _SELECT + " WHERE c.chunk_id = ANY(%s) ORDER BY c.chunk_id FOR UPDATE OF c"
# Locked, so that a revocation cannot slip in between this read and the write.
_LOCK_STATUS = "SELECT chunk_id, status FROM chunks WHERE chunk_id = ANY(%s) FOR UPDATE"
_SET_STATUS = "UPDATE chunks SET status = %s, superseded_by = %s WHERE chunk_id = %s"
# The approved versions of documents, for the overlap check: no text, no signature
# lookup (neither takes part), in the row form RowCodec decodes.
_APPROVED_OF_DOCUMENTS = """
    SELECT chunk_id, doc_id, version, tenant_id, allowed_principals, status,
           effective_at, expires_at, sha256, source_uri, superseded_by,
           requires_signature, NULL, payload_sha256, false
    FROM chunks WHERE status = 'approved' AND doc_id = ANY(%s) ORDER BY chunk_id
"""
# Serialises the writes that can make a record approved (loads, approvals): the
# overlap check reads which versions exist, and rows a concurrent load is about
# to insert cannot be locked. An arbitrary constant: "rgvers".
_APPROVALS_LOCK_KEY = 0x7267_7665_7273
_READ_ONLY_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
# Upserts go through a staging table filled by COPY: several times faster than
# one INSERT per record for a large file.
_STAGE = "CREATE TEMP TABLE chunks_upsert (LIKE chunks) ON COMMIT DROP"
_COPY = """
    COPY chunks_upsert (chunk_id, doc_id, version, tenant_id, allowed_principals, status,
                        effective_at, expires_at, sha256, source_uri, superseded_by,
                        requires_signature, text, payload_sha256) FROM STDIN
"""
# An unchanged record is not rewritten: no row version, no notification, so
# reloading a whole file does not flush every sidecar's cache.
_MERGE = """
    INSERT INTO chunks (chunk_id, doc_id, version, tenant_id, allowed_principals, status,
                        effective_at, expires_at, sha256, source_uri, superseded_by,
                        requires_signature, text, payload_sha256)
    SELECT chunk_id, doc_id, version, tenant_id, allowed_principals, status,
           effective_at, expires_at, sha256, source_uri, superseded_by,
           requires_signature, text, payload_sha256
    FROM chunks_upsert
    ON CONFLICT (chunk_id) DO UPDATE SET
        doc_id = excluded.doc_id, version = excluded.version, tenant_id = excluded.tenant_id,
        allowed_principals = excluded.allowed_principals, status = excluded.status,
        effective_at = excluded.effective_at, expires_at = excluded.expires_at,
        sha256 = excluded.sha256, source_uri = excluded.source_uri,
        superseded_by = excluded.superseded_by,
        requires_signature = excluded.requires_signature, text = excluded.text,
        payload_sha256 = excluded.payload_sha256
    WHERE ROW(chunks.*) IS DISTINCT FROM ROW(excluded.*)
"""

# psycopg adapts lists to text[] and aware datetimes to timestamptz, both ways.
_ROWS = RowCodec()

DEFAULT_QUERY_TIMEOUT_S = 1.0
DEFAULT_CONNECT_TIMEOUT_S = 5
DEFAULT_POOL_MIN_SIZE = 1
DEFAULT_POOL_MAX_SIZE = 4
# How long the pool keeps retrying one failed connection attempt (with its own
# backoff) before giving up; the next lookup that finds no connection starts a
# new attempt at once. psycopg_pool's default, 300 s with delays doubling from
# 1 s, left lookups failing for seconds after the server was back.
RECONNECT_WINDOW_S = 0.5
APPLICATION_NAME = "retrieval-gate"
DEFAULT_PORT = 5432  # libpq's


class PostgresStore:
    """MetadataStore on a PostgreSQL database migrated to this build's schema.

    Raises ValueError for a malformed URL and StoreUnavailable (SchemaMismatch
    for a missing, older or newer schema) when the database cannot be used.
    ``query_timeout_s`` bounds each ``fetch``, waiting for a pooled connection
    included: a response waits no longer than that for its metadata. The pool
    opens on the first ``fetch`` and belongs to that event loop: fetch from
    that loop only, and release it with ``aclose`` there.

    ``pgbouncer``: ``url`` goes through PgBouncer in transaction (or
    statement) pooling mode, so no statement is prepared on the server.
    ``listen_url``: where the change listener connects (``listen_url``
    attribute; default ``url``); it must be a session of its own.
    """

    def __init__(
        self,
        url: str,
        *,
        pool_min_size: int = DEFAULT_POOL_MIN_SIZE,
        pool_max_size: int = DEFAULT_POOL_MAX_SIZE,
        query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S,
        pgbouncer: bool = False,
        listen_url: str | None = None,
    ) -> None:
        if not 0 <= pool_min_size <= pool_max_size or pool_max_size < 1:
            raise ValueError("pool sizes must satisfy 0 <= min <= max, max >= 1")
        self.url = parse_postgres_url(url)
        self.listen_url = self.url if listen_url is None else parse_postgres_url(listen_url)
        self.endpoint = endpoint(self.url)
        self.pgbouncer = pgbouncer
        self._query_timeout_s = query_timeout_s
        self._closed = False
        with _connection(self.url, pgbouncer=pgbouncer) as connection:
            check_schema(connection, self.url.redacted)
        self._pool = AsyncConnectionPool(
            self.url.url,
            kwargs=connect_options(self.url, pgbouncer=pgbouncer) | {"autocommit": True},
            min_size=pool_min_size,
            max_size=pool_max_size,
            open=False,
            configure=_configure,
            timeout=query_timeout_s,
            reconnect_timeout=RECONNECT_WINDOW_S,
            name="retrieval-gate-metadata",
        )
        self._pool_opened = False
        # Lookups given up on at their timeout, still cancelling (see ``fetch``).
        self._abandoned: set[asyncio.Future[list[TupleRow]]] = set()

    async def fetch(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
        """Look up records in one statement; absent ids are left out of the result.

        Raises StoreUnavailable when the database cannot answer within the
        query timeout.
        """
        ids = list(dict.fromkeys(chunk_ids))
        if not ids:
            return {}
        if self._closed:
            raise StoreUnavailable("PostgreSQL metadata store is closed")
        if not self._pool_opened:
            # Opened here rather than in __init__: the pool belongs to the
            # event loop that uses it. Returns at once; connects in the background.
            await self._pool.open(wait=False)
            self._pool_opened = True
        # In a task of its own, so that the timeout returns on time: cancelling a
        # query makes psycopg send the server a cancel request and wait up to
        # 5 s + 5 s for the query to end, which an unreachable server (or a
        # PgBouncer with no server to give) never does. The abandoned task
        # finishes that in the background and returns or drops its connection.
        lookup = asyncio.ensure_future(self._lookup(ids))
        try:
            done, _ = await asyncio.wait((lookup,), timeout=self._query_timeout_s)
        except asyncio.CancelledError:
            self._abandon(lookup)
            raise
        try:
            if not done:
                self._abandon(lookup)
                raise TimeoutError
            rows = lookup.result()
        except TimeoutError:
            raise StoreUnavailable(
                f"PostgreSQL metadata query on {self.url} took longer than "
                f"{self._query_timeout_s:g} s"
            ) from None
        except _ConnectionLost as lost:
            raise StoreUnavailable(
                self.url.scrub(
                    f"PostgreSQL metadata query on {self.url} lost its connection: "
                    f"{describe_error(lost.error)}"
                )
            ) from None
        except psycopg.Error as exc:
            raise StoreUnavailable(
                self.url.scrub(
                    f"PostgreSQL metadata query on {self.url} failed: {describe_error(exc)}"
                )
            ) from None
        return _ROWS.decode_rows(rows, asked=len(ids))

    async def _lookup(self, ids: list[str]) -> list[TupleRow]:
        try:
            return await self._select(ids)
        except _ConnectionLost:
            # A pooled connection died (e.g. the server restarted), and its
            # siblings likely with it: replace the dead ones (new attempts start
            # at once), then retry once on a fresh connection. A read is safe to
            # repeat, and the query timeout still bounds both tries.
            await self._pool.check()
            return await self._select(ids)

    def _abandon(self, lookup: asyncio.Future[list[TupleRow]]) -> None:
        lookup.cancel()
        self._abandoned.add(lookup)
        lookup.add_done_callback(self._forget)

    def _forget(self, lookup: asyncio.Future[list[TupleRow]]) -> None:
        self._abandoned.discard(lookup)
        if not lookup.cancelled():
            lookup.exception()  # retrieved: nobody waits for it any more

    async def _select(self, ids: list[str]) -> list[TupleRow]:
        async with self._pool.connection() as connection:
            try:
                cursor = await connection.execute(_FETCH, (ids,))
                return await cursor.fetchall()
            except psycopg.OperationalError as exc:
                if connection.broken:
                    raise _ConnectionLost(exc) from exc
                raise

    def upsert(self, records: Iterable[ChunkRecord], *, reinstate: bool = False) -> int:
        """Insert or replace records in one transaction (all or none); return the count.

        Raises ValueError when a record cannot be stored (naive datetime, or a
        value the table's constraints reject) and StoreUnavailable on any other
        database error; in both cases nothing is written.
        """
        batch = list(records)
        # Encode first, so that a bad record fails before the transaction starts.
        # The last record of an id wins, as if they were written one by one.
        rows = {record.chunk_id: _ROWS.encode(record) for record in batch}
        with self._operation("upsert") as connection, connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_APPROVALS_LOCK_KEY,))
            if not reinstate:
                loaded = {record.chunk_id: record.status for record in batch}
                stored = connection.execute(_LOCK_STATUS, (loosening_ids(loaded),)).fetchall()
                check_no_reinstatement(loaded, {row[0]: Status(row[1]) for row in stored})
            check_no_version_overlap(
                batch, _approved_of_documents(connection, touched_documents(batch))
            )
            connection.execute(_STAGE)
            with connection.cursor() as cursor, cursor.copy(_COPY) as copy:
                for row in rows.values():
                    copy.write_row(row)
            connection.execute(_MERGE)
        return len(batch)

    def preview(self, records: Iterable[ChunkRecord], *, reinstate: bool = False) -> LoadPreview:
        """What ``upsert`` would do, read in one read-only snapshot; see
        ``MetadataStore.preview``."""
        batch = list(records)
        with self._operation("preview") as connection, connection.transaction():
            connection.execute(_READ_ONLY_SNAPSHOT)
            ids = list(dict.fromkeys(record.chunk_id for record in batch))
            stored = _ROWS.decode_rows(connection.execute(_FETCH, (ids,)).fetchall())
            approved = _approved_of_documents(connection, touched_documents(batch))
        return preview_load(batch, stored=stored, approved=approved, reinstate=reinstate)

    def get(self, chunk_id: str) -> ChunkRecord | None:
        """The record of one chunk (text included), or None; raises StoreUnavailable."""
        with self._operation("lookup") as connection:
            row = connection.execute(_GET, (chunk_id,)).fetchone()
        return None if row is None else _ROWS.decode(row)

    def set_status(
        self, chunk_id: str, status: Status, superseded_by: str | None = None
    ) -> ChunkRecord:
        """Set status and successor with both rows locked; see ``MetadataStore.set_status``."""
        ids = [chunk_id] if superseded_by is None else [chunk_id, superseded_by]
        approving = Status(status) is Status.APPROVED
        with self._operation("status change") as connection, connection.transaction():
            if approving:
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (_APPROVALS_LOCK_KEY,))
            found = _ROWS.decode_rows(connection.execute(_LOCK, (ids,)).fetchall())
            current = found.get(chunk_id)
            check_status_change(
                chunk_id,
                status,
                superseded_by,
                current=current,
                successor=None if superseded_by is None else found.get(superseded_by),
            )
            if approving and current is not None:
                check_approval(current, _approved_of_documents(connection, [current.doc_id]))
            connection.execute(_SET_STATUS, (Status(status).value, superseded_by, chunk_id))
            row = connection.execute(_GET, (chunk_id,)).fetchone()
        assert row is not None  # locked above, so still there
        return _ROWS.decode(row)

    def close(self) -> None:
        """Refuse further operations. The pool is released by ``aclose``."""
        self._closed = True

    async def aclose(self) -> None:
        """Refuse further operations and close the pool (from the loop that fetched)."""
        self._closed = True
        for lookup in list(self._abandoned):
            lookup.cancel()
        if self._pool_opened:
            await self._pool.close()

    @contextmanager
    def _operation(self, action: str) -> Iterator[psycopg.Connection[TupleRow]]:
        if self._closed:
            raise StoreUnavailable("PostgreSQL metadata store is closed")
        with _connection(self.url, pgbouncer=self.pgbouncer) as connection:
            try:
                yield connection
            except psycopg.errors.IntegrityError as exc:
                raise ValueError(
                    f"a record violates the chunks table constraints ({describe_error(exc)}); "
                    "nothing was written"
                ) from None
            except psycopg.DataError as exc:
                raise ValueError(
                    f"a record has a value PostgreSQL cannot store ({describe_error(exc)}); "
                    "nothing was written"
                ) from None
            except psycopg.Error as exc:
                raise StoreUnavailable(
                    self.url.scrub(f"PostgreSQL metadata {action} failed: {describe_error(exc)}")
                ) from None


def _approved_of_documents(
    connection: psycopg.Connection[TupleRow], doc_ids: list[str]
) -> list[ChunkRecord]:
    """The stored approved records of these documents, without their text."""
    if not doc_ids:
        return []
    rows = connection.execute(_APPROVED_OF_DOCUMENTS, (doc_ids,)).fetchall()
    return list(_ROWS.decode_rows(rows).values())


def migrate(url: str) -> list[Migration]:
    """Bring the database at ``url`` to this build's schema; return the migrations applied.

    Raises ValueError for a malformed URL, SchemaMismatch when the database is
    newer than this build, and StoreUnavailable when a connection or a
    migration fails (a failed migration is rolled back, earlier ones stay).
    """
    parsed = parse_postgres_url(url)
    with _connection(parsed) as connection:
        try:
            return apply_migrations(connection, parsed.redacted)
        except psycopg.Error as exc:
            raise StoreUnavailable(
                parsed.scrub(f"migrating {parsed} failed: {describe_error(exc)}")
            ) from None


def connect_options(url: PostgresUrl, *, pgbouncer: bool = False) -> dict[str, Any]:
    """Connection parameters to add to ``url``: defaults for what neither it nor the
    environment sets (libpq's own defaults wait forever and name no application);
    behind PgBouncer's transaction pooling, no server-side prepared statements."""
    given = url.parameter_names
    options: dict[str, Any] = {}
    if pgbouncer:
        options["prepare_threshold"] = None
    if "connect_timeout" not in given and "PGCONNECT_TIMEOUT" not in os.environ:
        options["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT_S
    if "application_name" not in given and "PGAPPNAME" not in os.environ:
        options["application_name"] = APPLICATION_NAME
    return options


def endpoint(url: PostgresUrl) -> StoreEndpoint:
    """The server ``url`` connects to first, as traces name it (``server.address``, ``.port``).

    libpq's defaults where the URL names none: ``PGHOST`` / ``PGPORT``, else the
    local socket and 5432.
    """
    parsed = conninfo_to_dict(url.url)
    host = str(parsed.get("host") or os.environ.get("PGHOST") or "").split(",")[0] or None
    port_text = str(parsed.get("port") or os.environ.get("PGPORT") or "").split(",")[0]
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        port = DEFAULT_PORT
    return StoreEndpoint("postgresql", host, port)


class _ConnectionLost(Exception):
    """A pooled connection turned out to be dead."""

    def __init__(self, error: psycopg.OperationalError) -> None:
        super().__init__(str(error))
        self.error = error


async def _configure(connection: psycopg.AsyncConnection[TupleRow]) -> None:
    # Timestamps arrive in the session's zone; UTC keeps every representable
    # instant within Python's years 1-9999.
    await connection.execute("SET TIME ZONE 'UTC'")


@contextmanager
def _connection(
    url: PostgresUrl, *, pgbouncer: bool = False
) -> Iterator[psycopg.Connection[TupleRow]]:
    try:
        connection = psycopg.connect(
            url.url, autocommit=True, **connect_options(url, pgbouncer=pgbouncer)
        )
        connection.execute("SET TIME ZONE 'UTC'")
    except psycopg.Error as exc:
        raise StoreUnavailable(
            url.scrub(f"cannot connect to PostgreSQL metadata store {url}: {describe_error(exc)}")
        ) from None
    with connection:
        yield connection
