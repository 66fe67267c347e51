"""Every non-Qdrant format through a real Envoy, detected by route with no format flag.

The upstream is the fixture server (sidecar.demo.upstream, a fake that replays
canned bodies); the bodies come from the per-format fixture builders, whose
modules name the API specifications they follow. Chroma has its own live test
against a real Chroma server (test_envoy_chroma.py).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from sidecar.demo.upstream import CannedResponse
from tests.fixtures import elasticsearch_bodies as es
from tests.fixtures import milvus_bodies as milvus
from tests.fixtures import pinecone_bodies as pinecone
from tests.fixtures import weaviate_bodies as weaviate
from tests.fixtures.harness import GateStack
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

UUID_OK, UUID_REVOKED, UUID_FOREIGN = weaviate.UUIDS[1:4]
# Chunk ids: "1" is admitted, "2" revoked, "3" another tenant's; the same for the UUIDs.
RECORDS = [
    record_dict("1"),
    record_dict("2", status="revoked"),
    record_dict("3", tenant_id="globex"),
    record_dict(UUID_OK),
    record_dict(UUID_REVOKED, status="revoked"),
    record_dict(UUID_FOREIGN, tenant_id="globex"),
]
INHOUSE = {
    "adapter": "generic",
    "routes": ["POST /api/retrieve"],
    "hits": "$.results[*]",
    "id": "doc_id",
    "text": "content",
    "count_fields": ["$.total"],
    "remove_fields": ["$.facets"],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("formats"), RECORDS, config={"formats": {"inhouse": INHOUSE}}
    ).start()
    yield gate
    gate.stop()


GRAPHQL_GET = orjson.dumps({"query": "{ Get { Chunk { text _additional { id distance } } } }"})


def through(
    stack: GateStack,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    request: bytes = b"{}",
) -> Any:
    stack.upstream.respond(
        method,
        path,
        CannedResponse(body, headers={"content-type": "application/json", **(headers or {})}),
    )
    response = stack.search(path, method=method, body=request)
    assert response.status == 200, response.body
    assert response.headers["content-length"] == str(len(response.body))
    return response


def test_elasticsearch_search_keeps_admitted_hits_and_recomputes_totals(stack: GateStack) -> None:
    hits = [es.hit(i, text_for(i), score=s) for i, s in (("2", 3.0), ("1", 2.0), ("3", 1.0))]
    body = es.search_body(hits, total=40, relation="eq")
    response = through(stack, "POST", "/docs/_search", es.encode(body))
    document = response.json()
    assert [h["_id"] for h in document["hits"]["hits"]] == ["1"]
    # What the client got, never how many matched: that would count rejected hits.
    assert document["hits"]["total"] == {"value": 1, "relation": "eq"}
    assert document["hits"]["max_score"] == 2.0
    assert "x-retrieval-gate-rejected" not in response.headers


def test_elasticsearch_aggregations_never_pass_even_when_every_hit_is_admitted(
    stack: GateStack,
) -> None:
    body = es.search_body([es.hit("1", text_for("1"))])
    body["aggregations"] = {"by_tenant": {"buckets": [{"key": "globex", "doc_count": 9}]}}
    body["suggest"] = {"s": [{"text": "x", "offset": 0, "length": 1, "options": []}]}
    response = through(stack, "POST", "/docs/_search", es.encode(body))
    document = response.json()
    assert [h["_id"] for h in document["hits"]["hits"]] == ["1"]
    assert "aggregations" not in document and "suggest" not in document
    assert b"globex" not in response.body


def test_elasticsearch_msearch_filters_every_item(stack: GateStack) -> None:
    items = [
        es.msearch_item([es.hit("1", text_for("1")), es.hit("2", text_for("2"))]),
        es.error_item(),
        es.msearch_item([es.hit("3", text_for("3"))]),
    ]
    # Three header + body line pairs, as Elasticsearch requires.
    searches = b'{"index": "docs"}\n{}\n' * 3
    response = through(
        stack, "POST", "/_msearch", es.encode(es.msearch_body(items)), request=searches
    )
    first, error, last = response.json()["responses"]
    assert [h["_id"] for h in first["hits"]["hits"]] == ["1"]
    # The gate writes the error item: an upstream error's text can quote documents.
    assert error["status"] == 404
    assert error["error"]["type"] == "retrieval_gate_upstream_error"
    assert "index_not_found" not in response.body.decode()
    assert last["hits"]["hits"] == []


def test_gzip_elasticsearch_body_is_decoded_and_filtered(stack: GateStack) -> None:
    body = es.encode(es.search_body([es.hit("1", text_for("1")), es.hit("2", text_for("2"))]))
    response = through(
        stack, "POST", "/gz/_search", gzip.compress(body), {"content-encoding": "gzip"}
    )
    assert "content-encoding" not in response.headers
    assert [h["_id"] for h in response.json()["hits"]["hits"]] == ["1"]


def test_weaviate_graphql_get(stack: GateStack) -> None:
    objects = [
        weaviate.hit(uuid, text_for(uuid), distance=d)
        for uuid, d in ((UUID_FOREIGN, 0.1), (UUID_OK, 0.2), (UUID_REVOKED, 0.3))
    ]
    body = weaviate.get_body({"Chunk": objects})
    response = through(stack, "POST", "/v1/graphql", weaviate.encode(body), request=GRAPHQL_GET)
    kept = response.json()["data"]["Get"]["Chunk"]
    assert [o["_additional"]["id"] for o in kept] == [UUID_OK]
    assert kept[0]["text"] == text_for(UUID_OK)


def test_weaviate_grouped_generative_answer_is_stripped_when_a_source_was_removed(
    stack: GateStack,
) -> None:
    objects = [
        weaviate.hit(
            UUID_OK,
            text_for(UUID_OK),
            additional={"generate": weaviate.generate(grouped="a summary of everything")},
        ),
        weaviate.hit(UUID_REVOKED, text_for(UUID_REVOKED)),
    ]
    response = through(
        stack,
        "POST",
        "/v1/graphql",
        weaviate.encode(weaviate.get_body({"Chunk": objects})),
        request=GRAPHQL_GET,
    )
    assert b"a summary of everything" not in response.body
    (kept,) = response.json()["data"]["Get"]["Chunk"]
    assert kept["_additional"]["generate"]["groupedResult"] is None


def test_pinecone_query(stack: GateStack) -> None:
    matches = [pinecone.match(i, text_for(i)) for i in ("3", "1", "2")]
    response = through(stack, "POST", "/query", pinecone.encode(pinecone.query_body(matches)))
    document = response.json()
    assert [m["id"] for m in document["matches"]] == ["1"]
    assert document["namespace"] == pinecone.NAMESPACE


def test_pinecone_records_search(stack: GateStack) -> None:
    hits = [pinecone.record_hit(i, text_for(i)) for i in ("1", "2")]
    route = pinecone.search_route()
    search = b'{"query": {"top_k": 2, "inputs": {"text": "q"}}}'
    response = through(
        stack, "POST", route.path, pinecone.encode(pinecone.search_body(hits)), request=search
    )
    assert [h["_id"] for h in response.json()["result"]["hits"]] == ["1"]


def test_milvus_search_keeps_topks_consistent(stack: GateStack) -> None:
    groups = [
        [milvus.row(1, text_for("1"), distance=0.1), milvus.row(2, text_for("2"), distance=0.2)],
        [milvus.row(3, text_for("3"), distance=0.3)],
    ]
    response = through(
        stack,
        "POST",
        milvus.route("search").path,
        milvus.encode(milvus.search_body(groups)),
    )
    document = response.json()
    assert [row["id"] for row in document["data"]] == [1]
    assert document["topks"] == [1, 0]


def test_milvus_error_keeps_its_code_but_not_its_text(stack: GateStack) -> None:
    # Milvus answers errors with HTTP 200; their text can quote expressions and values.
    body = milvus.encode(milvus.error_body(1100, "collection not found: hr-secrets"))
    response = through(stack, "POST", milvus.route("query").path, body)
    assert response.json() == {
        "code": 1100,
        "message": "retrieval_gate: the database answered an error",
    }


def test_generic_adapter_from_configuration(stack: GateStack) -> None:
    body = {
        "results": [{"doc_id": i, "content": text_for(i), "score": 1} for i in ("2", "1", "3")],
        "total": 3,
        "facets": {"tenant": {"globex": 1}},
    }
    response = through(stack, "POST", "/api/retrieve", orjson.dumps(body))
    document = response.json()
    assert [r["doc_id"] for r in document["results"]] == ["1"]
    assert document["total"] == 1
    assert "facets" not in document


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/docs/_doc/2"),  # a document by id: content the gate cannot filter
        ("POST", "/docs/_bulk"),
        ("POST", "/vectors/upsert"),
        ("POST", "/v2/vectordb/entities/insert"),
        ("GET", "/v1/objects"),
        ("POST", "/v1/batch/objects"),
    ],
)
def test_unfiltered_content_and_writes_are_forbidden_by_default(
    stack: GateStack, method: str, path: str
) -> None:
    stack.upstream.respond(method, path, CannedResponse(b'{"secret": "unfiltered"}'))
    response = stack.search(path, method=method)
    assert response.status == 403, (path, response.status)
    assert b"unfiltered" not in response.body
