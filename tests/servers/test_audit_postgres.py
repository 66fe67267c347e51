"""The PostgreSQL audit sink, its append-only table and `audit verify --store`."""

from __future__ import annotations

import argparse
import logging
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psycopg
import pytest

from sidecar.audit.jsonl import JsonlAuditSink
from sidecar.audit.postgres import AuditChainConflict, PostgresAuditSink, ship_batch
from sidecar.audit.postgres_schema import AuditRow, ensure_schema
from sidecar.audit.record import AuditRecord, UpstreamError
from sidecar.audit.verify import verify_chain, verify_postgres_chain
from sidecar.cli.audit import add_verify_arguments, verify
from sidecar.core.modes import Mode
from sidecar.core.outcome import Outcome
from tests.fixtures.postgres import fresh_database

pytestmark = [pytest.mark.timeout(60), pytest.mark.postgres]

TIME = "2024-05-01T12:00:00.123456+00:00"


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture
def dsn(database: str) -> str:
    """The module's database with a new, empty audit table."""
    admin(database, "DROP TABLE IF EXISTS audit_records")  # DROP is not refused; DELETE is
    with psycopg.connect(database) as connection:
        ensure_schema(connection)
    return database


def record(i: int) -> dict[str, object]:
    return {"decision_id": f"d{i}", "time": TIME, "admitted": [f"c{i}"], "latency_ms": 0.125}


def spool_records(spool: Path, n: int, start: int = 0) -> None:
    """Write records to the spool only: a sidecar whose shipper never ran."""
    sink = JsonlAuditSink(spool)
    for i in range(start, start + n):
        sink.write(record(i))
    sink.close()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def rows(dsn: str, chain_id: str | None = None) -> list[tuple[str, int, str]]:
    """(chain_id, seq, decision_id) of every stored row, in order."""
    with psycopg.connect(dsn) as connection:
        return [
            (str(c), int(s), str(d))
            for c, s, d in connection.execute(
                "SELECT chain_id, seq, decision_id FROM audit_records "
                "WHERE %s::text IS NULL OR chain_id = %s ORDER BY chain_id, seq",
                (chain_id, chain_id),
            )
        ]


def admin(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as connection:
        for statement in statements:
            connection.execute(statement)


def test_a_backlog_ships_in_full_batches(tmp_path: Path, dsn: str) -> None:
    spool = tmp_path / "spool.jsonl"
    spool_records(spool, 1000)
    sink = PostgresAuditSink(spool, dsn, chain_id="a", batch_size=500)
    assert sink.backlog == 1000
    sink.start()
    wait_for(lambda: sink.backlog == 0)
    sink.close()
    assert sink.batches_shipped == math.ceil(1000 / 500)
    assert [seq for _, seq, _ in rows(dsn)] == list(range(1, 1001))
    [report] = verify_postgres_chain(dsn)
    assert report.ok and report.records == 1000 and report.chain_id == "a"
    assert report.head_sha256 == verify_chain(spool).head_sha256


def test_live_writes_ship_in_batches_not_one_insert_each(tmp_path: Path, dsn: str) -> None:
    # A long interval: only full batches wake the shipper, so the count is exact.
    sink = PostgresAuditSink(
        tmp_path / "spool.jsonl", dsn, chain_id="a", batch_size=100, flush_interval=30
    )
    sink.start()
    for i in range(1000):
        sink.write(record(i))
    wait_for(lambda: sink.backlog == 0)
    assert sink.batches_shipped == 10
    sink.write(record(1000))
    sink.close()  # ships the partial batch
    assert sink.batches_shipped == 11 and len(rows(dsn)) == 1001


def test_a_lone_record_ships_within_the_flush_interval(tmp_path: Path, dsn: str) -> None:
    sink = PostgresAuditSink(tmp_path / "spool.jsonl", dsn, flush_interval=0.05)
    sink.start()
    sink.write(record(0))
    wait_for(lambda: sink.backlog == 0, timeout=3)
    sink.close()
    assert rows(dsn) == [(sink.chain_id, 1, "d0")]


def test_restart_resumes_after_the_last_shipped_record(tmp_path: Path, dsn: str) -> None:
    spool = tmp_path / "spool.jsonl"
    first = PostgresAuditSink(spool, dsn, flush_interval=30)
    first.start()
    for i in range(30):
        first.write(record(i))
    first.close()
    second = PostgresAuditSink(spool, dsn, flush_interval=30)
    assert second.chain_id == first.chain_id  # the default is stable for one spool
    second.start()
    for i in range(30, 50):
        second.write(record(i))
    second.close()
    assert second.batches_shipped == 1  # only the 20 new records
    assert [d for _, _, d in rows(dsn)] == [f"d{i}" for i in range(50)]
    assert [r.ok for r in verify_postgres_chain(dsn)] == [True]


def test_records_a_shipper_never_shipped_are_shipped_by_the_next_start(
    tmp_path: Path, dsn: str
) -> None:
    spool = tmp_path / "spool.jsonl"
    crashed = PostgresAuditSink(spool, dsn, chain_id="a")
    for i in range(120):
        crashed.write(record(i))  # never started: as if killed before its first batch
    sink = PostgresAuditSink(spool, dsn, chain_id="a", flush_interval=0.02)
    sink.start()
    wait_for(lambda: sink.backlog == 0)
    sink.close()
    assert len(rows(dsn)) == 120
    [report] = verify_postgres_chain(dsn, "a")
    assert report.ok and report.records == 120


WRITER = """
import sys
from pathlib import Path
from sidecar.audit.postgres import PostgresAuditSink

sink = PostgresAuditSink(
    Path(sys.argv[1]), sys.argv[2], chain_id="killed", batch_size=50, flush_interval=0.01
)
sink.start()
i = 0
while True:
    sink.write({"decision_id": f"d{i}"})
    print(f"d{i}", flush=True)  # the answer a client now receives
    i += 1
"""


def test_sigkill_loses_no_decision_a_client_received(tmp_path: Path, dsn: str) -> None:
    spool = tmp_path / "spool.jsonl"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(spool), dsn], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None
    received: list[str] = []
    try:
        for line in writer.stdout:
            received.append(line)
            if len(received) >= 2000:
                break
        wait_for(lambda: len(rows(dsn)) > 0)  # killed while shipping, not before
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    received += writer.stdout.readlines()
    acknowledged = {line.strip() for line in received if line.endswith("\n")}

    sink = PostgresAuditSink(spool, dsn, chain_id="killed", batch_size=500)
    sink.start()
    wait_for(lambda: sink.backlog == 0)
    sink.close()

    stored = rows(dsn, "killed")
    assert acknowledged <= {d for _, _, d in stored}
    [report] = verify_postgres_chain(dsn, "killed")
    spool_report = verify_chain(spool)
    assert report.ok and spool_report.ok
    assert report.records == spool_report.records == len(stored)
    assert report.head_sha256 == spool_report.head_sha256


def test_unreachable_postgres_never_blocks_writes(
    tmp_path: Path, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool.jsonl"
    seen: list[int] = []
    down = PostgresAuditSink(
        spool,
        "postgresql://postgres:s3cret@127.0.0.1:1/nowhere",
        chain_id="a",
        flush_interval=0.02,
        stop_timeout=0.5,
        on_backlog=seen.append,
    )
    down.start()
    started = time.perf_counter()
    for i in range(50):
        down.write(record(i))
    # A bound of seconds (a write that waited for the database would wait out the
    # shipper's retries, up to 10 s each), not a race with a busy CI machine.
    assert time.perf_counter() - started < 2
    wait_for(lambda: 50 in seen)
    assert down.backlog == 50 and down.failure is None
    closing = time.perf_counter()
    down.close()
    assert time.perf_counter() - closing < 2
    assert "s3cret" not in caplog.text and "127.0.0.1" in caplog.text

    up = PostgresAuditSink(spool, dsn, chain_id="a", flush_interval=0.02)
    up.start()
    wait_for(lambda: up.backlog == 0)
    up.close()
    assert len(rows(dsn)) == 50


def test_shipping_resumes_when_postgres_comes_back(
    tmp_path: Path, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    late = dsn + "_late"  # does not exist yet, so connections fail; the sink creates the table
    name = late.rsplit("/", 1)[1]
    caplog.set_level(logging.DEBUG, logger="sidecar.audit.postgres")
    sink = PostgresAuditSink(tmp_path / "spool.jsonl", late, chain_id="a", flush_interval=0.02)
    sink.start()
    try:
        for i in range(10):
            sink.write(record(i))
        # Polled, not slept: a shipping attempt failed with all ten waiting.
        wait_for(lambda: "10 wait in the spool" in caplog.text)
        assert sink.backlog == 10
        admin(dsn, f'CREATE DATABASE "{name}"')
        wait_for(lambda: sink.backlog == 0)
        sink.close()
        assert len(rows(late)) == 10
    finally:
        sink.close()
        admin(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_killed_connection_is_replaced_without_loss_or_duplicates(
    tmp_path: Path, dsn: str
) -> None:
    sink = PostgresAuditSink(tmp_path / "spool.jsonl", dsn, chain_id="a", flush_interval=0.02)
    sink.start()
    sink.write(record(0))
    wait_for(lambda: sink.backlog == 0)
    admin(
        dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'retrieval-gate-audit' AND datname = current_database()",
    )
    for i in range(1, 20):
        sink.write(record(i))
    wait_for(lambda: sink.backlog == 0)
    sink.close()
    assert [seq for _, seq, _ in rows(dsn)] == list(range(1, 21))


def spool_rows(spool: Path) -> list[AuditRow]:
    import orjson

    return [
        AuditRow.from_record(orjson.loads(line), line.decode())
        for line in spool.read_bytes().splitlines()
    ]


def test_shipping_a_batch_again_neither_fails_nor_duplicates(tmp_path: Path, dsn: str) -> None:
    spool_records(tmp_path / "ours.jsonl", 10)
    spool_records(tmp_path / "other.jsonl", 10, start=100)
    ours, other = spool_rows(tmp_path / "ours.jsonl"), spool_rows(tmp_path / "other.jsonl")
    with psycopg.connect(dsn) as connection:
        ensure_schema(connection)
        assert ship_batch(connection, "a", ours[:5]) == 5
        # Committed, but the acknowledgement was lost: the shipper sends it again.
        assert ship_batch(connection, "a", ours[:8]) == 3
        with pytest.raises(AuditChainConflict, match="seq 7 in PostgreSQL differs"):
            ship_batch(connection, "a", other[6:10])
    assert [seq for _, seq, _ in rows(dsn)] == list(range(1, 9))  # 9 and 10 rolled back


def test_the_table_refuses_update_delete_and_truncate(tmp_path: Path, dsn: str) -> None:
    spool_records(tmp_path / "spool.jsonl", 3)
    sink = PostgresAuditSink(tmp_path / "spool.jsonl", dsn, chain_id="a", flush_interval=0.02)
    sink.start()
    wait_for(lambda: sink.backlog == 0)
    sink.close()
    for statement in (
        "UPDATE audit_records SET decision_id = 'forged' WHERE seq = 2",
        "DELETE FROM audit_records WHERE seq = 3",
        "TRUNCATE audit_records",
    ):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            admin(dsn, statement)
    assert len(rows(dsn)) == 3


def shipped(tmp_path: Path, dsn: str, chain_id: str, n: int) -> Path:
    spool = tmp_path / f"{chain_id}.jsonl"
    spool_records(spool, n)
    sink = PostgresAuditSink(spool, dsn, chain_id=chain_id, flush_interval=0.02)
    sink.start()
    wait_for(lambda: sink.backlog == 0)
    sink.close()
    return spool


@pytest.mark.parametrize(
    ("tampering", "problem"),
    [
        (
            "UPDATE audit_records SET record = replace(record, '\"c2\"', '\"c9\"') WHERE seq = 3",
            "seq 3: content does not match its sha256 (edited)",
        ),
        (
            "DELETE FROM audit_records WHERE seq = 2",
            "seq 2: missing, the next row is seq 3 (records removed)",
        ),
        (
            "UPDATE audit_records SET decision_id = 'd7' WHERE seq = 4",
            "seq 4: columns do not match the record (edited)",
        ),
        (
            "UPDATE audit_records SET time = time + interval '1 hour' WHERE seq = 4",
            "seq 4: columns do not match the record (edited)",
        ),
    ],
)
def test_tampering_is_named_by_seq(tmp_path: Path, dsn: str, tampering: str, problem: str) -> None:
    shipped(tmp_path, dsn, "a", 5)
    admin(dsn, "ALTER TABLE audit_records DISABLE TRIGGER USER", tampering)
    [report] = verify_postgres_chain(dsn)
    assert not report.ok and report.problem == problem


def test_each_chain_in_a_shared_table_is_verified_on_its_own(tmp_path: Path, dsn: str) -> None:
    shipped(tmp_path, dsn, "sidecar-1", 4)
    shipped(tmp_path, dsn, "sidecar-2", 6)
    admin(
        dsn,
        "ALTER TABLE audit_records DISABLE TRIGGER USER",
        "DELETE FROM audit_records WHERE chain_id = 'sidecar-2' AND seq = 1",
    )
    one, two = verify_postgres_chain(dsn)
    assert (one.chain_id, one.ok, one.records) == ("sidecar-1", True, 4)
    assert (two.chain_id, two.ok, two.problem) == (
        "sidecar-2",
        False,
        "seq 1: missing, the next row is seq 2 (records removed)",
    )
    assert [r.chain_id for r in verify_postgres_chain(dsn, "sidecar-1")] == ["sidecar-1"]
    [unknown] = verify_postgres_chain(dsn, "sidecar-3")
    assert not unknown.ok and unknown.problem == "no records for this chain"


def test_a_replaced_spool_stops_shipping_loudly(
    tmp_path: Path, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    shipped(tmp_path, dsn, "a", 5)
    spool = tmp_path / "new.jsonl"
    spool_records(spool, 2, start=50)
    sink = PostgresAuditSink(spool, dsn, chain_id="a", flush_interval=0.02)
    sink.start()
    wait_for(lambda: sink.failure is not None)
    sink.write(record(99))  # the spool still takes records
    sink.close()
    assert sink.failure is not None and "the spool was replaced" in sink.failure
    assert any(r.levelno == logging.ERROR for r in caplog.records)
    assert len(rows(dsn)) == 5


def test_a_different_record_at_the_resume_point_stops_shipping(tmp_path: Path, dsn: str) -> None:
    shipped(tmp_path, dsn, "a", 5)
    spool = tmp_path / "other.jsonl"
    spool_records(spool, 7, start=50)
    sink = PostgresAuditSink(spool, dsn, chain_id="a", flush_interval=0.02)
    sink.start()
    wait_for(lambda: sink.failure is not None)
    sink.close()
    assert sink.failure is not None and "seq 5 in PostgreSQL differs" in sink.failure
    assert len(rows(dsn)) == 5


def test_a_damaged_spool_is_reported_not_shipped(tmp_path: Path, dsn: str) -> None:
    spool = tmp_path / "spool.jsonl"
    spool_records(spool, 3)
    lines = spool.read_bytes().splitlines()
    lines[1] = lines[1].replace(b'"c1"', b'"c9"')
    spool.write_bytes(b"\n".join(lines) + b"\n")
    sink = PostgresAuditSink(spool, dsn, chain_id="a", flush_interval=0.02)
    sink.start()
    wait_for(lambda: sink.failure is not None)
    sink.close()
    assert sink.failure == f"{spool}: seq 2: content does not match its sha256 (edited)"
    assert rows(dsn) == []


def run_verify(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_verify_arguments(parser)
    return verify(parser.parse_args(argv))


def test_verify_command_on_the_store(
    tmp_path: Path, dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped(tmp_path, dsn, "a", 3)
    assert run_verify("--store", dsn) == 0
    assert "ok: chain a: 3 records, chain intact" in capsys.readouterr().out
    admin(
        dsn,
        "ALTER TABLE audit_records DISABLE TRIGGER USER",
        "DELETE FROM audit_records WHERE seq = 2",
    )
    assert run_verify("--store", dsn, "--chain", "a") == 1
    assert "BROKEN chain a after 1 good records: seq 2: missing" in capsys.readouterr().err


def test_verify_command_never_prints_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_verify("--store", "postgresql://auditor:s3cret@127.0.0.1:1/audit") == 1
    err = capsys.readouterr().err
    assert "s3cret" not in err
    assert "postgresql://auditor:***@127.0.0.1:1/audit" in err


def test_a_malformed_url_is_refused_without_echoing_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    malformed = "postgresql://auditor:s3cret@db.internal/audit?no_such_option=1"
    with pytest.raises(ValueError, match="cannot be parsed") as caught:
        PostgresAuditSink(tmp_path / "spool.jsonl", malformed)
    assert "s3cret" not in str(caught.value)
    assert run_verify("--store", malformed) == 2
    assert "s3cret" not in capsys.readouterr().err


# Upstream errors as records keep them: a non-2xx body (bounded, U+FFFD for bad
# bytes), and an error a database reported inside a 2xx answer, with its code.
UPSTREAM_ERRORS = {
    "http": UpstreamError.from_body(500, b'{"error":"near \'it\\u00e9s\'\n\xff"}' + b"x" * 2000),
    "reported": UpstreamError.from_text(
        200, "milvus:1100", 'cannot parse expression: tenant == "acme", near: ' + "é" * 900
    ),
}


@pytest.mark.parametrize(
    ("kind", "edit"),
    [("http", ("near", "far")), ("reported", ("near", "far")), ("reported", ("1100", "1101"))],
)
def test_an_upstream_error_record_ships_and_verifies_and_cannot_be_edited(
    tmp_path: Path, dsn: str, kind: str, edit: tuple[str, str]
) -> None:
    upstream = UPSTREAM_ERRORS[kind]
    error = AuditRecord(
        decision_id="d-up",
        request_id="r",
        time=datetime(2024, 5, 1, 12, tzinfo=UTC),
        tenant="acme",
        principals_sha256="ab" * 32,
        format="qdrant",
        mode=Mode.ENFORCE,
        outcome=Outcome.ERROR,
        latency_ms=0.1,
        error="upstream_error",
        upstream=upstream,
    )
    spool = tmp_path / "spool.jsonl"
    JsonlAuditSink(spool).write(error.to_dict())
    sink = PostgresAuditSink(spool, dsn, chain_id="a", flush_interval=0.02)
    sink.start()
    wait_for(lambda: sink.backlog == 0)
    sink.close()
    [report] = verify_postgres_chain(dsn)
    assert report.ok and report.records == 1
    with psycopg.connect(dsn) as connection:
        (line,) = connection.execute("SELECT record FROM audit_records").fetchone() or ("",)
    shipped = orjson.loads(line)
    assert (shipped["upstream_code"], shipped["upstream_text"]) == (upstream.code, upstream.text)
    admin(
        dsn,
        "ALTER TABLE audit_records DISABLE TRIGGER USER",
        f"UPDATE audit_records SET record = replace(record, '{edit[0]}', '{edit[1]}')",
    )
    [report] = verify_postgres_chain(dsn)
    assert report.problem == "seq 1: content does not match its sha256 (edited)"
