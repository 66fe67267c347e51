"""End to end through a real Envoy: Qdrant responses filtered by `retrieval-gate serve`.

The upstream is the fixture server (sidecar.demo.upstream, a fake Qdrant that
replays bodies built by tests.fixtures.qdrant_bodies from Qdrant's API
shapes); every filtered body is validated with qdrant-client's own response
models, as an unchanged application would parse it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from qdrant_client.http import models

from sidecar.core.hits import Route
from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import CLI, GateStack
from tests.fixtures.qdrant_models import RESPONSE_MODELS
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

# Point id -> (record overrides or None when the store has no record, served text)
CORPUS: dict[int, tuple[dict[str, Any] | None, str]] = {
    101: ({}, text_for("101")),
    102: ({"status": "revoked"}, text_for("102")),
    103: ({"tenant_id": "globex"}, text_for("103")),
    104: ({}, text_for("104")),
    105: ({}, text_for("105") + " (edited in the index)"),
    106: (None, text_for("106")),
    107: ({"allowed_principals": ["group:hr"]}, text_for("107")),
    108: ({}, text_for("108")),
}
ADMITTED = [101, 104, 108]
EXPECTED_REASONS = {
    102: "STATUS_REVOKED",
    103: "TENANT_MISMATCH",
    105: "HASH_MISMATCH",
    106: "MISSING_METADATA",
    107: "PRINCIPAL_MISMATCH",
}
POINTS = [
    qb.point(pid, text, score=round(1 - i / 20, 3), doc_id=f"doc-{pid % 3}")
    for i, (pid, (_, text)) in enumerate(CORPUS.items())
]


def corpus_records() -> list[dict[str, Any]]:
    return [record_dict(str(pid), **o) for pid, (o, _) in CORPUS.items() if o is not None]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("stack"),
        corpus_records(),
        config={
            "routes": {
                "/collections/strict/": {"mode": "strict"},
                "/collections/audit/": {"mode": "audit"},
            },
            # The group searches group by doc_id: their ids go out as its released values.
            "formats": {"qdrant": {"releasable_fields": ["doc_id"]}},
        },
    ).start()
    yield gate
    gate.stop()


def returned_ids(suffix: str, body: dict[str, Any]) -> list[int]:
    """Point ids in a Qdrant body, in order, whatever the endpoint's shape."""
    result: Any = body.get("result")
    if suffix == "{id}":
        return [] if result is None else [result["id"]]
    if isinstance(result, dict) and "groups" in result:
        return [hit["id"] for group in result["groups"] for hit in group["hits"]]
    if isinstance(result, dict):
        return [hit["id"] for hit in result["points"]]
    flat: list[int] = []
    for item in result:
        if isinstance(item, list):
            flat.extend(hit["id"] for hit in item)
        elif "points" in item:
            flat.extend(hit["id"] for hit in item["points"])
        else:
            flat.append(item["id"])
    return flat


def serve(
    stack: GateStack, suffix: str, points: list[dict[str, Any]], collection: str = "docs"
) -> Route:
    route = qb.route(suffix, collection=collection, point_id=points[0]["id"])
    body = qb.encode(qb.BUILDERS[suffix](points))
    stack.upstream.respond(route.method, route.path, CannedResponse(body))
    return route


@pytest.mark.parametrize("suffix", sorted(s for s in qb.BUILDERS if s != "{id}"))
def test_only_admitted_chunks_arrive_and_the_body_still_parses(
    stack: GateStack, suffix: str
) -> None:
    route = serve(stack, suffix, POINTS)
    # The tenant is pushed down into every request of a batch: send real ones, one
    # per sub-result of the answer (an over-fetched batch's answer must have as many).
    one = b'{"vector":[0.1,0.2],"limit":10}'
    if "batch" in suffix:
        searches = len(qb.BUILDERS[suffix](POINTS)["result"])
        body = b'{"searches":[' + b",".join([one] * searches) + b"]}"
    else:
        body = one
    response = stack.search(route.path, method=route.method, body=body)
    assert response.status == 200, response.body
    RESPONSE_MODELS[suffix].model_validate_json(response.body)
    ids = returned_ids(suffix, response.json())
    assert sorted(set(ids)) == ADMITTED
    # Rank order is preserved within each sub-result.
    upstream_ids = returned_ids(suffix, qb.BUILDERS[suffix](POINTS))
    assert ids == [i for i in upstream_ids if i in ADMITTED]
    assert int(response.headers["x-retrieval-gate-admitted"]) == len(ids)
    assert "x-retrieval-gate-rejected" not in response.headers
    assert response.headers["content-length"] == str(len(response.body))


def test_single_point_get(stack: GateStack) -> None:
    hit = next(p for p in POINTS if p["id"] == 101)
    route = serve(stack, "{id}", [hit])
    response = stack.search(route.path, method="GET")
    assert response.status == 200
    RESPONSE_MODELS["{id}"].model_validate_json(response.body)
    assert returned_ids("{id}", response.json()) == [101]


def test_a_rejected_point_is_answered_like_a_missing_one(stack: GateStack) -> None:
    rejected = next(p for p in POINTS if p["id"] == 102)
    route = serve(stack, "{id}", [rejected])
    stack.upstream.respond(
        "GET",
        "/collections/docs/points/999",
        CannedResponse(b'{"status":{"error":"Not found: No point with id 999 found"}}', 404),
    )
    answers = [
        stack.search(path, method="GET") for path in (route.path, "/collections/docs/points/999")
    ]
    assert [a.status for a in answers] == [404, 404]
    # The same body but for the decision id, and the same headers.
    assert [a.json()["error"] for a in answers] == ["upstream_error", "upstream_error"]
    assert [sorted(set(a.json())) for a in answers] == [["decision_id", "error"]] * 2
    assert sorted(answers[0].headers) == sorted(answers[1].headers)


def test_audit_record_lists_every_reason_and_metrics_match(stack: GateStack) -> None:
    route = serve(stack, "search", POINTS, collection="counted")
    before = stack.metrics()
    response = stack.search(route.path)
    decision_id = response.headers["x-retrieval-gate-decision-id"]
    record = next(r for r in stack.audit_records() if r["decision_id"] == decision_id)
    assert record["admitted"] == [str(i) for i in ADMITTED]
    assert {int(r["chunk_id"]): r["reasons"][0] for r in record["rejected"]} == EXPECTED_REASONS
    assert record["tenant"] == "acme" and "principals" not in record
    assert record["format"] == "qdrant" and record["outcome"] == "filtered"
    assert not any("text" in str(value) for value in record.values() if value != record["rejected"])

    after = stack.metrics()

    def delta(sample: str) -> float:
        return after.get(sample, 0.0) - before.get(sample, 0.0)

    assert (
        delta(
            'retrieval_gate_chunks_total{collection="other",decision="admitted",format="qdrant",reason="NONE"}'
        )
        == 3
    )
    for reason in EXPECTED_REASONS.values():
        sample = (
            'retrieval_gate_chunks_total{collection="other",decision="rejected",'
            f'format="qdrant",reason="{reason}"}}'
        )
        assert delta(sample) == 1, reason
    assert (
        delta(
            'retrieval_gate_responses_total{collection="other",format="qdrant",outcome="filtered"}'
        )
        == 1
    )
    assert delta("retrieval_gate_decision_seconds_count") == 1


def test_audit_log_verifies_with_the_cli(stack: GateStack) -> None:
    serve(stack, "search", POINTS)
    stack.search("/collections/docs/points/search")
    done = subprocess.run(
        [*CLI, "audit", "verify", str(stack.audit_log)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "chain intact" in done.stdout


def test_everything_rejected_is_an_empty_valid_answer(stack: GateStack) -> None:
    route = serve(stack, "query", POINTS, collection="abstain")
    response = stack.search(route.path, tenant="initech", principals="user:zed")
    assert response.status == 200
    parsed = models.InlineResponse20022.model_validate_json(response.body)  # QueryResponse
    assert parsed.result is not None and parsed.result.points == []
    record = next(
        r
        for r in stack.audit_records()
        if r["decision_id"] == response.headers["x-retrieval-gate-decision-id"]
    )
    assert record["outcome"] == "abstained"


def test_identity_headers_are_stripped_and_encoding_not_requested(stack: GateStack) -> None:
    route = serve(stack, "search", POINTS, collection="headers")
    stack.upstream.requests.clear()
    stack.search(route.path, headers={"accept-encoding": "gzip, br"})
    seen = stack.upstream.requests[-1]
    assert seen.path == route.path
    assert "x-gate-tenant" not in seen.headers and "x-gate-principals" not in seen.headers
    assert "accept-encoding" not in seen.headers


def test_request_without_identity_is_refused_before_the_upstream(stack: GateStack) -> None:
    route = serve(stack, "search", POINTS, collection="anon")
    stack.upstream.requests.clear()
    response = stack.search(route.path, tenant=None, principals=None)
    assert response.status == 401
    assert response.json() == {"error": "identity_missing"}
    assert stack.upstream.requests == []


def test_collection_info_goes_out_without_point_counts(stack: GateStack) -> None:
    info = b'{"result":{"status":"green","points_count":8},"status":"ok","time":0.0001}'
    stack.upstream.respond("GET", "/collections/docs", CannedResponse(info))
    response = stack.search("/collections/docs", method="GET")
    assert response.status == 200
    assert response.json() == {
        "status": "ok",
        "time": 0.0001,
        "result": {"status": "green", "payload_schema": {}},
    }


def test_a_route_without_content_passes_untouched(stack: GateStack) -> None:
    answer = b'{"result":{"exists":true},"status":"ok","time":0.0001}'
    stack.upstream.respond("GET", "/collections/docs/exists", CannedResponse(answer))
    response = stack.search("/collections/docs/exists", method="GET")
    assert response.status == 200 and response.body == answer
    assert "x-retrieval-gate-decision-id" not in response.headers


def test_an_upstream_error_keeps_its_status_but_not_its_text(stack: GateStack) -> None:
    error = b'{"status":{"error":"Wrong input: Vector dimension error"},"time":0.0}'
    stack.upstream.respond(
        "POST", "/collections/bad/points/search", CannedResponse(error, status=400)
    )
    response = stack.search("/collections/bad/points/search")
    assert response.status == 400
    assert response.json()["error"] == "upstream_error"
    assert b"dimension" not in response.body


def test_strict_route_refuses_a_response_with_any_rejection(stack: GateStack) -> None:
    route = serve(stack, "search", POINTS, collection="strict")
    response = stack.search(route.path)
    assert response.status == 403
    assert response.json()["error"] == "rejected_chunks"
    assert b"Text of chunk" not in response.body
    clean = [p for p in POINTS if p["id"] in ADMITTED]
    serve(stack, "search", clean, collection="strict")
    assert returned_ids("search", stack.search(route.path).json()) == ADMITTED


def test_audit_route_passes_everything_but_records_what_it_would_strip(stack: GateStack) -> None:
    route = serve(stack, "search", POINTS, collection="audit")
    response = stack.search(route.path)
    assert response.status == 200
    assert returned_ids("search", response.json()) == list(CORPUS)
    record = next(
        r
        for r in stack.audit_records()
        if r["decision_id"] == response.headers["x-retrieval-gate-decision-id"]
    )
    assert record["mode"] == "audit" and record["outcome"] == "passthrough"
    assert len(record["rejected"]) == len(EXPECTED_REASONS)


def test_payload_id_field(tmp_path: Path) -> None:
    records = [record_dict("sop-1"), record_dict("sop-2", status="draft")]
    gate = GateStack(tmp_path, records, config={"id_field": "chunk_id"}).start()
    try:
        points = [
            qb.point("0b2f7e6c-9a59-4cde-8a7e-3c1c5d1c6a01", text_for("sop-1"), chunk_id="sop-1"),
            qb.point("5e9e0c1e-1f7d-4a41-9a7e-0d3b3f5f9a02", text_for("sop-2"), chunk_id="sop-2"),
        ]
        route = serve(gate, "search", points)
        response = gate.search(route.path)
        assert [h["payload"]["chunk_id"] for h in response.json()["result"]] == ["sop-1"]
    finally:
        gate.stop()


def test_body_larger_than_grpc_default_limit_is_filtered(tmp_path: Path) -> None:
    # 5 MiB is over gRPC's default 4 MiB message limit: the configured limit must apply.
    records = [record_dict(str(i)) for i in range(1, 6)]
    gate = GateStack(tmp_path, records, max_body_bytes=8 * 1024 * 1024).start()
    try:
        padding = "x" * (1024 * 1024)
        points = [qb.point(i, text_for(str(i)), padding=padding) for i in range(1, 6)]
        points.append(qb.point(99, "not in the store", padding=padding))
        route = serve(gate, "search", points)
        response = gate.search(route.path)
        assert response.status == 200, response.body[:200]
        # The padding is not a declared field: only the text goes out.
        assert [hit["id"] for hit in response.json()["result"]] == [1, 2, 3, 4, 5]
    finally:
        gate.stop()
