"""The serving sidecar's metadata store, opened with its ``[store]`` settings.

``open_store`` (``sidecar.store.open``) opens a store from its URL alone, as
the CLI's commands do; a serving sidecar also sizes its PostgreSQL pool,
knows whether PgBouncer is in between, and where the change listener holds
its LISTEN session (docs/postgresql.md, "Connection budget" and "PgBouncer").
"""

from __future__ import annotations

from sidecar.config.groups import StoreSettings
from sidecar.store.open import is_postgres_url, open_store
from sidecar.store.postgres import PostgresStore
from sidecar.store.store import MetadataStore


def open_metadata_store(settings: StoreSettings) -> MetadataStore:
    """The store ``settings.url`` names; a PostgreSQL one with the pool settings.

    Raises ValueError and StoreUnavailable as ``open_store`` does.
    """
    if not is_postgres_url(settings.url):
        return open_store(settings.url)
    return PostgresStore(
        settings.url,
        pool_min_size=settings.pool_min,
        pool_max_size=settings.pool_max,
        pgbouncer=settings.pgbouncer,
        listen_url=settings.listen_url,
    )
