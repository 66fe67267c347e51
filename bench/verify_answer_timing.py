"""Benchmark: what Gate/VerifyAnswer of a 10-claim answer costs at the gate.

Not a test. Runs a real `retrieval-gate serve` (identity ``jwt``, SQLite
metadata store, PostgreSQL audit store with its spool) from
tests/fixtures/verify_answer.py, makes one retrieval through Gate/Filter, then
verifies a 10-claim answer (each claim citing one or two of the three
admitted chunks with one or two quotes) ``--rounds`` times, twice:

- ``memory``: the decision is among those the process recorded (the usual
  case: an answer is checked seconds after its retrieval);
- ``postgres``: after a restart of the sidecar, so that every call reads the
  decision from the ``audit_records`` table.

Reports, per case, the median and 95th percentile of the gate's own time (the
``latency_ms`` each verification's audit record holds: decision lookup, store
lookup, check, audit write) and of the client's round trip over the Unix
socket, in milliseconds.

Usage: .venv/bin/python bench/verify_answer_timing.py [--rounds 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
import psycopg  # noqa: E402

from sidecar.integrations.client import ClaimToVerify, GateClient  # noqa: E402
from tests.fixtures.harness import GateStack, wait_until  # noqa: E402
from tests.fixtures.postgres import fresh_database  # noqa: E402
from tests.fixtures.records import text_for  # noqa: E402
from tests.fixtures.verify_answer import ADMITTED, RETRIEVED, jwt, verify_stack  # noqa: E402

CLAIMS = [
    ClaimToVerify(
        tuple(ADMITTED[(n + k) % 3] for k in range(1 + n % 2)),
        tuple(["handle with care.", "Second line."][: 1 + n % 2]),
    )
    for n in range(10)
]


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 3),
        "p95": round(ordered[int(len(ordered) * 0.95) - 1], 3),
    }


def _measure(stack: GateStack, decision_id: str, rounds: int) -> dict[str, object]:
    client = GateClient(f"unix:{stack.gate_socket}", timeout_seconds=10)
    chunks = [(chunk_id, text_for(chunk_id)) for chunk_id in ADMITTED]
    token = jwt()
    ids: list[str] = []
    round_trips: list[float] = []
    try:
        for _ in range(20):  # warm-up: connections, caches
            client.verify_answer([decision_id], CLAIMS, chunks, token)
        for _ in range(rounds):
            started = time.perf_counter()
            verification = client.verify_answer([decision_id], CLAIMS, chunks, token)
            round_trips.append((time.perf_counter() - started) * 1000)
            assert verification.supported, verification
            ids.append(verification.verification_id)
    finally:
        client.close()
    wanted = set(ids)
    at_gate = [
        float(record["latency_ms"])
        for line in stack.audit_log.read_bytes().splitlines()
        if (record := orjson.loads(line)).get("decision_id") in wanted
    ]
    return {"gate_ms": _quantiles(at_gate), "round_trip_ms": _quantiles(round_trips)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir, fresh_database() as database:
        stack = verify_stack(Path(workdir), audit_store=database).start()
        try:
            client = GateClient(f"unix:{stack.gate_socket}", timeout_seconds=10)
            decision_id = client.filter(RETRIEVED, jwt()).decision_id
            client.close()
            results = {"memory": _measure(stack, decision_id, args.rounds)}

            def shipped() -> bool:
                with psycopg.connect(database) as connection:
                    row = connection.execute(
                        "SELECT count(*) FROM audit_records WHERE decision_id = %s",
                        (decision_id,),
                    ).fetchone()
                return bool(row and row[0])

            assert wait_until(shipped)
            stack.kill_sidecar()
            stack.start_sidecar()
            results["postgres"] = _measure(stack, decision_id, args.rounds)
        finally:
            stack.stop()
    print(json.dumps({"claims": len(CLAIMS), "rounds": args.rounds, **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
