"""A revocation reaches a running gate on SQLite through the change poll, not the cache TTL.

A real `retrieval-gate serve` with two workers behind Envoy, its cache warm (the
default 30 s TTL); `retrieval-gate store revoke`, run as a process of its own on
the same file. Every worker stops releasing the chunk well within the 30 s TTL;
each worker's audit log says when it first refused it.
"""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from sidecar.demo.upstream import CannedResponse
from sidecar.runtime.workers import worker_audit_log
from sidecar.store.change_poll import APPLIED_WITHIN_SECONDS
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import CLI, GateStack, search_ids
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

SEARCH = "/collections/docs/points/search"
WORKERS = 2
# How long the test waits for the revocation: the cache TTL (30 s) would not do.
WAIT_S = 3.0


def decisions(stack: GateStack, worker: int) -> list[dict[str, Any]]:
    log = worker_audit_log(stack.audit_log, worker, WORKERS)
    return [orjson.loads(line) for line in log.read_bytes().splitlines()] if log.exists() else []


def released(decision: dict[str, Any]) -> bool:
    return "1" in decision.get("admitted", [])


def test_a_revocation_reaches_every_worker_through_the_change_poll(
    tmp_path: Path, record_property: Any
) -> None:
    stack = GateStack(tmp_path, [record_dict("1"), record_dict("2")], config={"workers": WORKERS})
    stack.start()
    try:
        body = qb.search_body([qb.point(1, text_for("1")), qb.point(2, text_for("2"))])
        stack.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(body)))
        # Warm both workers' caches: Envoy spreads the streams over them.
        deadline = time.monotonic() + 20
        while not all(len(decisions(stack, w)) >= 3 for w in range(WORKERS)):
            assert time.monotonic() < deadline, "a worker got no stream"
            assert search_ids(stack.search(SEARCH)) == [1, 2]
        assert stack.metric("retrieval_gate_cache_hits_total") > 0  # answered from the cache
        assert stack.metric("retrieval_gate_store_changes_watched") == 1  # in every worker

        revoke = subprocess.run(
            [*CLI, "store", "revoke", "--store", stack.store_url, "1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        revoked = datetime.now(UTC)  # the change was committed before the process ended
        assert revoke.returncode == 0, revoke.stderr
        assert f"within {APPLIED_WITHIN_SECONDS:g} s" in revoke.stdout

        started = time.monotonic()
        withheld_in_a_row = 0
        while withheld_in_a_row < 10:  # at least 5 streams per worker without chunk 1
            assert time.monotonic() - started < WAIT_S, "chunk 1 is still released"
            ids = search_ids(stack.search(SEARCH))
            withheld_in_a_row = 0 if 1 in ids else withheld_in_a_row + 1
            time.sleep(0.01)

        delays = []
        for worker in range(WORKERS):
            after = [
                d for d in decisions(stack, worker) if datetime.fromisoformat(d["time"]) > revoked
            ]
            refused = [d for d in after if not released(d)]
            assert refused, f"worker {worker} decided nothing after the revocation"
            assert not any(released(d) for d in after[after.index(refused[0]) :])
            reasons = {r["chunk_id"]: r["reasons"] for r in refused[0]["rejected"]}
            assert "STATUS_REVOKED" in reasons["1"]
            first = datetime.fromisoformat(refused[0]["time"])
            delays.append((first - revoked).total_seconds())
        # The observed delay from `store revoke`'s exit to each worker's first refusal
        # (its resolution: a stream per worker every ~20 ms); the poll bounds it.
        record_property("revocation_delay_seconds", delays)
        print(f"revocation reached the workers after {', '.join(f'{d:.3f}' for d in delays)} s")
    finally:
        stack.stop()
