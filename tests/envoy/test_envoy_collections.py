"""Collection ownership sees every collection a request names (issue 11, item 4).

Policy data reserves the collection ``finance`` to tenant globex
(``data.retrieval_gate.collections``, policies/request.rego). A caller of
acme is refused 403 ``COLLECTION_FORBIDDEN`` however the request names
finance: in the path, by a wildcard or a list, as every index (``_all``, no
index), in a multi-search header line, or as a Qdrant lookup collection. The
refusal comes before the upstream, so nothing of finance is read. The same
requests by globex, finance's owner, are allowed (the refusal is about
ownership, not the route), and so are acme's own index and a wildcard that
matches no reserved collection.

The upstream is ``tests.fixtures.documented_databases`` (a FAKE of the
databases' search APIs; no real server of them runs on the build machines).
Chroma names collections by id on its record routes, so ownership is keyed
by id there: that is shown through the real Chroma server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import chromadb
import orjson
import pytest
from chromadb.api.types import PyEmbeddings
from chromadb.config import Settings

from tests.fixtures.chroma_server import ChromaServer, chroma_server_fixture  # noqa: F401
from tests.fixtures.documented_databases import Document, DocumentedDatabases, records_for
from tests.fixtures.harness import GateStack
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

# "Finance": Weaviate's class names are capitalised.
RESERVED = {
    "retrieval_gate": {
        "collections": {"finance": {"tenants": ["globex"]}, "Finance": {"tenants": ["globex"]}}
    }
}
FORBIDDEN = {"error": "forbidden", "reasons": ["COLLECTION_FORBIDDEN"]}
DOCUMENTS = [Document(1, "acme", text_for("1")), Document(2, "globex", text_for("2"))]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("collections"), records_for(DOCUMENTS), policy_data=RESERVED
    ).start()
    db = DocumentedDatabases(DOCUMENTS)
    for collection in ("docs", "finance"):
        db.mount_all(gate.upstream, collection)
    for index in ("do*", "fin*", "_all", "docs,finance"):
        db.mount(gate.upstream, "POST", f"/{index}/_search", db.elasticsearch_search)
    for endpoint in ("recommend", "search/groups"):
        # What Qdrant answers matters not: these requests must not reach it.
        db.mount(gate.upstream, "POST", f"/collections/docs/points/{endpoint}", db.qdrant_search)
    yield gate
    gate.stop()


ES_SEARCH = b'{"query": {"match_all": {}}}'
VECTOR = [0.1, 0.2]
# Requests naming finance, each in a different way.
NAMING_FINANCE: dict[str, tuple[str, bytes]] = {
    "path": ("/finance/_search", ES_SEARCH),
    "wildcard": ("/fin*/_search", ES_SEARCH),
    "all": ("/_all/_search", ES_SEARCH),
    "every-index": ("/_search", ES_SEARCH),
    "list": ("/docs,finance/_search", ES_SEARCH),
    "msearch-header": (
        "/_msearch",
        b'{"index": "docs"}\n{}\n{"index": "finance"}\n{}\n',
    ),
    "msearch-header-list": ("/docs/_msearch", b'{"index": ["docs", "finance"]}\n{}\n'),
    "qdrant-path": (
        "/collections/finance/points/search",
        orjson.dumps({"vector": VECTOR, "limit": 3, "with_payload": True}),
    ),
    "qdrant-lookup-from": (
        "/collections/docs/points/recommend",
        orjson.dumps({"positive": [VECTOR], "limit": 3, "lookup_from": {"collection": "finance"}}),
    ),
    "qdrant-batch-lookup-from": (
        "/collections/docs/points/recommend/batch",
        orjson.dumps(
            {
                "searches": [
                    {"positive": [VECTOR], "limit": 3},
                    {"positive": [VECTOR], "limit": 3, "lookup_from": {"collection": "finance"}},
                ]
            }
        ),
    ),
    "qdrant-prefetch-lookup-from": (
        "/collections/docs/points/query",
        orjson.dumps(
            {
                "prefetch": {
                    "query": {"recommend": {"positive": [VECTOR]}},
                    "lookup_from": {"collection": "finance"},
                },
                "query": {"fusion": "rrf"},
                "limit": 3,
            }
        ),
    ),
    "msearch-header-comma-list": ("/_msearch", b'{"index": "docs,finance"}\n{}\n'),
    "weaviate-class": (
        "/v1/graphql",
        orjson.dumps({"query": "{ Get { Finance { text _additional { id } } } }"}),
    ),
    "weaviate-aliased-class": (
        "/v1/graphql",
        orjson.dumps({"query": "{ Get { Chunk: Finance { text _additional { id } } } }"}),
    ),
    "pinecone-namespace": (
        "/query",
        orjson.dumps({"vector": VECTOR, "topK": 3, "namespace": "finance"}),
    ),
    "milvus-collection": (
        "/v2/vectordb/entities/search",
        orjson.dumps({"collectionName": "finance", "data": [VECTOR], "limit": 3}),
    ),
    "milvus-hybrid-collection": (
        "/v2/vectordb/entities/hybrid_search",
        orjson.dumps(
            {
                "collectionName": "finance",
                "search": [{"data": [VECTOR], "annsField": "v", "limit": 3}],
                "rerank": {"strategy": "rrf", "params": {"k": 10}},
                "limit": 3,
            }
        ),
    ),
    "qdrant-with-lookup": (
        "/collections/docs/points/search/groups",
        orjson.dumps(
            {
                "vector": VECTOR,
                "group_by": "doc",
                "limit": 2,
                "group_size": 1,
                "with_lookup": "finance",
            }
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(NAMING_FINANCE))
def test_a_reserved_collection_is_refused_however_it_is_named(stack: GateStack, name: str) -> None:
    path, body = NAMING_FINANCE[name]
    stack.upstream.requests.clear()
    response = stack.search(path, body=body)
    assert response.status == 403, response.body
    assert response.json() == FORBIDDEN
    assert stack.upstream.requests == []


@pytest.mark.parametrize(
    "name", ["path", "wildcard", "all", "every-index", "list", "msearch-header", "qdrant-path"]
)
def test_control_the_owner_of_the_collection_is_allowed(stack: GateStack, name: str) -> None:
    path, body = NAMING_FINANCE[name]
    response = stack.search(path, body=body, tenant="globex")
    assert response.status == 200, response.body


@pytest.mark.parametrize("path", ["/docs/_search", "/do*/_search"])
def test_the_callers_own_index_and_a_pattern_sparing_finance_are_allowed(
    stack: GateStack, path: str
) -> None:
    response = stack.search(path, body=ES_SEARCH)
    assert response.status == 200, response.body
    assert [hit["_id"] for hit in response.json()["hits"]["hits"]] == ["1"]


# -- Chroma: ownership keyed by collection id, through the real server ----------------


EMBEDDING: PyEmbeddings = [[0.1, 0.2]]
CHROMA_PATH = "/api/v2/tenants/default_tenant/databases/default_database/collections/{}/query"


@pytest.fixture(scope="module")
def chroma_ids(chroma_server: ChromaServer) -> dict[str, str]:
    """Two collections in the real Chroma server, each with one acme record: name -> id."""
    client = chromadb.HttpClient(
        host="127.0.0.1", port=chroma_server.port, settings=Settings(anonymized_telemetry=False)
    )
    ids = {}
    for name in ("reserved", "open"):
        collection = client.create_collection(name, embedding_function=None)
        collection.add(
            ids=[f"{name}-1"],
            embeddings=EMBEDDING,
            documents=[text_for(f"{name}-1")],
            metadatas=[{"tenant": "acme"}],
        )
        ids[name] = str(collection.id)
    return ids


@pytest.fixture(scope="module")
def chroma_stack(
    tmp_path_factory: pytest.TempPathFactory,
    chroma_server: ChromaServer,
    chroma_ids: dict[str, str],
) -> Iterator[GateStack]:
    reserved = {
        "retrieval_gate": {"collections": {chroma_ids["reserved"]: {"tenants": ["globex"]}}}
    }
    gate = GateStack(
        tmp_path_factory.mktemp("collections-chroma"),
        [record_dict(f"{name}-1") for name in chroma_ids],
        upstream_url=chroma_server.url,
        policy_data=reserved,
    ).start()
    yield gate
    gate.stop()


@pytest.mark.chroma
def test_a_chroma_collection_reserved_by_id_is_refused(
    chroma_stack: GateStack, chroma_ids: dict[str, str]
) -> None:
    query: Any = {"query_embeddings": [[0.1, 0.2]], "n_results": 1, "include": ["documents"]}
    refused = chroma_stack.search(
        CHROMA_PATH.format(chroma_ids["reserved"]), body=orjson.dumps(query)
    )
    assert refused.status == 403, refused.body
    assert refused.json() == FORBIDDEN
    assert b"reserved-1" not in refused.body
    # Control: the other collection, through the same gate and server, answers.
    allowed = chroma_stack.search(CHROMA_PATH.format(chroma_ids["open"]), body=orjson.dumps(query))
    assert allowed.status == 200, allowed.body
    assert allowed.json()["ids"] == [["open-1"]]


# Chroma reads a collection id as any spelling of its UUID (measured with the real
# server: upper case, without hyphens, in braces, as a URN all find the collection).
UUID_SPELLINGS: dict[str, Any] = {
    "upper-case": str.upper,
    "no-hyphens": lambda uuid: uuid.replace("-", ""),
    "braces": lambda uuid: "{" + uuid + "}",
    "urn": lambda uuid: "urn:uuid:" + uuid,
}


@pytest.mark.chroma
@pytest.mark.parametrize(
    "spelling",
    [
        "braces",  # not a canonical path: refused 400 before the policy
        "no-hyphens",  # the rest name the same collection to Chroma: one id to the gate
        "upper-case",
        "urn",
    ],
)
def test_a_chroma_collection_reserved_by_id_is_refused_however_its_id_is_spelled(
    chroma_stack: GateStack, chroma_ids: dict[str, str], spelling: str
) -> None:
    query: Any = {"query_embeddings": [[0.1, 0.2]], "n_results": 1, "include": ["documents"]}
    path = CHROMA_PATH.format(UUID_SPELLINGS[spelling](chroma_ids["reserved"]))
    response = chroma_stack.search(path, body=orjson.dumps(query))
    assert b"reserved-1" not in response.body
    assert response.status in (400, 403), response.body
