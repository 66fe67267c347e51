"""Benchmark: how long a revoked chunk can still reach a client, through Envoy.

Not a test. Runs the real stack (fixture upstream, `retrieval-gate serve` with
an hour-long cache TTL, Envoy) and, per round, commits `UPDATE chunks SET
status = 'revoked'` from this process (as any tool would: psycopg, or sqlite3
on the gate's file), then searches through Envoy back to back until a response
no longer contains the chunk. The propagation time is commit -> first such
response, so it includes one request's latency. Reports p50/p99/max over the
rounds. On PostgreSQL the LISTEN notification explains it; on SQLite the
change poll (every ``change_poll.POLL_SECONDS``), whose cost per poll is
measured too.

Usage: .venv/bin/python bench/revocation.py [--rounds 100] [--store postgresql|sqlite]
PostgreSQL needs a server on 127.0.0.1:5432 (see tests/fixtures/postgres.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sidecar.demo.upstream import CannedResponse  # noqa: E402
from sidecar.store.cache import CachedStore  # noqa: E402
from sidecar.store.change_poll import POLL_SECONDS  # noqa: E402
from sidecar.store.sqlite import SqliteStore  # noqa: E402
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


Execute = Callable[[str], object]


@contextmanager
def postgres_store() -> Iterator[tuple[str | None, Execute]]:
    with fresh_database() as database, psycopg.connect(database, autocommit=True) as connection:
        yield database, connection.execute


@contextmanager
def sqlite_writer(path: Path) -> Iterator[Execute]:
    # Autocommit: each UPDATE is committed when execute returns.
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        yield connection.execute
    finally:
        connection.close()


def poll_cost_us(path: Path, calls: int = 20_000) -> float:
    """Mean wall time of one change poll's query (``SqliteStore.data_version``)."""
    store = SqliteStore(path)
    try:
        started = time.perf_counter()
        for _ in range(calls):
            store.data_version()
        return (time.perf_counter() - started) / calls * 1e6
    finally:
        store.close()


def clear_cost_us(path: Path, ids: int = 20, calls: int = 2_000) -> tuple[float, float]:
    """Mean time to look ``ids`` chunks up through the cache: warm, and right after the
    cache was dropped (what each change costs a gate on SQLite, once per chunk id)."""
    store = SqliteStore(path)
    cache = CachedStore(store, ttl=3600.0)
    wanted = [str(i) for i in range(1, ids + 1)]

    async def timed(clear: bool) -> float:
        await cache.fetch(wanted)
        started = time.perf_counter()
        for _ in range(calls):
            if clear:
                cache.clear()
            await cache.fetch(wanted)
        return (time.perf_counter() - started) / calls * 1e6

    try:
        return asyncio.run(timed(False)), asyncio.run(timed(True))
    finally:
        store.close()


def rounds(gate: GateStack, execute: Execute, count: int) -> tuple[list[float], list[int]]:
    samples: list[float] = []
    requests_needed: list[int] = []
    for _ in range(count):
        execute("UPDATE chunks SET status = 'approved' WHERE chunk_id = '1'")
        wait_for(gate, True)
        execute("UPDATE chunks SET status = 'revoked' WHERE chunk_id = '1'")
        committed = time.perf_counter()
        tries = wait_for(gate, False)
        samples.append(time.perf_counter() - committed)
        requests_needed.append(tries)
    return samples, requests_needed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--store", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "revocation.json")
    args = parser.parse_args()
    records = [record_dict(str(i)) for i in range(1, 21)]
    points = [qb.point(i, text_for(str(i))) for i in range(1, 21)]
    body = CannedResponse(qb.encode(qb.search_body(points)))
    extra: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.store == "postgresql":
            with postgres_store() as (database, execute):
                gate = GateStack(
                    Path(tmp), records, store_url=database, config={"cache_ttl_seconds": 3600}
                ).start()
                try:
                    gate.upstream.respond("POST", SEARCH, body)
                    samples, requests_needed = rounds(gate, execute, args.rounds)
                finally:
                    gate.stop()
        else:
            gate = GateStack(Path(tmp), records, config={"cache_ttl_seconds": 3600}).start()
            path = Path(gate.store_url.removeprefix("sqlite:///"))
            try:
                gate.upstream.respond("POST", SEARCH, body)
                with sqlite_writer(path) as execute:
                    samples, requests_needed = rounds(gate, execute, args.rounds)
                cost = poll_cost_us(path)
                warm, cold = clear_cost_us(path)
                extra = {
                    "poll_seconds": POLL_SECONDS,
                    "poll_query_us": round(cost, 1),
                    "poll_cpu_share": f"{cost / POLL_SECONDS / 1e6:.1e}",
                    "lookup_20_ids_warm_us": round(warm, 1),
                    "lookup_20_ids_after_a_change_us": round(cold, 1),
                }
            finally:
                gate.stop()
    samples_ms = sorted(s * 1000 for s in samples)
    p99 = samples_ms[min(len(samples_ms) - 1, round(0.99 * (len(samples_ms) - 1)))]
    report = {
        "store": args.store,
        "rounds": args.rounds,
        "p50_ms": statistics.median(samples_ms),
        "p99_ms": p99,
        "max_ms": samples_ms[-1],
        "responses_still_containing_the_chunk": sum(n - 1 for n in requests_needed),
        **extra,
        "command": f"bench/revocation.py --rounds {args.rounds} --store {args.store}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"revocation -> first response without the chunk, {args.rounds} rounds: "
        f"p50 {report['p50_ms']:.1f} ms, p99 {p99:.1f} ms, max {report['max_ms']:.1f} ms; "
        f"responses that still carried it after the commit: "
        f"{report['responses_still_containing_the_chunk']}"
    )
    if extra:
        print(
            f"SQLite change poll: {extra['poll_query_us']} us per poll, every {POLL_SECONDS} s; "
            f"20 ids looked up {extra['lookup_20_ids_warm_us']} us warm, "
            f"{extra['lookup_20_ids_after_a_change_us']} us right after a change"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
