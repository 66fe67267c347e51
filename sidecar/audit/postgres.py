"""Durable audit in PostgreSQL: a local spool, shipped in batches to an append-only table.

A decision must be on record before its answer leaves, but a database round
trip per response is too slow and PostgreSQL may be down. So ``write`` only
appends to a local hash-chained JSON Lines spool (``JsonlAuditSink``: one
unbuffered write, which survives SIGKILL of the sidecar) and returns; a shipper
thread copies the spool's new lines to the ``audit_records`` table with one
multi-row INSERT per batch. A thread rather than an asyncio task, so that
reading the spool and waiting on PostgreSQL never stall the event loop that
answers Envoy.

Resume needs no local bookkeeping: after every (re)connect the shipper reads
the chain's highest ``seq`` from PostgreSQL and continues from the spool line
after it, so records written before a crash, or while PostgreSQL was down, are
shipped, and none twice. The spool stays the first copy; it is never truncated
by the sink.

Each row keeps the spool line byte for byte (``record`` is TEXT, not JSONB,
which would reorder keys and re-render numbers), so ``verify_postgres_chain``
recomputes the same digests as ``verify_chain``. ``chain_id`` separates the
chains of many sidecars sharing one table.

Schema: on first connect the sink creates the table and its triggers when the
table is missing (``AUDIT_SCHEMA_SQL``; needs PostgreSQL 14+ and CREATE on the
schema). The triggers refuse UPDATE, DELETE and TRUNCATE, even by the table's
owner. An owner can still drop a trigger, so in production the sidecar should
connect as a role granted only INSERT and SELECT on a table created by another
role; the hash chain makes any rewrite that gets past this detectable.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import psycopg

from sidecar.audit.jsonl import (
    GENESIS,
    AuditError,
    ChainReport,
    JsonlAuditSink,
    chain_link_problem,
    offset_after,
)
from sidecar.postgres.dsn import parse_postgres_url

log = logging.getLogger(__name__)

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
CREATE OR REPLACE FUNCTION audit_records_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_records is append-only: % refused', TG_OP;
END
$$;
CREATE OR REPLACE TRIGGER audit_records_append_only
    BEFORE UPDATE OR DELETE ON audit_records
    FOR EACH ROW EXECUTE FUNCTION audit_records_refuse_change();
CREATE OR REPLACE TRIGGER audit_records_no_truncate
    BEFORE TRUNCATE ON audit_records
    FOR EACH STATEMENT EXECUTE FUNCTION audit_records_refuse_change();
"""

# Serialises schema creation between sidecars starting at the same moment.
_SCHEMA_LOCK = 0x7267_6175_6469_74  # "rgaudit"

_INSERT_SQL = """
INSERT INTO audit_records (chain_id, seq, decision_id, time, sha256, prev_sha256, record)
SELECT %s::text, * FROM unnest(
    %s::bigint[], %s::text[], %s::timestamptz[], %s::text[], %s::text[], %s::text[]
)
ON CONFLICT (chain_id, seq) DO NOTHING
RETURNING seq
"""

_CONNECT_TIMEOUT_SECONDS = 5
_FIRST_RETRY_SECONDS = 0.2
_MAX_RETRY_SECONDS = 10.0


class AuditChainConflict(AuditError):
    """PostgreSQL holds a different record at a seq of this chain than the spool does."""


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


def default_chain_id(spool: Path) -> str:
    """``hostname:digest-of-spool-path``: stable for one sidecar and its spool."""
    digest = hashlib.sha256(str(spool.resolve()).encode()).hexdigest()[:12]
    return f"{socket.gethostname()}:{digest}"


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


def ship_batch(connection: psycopg.Connection[Any], chain_id: str, rows: list[AuditRow]) -> int:
    """Insert ``rows`` in one statement and commit; return how many were new.

    Rows already present (a batch shipped again after its commit was not
    acknowledged) are skipped, but only if they are the same records: a
    different sha256 at the same seq rolls the batch back and raises
    AuditChainConflict.
    """
    columns = (
        [r.seq for r in rows],
        [r.decision_id for r in rows],
        [r.time for r in rows],
        [r.sha256 for r in rows],
        [r.prev_sha256 for r in rows],
        [r.line for r in rows],
    )
    try:
        inserted = {seq for (seq,) in connection.execute(_INSERT_SQL, (chain_id, *columns))}
        present = [r for r in rows if r.seq not in inserted]
        if present:
            stored = dict(
                connection.execute(
                    "SELECT seq, sha256 FROM audit_records WHERE chain_id = %s AND seq = ANY(%s)",
                    (chain_id, [r.seq for r in present]),
                ).fetchall()
            )
            for row in present:
                if stored.get(row.seq) != row.sha256:
                    raise AuditChainConflict(
                        f"chain {chain_id}: seq {row.seq} in PostgreSQL differs from the spool"
                    )
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    return len(inserted)


class PostgresAuditSink:
    """Spools records locally and ships them to PostgreSQL in the background.

    ``write`` never touches the network, so it neither waits for nor fails
    because of PostgreSQL; records wait in the spool (``backlog``) until they
    can be shipped. Call ``start`` to run the shipper and ``close`` to ship
    what is left (for at most ``stop_timeout`` seconds; the rest is shipped
    by the next start). A shipper that finds the spool and the table
    disagree stops and says so in ``failure`` and the log: continuing would
    hide tampering or two sidecars sharing one chain id.

    ``dsn`` is a ``postgresql://`` URL (ValueError, password redacted, when
    malformed); it is only ever shown redacted. ``on_backlog`` is called from
    the shipper thread with the backlog after every pass (at least every
    ``flush_interval`` seconds). Until the shipper has reached PostgreSQL
    once, every spooled record counts as backlog.
    """

    def __init__(
        self,
        spool: Path,
        dsn: str,
        *,
        chain_id: str | None = None,
        batch_size: int = 500,
        flush_interval: float = 0.2,
        stop_timeout: float = 5.0,
        on_backlog: Callable[[int], None] | None = None,
    ) -> None:
        if batch_size < 1 or flush_interval <= 0 or stop_timeout < 0:
            raise ValueError("batch_size and flush_interval must be positive, stop_timeout >= 0")
        self._url = parse_postgres_url(dsn)
        self._spool = JsonlAuditSink(spool)
        self.chain_id = chain_id or default_chain_id(spool)
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._stop_timeout = stop_timeout
        self._on_backlog = on_backlog
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._deadline = float("inf")  # monotonic time after which a stopping shipper gives up
        self._thread: threading.Thread | None = None
        # Shipper state: touched only by the shipper thread, read elsewhere.
        self._connection: psycopg.Connection[Any] | None = None
        self._reader: BinaryIO | None = None
        self._offset = 0  # spool byte offset of the first record not yet confirmed
        self._confirmed = 0  # highest seq known to be in PostgreSQL
        self._confirmed_sha256 = GENESIS
        self._batches = 0
        self._failure: str | None = None

    def write(self, record: Mapping[str, Any]) -> None:
        """Append to the spool; raises AuditError only if the spool cannot be written."""
        self._spool.write(record)
        if self.backlog >= self._batch_size:
            self._wake.set()

    @property
    def backlog(self) -> int:
        """Spooled records not yet confirmed in PostgreSQL."""
        return self._spool.head[0] - self._confirmed

    @property
    def batches_shipped(self) -> int:
        """INSERT statements committed so far (one per batch)."""
        return self._batches

    @property
    def failure(self) -> str | None:
        """Why the shipper stopped for good, or None while it runs or retries."""
        return self._failure

    def start(self) -> None:
        """Start the shipper thread (once)."""
        if self._thread is not None:
            raise RuntimeError("audit shipper already started")
        self._thread = threading.Thread(target=self._run, name="audit-shipper", daemon=True)
        self._wake.set()  # connect and resume now, not after the first interval
        self._thread.start()

    def close(self) -> None:
        """Ship what is left (bounded by ``stop_timeout``), then close the spool."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._deadline = time.monotonic() + self._stop_timeout
            self._stopping.set()
            self._wake.set()
            thread.join(self._stop_timeout + 1)
            if thread.is_alive():
                log.warning(
                    "audit shipper did not finish within %.1fs; %d records stay in the "
                    "spool and are shipped at the next start",
                    self._stop_timeout,
                    self.backlog,
                )
        self._spool.close()

    def _run(self) -> None:
        retry_at = 0.0
        retry_delay = _FIRST_RETRY_SECONDS
        outage = False
        while True:
            woken = self._wake.wait(self._flush_interval)
            self._wake.clear()
            stopping = self._stopping.is_set()
            if stopping or time.monotonic() >= retry_at:
                try:
                    # A wake-up means a full batch is waiting; the interval ships the rest.
                    self._ship(partial=stopping or not woken)
                except psycopg.Error as exc:
                    self._disconnect()
                    level = logging.DEBUG if outage else logging.WARNING
                    log.log(
                        level,
                        "audit records cannot reach %s (%s: %s); %d wait in the spool",
                        self._url.redacted,
                        type(exc).__name__,
                        self._url.scrub(str(exc).strip()),
                        self.backlog,
                    )
                    outage = True
                    retry_at = time.monotonic() + retry_delay
                    retry_delay = min(retry_delay * 2, _MAX_RETRY_SECONDS)
                except (AuditError, OSError) as exc:
                    self._failure = str(exc)
                    log.error("audit shipping to %s stopped: %s", self._url.redacted, exc)
                    break
                else:
                    if outage:
                        log.info("audit shipping to %s resumed", self._url.redacted)
                    outage = False
                    retry_delay = _FIRST_RETRY_SECONDS
            self._report_backlog()
            if stopping:
                break
        self._report_backlog()
        self._disconnect()
        if self._reader is not None:
            self._reader.close()

    def _ship(self, *, partial: bool) -> None:
        connection = self._connection or self._connect()
        while time.monotonic() < self._deadline:
            available = self.backlog
            if available == 0 or (available < self._batch_size and not partial):
                return
            rows, end = self._read(min(available, self._batch_size))
            if not rows:
                return
            ship_batch(connection, self.chain_id, rows)
            self._batches += 1
            self._offset, self._confirmed = end, rows[-1].seq
            self._confirmed_sha256 = rows[-1].sha256

    def _connect(self) -> psycopg.Connection[Any]:
        """Connect and find where to resume: after the chain's last row in PostgreSQL."""
        connection = psycopg.connect(
            self._url.url,
            connect_timeout=_CONNECT_TIMEOUT_SECONDS,
            application_name="retrieval-gate-audit",
        )
        try:
            ensure_schema(connection)
            last = connection.execute(
                "SELECT seq, sha256 FROM audit_records WHERE chain_id = %s "
                "ORDER BY seq DESC LIMIT 1",
                (self.chain_id,),
            ).fetchone()
            connection.commit()
            seq, sha256 = (int(last[0]), str(last[1])) if last else (0, GENESIS)
            spooled = self._spool.head[0]
            if seq > spooled:
                raise AuditChainConflict(
                    f"chain {self.chain_id}: PostgreSQL holds seq {seq} but the spool "
                    f"{self._spool.path} ends at seq {spooled}: the spool was replaced, "
                    "or another sidecar uses this chain id"
                )
            offset, record = offset_after(self._spool.path, seq)
            if record is not None and record.get("sha256") != sha256:
                raise AuditChainConflict(
                    f"chain {self.chain_id}: seq {seq} in PostgreSQL differs from the spool "
                    f"{self._spool.path}: another sidecar uses this chain id, or one copy "
                    "was rewritten"
                )
        except BaseException:
            connection.close()
            raise
        self._connection = connection
        self._offset, self._confirmed, self._confirmed_sha256 = offset, seq, sha256
        return connection

    def _read(self, count: int) -> tuple[list[AuditRow], int]:
        """Up to ``count`` spool records after the confirmed ones, checked as a chain.

        Returns them and the spool offset after the last one.
        """
        if self._reader is None:
            self._reader = self._spool.path.open("rb")
        self._reader.seek(self._offset)
        rows: list[AuditRow] = []
        seq, prev, end = self._confirmed, self._confirmed_sha256, self._offset
        for _ in range(count):
            raw = self._reader.readline()
            if not raw.endswith(b"\n"):
                break  # still being written: the next pass takes it
            line = raw[:-1]
            where = f"{self._spool.path}: seq {seq + 1}"
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                raise AuditError(f"{where}: not valid JSON") from None
            # Checked here so that a damaged spool is reported, not copied.
            problem = chain_link_problem(where, record, seq + 1, prev, f"seq {seq}")
            if problem is not None:
                raise AuditError(problem)
            rows.append(AuditRow.from_record(record, line.decode()))
            seq, prev, end = seq + 1, str(record["sha256"]), end + len(raw)
        return rows, end

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _report_backlog(self) -> None:
        if self._on_backlog is None:
            return
        try:
            self._on_backlog(self.backlog)
        except Exception:
            log.exception("audit backlog observer failed")


_VERIFY_SQL = """
SELECT chain_id, seq, decision_id, time, sha256, prev_sha256, record
FROM audit_records {where}
ORDER BY chain_id, seq
"""


class _ChainWalk:
    """The state of verifying one chain, row by row."""

    def __init__(self, chain_id: str) -> None:
        self.chain_id = chain_id
        self.count = 0
        self.prev = GENESIS
        self.problem: str | None = None

    def add(self, stored: AuditRow) -> None:
        if self.problem is not None:
            return
        seq = stored.seq
        expected = self.count + 1
        if seq != expected:
            self.problem = f"seq {expected}: missing, the next row is seq {seq} (records removed)"
            return
        where = f"seq {seq}"
        try:
            record = orjson.loads(stored.line)
        except orjson.JSONDecodeError:
            self.problem = f"{where}: not valid JSON"
            return
        self.problem = chain_link_problem(where, record, seq, self.prev, f"seq {seq - 1}")
        if self.problem is None and AuditRow.from_record(record, stored.line) != stored:
            self.problem = f"{where}: columns do not match the record (edited)"
        if self.problem is None:
            self.count += 1
            self.prev = stored.sha256

    def report(self) -> ChainReport:
        return ChainReport(
            self.problem is None, self.count, self.prev, self.problem, chain_id=self.chain_id
        )


def _stored_rows(
    connection: psycopg.Connection[Any], chain_id: str | None
) -> Iterator[tuple[str, AuditRow]]:
    # A server-side cursor: a chain can hold millions of rows.
    with connection.cursor(name="audit_verify") as cursor:
        cursor.itersize = 5000
        if chain_id is None:
            cursor.execute(_VERIFY_SQL.format(where=""))
        else:
            cursor.execute(_VERIFY_SQL.format(where="WHERE chain_id = %s"), (chain_id,))
        for chain, seq, decision_id, at, sha256, prev_sha256, line in cursor:
            yield chain, AuditRow(seq, decision_id, at, sha256, prev_sha256, line)


def verify_postgres_chain(dsn: str, chain_id: str | None = None) -> list[ChainReport]:
    """Check every chain in ``audit_records`` (or only ``chain_id``), one report each.

    Like ``verify_chain``: seqs run from 1 without gaps, each row's digest
    matches its stored line, each ``prev_sha256`` links to the previous row,
    and the columns agree with the line. A requested chain with no rows is
    reported as broken. Deleting a chain's newest rows is only detectable
    against its spool or a logged head digest. Raises ValueError (password
    redacted) for a malformed URL and psycopg.Error when the table cannot be
    read; scrub the latter with ``parse_postgres_url(dsn).scrub`` before showing it.
    """
    url = parse_postgres_url(dsn)
    walks: dict[str, _ChainWalk] = {}
    with psycopg.connect(url.url, connect_timeout=_CONNECT_TIMEOUT_SECONDS) as connection:
        for chain, row in _stored_rows(connection, chain_id):
            walk = walks.get(chain)
            if walk is None:
                walk = walks[chain] = _ChainWalk(chain)
            walk.add(row)
    if chain_id is not None and chain_id not in walks:
        return [ChainReport(False, 0, GENESIS, "no records for this chain", chain_id=chain_id)]
    return [walk.report() for walk in walks.values()]
