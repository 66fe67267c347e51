"""A remote request policy never holds the event loop: concurrent gRPC searches through a
real Envoy wait on OPA in parallel, on one sidecar worker.

A gRPC path names no collection, so every gRPC search asks the request policy
twice: at its headers (with the path's collections, none) and at its body
(with the collection the body names). With ``policy_engine = "opa"`` both are
an HTTP round trip; here a FAKE OPA (tests/fixtures/fake_opa.py) answers the
request rule after 300 ms. Were the body's question asked on the event loop
every stream of the worker shares, the body checks would reach OPA one at a
time; the test shows them in flight together. Qdrant is FAKE too
(tests/fixtures/qdrant_grpc_upstream.py): no Qdrant server runs here.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from qdrant_client import grpc as q

from tests.fixtures.fake_opa import Call, FakeOpa, Misbehaviour
from tests.fixtures.harness import GateStack
from tests.fixtures.qdrant_grpc_upstream import FakeQdrant
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

REQUEST_RULE = "retrieval_gate/request"
OPA_DELAY_SECONDS = 0.3
SEARCHES = 4
CALLER = (("x-gate-tenant", "acme"), ("x-gate-principals", "user:alice,group:qa"))


@pytest.fixture(scope="module")
def opa() -> Iterator[FakeOpa]:
    fake = FakeOpa().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, opa: FakeOpa) -> Iterator[GateStack]:
    upstream = FakeQdrant({pid: (text_for(str(pid)), {"tenant": "acme"}) for pid in (1, 2)})
    upstream.start()
    config = {
        "policy_engine": "opa",
        "opa_url": opa.url,
        # Ample for one slow answer: every question must be answered, not timed out.
        "opa_timeout_ms": 1500,
        "message_timeout_ms": 5000,
        "workers": 1,
    }
    records = [record_dict("1"), record_dict("2")]
    gate = GateStack(
        tmp_path_factory.mktemp("opa-concurrency"),
        records,
        config=config,
        grpc_upstream_url=upstream.url,
    ).start()
    yield gate
    gate.stop()
    upstream.stop()


def _search(stack: GateStack) -> list[int]:
    with grpc.insecure_channel(f"127.0.0.1:{stack.listen_port}") as channel:
        stub = q.PointsStub(channel)  # type: ignore[no-untyped-call]
        reply = stub.Search(
            q.SearchPoints(collection_name="docs", vector=[0.1, 0.2], limit=2),
            metadata=CALLER,
            timeout=30,
        )
    return sorted(point.id.num for point in reply.result)


def _peak_overlap(calls: list[Call]) -> int:
    """The most of ``calls`` that were waiting on OPA at one moment."""
    events = sorted(
        [(call.started, 1) for call in calls]
        + [(call.answered or call.started, -1) for call in calls]
    )
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def test_body_checks_wait_on_a_slow_opa_in_parallel(stack: GateStack, opa: FakeOpa) -> None:
    opa.misbehave(Misbehaviour.SLOW, rule=REQUEST_RULE, delay_seconds=OPA_DELAY_SECONDS)
    try:
        opa.calls.clear()
        with ThreadPoolExecutor(SEARCHES) as pool:
            results = list(pool.map(lambda _: _search(stack), range(SEARCHES)))
    finally:
        opa.behave()
    # Every search was answered, with both records admitted: nothing was refused or lost.
    assert results == [[1, 2]] * SEARCHES
    body_checks = [
        call
        for call in opa.calls
        if call.path.startswith(REQUEST_RULE) and call.input["collections"] == ["docs"]
    ]
    assert len(body_checks) == SEARCHES
    assert all(call.answered is not None for call in body_checks)
    # On a blocked loop the body checks would reach OPA strictly one after another.
    assert _peak_overlap(body_checks) >= 2
