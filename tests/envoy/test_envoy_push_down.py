"""Tenant push-down for every database (issue 11, item 2), through a real Envoy.

The upstream is ``tests.fixtures.documented_databases``, a FAKE that answers
the gate-rewritten requests as Elasticsearch, Qdrant, Pinecone, Milvus and
Weaviate document (no real server of them runs on the build machines).
Chroma's push-down is shown against the real Chroma server in
tests/envoy/test_envoy_chroma.py (``test_a_where_filtered_query_never_sees_another_tenants_record``,
``test_match_oracles_answer_alike_whether_or_not_another_tenant_matches``).

The index holds acme's documents 1, 3, 5 and globex's 2, 4, every one with the
word "care". For each database:

- the request the upstream sees carries the caller's tenant condition ANDed
  with the app's filter, the app's filter nested untouched;
- an app filter that tries to widen the search to globex (``should``,
  ``$or``, ``Or``, ``or``) never makes the database return a globex document:
  the audit record's ``candidates`` (what the database answered) hold acme's
  only, where the same filter alone would have matched globex's (a premise
  checked against the fake directly);
- a request the gate cannot restrict is refused 400 ``request_not_filterable``
  and never reaches the upstream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from graphql import parse
from graphql.language import ast
from graphql.utilities import value_from_ast_untyped

from sidecar.demo.upstream import SeenRequest
from tests.fixtures.documented_databases import (
    Document,
    DocumentedDatabases,
    records_for,
    weaviate_uuid,
)
from tests.fixtures.harness import GateStack, HttpResult
from tests.fixtures.records import text_for

pytestmark = pytest.mark.envoy

ACME = [Document(i, "acme", text_for(str(i))) for i in (1, 3, 5)]
GLOBEX = [Document(i, "globex", text_for(str(i))) for i in (2, 4)]
ACME_IDS = [str(d.id) for d in ACME]
GLOBEX_IDS = {str(d.id) for d in GLOBEX} | {weaviate_uuid(d.id) for d in GLOBEX}
TERM = {"term": {"tenant": "acme"}}
UNCONFINED = "unconfined"  # an index and a collection with push_down = false


@pytest.fixture(scope="module")
def db() -> DocumentedDatabases:
    return DocumentedDatabases(ACME + GLOBEX)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, db: DocumentedDatabases) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("push-down"),
        records_for(ACME + GLOBEX),
        config={
            # Push-down alone: the tests compare the bodies the database gets and its
            # answers, which over-fetch (on by default) would lengthen.
            "overfetch_factor": 1,
            "routes": {
                f"/{UNCONFINED}": {"push_down": False},
                f"/collections/{UNCONFINED}": {"push_down": False},
            },
        },
    ).start()
    for collection in ("docs", UNCONFINED):
        db.mount_all(gate.upstream, collection)
    yield gate
    gate.stop()


def send(stack: GateStack, path: str, body: Any, tenant: str = "acme") -> tuple[HttpResult, Any]:
    """Search through the gate: the answer, and the request body the upstream saw."""
    stack.upstream.requests.clear()
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    response = stack.search(path, body=raw, tenant=tenant)
    assert response.status == 200, response.body
    (seen,) = stack.upstream.requests
    return response, seen.body


def candidates(stack: GateStack, response: HttpResult) -> list[str]:
    """The chunk ids the database answered with, as the decision's audit record lists them."""
    decision = response.headers["x-retrieval-gate-decision-id"]
    record = next(r for r in stack.audit_records() if r["decision_id"] == decision)
    return [str(c) for c in record.get("candidates", [])]


def assert_confined(stack: GateStack, response: HttpResult, expected: list[str]) -> None:
    """The database answered with acme's documents only, the client got them all."""
    found = candidates(stack, response)
    assert found == expected
    assert not GLOBEX_IDS & set(found)


def premise(db: DocumentedDatabases, handler: Any, path: str, body: Any) -> bytes:
    """What the fake answers to the app's request as the app wrote it (no tenant condition)."""
    request = SeenRequest("POST", path, {}, orjson.dumps(body))
    return orjson.dumps(handler(request))


# -- Elasticsearch ----------------------------------------------------------------

ES_WIDENING = {"bool": {"should": [{"term": {"tenant": "globex"}}, {"match": {"text": "care"}}]}}


def test_elasticsearch_search_is_confined_and_a_should_cannot_widen_it(
    stack: GateStack, db: DocumentedDatabases
) -> None:
    assert b'"_id":"2"' in premise(
        db, db.elasticsearch_search, "/docs/_search", {"query": ES_WIDENING}
    )
    response, sent = send(stack, "/docs/_search", {"query": ES_WIDENING})
    assert orjson.loads(sent)["query"] == {"bool": {"filter": [TERM], "must": [ES_WIDENING]}}
    assert_confined(stack, response, ACME_IDS)
    assert [h["_id"] for h in response.json()["hits"]["hits"]] == ACME_IDS


def test_control_without_push_down_the_database_answers_with_another_tenants_documents(
    stack: GateStack,
) -> None:
    response, sent = send(stack, f"/{UNCONFINED}/_search", {"query": ES_WIDENING})
    assert orjson.loads(sent) == {"query": ES_WIDENING}
    assert {"2", "4"} <= set(candidates(stack, response))
    # The response check still removes them.
    assert [h["_id"] for h in response.json()["hits"]["hits"]] == ACME_IDS


def test_elasticsearch_msearch_confines_every_line(stack: GateStack) -> None:
    lines = [{"index": "docs"}, {"query": ES_WIDENING}, {}, {"size": 2}]
    body = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    response, sent = send(stack, "/_msearch", body)
    seen = [orjson.loads(line) for line in sent.splitlines()]
    assert seen[0] == {"index": "docs"} and seen[2] == {}
    assert seen[1]["query"] == {"bool": {"filter": [TERM], "must": [ES_WIDENING]}}
    assert seen[3]["query"] == {"bool": {"filter": [TERM], "must": [{"match_all": {}}]}}
    assert_confined(stack, response, ACME_IDS + ACME_IDS[:2])
    items = response.json()["responses"]
    assert [[h["_id"] for h in item["hits"]["hits"]] for item in items] == [ACME_IDS, ["1", "3"]]


def test_elasticsearch_knn_chooses_its_k_nearest_among_the_callers_documents(
    stack: GateStack,
) -> None:
    # Globex's document 2 is nearer than acme's 3: confined, the k nearest are acme's.
    knn = {"field": "vector", "query_vector": [0.1, 0.2], "k": 2, "num_candidates": 10}
    widening = {**knn, "filter": ES_WIDENING}
    response, sent = send(stack, "/docs/_search", {"knn": widening})
    assert orjson.loads(sent)["knn"]["filter"] == {"bool": {"filter": [TERM, ES_WIDENING]}}
    assert_confined(stack, response, ["1", "3"])
    assert [h["_id"] for h in response.json()["hits"]["hits"]] == ["1", "3"]


# -- Qdrant ------------------------------------------------------------------------

QDRANT_WIDENING = {
    "should": [
        {"key": "tenant", "match": {"value": "globex"}},
        {"key": "text", "match": {"text": "care"}},
    ]
}
QDRANT_SEARCH = {"vector": [0.1, 0.2], "limit": 3, "with_payload": True, "filter": QDRANT_WIDENING}


def test_qdrant_search_is_confined_and_a_should_cannot_widen_it(
    stack: GateStack, db: DocumentedDatabases
) -> None:
    path = "/collections/docs/points/search"
    assert b'"id":2' in premise(db, db.qdrant_search, path, QDRANT_SEARCH)
    response, sent = send(stack, path, QDRANT_SEARCH)
    condition = {"key": "tenant", "match": {"value": "acme"}}
    assert orjson.loads(sent)["filter"] == {"must": [condition, QDRANT_WIDENING]}
    assert_confined(stack, response, ACME_IDS)
    assert [p["id"] for p in response.json()["result"]] == [1, 3, 5]


def test_control_qdrant_without_push_down_the_database_answers_with_globex_points(
    stack: GateStack,
) -> None:
    response, _ = send(stack, f"/collections/{UNCONFINED}/points/search", QDRANT_SEARCH)
    assert "2" in candidates(stack, response)


def test_qdrant_scroll_is_confined(stack: GateStack) -> None:
    body = {"limit": 10, "filter": QDRANT_WIDENING}
    response, sent = send(stack, "/collections/docs/points/scroll", body)
    assert orjson.loads(sent)["filter"]["must"][1] == QDRANT_WIDENING
    assert_confined(stack, response, ACME_IDS)


# -- Pinecone ----------------------------------------------------------------------

PINECONE_WIDENING = {"$or": [{"tenant": {"$eq": "globex"}}, {"tenant": "acme"}]}


def test_pinecone_query_is_confined_and_an_or_cannot_widen_it(
    stack: GateStack, db: DocumentedDatabases
) -> None:
    body = {"vector": [0.1, 0.2], "topK": 3, "includeMetadata": True, "filter": PINECONE_WIDENING}
    assert b'"id":"2"' in premise(db, db.pinecone_query, "/query", body)
    response, sent = send(stack, "/query", body)
    assert orjson.loads(sent)["filter"] == {
        "$and": [{"tenant": {"$eq": "acme"}}, PINECONE_WIDENING]
    }
    assert_confined(stack, response, ACME_IDS)
    assert [m["id"] for m in response.json()["matches"]] == ACME_IDS


# -- Milvus ------------------------------------------------------------------------

MILVUS_WIDENING = 'tenant == "globex" or text like "%care%"'


def milvus_search(app_filter: str | None) -> dict[str, Any]:
    """A Milvus search body with ``app_filter`` (none when None)."""
    body: dict[str, Any] = {
        "collectionName": "docs",
        "data": [[0.1, 0.2]],
        "limit": 3,
        "outputFields": ["text"],
    }
    if app_filter is not None:
        body["filter"] = app_filter
    return body


def test_milvus_search_is_confined_and_an_or_cannot_widen_it(
    stack: GateStack, db: DocumentedDatabases
) -> None:
    path = "/v2/vectordb/entities/search"
    assert b'"id":2' in premise(db, db.milvus_search, path, milvus_search(MILVUS_WIDENING))
    response, sent = send(stack, path, milvus_search(MILVUS_WIDENING))
    assert orjson.loads(sent)["filter"] == f'tenant == "acme" and ({MILVUS_WIDENING})'
    assert_confined(stack, response, ACME_IDS)
    assert [row["id"] for row in response.json()["data"]] == [1, 3, 5]


def test_milvus_query_is_confined(stack: GateStack) -> None:
    body = {"collectionName": "docs", "filter": MILVUS_WIDENING, "outputFields": ["text"]}
    response, sent = send(stack, "/v2/vectordb/entities/query", body)
    assert orjson.loads(sent)["filter"] == f'tenant == "acme" and ({MILVUS_WIDENING})'
    assert_confined(stack, response, ACME_IDS)


def test_a_milvus_tenant_id_cannot_change_the_expressions_meaning(stack: GateStack) -> None:
    # Spliced unquoted, this tenant would read: tenant == "x" or tenant != "" (every row).
    tenant = 'x" or tenant != "'
    response, sent = send(stack, "/v2/vectordb/entities/search", milvus_search(None), tenant=tenant)
    assert orjson.loads(sent)["filter"] == 'tenant == "x\\" or tenant != \\""'
    assert candidates(stack, response) == []
    assert response.json()["data"] == []


# -- Weaviate ----------------------------------------------------------------------

WEAVIATE_WIDENING = (
    '{operator: Or, operands: [{path: ["tenant"], operator: Equal, valueText: "globex"}, '
    '{path: ["text"], operator: Like, valueText: "care"}]}'
)
WEAVIATE_QUERY = (
    "{ Get { Chunk(limit: 5, where: " + WEAVIATE_WIDENING + ") { text _additional { id } } } }"
)


def where_argument(query: str) -> Any:
    """The ``where`` of the one class field of a ``Get`` query, as a plain value."""
    operation = parse(query).definitions[0]
    assert isinstance(operation, ast.OperationDefinitionNode)
    (get,) = operation.selection_set.selections
    assert isinstance(get, ast.FieldNode) and get.selection_set is not None
    (chunk,) = get.selection_set.selections
    assert isinstance(chunk, ast.FieldNode)
    (where,) = (a for a in chunk.arguments if a.name.value == "where")
    return value_from_ast_untyped(where.value)


def test_weaviate_get_is_confined_and_an_or_cannot_widen_it(
    stack: GateStack, db: DocumentedDatabases
) -> None:
    body = {"query": WEAVIATE_QUERY}
    assert weaviate_uuid(2).encode() in premise(db, db.weaviate_graphql, "/v1/graphql", body)
    response, sent = send(stack, "/v1/graphql", body)
    assert where_argument(orjson.loads(sent)["query"]) == {
        "operator": "And",
        "operands": [
            {"path": ["tenant"], "operator": "Equal", "valueText": "acme"},
            where_argument(WEAVIATE_QUERY),
        ],
    }
    expected = [weaviate_uuid(d.id) for d in ACME]
    assert_confined(stack, response, expected)
    assert [o["_additional"]["id"] for o in response.json()["data"]["Get"]["Chunk"]] == expected


# -- what cannot be restricted is refused before the upstream ----------------------

NOT_FILTERABLE: dict[str, tuple[str, str, bytes | None]] = {
    # Elasticsearch: a search without a body is every tenant's documents.
    "es-bodyless-get": ("GET", "/docs/_search", None),
    # q replaces the body's query, the tenant term with it.
    "es-q-parameter": ("GET", "/docs/_search?q=secret", None),
    "es-q-parameter-post": ("POST", "/docs/_search?q=secret", b"{}"),
    "es-terms-lookup": (
        "POST",
        "/docs/_search",
        b'{"query": {"terms": {"tenant": {"index": "users", "id": "1", "path": "t"}}}}',
    ),
    "es-runtime-mappings": (
        "POST",
        "/docs/_search",
        b'{"runtime_mappings": {"tenant": {"type": "keyword"}}, "query": {"match_all": {}}}',
    ),
    "es-search-template": ("POST", "/docs/_search/template", b'{"id": "t", "params": {}}'),
    "es-msearch-more-like-this": (
        "POST",
        "/_msearch",
        b'{"index": "docs"}\n{"query": {"more_like_this": {"like": [{"_id": "2"}]}}}\n',
    ),
    # Qdrant: a point id as an example is looked up past the filter.
    "qdrant-recommend-by-id": (
        "POST",
        "/collections/docs/points/recommend",
        b'{"positive": [2], "limit": 3}',
    ),
    # Pinecone: a query by record id.
    "pinecone-query-by-id": ("POST", "/query", b'{"id": "2", "topK": 3}'),
    # Milvus: a filter that would close the gate's parenthesis; ids; a case variant key.
    "milvus-closing-parenthesis": (
        "POST",
        "/v2/vectordb/entities/search",
        b'{"collectionName": "docs", "data": [[0.1]], "filter": "x) or (true"}',
    ),
    "milvus-by-primary-key": (
        "POST",
        "/v2/vectordb/entities/search",
        b'{"collectionName": "docs", "ids": [2]}',
    ),
    "milvus-case-variant": (
        "POST",
        "/v2/vectordb/entities/query",
        b'{"collectionName": "docs", "filter": "true", "Filter": "true"}',
    ),
    # Weaviate: an object named by id, and roots that compute over every object.
    "weaviate-near-object": (
        "POST",
        "/v1/graphql",
        orjson.dumps(
            {"query": '{ Get { Chunk(nearObject: {id: "' + weaviate_uuid(2) + '"}) { text } } }'}
        ),
    ),
    "weaviate-aggregate": (
        "POST",
        "/v1/graphql",
        orjson.dumps({"query": "{ Aggregate { Chunk { meta { count } } } }"}),
    ),
}


@pytest.mark.parametrize("name", sorted(NOT_FILTERABLE))
def test_a_request_the_gate_cannot_restrict_never_reaches_the_upstream(
    stack: GateStack, name: str
) -> None:
    method, path, body = NOT_FILTERABLE[name]
    stack.upstream.requests.clear()
    response = stack.search(path, method=method, body=body or b"")
    assert response.status == 400, response.body
    assert response.json() == {"error": "request_not_filterable"}
    assert stack.upstream.requests == []
