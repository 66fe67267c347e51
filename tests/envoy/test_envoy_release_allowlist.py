"""Release by allowlist (issue 11, item 1): oracles around the hit list answer alike.

Through a real Envoy in front of ``tests.fixtures.documented_databases`` (a
FAKE that answers as each database documents; no real server of these
databases runs on the build machines). Each oracle is probed in two worlds:
another tenant's documents match the probe, or nothing of another tenant
does. What the client gets (status, body bytes but for ``took``/``time``,
headers but for the date and decision id) must be the same in both.

Each oracle also has a control on a route that passes the database's answer
(``mode = "audit"``, ``push_down = false``): there the two worlds answer
differently, so the probe is real and the tests can fail. Where push-down is
the mechanism (Qdrant's scroll cursor), a route with ``push_down = false``
alone shows the difference too; where the rebuilt body is (totals, flags,
shard counts), that route answers alike as well.

Besides: an ordinary search of each of the five databases answers alike
whether another tenant has documents or not (costs, read units and counts
included); unknown keys the upstream plants in envelopes, hits and payloads
never reach the client; a body with a duplicate key (Milvus'
``{"code":0,"data":[...],"code":1,"data":null}``, a Qdrant body with a second
``result``, a repeated key inside a hit, and likewise for the other
formats) is 502, never released.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from sidecar.demo.upstream import SeenRequest
from tests.fixtures.documented_databases import (
    Document,
    DocumentedDatabases,
    records_for,
    weaviate_uuid,
)
from tests.fixtures.harness import ClientView, GateStack, client_view
from tests.fixtures.records import text_for

pytestmark = pytest.mark.envoy

WORD = "zanzibar"  # only another tenant's documents hold it, in the first world
ACME = [Document(i, "acme", text_for(str(i))) for i in (1, 3, 5)]
GLOBEX_MATCHING = [Document(i, "globex", f"{text_for(str(i))} {WORD}") for i in (2, 4)]
GLOBEX_OTHER = [Document(i, "globex", text_for(str(i))) for i in (2, 4)]
WORLDS = {"match": ACME + GLOBEX_MATCHING, "no-match": ACME + GLOBEX_OTHER}

# Routes: the default (push-down, enforce); without push-down; passing the database's answer.
CONFINED, UNCONFINED, EXPOSED = "docs", "unconfined", "exposed"


@pytest.fixture(scope="module")
def db() -> DocumentedDatabases:
    return DocumentedDatabases(WORLDS["match"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, db: DocumentedDatabases) -> Iterator[GateStack]:
    routes: dict[str, Any] = {}
    for prefix in ("/", "/collections/"):
        routes[prefix + UNCONFINED] = {"push_down": False}
        routes[prefix + EXPOSED] = {"push_down": False, "mode": "audit"}
    gate = GateStack(
        tmp_path_factory.mktemp("release-allowlist"),
        records_for(ACME + GLOBEX_MATCHING),
        config={"routes": routes},
    ).start()
    for collection in (CONFINED, UNCONFINED, EXPOSED):
        db.mount_all(gate.upstream, collection)
    yield gate
    gate.stop()


@pytest.fixture(autouse=True)
def untampered(db: DocumentedDatabases) -> Iterator[None]:
    """Every test starts with the first world and an honest database."""
    db.set_documents(WORLDS["match"])
    db.tamper = None
    yield
    db.tamper = None


def in_both_worlds(
    db: DocumentedDatabases, probe: Any, worlds: Any = WORLDS
) -> tuple[list[ClientView], list[ClientView]]:
    """What ``probe()`` (a list of answers) shows in each of two worlds, in order."""
    seen = []
    for world in worlds.values():
        db.set_documents(world)
        seen.append([client_view(answer) for answer in probe()])
    return seen[0], seen[1]


# -- Elasticsearch: counts and flags computed over every document ----------------

MATCH = {"match": {"text": WORD}}


def json_body(document: dict[str, Any]) -> bytes:
    """A search body."""
    return orjson.dumps(document)


def msearch_body(document: dict[str, Any]) -> bytes:
    """One multi-search line pair searching the path's index with ``document``."""
    return b"{}\n" + orjson.dumps(document) + b"\n"


# Probe name -> (endpoint and URL parameters, request body).
ES_PROBES: dict[str, tuple[str, bytes]] = {
    # The total counts every match; with a threshold of 1, "gte" says "more than one".
    "total": ("_search", json_body({"size": 0, "query": MATCH})),
    "total-relation": ("_search", json_body({"size": 0, "track_total_hits": 1, "query": MATCH})),
    # terminated_early says a shard reached one match.
    "terminated-early": ("_search", json_body({"size": 0, "terminate_after": 1, "query": MATCH})),
    "terminated-early-in-url": (
        "_search?terminate_after=1",
        json_body({"size": 0, "query": MATCH}),
    ),
    # The can-match phase skips shards where nothing can match.
    "shards-skipped": ("_search?pre_filter_shard_size=1", json_body({"size": 0, "query": MATCH})),
    # The same, per item of a multi-search.
    "msearch": (
        "_msearch",
        msearch_body({"size": 0, "track_total_hits": 1, "terminate_after": 1, "query": MATCH}),
    ),
}


def es_probe(stack: GateStack, index: str, name: str) -> Any:
    """The probe ``name`` on ``index``: a callable returning its one answer in a list."""
    endpoint, body = ES_PROBES[name]
    return lambda: [stack.search(f"/{index}/{endpoint}", body=body)]


@pytest.mark.parametrize("index", [CONFINED, UNCONFINED])
@pytest.mark.parametrize("name", sorted(ES_PROBES))
def test_elasticsearch_oracles_answer_alike(
    stack: GateStack, db: DocumentedDatabases, name: str, index: str
) -> None:
    first, second = in_both_worlds(db, es_probe(stack, index, name))
    assert first == second
    (view,) = first
    assert view.status == 200, view.body
    document = orjson.loads(view.body)
    if name == "msearch":
        (document,) = document["responses"]
    assert document["hits"] == {
        "total": {"value": 0, "relation": "eq"},
        "max_score": None,
        "hits": [],
    }
    assert "terminated_early" not in document
    assert document["_shards"]["skipped"] == 0


@pytest.mark.parametrize("name", sorted(ES_PROBES))
def test_control_the_elasticsearch_oracles_are_real(
    stack: GateStack, db: DocumentedDatabases, name: str
) -> None:
    first, second = in_both_worlds(db, es_probe(stack, EXPOSED, name))
    assert first != second


def test_elasticsearch_counts_describe_the_callers_documents(stack: GateStack) -> None:
    # Not vacuous: a word acme's documents hold is counted, and they come back.
    body = {"query": {"match": {"text": "care"}}, "track_total_hits": True}
    response = stack.search(f"/{CONFINED}/_search", body=orjson.dumps(body))
    document = response.json()
    assert [hit["_id"] for hit in document["hits"]["hits"]] == ["1", "3", "5"]
    assert document["hits"]["total"] == {"value": 3, "relation": "eq"}


# -- Qdrant: the scroll cursor -------------------------------------------------------

# A should filter turns a listing into a match test: acme's points, or any with the word.
SCROLL_FILTER = {
    "should": [
        {"key": "text", "match": {"text": WORD}},
        {"key": "tenant", "match": {"value": "acme"}},
    ]
}


def scroll_all(stack: GateStack, collection: str) -> tuple[list[Any], list[int]]:
    """Page through ``collection`` one point at a time: the answers and the ids seen."""
    answers, ids = [], []
    offset: Any = None
    for _ in range(10):
        body: dict[str, Any] = {"limit": 1, "with_payload": True, "filter": SCROLL_FILTER}
        if offset is not None:
            body["offset"] = offset
        response = stack.search(f"/collections/{collection}/points/scroll", body=orjson.dumps(body))
        assert response.status == 200, response.body
        answers.append(response)
        result = response.json()["result"]
        ids += [point["id"] for point in result["points"]]
        offset = result["next_page_offset"]
        if offset is None:
            break
    return answers, ids


def test_scroll_pages_answer_alike_and_list_the_callers_points_only(
    stack: GateStack, db: DocumentedDatabases
) -> None:
    first, second = in_both_worlds(db, lambda: scroll_all(stack, CONFINED)[0])
    assert first == second
    for world in WORLDS.values():
        db.set_documents(world)
        assert scroll_all(stack, CONFINED)[1] == [1, 3, 5]


@pytest.mark.parametrize("collection", [UNCONFINED, EXPOSED])
def test_control_without_push_down_the_scroll_tells_the_worlds_apart(
    stack: GateStack, db: DocumentedDatabases, collection: str
) -> None:
    first, second = in_both_worlds(db, lambda: scroll_all(stack, collection)[0])
    assert first != second


def test_without_push_down_the_scroll_still_names_no_other_tenants_point(
    stack: GateStack, db: DocumentedDatabases
) -> None:
    for world in WORLDS.values():
        db.set_documents(world)
        _, ids = scroll_all(stack, UNCONFINED)
        assert set(ids) <= {d.id for d in ACME}


# -- unknown keys planted by the upstream ------------------------------------------

PLANTED = "planted-by-the-upstream"

SEARCHES: dict[str, tuple[str, bytes]] = {
    "elasticsearch": (f"/{CONFINED}/_search", b'{"query": {"match_all": {}}}'),
    "qdrant": (
        f"/collections/{CONFINED}/points/search",
        b'{"vector": [0.1, 0.2], "limit": 3, "with_payload": true}',
    ),
    "pinecone": ("/query", b'{"vector": [0.1, 0.2], "topK": 3, "includeMetadata": true}'),
    "milvus": (
        "/v2/vectordb/entities/search",
        b'{"collectionName": "docs", "data": [[0.1, 0.2]], "limit": 3, "outputFields": ["text"]}',
    ),
    "weaviate": (
        "/v1/graphql",
        orjson.dumps({"query": "{ Get { Chunk(limit: 3) { text _additional { id distance } } } }"}),
    ),
}


def released_ids(name: str, document: Any) -> list[str]:
    """The chunk ids of a search answer of database ``name``, in order."""
    if name == "elasticsearch":
        return [hit["_id"] for hit in document["hits"]["hits"]]
    if name == "qdrant":
        return [str(point["id"]) for point in document["result"]]
    if name == "pinecone":
        return [match["id"] for match in document["matches"]]
    if name == "milvus":
        return [str(row["id"]) for row in document["data"]]
    return [hit["_additional"]["id"] for hit in document["data"]["Get"]["Chunk"]]


HANDLERS = {
    "elasticsearch": DocumentedDatabases.elasticsearch_search,
    "qdrant": DocumentedDatabases.qdrant_search,
    "pinecone": DocumentedDatabases.pinecone_query,
    "milvus": DocumentedDatabases.milvus_search,
    "weaviate": DocumentedDatabases.weaviate_graphql,
}
# Another tenant has documents (matching every search below), or has none.
PRESENT_OR_ABSENT = {"present": WORLDS["match"], "absent": ACME}


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_a_search_answers_alike_whether_or_not_another_tenant_has_documents(
    stack: GateStack, db: DocumentedDatabases, name: str
) -> None:
    path, request = SEARCHES[name]
    # The premise: the app's request, as it wrote it, finds globex's documents.
    answers = []
    for world in PRESENT_OR_ABSENT.values():
        db.set_documents(world)
        answers.append(orjson.dumps(HANDLERS[name](db, SeenRequest("POST", path, {}, request))))
    assert answers[0] != answers[1]
    # Through the gate: the same answer, acme's documents (counts, costs, read units alike).
    first, second = in_both_worlds(
        db, lambda: [stack.search(path, body=request)], PRESENT_OR_ABSENT
    )
    assert first == second
    (view,) = first
    assert view.status == 200, view.body
    expected = [weaviate_uuid(d.id) if name == "weaviate" else str(d.id) for d in ACME]
    assert released_ids(name, orjson.loads(view.body)) == expected


def plant_everywhere(body: bytes) -> bytes:
    """Add an unknown key to every object of the answer: envelopes, hits, payloads."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {**{k: walk(v) for k, v in value.items()}, "x_planted": PLANTED}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return orjson.dumps(walk(orjson.loads(body)))


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_unknown_keys_planted_by_the_upstream_never_reach_the_client(
    stack: GateStack, db: DocumentedDatabases, name: str
) -> None:
    path, request = SEARCHES[name]
    db.tamper = plant_everywhere
    response = stack.search(path, body=request)
    assert response.status == 200, response.body
    assert PLANTED.encode() not in response.body
    assert b"x_planted" not in response.body
    expected = [weaviate_uuid(d.id) if name == "weaviate" else str(d.id) for d in ACME]
    assert released_ids(name, response.json()) == expected


# -- bodies a client could read differently ---------------------------------------

# Appended to the upstream's object: a key it already has, with another value.
DUPLICATES: dict[str, bytes] = {
    # A client parser keeping the first of duplicate keys sees rows; the gate the last.
    "milvus": b',"code":1,"data":null}',
    "qdrant": b',"result":[]}',
    "elasticsearch": b',"hits":{"total":{"value":0,"relation":"eq"},"max_score":null,"hits":[]}}',
    "pinecone": b',"matches":[]}',
    "weaviate": b',"data":null}',
}


def duplicate_at_the_end(extra: bytes) -> Any:
    """A tamper that appends ``extra`` (repeated keys) to the answer's outer object."""
    return lambda body: body[: body.rindex(b"}")] + extra


@pytest.mark.parametrize("name", sorted(DUPLICATES))
def test_a_body_with_a_duplicate_key_is_refused_never_released(
    stack: GateStack, db: DocumentedDatabases, name: str
) -> None:
    path, request = SEARCHES[name]
    db.tamper = duplicate_at_the_end(DUPLICATES[name])
    response = stack.search(path, body=request)
    assert response.status == 502, response.body
    assert response.json()["error"] == "upstream_body_malformed"
    assert b"Text of chunk" not in response.body


def test_a_duplicate_key_inside_a_hit_is_refused_too(
    stack: GateStack, db: DocumentedDatabases
) -> None:
    # The first "text" is what a first-key client shows; the gate would check the last.
    db.tamper = lambda body: body.replace(b'"payload":{', b'"payload":{"text":"forged",', 1)
    path, request = SEARCHES["qdrant"]
    response = stack.search(path, body=request)
    assert response.status == 502, response.body
    assert b"forged" not in response.body
