"""The fault matrix (bench/faults.py) at a reduced count: every fault, under load, through Envoy.

One run of the whole matrix (one rig per policy engine), then one test per
fault reading its result: no unfiltered answer, no lost audit record, back to
full releases after the fault, and the fault either visible in the answers
(it was injected) or absorbed, as the fault declares. The full count (10,000
requests per fault) is `bench/faults.py` with no arguments; docs/reliability.md
holds its figures.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fixtures.postgres import require_postgres
from tests.fixtures.servers import server_missing

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from faults import FAULTS, judge_fault, run_matrix
from traffic import DECISION_HEADER, READABLE_IDS, judge, upstream_body

pytestmark = [pytest.mark.envoy, pytest.mark.postgres]

# Enough to see each fault and the recovery after it; the published figures
# come from the full count.
REQUESTS = 300
# Longer than Envoy's 2 s message timeout, so that a stalled sidecar shows.
FAULT_SECONDS = 2.5


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    require_postgres()
    ran = run_matrix(None, requests=REQUESTS, fault_seconds=FAULT_SECONDS, clients=4)
    return {result["fault"]: result for result in ran}


@pytest.mark.parametrize("name", [fault.name for fault in FAULTS])
def test_the_gate_keeps_its_promise_under(name: str, results: dict[str, dict[str, Any]]) -> None:
    result = results[name]
    if "not_run" in result:
        server_missing(result["not_run"])
    assert result["all"]["requests"] >= REQUESTS
    assert result["all"]["unfiltered"] == 0, result["all"]["unfiltered_by"]
    assert result["audit_lost"] == 0
    assert result["problems"] == [], result


# The judge itself: each way an answer can leak is caught.

GATE = {DECISION_HEADER: "d-1"}


def _released(ids: list[int]) -> bytes:
    return orjson.dumps({"result": [{"id": i, "payload": {"text": "t"}} for i in ids]})


def test_the_judge_passes_a_full_release_and_a_withheld_one() -> None:
    assert judge(200, GATE, _released(sorted(READABLE_IDS)))[:2] == ("filtered", "")
    assert judge(200, GATE, _released([1]))[:2] == ("withheld", "")
    assert judge(503, {}, b"upstream connect error")[:2] == ("refused", "envoy")
    assert judge(500, GATE, b'{"error":"audit_unavailable"}')[:2] == (
        "refused",
        "audit_unavailable",
    )


@pytest.mark.parametrize(
    ("status", "headers", "body", "why"),
    [
        (200, GATE, upstream_body(), "canary"),
        (200, {}, _released([1]), "no decision id"),
        (200, GATE, _released([1, 101]), "forbidden id"),
        (200, GATE, b"<html>", "unparsable 200"),
        (500, {}, b'{"error":"CANARY text"}', "canary"),
    ],
)
def test_the_judge_calls_every_leak_unfiltered(
    status: int, headers: dict[str, str], body: bytes, why: str
) -> None:
    assert judge(status, headers, body)[:2] == ("unfiltered", why)


def test_a_chunk_on_its_way_out_may_be_released_or_not() -> None:
    everything = READABLE_IDS
    without_one = sorted(everything - {1})
    assert judge(200, GATE, _released(without_one), everything, frozenset({1}))[:2] == (
        "filtered",
        "",
    )
    after = everything - {1}
    assert judge(200, GATE, _released(sorted(everything)), after)[:2] == (
        "unfiltered",
        "forbidden id",
    )


def test_a_fault_that_changed_nothing_is_reported_as_not_injected() -> None:
    quiet = {"requests": 10, "filtered": 10, "withheld": 0, "refused": 0, "unfiltered": 0}
    result = {
        "all": quiet,
        "during": quiet,
        "disturbs": True,
        "recovered": True,
        "audit": {"chains_broken": []},
        "audit_lost": 0,
    }
    assert judge_fault(result) == [
        "every answer during the fault was a full release: was it injected?"
    ]
