"""The bounded audit spool with real PostgreSQL: shipped segments are deleted only once
read back from the table, unshipped ones never, and the chain verifies across the
table and the segments that remain (`audit verify --store URL --chain ID FILE`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psycopg
import pytest

from sidecar.audit.jsonl import JsonlAuditSink, SpoolLimits
from sidecar.audit.postgres import PostgresAuditSink
from sidecar.audit.postgres_schema import ensure_schema
from sidecar.audit.segments import in_chain_order, log_files, sealed_segments
from sidecar.audit.sink import AuditError
from sidecar.audit.verify import verify_postgres_chain, verify_store_and_segments
from sidecar.cli import main
from sidecar.metrics import GateMetrics
from tests.fixtures.postgres import fresh_database

pytestmark = [pytest.mark.timeout(60), pytest.mark.postgres]

SEGMENT = 4096
BOUND = 4 * SEGMENT


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture
def dsn(database: str) -> str:
    """The module's database with a new, empty audit table."""
    with psycopg.connect(database, autocommit=True) as connection:
        connection.execute("DROP TABLE IF EXISTS audit_records")
        ensure_schema(connection)
    return database


def record(i: int) -> dict[str, object]:
    # The shape of a real record, ~700 bytes chained: six fill a 4 KiB segment.
    return {
        "decision_id": f"d{i:06d}",
        "time": datetime.now(UTC).isoformat(timespec="microseconds"),
        "tenant": "acme",
        "principals_sha256": "9" * 64,
        "format": "qdrant",
        "mode": "enforce",
        "outcome": "filtered",
        "policy_version": "sha256:" + "a" * 16,
        "candidates": [f"chunk-{i}-{n}" for n in range(10)],
        "admitted": [f"chunk-{i}-{n}" for n in range(0, 10, 2)],
        "rejected": [{"position": n, "reasons": ["EXPIRED"]} for n in range(1, 10, 2)],
        "latency_ms": 1.25,
    }


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def table_seqs(dsn: str, chain_id: str) -> list[int]:
    with psycopg.connect(dsn) as connection:
        return [
            int(seq)
            for (seq,) in connection.execute(
                "SELECT seq FROM audit_records WHERE chain_id = %s ORDER BY seq", (chain_id,)
            )
        ]


def spool_bytes(spool: Path) -> int:
    total = 0
    for path in log_files(spool):
        with contextlib.suppress(FileNotFoundError):  # the shipper deletes as we look
            total += path.stat().st_size
    return total


def sample(metrics: GateMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, name
    return value


def test_a_spool_filled_ten_times_over_stays_bounded_and_loses_nothing(
    tmp_path: Path, dsn: str
) -> None:
    spool = tmp_path / "spool.jsonl"
    metrics = GateMetrics()
    limits = SpoolLimits(segment_bytes=SEGMENT, max_spool_bytes=BOUND)
    sink = PostgresAuditSink(
        spool,
        dsn,
        chain_id="bound",
        limits=limits,
        observer=metrics,
        batch_size=20,
        flush_interval=0.01,
    )
    sink.start()
    written = refused = i = 0
    largest = 0
    started = time.monotonic()
    while written < 10 * BOUND:
        try:
            sink.write(record(i))
        except AuditError as exc:
            # Shipping fell behind for a moment: refused (the client would get
            # audit_unavailable), not lost; the same decision is tried again.
            assert "audit spool full" in str(exc)
            refused += 1
            time.sleep(0.005)
            continue
        written += len(orjson.dumps(record(i))) + 120  # ~ the chain fields and newline
        i += 1
        largest = max(largest, spool_bytes(spool))
        assert largest <= BOUND
    wait_for(lambda: sink.backlog == 0)
    sink.close()
    elapsed = time.monotonic() - started

    seqs = table_seqs(dsn, "bound")
    assert seqs == list(range(1, i + 1))  # every record, once, none lost
    assert sink.failure is None
    assert spool_bytes(spool) <= BOUND < 10 * BOUND <= written
    deleted = sample(metrics, "retrieval_gate_audit_segments_deleted_total", reason="shipped")
    assert deleted >= 10
    assert sample(metrics, "retrieval_gate_audit_spool_bytes") == spool_bytes(spool)
    files = in_chain_order(log_files(spool))
    assert files and len(files) <= BOUND // SEGMENT
    across = verify_store_and_segments(dsn, "bound", files)
    assert across.ok and across.records == i, across.problem
    print(f"{i} records, {refused} refusals, {deleted:.0f} segments deleted, {elapsed:.1f}s")


def test_postgres_down_deletes_nothing_and_the_bound_refuses_records(
    tmp_path: Path, dsn: str
) -> None:
    spool = tmp_path / "spool.jsonl"
    late = dsn + "_late"  # no such database yet: every connection fails
    name = late.rsplit("/", 1)[1]
    metrics = GateMetrics()
    limits = SpoolLimits(segment_bytes=SEGMENT, max_spool_bytes=BOUND)
    first_time = datetime.now(UTC)
    down = PostgresAuditSink(
        spool,
        late,
        chain_id="down",
        limits=limits,
        observer=metrics,
        flush_interval=0.01,
        stop_timeout=0.5,
    )
    down.start()
    with pytest.raises(AuditError, match="audit spool full"):
        for i in range(1000):
            down.write(record(i))
    full = down.backlog
    assert full > 0 and len(sealed_segments(spool)) >= 2
    wait_for(lambda: down.oldest_unshipped > 0)
    assert abs(down.oldest_unshipped - first_time.timestamp()) < 1
    files = {path: path.read_bytes() for path in log_files(spool)}
    time.sleep(0.1)  # several shipper passes: nothing is deleted without PostgreSQL
    with pytest.raises(AuditError):
        down.write(record(full))
    down.close()
    assert {path: path.read_bytes() for path in log_files(spool)} == files
    assert metrics.registry.get_sample_value(
        "retrieval_gate_audit_segments_deleted_total", {"reason": "shipped"}
    ) in (None, 0.0)

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        up = PostgresAuditSink(spool, late, chain_id="down", limits=limits, flush_interval=0.01)
        up.start()
        wait_for(lambda: up.backlog == 0 and len(sealed_segments(spool)) == 0)
        wait_for(lambda: up.oldest_unshipped == 0)
        up.write(record(full))  # room again
        wait_for(lambda: up.backlog == 0)
        up.close()
        assert table_seqs(late, "down") == list(range(1, full + 2))
    finally:
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_restart_resumes_shipping_across_segments(tmp_path: Path, dsn: str) -> None:
    spool = tmp_path / "spool.jsonl"
    limits = SpoolLimits(segment_bytes=SEGMENT)
    sink = PostgresAuditSink(spool, dsn, chain_id="resume", limits=limits, flush_interval=0.01)
    sink.start()
    for i in range(15):
        sink.write(record(i))
    wait_for(lambda: sink.backlog == 0)
    sink.close()
    # Written while no shipper ran: several segments wait.
    offline = JsonlAuditSink(spool, limits, keep_until_shipped=True)
    for i in range(15, 60):
        offline.write(record(i))
    offline.close()
    assert len(sealed_segments(spool)) >= 3
    again = PostgresAuditSink(spool, dsn, chain_id="resume", limits=limits, flush_interval=0.01)
    again.start()
    wait_for(lambda: again.backlog == 0)
    again.close()
    assert table_seqs(dsn, "resume") == list(range(1, 61))
    [table] = verify_postgres_chain(dsn, "resume")
    assert table.ok and table.records == 60
    # Every sealed segment was confirmed and deleted; the active file remains.
    assert sealed_segments(spool) == []


def test_a_spool_whose_beginning_never_reached_postgres_stops_shipping(
    tmp_path: Path, dsn: str
) -> None:
    spool = tmp_path / "spool.jsonl"
    # Retention (no store configured then) deleted the first segments.
    alone = JsonlAuditSink(spool, SpoolLimits(segment_bytes=SEGMENT, max_spool_bytes=2 * SEGMENT))
    for i in range(40):
        alone.write(record(i))
    alone.close()
    first = sealed_segments(spool)[0][0]
    sink = PostgresAuditSink(spool, dsn, chain_id="gap", flush_interval=0.01)
    sink.start()
    wait_for(lambda: sink.failure is not None)
    sink.close()
    assert f"starts at seq {first}" in (sink.failure or "")
    assert "in neither" in (sink.failure or "")
    assert table_seqs(dsn, "gap") == []


def test_verify_across_the_table_and_the_remaining_segments(
    tmp_path: Path, dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = tmp_path / "spool.jsonl"
    limits = SpoolLimits(segment_bytes=SEGMENT)
    sink = PostgresAuditSink(spool, dsn, chain_id="v", limits=limits, flush_interval=0.01)
    sink.start()
    for i in range(30):
        sink.write(record(i))
    wait_for(lambda: sink.backlog == 0)
    sink.close()
    # More records that never reached the table, in segments of their own.
    offline = JsonlAuditSink(spool, limits, keep_until_shipped=True)
    for i in range(30, 50):
        offline.write(record(i))
    offline.close()
    assert main(["audit", "verify", "--store", dsn, "--chain", "v", str(spool)]) == 0
    assert "ok: chain v: 50 records, chain intact" in capsys.readouterr().out

    # A record the table also holds, edited in the file: the copies disagree.
    oldest = in_chain_order(log_files(spool))[0]
    content = oldest.read_bytes().splitlines()
    assert orjson.loads(content[0])["seq"] <= 30
    edited = content[0].replace(b'"acme"', b'"evil"')
    oldest.write_bytes(b"\n".join([edited, *content[1:]]) + b"\n")
    assert main(["audit", "verify", "--store", dsn, "--chain", "v", str(spool)]) == 1
    assert "differs from the table's record (edited)" in capsys.readouterr().err
    oldest.write_bytes(b"\n".join(content) + b"\n")

    # A segment after the table's end removed: those records are nowhere.
    later = [path for first, path in sealed_segments(spool) if first > 31]
    assert later
    later[0].unlink()
    report = verify_store_and_segments(dsn, "v", in_chain_order(log_files(spool)))
    assert not report.ok and report.problem is not None
    assert "records removed or reordered" in report.problem or "in neither" in report.problem
