"""Qdrant gRPC requests: collections named, tenant push-down, point-id refusals, over-fetch.

Requests are built with qdrant-client's own message classes, as the unchanged
client sends them, and what the gate forwards is parsed with the same classes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest
from google.protobuf import descriptor_pool
from hypothesis import given
from hypothesis import strategies as st
from qdrant_client import grpc as q

from sidecar.core.hits import Route
from sidecar.formats.base import (
    MalformedRequest,
    RequestRewrite,
    UnfilterableRequest,
)
from sidecar.formats.grpc_frames import frame
from sidecar.formats.qdrant.grpc import QdrantGrpcFormat
from tests.fixtures.format_strategies import PROPERTIES
from tests.fixtures.qdrant_grpc_upstream import framed, route_path, unframed

FORMAT = QdrantGrpcFormat()
TENANT = "acme"
TENANT_KEY = "tenant"
CONDITION = q.Condition(field=q.FieldCondition(key=TENANT_KEY, match=q.Match(keyword=TENANT)))
APP_FILTER = q.Filter(
    must=[q.Condition(field=q.FieldCondition(key="lang", match=q.Match(keyword="en")))],
    must_not=[q.Condition(has_id=q.HasIdCondition(has_id=[q.PointId(num=3)]))],
)
VECTOR = q.VectorInput(dense=q.DenseVector(data=[0.1, 0.2]))
BY_ID = q.VectorInput(id=q.PointId(num=42))


def route(method: str) -> Route:
    return Route("POST", route_path(method))


def rewrite(
    method: str,
    request: Any,
    *,
    tenant_key: str | None = TENANT_KEY,
    tenant: str = TENANT,
    factor: float = 1.0,
    cap: int = 1000,
) -> RequestRewrite:
    return FORMAT.rewrite_request(
        framed(request),
        route(method),
        tenant=tenant,
        tenant_key=tenant_key,
        overfetch_factor=factor,
        overfetch_cap=cap,
    )


def forwarded(method: str, request: Any, **options: Any) -> Any:
    """The request as the gate forwards it, parsed with qdrant-client's class."""
    return unframed(type(request), rewrite(method, request, **options).body)


def confined(app_filter: Any | None) -> q.Filter:
    """``app_filter`` as push-down leaves it."""
    conditions = [CONDITION]
    if app_filter is not None:
        conditions.append(q.Condition(filter=app_filter))
    return q.Filter(must=conditions)


def test_it_is_a_request_rewriter_for_every_method_of_the_service() -> None:
    service = descriptor_pool.Default().FindServiceByName("qdrant.Points")
    assert all(FORMAT.rewrites_request(route(m.name)) for m in service.methods)
    assert not FORMAT.rewrites_request(route("NewMethod"))
    assert not FORMAT.rewrites_request(Route("GET", route_path("Query")))
    assert not FORMAT.rewrites_request(Route("POST", "/qdrant.Qdrant/HealthCheck"))
    # The Collections service is read for the collection a request names, where it names one.
    assert FORMAT.rewrites_request(Route("POST", "/qdrant.Collections/Get"))
    assert not FORMAT.rewrites_request(Route("POST", "/qdrant.Collections/List"))


# -- collections ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "request_", "names"),
    [
        ("Get", q.GetPoints(collection_name="docs", ids=[q.PointId(num=1)]), ("docs",)),
        ("Upsert", q.UpsertPoints(collection_name="docs"), ("docs",)),
        ("Count", q.CountPoints(collection_name="docs", filter=APP_FILTER), ("docs",)),
        ("Facet", q.FacetCounts(collection_name="docs", key="k"), ("docs",)),
        ("SearchMatrixPairs", q.SearchMatrixPoints(collection_name="docs"), ("docs",)),
        ("UpdateBatch", q.UpdateBatchPoints(collection_name="docs"), ("docs",)),
        (
            "Query",
            q.QueryPoints(
                collection_name="docs",
                query=q.Query(nearest=VECTOR),
                lookup_from=q.LookupLocation(collection_name="vectors"),
                prefetch=[
                    q.PrefetchQuery(
                        prefetch=[
                            q.PrefetchQuery(lookup_from=q.LookupLocation(collection_name="deep"))
                        ]
                    )
                ],
            ),
            ("docs", "vectors", "deep"),
        ),
        (
            "QueryGroups",
            q.QueryPointGroups(
                collection_name="docs",
                group_by="doc",
                with_lookup=q.WithLookup(collection="authors"),
            ),
            ("docs", "authors"),
        ),
        (
            "SearchGroups",
            q.SearchPointGroups(
                collection_name="docs", with_lookup=q.WithLookup(collection="authors")
            ),
            ("docs", "authors"),
        ),
        (
            "SearchBatch",
            q.SearchBatchPoints(
                collection_name="docs",
                search_points=[
                    q.SearchPoints(collection_name="docs", limit=1),
                    q.SearchPoints(collection_name="other", limit=1),
                    q.SearchPoints(limit=1),
                ],
            ),
            ("docs", "other"),
        ),
        (
            "RecommendBatch",
            q.RecommendBatchPoints(
                collection_name="docs",
                recommend_points=[
                    q.RecommendPoints(lookup_from=q.LookupLocation(collection_name="lk"))
                ],
            ),
            ("docs", "lk"),
        ),
        (
            "Discover",
            q.DiscoverPoints(
                collection_name="docs", lookup_from=q.LookupLocation(collection_name="lk")
            ),
            ("docs", "lk"),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_collections_the_request_names(method: str, request_: Any, names: tuple[str, ...]) -> None:
    for tenant_key in (None, TENANT_KEY):
        assert rewrite(method, request_, tenant_key=tenant_key).collections == names


def test_collections_are_read_before_anything_is_refused_or_rewritten() -> None:
    request = q.RecommendPoints(collection_name="docs", positive=[q.PointId(num=1)], limit=3)
    # No push-down: nothing refused, the body as it came, its collection named.
    rewritten = rewrite("Recommend", request, tenant_key=None)
    assert rewritten == RequestRewrite(framed(request), (), False, False, ("docs",))


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        ("Query", q.QueryPoints()),
        ("Get", q.GetPoints(ids=[q.PointId(num=1)])),
        ("Upsert", q.UpsertPoints()),
        ("Query", q.QueryPoints(collection_name="d", lookup_from=q.LookupLocation())),
        ("QueryGroups", q.QueryPointGroups(collection_name="d", with_lookup=q.WithLookup())),
    ],
)
def test_a_request_without_a_collection_where_one_belongs_is_malformed(
    method: str, request_: Any
) -> None:
    with pytest.raises(MalformedRequest):
        rewrite(method, request_, tenant_key=None)


@pytest.mark.parametrize(
    "body",
    [b"", b"\x00\x00\x00", frame(b"\xff\xff"), frame(b"") + frame(b""), b"\x01\x00\x00\x00\x00"],
)
def test_unreadable_bodies_are_malformed_requests(body: bytes) -> None:
    with pytest.raises(MalformedRequest) as refused:
        FORMAT.rewrite_request(
            body,
            route("Query"),
            tenant=TENANT,
            tenant_key=TENANT_KEY,
            overfetch_factor=1.0,
            overfetch_cap=10,
        )
    assert not isinstance(refused.value, UnfilterableRequest)


def test_other_routes_come_back_unchanged() -> None:
    rewritten = FORMAT.rewrite_request(
        b"anything",
        Route("POST", "/qdrant.Collections/List"),
        tenant=TENANT,
        tenant_key=TENANT_KEY,
        overfetch_factor=2.0,
        overfetch_cap=10,
    )
    assert rewritten == RequestRewrite(b"anything", (), False, False)


# -- push-down -------------------------------------------------------------------


@pytest.mark.parametrize("app_filter", [None, APP_FILTER], ids=["no-filter", "app-filter"])
@pytest.mark.parametrize(
    ("method", "request_"),
    [
        ("Search", q.SearchPoints(collection_name="d", vector=[0.1], limit=3)),
        ("SearchGroups", q.SearchPointGroups(collection_name="d", vector=[0.1], limit=3)),
        ("Scroll", q.ScrollPoints(collection_name="d", offset=q.PointId(num=7), limit=3)),
        ("Recommend", q.RecommendPoints(collection_name="d", positive_vectors=[q.Vector()])),
        ("RecommendGroups", q.RecommendPointGroups(collection_name="d", group_by="g")),
        ("Discover", q.DiscoverPoints(collection_name="d")),
        ("Query", q.QueryPoints(collection_name="d", query=q.Query(nearest=VECTOR))),
        ("QueryGroups", q.QueryPointGroups(collection_name="d", group_by="g")),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_push_down_ands_the_tenant_with_the_apps_filter(
    method: str, request_: Any, app_filter: Any | None
) -> None:
    if app_filter is not None:
        request_.filter.CopyFrom(app_filter)
    rewritten = rewrite(method, request_)
    assert rewritten.tenant_filter and not rewritten.overfetched
    out = unframed(type(request_), rewritten.body)
    assert out.filter == confined(app_filter)
    # Everything else reaches the database as the app sent it.
    out.ClearField("filter")
    request_.ClearField("filter")
    assert out == request_


@pytest.mark.parametrize(
    ("method", "field", "cls", "item"),
    [
        ("SearchBatch", "search_points", q.SearchBatchPoints, q.SearchPoints(limit=2)),
        ("RecommendBatch", "recommend_points", q.RecommendBatchPoints, q.RecommendPoints(limit=2)),
        ("DiscoverBatch", "discover_points", q.DiscoverBatchPoints, q.DiscoverPoints(limit=2)),
        (
            "QueryBatch",
            "query_points",
            q.QueryBatchPoints,
            q.QueryPoints(query=q.Query(nearest=VECTOR)),
        ),
    ],
)
def test_push_down_reaches_every_request_of_a_batch(
    method: str, field: str, cls: Any, item: Any
) -> None:
    second = type(item)()
    second.CopyFrom(item)
    second.filter.CopyFrom(APP_FILTER)
    request = cls(collection_name="d", **{field: [item, second]})
    out = forwarded(method, request)
    assert [sub.filter for sub in getattr(out, field)] == [confined(None), confined(APP_FILTER)]


def _prefetch_tree(depth: int, width: int) -> list[q.PrefetchQuery]:
    if depth == 0:
        return []
    return [
        q.PrefetchQuery(
            query=q.Query(nearest=VECTOR),
            filter=APP_FILTER if index % 2 else None,
            limit=5,
            prefetch=_prefetch_tree(depth - 1, width),
        )
        for index in range(width)
    ]


def _prefetches(holder: Any) -> Iterator[Any]:
    for prefetch in holder.prefetch:
        yield prefetch
        yield from _prefetches(prefetch)


@PROPERTIES
@given(depth=st.integers(0, 4), width=st.integers(1, 3), groups=st.booleans())
def test_property_push_down_reaches_every_prefetch_at_every_depth(
    depth: int, width: int, groups: bool
) -> None:
    method, cls = ("QueryGroups", q.QueryPointGroups) if groups else ("Query", q.QueryPoints)
    request = cls(
        collection_name="d",
        prefetch=_prefetch_tree(depth, width),
        query=q.Query(fusion=q.Fusion.RRF),
    )
    out = forwarded(method, request)
    before, after = list(_prefetches(request)), list(_prefetches(out))
    assert len(after) == len(before) == sum(width**d for d in range(1, depth + 1))
    for old, new in zip(before, after, strict=True):
        assert new.filter == confined(old.filter if old.HasField("filter") else None)
        assert new.limit == old.limit  # prefetch limits are never raised
    assert out.filter == confined(None)


@PROPERTIES
@given(tenant=st.text(), key=st.text(min_size=1))
def test_property_the_tenant_reaches_the_database_exactly(tenant: str, key: str) -> None:
    request = q.QueryPoints(collection_name="d", query=q.Query(nearest=VECTOR))
    out = forwarded("Query", request, tenant=tenant, tenant_key=key)
    assert out.filter == q.Filter(
        must=[q.Condition(field=q.FieldCondition(key=key, match=q.Match(keyword=tenant)))]
    )


def test_a_tenant_that_is_no_unicode_string_is_refused() -> None:
    request = q.QueryPoints(collection_name="d", query=q.Query(nearest=VECTOR))
    with pytest.raises(MalformedRequest):
        rewrite("Query", request, tenant="bad\udc80")


def test_get_and_other_methods_are_never_rewritten() -> None:
    for method, request in [
        ("Get", q.GetPoints(collection_name="d", ids=[q.PointId(num=1)])),
        ("Count", q.CountPoints(collection_name="d")),
        ("Facet", q.FacetCounts(collection_name="d", key="k", limit=3)),
        ("Delete", q.DeletePoints(collection_name="d")),
    ]:
        rewritten = rewrite(method, request, factor=3.0)
        assert rewritten == RequestRewrite(framed(request), (), False, False, ("d",))


# -- what push-down cannot confine -------------------------------------------------


def _pair(vector: Any) -> q.ContextInputPair:
    return q.ContextInputPair(positive=vector, negative=VECTOR)


POINT_EXAMPLES = [
    ("Recommend", q.RecommendPoints(collection_name="d", positive=[q.PointId(num=1)])),
    ("Recommend", q.RecommendPoints(collection_name="d", negative=[q.PointId(uuid="u")])),
    ("RecommendGroups", q.RecommendPointGroups(collection_name="d", positive=[q.PointId()])),
    (
        "RecommendBatch",
        q.RecommendBatchPoints(
            collection_name="d",
            recommend_points=[q.RecommendPoints(), q.RecommendPoints(positive=[q.PointId(num=1)])],
        ),
    ),
    (
        "Discover",
        q.DiscoverPoints(
            collection_name="d",
            target=q.TargetVector(single=q.VectorExample(id=q.PointId(num=1))),
        ),
    ),
    (
        "DiscoverBatch",
        q.DiscoverBatchPoints(
            collection_name="d",
            discover_points=[
                q.DiscoverPoints(
                    context=[
                        q.ContextExamplePair(
                            positive=q.VectorExample(vector=q.Vector()),
                            negative=q.VectorExample(id=q.PointId(num=1)),
                        )
                    ]
                )
            ],
        ),
    ),
    ("Query", q.QueryPoints(collection_name="d", query=q.Query(nearest=BY_ID))),
    (
        "Query",
        q.QueryPoints(
            collection_name="d",
            query=q.Query(recommend=q.RecommendInput(positive=[VECTOR], negative=[BY_ID])),
        ),
    ),
    (
        "Query",
        q.QueryPoints(
            collection_name="d",
            query=q.Query(discover=q.DiscoverInput(target=BY_ID)),
        ),
    ),
    (
        "Query",
        q.QueryPoints(
            collection_name="d",
            query=q.Query(
                discover=q.DiscoverInput(
                    target=VECTOR, context=q.ContextInput(pairs=[_pair(BY_ID)])
                )
            ),
        ),
    ),
    (
        "Query",
        q.QueryPoints(
            collection_name="d", query=q.Query(context=q.ContextInput(pairs=[_pair(BY_ID)]))
        ),
    ),
    (
        "Query",
        q.QueryPoints(
            collection_name="d",
            query=q.Query(nearest_with_mmr=q.NearestInputWithMmr(nearest=BY_ID, mmr=q.Mmr())),
        ),
    ),
    (
        "Query",
        q.QueryPoints(
            collection_name="d",
            query=q.Query(relevance_feedback=q.RelevanceFeedbackInput(target=BY_ID)),
        ),
    ),
    (
        "Query",
        q.QueryPoints(
            collection_name="d",
            query=q.Query(
                relevance_feedback=q.RelevanceFeedbackInput(
                    target=VECTOR, feedback=[q.FeedbackItem(example=BY_ID, score=1)]
                )
            ),
        ),
    ),
    (
        "Query",
        q.QueryPoints(
            collection_name="d",
            prefetch=[q.PrefetchQuery(prefetch=[q.PrefetchQuery(query=q.Query(nearest=BY_ID))])],
        ),
    ),
    ("QueryGroups", q.QueryPointGroups(collection_name="d", query=q.Query(nearest=BY_ID))),
    (
        "QueryBatch",
        q.QueryBatchPoints(
            collection_name="d",
            query_points=[q.QueryPoints(), q.QueryPoints(query=q.Query(nearest=BY_ID))],
        ),
    ),
]


@pytest.mark.parametrize(("method", "request_"), POINT_EXAMPLES)
def test_a_point_id_as_an_example_is_refused_with_push_down(method: str, request_: Any) -> None:
    with pytest.raises(UnfilterableRequest, match="point id"):
        rewrite(method, request_)
    # Without push-down the database answers it for the caller's own
    # collection, and the response is filtered as usual.
    assert rewrite(method, request_, tenant_key=None).body == framed(request_)


def test_scrolls_start_position_is_no_example() -> None:
    request = q.ScrollPoints(collection_name="d", offset=q.PointId(num=9))
    assert forwarded("Scroll", request).offset == q.PointId(num=9)


def _with_unknown(message: Any) -> None:
    """Give ``message`` a field its definition (Qdrant's, and the gate's copy) lacks."""
    message.MergeFromString(b"\xc0\x0c\x01")  # field 200, the varint 1


@pytest.mark.parametrize(
    "where",
    ["request", "query", "vector", "prefetch", "lookup", "pair", "batch entry"],
)
def test_a_field_the_gate_does_not_know_where_a_query_sits_is_refused(where: str) -> None:
    request = q.QueryBatchPoints(
        collection_name="d",
        query_points=[
            q.QueryPoints(
                query=q.Query(context=q.ContextInput(pairs=[_pair(VECTOR)])),
                prefetch=[q.PrefetchQuery(query=q.Query(nearest=VECTOR))],
                lookup_from=q.LookupLocation(collection_name="l"),
            )
        ],
    )
    entry = request.query_points[0]
    target = {
        "request": request,
        "query": entry.query,
        "vector": entry.prefetch[0].query.nearest,
        "prefetch": entry.prefetch[0],
        "lookup": entry.lookup_from,
        "pair": entry.query.context.pairs[0],
        "batch entry": entry,
    }[where]
    _with_unknown(target)
    with pytest.raises(UnfilterableRequest, match="does not know"):
        rewrite("QueryBatch", request)
    # Without push-down the request goes as it came.
    assert rewrite("QueryBatch", request, tenant_key=None).body == framed(request)


def test_unknown_fields_inside_an_apps_filter_or_settings_travel_untouched() -> None:
    request = q.QueryPoints(
        collection_name="d",
        query=q.Query(nearest=VECTOR),
        filter=APP_FILTER,
        params=q.SearchParams(hnsw_ef=64, exact=True),
        with_payload=q.WithPayloadSelector(include=q.PayloadIncludeSelector(fields=["a"])),
    )
    _with_unknown(request.filter.must[0].field)
    out = forwarded("Query", request)
    assert out.params == request.params
    assert out.with_payload == request.with_payload
    assert out.filter.must[1].filter.SerializeToString() == request.filter.SerializeToString()


def test_a_query_variant_set_twice_reaches_the_database_as_the_gate_read_it() -> None:
    # nearest (by vector) after a point-id nearest: Qdrant reads the last one.
    raw = q.Query(nearest=BY_ID).SerializeToString() + q.Query(nearest=VECTOR).SerializeToString()
    query = q.Query.FromString(raw)
    assert query.nearest == VECTOR
    request = q.QueryPoints(collection_name="d", query=query)
    assert forwarded("Query", request).query == q.Query(nearest=VECTOR)
    # The other order is an id lookup, and refused.
    raw = q.Query(nearest=VECTOR).SerializeToString() + q.Query(nearest=BY_ID).SerializeToString()
    with pytest.raises(UnfilterableRequest):
        rewrite("Query", q.QueryPoints(collection_name="d", query=q.Query.FromString(raw)))


# -- over-fetch ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "request_", "asked", "raised"),
    [
        ("Search", q.SearchPoints(collection_name="d", limit=10), 10, 20),
        ("SearchGroups", q.SearchPointGroups(collection_name="d", limit=4), 4, 8),
        ("Recommend", q.RecommendPoints(collection_name="d", limit=3), 3, 6),
        ("RecommendGroups", q.RecommendPointGroups(collection_name="d", limit=3), 3, 6),
        ("Discover", q.DiscoverPoints(collection_name="d", limit=5), 5, 10),
        ("Query", q.QueryPoints(collection_name="d", limit=5), 5, 10),
        ("Query", q.QueryPoints(collection_name="d"), 10, 20),  # Qdrant's default
        ("QueryGroups", q.QueryPointGroups(collection_name="d", limit=2), 2, 4),
        ("QueryGroups", q.QueryPointGroups(collection_name="d"), 10, 20),
        ("Query", q.QueryPoints(collection_name="d", limit=5, offset=0), 5, 10),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_overfetch_raises_the_limit_and_remembers_the_apps(
    method: str, request_: Any, asked: int, raised: int
) -> None:
    rewritten = rewrite(method, request_, tenant_key=None, factor=2.0)
    assert rewritten.limits == (asked,)
    assert rewritten.overfetched and not rewritten.tenant_filter
    assert unframed(type(request_), rewritten.body).limit == raised


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        ("Search", q.SearchPoints(collection_name="d", limit=10, offset=5)),
        ("Recommend", q.RecommendPoints(collection_name="d", limit=10, offset=1)),
        ("Discover", q.DiscoverPoints(collection_name="d", limit=10, offset=1)),
        ("Query", q.QueryPoints(collection_name="d", limit=10, offset=10)),
        ("Scroll", q.ScrollPoints(collection_name="d", limit=10)),
        ("Search", q.SearchPoints(collection_name="d", limit=0)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_no_overfetch_past_an_offset_for_scroll_or_nothing(method: str, request_: Any) -> None:
    rewritten = rewrite(method, request_, tenant_key=None, factor=2.0)
    assert rewritten == RequestRewrite(framed(request_), (), False, False, ("d",))
    # With push-down: confined, not over-fetched.
    rewritten = rewrite(method, request_, factor=2.0)
    assert rewritten.limits == () and rewritten.tenant_filter
    assert unframed(type(request_), rewritten.body).limit == request_.limit


def test_overfetch_of_a_batch_has_one_limit_per_request() -> None:
    request = q.QueryBatchPoints(
        collection_name="d",
        query_points=[
            q.QueryPoints(limit=3),
            q.QueryPoints(limit=3, offset=3),
            q.QueryPoints(),
        ],
    )
    rewritten = rewrite("QueryBatch", request, factor=1.5)
    assert rewritten.limits == (3, None, 10)
    assert [p.limit for p in unframed(q.QueryBatchPoints, rewritten.body).query_points] == [
        5,
        3,
        15,
    ]


def test_overfetch_is_capped_and_never_below_the_apps_limit() -> None:
    request = q.SearchPoints(collection_name="d", limit=10)
    assert rewrite("Search", request, tenant_key=None, factor=3.0, cap=15).limits == (10,)
    assert unframed(q.SearchPoints, rewrite("Search", request, factor=3.0, cap=15).body).limit == 15
    assert rewrite("Search", request, tenant_key=None, factor=3.0, cap=5).limits == ()
    groups = q.SearchPointGroups(collection_name="d", limit=2**32 - 2)
    out = forwarded("SearchGroups", groups, factor=2.0, cap=2**40)
    assert out.limit == 2**32 - 1  # a uint32 field


def test_a_factor_that_is_not_finite_is_a_configuration_error() -> None:
    with pytest.raises(ValueError):
        rewrite("Query", q.QueryPoints(collection_name="d"), factor=math.inf)


@PROPERTIES
@given(
    limit=st.integers(0, 10_000),
    factor=st.floats(min_value=0, max_value=20, allow_nan=False),
    cap=st.integers(0, 50_000),
)
def test_property_overfetch_arithmetic(limit: int, factor: float, cap: int) -> None:
    request = q.QueryPoints(collection_name="d", limit=limit)
    rewritten = rewrite("Query", request, tenant_key=None, factor=factor, cap=cap)
    sent = unframed(q.QueryPoints, rewritten.body).limit
    expected = min(cap, math.ceil(Fraction(repr(factor)) * limit)) if factor > 1 else limit
    if expected <= limit:
        assert rewritten.limits == () and sent == limit
    else:
        assert rewritten.limits == (limit,) and sent == expected
