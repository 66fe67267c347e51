"""Qdrant search requests: tenant push-down, over-fetch, malformed bodies.

Every rewritten request is validated with the request model of its endpoint:
qdrant-client's for query, query/batch, query/groups and scroll; for the
search, recommend and discover endpoints, which the installed qdrant-client no
longer ships, the models below restate Qdrant's OpenAPI spec (as qdrant-client
1.14 generated them) on top of qdrant-client's component models.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, StrictFloat
from qdrant_client.http import models

from sidecar.core.hits import Route
from sidecar.formats.base import (
    MalformedRequest,
    RequestRewrite,
    ResponseFormat,
    UnfilterableRequest,
)
from sidecar.formats.qdrant.rest import QdrantFormat
from tests.fixtures.format_strategies import PROPERTIES
from tests.fixtures.qdrant_bodies import encode, point, query_body, route

TENANT = "acme"
TENANT_KEY = "tenant"
CONDITION = {"key": TENANT_KEY, "match": {"value": TENANT}}
UUID_A = "5c56c793-69f3-4fbf-87e6-c4bf54c28c26"

Request = dict[str, Any]


# -- request models of the endpoints qdrant-client no longer ships --------------


class _NamedVector(BaseModel, extra="forbid"):
    name: str
    vector: list[StrictFloat]


class _NamedSparseVector(BaseModel, extra="forbid"):
    name: str
    vector: models.SparseVector


_NamedVectorStruct = list[StrictFloat] | _NamedVector | _NamedSparseVector
_RecommendExample = models.ExtendedPointId | list[StrictFloat] | models.SparseVector


class _ContextExamplePair(BaseModel, extra="forbid"):
    positive: _RecommendExample
    negative: _RecommendExample


class _Common(BaseModel, extra="forbid"):
    shard_key: models.ShardKeySelector | None = None
    filter: models.Filter | None = None
    params: models.SearchParams | None = None
    with_payload: models.WithPayloadInterface | None = None
    with_vector: models.WithVector | None = None


class SearchRequest(_Common):
    vector: _NamedVectorStruct
    limit: int
    offset: int | None = None
    score_threshold: float | None = None


class RecommendRequest(_Common):
    positive: list[_RecommendExample] | None = None
    negative: list[_RecommendExample] | None = None
    strategy: models.RecommendStrategy | None = None
    limit: int
    offset: int | None = None
    score_threshold: float | None = None
    using: str | None = None
    lookup_from: models.LookupLocation | None = None


class DiscoverRequest(_Common):
    target: _RecommendExample | None = None
    context: list[_ContextExamplePair] | None = None
    limit: int
    offset: int | None = None
    using: str | None = None
    lookup_from: models.LookupLocation | None = None


class _Groups(BaseModel, extra="forbid"):
    group_by: str
    group_size: int
    limit: int
    with_lookup: models.WithLookupInterface | None = None


class SearchGroupsRequest(_Common, _Groups):
    vector: _NamedVectorStruct
    score_threshold: float | None = None


class RecommendGroupsRequest(_Common, _Groups):
    positive: list[_RecommendExample] | None = None
    negative: list[_RecommendExample] | None = None
    strategy: models.RecommendStrategy | None = None
    score_threshold: float | None = None
    using: str | None = None
    lookup_from: models.LookupLocation | None = None


class SearchRequestBatch(BaseModel, extra="forbid"):
    searches: list[SearchRequest]


class RecommendRequestBatch(BaseModel, extra="forbid"):
    searches: list[RecommendRequest]


class DiscoverRequestBatch(BaseModel, extra="forbid"):
    searches: list[DiscoverRequest]


REQUEST_MODELS: Mapping[str, type[BaseModel]] = {
    "search": SearchRequest,
    "search/batch": SearchRequestBatch,
    "search/groups": SearchGroupsRequest,
    "query": models.QueryRequest,
    "query/batch": models.QueryRequestBatch,
    "query/groups": models.QueryGroupsRequest,
    "recommend": RecommendRequest,
    "recommend/batch": RecommendRequestBatch,
    "recommend/groups": RecommendGroupsRequest,
    "discover": DiscoverRequest,
    "discover/batch": DiscoverRequestBatch,
    "scroll": models.ScrollRequest,
}
ENDPOINTS = sorted(REQUEST_MODELS)
BATCHES = [name for name in ENDPOINTS if name.endswith("/batch")]


# -- example requests ---------------------------------------------------------

APP_FILTER: Request = {
    "must": [{"key": "lang", "match": {"value": "en"}}],
    "should": {"key": "tags", "match": {"any": ["a", "b"]}},
    "must_not": [{"has_id": [7, UUID_A]}, {"is_empty": {"key": "text"}}],
    "min_should": {
        "conditions": [{"key": "year", "range": {"gte": 2020}}, {"is_null": {"key": "x"}}],
        "min_count": 1,
    },
}

_SEARCH: Request = {
    "vector": {"name": "dense", "vector": [0.1, 0.2, 0.3]},
    "limit": 5,
    "params": {"hnsw_ef": 128, "exact": False},
    "with_payload": ["text", "doc_id"],
    "score_threshold": 0.25,
}
_RECOMMEND: Request = {
    # Vectors: a point id as an example is refused under push-down (tested below).
    "positive": [[0.1, 0.2, 0.3], [0.2, 0.2, 0.2]],
    "negative": [[0.3, 0.2, 0.1]],
    "strategy": "best_score",
    "limit": 5,
    "using": "dense",
    "lookup_from": {"collection": "other", "vector": "dense"},
    "with_payload": True,
}
_DISCOVER: Request = {
    "target": [0.1, 0.2, 0.3],
    "context": [{"positive": [0.2, 0.2, 0.2], "negative": [0.3, 0.2, 0.1]}],
    "limit": 5,
    "with_payload": True,
}
_QUERY: Request = {
    "prefetch": [
        {"query": {"indices": [1, 5], "values": [0.3, 0.7]}, "using": "sparse", "limit": 20},
        {"query": [0.1, 0.2, 0.3], "using": "dense", "limit": 20},
    ],
    "query": {"fusion": "rrf"},
    "limit": 5,
    "with_payload": True,
}
_GROUPS: Request = {"group_by": "doc_id", "group_size": 2, "limit": 4}

EXAMPLES: Mapping[str, Request] = {
    "search": _SEARCH,
    "search/batch": {"searches": [_SEARCH, {"vector": [0.5, 0.5, 0.5], "limit": 3}]},
    "search/groups": {
        "vector": [0.1, 0.2, 0.3],
        **_GROUPS,
        "with_lookup": {"collection": "documents", "with_payload": True},
    },
    "query": _QUERY,
    "query/batch": {"searches": [_QUERY, {"query": [0.5, 0.5, 0.5], "limit": 3}]},
    "query/groups": {"query": [0.1, 0.2, 0.3], **_GROUPS, "with_payload": True},
    "recommend": _RECOMMEND,
    "recommend/batch": {"searches": [_RECOMMEND, {"positive": [[0.5, 0.5, 0.5]], "limit": 3}]},
    "recommend/groups": {"positive": [[0.5, 0.5, 0.5]], "negative": [[0.1, 0.1, 0.1]], **_GROUPS},
    "discover": _DISCOVER,
    "discover/batch": {"searches": [_DISCOVER, {"target": [0.5, 0.5, 0.5], "limit": 3}]},
    "scroll": {"limit": 10, "offset": UUID_A, "with_payload": True, "with_vector": False},
}


def _rewrite(
    endpoint: str,
    request: Request,
    *,
    tenant_key: str | None = TENANT_KEY,
    factor: float = 1.0,
    cap: int = 1000,
) -> tuple[Request, RequestRewrite]:
    """Rewrite ``request`` for ``endpoint``; check the result with its request model."""
    rewrite = QdrantFormat().rewrite_request(
        encode(request),
        route(endpoint),
        tenant=TENANT,
        tenant_key=tenant_key,
        overfetch_factor=factor,
        overfetch_cap=cap,
    )
    REQUEST_MODELS[endpoint].model_validate_json(rewrite.body)
    decoded: Request = orjson.loads(rewrite.body)
    return decoded, rewrite


def _sub_requests(endpoint: str, request: Request) -> list[Request]:
    searches: list[Request] = request["searches"] if endpoint in BATCHES else [request]
    return searches


def _with_filter(endpoint: str, app_filter: Request) -> Request:
    request = copy.deepcopy(EXAMPLES[endpoint])
    for sub_request in _sub_requests(endpoint, request):
        sub_request["filter"] = app_filter
    return request


def _without(request: Request, *fields: str) -> Request:
    return {key: value for key, value in request.items() if key not in fields}


# -- routes ------------------------------------------------------------------


def test_examples_are_valid_requests() -> None:
    for endpoint in ENDPOINTS:
        REQUEST_MODELS[endpoint].model_validate(EXAMPLES[endpoint])
        REQUEST_MODELS[endpoint].model_validate(_with_filter(endpoint, APP_FILTER))


def test_qdrant_format_declares_that_it_rewrites_searches() -> None:
    response_format: ResponseFormat = QdrantFormat()
    assert all(response_format.rewrites_request(route(endpoint)) for endpoint in ENDPOINTS)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_rewrites_search_routes(endpoint: str) -> None:
    assert QdrantFormat().rewrites_request(route(endpoint))
    assert QdrantFormat().rewrites_request(Route("post", f"/collections/c/points/{endpoint}/"))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/collections/docs/points"),  # retrieve by ids
        ("GET", "/collections/docs/points/42"),
        ("PUT", "/collections/docs/points"),
        ("POST", "/collections/docs/points/count"),
        ("POST", "/collections/docs/points/delete"),
        ("POST", "/collections/docs/points/discover/groups"),
        ("POST", "/collections/docs/points/search/matrix/pairs"),
        ("GET", "/collections/docs/points/search"),
        ("POST", "/collections//points/search"),
        ("POST", "/v1/collections/docs/points/search"),
    ],
)
def test_does_not_rewrite_other_routes(method: str, path: str) -> None:
    assert not QdrantFormat().rewrites_request(Route(method, path))


@pytest.mark.parametrize(
    ("request_route", "body"),
    [
        (route(""), b'{"ids": [1, 2], "with_payload": true}'),  # retrieve: explicit ids
        (route("{id}"), b""),
        (route("search/matrix/pairs"), b"not json"),
        (Route("PUT", "/collections/docs/points"), b'{"points": []}'),
    ],
)
def test_other_routes_come_back_unchanged(request_route: Route, body: bytes) -> None:
    rewrite = QdrantFormat().rewrite_request(
        body,
        request_route,
        tenant=TENANT,
        tenant_key=TENANT_KEY,
        overfetch_factor=2,
        overfetch_cap=100,
    )
    assert rewrite == RequestRewrite(body, (), tenant_filter=False, overfetched=False)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_nothing_to_apply_returns_the_same_body(endpoint: str) -> None:
    # Read for the collections it names, forwarded as it came.
    body = encode(EXAMPLES[endpoint])
    rewrite = QdrantFormat().rewrite_request(
        body,
        route(endpoint),
        tenant=TENANT,
        tenant_key=None,
        overfetch_factor=1.0,
        overfetch_cap=100,
    )
    assert rewrite.body is body
    assert (rewrite.limits, rewrite.tenant_filter, rewrite.overfetched) == ((), False, False)


# -- tenant push-down ---------------------------------------------------------


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_push_down_without_app_filter(endpoint: str) -> None:
    request = EXAMPLES[endpoint]
    rewritten, rewrite = _rewrite(endpoint, request)
    assert rewrite.tenant_filter
    assert not rewrite.overfetched
    assert rewrite.limits == ()
    originals = _sub_requests(endpoint, request)
    for sub_request, original in zip(_sub_requests(endpoint, rewritten), originals, strict=True):
        assert sub_request["filter"] == {"must": [CONDITION]}
        assert _without(sub_request, "filter", "prefetch") == _without(original, "prefetch")


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_push_down_nests_the_app_filter(endpoint: str) -> None:
    request = _with_filter(endpoint, APP_FILTER)
    rewritten, _ = _rewrite(endpoint, request)
    for sub_request in _sub_requests(endpoint, rewritten):
        assert sub_request["filter"] == {"must": [CONDITION, APP_FILTER]}
        # Qdrant reads the nested element as a Filter, the same one the app sent.
        parsed = models.Filter.model_validate(sub_request["filter"])
        assert isinstance(parsed.must, list)
        assert parsed.must[1] == models.Filter.model_validate(APP_FILTER)


def test_push_down_keeps_the_filter_where_the_app_put_it() -> None:
    body = b'{"filter":{"must":[]},"vector":[0.1],"limit":5,"x-extra":[1,2.5,null]}'
    rewrite = QdrantFormat().rewrite_request(
        body,
        route("search"),
        tenant=TENANT,
        tenant_key=TENANT_KEY,
        overfetch_factor=1,
        overfetch_cap=100,
    )
    assert rewrite.body == (
        b'{"filter":{"must":[{"key":"tenant","match":{"value":"acme"}},{"must":[]}]},'
        b'"vector":[0.1],"limit":5,"x-extra":[1,2.5,null]}'
    )


def test_null_filter_is_no_filter() -> None:
    rewritten, _ = _rewrite("search", {**_SEARCH, "filter": None})
    assert rewritten["filter"] == {"must": [CONDITION]}


def test_query_push_down_reaches_every_prefetch() -> None:
    inner_filter = {"must_not": [{"key": "draft", "match": {"value": True}}]}
    request = {
        "prefetch": [
            {
                "prefetch": {"query": [0.1, 0.2], "limit": 50, "filter": inner_filter},
                "query": [0.1, 0.2],
                "limit": 20,
            },
            {"query": {"indices": [1], "values": [1.0]}, "using": "sparse", "filter": APP_FILTER},
        ],
        "query": {"fusion": "dbsf"},
        "filter": APP_FILTER,
        "limit": 5,
    }
    rewritten, _ = _rewrite("query", request, factor=2)
    first, second = rewritten["prefetch"]
    assert rewritten["filter"] == {"must": [CONDITION, APP_FILTER]}
    assert first["filter"] == {"must": [CONDITION]}
    assert first["prefetch"]["filter"] == {"must": [CONDITION, inner_filter]}
    assert second["filter"] == {"must": [CONDITION, APP_FILTER]}
    # Prefetch limits stay: the final query ranks the same candidates.
    assert (first["limit"], first["prefetch"]["limit"]) == (20, 50)
    assert rewritten["limit"] == 10


def test_query_groups_push_down_reaches_prefetch() -> None:
    request = {**EXAMPLES["query/groups"], "prefetch": {"query": [0.1, 0.2, 0.3], "limit": 40}}
    rewritten, _ = _rewrite("query/groups", request)
    assert rewritten["prefetch"]["filter"] == {"must": [CONDITION]}


def _prefetch_chain(depth: int) -> Request:
    request: Request = {"query": [0.1], "limit": 5}
    innermost = request
    for _ in range(depth):
        innermost["prefetch"] = {"query": [0.1], "limit": 5}
        innermost = innermost["prefetch"]
    return request


def test_every_level_of_a_prefetch_chain_gets_the_condition() -> None:
    rewritten, _ = _rewrite("query", _prefetch_chain(60))
    level: Request | None = rewritten
    levels = 0
    while level is not None:
        assert level["filter"] == {"must": [CONDITION]}
        level, levels = level.get("prefetch"), levels + 1
    assert levels == 61


def test_prefetch_chain_deeper_than_python_recursion_is_malformed_not_a_crash() -> None:
    # orjson reads 1024 levels; a recursive walk would overflow before that.
    with pytest.raises(MalformedRequest, match="nested too deeply"):
        QdrantFormat().rewrite_request(
            b'{"limit":5,"prefetch":' * 1000 + b"{}" + b"}" * 1000,
            route("query"),
            tenant=TENANT,
            tenant_key=TENANT_KEY,
            overfetch_factor=1,
            overfetch_cap=100,
        )


def test_push_down_only_when_over_fetch_is_off() -> None:
    rewritten, rewrite = _rewrite("query", EXAMPLES["query"], factor=0.5)
    assert rewritten["limit"] == 5
    assert (rewrite.tenant_filter, rewrite.overfetched, rewrite.limits) == (True, False, ())


def test_over_fetch_only_when_push_down_is_off() -> None:
    rewritten, rewrite = _rewrite("search", EXAMPLES["search"], tenant_key=None, factor=2)
    assert rewritten == {**EXAMPLES["search"], "limit": 10}
    assert (rewrite.tenant_filter, rewrite.overfetched, rewrite.limits) == (False, True, (5,))


def test_scroll_only_over_fetch_is_nothing_to_do() -> None:
    body = encode(EXAMPLES["scroll"])
    rewrite = QdrantFormat().rewrite_request(
        body,
        route("scroll"),
        tenant=TENANT,
        tenant_key=None,
        overfetch_factor=3,
        overfetch_cap=100,
    )
    assert rewrite == RequestRewrite(body, (), tenant_filter=False, overfetched=False)


# -- over-fetch ----------------------------------------------------------------


@pytest.mark.parametrize("endpoint", sorted(set(ENDPOINTS) - {"scroll"}))
def test_over_fetch_multiplies_the_limit_and_records_the_app_limit(endpoint: str) -> None:
    request = EXAMPLES[endpoint]
    rewritten, rewrite = _rewrite(endpoint, request, factor=3)
    originals = _sub_requests(endpoint, request)
    assert rewrite.overfetched
    assert rewrite.limits == tuple(original["limit"] for original in originals)
    for sub_request, original in zip(_sub_requests(endpoint, rewritten), originals, strict=True):
        assert sub_request["limit"] == original["limit"] * 3
        assert _without(sub_request, "filter", "prefetch", "limit") == _without(
            original, "prefetch", "limit"
        )


@pytest.mark.parametrize("endpoint", ["search/groups", "query/groups", "recommend/groups"])
def test_groups_over_fetch_groups_not_group_size(endpoint: str) -> None:
    rewritten, rewrite = _rewrite(endpoint, EXAMPLES[endpoint], factor=2.5)
    assert (rewritten["limit"], rewritten["group_size"]) == (10, 2)
    assert rewrite.limits == (4,)


@pytest.mark.parametrize(
    ("limit", "factor", "cap", "raised"),
    [
        (5, 2, 1000, 10),
        (5, 1.5, 1000, 8),  # rounded up
        (10, 1.1, 1000, 11),  # as configured, not 11.000000000000002 rounded up
        (3, 1.01, 1000, 4),
        (10, 3, 25, 25),  # capped
        (1, 1000.0, 64, 64),
    ],
)
def test_over_fetch_rounds_up_and_caps(limit: int, factor: float, cap: int, raised: int) -> None:
    rewritten, rewrite = _rewrite("search", {**_SEARCH, "limit": limit}, factor=factor, cap=cap)
    assert rewritten["limit"] == raised
    assert rewrite.limits == (limit,)


@pytest.mark.parametrize(("limit", "cap"), [(100, 50), (50, 50), (0, 1000)])
def test_over_fetch_never_lowers_a_limit(limit: int, cap: int) -> None:
    rewritten, rewrite = _rewrite("query", {**_QUERY, "limit": limit}, factor=2, cap=cap)
    assert rewritten["limit"] == limit
    assert (rewrite.overfetched, rewrite.limits) == (False, ())


@pytest.mark.parametrize("endpoint", ["query", "query/groups"])
@pytest.mark.parametrize("limit", ["absent", None])
def test_query_limit_defaults_to_ten(endpoint: str, limit: str | None) -> None:
    request = _without(EXAMPLES[endpoint], "limit")
    if limit is None:
        request["limit"] = None
    rewritten, rewrite = _rewrite(endpoint, request, factor=2)
    assert rewritten["limit"] == 20
    assert rewrite.limits == (10,)


@pytest.mark.parametrize("endpoint", ["search", "recommend", "discover", "search/groups"])
def test_requests_without_their_required_limit_are_not_over_fetched(endpoint: str) -> None:
    # Qdrant refuses them itself; inventing a limit would make them valid.
    request = _without(EXAMPLES[endpoint], "limit")
    body = QdrantFormat().rewrite_request(
        encode(request),
        route(endpoint),
        tenant=TENANT,
        tenant_key=TENANT_KEY,
        overfetch_factor=2,
        overfetch_cap=100,
    )
    assert _without(orjson.loads(body.body), "filter") == request
    assert (body.overfetched, body.limits) == (False, ())


@pytest.mark.parametrize("endpoint", ["search", "recommend", "discover"])
def test_deprecated_top_is_over_fetched_in_place(endpoint: str) -> None:
    request = {**_without(EXAMPLES[endpoint], "limit"), "top": 4}
    rewrite = QdrantFormat().rewrite_request(
        encode(request),
        route(endpoint),
        tenant=TENANT,
        tenant_key=None,
        overfetch_factor=2,
        overfetch_cap=100,
    )
    assert orjson.loads(rewrite.body) == {**request, "top": 8}
    assert rewrite.limits == (4,)


@pytest.mark.parametrize("endpoint", ["search", "recommend", "discover", "query"])
def test_offset_turns_over_fetch_off(endpoint: str) -> None:
    rewritten, rewrite = _rewrite(endpoint, {**EXAMPLES[endpoint], "offset": 10}, factor=2)
    assert (rewritten["limit"], rewritten["offset"]) == (5, 10)
    assert (rewrite.overfetched, rewrite.limits) == (False, ())


@pytest.mark.parametrize("offset", [0, None])
def test_zero_or_null_offset_is_no_offset(offset: int | None) -> None:
    rewritten, rewrite = _rewrite("query", {**_QUERY, "offset": offset}, factor=2)
    assert (rewritten["limit"], rewrite.limits) == (10, (5,))


def test_scroll_is_never_over_fetched() -> None:
    rewritten, rewrite = _rewrite("scroll", EXAMPLES["scroll"], factor=3)
    assert rewritten == {**EXAMPLES["scroll"], "filter": {"must": [CONDITION]}}
    assert (rewrite.tenant_filter, rewrite.overfetched, rewrite.limits) == (True, False, ())


def test_batch_limits_follow_the_sub_requests() -> None:
    request = {
        "searches": [
            {"vector": [0.1], "limit": 5},
            {"vector": [0.2], "limit": 3, "offset": 6},
            {"vector": [0.3], "limit": 500},
            {"vector": [0.4], "limit": 2},
        ]
    }
    rewritten, rewrite = _rewrite("search/batch", request, factor=2, cap=100)
    assert [sub["limit"] for sub in rewritten["searches"]] == [10, 3, 500, 4]
    assert rewrite.limits == (5, None, None, 2)
    assert rewrite.overfetched


def test_empty_batch() -> None:
    rewritten, rewrite = _rewrite("query/batch", {"searches": []}, factor=2)
    assert rewritten == {"searches": []}
    assert (rewrite.tenant_filter, rewrite.overfetched, rewrite.limits) == (True, False, ())


def test_non_finite_factor_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="finite"):
        QdrantFormat().rewrite_request(
            encode(_SEARCH),
            route("search"),
            tenant=TENANT,
            tenant_key=None,
            overfetch_factor=math.inf,
            overfetch_cap=100,
        )


def test_over_fetched_query_is_trimmed_back_to_k() -> None:
    # The app asks for k=5; the gate fetches 10 and rejects 3 of the first 5.
    _, rewrite = _rewrite("query", _QUERY, factor=2)
    assert rewrite.limits == (5,)
    hits = [point(i, f"text {i}", score=1 - i / 100) for i in range(10)]
    parsed = QdrantFormat().parse(encode(query_body(hits)), route("query"))
    admitted = set(range(10)) - {0, 2, 3}
    rendered = orjson.loads(parsed.render(admitted, rewrite.limits))
    assert [hit["id"] for hit in rendered["result"]["points"]] == [1, 4, 5, 6, 7]


# -- malformed requests -----------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("search", b""),
        ("search", b"{not json"),
        ("search", b'{"vector": [0.1], "limit": 5, "x": "\xff"}'),
        ("search", b"[" * 2000),
        ("search", b"[]"),
        ("search", b"null"),
        ("search", b'"SECRET"'),
        ("search", b'{"filter": [], "limit": 5}'),
        ("search", b'{"filter": "SECRET", "limit": 5}'),
        ("scroll", b'{"filter": 3}'),
        ("search/batch", b'{"searches": {}}'),
        ("search/batch", b'{"searches": null}'),
        ("query/batch", b'{"searches": [{"limit": 5}, "SECRET"]}'),
        ("query/batch", b"{}"),
        ("query", b'{"prefetch": ["SECRET"], "limit": 5}'),
        ("query", b'{"prefetch": {"prefetch": [{}, 1]}, "limit": 5}'),
        ("query/groups", b'{"prefetch": 1, "group_by": "d", "group_size": 1, "limit": 5}'),
        ("search", b'{"vector": [0.1], "limit": "5"}'),
        ("search", b'{"vector": [0.1], "limit": -1}'),
        ("search", b'{"vector": [0.1], "limit": 2.5}'),
        ("search", b'{"vector": [0.1], "limit": true}'),
        ("recommend", b'{"positive": [1], "top": "SECRET"}'),
        ("query", b'{"limit": [5]}'),
        ("search", b'{"filter": ' + b'{"must": ' * 260 + b"{}" + b"}" * 261),
    ],
)
def test_malformed_requests(endpoint: str, body: bytes) -> None:
    with pytest.raises(MalformedRequest) as raised:
        QdrantFormat().rewrite_request(
            body,
            route(endpoint),
            tenant=TENANT,
            tenant_key=TENANT_KEY,
            overfetch_factor=2,
            overfetch_cap=100,
        )
    assert "SECRET" not in str(raised.value)
    # A decode error's .doc holds the whole body: it must not ride along.
    assert raised.value.__cause__ is None
    assert raised.value.__context__ is None


def test_limit_is_not_read_when_over_fetch_is_off() -> None:
    # Qdrant judges the limit itself; the gate only reads what it changes.
    rewritten = QdrantFormat().rewrite_request(
        b'{"vector": [0.1], "limit": "5"}',
        route("search"),
        tenant=TENANT,
        tenant_key=TENANT_KEY,
        overfetch_factor=1,
        overfetch_cap=100,
    )
    assert orjson.loads(rewritten.body)["limit"] == "5"


# -- properties ---------------------------------------------------------------

_keys = st.sampled_from(["doc_id", "lang", "meta.owner", "tags[]", "tenant", "a.b[].c"])
_numbers = st.integers(min_value=-(2**31), max_value=2**31) | st.floats(
    allow_nan=False, allow_infinity=False, width=32
)
_match = st.one_of(
    st.builds(lambda v: {"value": v}, st.text(max_size=5) | st.integers(0, 99) | st.booleans()),
    st.builds(lambda v: {"any": v}, st.lists(st.text(max_size=5), max_size=3)),
    st.builds(lambda v: {"except": v}, st.lists(st.integers(0, 99), max_size=3)),
    st.builds(lambda v: {"text": v}, st.text(min_size=1, max_size=5)),
)
_range = st.fixed_dictionaries(
    {}, optional={"gt": _numbers, "gte": _numbers, "lt": _numbers, "lte": _numbers}
)
_leaf_conditions = st.one_of(
    st.builds(lambda k, m: {"key": k, "match": m}, _keys, _match),
    st.builds(lambda k, r: {"key": k, "range": r}, _keys, _range),
    st.builds(lambda k: {"is_empty": {"key": k}}, _keys),
    st.builds(lambda k: {"is_null": {"key": k}}, _keys),
    st.builds(
        lambda ids: {"has_id": ids},
        st.lists(st.integers(0, 2**63) | st.uuids().map(str), max_size=3),
    ),
)


def _filters(conditions: st.SearchStrategy[Request]) -> st.SearchStrategy[Request]:
    clause = st.lists(conditions, max_size=3) | conditions  # Qdrant takes a list or one
    min_should = st.fixed_dictionaries(
        {"conditions": st.lists(conditions, max_size=3), "min_count": st.integers(0, 3)}
    )
    return st.fixed_dictionaries(
        {},
        optional={"must": clause, "should": clause, "must_not": clause, "min_should": min_should},
    )


def _nested(conditions: st.SearchStrategy[Request]) -> st.SearchStrategy[Request]:
    return st.builds(
        lambda key, inner: {"nested": {"key": key, "filter": inner}}, _keys, _filters(conditions)
    )


_conditions = st.recursive(
    _leaf_conditions,
    lambda children: _filters(children) | _nested(children),
    max_leaves=8,
)
_app_filters = _filters(_conditions)


@PROPERTIES
@given(app_filter=_app_filters, endpoint=st.sampled_from(ENDPOINTS), factor=st.sampled_from([1, 2]))
def test_property_app_filter_is_the_second_must_element(
    app_filter: Request, endpoint: str, factor: int
) -> None:
    models.Filter.model_validate(app_filter)  # the strategy makes valid filters
    request = _with_filter(endpoint, app_filter)
    if endpoint.startswith("query"):
        for sub_request in _sub_requests(endpoint, request):
            sub_request["prefetch"] = {"query": [0.1, 0.2, 0.3], "filter": app_filter}
    expected = copy.deepcopy(app_filter)

    rewritten, _ = _rewrite(endpoint, request, factor=factor)

    for sub_request in _sub_requests(endpoint, rewritten):
        assert sub_request["filter"] == {"must": [CONDITION, expected]}
        if endpoint.startswith("query"):
            assert sub_request["prefetch"]["filter"] == {"must": [CONDITION, expected]}


@PROPERTIES
@given(
    limits=st.lists(st.integers(0, 10_000), max_size=4),
    factor=st.floats(min_value=0, max_value=50, allow_nan=False),
    cap=st.integers(0, 20_000),
)
def test_property_over_fetch(limits: list[int], factor: float, cap: int) -> None:
    request = {"searches": [{"query": [0.1], "limit": limit} for limit in limits]}
    rewritten, rewrite = _rewrite("query/batch", request, tenant_key=None, factor=factor, cap=cap)

    raised = [sub["limit"] for sub in rewritten["searches"]]
    for asked, got in zip(limits, raised, strict=True):
        assert got == max(asked, min(cap, math.ceil(Fraction(repr(factor)) * asked)))
    recorded = tuple(
        asked if got > asked else None for asked, got in zip(limits, raised, strict=True)
    )
    assert rewrite.overfetched == any(limit is not None for limit in recorded)
    assert rewrite.limits == (recorded if rewrite.overfetched else ())


# -- collections named in the body ----------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "request_body", "named"),
    [
        ("recommend", _RECOMMEND, ("other",)),
        ("recommend/batch", EXAMPLES["recommend/batch"], ("other",)),
        ("search/groups", EXAMPLES["search/groups"], ("documents",)),
        ("search/groups", {**EXAMPLES["search/groups"], "with_lookup": "docs2"}, ("docs2",)),
        (
            "query",
            {
                **_QUERY,
                "prefetch": {"query": [0.1, 0.2, 0.3], "lookup_from": {"collection": "deep"}},
            },
            ("deep",),
        ),
        ("search", _SEARCH, ()),
    ],
    ids=["lookup_from", "batch", "with_lookup", "with_lookup-name", "prefetch", "none"],
)
@pytest.mark.parametrize("tenant_key", [TENANT_KEY, None], ids=["push-down", "no-push-down"])
def test_collections_named_in_the_body_are_reported(
    endpoint: str, request_body: Request, named: tuple[str, ...], tenant_key: str | None
) -> None:
    # Without push-down or over-fetch too: ownership is checked either way.
    rewrite = QdrantFormat().rewrite_request(
        encode(request_body),
        route(endpoint),
        tenant=TENANT,
        tenant_key=tenant_key,
        overfetch_factor=1.0,
        overfetch_cap=1000,
    )
    assert rewrite.collections == named
    if tenant_key is None:
        assert rewrite.body == encode(request_body)


@pytest.mark.parametrize("lookup", [{"vector": "dense"}, {"collection": ""}, 7, {"collection": 3}])
def test_a_lookup_without_a_collection_name_is_malformed(lookup: Any) -> None:
    with pytest.raises(MalformedRequest, match="lookup_from"):
        _rewrite("recommend", {**_RECOMMEND, "lookup_from": lookup})


@pytest.mark.parametrize(
    ("endpoint", "request_body"),
    [
        ("recommend", {**_RECOMMEND, "positive": [7]}),
        ("recommend", {**_RECOMMEND, "negative": [[0.1, 0.1, 0.1], UUID_A]}),
        ("discover", {**_DISCOVER, "target": 7}),
        ("discover", {**_DISCOVER, "context": [{"positive": UUID_A, "negative": [0.1, 0.1]}]}),
        ("query", {"query": 7, "limit": 3}),
        ("query", {"query": {"nearest": UUID_A}, "limit": 3}),
        ("query", {"query": {"recommend": {"positive": [1], "negative": []}}}),
        ("query", {"query": {"discover": {"target": 1, "context": []}}}),
        ("query", {"query": {"context": [{"positive": 1, "negative": 2}]}}),
        ("query", {**_QUERY, "prefetch": [{"prefetch": {"query": 9}}]}),
        ("recommend/batch", {"searches": [_RECOMMEND, {"positive": [2], "limit": 3}]}),
    ],
)
def test_a_point_id_as_an_example_is_refused_under_push_down(
    endpoint: str, request_body: Request
) -> None:
    # Qdrant looks the point up past the filter: its answer tells whether the id exists.
    with pytest.raises(UnfilterableRequest, match="point id"):
        _rewrite(endpoint, request_body)
    # Without push-down the request goes as it came (the response check still runs).
    assert _rewrite(endpoint, request_body, tenant_key=None)[1].body == encode(request_body)


@pytest.mark.parametrize(
    "query",
    [
        [0.1, 0.2, 0.3],
        [[0.1, 0.2], [0.3, 0.4]],
        {"indices": [1, 5], "values": [0.3, 0.7]},
        {"nearest": [0.1, 0.2, 0.3]},
        {"fusion": "rrf"},
        {"order_by": "created"},
    ],
    ids=["dense", "multi", "sparse", "nearest", "fusion", "order_by"],
)
def test_vectors_and_other_queries_are_not_point_ids(query: Any) -> None:
    rewritten, _ = _rewrite("query", {"query": query, "limit": 3})
    assert rewritten["query"] == query


@pytest.mark.parametrize("tenant_key", [TENANT_KEY, None], ids=["push-down", "no-push-down"])
def test_a_request_with_a_duplicate_key_is_malformed(tenant_key: str | None) -> None:
    # The gate reads the last "lookup_from"; a database reading the first would not.
    body = b'{"positive":[[0.1]],"limit":3,"lookup_from":{"collection":"finance"},'
    body += b'"lookup_from":{"collection":"docs"}}'
    with pytest.raises(MalformedRequest, match="same key twice"):
        QdrantFormat().rewrite_request(
            body,
            route("recommend"),
            tenant=TENANT,
            tenant_key=tenant_key,
            overfetch_factor=1.0,
            overfetch_cap=1000,
        )
