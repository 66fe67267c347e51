"""Open a metadata store from a URL given in configuration or on the command line."""

from __future__ import annotations

from sidecar.postgres.dsn import SCHEMES as POSTGRES_SCHEMES
from sidecar.store.postgres import PostgresStore
from sidecar.store.sqlite import SqliteStore
from sidecar.store.store import MetadataStore

SQLITE_PREFIX = "sqlite:///"

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

    SQLite URLs follow SQLAlchemy's convention: ``sqlite:///`` is followed by
    the file path, so ``sqlite:///data/chunks.db`` is relative to the working
    directory and ``sqlite:////var/lib/gate/chunks.db`` (four slashes) is
    absolute. The path is taken literally (no percent-decoding, no query
    parameters). The file and its schema are created when missing.

    Raises ValueError for an unsupported or malformed URL, and StoreUnavailable
    when the store cannot be opened.
    """
    scheme, separator, _ = url.partition("://")
    if not separator:
        raise ValueError(f"metadata store URL has no scheme; {_SUPPORTED}")
    if is_postgres_url(url):
        return PostgresStore(url)
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
    return SqliteStore(path)
