"""Milvus gRPC requests: tenant push-down into filter expressions, over-fetch, collections.

Requests are built by pymilvus itself (``Prepare``, what ``MilvusClient``
sends) or with its message classes. The expression checks are the REST
twin's (tests/unit/test_milvus_request.py holds their grammar-based properties);
here the properties check that whatever the app sends, the expression that
reaches Milvus encloses the app's filter in the gate's parentheses behind the
tenant condition, in every place a request carries a filter.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymilvus import RRFRanker
from pymilvus.client.prepare import Prepare
from pymilvus.grpc_gen import common_pb2, milvus_pb2, schema_pb2

from sidecar.core.hits import Route
from sidecar.formats.base import MalformedRequest, RequestRewrite, UnfilterableRequest
from sidecar.formats.grpc_frames import frame, messages
from sidecar.formats.milvus.grpc import MilvusGrpcFormat
from sidecar.formats.milvus.grpc_request import IteratorEcho
from sidecar.formats.milvus.rest_request import string_literal
from tests.fixtures import milvus_grpc_bodies as mb
from tests.fixtures.format_strategies import PROPERTIES
from tests.fixtures.milvus_expressions import attempts, encloses, reference_tokens

FMT = MilvusGrpcFormat()
PARAMS = {"metric_type": "L2", "params": {"nprobe": 4}}
ROUTES = {"search": mb.SEARCH, "hybrid": mb.HYBRID_SEARCH, "query": mb.QUERY}
REPLIES = {
    "search": milvus_pb2.SearchRequest,
    "hybrid": milvus_pb2.HybridSearchRequest,
    "query": milvus_pb2.QueryRequest,
}


def search(expr: str | None = 'kind == "a"', limit: int = 5, **kwargs: Any) -> Any:
    return Prepare.search_requests_with_expr(
        "docs", "vec", PARAMS, limit, data=[[0.1, 0.2]], expr=expr, output_fields=["text"], **kwargs
    )


def hybrid(*exprs: str | None, limit: int = 3, **kwargs: Any) -> Any:
    return Prepare.hybrid_search_request_with_ranker(
        "docs", [search(e) for e in exprs], RRFRanker(), limit, output_fields=["text"], **kwargs
    )


def query(expr: str = "id in [1, 2]", **kwargs: Any) -> Any:
    return Prepare.query_request("docs", expr, ["text"], None, **kwargs)


def rewrite(
    request: Any,
    kind: str = "search",
    *,
    tenant: str = "acme",
    tenant_key: str | None = "tenant",
    factor: float = 1,
    cap: int = 100,
) -> RequestRewrite:
    return FMT.rewrite_request(
        frame(request.SerializeToString()),
        ROUTES[kind],
        tenant=tenant,
        tenant_key=tenant_key,
        overfetch_factor=factor,
        overfetch_cap=cap,
    )


def rewritten(request: Any, kind: str = "search", **kwargs: Any) -> Any:
    (message,) = messages(rewrite(request, kind, **kwargs).body)
    return REPLIES[kind].FromString(message)


def refused(request: Any, kind: str = "search", **kwargs: Any) -> str:
    with pytest.raises(UnfilterableRequest) as raised:
        rewrite(request, kind, **kwargs)
    assert raised.value.code == "request_not_filterable"
    return str(raised.value)


def params(pairs: Any) -> dict[str, str]:
    return {pair.key: pair.value for pair in pairs}


# -- push-down -------------------------------------------------------------------------


def test_search_filter_is_anded_and_parenthesised() -> None:
    out = rewritten(search())
    assert out.dsl == 'tenant == "acme" and (kind == "a")'
    assert out.dsl_type == common_pb2.BoolExprV1
    # Everything else reaches Milvus as the client sent it.
    original = search()
    original.dsl = out.dsl
    assert out == original


@pytest.mark.parametrize("expr", [None, "", "  \n"])
def test_no_filter_is_the_condition_alone(expr: str | None) -> None:
    assert rewritten(search(expr)).dsl == 'tenant == "acme"'


def test_a_search_in_another_dsl_type_gets_a_boolean_expression() -> None:
    request = search("")
    request.dsl_type = common_pb2.Dsl
    out = rewritten(request)
    assert (out.dsl, out.dsl_type) == ('tenant == "acme"', common_pb2.BoolExprV1)


def test_every_sub_search_of_a_hybrid_search_is_filtered() -> None:
    out = rewritten(hybrid("a > 1", None), "hybrid")
    assert [r.dsl for r in out.requests] == ['tenant == "acme" and (a > 1)', 'tenant == "acme"']


def test_sub_requests_of_a_search_are_filtered() -> None:
    request = search("x == 1")
    request.sub_reqs.add(dsl="y == 2")
    request.sub_reqs.add()
    out = rewritten(request)
    assert [s.dsl for s in out.sub_reqs] == ['tenant == "acme" and (y == 2)', 'tenant == "acme"']
    assert {s.dsl_type for s in out.sub_reqs} == {common_pb2.BoolExprV1}


def test_query_and_get_are_filtered() -> None:
    out = rewritten(query("pk in [1, 2]"), "query")
    assert out.expr == 'tenant == "acme" and (pk in [1, 2])'
    result = rewrite(query(), "query")
    assert result.tenant_filter


def test_the_tenant_is_quoted() -> None:
    out = rewritten(query(), "query", tenant='a" or "1" == "1')
    assert out.expr.startswith('tenant == "a\\" or \\"1\\" == \\"1" and (')


def test_tenants_the_gate_does_not_quote_are_refused() -> None:
    assert refused(search(), tenant="a\nb") == (
        "the tenant id holds a character a Milvus filter cannot quote"
    )


@pytest.mark.parametrize("name", ["", "and", "a-b", "1x", "tenant id", "TRUE"])
def test_a_tenant_key_that_is_no_field_name_is_a_configuration_error(name: str) -> None:
    with pytest.raises(ValueError, match="tenant_key"):
        rewrite(search(), tenant_key=name)


@pytest.mark.parametrize(
    ("request_", "kind", "where"),
    [
        (search("x) or (true"), "search", "'dsl'"),
        (hybrid("a", "b) or (c"), "hybrid", "'requests[1].dsl'"),
        (query("pk > 0) or (pk < 0"), "query", "'expr'"),
    ],
)
def test_filters_that_could_escape_the_parentheses_are_refused(
    request_: Any, kind: str, where: str
) -> None:
    assert refused(request_, kind) == f"{where}: a ')' closes a parenthesis it did not open"


def test_a_search_by_primary_key_is_refused() -> None:
    by_ids = Prepare.search_requests_with_expr("docs", "vec", PARAMS, 5, ids=[1, 2])
    assert "primary key" in refused(by_ids)
    flagged = search()
    flagged.search_by_primary_keys = True
    assert "primary key" in refused(flagged)
    nested = hybrid("a")
    nested.requests[0].ids.int_id.data.append(3)
    assert refused(nested, "hybrid").startswith("requests[0].ids")


def _with_unknown_field(request: Any) -> bytes:
    return frame(request.SerializeToString() + b"\xd0\x0f\x01")  # field 250, varint 1


@pytest.mark.parametrize("kind", ["search", "hybrid", "query"])
def test_a_request_with_a_field_the_gate_does_not_know_is_refused(kind: str) -> None:
    request = {"search": search(), "hybrid": hybrid("a"), "query": query()}[kind]
    with pytest.raises(UnfilterableRequest, match="does not know"):
        FMT.rewrite_request(
            _with_unknown_field(request),
            ROUTES[kind],
            tenant="acme",
            tenant_key="tenant",
            overfetch_factor=1,
            overfetch_cap=100,
        )
    # Without push-down it passes, but is not over-fetched.
    result = FMT.rewrite_request(
        _with_unknown_field(request),
        ROUTES[kind],
        tenant="acme",
        tenant_key=None,
        overfetch_factor=2,
        overfetch_cap=100,
    )
    assert result.body == _with_unknown_field(request)
    assert not result.overfetched


@pytest.mark.parametrize(
    "body",
    [b"", b"not grpc", frame(b"\xff\xff"), frame(b"") + frame(b"")],
)
def test_unreadable_requests(body: bytes) -> None:
    with pytest.raises(MalformedRequest):
        FMT.rewrite_request(
            body, mb.SEARCH, tenant="acme", tenant_key="tenant", overfetch_factor=1, overfetch_cap=9
        )


@pytest.mark.parametrize(
    "other",
    [
        Route("POST", "/milvus.proto.milvus.MilvusService/Insert"),
        Route("POST", "/milvus.proto.milvus.MilvusService/DescribeCollection"),
        Route("GET", "/milvus.proto.milvus.MilvusService/Search"),
        Route("POST", "/v2/vectordb/entities/search"),
    ],
)
def test_other_routes_are_not_rewritten(other: Route) -> None:
    assert not FMT.rewrites_request(other)
    result = FMT.rewrite_request(
        b"anything", other, tenant="acme", tenant_key="tenant", overfetch_factor=2, overfetch_cap=9
    )
    assert result == RequestRewrite(b"anything", (), False, False)


def test_filtered_methods_are_rewritten() -> None:
    assert all(FMT.rewrites_request(route) for route in ROUTES.values())


def test_no_tenant_key_no_push_down_and_the_body_unchanged() -> None:
    body = frame(search("x) or (true").SerializeToString())
    result = FMT.rewrite_request(
        body, mb.SEARCH, tenant="acme", tenant_key=None, overfetch_factor=1, overfetch_cap=9
    )
    assert result == RequestRewrite(body, (), False, False, ("docs",))


# -- collections -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("db", "expected"), [("", ("docs",)), ("default", ("docs",)), ("hr", ("hr.docs",))]
)
def test_the_collection_the_body_names(db: str, expected: tuple[str, ...]) -> None:
    request = query()
    request.db_name = db
    assert rewrite(request, "query").collections == expected


def test_a_hybrid_searchs_sub_searches_name_their_collections() -> None:
    request = hybrid("a", "b")
    request.requests[1].collection_name = "other"
    assert rewrite(request, "hybrid").collections == ("docs", "other")


# -- over-fetch ------------------------------------------------------------------------


def test_search_topk_is_raised_and_remembered() -> None:
    result = rewrite(search(limit=5), factor=1.5)
    (message,) = messages(result.body)
    assert params(milvus_pb2.SearchRequest.FromString(message).search_params)["topk"] == "8"
    assert (result.limits, result.overfetched) == ((5,), True)


def test_hybrid_limit_is_raised_and_sub_search_limits_stay() -> None:
    result = rewrite(hybrid("a", "b", limit=3), "hybrid", factor=2)
    (message,) = messages(result.body)
    out = milvus_pb2.HybridSearchRequest.FromString(message)
    assert params(out.rank_params)["limit"] == "6"
    assert [params(r.search_params)["topk"] for r in out.requests] == ["5", "5"]
    assert result.limits == (3,)


def test_query_limit_is_raised() -> None:
    result = rewrite(query(limit=4), "query", factor=2)
    (message,) = messages(result.body)
    assert params(milvus_pb2.QueryRequest.FromString(message).query_params)["limit"] == "8"
    assert result.limits == (4,)


def test_over_fetch_is_capped_by_milvus_largest_topk() -> None:
    result = rewrite(search(limit=10000), factor=2, cap=10**6)
    (message,) = messages(result.body)
    assert params(milvus_pb2.SearchRequest.FromString(message).search_params)["topk"] == "16384"


def _search_with(**search_params: str) -> Any:
    request = search()
    for key, value in search_params.items():
        request.search_params.add(key=key, value=value)
    return request


def _topk(value: str) -> Any:
    request = search()
    for pair in request.search_params:
        if pair.key == "topk":
            pair.value = value
    return request


@pytest.mark.parametrize(
    ("request_", "kind"),
    [
        (_search_with(offset="2"), "search"),
        (_search_with(group_by_field="doc"), "search"),
        (_search_with(iterator="False"), "search"),
        (_search_with(search_iter_v2="True"), "search"),
        (_search_with(topk="7"), "search"),
        (_topk("0x10"), "search"),
        (_topk("010"), "search"),
        (_topk("-1"), "search"),
        (search(search_aggregation=None, group_by_field="g"), "search"),
        (query(), "query"),
        (query(limit=3, offset=2), "query"),
        (query(limit=3, iterator="False"), "query"),
        (Prepare.query_request("docs", "", ["count(*)"], None, limit=3), "query"),
        (hybrid("a", limit=3, offset=1), "hybrid"),
        (hybrid("a", limit=3, group_by_field="g"), "hybrid"),
    ],
)
def test_limit_is_left_alone(request_: Any, kind: str) -> None:
    result = rewrite(request_, kind, tenant_key=None, factor=2)
    assert not result.overfetched
    assert result.limits == ()
    assert result.body == frame(request_.SerializeToString())


def test_no_over_fetch_with_function_scores_sub_requests_or_aggregation() -> None:
    scored = search()
    scored.function_score.functions.add(name="decay")
    nested = search()
    nested.sub_reqs.add(dsl="")
    aggregated = search()
    aggregated.search_aggregation.fields.append("doc")
    for request in (scored, nested, aggregated):
        assert not rewrite(request, tenant_key=None, factor=2).overfetched


def test_over_fetch_with_push_down() -> None:
    result = rewrite(search(limit=2), factor=3)
    (message,) = messages(result.body)
    out = milvus_pb2.SearchRequest.FromString(message)
    assert out.dsl.startswith('tenant == "acme"')
    assert params(out.search_params)["topk"] == "6"
    assert (result.tenant_filter, result.limits) == (True, (2,))


def test_a_factor_that_is_not_finite_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="finite"):
        rewrite(search(), factor=float("inf"))


# -- properties ------------------------------------------------------------------------


def _placed(kind: str, app_filter: str) -> Any:
    if kind == "search":
        return search(app_filter)
    if kind == "hybrid":
        return hybrid("a == 1", app_filter)
    return query(app_filter)


def _filters(out: Any, kind: str) -> list[str]:
    if kind == "search":
        return [out.dsl]
    if kind == "hybrid":
        return [r.dsl for r in out.requests]
    return [out.expr]


@PROPERTIES
@given(
    app_filter=attempts,
    tenant=st.text(max_size=12),
    kind=st.sampled_from(["search", "hybrid", "query"]),
)
def test_property_every_forwarded_filter_encloses_the_app_filter(
    app_filter: str, tenant: str, kind: str
) -> None:
    try:
        out = rewritten(_placed(kind, app_filter), kind, tenant=tenant)
    except UnfilterableRequest:
        return
    literal = string_literal(tenant)
    prefix = f"tenant == {literal}"
    assert json.loads(literal) == tenant
    for expression in _filters(out, kind):
        assert expression.startswith(prefix)
        tokens = reference_tokens(expression)
        assert tokens is not None
        assert tokens[0] == ("literal", len("tenant == "), len(prefix))
        if expression != prefix:
            assert encloses(expression, len(prefix) + len(" and "))


@PROPERTIES
@given(
    topk=st.integers(0, 20000),
    factor=st.sampled_from([1, 1.1, 1.5, 2, 3.7]),
    cap=st.integers(1, 30000),
)
def test_property_over_fetch_never_asks_for_fewer(topk: int, factor: float, cap: int) -> None:
    result = rewrite(search(limit=topk), tenant_key=None, factor=factor, cap=cap)
    (message,) = messages(result.body)
    sent = int(params(milvus_pb2.SearchRequest.FromString(message).search_params)["topk"])
    assert sent >= topk
    if result.overfetched:
        assert result.limits == (topk,)
        assert sent <= min(cap, 16384)
    else:
        assert sent == topk


def test_a_rich_request_reaches_milvus_whole() -> None:
    # The gate re-encodes a request from its own copy of the proto: nothing is lost.
    request = search(expr_params={"v": [1, 2]}, group_by_field="g", namespace="ns")
    request.function_score.functions.add(name="f", params=[common_pb2.KeyValuePair(key="k")])
    request.highlighter.type = common_pb2.Semantic
    request.function_chains.add(name="chain", stage=schema_pb2.FunctionChainStageL2Rerank)
    request.base.msg_type = common_pb2.Search
    request.base.properties["p"] = "q"
    out = rewritten(request)
    request.dsl = out.dsl
    assert out == request


# -- what a search iterator's answer repeats -----------------------------------------


def test_a_search_iterators_token_and_bound_are_read_for_its_answer() -> None:
    later = search(search_iter_v2=True, search_iter_id="tok", search_iter_last_bound=0.25)
    assert rewrite(later).echo == IteratorEcho("tok", 0.25)
    # Without push-down or over-fetch the body goes unchanged, the echo with it.
    assert rewrite(later, tenant_key=None).echo == IteratorEcho("tok", 0.25)
    assert rewrite(search(search_iter_v2=True)).echo == IteratorEcho(None, None)


@pytest.mark.parametrize("request_", [search(), query(), hybrid('kind == "a"')])
def test_other_requests_echo_nothing(request_: Any) -> None:
    kind = {
        milvus_pb2.SearchRequest: "search",
        milvus_pb2.QueryRequest: "query",
        milvus_pb2.HybridSearchRequest: "hybrid",
    }[type(request_)]
    assert rewrite(request_, kind).echo is None
