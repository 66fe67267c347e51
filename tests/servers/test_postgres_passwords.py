"""Passwords in PostgreSQL URLs never reach a message; these need no server.

The cases that need the server to echo a password are in test_postgres_store.py.
"""

from __future__ import annotations

import pytest

from sidecar.postgres.dsn import parse_postgres_url, redact_url
from sidecar.store.open import open_store
from sidecar.store.postgres import migrate
from sidecar.store.store import StoreUnavailable

PASSWORD = "s3cret-Pw"


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("postgresql://gate:pw@db:5432/gate", "postgresql://gate:***@db:5432/gate"),
        ("postgres://gate:p%40ss@db/gate", "postgres://gate:***@db/gate"),
        (
            "postgresql://gate@db/gate?password=pw&sslmode=require",
            "postgresql://gate@db/gate?password=***&sslmode=require",
        ),
        ("postgresql://gate@db/gate", "postgresql://gate@db/gate"),
        ("postgresql://:pw@db/gate", "postgresql://:***@db/gate"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


def test_ambiguous_password_is_refused_without_echoing_it() -> None:
    with pytest.raises(ValueError, match="ambiguous") as caught:
        parse_postgres_url("postgresql://gate:ab/cd@db/gate")
    assert "ab/cd" not in str(caught.value) and "cd@" not in str(caught.value)


def test_connection_errors_never_show_the_password() -> None:
    with pytest.raises(StoreUnavailable) as caught:
        open_store(f"postgresql://gate:{PASSWORD}@127.0.0.1:1/gate")
    assert PASSWORD not in str(caught.value)
    assert "postgresql://gate:***@127.0.0.1:1/gate" in str(caught.value)
    with pytest.raises(StoreUnavailable) as caught:
        migrate(f"postgresql://gate:{PASSWORD}@127.0.0.1:1/gate")
    assert PASSWORD not in str(caught.value)
