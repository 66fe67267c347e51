"""Integrity beyond the text (issue 11, item 6), through a real Envoy.

With ``formats.qdrant.hashed_fields = ["title"]`` the chunk record vouches for
the title as well as the text: ``store load`` computes the record's
``payload_sha256`` from its ``payload`` (sidecar/store/loader.py). A hit
whose title was edited in the index is rejected ``PAYLOAD_HASH_MISMATCH``
(audit record and metrics), as is a hit whose record vouches for no payload;
an intact hit goes out with its title; ``releasable_fields`` go out
unverified; every other payload field (the tenant, access lists, notes) is
dropped.

The upstream is ``tests.fixtures.documented_databases`` (a FAKE Qdrant that
searches the documents it holds; no Qdrant server runs on the build
machines).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from sidecar.demo.upstream import SeenRequest
from tests.fixtures.documented_databases import Document, DocumentedDatabases, record_for
from tests.fixtures.harness import GateStack, HttpResult
from tests.fixtures.records import text_for

pytestmark = pytest.mark.envoy

ACL = "acl-group-hr-only"  # an undeclared field's value: must never go out
NOTE = "note-kept-in-the-index"


def document(doc_id: int, title: str, page: Any) -> Document:
    """An acme document with a title, a page and two fields nobody declared."""
    return Document(
        doc_id,
        "acme",
        text_for(str(doc_id)),
        {"title": title, "page": page, "acl": ACL, "note": NOTE},
    )


INTACT = document(1, "Employee handbook", 3)
TAMPERED = document(3, "Tampered title", 4)  # the record vouches for "Quarterly plan"
PAGE_EDITED = document(5, "Travel policy", "edited in the index")  # page: releasable
UNVOUCHED = document(7, "No payload hash", 8)  # the record has no payload_sha256
DOCUMENTS = [INTACT, TAMPERED, PAGE_EDITED, UNVOUCHED]
RECORDS = [
    record_for(INTACT, payload={"title": "Employee handbook"}),
    record_for(TAMPERED, payload={"title": "Quarterly plan"}),
    record_for(PAGE_EDITED, payload={"title": "Travel policy"}),
    record_for(UNVOUCHED),
]
SEARCH = "/collections/docs/points/search"
REQUEST = {"vector": [0.1, 0.2], "limit": 10, "with_payload": True}
MISMATCH = (
    "retrieval_gate_chunks_total"
    '{collection="other",decision="rejected",format="qdrant",reason="PAYLOAD_HASH_MISMATCH"}'
)


@pytest.fixture(scope="module")
def db() -> DocumentedDatabases:
    return DocumentedDatabases(DOCUMENTS)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, db: DocumentedDatabases) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("payload-integrity"),
        RECORDS,
        config={"formats": {"qdrant": {"hashed_fields": ["title"], "releasable_fields": ["page"]}}},
    ).start()
    db.mount_all(gate.upstream)
    yield gate
    gate.stop()


@pytest.fixture(scope="module")
def searched(stack: GateStack) -> tuple[HttpResult, dict[str, float], dict[str, float]]:
    """One search through the gate, with the metrics before and after it."""
    before = stack.metrics()
    response = stack.search(SEARCH, body=orjson.dumps(REQUEST))
    assert response.status == 200, response.body
    return response, before, stack.metrics()


def test_the_index_serves_every_field_to_whoever_asks_it(db: DocumentedDatabases) -> None:
    # The premise: without the gate, the tampered title and the undeclared fields go out.
    answer = orjson.dumps(db.qdrant_search(SeenRequest("POST", SEARCH, {}, orjson.dumps(REQUEST))))
    assert b"Tampered title" in answer and ACL.encode() in answer


def test_an_intact_hit_goes_out_with_its_title_and_releasable_fields_only(
    searched: tuple[HttpResult, dict[str, float], dict[str, float]],
) -> None:
    response, _, _ = searched
    points = {point["id"]: point for point in response.json()["result"]}
    assert sorted(points) == [INTACT.id, PAGE_EDITED.id]
    assert points[INTACT.id]["payload"] == {
        "text": INTACT.text,
        "title": "Employee handbook",
        "page": 3,
    }
    # page is releasable: it goes out unverified, as the index has it.
    assert points[PAGE_EDITED.id]["payload"]["page"] == "edited in the index"


def test_undeclared_payload_fields_never_go_out(
    searched: tuple[HttpResult, dict[str, float], dict[str, float]],
) -> None:
    response, _, _ = searched
    for point in response.json()["result"]:
        assert set(point["payload"]) == {"text", "title", "page"}
    for value in (ACL, NOTE, '"tenant"', "acme"):
        assert value.encode() not in response.body


def test_a_tampered_title_is_rejected_with_its_reason_in_the_audit_record_and_metrics(
    stack: GateStack, searched: tuple[HttpResult, dict[str, float], dict[str, float]]
) -> None:
    response, before, after = searched
    assert b"Tampered title" not in response.body and b"Quarterly plan" not in response.body
    decision = response.headers["x-retrieval-gate-decision-id"]
    record = next(r for r in stack.audit_records() if r["decision_id"] == decision)
    assert record["admitted"] == [str(INTACT.id), str(PAGE_EDITED.id)]
    rejected = {r["chunk_id"]: r for r in record["rejected"]}
    assert rejected[str(TAMPERED.id)]["reasons"] == ["PAYLOAD_HASH_MISMATCH"]
    assert "detail" not in rejected[str(TAMPERED.id)]
    # A record that vouches for no payload rejects its hit once fields are declared.
    assert rejected[str(UNVOUCHED.id)]["reasons"] == ["PAYLOAD_HASH_MISMATCH"]
    assert rejected[str(UNVOUCHED.id)]["detail"] == "record has no payload_sha256"
    assert b"No payload hash" not in response.body
    assert after.get(MISMATCH, 0.0) - before.get(MISMATCH, 0.0) == 2
