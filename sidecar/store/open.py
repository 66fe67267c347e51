"""Open a metadata store from a URL given in configuration or on the command line."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import psycopg

from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.postgres.dsn import SCHEMES as POSTGRES_SCHEMES
from sidecar.store.postgres import PostgresStore
from sidecar.store.sqlite import URL_PREFIX as SQLITE_PREFIX
from sidecar.store.sqlite import SqliteStore, require_file
from sidecar.store.store import LoadPreview, MetadataStore, SchemaMismatch, StoreUnavailable

_SUPPORTED = (
    "supported: sqlite:///relative/path.db, sqlite:////absolute/path.db, "
    "postgresql://user@host:port/database"
)


def is_postgres_url(url: str) -> bool:
    """True for a ``postgresql://`` or ``postgres://`` URL."""
    return url.partition("://")[0].lower() in POSTGRES_SCHEMES


def open_store(url: str) -> MetadataStore:
    """Open the metadata store named by ``url``.

    ``postgresql://`` (or ``postgres://``) URLs are libpq connection URIs; the
    database must have been migrated (``retrieval-gate store migrate``). Keep
    the password out of the URL (PGPASSWORD or ~/.pgpass); if it is there, it
    is redacted from every message.

    SQLite URLs: see :func:`sqlite_path`. The file must exist: only ``store
    migrate`` (``sqlite.migrate``) creates one.

    Raises ValueError for an unsupported or malformed URL, and StoreUnavailable
    when the store cannot be opened (StoreNotCreated for a SQLite file that is
    not there, SchemaMismatch for a store without this build's schema).
    """
    path = sqlite_path(url)
    if path is None:
        return PostgresStore(url)
    return SqliteStore(path)


def sqlite_path(url: str) -> str | None:
    """The file a ``sqlite:///`` URL names; None for a PostgreSQL URL.

    SQLite URLs follow SQLAlchemy's convention: ``sqlite:///`` is followed by
    the file path, so ``sqlite:///data/chunks.db`` is relative to the working
    directory and ``sqlite:////var/lib/gate/chunks.db`` (four slashes) is
    absolute. The path is taken literally (no percent-decoding, no query
    parameters). Raises ValueError for an unsupported or malformed URL.
    """
    scheme, separator, _ = url.partition("://")
    if not separator:
        raise ValueError(f"metadata store URL has no scheme; {_SUPPORTED}")
    if is_postgres_url(url):
        return None
    # Only the scheme is echoed: a database URL may carry a password.
    if scheme.lower() != "sqlite":
        raise ValueError(f"unsupported metadata store URL scheme {scheme!r}; {_SUPPORTED}")
    if url[: len(SQLITE_PREFIX)].lower() != SQLITE_PREFIX:
        raise ValueError(
            f"SQLite URL must start with {SQLITE_PREFIX!r} (three slashes); {_SUPPORTED}"
        )
    path = url[len(SQLITE_PREFIX) :]
    if not path or path == "/":
        raise ValueError(f"SQLite URL names no file; {_SUPPORTED}")
    if path == ":memory:":
        # SqliteStore opens two connections; each would get its own empty database.
        raise ValueError("in-memory SQLite is not supported; name a file")
    if "?" in path:
        raise ValueError("SQLite URL query parameters are not supported")
    return path


def require_created(url: str) -> None:
    """Raise StoreNotCreated when ``url`` names a SQLite file that does not exist.

    For a process about to start workers, each of which would otherwise fail on
    its own; whatever else may be wrong with ``url`` is reported by
    :func:`open_store` when the store is opened.
    """
    try:
        path = sqlite_path(url)
    except ValueError:
        return
    if path is not None:
        require_file(path)


# What libpq and the server say when the server cannot be reached, or cannot
# take a session yet: an outage, which may end by itself (a mesh proxy not
# started yet, a server restarting). Anything else a connection attempt ends
# with (a refused login, an unknown role or database, a bad parameter, TLS
# refused) is a misconfiguration that no wait changes. libpq gives connection
# failures no SQLSTATE, so its message is read.
_OUTAGE_MESSAGES = (
    "connection refused",
    "timeout expired",
    "timed out",
    "could not translate host name",
    "failed to resolve host",
    "name or service not known",
    "temporary failure in name resolution",
    "no route to host",
    "network is unreachable",
    "host is unreachable",
    "connection reset",
    "server closed the connection unexpectedly",
    "no such file or directory",  # a unix socket not there yet
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "too many clients",
    "too many connections",
)
# SQLSTATE classes of outages, when there is one: 08 connection exception,
# 53 insufficient resources (too many connections), 57 operator intervention
# (starting up, shutting down).
_OUTAGE_SQLSTATES = ("08", "53", "57")


def is_outage(error: StoreUnavailable) -> bool:
    """True when ``error`` (from :func:`open_store`) is an outage worth retrying: the
    server could not be reached (refused, timed out, a name that does not resolve
    yet, no route) or cannot take a session yet (starting up, out of connections).

    False for what waiting does not change: a refused login, an unknown role or
    database, a bad connection parameter, TLS refused, a schema at another
    version (SchemaMismatch: the message says which migration to run), and any
    error that is not a connection error.
    """
    if isinstance(error, SchemaMismatch):
        return False
    cause = error.__cause__ or error.__context__
    if not isinstance(cause, psycopg.OperationalError):
        return False
    if cause.sqlstate:
        return cause.sqlstate.startswith(_OUTAGE_SQLSTATES)
    message = " ".join(str(cause).lower().split())
    return any(text in message for text in _OUTAGE_MESSAGES)


class PendingStore:
    """A metadata store not opened yet: every lookup is StoreUnavailable until
    :meth:`attach` hands it the opened store, then it is that store.

    The sidecar serves (NOT_SERVING, failing closed) while the store it needs
    cannot be reached at start, instead of exiting.
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        self._inner: MetadataStore | None = None
        self._closed = False

    @property
    def opened(self) -> bool:
        """True once :meth:`attach` was called."""
        return self._inner is not None

    def attach(self, store: MetadataStore) -> None:
        """From now on, answer with ``store``."""
        self._inner = store

    def _store(self) -> MetadataStore:
        if self._inner is None or self._closed:
            raise StoreUnavailable(f"metadata store not reached yet: {self.reason}")
        return self._inner

    async def fetch(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
        return await self._store().fetch(chunk_ids)

    def upsert(self, records: Iterable[ChunkRecord], *, reinstate: bool = False) -> int:
        return self._store().upsert(records, reinstate=reinstate)

    def preview(self, records: Iterable[ChunkRecord], *, reinstate: bool = False) -> LoadPreview:
        return self._store().preview(records, reinstate=reinstate)

    def get(self, chunk_id: str) -> ChunkRecord | None:
        return self._store().get(chunk_id)

    def set_status(
        self, chunk_id: str, status: Status, superseded_by: str | None = None
    ) -> ChunkRecord:
        return self._store().set_status(chunk_id, status, superseded_by)

    def close(self) -> None:
        self._closed = True
        if self._inner is not None:
            self._inner.close()

    async def aclose(self) -> None:
        self._closed = True
        if self._inner is not None:
            await self._inner.aclose()
