"""PostgreSQL stopped mid-traffic, through a real Envoy: reject, never admit; recover alone.

Stops and restarts the machine's real PostgreSQL server (pg_ctlcluster, as
root, as on the CI machines), so it lives in its own module and always
restarts the server, even when an assertion fails. On a machine whose
PostgreSQL others use, point RETRIEVAL_GATE_TEST_PG at a cluster of its own
(tests/fixtures/postgres.py, ``local_cluster``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import GateStack, search_ids
from tests.fixtures.postgres import (
    control_cluster,
    fresh_database,
    local_cluster,
    postgres_available,
)
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.servers import server_missing

pytestmark = [pytest.mark.envoy, pytest.mark.postgres]

SEARCH = "/collections/docs/points/search"
OUTAGE_S = 4.0


@pytest.fixture
def stoppable() -> Iterator[None]:
    if local_cluster() is None:
        server_missing("needs a local PostgreSQL cluster this user can stop (pg_ctlcluster, root)")
    try:
        yield
    finally:
        if postgres_available() is not None:
            control_cluster("start")


def _reasons(gate: GateStack, decision_id: str) -> dict[str, list[str]]:
    record = next(r for r in gate.audit_records() if r["decision_id"] == decision_id)
    return {r["chunk_id"]: r["reasons"] for r in record["rejected"]}


def test_store_down_rejects_after_expiry_and_recovers_without_restart(
    tmp_path: Path, stoppable: None
) -> None:
    with fresh_database() as database:
        gate = GateStack(
            tmp_path,
            [record_dict("1"), record_dict("2")],
            store_url=database,
            config={"cache_ttl_seconds": 1, "negative_cache_ttl_seconds": 1},
        ).start()
        try:
            points = [qb.point(i, text_for(str(i))) for i in (1, 2)]
            gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(points))))
            assert search_ids(gate.search(SEARCH)) == [1, 2]

            control_cluster("stop")
            stopped = time.monotonic()
            # Until the cached entries expire (TTL 1 s) they may still answer;
            # after that every response abstains, for as long as the outage lasts
            # (4 s: psycopg_pool alone would retry at about 1, 3 and 7 s).
            abstained = 0
            while time.monotonic() - stopped < OUTAGE_S or abstained < 3:
                response = gate.search(SEARCH)
                assert response.status == 200
                if search_ids(response):
                    assert abstained == 0  # a cached answer, before the first abstention
                    assert time.monotonic() - stopped < 5
                    continue
                abstained += 1
                decision_id = response.headers["x-retrieval-gate-decision-id"]
                reasons = _reasons(gate, decision_id)
                assert reasons == {"1": ["METADATA_UNAVAILABLE"], "2": ["METADATA_UNAVAILABLE"]}
                time.sleep(0.05)
            assert gate.metric("retrieval_gate_store_errors_total") >= 1

            control_cluster("start")  # returns once the server accepts connections
            back = time.monotonic()
            admitted: list[int] = []
            while time.monotonic() - back < 30 and admitted != [1, 2]:
                admitted = search_ids(gate.search(SEARCH))
                if admitted != [1, 2]:
                    time.sleep(0.02)
            recovered_s = time.monotonic() - back
            assert admitted == [1, 2]  # same sidecar process, no restart
            # Within a second of the server's return (psycopg_pool's own schedule
            # took seconds; docs/postgresql.md, "After an outage").
            assert recovered_s < 1.0
        finally:
            if postgres_available() is not None:
                control_cluster("start")  # before the database is dropped
            gate.stop()
