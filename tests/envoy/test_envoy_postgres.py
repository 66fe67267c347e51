"""The PostgreSQL store through a real Envoy: live revocation, outages, signatures, audit.

Runs against the machine's real PostgreSQL (a fresh database per module, see
tests/fixtures/postgres.py; `.ci/run` starts the server). The cache TTL is an
hour in most tests, so a change that shows up in the next response can only
have come from the change notification, never from expiry.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sidecar.core.integrity import canonical_sha256
from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import CLI, GateStack, search_ids, wait_until, write_records
from tests.fixtures.postgres import fresh_database
from tests.fixtures.records import record_dict, text_for

pytestmark = [pytest.mark.envoy, pytest.mark.postgres]

SEARCH = "/collections/docs/points/search"
IDS = [1, 2, 3, 4, 5, 6]
RECORDS = [record_dict(str(i)) for i in IDS[:-1]] + [
    record_dict("6", requires_signature=True, doc_id="SOP-6", version="2")
]


def sql(url: str, statement: str) -> None:
    """Run SQL with plain psql, as an operator's tool would (not through our code)."""
    subprocess.run(["psql", url, "-v", "ON_ERROR_STOP=1", "-q", "-c", statement], check=True)


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, database: str) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("postgres"),
        RECORDS,
        store_url=database,
        config={
            "cache_ttl_seconds": 3600,
            "negative_cache_ttl_seconds": 3600,
            "audit_store": database,
            "routes": {"/collections/current/": {"substitute_superseded": True}},
        },
    ).start()
    points = [qb.point(i, text_for(str(i))) for i in IDS]
    for collection in ("docs", "current"):
        gate.upstream.respond(
            "POST",
            f"/collections/{collection}/points/search",
            CannedResponse(qb.encode(qb.search_body(points))),
        )
    yield gate
    gate.stop()


def served(stack: GateStack) -> list[int]:
    """The point ids the gate releases of the search (every point, in order, upstream)."""
    return search_ids(stack.search(SEARCH))


def assert_served_becomes(stack: GateStack, expected: list[int]) -> None:
    """Wait until exactly ``expected`` is released: a change withdraws (or restores)
    its chunk and leaves every other one served. Absence alone would also hold for
    a gate that withholds everything after a change."""
    last: list[list[int]] = []

    def exactly() -> bool:
        last[:] = [served(stack)]
        return last[0] == expected

    assert wait_until(exactly), f"served {last[0]}, expected {expected}"


def test_revocation_from_plain_psql_reaches_the_next_responses(
    stack: GateStack, database: str
) -> None:
    # The first test of the module: every chunk but 6 (unsigned) is admitted,
    # and now cached for an hour.
    assert served(stack) == [1, 2, 3, 4, 5]
    started = time.monotonic()
    sql(database, "UPDATE chunks SET status = 'revoked' WHERE chunk_id = '1'")
    assert_served_becomes(stack, [2, 3, 4, 5])
    print(f"revocation visible through Envoy after {time.monotonic() - started:.3f} s")
    assert stack.metric("retrieval_gate_cache_invalidations_total") >= 1


def test_killed_listen_connection_flushes_the_cache(stack: GateStack, database: str) -> None:
    before = served(stack)
    assert 2 in before
    flushes = stack.metric("retrieval_gate_cache_flushes_total")
    with psycopg.connect(database, autocommit=True) as connection:
        connection.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        # Changed while nobody listens: this notification is lost.
        connection.execute("UPDATE chunks SET status = 'quarantined' WHERE chunk_id = '2'")
    assert wait_until(lambda: stack.metric("retrieval_gate_cache_flushes_total") >= flushes + 2)
    assert served(stack) == [i for i in before if i != 2]


def test_signature_required_then_signed(stack: GateStack, database: str) -> None:
    record = stack.search(SEARCH)
    before = search_ids(record)
    assert before and 6 not in before
    decision = stack.audit_records()[-1]
    assert {"chunk_id": "6", "position": 5, "reasons": ["SIGNATURE_MISSING"]} in decision[
        "rejected"
    ]
    sql(
        database,
        "INSERT INTO electronic_signatures (doc_id, version, signer, meaning, signed_at) "
        "VALUES ('SOP-6', '2', 'qa-lead', 'approval', now())",
    )
    assert_served_becomes(stack, [*before, 6])
    sql(database, "UPDATE electronic_signatures SET is_valid = false WHERE doc_id = 'SOP-6'")
    assert_served_becomes(stack, before)


def test_supersede_with_the_cli_and_substitute(stack: GateStack, database: str) -> None:
    new_text = "Chunk 3, second revision."
    successor = record_dict(
        "33", doc_id="doc-3", version="2", text=new_text, sha256=canonical_sha256(new_text)
    )
    before = served(stack)
    assert 3 in before
    # Two approved versions of doc-3 at once would be refused: the successor comes in
    # as a draft, takes over, then is approved.
    draft = write_records(stack.workdir / "draft.jsonl", [{**successor, "status": "draft"}])
    subprocess.run([*CLI, "store", "load", "--store", database, str(draft)], check=True)
    subprocess.run([*CLI, "store", "supersede", "3", "--by", "33", "--store", database], check=True)
    path = write_records(stack.workdir / "successor.jsonl", [successor])
    subprocess.run([*CLI, "store", "load", "--store", database, str(path)], check=True)
    assert_served_becomes(stack, [i for i in before if i != 3])
    substituted = stack.search("/collections/current/points/search").json()["result"]
    hit = next(h for h in substituted if h["id"] == 33)
    assert hit["payload"]["text"] == new_text


def test_audit_trail_reaches_postgres_and_verifies(stack: GateStack, database: str) -> None:
    decision_id = stack.search(SEARCH).headers["x-retrieval-gate-decision-id"]

    def shipped() -> bool:
        with psycopg.connect(database) as connection:
            row = connection.execute(
                "SELECT count(*) FROM audit_records WHERE decision_id = %s", (decision_id,)
            ).fetchone()
        return row is not None and row[0] == 1

    assert wait_until(shipped)
    done = subprocess.run(
        [*CLI, "audit", "verify", "--store", database], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_sigkill_under_load_loses_no_returned_decision(tmp_path: Path) -> None:
    with fresh_database() as database:
        gate = GateStack(
            tmp_path, RECORDS, store_url=database, config={"audit_store": database}
        ).start()
        try:
            points = [qb.point(i, text_for(str(i))) for i in IDS]
            gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(points))))
            received: list[str] = []
            stop = threading.Event()

            def load() -> None:
                while not stop.is_set():
                    response = gate.search(SEARCH)
                    if response.status == 200:
                        received.append(response.headers["x-retrieval-gate-decision-id"])

            workers = [threading.Thread(target=load) for _ in range(4)]
            for worker in workers:
                worker.start()
            # Polled, not slept: traffic is flowing once answers come back.
            assert wait_until(lambda: len(received) > 20, timeout=30)
            gate.kill_sidecar()  # SIGKILL, mid-traffic
            stop.set()
            for worker in workers:
                worker.join()
            assert len(received) > 20
            gate.start_sidecar()  # the restart ships what the killed one had spooled

            def all_shipped() -> bool:
                with psycopg.connect(database) as connection:
                    rows = connection.execute("SELECT decision_id FROM audit_records").fetchall()
                return set(received) <= {row[0] for row in rows}

            assert wait_until(all_shipped, timeout=30)
            done = subprocess.run(
                [*CLI, "audit", "verify", "--store", database], capture_output=True, text=True
            )
            assert done.returncode == 0, done.stdout + done.stderr
        finally:
            gate.stop()
