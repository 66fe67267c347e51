"""Supersession through a real Envoy: a stale index hit replaced by its successor.

The fixture upstream (a fake Qdrant) still serves the superseded revision, as an
index that has not been re-embedded would; the store knows the successor.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sidecar.core.integrity import canonical_sha256
from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import GateStack
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

V3_TEXT = "SOP-7 rev 3: sterilise at 121 C for 20 minutes."
RECORDS = [
    record_dict(
        "sop-7-v2", doc_id="SOP-7", version="2", status="superseded", superseded_by="sop-7-v3"
    ),
    record_dict(
        "sop-7-v3", doc_id="SOP-7", version="3", text=V3_TEXT, sha256=canonical_sha256(V3_TEXT)
    ),
    record_dict("sop-8-v1", doc_id="SOP-8", status="superseded", superseded_by="sop-8-v2"),
    # The successor exists but this caller may not read it.
    record_dict(
        "sop-8-v2",
        doc_id="SOP-8",
        version="2",
        text="rev 2",
        sha256=canonical_sha256("rev 2"),
        allowed_principals=["group:hr"],
    ),
    record_dict("other"),
]
POINTS = [
    qb.point(1, text_for("sop-7-v2"), chunk_id="sop-7-v2", score=0.9),
    qb.point(2, text_for("sop-8-v1"), chunk_id="sop-8-v1", score=0.8),
    qb.point(3, text_for("other"), chunk_id="other", score=0.7),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("supersession"),
        RECORDS,
        config={
            "id_field": "chunk_id",
            "routes": {"/collections/current/": {"substitute_superseded": True}},
        },
    ).start()
    body = qb.encode(qb.search_body(POINTS))
    for collection in ("current", "plain"):
        gate.upstream.respond(
            "POST", f"/collections/{collection}/points/search", CannedResponse(body)
        )
    yield gate
    gate.stop()


def test_superseded_chunk_is_replaced_by_its_admitted_successor(stack: GateStack) -> None:
    response = stack.search("/collections/current/points/search")
    assert response.status == 200
    hits = response.json()["result"]
    assert [h["payload"]["chunk_id"] for h in hits] == ["sop-7-v3", "other"]
    assert hits[0]["payload"]["text"] == V3_TEXT
    assert hits[0]["payload"]["retrieval_gate_substituted_for"] == "sop-7-v2"
    assert hits[0]["score"] == 0.9  # rank position kept
    record = next(
        r
        for r in stack.audit_records()
        if r["decision_id"] == response.headers["x-retrieval-gate-decision-id"]
    )
    assert record["substituted"] == [
        {"position": 0, "chunk_id": "sop-7-v2", "substitute": "sop-7-v3"}
    ]
    assert record["admitted"] == ["sop-7-v3", "other"]
    reasons = {r["chunk_id"]: r["reasons"] for r in record["rejected"]}
    assert reasons == {"sop-7-v2": ["STATUS_SUPERSEDED"], "sop-8-v1": ["STATUS_SUPERSEDED"]}
    assert stack.metrics()["retrieval_gate_substitutions_total"] >= 1


def test_without_substitution_the_superseded_chunk_is_only_removed(stack: GateStack) -> None:
    response = stack.search("/collections/plain/points/search")
    assert [h["payload"]["chunk_id"] for h in response.json()["result"]] == ["other"]
