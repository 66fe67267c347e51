"""Bounded work per response, through a real Envoy.

A body with more hits than ``max_hits`` is refused (502) before it is
decided; a huge body that is within the limit is parsed and rendered in a
worker thread and decided in slices, so other callers' responses are decided
meanwhile. The in-process proof that a large parse never holds the event
loop is ``test_ext_proc_servicer``'s; this is the same through Envoy.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import GateStack, search_ids, wait_until
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

SEARCH = "/collections/{}/points/search"
# Near the case: a search answering ~95,000 distinct ids.
LARGE_HITS = 95_000


def body_of(n: int) -> bytes:
    """A Qdrant search body of points 1..n; the store knows points 1 and 2 only."""
    return qb.encode(qb.search_body([qb.point(i, text_for(str(i))) for i in range(1, n + 1)]))


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("max-hits"),
        [record_dict("1"), record_dict("2")],
        config={"max_hits": 3},
    ).start()
    yield gate
    gate.stop()


def test_a_body_over_max_hits_is_502_and_recorded(bounded: GateStack) -> None:
    path = SEARCH.format("docs")
    bounded.upstream.respond("POST", path, CannedResponse(body_of(3)))
    assert search_ids(bounded.search(path)) == [1, 2]
    counted = 'retrieval_gate_responses_total{collection="other",format="qdrant",outcome="error"}'
    before = bounded.metric(counted)
    bounded.upstream.respond("POST", path, CannedResponse(body_of(4)))
    response = bounded.search(path)
    record = bounded.audit_records()[-1]
    assert response.status == 502
    assert response.json() == {
        "error": "upstream_too_many_hits",
        "decision_id": record["decision_id"],
    }
    assert text_for("1").encode() not in response.body
    assert record["error"] == "upstream_too_many_hits"
    assert bounded.metric(counted) == before + 1


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("large-body"),
        [record_dict("1"), record_dict("2")],
        max_body_bytes=16 * 1024 * 1024,
        # Deciding 95,000 hits takes seconds here: more than Envoy's default wait.
        config={"max_hits": 100_000, "message_timeout_ms": 60_000},
    ).start()
    yield gate
    gate.stop()


def test_small_responses_are_decided_while_a_huge_one_is(roomy: GateStack) -> None:
    large, small = SEARCH.format("big"), SEARCH.format("docs")
    roomy.upstream.respond("POST", large, CannedResponse(body_of(LARGE_HITS)))
    roomy.upstream.respond("POST", small, CannedResponse(body_of(3)))
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(roomy.search, large)
        # The upstream has answered: its body is on its way to the sidecar.
        assert wait_until(lambda: any(r.path == large for r in roomy.upstream.requests))
        answers = [roomy.search(small) for _ in range(5)]
        huge = pending.result()
    assert [search_ids(answer) for answer in answers] == [[1, 2]] * 5
    assert search_ids(huge) == [1, 2]
    # Records are written as responses are decided: every small one before the huge one.
    sizes = [len(record["candidates"]) for record in roomy.audit_records()]
    assert sizes == [3] * 5 + [LARGE_HITS]
