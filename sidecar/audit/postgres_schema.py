"""The ``audit_records`` table: its DDL and its row, shared by the sink and the verifier.

Each row keeps a record's canonical JSON line byte for byte (``record`` is
TEXT, not JSONB, which would reorder keys and re-render numbers), so the
verifier recomputes the same digests as for a JSON Lines file; the other
columns are copies for queries. ``chain_id`` separates the chains of many
sidecars sharing one table.

On first connect the sink creates the table and its triggers when the table
is missing (:data:`AUDIT_SCHEMA_SQL`; needs PostgreSQL 14+ and CREATE on the
schema). The triggers refuse UPDATE, DELETE and TRUNCATE, even by the table's
owner. An owner can still drop a trigger, so in production the sidecar should
connect as a role granted only INSERT and SELECT on a table created by another
role; the hash chain makes any rewrite that gets past this detectable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg


def append_only_sql(table: str) -> str:
    """Triggers that refuse every UPDATE, DELETE and TRUNCATE of ``table``: the audit
    tables only grow, whatever the role that writes them may do."""
    return f"""CREATE OR REPLACE FUNCTION {table}_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '{table} is append-only: % refused', TG_OP;
END
$$;
CREATE OR REPLACE TRIGGER {table}_append_only
    BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {table}_refuse_change();
CREATE OR REPLACE TRIGGER {table}_no_truncate
    BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {table}_refuse_change();
"""


AUDIT_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS audit_records (
    chain_id    text        NOT NULL,
    seq         bigint      NOT NULL CHECK (seq > 0),
    decision_id text,
    time        timestamptz,
    sha256      text        NOT NULL,
    prev_sha256 text        NOT NULL,
    record      text        NOT NULL,
    PRIMARY KEY (chain_id, seq)
);
CREATE INDEX IF NOT EXISTS audit_records_decision_id ON audit_records (decision_id);
""" + append_only_sql("audit_records")

# Serialises schema creation between sidecars starting at the same moment.
_SCHEMA_LOCK = 0x7267_6175_6469_74  # "rgaudit"

# How long the shipper and the verifier wait for a connection before giving up.
CONNECT_TIMEOUT_SECONDS = 5


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One record as stored in ``audit_records`` (``line`` is the canonical JSON)."""

    seq: int
    decision_id: str | None
    time: datetime | None
    sha256: str
    prev_sha256: str
    line: str

    @classmethod
    def from_record(cls, record: Mapping[str, Any], line: str) -> AuditRow:
        """The row for a chained record and its canonical line; the columns are copies."""
        decision_id = record.get("decision_id")
        return cls(
            seq=int(record["seq"]),
            decision_id=decision_id if isinstance(decision_id, str) else None,
            time=_parse_time(record.get("time")),
            sha256=str(record["sha256"]),
            prev_sha256=str(record["prev_sha256"]),
            line=line,
        )


def _parse_time(value: object) -> datetime | None:
    # The column is for queries; the line keeps the original, so an odd value is left out.
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def ensure_schema(connection: psycopg.Connection[Any]) -> None:
    """Create ``audit_records`` and its triggers unless the table exists; commits.

    An existing table is left alone, so a role without CREATE can use a table
    made by migrations or an administrator.
    """
    exists = connection.execute("SELECT to_regclass('audit_records') IS NOT NULL").fetchone()
    if not (exists and exists[0]):
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        connection.execute(AUDIT_SCHEMA_SQL)
    connection.commit()
