"""Pinecone data-plane requests: tenant push-down into metadata filters, over-fetch, namespaces.

Request shapes follow the data-plane OpenAPI specs (pinecone-io/pinecone-api,
``QueryRequest``, ``QueryVector``, ``SearchRecordsRequest``). A rewritten body
is checked with the filter semantics the spec documents: ``$and`` holds
filter expressions that must all match, so ``_matches`` (a small evaluator
of the operators the tests use) shows the app's filter kept its meaning and
the tenant condition holds for every record that passes.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Route
from sidecar.formats.base import MalformedRequest, RequestRewrite, UnfilterableRequest
from sidecar.formats.pinecone.rest import PineconeFormat
from sidecar.formats.registry import FormatTable
from tests.fixtures.format_strategies import PROPERTIES

FMT = PineconeFormat()
QUERY = Route("POST", "/query")
SEARCH = Route("POST", "/records/namespaces/Docs-1/search")
CONDITION = {"tenant": {"$eq": "acme"}}


def rewrite(
    body: dict[str, Any],
    route: Route = QUERY,
    *,
    tenant: str = "acme",
    tenant_key: str | None = "tenant",
    factor: float = 1,
) -> RequestRewrite:
    return FMT.rewrite_request(
        orjson.dumps(body),
        route,
        tenant=tenant,
        tenant_key=tenant_key,
        overfetch_factor=factor,
        overfetch_cap=100,
    )


def rewritten(body: dict[str, Any], route: Route = QUERY, **kwargs: Any) -> Any:
    return orjson.loads(rewrite(body, route, **kwargs).body)


# -- push-down ------------------------------------------------------------------------


def test_query_filter_is_anded() -> None:
    app = {"genre": {"$in": ["drama", "comedy"]}, "year": {"$gte": 2020}}
    body = rewritten({"vector": [0.1], "topK": 3, "filter": app, "includeMetadata": True})
    assert body == {
        "vector": [0.1],
        "topK": 3,
        "filter": {"$and": [CONDITION, app]},
        "includeMetadata": True,
    }


@pytest.mark.parametrize(
    "body", [{"topK": 3}, {"topK": 3, "filter": None}, {"topK": 3, "filter": {}}]
)
def test_no_filter_is_the_condition_alone(body: dict[str, Any]) -> None:
    assert rewritten(body)["filter"] == CONDITION


def test_an_app_filter_on_the_tenant_field_only_narrows() -> None:
    app = {"$or": [{"tenant": {"$eq": "globex"}}, {"tenant": {"$ne": "x"}}]}
    assert rewritten({"topK": 1, "filter": app})["filter"] == {"$and": [CONDITION, app]}


def test_records_search_filter_is_anded() -> None:
    body = {"query": {"inputs": {"text": "q"}, "top_k": 4, "filter": {"a": 1}}, "fields": ["t"]}
    assert rewritten(body, SEARCH) == {
        "query": {"inputs": {"text": "q"}, "top_k": 4, "filter": {"$and": [CONDITION, {"a": 1}]}},
        "fields": ["t"],
    }
    assert rewritten({"query": {"top_k": 4}}, SEARCH)["query"]["filter"] == CONDITION


def test_every_legacy_query_is_filtered() -> None:
    body = {
        "topK": 2,
        "filter": {"a": 1},
        "queries": [{"values": [0.1], "filter": {"b": 2}}, {"values": [0.2]}],
    }
    out = rewritten(body)
    assert out["filter"] == {"$and": [CONDITION, {"a": 1}]}
    assert [query["filter"] for query in out["queries"]] == [
        {"$and": [CONDITION, {"b": 2}]},
        CONDITION,
    ]


def test_the_tenant_is_a_json_value_whatever_it_holds() -> None:
    tenant = '"}, {"$or": [{}]} \\ \n'
    assert rewritten({"topK": 1}, tenant=tenant, tenant_key="org")["filter"] == {
        "org": {"$eq": tenant}
    }


@pytest.mark.parametrize(
    ("body", "route", "where"),
    [
        ({"id": "rec-9", "topK": 3}, QUERY, "'id'"),
        ({"query": {"id": "rec-9", "top_k": 3}}, SEARCH, "'query.id'"),
    ],
)
def test_a_query_by_record_id_is_refused(body: dict[str, Any], route: Route, where: str) -> None:
    with pytest.raises(UnfilterableRequest) as raised:
        rewrite(body, route)
    assert raised.value.code == "request_not_filterable"
    assert where in str(raised.value)
    assert "rec-9" not in str(raised.value)
    # Without push-down the gate has nothing to say about it.
    assert rewrite(body, route, tenant_key=None, factor=2).tenant_filter is False


@pytest.mark.parametrize(
    ("body", "route"),
    [
        (b"not json", QUERY),
        (b"[]", QUERY),
        (b'{"filter": "tenant = acme"}', QUERY),
        (b'{"filter": [{"a": 1}]}', QUERY),
        (b'{"queries": {"filter": {}}}', QUERY),
        (b'{"queries": [5]}', QUERY),
        (b'{"queries": [{"filter": "x"}]}', QUERY),
        (b'{"namespace": 5}', QUERY),
        (b'{"queries": [{"namespace": ["a"]}]}', QUERY),
        (b'{"topK": "10"}', QUERY),
        (b'{"topK": -1}', QUERY),
        (b"{}", SEARCH),
        (b'{"query": "text"}', SEARCH),
        (b'{"query": {"filter": "x"}}', SEARCH),
        (b'{"query": {"top_k": 1.5}}', SEARCH),
    ],
)
def test_unreadable_requests(body: bytes, route: Route) -> None:
    with pytest.raises(MalformedRequest):
        FMT.rewrite_request(
            body, route, tenant="acme", tenant_key="tenant", overfetch_factor=2, overfetch_cap=100
        )


@pytest.mark.parametrize(
    "route",
    [
        Route("GET", "/query"),
        Route("POST", "/vectors/fetch_by_metadata"),
        Route("POST", "/describe_index_stats"),
        Route("POST", "/namespaces/ns/documents/search"),
        Route("POST", "/records/namespaces/ns/upsert"),
    ],
)
def test_other_routes_are_not_rewritten(route: Route) -> None:
    assert not FMT.rewrites_request(route)
    body = b'{"filter": {"tenant": "globex"}}'
    result = FMT.rewrite_request(
        body, route, tenant="acme", tenant_key="tenant", overfetch_factor=2, overfetch_cap=9
    )
    assert result == RequestRewrite(body, (), tenant_filter=False, overfetched=False)


def test_no_tenant_key_no_push_down() -> None:
    result = rewrite({"topK": 3, "filter": {"a": 1}}, tenant_key=None, factor=1)
    assert orjson.loads(result.body) == {"topK": 3, "filter": {"a": 1}}
    assert not result.tenant_filter


# -- over-fetch -----------------------------------------------------------------------


def test_top_k_is_raised_and_remembered() -> None:
    result = rewrite({"topK": 5, "vector": [0.1]}, factor=2)
    assert orjson.loads(result.body)["topK"] == 10
    assert result.limits == (5,)
    assert result.overfetched


def test_records_top_k_is_raised_in_the_query() -> None:
    result = rewrite({"query": {"top_k": 4, "inputs": {"text": "q"}}}, SEARCH, factor=1.5)
    assert orjson.loads(result.body)["query"]["top_k"] == 6
    assert result.limits == (4,)


@pytest.mark.parametrize(
    ("body", "route"),
    [
        ({"vector": [0.1]}, QUERY),
        ({"topK": 5, "queries": [{"values": [0.1]}]}, QUERY),
        ({"query": {"top_k": 4}, "rerank": {"model": "m", "top_n": 2}}, SEARCH),
        ({"query": {"inputs": {"text": "q"}}}, SEARCH),
    ],
)
def test_limit_is_left_alone(body: dict[str, Any], route: Route) -> None:
    result = rewrite(body, route, factor=3)
    out = orjson.loads(result.body)
    assert out.get("topK") == body.get("topK")
    assert out.get("query", {}).get("top_k") == body.get("query", {}).get("top_k")
    assert result.limits == ()


def test_over_fetch_is_capped() -> None:
    assert orjson.loads(rewrite({"topK": 80}, factor=2).body)["topK"] == 100


# -- namespaces -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "namespaces"),
    [
        ({"namespace": "hr"}, ("hr",)),
        ({}, ("__default__",)),
        ({"namespace": ""}, ("__default__",)),
        ({"namespace": None}, ("__default__",)),
        (
            {"namespace": "a", "queries": [{"namespace": "b"}, {}, {"namespace": "a"}]},
            ("a", "b"),
        ),
        ({"queries": [{"namespace": "b"}]}, ("__default__", "b")),
    ],
)
def test_the_namespaces_a_query_names(body: dict[str, Any], namespaces: tuple[str, ...]) -> None:
    assert rewrite(body).collections == namespaces
    assert rewrite(body, tenant_key=None, factor=2).collections == namespaces


def test_a_records_search_names_its_path_namespace_as_written() -> None:
    # The request policy sees it from the path, before the body is read.
    assert FormatTable([FMT]).collections(SEARCH) == ("Docs-1",)
    assert FMT.route_collections(Route("post", "/RECORDS/namespaces/Docs-1/search/")) == ["Docs-1"]
    assert FMT.rewrites_request(Route("post", "/RECORDS/namespaces/Docs-1/search/"))
    assert FMT.route_collections(QUERY) is None


@pytest.mark.parametrize("tenant_key", [None, "tenant"])
@pytest.mark.parametrize("factor", [1, 2])
def test_a_records_search_body_names_no_namespace(tenant_key: str | None, factor: float) -> None:
    # Its namespace is the path's; the body cannot name one, so nothing is read
    # from it for the request policy, with or without push-down.
    body = {"query": {"top_k": 5, "inputs": {"text": "q"}}}
    assert rewrite(body, SEARCH, tenant_key=tenant_key, factor=factor).collections == ()
    assert FMT.request_collections(orjson.dumps(body), SEARCH) == ()


# -- properties: the app's filter keeps its meaning, the tenant always holds ------------------


def _matches(record: dict[str, Any], expression: dict[str, Any]) -> bool:
    """Pinecone's documented filter semantics for ``$and``/``$or``/``$eq``/``$ne``/``$in``."""
    for key, condition in expression.items():
        if key == "$and":
            if not all(_matches(record, part) for part in condition):
                return False
        elif key == "$or":
            if not any(_matches(record, part) for part in condition):
                return False
        else:
            ((operator, value),) = condition.items()
            actual = record.get(key)
            if operator == "$eq" and actual != value:
                return False
            if operator == "$ne" and actual == value:
                return False
            if operator == "$in" and actual not in value:
                return False
    return True


_values = st.sampled_from(["acme", "globex", "x"])
_conditions = st.builds(
    lambda key, op, value: {key: {op: [value] if op == "$in" else value}},
    st.sampled_from(["tenant", "kind"]),
    st.sampled_from(["$eq", "$ne", "$in"]),
    _values,
)
_filters = st.recursive(
    _conditions,
    lambda inner: st.builds(
        lambda op, parts: {op: parts}, st.sampled_from(["$and", "$or"]), st.lists(inner, min_size=1)
    ),
    max_leaves=6,
)
_records = st.fixed_dictionaries({"tenant": _values, "kind": _values})


@PROPERTIES
@given(app=st.none() | _filters, records=st.lists(_records, max_size=6), tenant=_values)
def test_property_push_down_only_narrows(
    app: dict[str, Any] | None, records: list[dict[str, Any]], tenant: str
) -> None:
    pushed = rewritten({"topK": 1, "filter": app}, tenant=tenant)["filter"]
    for record in records:
        passes = _matches(record, pushed)
        assert passes == (record["tenant"] == tenant and (app is None or _matches(record, app)))
