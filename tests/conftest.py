"""Shared test set-up: the hypothesis profile, the server markers, shared fixtures.

Tests marked ``postgres``, ``pgbouncer`` or ``chroma`` (markers in pyproject.toml) need that
server; before each such test runs, the server is checked, and a missing one
skips the test on a laptop and fails it in CI (tests/fixtures/servers.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from sidecar.store.postgres import migrate
from sidecar.store.sqlite import SqliteStore
from tests.fixtures.chroma_server import require_chroma
from tests.fixtures.pgbouncer import require_pgbouncer
from tests.fixtures.postgres import fresh_database, require_postgres
from tests.fixtures.stores import new_sqlite_store

# Every property test runs under this profile, locally and in CI. No deadline:
# on a shared two-core machine a slow example is load, not a bug. too_slow is
# suppressed because the body strategies build whole search responses. A test
# may still set its own max_examples with @settings.
HYPOTHESIS_PROFILE = "retrieval-gate"
settings.register_profile(
    HYPOTHESIS_PROFILE,
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(HYPOTHESIS_PROFILE)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (laptop) or fail (CI) a test whose marked server is missing."""
    if item.get_closest_marker("postgres") is not None:
        require_postgres()
    if item.get_closest_marker("pgbouncer") is not None:
        require_postgres()
        require_pgbouncer()
    if item.get_closest_marker("chroma") is not None:
        require_chroma()


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database migrated to this build's schema, one per test module.

    Dropped when the module is done; tests that share it empty its tables first.
    """
    with fresh_database() as url:
        migrate(url)
        yield url


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    """The file of the test's SQLite metadata store (``sqlite_store`` creates it, as
    ``store migrate`` does)."""
    return tmp_path / "meta.db"


@pytest.fixture
def sqlite_store(sqlite_path: Path) -> Iterator[SqliteStore]:
    """An empty SQLite metadata store at ``sqlite_path``, closed after the test."""
    store = new_sqlite_store(sqlite_path)
    yield store
    store.close()
