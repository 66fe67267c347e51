"""Describing PostgreSQL errors without leaking row data."""

from __future__ import annotations

import psycopg


def describe_error(exc: psycopg.Error) -> str:
    """The server's primary message (or the client's message) for ``exc``.

    Never the DETAIL line: for a constraint violation it quotes the whole row
    ("Failing row contains (...)"), chunk text included.
    """
    primary = exc.diag.message_primary
    return primary if primary else str(exc).strip()
