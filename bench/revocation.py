"""Benchmark: how long a revoked chunk can still reach a client, through Envoy.

Not a test. Runs the real stack (fixture upstream, `retrieval-gate serve` on
PostgreSQL with an hour-long cache TTL, Envoy) and, per round, commits
`UPDATE chunks SET status = 'revoked'` with psycopg (as any tool would), then
searches through Envoy back to back until a response no longer contains the
chunk. The propagation time is commit -> first such response, so it includes
one request's latency. Reports p50/p99/max over the rounds.

Usage: .venv/bin/python bench/revocation.py [--rounds 100]
Needs PostgreSQL on 127.0.0.1:5432 (see tests/fixtures/postgres.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sidecar.demo.upstream import CannedResponse  # noqa: E402
from tests.fixtures import qdrant_bodies as qb  # noqa: E402
from tests.fixtures.harness import GateStack  # noqa: E402
from tests.fixtures.postgres import fresh_database  # noqa: E402
from tests.fixtures.records import record_dict, text_for  # noqa: E402

SEARCH = "/collections/docs/points/search"


def visible(gate: GateStack) -> bool:
    return any(hit["id"] == 1 for hit in gate.search(SEARCH).json()["result"])


def wait_for(gate: GateStack, expected: bool, limit_s: float = 30.0) -> int:
    """Search until the chunk's visibility is ``expected``; return how many searches it took."""
    deadline = time.monotonic() + limit_s
    tries = 1
    while visible(gate) is not expected:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"chunk still {'hidden' if expected else 'visible'} after {limit_s} s"
            )
        tries += 1
    return tries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "revocation.json")
    args = parser.parse_args()
    with fresh_database() as database, tempfile.TemporaryDirectory() as tmp:
        records = [record_dict(str(i)) for i in range(1, 21)]
        gate = GateStack(
            Path(tmp), records, store_url=database, config={"cache_ttl_seconds": 3600}
        ).start()
        try:
            points = [qb.point(i, text_for(str(i))) for i in range(1, 21)]
            gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(points))))
            samples: list[float] = []
            requests_needed: list[int] = []
            with psycopg.connect(database, autocommit=True) as connection:
                for _ in range(args.rounds):
                    connection.execute("UPDATE chunks SET status = 'approved' WHERE chunk_id = '1'")
                    wait_for(gate, True)
                    connection.execute("UPDATE chunks SET status = 'revoked' WHERE chunk_id = '1'")
                    committed = time.perf_counter()
                    tries = wait_for(gate, False)
                    samples.append(time.perf_counter() - committed)
                    requests_needed.append(tries)
        finally:
            gate.stop()
    samples_ms = sorted(s * 1000 for s in samples)
    p99 = samples_ms[min(len(samples_ms) - 1, round(0.99 * (len(samples_ms) - 1)))]
    report = {
        "rounds": args.rounds,
        "p50_ms": statistics.median(samples_ms),
        "p99_ms": p99,
        "max_ms": samples_ms[-1],
        "responses_still_containing_the_chunk": sum(n - 1 for n in requests_needed),
        "command": f"bench/revocation.py --rounds {args.rounds}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"revocation -> first response without the chunk, {args.rounds} rounds: "
        f"p50 {report['p50_ms']:.1f} ms, p99 {p99:.1f} ms, max {report['max_ms']:.1f} ms; "
        f"responses that still carried it after the commit: "
        f"{report['responses_still_containing_the_chunk']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
