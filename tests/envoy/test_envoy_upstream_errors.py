"""Upstream errors and response headers on filtered routes, through a real Envoy.

The upstream is the fixture server (a fake Qdrant). An upstream answer is
released by allowlist like a body: a non-2xx answer keeps its status but the
client gets the gate's body and no upstream header, the upstream's text goes
to the audit record only; a 2xx answer keeps only allowlisted upstream
headers. Routes may opt out (``pass_upstream_errors``), and audit mode
changes nothing the client gets. A gRPC error sent in trailers after the
response headers (a fake gRPC server, ``FailAfterHeaders``) is an upstream
error too: recorded, logged, and the client keeps its status.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import orjson
import pytest

from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.grpc_upstream import FailAfterHeaders, FakeGrpcUpstream
from tests.fixtures.harness import GateStack, HttpResult, search_ids
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

SEARCH = "/collections/{}/points/search"
FOREIGN = text_for("2")  # globex's chunk: never for acme's eyes
# As an Elasticsearch script error can, the upstream's error quotes a document.
QUOTING = qb.encode({"status": {"error": f"script failed near '{FOREIGN}'"}, "time": 0.1})
UPSTREAM_HEADERS = {
    "content-type": "application/json",
    "x-elastic-product": "Elasticsearch",
    "etag": '"all-tenants-v7"',
    "x-upstream-secret": "shard-3",
}


# What a filtered answer may carry: the upstream headers the gate keeps, its own,
# and Envoy's connection-level ones. The router's x-envoy-upstream-service-time
# (how long the database took) is suppressed in the bootstrap.
KEPT = {"content-type", "content-length", "date", "x-elastic-product"}
GATE = {"x-retrieval-gate-decision-id", "x-retrieval-gate-admitted"}
ENVOY = {"server", "connection"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("upstream-errors"),
        [record_dict("1"), record_dict("2", tenant_id="globex")],
        config={
            "routes": {
                "/collections/passed": {"pass_upstream_errors": True},
                "/collections/observed": {"mode": "audit"},
            }
        },
    ).start()
    yield gate
    gate.stop()


def answer_error(stack: GateStack, collection: str, status: int) -> HttpResult:
    """Search ``collection`` whose upstream fails with ``status`` and a quoting body."""
    path = SEARCH.format(collection)
    headers = {**UPSTREAM_HEADERS, "location": "http://db.internal/elsewhere"}
    stack.upstream.respond("POST", path, CannedResponse(QUOTING, status, headers))
    return stack.search(path)


def last_record(stack: GateStack) -> dict[str, object]:
    return stack.audit_records()[-1]


@pytest.mark.parametrize("status", [302, 400, 404, 500, 503])
def test_an_upstream_error_keeps_its_status_but_not_its_text_or_headers(
    stack: GateStack, status: int
) -> None:
    counted = stack.metric(
        'retrieval_gate_responses_total{collection="other",format="qdrant",outcome="upstream_error"}'
    )
    response = answer_error(stack, "docs", status)
    record = last_record(stack)
    # A 302 without its Location is not followed: the client sees the 302 itself.
    assert response.status == status
    assert response.json() == {"error": "upstream_error", "decision_id": record["decision_id"]}
    assert FOREIGN.encode() not in response.body
    assert response.headers["content-type"] == "application/json"
    for name in ("location", "etag", "x-upstream-secret", "x-elastic-product"):
        assert name not in response.headers
    assert response.headers["x-retrieval-gate-decision-id"] == record["decision_id"]
    assert record["upstream_status"] == status
    assert record["upstream_text"] == QUOTING.decode()
    assert (record["outcome"], record["error"]) == ("error", "upstream_error")
    assert (
        stack.metric(
            'retrieval_gate_responses_total{collection="other",format="qdrant",outcome="upstream_error"}'
        )
        == counted + 1
    )


def test_a_rejected_point_and_a_missing_one_get_the_same_answer(stack: GateStack) -> None:
    # Point 2 exists (globex's, rejected for acme); point 7 does not (Qdrant's 404).
    path = "/collections/docs/points/{}"
    found = qb.encode(qb.envelope(qb.record(qb.point(2, FOREIGN))))
    stack.upstream.respond("GET", path.format(2), CannedResponse(found))
    rejected = stack.search(path.format(2), method="GET")
    missing = stack.search(path.format(7), method="GET")
    assert rejected.status == missing.status == 404
    assert rejected.json().keys() == missing.json().keys() == {"error", "decision_id"}
    assert rejected.json()["error"] == missing.json()["error"]
    assert rejected.headers.keys() == missing.headers.keys()
    assert FOREIGN.encode() not in rejected.body


def test_a_route_that_passes_upstream_errors_gets_them_as_written(stack: GateStack) -> None:
    response = answer_error(stack, "passed", 500)
    assert response.status == 500
    assert response.body == QUOTING
    assert response.headers["x-upstream-secret"] == "shard-3"


def test_audit_mode_passes_an_upstream_error_and_records_it(stack: GateStack) -> None:
    response = answer_error(stack, "observed", 503)
    assert (response.status, response.body) == (503, QUOTING)
    assert response.headers["x-upstream-secret"] == "shard-3"
    record = last_record(stack)
    assert (record["outcome"], record["upstream_status"]) == ("passthrough", 503)
    assert record["upstream_text"] == QUOTING.decode()


def test_a_filtered_answer_keeps_only_allowlisted_upstream_headers(stack: GateStack) -> None:
    body = qb.encode(qb.search_body([qb.point(1, text_for("1")), qb.point(2, FOREIGN)]))
    stack.upstream.respond(
        "POST", SEARCH.format("docs"), CannedResponse(body, 200, UPSTREAM_HEADERS)
    )
    response = stack.search(SEARCH.format("docs"))
    assert search_ids(response) == [1]
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-elastic-product"] == "Elasticsearch"  # elasticsearch-py needs it
    assert response.headers["content-length"] == str(len(response.body))
    assert "date" in response.headers
    assert "x-retrieval-gate-decision-id" in response.headers
    # Nothing else of the upstream's: the fixture server's own "Server" is Envoy's now.
    assert set(response.headers) <= {*KEPT, *GATE, *ENVOY}
    assert response.headers["server"] == "envoy"


def test_audit_mode_leaves_the_upstream_headers_of_a_filtered_answer(stack: GateStack) -> None:
    body = qb.encode(qb.search_body([qb.point(1, text_for("1"))]))
    path = SEARCH.format("observed")
    stack.upstream.respond("POST", path, CannedResponse(body, 200, UPSTREAM_HEADERS))
    response = stack.search(path)
    assert response.headers["etag"] == '"all-tenants-v7"'


# -- a gRPC error after the response headers ---------------------------------------------

GRPC_SEARCH = "/milvus.proto.milvus.MilvusService/Search"


def _fail(request: bytes) -> bytes:
    raise FailAfterHeaders(grpc.StatusCode.INVALID_ARGUMENT, f"cannot search near '{FOREIGN}'")


@pytest.fixture(scope="module")
def grpc_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    upstream = FakeGrpcUpstream({GRPC_SEARCH: _fail}).start()
    gate = GateStack(
        tmp_path_factory.mktemp("upstream-errors-grpc"),
        [record_dict("1")],
        grpc_upstream_url=upstream.url,
    ).start()
    yield gate
    gate.stop()
    upstream.stop()


def test_a_grpc_error_after_the_headers_is_recorded_and_keeps_its_status(
    grpc_stack: GateStack,
) -> None:
    with grpc.insecure_channel(grpc_stack.url.removeprefix("http://")) as channel:
        search = channel.unary_unary(GRPC_SEARCH)
        metadata = (("x-gate-tenant", "acme"), ("x-gate-principals", "group:qa"))
        with pytest.raises(grpc.RpcError) as raised:
            search(b"", metadata=metadata, timeout=10)
    error: Any = raised.value
    record = last_record(grpc_stack)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert orjson.loads(error.details()) == {
        "error": "upstream_error",
        "decision_id": record["decision_id"],
    }
    assert (record["outcome"], record["error"]) == ("error", "upstream_error")
    assert (record["upstream_status"], record["upstream_code"]) == (200, "grpc:3")
    assert record["upstream_text"] == f"cannot search near '{FOREIGN}'"
    log = (grpc_stack.workdir / "sidecar.log").read_text()
    (warning,) = [line for line in log.splitlines() if str(record["decision_id"]) in line]
    assert "WARNING" in warning and "upstream code grpc:3" in warning
    assert FOREIGN.splitlines()[0] not in log
