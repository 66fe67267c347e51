"""Signed checkpoints in PostgreSQL: the ``audit_checkpoints`` table, shipped from the local file.

With a PostgreSQL audit store, the checkpoints file beside the spool is
shipped like the spool itself, by the same shipper thread, into an
append-only table beside ``audit_records`` (same triggers, same advice: the
sidecar's role gets INSERT and SELECT only). A checkpoint is shipped only once
the table holds the record it signs, so the table never shows a checkpoint
beyond its chain's end (which the verifier reads as removed records).

The table is created on first connect when missing, separately from
``audit_records``, so that a table made before checkpoints existed gains it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from sidecar.audit.checkpoints import Checkpoint, CheckpointError
from sidecar.audit.postgres_schema import append_only_sql

CHECKPOINT_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS audit_checkpoints (
    chain_id  text        NOT NULL,
    seq       bigint      NOT NULL CHECK (seq > 0),
    sha256    text        NOT NULL,
    time      timestamptz NOT NULL,
    key_id    text        NOT NULL,
    line      text        NOT NULL,
    PRIMARY KEY (chain_id, seq)
);
""" + append_only_sql("audit_checkpoints")

# Not the audit_records lock: both may be created by sidecars starting together.
_SCHEMA_LOCK = 0x7267_6370_6F69_6E74  # "rgcpoint"

_INSERT_SQL = """
INSERT INTO audit_checkpoints (chain_id, seq, sha256, time, key_id, line)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (chain_id, seq) DO NOTHING
"""


def ensure_checkpoint_schema(connection: psycopg.Connection[Any]) -> None:
    """Create ``audit_checkpoints`` and its triggers unless the table exists; commits."""
    exists = connection.execute("SELECT to_regclass('audit_checkpoints') IS NOT NULL").fetchone()
    if not (exists and exists[0]):
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        connection.execute(CHECKPOINT_SCHEMA_SQL)
    connection.commit()


def stored_checkpoints(
    connection: psycopg.Connection[Any], chain_id: str | None = None
) -> dict[str, list[Checkpoint]]:
    """The checkpoints in the table by chain id (every chain, or only ``chain_id``).

    Empty when the table does not exist. Raises CheckpointError naming a row
    that is not a checkpoint.
    """
    exists = connection.execute("SELECT to_regclass('audit_checkpoints') IS NOT NULL").fetchone()
    if not (exists and exists[0]):
        return {}
    rows = connection.execute(
        "SELECT chain_id, seq, line FROM audit_checkpoints "
        "WHERE %(chain)s::text IS NULL OR chain_id = %(chain)s ORDER BY chain_id, seq",
        {"chain": chain_id},
    ).fetchall()
    found: dict[str, list[Checkpoint]] = {}
    for chain, seq, line in rows:
        try:
            checkpoint = Checkpoint.parse(line)
        except CheckpointError as exc:
            raise CheckpointError(f"audit_checkpoints chain {chain} seq {seq}: {exc}") from None
        if (checkpoint.chain_id, checkpoint.seq) != (chain, seq):
            raise CheckpointError(
                f"audit_checkpoints chain {chain} seq {seq}: columns do not match the line (edited)"
            )
        found.setdefault(chain, []).append(checkpoint)
    return found


class CheckpointShipper:
    """Copies the checkpoints file's new lines to ``audit_checkpoints``, for the audit shipper.

    Runs in the shipper's thread only. It remembers how far the file was
    shipped; after a (re)connect it skips the lines whose seq the table
    already holds for the chain.
    """

    def __init__(self, path: Path, chain_id: str) -> None:
        self.path = path
        self._chain_id = chain_id
        self._offset = 0  # bytes of the file shipped (or found in the table)
        self._shipped_seq: int | None = None  # None: ask the table first

    def reconnected(self) -> None:
        """Ask the table where the chain's checkpoints end before the next shipment."""
        self._shipped_seq = None

    def ship(self, connection: psycopg.Connection[Any], confirmed_seq: int) -> int:
        """Ship the checkpoints of records up to ``confirmed_seq`` (in the table); commits.

        Returns how many were inserted. Raises CheckpointError on a line that
        is not a checkpoint, psycopg.Error when PostgreSQL fails (the file
        position is kept, so the next pass ships them again).
        """
        if not self.path.exists():
            return 0
        if self._shipped_seq is None:
            ensure_checkpoint_schema(connection)
            row = connection.execute(
                "SELECT coalesce(max(seq), 0) FROM audit_checkpoints WHERE chain_id = %s",
                (self._chain_id,),
            ).fetchone()
            connection.commit()
            self._shipped_seq = int(row[0]) if row else 0
        inserted = 0
        offset = self._offset
        with self.path.open("rb") as handle:
            handle.seek(offset)
            try:
                for raw in handle:
                    if not raw.endswith(b"\n"):
                        break  # being written
                    checkpoint = Checkpoint.parse(raw)
                    if checkpoint.seq > confirmed_seq:
                        break  # its record is not in the table yet
                    if checkpoint.seq > self._shipped_seq:
                        connection.execute(
                            _INSERT_SQL,
                            (
                                self._chain_id,
                                checkpoint.seq,
                                checkpoint.sha256,
                                checkpoint.time,
                                checkpoint.key_id,
                                raw[:-1].decode(),
                            ),
                        )
                        inserted += 1
                        self._shipped_seq = checkpoint.seq
                    offset += len(raw)
                connection.commit()
            except CheckpointError as exc:
                connection.rollback()
                raise CheckpointError(f"{self.path} at byte {offset}: {exc}") from None
            except BaseException:
                connection.rollback()
                self._shipped_seq = None
                raise
        self._offset = offset
        return inserted
