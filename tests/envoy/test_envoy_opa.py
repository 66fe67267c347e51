"""--policy-engine opa through a real Envoy, with a FAKE OPA (tests/fixtures/fake_opa.py).

Two stacks with the same records, one deciding in process (regorus) and one
asking OPA: they must answer every caller alike. Then OPA goes down, slow or
wrong: every chunk is rejected with POLICY_ERROR (or the request refused with
``policy_error``), and no hit ever reaches the client.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.fake_opa import FakeOpa, Misbehaviour
from tests.fixtures.harness import GateStack, HttpResult, client_view, search_ids, wait_until
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

SEARCH = "/collections/docs/points/search"
RECORDS = [
    record_dict("1"),
    record_dict("2", status="revoked"),
    record_dict("3", status="draft"),
    record_dict("4", tenant_id="globex"),
    record_dict("5", allowed_principals=["group:hr"]),
    record_dict("6", expires_at="2025-06-01T00:00:00Z"),
    record_dict("7", status="superseded", superseded_by="1"),
    record_dict("8", allowed_principals=["group:qa", "group:hr"]),
]
POINTS = [qb.point(int(r["chunk_id"]), text_for(r["chunk_id"])) for r in RECORDS]
BODY = qb.encode(qb.search_body(POINTS))
CALLERS = [
    ("acme", "user:alice,group:qa"),
    ("acme", "user:bob,group:hr"),
    ("globex", "group:qa,group:hr"),
    ("initech", "group:qa"),
]
CHUNKS_RULE = "retrieval_gate/chunks"
REQUEST_RULE = "retrieval_gate/request"
OPA_TIMEOUT_MS = 300


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpa]:
    opa = FakeOpa().start()
    yield opa
    opa.stop()


def _stack(workdir: Any, config: dict[str, Any] | None = None) -> GateStack:
    stack = GateStack(workdir, RECORDS, config=config).start()
    stack.upstream.respond("POST", SEARCH, CannedResponse(BODY))
    return stack


@pytest.fixture(scope="module")
def regorus_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    stack = _stack(tmp_path_factory.mktemp("regorus"))
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def opa_stack(tmp_path_factory: pytest.TempPathFactory, fake: FakeOpa) -> Iterator[GateStack]:
    config = {"policy_engine": "opa", "opa_url": fake.url, "opa_timeout_ms": OPA_TIMEOUT_MS}
    stack = _stack(tmp_path_factory.mktemp("opa"), config)
    yield stack
    stack.stop()


@pytest.fixture(autouse=True)
def well_behaved(fake: FakeOpa) -> Iterator[None]:
    fake.behave()
    yield
    fake.behave()


def _rejections(stack: GateStack) -> dict[str, list[str]]:
    """The last audit record's reasons per rejected chunk id."""
    record = stack.audit_records()[-1]
    return {entry["chunk_id"]: entry["reasons"] for entry in record["rejected"]}


def _assert_nothing_released(response: HttpResult) -> None:
    """No hit in the answer, whatever its status."""
    if response.status == 200:
        assert search_ids(response) == []
    for record in RECORDS:
        assert text_for(record["chunk_id"]).encode() not in response.body


def test_opa_decides_like_regorus_for_every_caller(
    regorus_stack: GateStack, opa_stack: GateStack, fake: FakeOpa
) -> None:
    fake.calls.clear()
    for tenant, principals in CALLERS:
        local = regorus_stack.search(SEARCH, tenant=tenant, principals=principals)
        remote = opa_stack.search(SEARCH, tenant=tenant, principals=principals)
        assert local.status == 200
        assert client_view(remote) == client_view(local), (tenant, principals)
        assert _rejections(opa_stack) == _rejections(regorus_stack)
    # The decisions really came from OPA: one request-policy call and ONE
    # batched chunk call per search, holding every candidate.
    chunk_calls = [c for c in fake.calls if c.path == "retrieval_gate/chunks/reasons"]
    request_calls = [c for c in fake.calls if c.path == "retrieval_gate/request/denials"]
    assert len(chunk_calls) == len(CALLERS) == len(request_calls)
    assert all(len(c.input["chunks"]) == len(RECORDS) for c in chunk_calls)
    assert opa_stack.audit_records()[-1]["policy_version"].startswith("opa:http://127.0.0.1:")


def test_acme_qa_sees_what_the_policy_admits(opa_stack: GateStack) -> None:
    response = opa_stack.search(SEARCH)
    assert search_ids(response) == [1, 8]
    assert _rejections(opa_stack)["2"] == ["STATUS_REVOKED"]


@pytest.mark.parametrize(
    "how",
    [
        Misbehaviour.SLOW,
        Misbehaviour.NOT_JSON,
        Misbehaviour.WRONG_SHAPE,
        Misbehaviour.UNDEFINED,
        Misbehaviour.NO_ENTRIES,
        Misbehaviour.SERVER_ERROR,
        Misbehaviour.TRUNCATED,
    ],
)
def test_a_failing_chunk_policy_rejects_every_chunk(
    opa_stack: GateStack, fake: FakeOpa, how: Misbehaviour
) -> None:
    errors_before = opa_stack.metric("retrieval_gate_policy_errors_total")
    # Slow: well beyond the sidecar's OPA timeout, and within Envoy's 2 s.
    fake.misbehave(how, rule=CHUNKS_RULE, delay_seconds=4 * OPA_TIMEOUT_MS / 1000)
    response = opa_stack.search(SEARCH)
    assert response.status == 200, response.body
    _assert_nothing_released(response)
    record = opa_stack.audit_records()[-1]
    assert record["admitted"] == []
    assert {entry["chunk_id"]: entry["reasons"] for entry in record["rejected"]} == {
        r["chunk_id"]: ["POLICY_ERROR"] for r in RECORDS
    }
    assert opa_stack.metric("retrieval_gate_policy_errors_total") == errors_before + 1
    fake.behave()
    assert search_ids(opa_stack.search(SEARCH)) == [1, 8]  # recovered, no restart


@pytest.mark.parametrize(
    "how",
    [
        Misbehaviour.SLOW,
        Misbehaviour.NOT_JSON,
        Misbehaviour.UNDEFINED,
        Misbehaviour.NO_ENTRIES,
        Misbehaviour.SERVER_ERROR,
        Misbehaviour.TRUNCATED,
    ],
)
def test_a_failing_request_policy_refuses_the_request(
    opa_stack: GateStack, fake: FakeOpa, how: Misbehaviour
) -> None:
    fake.misbehave(how, rule=REQUEST_RULE, delay_seconds=4 * OPA_TIMEOUT_MS / 1000)
    response = opa_stack.search(SEARCH)
    assert response.status == 403
    assert response.json()["error"] == "policy_error"
    _assert_nothing_released(response)


def test_a_down_opa_refuses_every_request(opa_stack: GateStack, fake: FakeOpa) -> None:
    fake.down()
    try:
        for tenant, principals in CALLERS:
            response = opa_stack.search(SEARCH, tenant=tenant, principals=principals)
            assert response.status == 403
            assert response.json()["error"] == "policy_error"
            _assert_nothing_released(response)
    finally:
        fake.start()
    assert search_ids(opa_stack.search(SEARCH)) == [1, 8]


def test_opa_going_down_mid_request_rejects_every_chunk(
    opa_stack: GateStack, fake: FakeOpa
) -> None:
    # The request policy passes; OPA is gone by the time the response is decided.
    opa_stack.upstream.respond("POST", SEARCH, CannedResponse(BODY, delay_seconds=1.0))
    try:
        seen = len(opa_stack.upstream.requests)
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(opa_stack.search, SEARCH)
            # Polled, not slept: the database has the request, so the request
            # policy has passed; it answers after 1 s, and OPA goes down meanwhile.
            assert wait_until(lambda: len(opa_stack.upstream.requests) > seen, timeout=10)
            fake.down()
            response = pending.result()
    finally:
        fake.start()
        opa_stack.upstream.respond("POST", SEARCH, CannedResponse(BODY))
    assert response.status == 200
    _assert_nothing_released(response)
    rejected = _rejections(opa_stack)
    assert rejected == {r["chunk_id"]: ["POLICY_ERROR"] for r in RECORDS}
