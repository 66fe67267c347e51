"""End to end through a real Envoy in front of a real Chroma server.

Chunks are loaded straight into Chroma (``chroma run``) with the real
``chromadb.HttpClient``, embeddings supplied so nothing needs a model or the
network. The application side is another ``chromadb.HttpClient`` pointed at
Envoy: it must get aligned, filtered results from ``collection.query`` and
``collection.get``, as Chroma's own client parses them. Raw bodies are also
checked against the response schemas of Chroma's OpenAPI document
(``tests.fixtures.chroma_bodies.RESPONSE_SCHEMAS``).

The collection also holds another tenant's records (``OTHER``), between acme's
in every ranking. The gate runs with its defaults, tenant push-down on
(``tenant_key = "tenant"``): acme's requests never make Chroma return them,
so results, the audit record's candidates and every answer that could tell
whether one of them matches describe acme's records only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import chromadb
import jsonschema
import orjson
import pytest
from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.api.types import PyEmbeddings, Where
from chromadb.base_types import LiteralValue, LogicalOperator, WhereOperator
from chromadb.config import Settings

from tests.fixtures.chroma_bodies import RESPONSE_SCHEMAS

# The module-scoped fixture `chroma_server`, used by name.
from tests.fixtures.chroma_server import ChromaServer, chroma_server_fixture  # noqa: F401
from tests.fixtures.harness import GateStack
from tests.fixtures.records import record_dict, text_for

pytestmark = [pytest.mark.envoy, pytest.mark.chroma]

IDENTITY = {"x-gate-tenant": "acme", "x-gate-principals": "user:alice,group:qa"}
COLLECTION = "gate-docs"

# Chunk id -> (record overrides, or None when the store has no record; document in Chroma)
CORPUS: dict[str, tuple[dict[str, Any] | None, str]] = {
    "c-01": ({}, text_for("c-01")),
    "c-02": ({"status": "revoked"}, text_for("c-02")),
    "c-03": ({"tenant_id": "globex"}, text_for("c-03")),
    "c-04": ({}, text_for("c-04")),
    "c-05": ({}, text_for("c-05") + " (edited in the index)"),
    "c-06": (None, text_for("c-06")),
    "c-07": ({"allowed_principals": ["group:hr"]}, text_for("c-07")),
    "c-08": ({}, text_for("c-08")),
}
ADMITTED = ["c-01", "c-04", "c-08"]
# Another tenant's records in the same collection: the store has them as
# globex's, and each document holds a word no acme record has.
OTHER = {f"g-0{i}": [i + 0.5, 0.0] for i in range(1, 4)}
OTHER_WORD = "zanzibar"
EXPECTED_REASONS = {
    "c-02": "STATUS_REVOKED",
    "c-03": "TENANT_MISMATCH",
    "c-05": "HASH_MISMATCH",
    "c-06": "MISSING_METADATA",
    "c-07": "PRINCIPAL_MISMATCH",
}
# On a line, so L2 distances to the query points below are all different.
EMBEDDINGS = {chunk_id: [float(i), 0.0] for i, chunk_id in enumerate(CORPUS, 1)}
# Three query embeddings rank the corpus three different ways.
QUERIES: PyEmbeddings = [[0.0, 0.0], [9.0, 0.0], [4.4, 0.0]]
ALL_INCLUDE: Any = ["documents", "metadatas", "distances", "embeddings"]


def _client(port: int, headers: dict[str, str] | None = None) -> ClientAPI:
    return chromadb.HttpClient(
        host="127.0.0.1",
        port=port,
        headers=headers,
        settings=Settings(anonymized_telemetry=False),
    )


@pytest.fixture(scope="module")
def direct(chroma_server: ChromaServer) -> Collection:
    """The collection, loaded through a client that talks to Chroma itself."""
    client = _client(chroma_server.port)
    collection = client.create_collection(COLLECTION, embedding_function=None)
    ids = list(CORPUS)
    embeddings: PyEmbeddings = [EMBEDDINGS[i] for i in ids]
    collection.add(
        ids=ids,
        embeddings=embeddings,
        documents=[CORPUS[i][1] for i in ids],
        metadatas=[{"chunk": i, "rank": n, "tenant": "acme"} for n, i in enumerate(ids, 1)],
    )
    other: PyEmbeddings = list(OTHER.values())
    collection.add(
        ids=list(OTHER),
        embeddings=other,
        documents=[f"{text_for(i)} {OTHER_WORD}" for i in OTHER],
        metadatas=[{"chunk": i, "rank": n, "tenant": "globex"} for n, i in enumerate(OTHER, 1)],
    )
    return collection


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, chroma_server: ChromaServer, direct: Collection
) -> Iterator[GateStack]:
    records = [record_dict(i, **o) for i, (o, _) in CORPUS.items() if o is not None]
    records += [record_dict(i, tenant_id="globex") for i in OTHER]
    gate = GateStack(
        tmp_path_factory.mktemp("stack"),
        records,
        upstream_url=chroma_server.url,
        # Push-down is on by default; of the metadata, these go out unverified.
        config={"formats": {"chroma": {"releasable_fields": ["chunk", "rank"]}}},
    ).start()
    yield gate
    gate.stop()


@pytest.fixture(scope="module")
def gated(stack: GateStack) -> Collection:
    """The same collection as the application sees it: through Envoy and the gate."""
    client = _client(stack.listen_port, IDENTITY)
    return client.get_collection(COLLECTION, embedding_function=None)


def _path(collection: Collection, endpoint: str) -> str:
    return (
        f"/api/v2/tenants/default_tenant/databases/default_database/collections/"
        f"{collection.id}/{endpoint}"
    )


ACME: Where = {"tenant": "acme"}


def _assert_aligned(ids: list[str], result: dict[str, Any], index: int | None = None) -> None:
    """Every column entry belongs to the id at the same index, and of its metadata
    only the declared fields went out."""

    def column(name: str) -> Any:
        value = result[name]
        return value if index is None else value[index]

    documents, metadatas = column("documents"), column("metadatas")
    assert len(documents) == len(metadatas) == len(ids)
    for i, chunk_id in enumerate(ids):
        assert documents[i] == CORPUS[chunk_id][1] == text_for(chunk_id)
        assert metadatas[i] == {"chunk": chunk_id, "rank": list(CORPUS).index(chunk_id) + 1}


def test_query_with_several_embeddings_returns_only_admitted_hits_aligned(
    direct: Collection, gated: Collection
) -> None:
    # What Chroma returns for the request as the gate sends it: acme's records.
    upstream = direct.query(
        query_embeddings=QUERIES, n_results=len(CORPUS), include=ALL_INCLUDE, where=ACME
    )
    result = gated.query(query_embeddings=QUERIES, n_results=len(CORPUS), include=ALL_INCLUDE)
    assert upstream["ids"][0] == list(CORPUS)  # every chunk comes back, nearest first
    assert upstream["ids"][1] == list(reversed(CORPUS))
    assert result["ids"] == [[i for i in ranked if i in ADMITTED] for ranked in upstream["ids"]]
    assert result["ids"][2] == ["c-04", "c-01", "c-08"]
    distances, embeddings = result["distances"], result["embeddings"]
    upstream_distances = upstream["distances"]
    assert distances is not None and embeddings is not None and upstream_distances is not None
    for q, ids in enumerate(result["ids"]):
        _assert_aligned(ids, dict(result), q)
        upstream_distance = dict(zip(upstream["ids"][q], upstream_distances[q], strict=True))
        for i, chunk_id in enumerate(ids):
            assert distances[q][i] == upstream_distance[chunk_id]
            assert list(embeddings[q][i]) == EMBEDDINGS[chunk_id]


def test_get_by_ids_returns_only_admitted_records_aligned(
    direct: Collection, gated: Collection
) -> None:
    upstream = direct.get(ids=list(CORPUS))
    result = gated.get(ids=list(CORPUS))
    assert result["ids"] == [i for i in upstream["ids"] if i in ADMITTED]
    assert sorted(result["ids"]) == ADMITTED
    _assert_aligned(result["ids"], dict(result))
    assert gated.get(ids=["c-02", "c-03", "c-05"])["ids"] == []


def test_get_with_where_filter(gated: Collection) -> None:
    rank_from_4: dict[WhereOperator | LogicalOperator, LiteralValue] = {"$gte": 4}
    where: Where = {"rank": rank_from_4}
    result = gated.get(where=where, include=["documents", "metadatas"])
    assert sorted(result["ids"]) == ["c-04", "c-08"]
    _assert_aligned(result["ids"], dict(result))
    result = gated.get(where={"chunk": "c-07"})
    assert result["ids"] == [] and result["documents"] == [] and result["metadatas"] == []


def test_without_documents_no_id_is_released(stack: GateStack, gated: Collection) -> None:
    # The gate can only verify a chunk whose text it sees.
    result = gated.query(query_embeddings=QUERIES[:2], n_results=3, include=["metadatas"])
    assert result["ids"] == [[], []] and result["metadatas"] == [[], []]
    assert gated.get(ids=ADMITTED, include=["metadatas"])["ids"] == []
    record = stack.audit_records()[-1]
    assert record["format"] == "chroma" and record["admitted"] == []
    assert {r["reasons"][0] for r in record["rejected"]} == {"MALFORMED_CHUNK"}


def test_raw_query_body_headers_audit_and_metrics(stack: GateStack, direct: Collection) -> None:
    before = stack.metrics()
    request = {"query_embeddings": QUERIES, "n_results": len(CORPUS), "include": ALL_INCLUDE}
    response = stack.search(_path(direct, "query"), body=orjson.dumps(request))
    assert response.status == 200, response.body
    body = response.json()
    jsonschema.validate(body, RESPONSE_SCHEMAS["query"])
    for chunk_id in EXPECTED_REASONS:
        assert CORPUS[chunk_id][1].encode() not in response.body
    assert [sorted(ids) for ids in body["ids"]] == [ADMITTED] * len(QUERIES)
    hits = len(CORPUS) * len(QUERIES)
    assert response.headers["x-retrieval-gate-admitted"] == str(len(ADMITTED) * len(QUERIES))
    assert "x-retrieval-gate-rejected" not in response.headers
    assert response.headers["content-length"] == str(len(response.body))

    decision_id = response.headers["x-retrieval-gate-decision-id"]
    record = next(r for r in stack.audit_records() if r["decision_id"] == decision_id)
    assert record["format"] == "chroma" and record["outcome"] == "filtered"
    assert record["tenant"] == "acme"
    assert len(record["candidates"]) == hits
    assert sorted(record["admitted"]) == sorted(ADMITTED * len(QUERIES))
    rejected = {(r["chunk_id"], r["reasons"][0]) for r in record["rejected"]}
    assert rejected == set(EXPECTED_REASONS.items())
    assert len(record["rejected"]) == len(EXPECTED_REASONS) * len(QUERIES)
    assert "Text of chunk" not in orjson.dumps(record).decode()

    after = stack.metrics()

    def delta(sample: str) -> float:
        return after.get(sample, 0.0) - before.get(sample, 0.0)

    admitted = (
        'retrieval_gate_chunks_total{collection="other",decision="admitted",'
        'format="chroma",reason="NONE"}'
    )
    assert delta(admitted) == len(ADMITTED) * len(QUERIES)
    for reason in EXPECTED_REASONS.values():
        sample = (
            'retrieval_gate_chunks_total{collection="other",decision="rejected",'
            f'format="chroma",reason="{reason}"}}'
        )
        assert delta(sample) == len(QUERIES), reason
    assert (
        delta(
            'retrieval_gate_responses_total{collection="other",format="chroma",outcome="filtered"}'
        )
        == 1
    )


def test_raw_get_body_matches_the_schema(stack: GateStack, direct: Collection) -> None:
    request = {"ids": list(CORPUS), "include": ["documents", "metadatas", "embeddings"]}
    response = stack.search(_path(direct, "get"), body=orjson.dumps(request))
    assert response.status == 200, response.body
    body = response.json()
    jsonschema.validate(body, RESPONSE_SCHEMAS["get"])
    assert sorted(body["ids"]) == ADMITTED
    assert [m["chunk"] for m in body["metadatas"]] == body["ids"]
    assert all(set(m) == {"chunk", "rank"} for m in body["metadatas"])
    assert body["embeddings"] == [EMBEDDINGS[i] for i in body["ids"]]


def test_writes_through_the_gate_are_refused(direct: Collection, gated: Collection) -> None:
    with pytest.raises(Exception, match=r"(?i)forbidden"):
        injected: PyEmbeddings = [[0.5, 0.0]]
        gated.add(ids=["c-99"], embeddings=injected, documents=["injected"])
    with pytest.raises(Exception, match=r"(?i)forbidden"):
        gated.delete(ids=["c-01"])
    assert direct.count() == len(CORPUS) + len(OTHER)


# -- tenant push-down ------------------------------------------------------------------


def _candidates(stack: GateStack, decision_id: str) -> list[str]:
    """The chunk ids Chroma returned for a request, as its audit record lists them."""
    record = next(r for r in stack.audit_records() if r["decision_id"] == decision_id)
    assert record["tenant_filter"] is True
    return list(record.get("candidates", []))


def test_other_tenants_records_are_in_the_collection_between_acmes(direct: Collection) -> None:
    # The premise of the tests below: without the tenant condition they come back.
    upstream = direct.query(query_embeddings=QUERIES[:1], n_results=4, include=[])
    assert upstream["ids"] == [["c-01", "g-01", "c-02", "g-02"]]
    assert direct.get(where_document={"$contains": OTHER_WORD}, include=[])["ids"] == list(OTHER)


def test_a_where_filtered_query_never_sees_another_tenants_record(
    stack: GateStack, direct: Collection
) -> None:
    # Even a filter that asks for globex's records by name gets acme's only.
    widening: dict[str, Any] = {"$or": [{"tenant": "globex"}, {"rank": {"$gte": 1}}]}
    request = {
        "query_embeddings": QUERIES,
        "n_results": 4,
        "where": widening,
        "include": ["documents", "metadatas"],
    }
    response = stack.search(_path(direct, "query"), body=orjson.dumps(request))
    assert response.status == 200, response.body
    body = response.json()
    assert OTHER_WORD.encode() not in response.body
    assert all(not i.startswith("g-") for ids in body["ids"] for i in ids)
    # Chroma itself answered with acme's eight nearest per query (over-fetch, on by
    # default, asked for twice the four): no slot went to globex, so the counts
    # describe acme's records only. Each query got every admitted record (three,
    # fewer than the four asked for), where its four nearest alone held fewer.
    expected = direct.query(query_embeddings=QUERIES, n_results=8, where=ACME, include=[])
    candidates = _candidates(stack, response.headers["x-retrieval-gate-decision-id"])
    assert candidates == [i for ids in expected["ids"] for i in ids]
    assert len(candidates) == 8 * len(QUERIES)
    assert [sorted(ids) for ids in body["ids"]] == [ADMITTED] * len(QUERIES)


def test_a_client_query_with_a_where_filter(gated: Collection) -> None:
    rank_from_2: dict[WhereOperator | LogicalOperator, LiteralValue] = {"$gte": 2}
    where: Where = {"rank": rank_from_2}
    result = gated.query(query_embeddings=QUERIES[:1], n_results=len(CORPUS), where=where)
    assert result["ids"] == [["c-04", "c-08"]]
    _assert_aligned(result["ids"][0], dict(result), 0)


def test_match_oracles_answer_alike_whether_or_not_another_tenant_matches(
    stack: GateStack, direct: Collection
) -> None:
    """A word only globex's documents hold, and an id only globex has, get exactly
    the answer of a word and an id nobody has."""

    def answer(request: dict[str, Any]) -> tuple[int, bytes, list[str]]:
        response = stack.search(_path(direct, "get"), body=orjson.dumps(request))
        decision = response.headers["x-retrieval-gate-decision-id"]
        return response.status, response.body, _candidates(stack, decision)

    for include in ([], ["documents", "metadatas"]):
        by_word = {"where_document": {"$contains": OTHER_WORD}, "include": include}
        nobody = {"where_document": {"$contains": "nobody-has-this"}, "include": include}
        assert answer(by_word) == answer(nobody) == (200, answer(nobody)[1], [])
        by_id = {"ids": ["g-01"], "include": include}
        no_id = {"ids": ["no-such-id"], "include": include}
        assert answer(by_id) == answer(no_id) == (200, answer(no_id)[1], [])


def test_a_get_page_lists_acmes_records_only(stack: GateStack, direct: Collection) -> None:
    request = {"limit": 20, "include": ["documents"]}
    response = stack.search(_path(direct, "get"), body=orjson.dumps(request))
    assert response.status == 200, response.body
    assert sorted(response.json()["ids"]) == ADMITTED
    candidates = _candidates(stack, response.headers["x-retrieval-gate-decision-id"])
    assert sorted(candidates) == sorted(CORPUS)
