"""Durable audit in PostgreSQL: a local spool, shipped in batches to an append-only table.

A decision must be on record before its answer leaves, but a database round
trip per response is too slow and PostgreSQL may be down. So ``write`` only
appends to a local hash-chained JSON Lines spool (``JsonlAuditSink``: one
unbuffered write, which survives SIGKILL of the sidecar) and returns; a shipper
thread copies the spool's new lines to the ``audit_records`` table
(``sidecar.audit.postgres_schema``) with one multi-row INSERT per batch. A
thread rather than an asyncio task, so that reading the spool and waiting on
PostgreSQL never stall the event loop that answers Envoy.

Resume needs no local bookkeeping: after every (re)connect the shipper reads
the chain's highest ``seq`` from PostgreSQL and continues from the spool line
after it, in whichever segment it is, so records written before a crash, or
while PostgreSQL was down, are shipped, and none twice. Lines are checked as a
chain before they are shipped, so a damaged spool is reported, not copied.

The spool is bounded (``sidecar.audit.jsonl``): a sealed segment is deleted
once PostgreSQL is read back to hold every one of its records (their count,
and the last one's sha256), oldest first, never the active file. Records
PostgreSQL has not confirmed are never deleted: when they fill the bound,
writes are refused until shipping resumes.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import psycopg

from sidecar.audit.chain import GENESIS, BrokenChain, ChainWalk
from sidecar.audit.checkpoint_store import CheckpointShipper
from sidecar.audit.jsonl import JsonlAuditSink, SpoolLimits, SpoolObserver
from sidecar.audit.postgres_schema import CONNECT_TIMEOUT_SECONDS, AuditRow, ensure_schema
from sidecar.audit.segments import first_record, last_line, offset_in, sealed_path
from sidecar.audit.sink import AuditError
from sidecar.postgres.dsn import parse_postgres_url

log = logging.getLogger(__name__)

_INSERT_SQL = """
INSERT INTO audit_records (chain_id, seq, decision_id, time, sha256, prev_sha256, record)
SELECT %s::text, * FROM unnest(
    %s::bigint[], %s::text[], %s::timestamptz[], %s::text[], %s::text[], %s::text[]
)
ON CONFLICT (chain_id, seq) DO NOTHING
RETURNING seq
"""

# How many of a segment's seqs the table holds, and the sha256 it holds for the last one.
_CONFIRM_SQL = """
SELECT count(*), max(sha256) FILTER (WHERE seq = %(last)s)
FROM audit_records WHERE chain_id = %(chain)s AND seq BETWEEN %(first)s AND %(last)s
"""

_FIRST_RETRY_SECONDS = 0.2
_MAX_RETRY_SECONDS = 10.0


class AuditChainConflict(AuditError):
    """PostgreSQL holds a different record at a seq of this chain than the spool does."""


def default_chain_id(spool: Path) -> str:
    """``hostname:digest-of-spool-path``: stable for one sidecar and its spool."""
    digest = hashlib.sha256(str(spool.resolve()).encode()).hexdigest()[:12]
    return f"{socket.gethostname()}:{digest}"


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
    can be shipped, and fail only when the spool cannot take them (its bound
    reached while PostgreSQL is away, a full disk). Call ``start`` to run the
    shipper and ``close`` to ship what is left (for at most ``stop_timeout``
    seconds; the rest is shipped by the next start). A shipper that finds the
    spool and the table disagree stops and says so in ``failure`` and the
    log: continuing would hide tampering or two sidecars sharing one chain id.

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
        limits: SpoolLimits | None = None,
        observer: SpoolObserver | None = None,
        batch_size: int = 500,
        flush_interval: float = 0.2,
        stop_timeout: float = 5.0,
        on_backlog: Callable[[int], None] | None = None,
        checkpoints: Path | None = None,
    ) -> None:
        if batch_size < 1 or flush_interval <= 0 or stop_timeout < 0:
            raise ValueError("batch_size and flush_interval must be positive, stop_timeout >= 0")
        self._url = parse_postgres_url(dsn)
        self._spool = JsonlAuditSink(spool, limits, keep_until_shipped=True, observer=observer)
        self.chain_id = chain_id or default_chain_id(spool)
        # The signed checkpoints file beside the spool, shipped after the records it signs.
        self._checkpoints = (
            None if checkpoints is None else CheckpointShipper(checkpoints, self.chain_id)
        )
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
        self._reader_segment = 0  # the segment ``_reader`` reads
        # The first record not yet confirmed: its segment (by first seq) and offset in it.
        # Records of deleted segments were all confirmed, so the oldest segment is the start.
        self._segment = self._spool.segments()[0]
        self._offset = 0
        self._confirmed = self._segment - 1  # highest seq known to be in PostgreSQL
        self._confirmed_sha256 = GENESIS
        self._oldest: tuple[tuple[int, int], float] | None = None  # (position, its record's time)
        self._oldest_unshipped = 0.0
        self._batches = 0
        self._failure: str | None = None

    def write(self, record: Mapping[str, Any]) -> None:
        """Append to the spool; raises AuditError only if the spool cannot take it."""
        self._spool.write(record)
        if self.backlog >= self._batch_size:
            self._wake.set()

    @property
    def backlog(self) -> int:
        """Spooled records not yet confirmed in PostgreSQL."""
        return self._spool.head[0] - self._confirmed

    @property
    def head(self) -> tuple[int, str]:
        """(seq, sha256) of the spool's last record."""
        return self._spool.head

    @property
    def oldest_unshipped(self) -> float:
        """Unix time of the oldest spooled record not yet confirmed in PostgreSQL; 0: none.

        Updated by the shipper after every pass.
        """
        return self._oldest_unshipped

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
        self._close_reader()

    def _ship(self, *, partial: bool) -> None:
        connection = self._connection or self._connect()
        while time.monotonic() < self._deadline:
            available = self.backlog
            if available == 0 or (available < self._batch_size and not partial):
                break
            rows, (segment, offset) = self._read(min(available, self._batch_size))
            if not rows:
                break
            ship_batch(connection, self.chain_id, rows)
            self._batches += 1
            self._segment, self._offset = segment, offset
            self._confirmed, self._confirmed_sha256 = rows[-1].seq, rows[-1].sha256
        if self._checkpoints is not None:
            self._checkpoints.ship(connection, self._confirmed)
        self._delete_shipped(connection)

    def _connect(self) -> psycopg.Connection[Any]:
        """Connect and find where to resume: after the chain's last row in PostgreSQL."""
        # No server-side prepared statements: behind PgBouncer in transaction
        # mode the next batch may run on a session that never prepared them. One
        # INSERT per batch gains nothing from preparing anyway.
        connection = psycopg.connect(
            self._url.url,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            application_name="retrieval-gate-audit",
            prepare_threshold=None,
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
            segment, offset, spooled_sha256 = self._locate(seq)
            if spooled_sha256 != sha256:
                raise AuditChainConflict(
                    f"chain {self.chain_id}: seq {seq} in PostgreSQL differs from the spool "
                    f"{self._spool.path}: another sidecar uses this chain id, or one copy "
                    "was rewritten"
                )
        except BaseException:
            connection.close()
            raise
        self._connection = connection
        if self._checkpoints is not None:
            self._checkpoints.reconnected()
        self._segment, self._offset = segment, offset
        self._confirmed, self._confirmed_sha256 = seq, sha256
        return connection

    def _locate(self, seq: int) -> tuple[int, int, str]:
        """Where the record after ``seq`` starts (segment, offset), and the sha256 the
        spool holds for record ``seq`` (GENESIS for 0)."""
        starts = self._spool.segments()
        segment = max((first for first in starts if first <= seq + 1), default=None)
        if segment is None:
            raise AuditChainConflict(
                f"chain {self.chain_id}: PostgreSQL ends at seq {seq} but the spool "
                f"{self._spool.path} starts at seq {starts[0]}: the records between are in "
                "neither (deleted by retention before shipping was configured, or the spool "
                "belongs to another chain)"
            )
        with self._spool.open_segment(segment) as handle:
            if seq >= segment:
                offset, record = offset_in(handle, seq)
                return segment, offset, str(record.get("sha256"))
            if seq == 0:
                return segment, 0, GENESIS
            # ``seq`` is the last record of the segment before, which may be deleted:
            # the link to it is the first record's prev_sha256.
            first = first_record(handle)
        if first is None:  # the empty active file: ``seq`` is the spool's head
            return segment, 0, self._spool.head[1]
        return segment, 0, str(first.get("prev_sha256"))

    def _read(self, count: int) -> tuple[list[AuditRow], tuple[int, int]]:
        """Up to ``count`` spool records after the confirmed ones, checked as a chain.

        Returns them and the position (segment, offset) after the last one.
        Crosses into the next segment at the end of a sealed one.
        """
        segment, offset = self._segment, self._offset
        rows: list[AuditRow] = []
        walk = ChainWalk(seq=self._confirmed, head=self._confirmed_sha256)
        # Taken before reading: a segment sealed by then is complete, so its end
        # of file is its end; one sealed later is finished by the next pass.
        starts = self._spool.segments()
        while len(rows) < count:
            sealed = segment != starts[-1]
            reader = self._reader_at(segment, offset)
            raw = reader.readline()
            if not raw.endswith(b"\n"):
                if raw and sealed:
                    raise AuditError(f"{reader.name}: unterminated line in a sealed segment")
                if not sealed:
                    break  # still being written: the next pass takes it
                segment, offset = starts[starts.index(segment) + 1], 0
                continue
            line = raw[:-1]
            try:
                # Checked here so that a damaged spool is reported, not copied.
                record = walk.follow(line)
            except BrokenChain as exc:
                raise AuditError(f"{reader.name}: {exc}") from None
            rows.append(AuditRow.from_record(record, line.decode()))
            offset += len(raw)
        return rows, (segment, offset)

    def _reader_at(self, segment: int, offset: int) -> BinaryIO:
        if self._reader is None or self._reader_segment != segment:
            self._close_reader()
            self._reader = self._spool.open_segment(segment)
            self._reader_segment = segment
        self._reader.seek(offset)
        return self._reader

    def _delete_shipped(self, connection: psycopg.Connection[Any]) -> None:
        """Delete the sealed segments whose records PostgreSQL is read back to hold."""
        starts = self._spool.segments()
        for first, following in itertools.pairwise(starts):
            last = following - 1
            if last > self._confirmed:
                return
            path = sealed_path(self._spool.path, first)
            tail = last_line(path)
            expected = orjson.loads(tail)["sha256"] if tail is not None else None
            stored = connection.execute(
                _CONFIRM_SQL, {"chain": self.chain_id, "first": first, "last": last}
            ).fetchone()
            connection.commit()
            if stored is None or stored[0] != last - first + 1 or stored[1] != expected:
                raise AuditChainConflict(
                    f"chain {self.chain_id}: PostgreSQL does not hold every record of "
                    f"{path.name} (seq {first}-{last}) as spooled; the segment is kept"
                )
            if not self._spool.delete_shipped(first):
                return

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _find_oldest_unshipped(self) -> float:
        """The time of the first record not confirmed, read once per position."""
        if self.backlog <= 0:
            return 0.0
        position = (self._segment, self._offset)
        if self._oldest is not None and self._oldest[0] == position:
            return self._oldest[1]
        try:
            raw = self._reader_at(*position).readline()
            at = datetime.fromisoformat(orjson.loads(raw)["time"]).timestamp()
        except (AuditError, OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return time.time()  # being written, or unreadable (shipping reports that)
        self._oldest = (position, at)
        return at

    def _report_backlog(self) -> None:
        self._oldest_unshipped = self._find_oldest_unshipped()
        if self._on_backlog is None:
            return
        try:
            self._on_backlog(self.backlog)
        except Exception:
            log.exception("audit backlog observer failed")
