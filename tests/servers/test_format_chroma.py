"""The Chroma adapter: routes, candidates, filtering, substitutes, malformed bodies.

Routes come from chromadb 1.5's OpenAPI document (``chroma run`` serves it at
``/openapi.json``) and the Python client's calls (``chromadb.api.fastapi``).
Body shapes come from that document's ``QueryResponse``, ``GetResponse`` and
``SearchResponse`` and are built by ``tests.fixtures.chroma_bodies``.

Every rendered body is validated twice: with JSON Schema against the
response schema (``chroma_bodies.RESPONSE_SCHEMAS``), and by handing it to
chromadb's own HTTP client (``Collection.query``/``get``/``search`` over
``chromadb.api.fastapi.FastAPI``, with an httpx mock transport standing in
for the server), which is how an unchanged application reads it.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any

import httpx
import jsonschema
import orjson
import pytest
from chromadb.api.fastapi import FastAPI
from chromadb.api.models.Collection import Collection as ChromaCollection
from chromadb.config import Settings, System
from chromadb.execution.expression.plan import Search
from chromadb.types import Collection as CollectionModel
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.core.integrity import canonical_fields
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody, ParsedBody, ResponseFormat
from sidecar.formats.chroma.rest import ChromaFormat, PathCollection
from sidecar.formats.chroma.rest_request import ChromaEcho, collection_endpoint
from sidecar.formats.options import AdapterOptions
from sidecar.formats.qdrant.rest import QdrantFormat
from sidecar.formats.registry import FormatTable, build_format_table, classify
from tests.fixtures.chroma_bodies import (
    ALL_INCLUDE,
    ALL_SELECT,
    COLLECTION_ID,
    RESPONSE_SCHEMAS,
    Body,
    Row,
    encode,
    get_body,
    query_body,
    route,
    row,
    search_body,
)
from tests.fixtures.format_strategies import PROPERTIES, adapter

ENDPOINTS = ("query", "get", "search")
V2 = "/api/v2"
DB = f"{V2}/tenants/default_tenant/databases/default_database"
COLL = f"{DB}/collections/{COLLECTION_ID}"

# -- the client library as a validator ----------------------------------------


class _ClientReader:
    """chromadb's own HTTP client, answered with the body under test."""

    def __init__(self) -> None:
        system = System(
            Settings(
                chroma_api_impl="chromadb.api.fastapi.FastAPI",
                chroma_server_host="chroma.invalid",
                chroma_server_http_port=8000,
                anonymized_telemetry=False,
            )
        )
        api = system.instance(FastAPI)
        self._body = b""
        api._session = httpx.Client(transport=httpx.MockTransport(self._answer))
        model = CollectionModel.from_json(
            {
                "id": COLLECTION_ID,
                "name": "docs",
                "configuration_json": {"hnsw": None, "spann": None, "embedding_function": None},
                "metadata": None,
                "dimension": 2,
                "tenant": "default_tenant",
                "database": "default_database",
                "version": 0,
                "log_position": 0,
            }
        )
        self._collection = ChromaCollection(client=api, model=model)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=self._body)

    def read(self, endpoint: str, body: bytes) -> dict[str, Any]:
        """What ``collection.<endpoint>()`` returns to an application for ``body``."""
        self._body = body
        include = orjson.loads(body).get("include") or []
        if endpoint == "query":
            embeddings: list[Sequence[float] | Sequence[int]] = [[0.0, 0.0]]
            return dict(self._collection.query(query_embeddings=embeddings, include=include))
        if endpoint == "get":
            return dict(self._collection.get(include=include))
        result = self._collection.search(Search())
        result.rows()  # the client's row view zips the columns of every search
        return dict(result)


@functools.cache
def _reader() -> _ClientReader:
    return _ClientReader()


def validate(endpoint: str, body: bytes) -> Body:
    """Validate a rendered body with the schema and the client; return it decoded."""
    decoded: Body = orjson.loads(body)
    jsonschema.validate(decoded, RESPONSE_SCHEMAS[endpoint])
    result = _reader().read(endpoint, body)
    ids = result["ids"]
    for column in ("documents", "metadatas", "distances", "uris", "scores", "embeddings"):
        value = result.get(column)
        if value is None:
            continue
        if endpoint == "get":
            assert len(value) == len(ids), column
        else:
            for inner, inner_ids in zip(value, ids, strict=True):
                assert inner is None or len(inner) == len(inner_ids), column
    return decoded


# -- building bodies -------------------------------------------------------------


def build(
    endpoint: str,
    batches: Sequence[Sequence[Row]],
    keep: Collection[int] | None = None,
    *,
    include: Sequence[str] = ALL_INCLUDE,
    selects: Sequence[Sequence[str]] | None = None,
) -> Body:
    """The body for ``batches`` (one for get) keeping only the rows whose position
    (numbered through all batches) is in ``keep``; all when None. The oracle."""
    kept: list[list[Row]] = []
    position = 0
    for batch in batches:
        kept.append([r for i, r in enumerate(batch, position) if keep is None or i in keep])
        position += len(batch)
    if endpoint == "get":
        (rows,) = kept
        return get_body(rows, include=[i for i in include if i != "distances"])
    if endpoint == "query":
        return query_body(kept, include=include)
    return search_body(kept, selects)


# The metadata fields of the records below, declared releasable so that whole
# records go out; without a declaration each metadata object is emptied.
RELEASABLE = ["chunk", "group", "tags", "n", "ok", "f"]


def chroma(**options: Any) -> ChromaFormat:
    """The adapter with the test records' metadata fields releasable."""
    return adapter(ChromaFormat, releasable_fields=RELEASABLE, **options)


def parse(endpoint: str, body: Body | bytes, fmt: ChromaFormat | None = None) -> ParsedBody:
    raw = body if isinstance(body, bytes) else encode(body)
    return (fmt or chroma()).parse(raw, route(endpoint))


ROWS = [
    row("c-1", "alpha", distance=0.1, group="a"),
    row("c-2", "beta", distance=0.2, uri="s3://b"),
    row("c-3", "gamma", distance=0.3, embedding=(0.5, 0.25), tags=["x", "y"]),
    row("c-4", "delta", distance=0.4, n=7, ok=True),
    row("c-5", "epsilon", distance=0.5),
    row("c-6", "zeta", distance=0.6, f=1.5),
]


def batches_for(endpoint: str, rows: Sequence[Row] = ROWS) -> list[list[Row]]:
    """Get has one list; query and search split the rows over two queries and add an empty one."""
    if endpoint == "get":
        return [list(rows)]
    half = len(rows) // 2
    return [list(rows[:half]), [], list(rows[half:])]


# -- routes ------------------------------------------------------------------

FILTERED = [
    ("POST", f"{COLL}/query"),
    ("POST", f"{COLL}/get"),
    ("POST", f"{COLL}/search"),
    ("post", f"{COLL}/query"),
    ("POST", f"{V2}/tenants/acme/databases/prod/collections/my-docs/query"),
    # The Python server routes these to the collection named "by-id".
    ("POST", f"{DB}/collections/by-id/get"),
]
READ = [
    ("GET", V2),
    ("GET", f"{V2}/heartbeat"),
    ("HEAD", f"{V2}/heartbeat"),
    ("GET", f"{V2}/healthcheck"),
    ("GET", f"{V2}/version"),
    ("GET", f"{V2}/pre-flight-checks"),
    ("GET", f"{V2}/auth/identity"),
    ("GET", f"{V2}/tenants/default_tenant"),
    ("GET", f"{V2}/tenants/default_tenant/databases"),
    ("GET", DB),
    ("GET", f"{DB}/collections"),
    ("GET", f"{DB}/collections_count"),
    ("GET", f"{DB}/collections/docs"),
    ("GET", f"{DB}/collections/by-id/{COLLECTION_ID}"),
    ("GET", f"{COLL}/fork_count"),
    ("GET", f"{COLL}/functions/stats"),
    ("GET", f"{V2}/collections/crn:acme:prod:docs"),
    ("OPTIONS", f"{COLL}/query"),
    ("OPTIONS", f"{DB}/collections"),
]
WRITE = [
    ("POST", f"{V2}/reset"),
    ("POST", f"{V2}/tenants"),
    ("PATCH", f"{V2}/tenants/default_tenant"),
    ("POST", f"{V2}/tenants/default_tenant/databases"),
    ("DELETE", DB),
    ("POST", f"{DB}/collections"),
    ("PUT", f"{COLL}"),
    ("DELETE", f"{DB}/collections/docs"),
    ("POST", f"{COLL}/add"),
    ("POST", f"{COLL}/update"),
    ("POST", f"{COLL}/upsert"),
    ("POST", f"{COLL}/delete"),
    ("POST", f"{COLL}/fork"),
    ("POST", f"{COLL}/functions/attach"),
    ("POST", f"{COLL}/attached_functions/stats/detach"),
]
CONTENT = [
    # A collection's record count counts every tenant's records, its indexing
    # status every tenant's record operations.
    ("GET", f"{COLL}/count"),
    ("GET", f"{COLL}/indexing_status"),
    # Unknown to the adapter: a newer server's endpoint may return records.
    ("POST", f"{COLL}/export"),
    ("GET", f"{COLL}/records"),
    ("GET", f"{COLL}/records/c-1"),
    ("POST", f"{COLL}/get/extra"),
    ("POST", f"{V2}/collections/crn:acme:prod:docs/query"),
    # Known paths with methods the API does not have there.
    ("GET", f"{COLL}/query"),
    ("GET", f"{COLL}/get"),
    ("DELETE", f"{COLL}/search"),
    ("PATCH", f"{V2}/heartbeat"),
    ("POST", f"{COLL}/count"),
    ("OPTIONS", f"{V2}/unknown"),
    # Paths the server does not route as written (404) are not guessed at.
    ("POST", f"{COLL}/query/"),
    ("GET", f"{V2}/heartbeat/"),
    ("GET", f"{V2}/"),
    ("POST", f"{DB}/collections//query"),
    ("POST", f"{V2}/tenants//databases/d/collections/c/query"),
    # The legacy API: gone (410) in chromadb 1.x, unfiltered records on older servers.
    ("GET", "/api/v1"),
    ("GET", "/api/v1/heartbeat"),
    ("POST", f"/api/v1/collections/{COLLECTION_ID}/query"),
    ("POST", f"/api/v1/collections/{COLLECTION_ID}/get"),
    ("POST", "/api/v1/collections"),
]
OTHERS = [
    ("POST", "/collections/docs/points/search"),  # Qdrant
    ("POST", "/collections/docs/points/query"),
    ("POST", "/query"),  # Pinecone
    ("POST", "/records/namespaces/ns/search"),
    ("POST", "/v1/graphql"),  # Weaviate
    ("GET", "/v1/objects/Docs/123"),
    ("POST", "/v2/vectordb/entities/search"),  # Milvus
    ("POST", "/docs/_search"),  # Elasticsearch / OpenSearch
    ("POST", "/api/v3/heartbeat"),
    ("GET", "/api/v20/heartbeat"),
    ("GET", "/api/v2x/heartbeat"),
    ("GET", "/api/v1x"),
    ("GET", "/API/V2/heartbeat"),
    ("POST", f"/api{COLL.removeprefix(V2)}/query"),
    ("POST", f"/v2{COLL.removeprefix(V2)}/query"),
    ("POST", f"/chroma{COLL}/query"),
    ("POST", f"api/v2{COLL.removeprefix(V2)}/query"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/"),
    ("GET", ""),
]


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        *((m, p, RouteKind.FILTERED) for m, p in FILTERED),
        *((m, p, RouteKind.READ) for m, p in READ),
        *((m, p, RouteKind.WRITE) for m, p in WRITE),
        *((m, p, RouteKind.CONTENT) for m, p in CONTENT),
        *((m, p, None) for m, p in OTHERS),
    ],
)
def test_route_kind(method: str, path: str, kind: RouteKind | None) -> None:
    assert ChromaFormat().route_kind(Route(method, path)) is kind


def test_every_route_of_the_openapi_document_is_classified() -> None:
    # Method and path template of each operation in chromadb 1.5's /openapi.json.
    operations = {
        ("GET", "/auth/identity"): RouteKind.READ,
        ("GET", "/collections/{crn}"): RouteKind.READ,
        ("GET", "/healthcheck"): RouteKind.READ,
        ("GET", "/heartbeat"): RouteKind.READ,
        ("GET", "/pre-flight-checks"): RouteKind.READ,
        ("POST", "/reset"): RouteKind.WRITE,
        ("POST", "/tenants"): RouteKind.WRITE,
        ("GET", "/tenants/{t}"): RouteKind.READ,
        ("PATCH", "/tenants/{t}"): RouteKind.WRITE,
        ("GET", "/tenants/{t}/databases"): RouteKind.READ,
        ("POST", "/tenants/{t}/databases"): RouteKind.WRITE,
        ("GET", "/tenants/{t}/databases/{d}"): RouteKind.READ,
        ("DELETE", "/tenants/{t}/databases/{d}"): RouteKind.WRITE,
        ("GET", "/tenants/{t}/databases/{d}/collections"): RouteKind.READ,
        ("POST", "/tenants/{t}/databases/{d}/collections"): RouteKind.WRITE,
        ("GET", "/tenants/{t}/databases/{d}/collections/by-id/{c}"): RouteKind.READ,
        ("GET", "/tenants/{t}/databases/{d}/collections/{c}"): RouteKind.READ,
        ("PUT", "/tenants/{t}/databases/{d}/collections/{c}"): RouteKind.WRITE,
        ("DELETE", "/tenants/{t}/databases/{d}/collections/{c}"): RouteKind.WRITE,
        ("POST", "/tenants/{t}/databases/{d}/collections/{c}/add"): RouteKind.WRITE,
        (
            "POST",
            "/tenants/{t}/databases/{d}/collections/{c}/attached_functions/{n}/detach",
        ): RouteKind.WRITE,
        ("GET", "/tenants/{t}/databases/{d}/collections/{c}/count"): RouteKind.CONTENT,
        ("POST", "/tenants/{t}/databases/{d}/collections/{c}/delete"): RouteKind.WRITE,
        ("POST", "/tenants/{t}/databases/{d}/collections/{c}/fork"): RouteKind.WRITE,
        ("GET", "/tenants/{t}/databases/{d}/collections/{c}/fork_count"): RouteKind.READ,
        ("POST", "/tenants/{t}/databases/{d}/collections/{c}/functions/attach"): RouteKind.WRITE,
        ("GET", "/tenants/{t}/databases/{d}/collections/{c}/functions/{f}"): RouteKind.READ,
        ("POST", "/tenants/{t}/databases/{d}/collections/{c}/get"): RouteKind.FILTERED,
        ("GET", "/tenants/{t}/databases/{d}/collections/{c}/indexing_status"): RouteKind.CONTENT,
        ("POST", "/tenants/{t}/databases/{d}/collections/{c}/query"): RouteKind.FILTERED,
        ("POST", "/tenants/{t}/databases/{d}/collections/{c}/search"): RouteKind.FILTERED,
        ("POST", "/tenants/{t}/databases/{d}/collections/{c}/update"): RouteKind.WRITE,
        ("POST", "/tenants/{t}/databases/{d}/collections/{c}/upsert"): RouteKind.WRITE,
        ("GET", "/tenants/{t}/databases/{d}/collections_count"): RouteKind.READ,
        ("GET", "/version"): RouteKind.READ,
    }
    names = {"{t}": "acme", "{d}": "prod", "{c}": COLLECTION_ID, "{n}": "fn", "{f}": "fn"}
    names["{crn}"] = "acme:prod:docs"
    for (method, template), kind in operations.items():
        path = V2 + template
        for placeholder, value in names.items():
            path = path.replace(placeholder, value)
        assert ChromaFormat().route_kind(Route(method, path)) is kind, (method, template)


def test_name() -> None:
    assert ChromaFormat().name == "chroma"


def test_does_not_claim_qdrant_routes_and_qdrant_does_not_claim_chroma_routes() -> None:
    formats: list[ResponseFormat] = [QdrantFormat(), ChromaFormat()]
    found = classify(route("query"), formats)
    assert found is not None and found[0].name == "chroma"
    found = classify(Route("POST", "/collections/docs/points/search"), formats[::-1])
    assert found is not None and found[0].name == "qdrant"


@pytest.mark.parametrize(("method", "path"), [*READ[:3], *WRITE[:3], *CONTENT[:3], *OTHERS[:3]])
def test_parse_refuses_routes_it_does_not_filter(method: str, path: str) -> None:
    with pytest.raises(ValueError, match="not handled by the chroma format"):
        ChromaFormat().parse(encode(get_body(ROWS)), Route(method, path))


# -- options ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"id_field": ""}, "id_field"),
        ({"id_field": 3}, "id_field"),
    ],
)
def test_invalid_options_name_the_option(options: dict[str, Any], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        adapter(ChromaFormat, **options)


def test_text_is_the_document_not_a_metadata_field() -> None:
    body = get_body([row("c-1", "the document", text="a metadata field")])
    (candidate,) = parse("get", body).candidates
    assert candidate.text == "the document"


def test_there_is_no_text_field_option() -> None:
    # Chroma keeps text in its own column: an option that would not be used is refused.
    with pytest.raises(ValueError, match=r"formats\.chroma: unknown option 'text_field'"):
        build_format_table({"chroma": {"text_field": "body"}}, {}, text_field="t", id_field=None)
    built = build_format_table({}, {}, text_field="body", id_field="chunk")
    chroma = next(f for f in built.formats if f.name == "chroma")
    assert isinstance(chroma, ChromaFormat) and chroma.id_field == "chunk"


# -- candidates ----------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_candidates_number_hits_across_queries_in_body_order(endpoint: str) -> None:
    parsed = parse(endpoint, build(endpoint, batches_for(endpoint)))
    assert list(parsed.candidates) == [
        Candidate(i, r["id"], r["document"]) for i, r in enumerate(ROWS)
    ]


@pytest.mark.parametrize(
    ("record", "chunk_id", "text", "problem"),
    [
        (row("c-1", ""), "c-1", "", None),
        (row("c-1", None), "c-1", None, "document missing"),
        (row("c-1", 12), "c-1", None, "document is not a string"),
        (row("c-1", ["SECRET"]), "c-1", None, "document is not a string"),
        (row("", "t"), None, "t", "id is empty"),
        (row(None, "t"), None, "t", "id missing"),
        (row(True, "t"), None, "t", "id is not a string or integer"),
        (row({"SECRET": 1}, None), None, None, "id is not a string or integer; document missing"),
    ],
)
def test_candidate_from_record_id(
    record: Row, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    for endpoint in ENDPOINTS:
        parsed = parse(endpoint, build(endpoint, [[record]]))
        assert parsed.candidates == (Candidate(0, chunk_id, text, problem),), endpoint


@pytest.mark.parametrize(
    ("metadata", "chunk_id", "problem"),
    [
        ({"doc_chunk": "sop-1"}, "sop-1", None),
        ({"doc_chunk": 12}, "12", None),
        ({"other": "x"}, None, "metadata field 'doc_chunk' missing"),
        ({"doc_chunk": None}, None, "metadata field 'doc_chunk' missing"),
        ({"doc_chunk": ""}, None, "metadata field 'doc_chunk' is empty"),
        ({"doc_chunk": False}, None, "metadata field 'doc_chunk' is not a string or integer"),
        ({"doc_chunk": ["SECRET"]}, None, "metadata field 'doc_chunk' is not a string or integer"),
        (None, None, "metadata missing"),
    ],
)
def test_candidate_from_metadata_id_field(
    metadata: dict[str, Any] | None, chunk_id: str | None, problem: str | None
) -> None:
    fmt = chroma(id_field="doc_chunk")
    for endpoint in ENDPOINTS:
        record = {**row("record-9", "text"), "metadata": metadata}
        parsed = parse(endpoint, build(endpoint, [[record]]), fmt)
        assert parsed.candidates == (Candidate(0, chunk_id, "text", problem),), endpoint


@pytest.mark.parametrize("endpoint", ["query", "get"])
def test_without_documents_every_hit_has_a_problem(endpoint: str) -> None:
    body = build(endpoint, batches_for(endpoint), include=["metadatas", "distances"])
    parsed = parse(endpoint, body)
    assert [(c.chunk_id, c.text, c.problem) for c in parsed.candidates] == [
        (r["id"], None, "no documents") for r in ROWS
    ]


def test_id_field_without_metadatas_is_a_problem() -> None:
    body = build("query", batches_for("query"), include=["documents"])
    (first, *_) = parse("query", body, ChromaFormat(AdapterOptions(id_field="chunk"))).candidates
    assert first == Candidate(0, None, "alpha", "no metadatas")


def test_search_without_document_selected_has_a_problem_per_hit() -> None:
    selects = [["#document", "#score"], ["#score"], ["#metadata"]]
    body = search_body(batches_for("search"), selects)
    parsed = parse("search", body)
    assert [c.problem for c in parsed.candidates] == [None] * 3 + ["no documents"] * 3
    assert orjson.loads(parsed.render(range(6))) == body


def test_null_inner_list_means_that_query_lacks_the_column() -> None:
    body = {**query_body([ROWS[:1], ROWS[1:2]]), "documents": [None, ["beta"]]}
    parsed = parse("query", body)
    assert [c.problem for c in parsed.candidates] == ["no documents", None]
    assert orjson.loads(parsed.render({0}))["documents"] == [None, []]


def test_problems_never_contain_body_values() -> None:
    body = get_body([row(["SECRET-ID"], {"SECRET": "TEXT"})])
    (candidate,) = parse("get", body).candidates
    assert candidate.problem is not None
    assert "SECRET" not in candidate.problem


# -- filtering ----------------------------------------------------------------

KEEPS = [set(), {0}, {1, 4}, {0, 2, 3, 5}, set(range(6)), {5, 99, -1}]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("keep", KEEPS)
def test_render_keeps_exactly_the_kept_hits_in_every_column(endpoint: str, keep: set[int]) -> None:
    batches = batches_for(endpoint)
    out = validate(endpoint, parse(endpoint, build(endpoint, batches)).render(keep))
    assert out == build(endpoint, batches, keep)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_render_all_is_the_original_body_byte_for_byte(endpoint: str) -> None:
    body = build(endpoint, batches_for(endpoint))
    assert parse(endpoint, body).render(range(len(ROWS))) == encode(body)


def test_render_keeps_each_id_with_its_own_cells() -> None:
    out = orjson.loads(parse("query", build("query", batches_for("query"))).render({1, 3, 5}))
    assert out["ids"] == [["c-2"], [], ["c-4", "c-6"]]
    for q, ids in enumerate(out["ids"]):
        for i, chunk_id in enumerate(ids):
            original = next(r for r in ROWS if r["id"] == chunk_id)
            assert out["documents"][q][i] == original["document"]
            assert out["metadatas"][q][i] == original["metadata"]
            assert out["metadatas"][q][i]["chunk"] == chunk_id
            assert out["distances"][q][i] == original["distance"]
            assert out["embeddings"][q][i] == original["embedding"]
            assert out["uris"][q][i] == original["uri"]


@pytest.mark.parametrize("endpoint", ["query", "get"])
def test_render_leaves_null_columns_and_include_alone(endpoint: str) -> None:
    body = build(endpoint, batches_for(endpoint), include=["documents"])
    out = validate(endpoint, parse(endpoint, body).render({2}))
    assert out == build(endpoint, batches_for(endpoint), {2}, include=["documents"])
    assert out["metadatas"] is None and out["embeddings"] is None
    assert out["include"] == ["documents"]


def test_render_keeps_only_the_routes_own_keys_in_their_order() -> None:
    # Anything else goes, whatever it holds: a newer server's key, another
    # route's column, a string, an object.
    extra = {
        "note": "SECRET",
        "stats": {"SECRET": 1},
        "future": ["SECRET", "SECRET"],
        "distances": [0.1, 0.2],  # query's column, not get's
        "scores": [0.1, 0.2],
        "included": ["documents"],
    }
    body = {"x-first": 1, **get_body(ROWS[:2]), **extra}
    out = parse("get", body).render({1})
    assert out == encode(get_body(ROWS[1:2]))
    assert b"SECRET" not in parse("get", body).render({0, 1})


@pytest.mark.parametrize(
    ("endpoint", "foreign"),
    [("query", "scores"), ("search", "distances"), ("search", "uris"), ("search", "include")],
)
def test_columns_of_other_routes_are_dropped_unread(endpoint: str, foreign: str) -> None:
    body = {**build(endpoint, batches_for(endpoint)), foreign: [["SECRET"]]}
    out = orjson.loads(parse(endpoint, body).render(range(6)))
    assert out == build(endpoint, batches_for(endpoint))


def test_key_order_is_kept() -> None:
    body = query_body([ROWS[:2]])
    reordered = {key: body[key] for key in reversed(body)}
    out = parse("query", reordered).render({0})
    assert list(orjson.loads(out)) == list(reordered)


@pytest.mark.parametrize(
    ("endpoint", "key", "value"),
    [
        ("get", "include", "documents"),
        ("get", "include", [1]),
        ("query", "include", {"documents": True}),
        ("search", "select", ["#document"]),
        ("search", "select", [[None]]),
    ],
)
def test_malformed_include_or_select(endpoint: str, key: str, value: Any) -> None:
    body = {**build(endpoint, batches_for(endpoint)), key: value}
    with pytest.raises(MalformedBody, match=key):
        parse(endpoint, body)


def test_legacy_python_server_body_with_data() -> None:
    # The Python server writes the client's QueryResult: "data" is a column,
    # "included" (its copy of include) is not a key of the v2 response.
    body = {**query_body([ROWS[:3]]), "data": None, "included": ["documents"]}
    out = orjson.loads(parse("query", body).render({0, 2}))
    assert out["ids"] == [["c-1", "c-3"]] and out["data"] is None
    assert "included" not in out
    body["data"] = [["d1", "d2", "d3"]]
    assert orjson.loads(parse("query", body).render({1}))["data"] == [["d2"]]


def test_render_never_mutates_and_can_run_again() -> None:
    body = build("search", batches_for("search"))
    raw = encode(body)
    parsed = parse("search", raw)
    replacements = {0: Replacement("c-new", "new text")}
    first = parsed.render({0, 3}, replacements=replacements)
    assert orjson.loads(parsed.render(set())) == build("search", batches_for("search"), set())
    assert parsed.render({0, 3}, replacements=replacements) == first
    assert parsed.render(range(6)) == raw


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_released_positions(endpoint: str) -> None:
    parsed = parse(endpoint, build(endpoint, batches_for(endpoint)))
    assert parsed.released_positions({5, 1, 3, 42}) == [1, 3, 5]
    assert parsed.released_positions(set(), ()) == []


@pytest.mark.parametrize(
    ("endpoint", "limits"),
    [("query", (1, 2)), ("get", (None, None)), ("search", (1,)), ("search", (1, 2, 3, 4))],
)
def test_limits_must_match_the_sub_results(endpoint: str, limits: Sequence[int | None]) -> None:
    # One for query (it holds for every query embedding) and get; one per search.
    parsed = parse(endpoint, build(endpoint, batches_for(endpoint)))
    with pytest.raises(MalformedBody, match="sub-results"):
        parsed.render(range(6), limits)
    with pytest.raises(MalformedBody, match="sub-results"):
        parsed.released_positions(range(6), limits)


def test_query_limit_trims_the_list_of_every_query_embedding() -> None:
    batches = batches_for("query")
    parsed = parse("query", build("query", batches))
    out = validate("query", parsed.render({0, 1, 2, 4, 5}, [2]))
    assert out == build("query", batches, {0, 1, 4, 5})
    assert parsed.released_positions({0, 1, 2, 4, 5}, [2]) == [0, 1, 4, 5]
    # Rejected hits do not count: the limit takes the next kept ones.
    assert parsed.released_positions({1, 2, 3, 4, 5}, [1]) == [1, 3]


def test_search_limits_trim_each_search() -> None:
    batches = batches_for("search")
    parsed = parse("search", build("search", batches))
    out = validate("search", parsed.render(range(6), [1, None, 2]))
    assert out == build("search", batches, {0, 3, 4})
    assert parsed.released_positions(range(6), (None, 0, 0)) == [0, 1, 2]


def test_get_limit() -> None:
    parsed = parse("get", build("get", batches_for("get")))
    assert parsed.released_positions({1, 3, 4, 5}, [2]) == [1, 3]
    assert orjson.loads(parsed.render({1, 3, 4, 5}, [2]))["ids"] == ["c-2", "c-4"]


@pytest.mark.parametrize("limits", [None, ()])
def test_no_limits_trim_nothing(limits: Sequence[int | None] | None) -> None:
    body = build("get", batches_for("get"))
    assert parse("get", body).render(range(6), limits) == encode(body)


# -- substitutes -----------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_replacement_takes_id_and_document_and_marks_metadata(endpoint: str) -> None:
    batches = batches_for(endpoint)
    parsed = parse(endpoint, build(endpoint, batches))
    out = validate(
        endpoint, parsed.render({1, 2, 4}, replacements={4: Replacement("c-5b", "epsilon v2")})
    )
    new = {
        **ROWS[4],
        "id": "c-5b",
        "document": "epsilon v2",
        # The declared fields described the replaced document: only the marker stays.
        "metadata": {SUBSTITUTED_FOR: "c-5"},
    }
    substituted = [[new if r is ROWS[4] else r for r in batch] for batch in batches]
    assert out == build(endpoint, substituted, {1, 2, 4})


def test_replacement_creates_metadata_for_a_null_entry() -> None:
    record = {**row("c-1", "old"), "metadata": None}
    out = orjson.loads(
        parse("get", get_body([record])).render({0}, replacements={0: Replacement("c-2", "new")})
    )
    assert out["ids"] == ["c-2"] and out["documents"] == ["new"]
    assert out["metadatas"] == [{SUBSTITUTED_FOR: "c-1"}]


def test_replacement_without_metadatas_leaves_them_null() -> None:
    body = get_body(ROWS[:2], include=["documents"])
    out = orjson.loads(parse("get", body).render({0, 1}, replacements={0: Replacement("n", "t")}))
    assert out["ids"] == ["n", "c-2"] and out["documents"] == ["t", "beta"]
    assert out["metadatas"] is None


def test_replacement_with_id_field_rewrites_the_metadata_field_not_the_record_id() -> None:
    records = [row("r-1", "old", doc_chunk="sop-1"), row("r-2", "other", doc_chunk="sop-2")]
    fmt = chroma(id_field="doc_chunk")
    parsed = parse("query", query_body([records]), fmt)
    out = validate("query", parsed.render({0}, replacements={0: Replacement("sop-1b", "new")}))
    assert out["ids"] == [["r-1"]]
    assert out["documents"] == [["new"]]
    assert out["metadatas"] == [[{"doc_chunk": "sop-1b", SUBSTITUTED_FOR: "sop-1"}]]


def test_replacement_of_a_hit_that_is_not_kept_is_ignored() -> None:
    body = build("get", batches_for("get"))
    out = parse("get", body).render({0}, replacements={3: Replacement("x", "y")})
    assert orjson.loads(out) == build("get", batches_for("get"), {0})


# -- malformed bodies ---------------------------------------------------------


def _query(**columns: Any) -> bytes:
    return orjson.dumps({"ids": [["a", "b"]], "include": [], **columns})


def _get(**columns: Any) -> bytes:
    return orjson.dumps({"ids": ["a", "b"], "include": [], **columns})


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("query", b""),
        ("query", b"{not json"),
        ("query", b'{"ids": [], "include": ["\xff"]}'),
        ("query", b"[" * 2000),
        ("query", b"[]"),
        ("query", b"null"),
        ("query", b'"SECRET"'),
        ("query", b"{}"),
        ("query", b'{"ids": null}'),
        ("query", b'{"ids": "SECRET"}'),
        ("query", b'{"ids": ["SECRET"]}'),
        ("query", b'{"ids": [["a"], null]}'),
        ("query", _query(documents=[["SECRET"]])),
        ("query", _query(documents=[["x", "y"], ["z"]])),
        ("query", _query(documents=["x", "y"])),
        ("query", _query(documents="SECRET")),
        ("query", _query(documents={"0": ["x", "y"]})),
        ("query", _query(metadatas=[["SECRET", None]])),
        ("query", _query(metadatas=[[[], None]])),
        ("query", _query(distances=[[0.1]])),
        ("query", _query(embeddings=[[[0.1]], [[0.2]]])),
        ("query", _query(uris=[["u", "v", "w"]])),
        ("query", _query(data=[["SECRET"]])),
        ("get", b'{"ids": {"SECRET": 1}}'),
        ("get", _get(documents=["SECRET"])),
        ("get", _get(documents=[None])),
        ("get", _get(metadatas=[{"k": 1}, 5])),
        ("get", _get(embeddings={"SECRET": 1})),
        ("search", b'{"ids": ["a"]}'),
        ("search", orjson.dumps({"ids": [["a"]], "documents": [None, None], "select": [[]]})),
        ("search", orjson.dumps({"ids": [["a"]], "metadatas": [["SECRET"]], "select": [[]]})),
        ("search", orjson.dumps({"ids": [["a"]], "scores": [[0.1, 0.2]], "select": [[]]})),
    ],
)
def test_malformed_bodies(endpoint: str, body: bytes) -> None:
    with pytest.raises(MalformedBody) as raised:
        ChromaFormat().parse(body, route(endpoint))
    assert "SECRET" not in str(raised.value)
    assert raised.value.__cause__ is None
    assert raised.value.__context__ is None


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_empty_results_are_valid(endpoint: str) -> None:
    batches: list[list[Row]] = [[]] if endpoint == "get" else [[], []]
    body = build(endpoint, batches)
    parsed = parse(endpoint, body)
    assert parsed.candidates == ()
    assert validate(endpoint, parsed.render(set())) == body
    no_queries = parse(endpoint, build(endpoint, [] if endpoint != "get" else [[]]))
    assert no_queries.candidates == ()


# -- metadata: what goes out of it -----------------------------------------------


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_without_declared_fields_metadata_goes_out_empty(endpoint: str) -> None:
    body = build(endpoint, batches_for(endpoint))
    out = orjson.loads(parse(endpoint, body, ChromaFormat()).render(range(6)))
    empty = [{**r, "metadata": {}} for r in ROWS]
    assert out == build(endpoint, batches_for(endpoint, empty))


def test_null_metadata_stays_null() -> None:
    record = {**row("c-1", "t"), "metadata": None}
    out = orjson.loads(parse("get", get_body([record]), ChromaFormat()).render({0}))
    assert out["metadatas"] == [None]


def test_id_field_and_marker_go_out_undeclared() -> None:
    records = [row("r-1", "old", doc_chunk="sop-1", secret="SECRET")]
    parsed = parse("get", get_body(records), ChromaFormat(AdapterOptions(id_field="doc_chunk")))
    out = orjson.loads(parsed.render({0}, replacements={0: Replacement("sop-2", "new")}))
    assert out["metadatas"] == [{"doc_chunk": "sop-2", SUBSTITUTED_FOR: "sop-1"}]


def test_a_substitute_loses_the_declared_metadata_fields() -> None:
    records = [row("r-1", "old", doc_chunk="sop-1", title="T", source={"url": "u"})]
    fmt = ChromaFormat(
        AdapterOptions(id_field="doc_chunk", hashed_fields=["title"], releasable_fields=["source"])
    )
    parsed = parse("get", get_body(records), fmt)
    assert orjson.loads(parsed.render({0}))["metadatas"] == [
        {"doc_chunk": "sop-1", "title": "T", "source": {"url": "u"}}
    ]
    out = orjson.loads(parsed.render({0}, replacements={0: Replacement("sop-2", "new")}))
    assert out["metadatas"] == [{"doc_chunk": "sop-2", SUBSTITUTED_FOR: "sop-1"}]


def test_releasable_dotted_paths_keep_their_nesting() -> None:
    record = row("c-1", "t", source={"url": "u", "owner": "SECRET"}, page=3)
    fmt = ChromaFormat(AdapterOptions(releasable_fields=["source.url", "page", "absent.field"]))
    out = orjson.loads(parse("get", get_body([record]), fmt).render({0}))
    assert out["metadatas"] == [{"source": {"url": "u"}, "page": 3}]


def test_hashed_fields_reach_the_candidate_and_go_out() -> None:
    records = [row("c-1", "t", title="T1", secret="SECRET"), row("c-2", "u")]
    fmt = ChromaFormat(AdapterOptions(hashed_fields=["title"]))
    for endpoint in ENDPOINTS:
        parsed = parse(endpoint, build(endpoint, [records]), fmt)
        first, second = parsed.candidates
        assert first.fields == canonical_fields({"title": "T1"}), endpoint
        assert second.fields == canonical_fields({}), endpoint
        out = orjson.loads(parsed.render({0, 1}))
        metadatas = out["metadatas"] if endpoint == "get" else out["metadatas"][0]
        assert metadatas == [{"title": "T1"}, {}], endpoint


def test_hashed_fields_without_a_canonical_form_make_the_record_unusable() -> None:
    # Two keys that are one once in canonical (NFC) form.
    record = row("c-1", "t", title={"e\u0301": 1, "\u00e9": 2})
    (candidate,) = parse(
        "get", get_body([record]), ChromaFormat(AdapterOptions(hashed_fields=["title"]))
    ).candidates
    assert candidate.text is None and candidate.fields is None
    assert candidate.problem == "hashed fields have no canonical form"


@pytest.mark.parametrize(
    "options",
    [{"hashed_fields": "title"}, {"releasable_fields": ["a..b"]}, {"hashed_fields": [1]}],
)
def test_invalid_field_options(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="_fields"):
        adapter(ChromaFormat, **options)


# -- collections named in paths ----------------------------------------------------

_ID, _NAME = "id", "name"


@pytest.mark.parametrize(
    ("method", "path", "named"),
    [
        ("POST", f"{COLL}/query", [(_ID, COLLECTION_ID)]),
        ("POST", f"{COLL}/get", [(_ID, COLLECTION_ID)]),
        ("GET", f"{COLL}/count", [(_ID, COLLECTION_ID)]),
        ("POST", f"{COLL}/add", [(_ID, COLLECTION_ID)]),
        ("GET", f"{COLL}/functions/fn", [(_ID, COLLECTION_ID)]),
        ("PUT", COLL, [(_ID, COLLECTION_ID)]),
        ("GET", f"{DB}/collections/docs", [(_NAME, "docs")]),
        ("HEAD", f"{DB}/collections/docs", [(_NAME, "docs")]),
        ("DELETE", f"{DB}/collections/docs", [(_NAME, "docs")]),
        # A collection may be named like another one's id: a name all the same.
        ("GET", COLL, [(_NAME, COLLECTION_ID)]),
        ("OPTIONS", COLL, [(_ID, COLLECTION_ID), (_NAME, COLLECTION_ID)]),
        ("GET", f"{DB}/collections/by-id/{COLLECTION_ID}", [(_ID, COLLECTION_ID)]),
        # "by-id" is a name where a path goes on past it.
        ("POST", f"{DB}/collections/by-id/get", [(_ID, "by-id")]),
        ("GET", f"{DB}/collections", []),
        ("GET", f"{DB}/collections_count", []),
        ("GET", f"{V2}/heartbeat", []),
        ("POST", f"{DB}/collections//query", []),
        ("POST", f"/api/v1/collections/{COLLECTION_ID}/query", []),
        ("POST", "/collections/docs/points/search", []),
    ],
)
def test_path_collections(method: str, path: str, named: list[tuple[str, str]]) -> None:
    found = ChromaFormat().path_collections(Route(method, path))
    expected_scope = ("default_tenant", "default_database")
    assert [(c.kind, c.value) for c in found] == named
    assert all((c.tenant, c.database) == expected_scope for c in found)


def test_path_collections_of_a_crn() -> None:
    found = ChromaFormat().path_collections(Route("GET", f"{V2}/collections/acme:prod:docs"))
    assert found == (PathCollection("name", "docs", "acme", "prod"),)
    found = ChromaFormat().path_collections(Route("GET", f"{V2}/collections/docs"))
    assert found == (PathCollection("name", "docs", None, None),)


@pytest.mark.parametrize(("method", "path"), [*FILTERED, *READ, *WRITE, *CONTENT, *OTHERS])
def test_the_rewriter_reads_exactly_the_filtered_routes(method: str, path: str) -> None:
    fmt = ChromaFormat()
    filtered = fmt.route_kind(Route(method, path)) is RouteKind.FILTERED
    assert fmt.rewrites_request(Route(method, path)) is filtered
    assert (collection_endpoint(Route(method, path)) is not None) is filtered


# -- properties (the shared ones are in tests/unit/test_format_contract.py) ----------

_scalar = (
    st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
_finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
# Any key but row()'s own keywords.
_metadata_keys = st.text(min_size=1, max_size=5).filter(
    lambda key: key not in ("distance", "embedding", "uri")
)


@st.composite
def _row(draw: st.DrawFn, chunk_id: str) -> Row:
    record = row(
        chunk_id,
        draw(st.none() | st.text(max_size=12)),
        distance=draw(st.none() | _finite),
        embedding=draw(st.lists(_finite, min_size=2, max_size=2)),
        uri=draw(st.none() | st.text(max_size=6)),
        **draw(st.dictionaries(_metadata_keys, _scalar, max_size=3)),
    )
    if draw(st.booleans()):
        # Null metadata for some records (Chroma stores records without any).
        record["metadata"] = draw(st.none() | st.just(record["metadata"]))
    return record


@st.composite
def _batches(draw: st.DrawFn, endpoint: str) -> list[list[Row]]:
    count = 1 if endpoint == "get" else draw(st.integers(min_value=0, max_value=3))
    batches = []
    for _ in range(count):
        ids = draw(st.lists(st.text(min_size=1, max_size=6), max_size=5, unique=True))
        batches.append([draw(_row(chunk_id)) for chunk_id in ids])
    return batches


def _released(batches: Sequence[Sequence[Row]]) -> list[list[Row]]:
    """The records as they go out of ``ChromaFormat(releasable_fields=["chunk"])``:
    of the metadata only ``chunk`` and the marker."""
    kept = ("chunk", SUBSTITUTED_FOR)

    def metadata(record: Row) -> Any:
        value = record["metadata"]
        return None if value is None else {k: v for k, v in value.items() if k in kept}

    return [[{**r, "metadata": metadata(r)} for r in batch] for batch in batches]


_CHUNK_ONLY = ChromaFormat(AdapterOptions(releasable_fields=["chunk"]))


def _layout(data: st.DataObject, batches: list[list[Row]]) -> tuple[list[str], list[list[str]]]:
    include = data.draw(st.lists(st.sampled_from(ALL_INCLUDE), unique=True))
    selects = [
        data.draw(st.lists(st.sampled_from([*ALL_SELECT, "chunk"]), unique=True)) for _ in batches
    ]
    return include, selects


@PROPERTIES
@given(endpoint=st.sampled_from(ENDPOINTS), data=st.data())
def test_property_every_include_and_select_stays_aligned(
    endpoint: str, data: st.DataObject
) -> None:
    """The contract's property (tests/unit/test_format_contract.py) over every column
    layout a request can select, null metadata and documents, checked by the client."""
    batches = data.draw(_batches(endpoint))
    include, selects = _layout(data, batches)
    if endpoint == "get":  # Chroma refuses a get that includes distances
        include = [i for i in include if i != "distances"]
    body = build(endpoint, batches, include=include, selects=selects)
    # What the request asked, as the request path hands it to the answer on a
    # filtered route: include and select go out as asked, metadata keys included.
    asked = ChromaEcho(tuple(include), tuple(tuple(keys) for keys in selects))
    parsed = _CHUNK_ONLY.parse(encode(body), route(endpoint), echo=asked)
    hits = [r for batch in batches for r in batch]
    assert [c.chunk_id for c in parsed.candidates] == [r["id"] for r in hits]
    keep = data.draw(st.sets(st.integers(min_value=-1, max_value=len(hits))))
    out = validate(endpoint, parsed.render(keep))
    assert out == build(endpoint, _released(batches), keep, include=include, selects=selects)
    assert parsed.released_positions(keep) == sorted(k for k in keep if 0 <= k < len(hits))


@PROPERTIES
@given(endpoint=st.sampled_from(ENDPOINTS), data=st.data())
def test_property_replacements_take_id_and_document_and_only_the_marker_in_metadata(
    endpoint: str, data: st.DataObject
) -> None:
    """Substitutes in records with null metadata or documents, checked by the client."""
    batches = data.draw(_batches(endpoint))
    body = build(endpoint, batches)
    parsed = parse(endpoint, body, _CHUNK_ONLY)
    positions = range(len(parsed.candidates))
    keep = data.draw(st.sets(st.sampled_from(positions))) if positions else set()
    replaced = data.draw(st.sets(st.sampled_from(sorted(keep)))) if keep else set()
    replacements = {p: Replacement(f"new-{p}", f"text {p}") for p in replaced}
    out = validate(endpoint, parsed.render(keep, replacements=replacements))

    expected: list[list[Row]] = []
    position = 0
    for batch in batches:
        expected.append([])
        for record in batch:
            if position in replacements:
                metadata = {SUBSTITUTED_FOR: record["id"]}
                record = {
                    **record,
                    "id": f"new-{position}",
                    "document": f"text {position}",
                    "metadata": metadata,
                }
            expected[-1].append(record)
            position += 1
    assert out == build(endpoint, _released(expected), keep)


@pytest.mark.parametrize(
    ("method", "path", "named"),
    [
        ("POST", f"{COLL}/query", [COLLECTION_ID]),
        ("GET", f"{DB}/collections/by-id/{COLLECTION_ID}", [COLLECTION_ID]),
        ("GET", f"{DB}/collections/sops", ["sops"]),
        ("GET", f"{V2}/heartbeat", []),
    ],
)
def test_the_request_policy_sees_the_collection_a_path_names(
    method: str, path: str, named: list[str]
) -> None:
    assert FormatTable([ChromaFormat()]).collections(Route(method, path)) == tuple(named)
