"""The Weaviate GraphQL adapter: routes, candidates, filtering, malformed bodies.

Routes follow Weaviate's REST API reference and OpenAPI spec
(docs.weaviate.io/weaviate/api/rest, weaviate/weaviate openapi-specs/schema.json)
plus the REST Search API (``/v1/search``, ``/v1/aggregate``), export and MCP
endpoints of recent releases. Body shapes come from the GraphQL API reference
and the GraphQL types Weaviate builds (see ``tests/fixtures/weaviate_bodies.py``).

Validation: weaviate-client v4 speaks gRPC and has no model of GraphQL
results; what it has is ``graphql_raw_query``, whose response callback decodes
a ``/v1/graphql`` body into ``_RawGQLReturn`` (get/aggregate/explore/errors).
Every rendered body is run through that callback (``_client_view``), and then
through ``_check_response``, a structural check derived from the same GraphQL
types: envelope keys, ``errors`` entries, ``_additional`` field types, group
statistics consistent with their hits, a grouped generative answer only on the
first object. Responses get no schema-level validation: Weaviate builds its
GraphQL schema per class at run time.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from weaviate.client_executor import _WeaviateClientExecutor
from weaviate.collections.classes.internal import _RawGQLReturn

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.core.integrity import canonical_fields
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody, ParsedBody, Unreleasable
from sidecar.formats.options import AdapterOptions
from sidecar.formats.weaviate.rest import WeaviateFormat
from sidecar.formats.weaviate.rest_body import GENERATIVE_WITHHELD, UPSTREAM_ERROR
from tests.fixtures.format_strategies import PROPERTIES, adapter
from tests.fixtures.weaviate_bodies import (
    UUIDS,
    Body,
    Obj,
    aggregate_body,
    batch,
    encode,
    errors_body,
    explore_body,
    generate,
    generative_body,
    get_body,
    graphql_error,
    group,
    group_hit,
    group_object,
    group_with_own_values_body,
    groups_body,
    hit,
    references_body,
    route,
)

# -- validation ------------------------------------------------------------------


def _client_view(body: bytes) -> _RawGQLReturn:
    """The body as weaviate-client's ``graphql_raw_query`` reads it."""
    response = httpx.Response(
        200,
        content=body,
        headers={"content-type": "application/json"},
        request=httpx.Request("POST", "http://weaviate:8080/v1/graphql"),
    )
    connection = SimpleNamespace(post=lambda **_: response)
    executor = SimpleNamespace(_connection=connection)
    result = _WeaviateClientExecutor.graphql_raw_query(executor, "{Get{Chunk{text}}}")  # type: ignore[arg-type]
    assert isinstance(result, _RawGQLReturn)
    return result


def _check_object(value: Any) -> None:
    assert isinstance(value, dict)
    additional = value.get("_additional")
    assert isinstance(additional, dict | None)
    if additional:
        assert isinstance(additional.get("id"), str | None)
        for key in ("distance", "certainty"):
            assert isinstance(additional.get(key), float | int | None)
        for key in ("score", "explainScore"):
            assert isinstance(additional.get(key), str | None)
        if (gen := additional.get("generate")) is not None:
            for key in ("singleResult", "groupedResult", "error"):
                assert isinstance(gen.get(key), str | None)
            assert gen.get("debug") is None or isinstance(gen["debug"].get("prompt"), str | None)
        if (grp := additional.get("group")) is not None:
            _check_group(grp)
    for item in value.values():
        if isinstance(item, list) and any(isinstance(ref, dict) for ref in item):
            for ref in item:
                _check_object(ref)


def _check_group(value: Any) -> None:
    assert isinstance(value, dict)
    hits = value["hits"]
    assert isinstance(hits, list) and hits, "a released group has hits"
    for item in hits:
        _check_object(item)
    assert isinstance(value.get("id"), int)
    assert value.get("count", len(hits)) == len(hits)
    distances = [h["_additional"].get("distance") for h in hits]
    if all(isinstance(d, float | int) for d in distances):
        assert value.get("minDistance", min(distances)) == min(distances)
        assert value.get("maxDistance", max(distances)) == max(distances)


def _check_class_result(objects: list[Any]) -> None:
    for obj in objects:
        _check_object(obj)
    groups = [
        o["_additional"]["group"] for o in objects if (o.get("_additional") or {}).get("group")
    ]
    assert [g["id"] for g in groups] == list(range(len(groups))), "group ids count released groups"
    grouped = [
        i
        for i, o in enumerate(objects)
        if ((o.get("_additional") or {}).get("generate") or {}).get("groupedResult") is not None
    ]
    assert grouped in ([], [0]), "a grouped answer sits on the first object only"


def _check_response(doc: Any) -> None:
    assert isinstance(doc, dict)
    assert set(doc) <= {"data", "errors", "extensions"}
    assert "data" in doc or "errors" in doc
    errors = doc.get("errors")
    assert isinstance(errors, list | None)
    for error in errors or []:
        assert isinstance(error["message"], str)
        assert all(isinstance(step, str | int) for step in error.get("path") or [])
    data = doc.get("data")
    assert isinstance(data, dict | None)
    for key, value in (data or {}).items():
        if key == "Get" and isinstance(value, dict):
            for objects in value.values():
                if isinstance(objects, list):
                    _check_class_result(objects)
        else:
            assert value is None or isinstance(value, str), "only Get results are released"


def _validated(out: bytes, batched: bool = False) -> Any:
    decoded = orjson.loads(out)
    for doc in decoded if batched else [decoded]:
        view = _client_view(orjson.dumps(doc))
        data = doc.get("data") or {}
        assert view.get == (data.get("Get", {}) if data else {})
        assert view.errors == doc.get("errors")
        _check_response(doc)
    return decoded


# The properties of the test objects, declared releasable so that whole objects
# go out; without a declaration only the text and id properties do.
RELEASABLE = [
    "doc_id",
    "page",
    "tags",
    "geo",
    "blank",
    "title",
    "chunk_id",
    "ofDocument",
    "related",
    "sections",
]


def weaviate(**options: Any) -> WeaviateFormat:
    """The adapter with the test objects' properties releasable."""
    return adapter(WeaviateFormat, releasable_fields=RELEASABLE, **options)


def _parse(body: Body | list[Body], fmt: WeaviateFormat | None = None) -> ParsedBody:
    return (fmt or weaviate()).parse(encode(body), route(isinstance(body, list)))


def _filtered(
    body: Body | list[Body], keep: Collection[int], fmt: WeaviateFormat | None = None
) -> Any:
    return _validated(_parse(body, fmt).render(keep), isinstance(body, list))


HITS = [
    hit(UUIDS[0], "alpha", distance=0.11, doc_id="a", page=1),
    hit(UUIDS[1], "beta", distance=0.12, doc_id="a", tags=["x", "y"]),
    hit(UUIDS[2], "gamma", distance=0.2, doc_id="b", geo={"latitude": 1.5, "longitude": 2.0}),
    hit(UUIDS[3], "delta", distance=0.3, doc_id="c", additional={"score": "0.7"}),
    hit(UUIDS[4], "", distance=0.4, doc_id="c", blank=None),
]


def _plain(keep: Collection[int] | None = None) -> Body:
    """HITS split over a class and an alias, keeping positions in ``keep`` (all when None)."""
    kept = [h for i, h in enumerate(HITS) if keep is None or i in keep]
    first = [h for h in kept if h in HITS[:3]]
    return get_body({"Chunk": first, "recent": [h for h in kept if h not in first]})


# -- routes ------------------------------------------------------------------------

U = UUIDS[0]


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("POST", "/v1/graphql", RouteKind.FILTERED),
        ("POST", "/v1/graphql/", RouteKind.FILTERED),
        ("post", "/v1/graphql", RouteKind.FILTERED),
        ("POST", "/v1/graphql/batch", RouteKind.FILTERED),
        ("GET", "/v1/graphql", RouteKind.CONTENT),
        ("PUT", "/v1/graphql", RouteKind.WRITE),
        ("POST", "/v1/graphql/other", RouteKind.WRITE),
        ("GET", "/v1/objects", RouteKind.CONTENT),
        ("GET", f"/v1/objects/{U}", RouteKind.CONTENT),
        ("HEAD", f"/v1/objects/{U}", RouteKind.CONTENT),
        ("GET", f"/v1/objects/Chunk/{U}", RouteKind.CONTENT),
        ("HEAD", f"/v1/objects/Chunk/{U}", RouteKind.CONTENT),
        ("GET", "/v1/backups/filesystem", RouteKind.CONTENT),
        ("POST", "/v1/backups/s3", RouteKind.CONTENT),
        ("GET", "/v1/backups/s3/nightly", RouteKind.CONTENT),
        ("POST", "/v1/backups/s3/nightly/restore", RouteKind.CONTENT),
        ("DELETE", "/v1/backups/s3/nightly", RouteKind.CONTENT),
        ("POST", "/v1/export/s3", RouteKind.CONTENT),
        ("GET", "/v1/export/s3/e1", RouteKind.CONTENT),
        ("POST", "/v1/search/Chunk/near-text", RouteKind.CONTENT),
        ("POST", "/v1/search/Chunk/bm25", RouteKind.CONTENT),
        ("POST", "/v1/search/Chunk/hybrid", RouteKind.CONTENT),
        ("POST", "/v1/aggregate/Chunk", RouteKind.CONTENT),
        ("POST", "/v1/mcp", RouteKind.CONTENT),
        ("GET", "/v1/mcp", RouteKind.CONTENT),
        ("GET", "/v1/modules/text2vec-contextionary/concepts/x", RouteKind.CONTENT),
        ("GET", "/v1", RouteKind.READ),
        ("GET", "/v1/", RouteKind.READ),
        ("GET", "/v1/meta", RouteKind.READ),
        ("GET", "/v1/.well-known/ready", RouteKind.READ),
        ("GET", "/v1/.well-known/live", RouteKind.READ),
        ("GET", "/v1/.well-known/openid-configuration", RouteKind.READ),
        ("GET", "/v1/schema", RouteKind.READ),
        ("GET", "/v1/schema/Chunk", RouteKind.READ),
        ("GET", "/v1/schema/Chunk/shards", RouteKind.CONTENT),  # vectorQueueSize
        (
            "GET",
            "/v1/schema/Chunk/tenants",
            RouteKind.CONTENT,
        ),  # tenant names: who else uses the class
        ("HEAD", "/v1/schema/Chunk/tenants/acme", RouteKind.CONTENT),
        ("GET", "/v1/nodes", RouteKind.CONTENT),  # verbose: objects per shard
        ("GET", "/v1/nodes/Chunk", RouteKind.CONTENT),
        ("GET", "/v1/cluster/statistics", RouteKind.READ),
        ("GET", "/v1/aliases", RouteKind.READ),
        ("GET", "/v1/users/own-info", RouteKind.READ),
        ("GET", "/v1/authz/roles", RouteKind.READ),
        ("POST", "/v1/authz/roles/admin/has-permission", RouteKind.READ),
        ("GET", "/v1/replication/replicate/list", RouteKind.READ),
        ("GET", "/v1/namespaces", RouteKind.READ),
        ("GET", "/v1/tasks", RouteKind.READ),
        ("GET", "/v1/classifications/c1", RouteKind.CONTENT),  # meta.count
        ("POST", "/v1/tokenize", RouteKind.READ),
        ("POST", "/v1/schema/Chunk/properties/title/tokenize", RouteKind.READ),
        ("POST", "/v1", RouteKind.WRITE),
        ("POST", "/v1/objects", RouteKind.WRITE),
        ("POST", "/v1/objects/validate", RouteKind.WRITE),
        ("PUT", f"/v1/objects/Chunk/{U}", RouteKind.WRITE),
        ("PATCH", f"/v1/objects/Chunk/{U}", RouteKind.WRITE),
        ("DELETE", f"/v1/objects/{U}", RouteKind.WRITE),
        ("POST", f"/v1/objects/Chunk/{U}/references/ofDocument", RouteKind.WRITE),
        ("POST", "/v1/batch/objects", RouteKind.WRITE),
        ("DELETE", "/v1/batch/objects", RouteKind.WRITE),
        ("POST", "/v1/batch/references", RouteKind.WRITE),
        ("GET", "/v1/batch/objects", RouteKind.WRITE),
        ("POST", "/v1/schema", RouteKind.WRITE),
        ("PUT", "/v1/schema/Chunk", RouteKind.WRITE),
        ("DELETE", "/v1/schema/Chunk", RouteKind.WRITE),
        ("POST", "/v1/schema/Chunk/properties", RouteKind.WRITE),
        ("POST", "/v1/schema/Chunk/tenants", RouteKind.WRITE),
        ("POST", "/v1/classifications", RouteKind.WRITE),
        ("POST", "/v1/users/db/svc/rotate-key", RouteKind.WRITE),
        ("POST", "/v1/authz/roles", RouteKind.WRITE),
        ("POST", "/v1/aliases", RouteKind.WRITE),
        ("DELETE", "/v1/replication/replicate/r1", RouteKind.WRITE),
        ("POST", "/v1/namespaces/ns1", RouteKind.WRITE),
        ("POST", "/v1/modules/text2vec-contextionary/extensions", RouteKind.WRITE),
    ],
)
def test_route_kind(method: str, path: str, kind: RouteKind) -> None:
    assert WeaviateFormat().route_kind(Route(method, path)) is kind


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/graphql"),
        ("POST", "/v2/graphql"),
        ("POST", "/v10/graphql"),
        ("POST", "v1/graphql"),
        ("POST", "/api/v1/graphql"),
        ("POST", "/v1//graphql"),
        ("POST", "/v1/_search"),  # an Elasticsearch index named "v1"
        ("GET", "/v1/_doc/1"),
        ("POST", "/v1/vector/search"),  # Milvus REST v1
        ("POST", "/v1/unknown"),
        ("POST", "/collections/docs/points/search"),
        ("POST", "/api/v2/tenants/t/databases/d/collections/c/query"),
        ("POST", "/query"),
        ("GET", "/"),
        ("POST", ""),
    ],
)
def test_route_kind_leaves_other_paths(method: str, path: str) -> None:
    assert WeaviateFormat().route_kind(Route(method, path)) is None


def test_name() -> None:
    assert WeaviateFormat().name == "weaviate"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"generative": "drop"}, "generative"),
        ({"text_field": ""}, "text_field"),
        ({"id_field": ""}, "id_field"),
    ],
)
def test_invalid_options(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        adapter(WeaviateFormat, **options)


@pytest.mark.parametrize(
    "bad_route", [Route("GET", "/v1/graphql"), Route("GET", "/v1/objects"), Route("POST", "/q")]
)
def test_parse_rejects_a_route_it_does_not_filter(bad_route: Route) -> None:
    with pytest.raises(ValueError, match="not handled by the weaviate format"):
        WeaviateFormat().parse(encode(_plain()), bad_route)


# -- plain Get -----------------------------------------------------------------------


def test_candidates_number_hits_across_classes_in_document_order() -> None:
    parsed = _parse(_plain())
    assert list(parsed.candidates) == [
        Candidate(i, h["_additional"]["id"], h["text"]) for i, h in enumerate(HITS)
    ]


@pytest.mark.parametrize("keep", [set(), {0}, {1, 4}, {0, 2, 3}, set(range(5)), {4, 99, -1}])
def test_render_keeps_exactly_the_kept_hits(keep: set[int]) -> None:
    assert _filtered(_plain(), keep) == _plain(keep)


def test_render_all_of_a_plain_body_is_the_original() -> None:
    assert _parse(_plain()).render(range(5)) == encode(_plain())


def test_upstream_errors_become_one_gate_error_and_extensions_go() -> None:
    body = _plain()
    body["errors"] = [graphql_error("partial failure quoting SECRET", "Get", "Other")]
    body["extensions"] = {"trace": ["SECRET"]}
    out = _filtered(body, range(5))
    assert out == {**_plain(), "errors": [UPSTREAM_ERROR]}


def test_render_keeps_the_envelope_order_and_drops_strings_and_unknown_keys() -> None:
    body = {
        "extensions": {"x": 1},
        "errors": None,
        "data": {
            "__typename": "SECRET",
            "Get": {"__typename": "SECRET", "C": HITS[:2], "D": None},
            "Other": None,
        },
        "x-debug": "SECRET",
    }
    out = _parse(body).render({1})
    assert out == orjson.dumps(
        {"errors": None, "data": {"Get": {"C": [HITS[1]], "D": None}, "Other": None}}
    )


def test_render_can_be_called_again_and_never_mutates() -> None:
    body = _plain()
    parsed = _parse(body)
    first = parsed.render({0, 3})
    parsed.render({1}, None, {1: Replacement("new", "new text")})
    assert orjson.loads(parsed.render(set())) == _plain(set())
    assert parsed.render({0, 3}) == first
    assert parsed.render(range(5)) == encode(body)
    assert body == _plain()


@pytest.mark.parametrize("limits", [None, (), []])
def test_render_without_limits(limits: Sequence[int | None] | None) -> None:
    assert _parse(_plain()).render(range(5), limits) == encode(_plain())


@pytest.mark.parametrize("limits", [(3,), (1, 2, 3)])
def test_limits_must_match_the_class_results(limits: tuple[int, ...]) -> None:
    parsed = _parse(_plain())  # two class results: Chunk and recent
    with pytest.raises(MalformedBody, match="sub-results"):
        parsed.render(range(5), limits)
    with pytest.raises(MalformedBody, match="sub-results"):
        parsed.released_positions(range(5), limits)


def test_limits_apply_by_response_key_in_sorted_order() -> None:
    # Weaviate writes data.Get as a Go map: keys sorted, whatever the query's order.
    body = get_body({"recent": HITS[3:], "Chunk": HITS[:3]})
    parsed = _parse(body)
    # Sorted: "Chunk" (positions 2, 3, 4) then "recent" (positions 0, 1).
    out = _filtered(body, range(5))
    assert _validated(parsed.render(range(5), (2, 1))) == get_body(
        {"recent": HITS[3:4], "Chunk": HITS[:2]}
    )
    assert parsed.released_positions({0, 1, 3, 4}, (2, None)) == [0, 1, 3, 4]
    assert parsed.released_positions({0, 1, 2, 4}, (1, 1)) == [0, 2]
    assert out == body


def test_a_null_class_result_takes_a_limit_too() -> None:
    body = get_body({"A": None, "B": HITS[:3]})
    parsed = _parse(body)
    assert orjson.loads(parsed.render(range(3), (5, 1))) == get_body({"A": None, "B": HITS[:1]})


def test_batches_take_no_limits() -> None:
    parsed = _parse(batch([_plain()]))
    with pytest.raises(MalformedBody, match="does not trim"):
        parsed.render(range(5), (1, 1))
    assert parsed.render(range(5), ()) == encode(batch([_plain()]))


def test_trimmed_objects_withhold_the_grouped_answer() -> None:
    out = _validated(_parse(generative_body()).render(range(3), (2,)))
    first, second = out["data"]["Get"]["Chunk"]
    assert first["_additional"]["generate"] == generate("single 0", None, GENERATIVE_WITHHELD)
    assert second == generative_body()["data"]["Get"]["Chunk"][1]


def test_null_class_results_and_empty_get_pass() -> None:
    body = get_body(
        {"Chunk": None, "Other": []}, errors=[graphql_error("no such tenant", "Get", "Chunk")]
    )
    parsed = _parse(body)
    assert parsed.candidates == ()
    assert _filtered(body, set()) == {**body, "errors": [UPSTREAM_ERROR]}


@pytest.mark.parametrize(
    "body",
    [
        errors_body(),
        {"errors": [graphql_error("boom")]},
        {"data": {"Get": None}, "errors": [graphql_error("boom", "Get")]},
        {"data": {}},
    ],
)
def test_errors_only_responses_pass_without_candidates(body: Body) -> None:
    parsed = _parse(body)
    assert parsed.candidates == ()
    expected = {**body, "errors": [UPSTREAM_ERROR]} if "errors" in body else body
    assert _filtered(body, set()) == expected


@pytest.mark.parametrize("errors", [[], None])
def test_empty_or_null_errors_stay_as_they_are(errors: list[Any] | None) -> None:
    body = {**_plain(), "errors": errors}
    assert _filtered(body, range(5)) == body


# -- candidate fields ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "chunk_id", "text", "problem"),
    [
        ({"text": "t", "_additional": {"id": U}}, U, "t", None),
        ({"text": "", "_additional": {"id": U}}, U, "", None),
        ({"text": "t", "_additional": {"id": 7}}, "7", "t", None),
        ({"text": "t"}, None, "t", "no _additional"),
        ({"text": "t", "_additional": None}, None, "t", "no _additional"),
        ({"text": "t", "_additional": {"distance": 0.1}}, None, "t", "_additional.id missing"),
        ({"text": "t", "_additional": {"id": ""}}, None, "t", "_additional.id is empty"),
        (
            {"text": "t", "_additional": {"id": True}},
            None,
            "t",
            "_additional.id is not a string or integer",
        ),
        ({"_additional": {"id": U}}, U, None, "property 'text' missing"),
        ({"text": None, "_additional": {"id": U}}, U, None, "property 'text' missing"),
        ({"text": ["a"], "_additional": {"id": U}}, U, None, "property 'text' is not a string"),
        ({}, None, None, "no _additional; property 'text' missing"),
    ],
)
def test_candidate_from_object(
    obj: Obj, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    assert _parse(get_body({"Chunk": [obj]})).candidates == (Candidate(0, chunk_id, text, problem),)


@pytest.mark.parametrize(
    ("obj", "chunk_id", "text", "problem"),
    [
        ({"chunk_id": "c-1", "body": "b", "_additional": {"id": U}}, "c-1", "b", None),
        ({"chunk_id": 12, "body": "b"}, "12", "b", None),
        ({"body": "b", "_additional": {"id": U}}, None, "b", "property 'chunk_id' missing"),
        ({"chunk_id": "c-1", "text": "t"}, "c-1", None, "property 'body' missing"),
    ],
)
def test_candidate_from_properties(
    obj: Obj, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    fmt = WeaviateFormat(AdapterOptions(text_field="body", id_field="chunk_id"))
    assert _parse(get_body({"Chunk": [obj]}), fmt).candidates == (
        Candidate(0, chunk_id, text, problem),
    )


def test_problems_never_contain_values() -> None:
    obj = {"text": {"v": "SECRET-TEXT"}, "_additional": {"id": ["SECRET-ID"]}}
    (candidate,) = _parse(get_body({"Chunk": [obj]})).candidates
    assert candidate.problem is not None
    assert "SECRET" not in candidate.problem


# -- what goes out of a result object ------------------------------------------------


def test_undeclared_properties_are_dropped() -> None:
    obj = hit(U, "t", distance=0.2, secret="SECRET", nested={"a": "SECRET"})
    out = _filtered(get_body({"Chunk": [obj]}), {0}, WeaviateFormat())
    assert out["data"]["Get"]["Chunk"] == [{"text": "t", "_additional": obj["_additional"]}]


def test_id_property_and_typename_go_out_undeclared() -> None:
    obj = {"__typename": "Chunk", "chunk_id": "c-1", "text": "t", "secret": "SECRET"}
    fmt = WeaviateFormat(AdapterOptions(id_field="chunk_id"))
    out = _filtered(get_body({"Chunk": [obj]}), {0}, fmt)
    assert out["data"]["Get"]["Chunk"] == [{"__typename": "Chunk", "chunk_id": "c-1", "text": "t"}]


def test_hashed_properties_reach_the_candidate_and_go_out() -> None:
    objs = [hit(U, "t", title="T", secret="SECRET"), hit(UUIDS[1], "u")]
    fmt = WeaviateFormat(AdapterOptions(hashed_fields=["title", "meta.source"]))
    parsed = _parse(get_body({"Chunk": objs}), fmt)
    assert [c.fields for c in parsed.candidates] == [
        canonical_fields({"title": "T"}),
        canonical_fields({}),
    ]
    out = orjson.loads(parsed.render({0, 1}))
    assert out["data"]["Get"]["Chunk"] == [
        {"text": "t", "title": "T", "_additional": objs[0]["_additional"]},
        {"text": "u", "_additional": objs[1]["_additional"]},
    ]


def test_additional_keeps_only_known_safe_keys() -> None:
    additional = {
        "id": U,
        "distance": 0.1,
        "certainty": 0.9,
        "score": "0.5",
        "vector": [0.1],
        "vectors": {"v": [0.1]},
        "creationTimeUnix": "1",
        "lastUpdateTimeUnix": "2",
        "rerank": [{"score": 0.3}],
        "explainScore": "SECRET",
        "featureProjection": {"vector": [1, 2]},
        "answer": {"result": "SECRET"},
        "summary": [{"result": "SECRET"}],
        "generate": {**generate("single"), "metadata": {"usage": "SECRET"}},
    }
    obj = {"text": "t", "_additional": additional}
    out = _filtered(get_body({"Chunk": [obj]}), {0})
    (released,) = out["data"]["Get"]["Chunk"]
    dropped = {"explainScore", "featureProjection", "answer", "summary"}
    assert released["_additional"] == {
        **{k: v for k, v in additional.items() if k not in dropped},
        "generate": generate("single"),
    }


def test_a_substitute_loses_its_declared_properties_references_too() -> None:
    body = references_body()
    fmt = WeaviateFormat(AdapterOptions(releasable_fields=["tags", "ofDocument"]))
    parsed = _parse(body, fmt)
    out = orjson.loads(parsed.render({0, 1, 2}, None, {0: Replacement(UUIDS[50], "new")}))
    (first, _) = out["data"]["Get"]["Chunk"]
    assert first == {"text": "new", "_additional": {"id": UUIDS[50]}}


def test_undeclared_reference_properties_are_dropped_empty_or_not() -> None:
    # Present-but-emptied against absent would tell that a reference was removed.
    body = references_body()
    fmt = WeaviateFormat(AdapterOptions(releasable_fields=["tags"]))
    for keep in (set(), {1}, {3, 4}):
        out = _filtered(body, {0, 2, *keep}, fmt)
        first, second = out["data"]["Get"]["Chunk"]
        assert set(first) == {"text", "tags", "_additional"}
        assert set(second) == {"text", "_additional"}


def test_grouped_by_value_goes_out_only_for_a_released_property() -> None:
    body = groups_body()
    out = _filtered(body, range(6), WeaviateFormat())
    groups = [o["_additional"]["group"] for o in out["data"]["Get"]["Chunk"]]
    assert [g["groupedBy"] for g in groups] == [{"path": ["doc_id"], "value": None}] * 3
    out = _filtered(body, range(6), WeaviateFormat(AdapterOptions(releasable_fields=["doc_id"])))
    groups = [o["_additional"]["group"] for o in out["data"]["Get"]["Chunk"]]
    assert [g["groupedBy"]["value"] for g in groups] == ["a", "b", "c"]


def test_group_keeps_only_its_known_keys() -> None:
    value = {**group(0, "a", [group_hit(U, "a0", 0.1)]), "extra": "SECRET", "groupedBy": "SECRET"}
    body = get_body({"Chunk": [group_object(value)]})
    out = orjson.loads(_parse(body).render({0}))
    released = out["data"]["Get"]["Chunk"][0]["_additional"]["group"]
    assert set(released) == {"id", "groupedBy", "count", "maxDistance", "minDistance", "hits"}
    assert released["groupedBy"] is None


def test_a_rejected_group_object_nulls_only_what_would_go_out() -> None:
    hits = [group_hit(UUIDS[0], "a0", 0.1), group_hit(UUIDS[1], "a1", 0.3)]
    obj = group_object(
        group(0, "a", hits), text="a0", secret="SECRET", _additional={"id": U, "answer": {}}
    )
    out = orjson.loads(_parse(get_body({"Chunk": [obj]})).render({2}))
    (released,) = out["data"]["Get"]["Chunk"]
    assert set(released) == {"text", "_additional"} and released["text"] is None
    assert set(released["_additional"]) == {"id", "group"}


# -- cross-references --------------------------------------------------------------------


def test_referenced_objects_are_candidates_after_their_holder() -> None:
    parsed = _parse(references_body())
    assert [c.chunk_id for c in parsed.candidates] == [
        UUIDS[0],
        UUIDS[10],
        UUIDS[1],
        UUIDS[12],
        UUIDS[11],
        UUIDS[10],
    ]


def test_rejected_references_are_removed_from_their_list() -> None:
    body = references_body()
    out = _filtered(body, {0, 2, 4, 5})
    first, second = out["data"]["Get"]["Chunk"]
    assert first == {**body["data"]["Get"]["Chunk"][0], "ofDocument": []}
    assert second["related"] == [body["data"]["Get"]["Chunk"][1]["related"][1]]
    assert second["ofDocument"] == []


def test_references_of_a_kept_reference_are_filtered_too() -> None:
    body = references_body()
    out = _filtered(body, {2, 3})
    (second,) = out["data"]["Get"]["Chunk"]
    assert second["related"] == [
        {**body["data"]["Get"]["Chunk"][1]["related"][0], "ofDocument": []}
    ]


def test_references_of_a_removed_object_are_not_released() -> None:
    parsed = _parse(references_body())
    assert parsed.released_positions({1, 3, 4, 5}) == []
    assert parsed.released_positions({0, 1, 2, 4, 5}) == [0, 1, 2, 5]


def test_nested_object_lists_are_checked_like_references() -> None:
    # Without the schema an object[] property looks like a cross-reference.
    obj = hit(U, "t", sections=[{"title": "s1"}, {"title": "s2"}])
    parsed = _parse(get_body({"Chunk": [obj]}))
    assert [c.problem for c in parsed.candidates][1:] == [
        "no _additional; property 'text' missing"
    ] * 2
    out = _filtered(get_body({"Chunk": [obj]}), {0})
    assert out["data"]["Get"]["Chunk"] == [{**obj, "sections": []}]


# -- groupBy -------------------------------------------------------------------------


def test_group_hits_are_the_candidates() -> None:
    parsed = _parse(groups_body())
    assert [(c.chunk_id, c.text) for c in parsed.candidates] == [
        (UUIDS[0], "a0"),
        (UUIDS[1], "a1"),
        (UUIDS[2], "b0"),
        (UUIDS[3], "c0"),
        (UUIDS[4], "c1"),
        (UUIDS[5], "c2"),
    ]


def test_groups_are_recomputed_from_kept_hits() -> None:
    body = groups_body()
    out = _filtered(body, {1, 3, 5})
    hits = [g["_additional"]["group"]["hits"] for g in body["data"]["Get"]["Chunk"]]
    assert out == get_body(
        {
            "Chunk": [
                group_object(group(0, "a", [hits[0][1]])),
                group_object(group(1, "c", [hits[2][0], hits[2][2]])),
            ]
        }
    )
    assert out["data"]["Get"]["Chunk"][1]["_additional"]["group"]["minDistance"] == 0.25
    assert out["data"]["Get"]["Chunk"][1]["_additional"]["group"]["maxDistance"] == 0.5


def test_all_kept_groups_are_unchanged() -> None:
    assert _filtered(groups_body(), range(6)) == groups_body()


def test_group_statistics_without_hit_distances_become_null() -> None:
    hits = [
        {"text": "a", "_additional": {"id": UUIDS[0]}},
        {"text": "b", "_additional": {"id": UUIDS[1]}},
    ]
    value = {
        **group(0, "a", [group_hit(UUIDS[0], "a", 0.1), group_hit(UUIDS[1], "b", 0.2)]),
        "hits": hits,
    }
    out = _filtered(get_body({"Chunk": [group_object(value)]}), {1})
    (only,) = out["data"]["Get"]["Chunk"]
    assert only["_additional"]["group"] == {
        **value,
        "hits": [hits[1]],
        "count": 1,
        "minDistance": None,
        "maxDistance": None,
    }


def test_group_without_selected_hits_is_dropped() -> None:
    value = group(0, "a", [group_hit(UUIDS[0], "a", 0.1)])
    del value["hits"]
    body = get_body({"Chunk": [group_object(value)]})
    assert _parse(body).candidates == ()
    assert _filtered(body, set())["data"]["Get"]["Chunk"] == []


def test_group_object_carrying_values_is_a_candidate_before_its_hits() -> None:
    parsed = _parse(group_with_own_values_body())
    assert [c.chunk_id for c in parsed.candidates] == [UUIDS[0], UUIDS[0], UUIDS[1]]
    assert _filtered(group_with_own_values_body(), {0, 1, 2}) == group_with_own_values_body()


def test_rejected_group_object_keeps_only_its_group() -> None:
    body = group_with_own_values_body()
    out = _filtered(body, {2})
    hits = body["data"]["Get"]["Chunk"][0]["_additional"]["group"]["hits"]
    assert out["data"]["Get"]["Chunk"] == [
        {
            "text": None,
            "_additional": {"id": None, "distance": None, "group": group(0, "a", hits[1:])},
        }
    ]
    assert _parse(body).released_positions({2}) == [2]


def test_group_object_without_kept_hits_is_dropped_even_when_kept() -> None:
    out = _filtered(group_with_own_values_body(), {0})
    assert out["data"]["Get"]["Chunk"] == []
    assert _parse(group_with_own_values_body()).released_positions({0}) == []


# -- generative search ---------------------------------------------------------------------


def test_generated_text_stays_when_nothing_is_removed() -> None:
    assert _filtered(generative_body(), range(3)) == generative_body()


def test_grouped_answer_is_withheld_when_an_object_is_removed() -> None:
    out = _filtered(generative_body(), {0, 2})
    first, third = out["data"]["Get"]["Chunk"]
    assert first["_additional"]["generate"] == generate("single 0", None, GENERATIVE_WITHHELD)
    assert third == generative_body()["data"]["Get"]["Chunk"][2]


def test_grouped_slot_moves_to_the_first_kept_object() -> None:
    out = _filtered(generative_body(), {1, 2})
    second, third = out["data"]["Get"]["Chunk"]
    assert second["_additional"]["generate"] == generate("single 1", None, GENERATIVE_WITHHELD)
    assert third["_additional"]["generate"] == generate("single 2")


def test_grouped_error_is_replaced_too() -> None:
    out = _filtered(generative_body(None, "provider error quoting SECRET"), {0, 1})
    assert out["data"]["Get"]["Chunk"][0]["_additional"]["generate"]["error"] == GENERATIVE_WITHHELD


def test_no_grouped_answer_means_nothing_to_withhold() -> None:
    out = _filtered(generative_body(None), {1})
    assert out["data"]["Get"]["Chunk"] == [generative_body(None)["data"]["Get"]["Chunk"][1]]


def test_block_refuses_a_grouped_answer_over_removed_objects() -> None:
    parsed = _parse(generative_body(), weaviate(generative="block"))
    with pytest.raises(Unreleasable) as raised:
        parsed.render({0, 1})
    assert raised.value.code == "generated_from_rejected_chunks"
    assert parsed.render(range(3)) == encode(generative_body())
    # No grouped answer, nothing to refuse.
    parsed = _parse(generative_body(None), weaviate(generative="block"))
    assert orjson.loads(parsed.render({1}))["data"]["Get"]["Chunk"][0]["text"] == "text 1"


def test_grouped_answer_on_a_class_result_is_independent_of_other_classes() -> None:
    body = generative_body()
    body["data"]["Get"]["Other"] = [hit(UUIDS[9], "other")]
    out = _filtered(body, {0, 1, 2})
    assert out["data"]["Get"]["Chunk"] == generative_body()["data"]["Get"]["Chunk"]
    assert out["data"]["Get"]["Other"] == []


# -- replacements -----------------------------------------------------------------------


def test_replacement_takes_the_hits_id_and_text() -> None:
    body = _plain()
    out = _validated(_parse(body).render({0, 3}, None, {3: Replacement(UUIDS[40], "successor")}))
    # Its declared properties described the replaced document: they go.
    assert out["data"]["Get"]["recent"] == [
        {"text": "successor", "_additional": {**HITS[3]["_additional"], "id": UUIDS[40]}}
    ]
    assert SUBSTITUTED_FOR.encode() not in orjson.dumps(out)


def test_replacement_of_a_property_id() -> None:
    fmt = weaviate(id_field="chunk_id")
    body = get_body({"Chunk": [hit(U, "old", chunk_id="c-1")]})
    out = _validated(_parse(body, fmt).render({0}, None, {0: Replacement("c-2", "new")}))
    assert out["data"]["Get"]["Chunk"] == [hit(U, "new", chunk_id="c-2")]


def test_replacement_clears_text_generated_from_the_old_text() -> None:
    body = get_body(
        {
            "Chunk": [
                hit(U, "old", additional={"generate": generate("from old", debug="prompt old")})
            ]
        }
    )
    out = _validated(_parse(body).render({0}, None, {0: Replacement("n", "new")}))
    assert out["data"]["Get"]["Chunk"][0]["_additional"]["generate"] == generate(
        None, None, GENERATIVE_WITHHELD
    )
    with pytest.raises(Unreleasable):
        _parse(body, weaviate(generative="block")).render({0}, None, {0: Replacement("n", "x")})


def test_replaced_first_object_withholds_the_grouped_answer() -> None:
    out = _validated(_parse(generative_body()).render(range(3), None, {0: Replacement("n", "new")}))
    first = out["data"]["Get"]["Chunk"][0]["_additional"]["generate"]
    assert first == generate(None, None, GENERATIVE_WITHHELD)


# -- other root fields ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (aggregate_body(), "Aggregate"),
        (explore_body(UUIDS[:3]), "Explore"),
        ({"data": {"__schema": {"types": [{"name": "Chunk"}]}}}, "__schema"),
        ({"data": {"found": {"Chunk": [hit(U, "aliased")]}}}, "found"),
        ({"data": {"Get": [{"beacon": "weaviate://localhost/Chunk/x"}]}}, "Get"),
    ],
)
def test_other_root_fields_are_withheld(body: Body, key: str) -> None:
    parsed = _parse(body)
    assert parsed.candidates == ()
    out = _filtered(body, set())
    assert out == {**body, "data": {**body["data"], key: None}, "errors": [_withheld_error(key)]}
    assert _parse(body).render(range(10)) == parsed.render(set())


def test_withheld_fields_add_to_existing_errors() -> None:
    body = _plain()
    body["data"]["Aggregate"] = aggregate_body()["data"]["Aggregate"]
    body["errors"] = [graphql_error("earlier")]
    out = _filtered(body, range(5))
    assert out["data"]["Get"] == _plain()["data"]["Get"]
    assert out["data"]["Aggregate"] is None
    assert out["errors"] == [UPSTREAM_ERROR, _withheld_error("Aggregate")]


def test_aggregate_aliased_as_get_rows_are_rejected_candidates() -> None:
    body = {"data": {"Get": aggregate_body()["data"]["Aggregate"]}}
    parsed = _parse(body)
    assert [c.chunk_id for c in parsed.candidates] == [None]
    assert _filtered(body, set()) == {"data": {"Get": {"Chunk": []}}}


def _withheld_error(key: str) -> Obj:
    return {
        "message": f"retrieval gate: {key} is not released, only Get results are filtered",
        "path": [key],
    }


# -- batch ---------------------------------------------------------------------------------


def test_batch_numbers_hits_through_all_responses() -> None:
    body = batch([_plain(), errors_body(), get_body({"Chunk": [hit(UUIDS[20], "z")]})])
    parsed = _parse(body)
    assert [c.chunk_id for c in parsed.candidates] == [*UUIDS[:5], UUIDS[20]]
    out = _filtered(body, {1, 5})
    failed = {"data": None, "errors": [UPSTREAM_ERROR]}
    assert out == batch([_plain({1}), failed, get_body({"Chunk": [hit(UUIDS[20], "z")]})])


def test_empty_batch() -> None:
    assert _filtered([], set()) == []


# -- malformed bodies -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batched", "body"),
    [
        (False, b""),
        (False, b"{not json"),
        (False, b'{"data": {"Get": {"C": []}}, "x": "\xff"}'),
        (False, b"[" * 2000),
        (False, b"[]"),
        (False, b"null"),
        (False, b'"SECRET"'),
        (False, b"{}"),
        (False, b'{"extensions": {}}'),
        (False, b'{"data": []}'),
        (False, b'{"data": "SECRET", "errors": {}}'),
        (False, b'{"data": {"Get": {"C": {"SECRET": 1}}}}'),
        (False, b'{"data": {"Get": {"C": 5}}}'),
        (False, b'{"data": {"Get": {"C": ["SECRET"]}}}'),
        (False, b'{"data": {"Get": {"C": [null]}}}'),
        (False, b'{"data": {"Get": {"C": [{"_additional": "SECRET"}]}}}'),
        (False, b'{"data": {"Get": {"C": [{"_additional": {"group": []}}]}}}'),
        (False, b'{"data": {"Get": {"C": [{"_additional": {"group": {"hits": {}}}}]}}}'),
        (False, b'{"data": {"Get": {"C": [{"_additional": {"group": {"hits": [1]}}}]}}}'),
        (False, b'{"data": {"Get": {"C": [{"ref": [{"a": 1}, "SECRET"]}]}}}'),
        (True, b'{"data": null}'),
        (True, b"[[]]"),
        (True, b'[{"data": {"Get": {"C": [1]}}}]'),
    ],
)
def test_malformed_bodies(batched: bool, body: bytes) -> None:
    with pytest.raises(MalformedBody) as raised:
        WeaviateFormat().parse(body, route(batched))
    assert "SECRET" not in str(raised.value)
    assert raised.value.__cause__ is None
    assert raised.value.__context__ is None


# -- properties (the shared ones are in tests/unit/test_format_contract.py) ------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_property_names = st.text(min_size=1, max_size=6).filter(lambda k: k not in ("text", "_additional"))
_properties: st.SearchStrategy[dict[str, Any]] = st.dictionaries(
    _property_names, _scalars | st.lists(st.text(max_size=4), max_size=3), max_size=3
)
_ids = st.none() | st.uuids().map(str)
_texts = st.none() | st.text(max_size=12)
_distances = st.floats(min_value=0, max_value=2, allow_nan=False)


@st.composite
def _objects(draw: st.DrawFn, max_size: int = 5) -> list[Obj]:
    return [
        hit(draw(_ids), draw(_texts), distance=draw(_distances), **draw(_properties))
        for _ in range(draw(st.integers(min_value=0, max_value=max_size)))
    ]


_class_names = st.sampled_from(["Chunk", "Passage", "recent", "a1", "__x"])


@st.composite
def _classes(draw: st.DrawFn) -> dict[str, list[Obj]]:
    return {name: draw(_objects()) for name in draw(st.sets(_class_names, min_size=1, max_size=3))}


def _keep_subset(classes: dict[str, list[Obj]], keep: Collection[int]) -> dict[str, list[Obj]]:
    out, position = {}, 0
    for name, objs in classes.items():
        out[name] = [o for i, o in enumerate(objs, position) if i in keep]
        position += len(objs)
    return out


def _keeps(count: int) -> st.SearchStrategy[set[int]]:
    return st.sets(st.integers(min_value=0, max_value=max(count - 1, 0)))


@PROPERTIES
@given(
    responses=st.lists(_classes(), min_size=1, max_size=3), batched=st.booleans(), data=st.data()
)
def test_property_the_client_reads_exactly_the_kept_objects(
    responses: list[dict[str, list[Obj]]], batched: bool, data: st.DataObject
) -> None:
    """The contract's property (tests/unit/test_format_contract.py) for objects with any
    properties, in classes, aliases and batches, read by weaviate-client."""
    responses = responses if batched else responses[:1]
    count = sum(len(objs) for classes in responses for objs in classes.values())
    keep = data.draw(_keeps(count))
    expected: list[Body] = []
    offset = 0
    for classes in responses:
        kept = _keep_subset(classes, {p - offset for p in keep})
        # No property is declared: of each object only its text and id go out.
        expected.append(get_body({k: [_bare(o) for o in objs] for k, objs in kept.items()}))
        offset += sum(len(objs) for objs in classes.values())
    bodies = [get_body(classes) for classes in responses]
    body: Body | list[Body] = batch(bodies) if batched else bodies[0]
    out = _filtered(body, keep, WeaviateFormat())
    assert out == (batch(expected) if batched else expected[0])


def _bare(obj: Obj) -> Obj:
    """``obj`` as it goes out when no property is declared: its text and ``_additional``."""
    return {key: value for key, value in obj.items() if key in ("text", "_additional")}


@st.composite
def _grouped(draw: st.DrawFn) -> list[tuple[str, list[Obj]]]:
    return [
        (
            draw(st.text(max_size=4)),
            [
                group_hit(draw(_ids), draw(_texts), draw(_distances), **draw(_properties))
                for _ in range(draw(st.integers(min_value=0, max_value=3)))
            ],
        )
        for _ in range(draw(st.integers(min_value=0, max_value=4)))
    ]


@PROPERTIES
@given(groups=_grouped(), data=st.data())
def test_property_groups(groups: list[tuple[str, list[Obj]]], data: st.DataObject) -> None:
    body = get_body({"Chunk": [group_object(group(i, v, h)) for i, (v, h) in enumerate(groups)]})
    fmt = WeaviateFormat(AdapterOptions(releasable_fields=["doc_id"]))
    parsed = _parse(body, fmt)
    count = sum(len(h) for _, h in groups)
    assert len(parsed.candidates) == count
    keep = data.draw(_keeps(count))

    expected: list[Obj] = []
    position = 0
    for value, hits in groups:
        kept = [_bare(h) for i, h in enumerate(hits, position) if i in keep]
        position += len(hits)
        if kept:
            expected.append(group_object(group(len(expected), value, kept)))
    assert _filtered(body, keep, fmt) == get_body({"Chunk": expected})


@PROPERTIES
@given(
    size=st.integers(min_value=1, max_value=5),
    grouped=st.none() | st.text(max_size=6),
    error=st.none() | st.text(max_size=6),
    block=st.booleans(),
    data=st.data(),
)
def test_propertygenerative_body(
    size: int, grouped: str | None, error: str | None, block: bool, data: st.DataObject
) -> None:
    objs = [
        hit(UUIDS[i], f"t{i}", additional={"generate": generate(data.draw(_texts))})
        for i in range(size)
    ]
    objs[0]["_additional"]["generate"].update(groupedResult=grouped, error=error)
    body = get_body({"Chunk": objs})
    keep = data.draw(_keeps(size))
    removed = len(keep & set(range(size))) < size
    parsed = _parse(body, weaviate(generative="block" if block else "strip"))
    if block and removed and grouped is not None:
        with pytest.raises(Unreleasable):
            parsed.render(keep)
        return

    kept = [o for i, o in enumerate(objs) if i in keep]
    if removed and kept and (grouped is not None or error is not None):
        carrier = kept[0]
        withheld = {**carrier["_additional"]["generate"], "groupedResult": None}
        withheld["error"] = GENERATIVE_WITHHELD
        kept[0] = {**carrier, "_additional": {**carrier["_additional"], "generate": withheld}}
    assert _validated(parsed.render(keep)) == get_body({"Chunk": kept})
