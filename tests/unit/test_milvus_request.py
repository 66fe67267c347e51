"""Milvus REST v2 requests: tenant push-down into filter expressions, over-fetch, collections.

The properties check the rewriter against a second reading of the filter
lexer (``tests/fixtures/milvus_expressions.py``): an expression the
gate forwards always has the gate's parentheses around the whole app
filter, and the tenant's literal always decodes to the tenant.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Route
from sidecar.formats.base import MalformedRequest, RequestRewrite, UnfilterableRequest
from sidecar.formats.milvus.rest import MilvusFormat
from sidecar.formats.milvus.rest_request import expression_problem, string_literal, tenant_field
from tests.fixtures.format_strategies import PROPERTIES
from tests.fixtures.milvus_expressions import (
    attempts,
    balanced,
    encloses,
    reference_tokens,
)

FMT = MilvusFormat()


def route(action: str) -> Route:
    return Route("POST", f"/v2/vectordb/entities/{action}")


def rewrite(
    body: dict[str, Any],
    action: str = "search",
    *,
    tenant: str = "acme",
    tenant_key: str | None = "tenant",
    factor: float = 1,
) -> RequestRewrite:
    return FMT.rewrite_request(
        orjson.dumps(body),
        route(action),
        tenant=tenant,
        tenant_key=tenant_key,
        overfetch_factor=factor,
        overfetch_cap=100,
    )


def rewritten(body: dict[str, Any], action: str = "search", **kwargs: Any) -> Any:
    return orjson.loads(rewrite(body, action, **kwargs).body)


def refused(body: dict[str, Any], action: str = "search", **kwargs: Any) -> str:
    with pytest.raises(UnfilterableRequest) as raised:
        rewrite(body, action, **kwargs)
    assert raised.value.code == "request_not_filterable"
    return str(raised.value)


_PROBLEM = (
    r"'filter': (a string literal is not closed( on its line)?|a backslash outside a string"
    r" literal|a '\)' closes a parenthesis it did not open|a '\(' is not closed)"
)

_TENANT_PROBLEM = "the tenant id holds a character a Milvus filter cannot quote"


# -- push-down ------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["search", "query"])
def test_filter_is_anded_and_parenthesised(action: str) -> None:
    body = rewritten({"collectionName": "c", "filter": "a > 1 or b < 2"}, action)
    assert body["filter"] == 'tenant == "acme" and (a > 1 or b < 2)'


@pytest.mark.parametrize("app_filter", [None, "", "   \n\t"])
def test_no_filter_is_the_condition_alone(app_filter: str | None) -> None:
    body = {"collectionName": "c"} | ({} if app_filter is None else {"filter": app_filter})
    assert rewritten(body)["filter"] == 'tenant == "acme"'
    assert rewritten({"collectionName": "c", "filter": None})["filter"] == 'tenant == "acme"'


@pytest.mark.parametrize("action", ["hybrid_search", "advanced_search"])
def test_every_sub_search_is_filtered(action: str) -> None:
    body = {
        "collectionName": "c",
        "search": [{"data": [[0.1]], "filter": "x in [1, 2]"}, {"data": [[0.2]]}],
        "limit": 3,
    }
    searches = rewritten(body, action)["search"]
    assert [search["filter"] for search in searches] == [
        'tenant == "acme" and (x in [1, 2])',
        'tenant == "acme"',
    ]
    assert [search["data"] for search in searches] == [[[0.1]], [[0.2]]]


def test_the_rest_of_the_body_is_left_as_it_is() -> None:
    body = {
        "collectionName": "c",
        "data": [[0.1, 0.2]],
        "annsField": "v",
        "filter": "a == 1",
        "outputFields": ["text"],
        "exprParams": {"x": 1},
    }
    assert rewritten(body) == {**body, "filter": 'tenant == "acme" and (a == 1)'}


def test_get_takes_no_filter_and_says_so() -> None:
    body = {"collectionName": "c", "id": [1, 2], "outputFields": ["text"]}
    result = rewrite(body, "get")
    assert orjson.loads(result.body) == body
    assert result.tenant_filter is False
    assert result.collections == ("c",)


def test_the_tenant_key_names_the_field() -> None:
    assert rewritten({"filter": "a"}, tenant_key="org_id")["filter"] == 'org_id == "acme" and (a)'


def test_no_tenant_key_no_push_down() -> None:
    result = rewrite({"collectionName": "c", "filter": "a", "ids": [1]}, tenant_key=None)
    assert orjson.loads(result.body) == {"collectionName": "c", "filter": "a", "ids": [1]}
    assert result.tenant_filter is False


@pytest.mark.parametrize(
    ("tenant", "literal"),
    [
        ("acme", '"acme"'),
        ('a"b', '"a\\"b"'),
        ("a\\b", '"a\\\\b"'),
        ('\\"', '"\\\\\\""'),
        ("a'b", '"a\'b"'),
        ("a) or (true", '"a) or (true"'),
        ("ünï €", '"ünï €"'),
        ("", '""'),
    ],
)
def test_tenant_literal(tenant: str, literal: str) -> None:
    assert string_literal(tenant) == literal
    assert rewritten({}, tenant=tenant)["filter"] == f"tenant == {literal}"


@pytest.mark.parametrize("tenant", ["a\nb", "a\rb", "a\x00b", "a\x7fb", "a\x85b", "a\ud800b"])
def test_tenants_the_gate_does_not_quote_are_refused(tenant: str) -> None:
    with pytest.raises(UnfilterableRequest) as raised:
        string_literal(tenant)
    assert tenant not in str(raised.value)


@pytest.mark.parametrize(
    "name", ["", "1tenant", "tenant-id", "a.b", 'a["b"]', "and", "OR", "Like", "true", "in", " t"]
)
def test_a_tenant_key_that_is_no_field_name_is_a_configuration_error(name: str) -> None:
    with pytest.raises(ValueError, match="tenant_key"):
        tenant_field(name)
    with pytest.raises(ValueError, match="tenant_key"):
        rewrite({"filter": "a"}, tenant_key=name)


@pytest.mark.parametrize("name", ["tenant", "_t", "tenant_id2", "andx", "T"])
def test_field_names(name: str) -> None:
    assert tenant_field(name) == name


@pytest.mark.parametrize(
    "app_filter",
    [
        "x) or (true",
        "x) or true or (x",
        ")",
        "(",
        "a) (",
        "(a))",
        '"unterminated',
        "'unterminated",
        'a == "x\\',
        "a == 'x\\'",
        'a == "x\ny"',
        'a == "x\\\ny"',
        'a == "x\ry"',
        "a \\ b",
        '\\"x") or (true or ("',
        'r"\\") or (true',
    ],
)
def test_filters_that_could_escape_the_parentheses_are_refused(app_filter: str) -> None:
    # The message names the field and the problem, never the filter.
    assert re.fullmatch(_PROBLEM, refused({"filter": app_filter}))


@pytest.mark.parametrize(
    "app_filter",
    [
        'name == ")"',
        "name == ')'",
        'name == "(\\")"',
        "name == 'it\\'s ('",
        'r"\\)" == name',
        'meta["a)b"] == 1',
        "((a > 1) and (b < 2)) or c",
        'name like "x%"',
        'array_contains(tags, "a(b")',
    ],
)
def test_filters_with_parentheses_in_literals_are_wrapped(app_filter: str) -> None:
    assert rewritten({"filter": app_filter})["filter"] == f'tenant == "acme" and ({app_filter})'


def test_a_refused_sub_search_is_named() -> None:
    body = {"search": [{"filter": "a"}, {"filter": "a) or (true"}]}
    assert "'search[1].filter'" in refused(body, "hybrid_search")


@pytest.mark.parametrize(
    ("body", "action"),
    [
        ({"filter": "a", "Filter": "true"}, "search"),
        ({"FILTER": "true"}, "query"),
        # Go folds the long s to an s, as Python's casefold does.
        ({"filter": "a", "\u017fearch": []}, "search"),
        ({"search": [], "Search": [{"filter": "true"}]}, "hybrid_search"),
        ({"Limit": 5}, "search"),
        ({"collectionname": "other"}, "get"),
        ({"DBName": "other"}, "query"),
    ],
)
def test_keys_that_differ_only_in_case_are_refused(body: dict[str, Any], action: str) -> None:
    assert "only in case" in refused(body, action)


def test_keys_of_a_sub_search_that_differ_only_in_case_are_refused() -> None:
    assert "only in case" in refused(
        {"search": [{"filter": "a", "FILTER": "true"}]}, "hybrid_search"
    )


@pytest.mark.parametrize(
    ("body", "action", "where"),
    [
        ({"ids": [1, 2]}, "search", "'ids'"),
        ({"search": [{"data": [[1.0]]}, {"ids": ["a"]}]}, "hybrid_search", "'search[1].ids'"),
    ],
)
def test_a_search_by_primary_key_is_refused(body: dict[str, Any], action: str, where: str) -> None:
    assert where in refused(body, action)


@pytest.mark.parametrize(
    ("body", "action"),
    [
        (b"not json", "search"),
        (b"[]", "search"),
        (b'{"filter": 5}', "search"),
        (b'{"filter": ["a"]}', "query"),
        (b'{"search": {"filter": "a"}}', "hybrid_search"),
        (b'{"search": ["a"]}', "hybrid_search"),
        (b'{"search": [{"filter": 1}]}', "hybrid_search"),
        (b'{"collectionName": 5}', "search"),
        (b'{"collectionName": "c", "dbName": ["d"]}', "get"),
        (b'{"limit": "5"}', "search"),
        (b'{"limit": -1}', "query"),
    ],
)
def test_unreadable_requests(body: bytes, action: str) -> None:
    with pytest.raises(MalformedRequest):
        FMT.rewrite_request(
            body,
            route(action),
            tenant="acme",
            tenant_key="tenant",
            overfetch_factor=2,
            overfetch_cap=100,
        )


@pytest.mark.parametrize(
    "bad_route",
    [
        Route("POST", "/v2/vectordb/entities/insert"),
        Route("GET", "/v2/vectordb/entities/search"),
        Route("POST", "/v2/vectordb/collections/list"),
        Route("POST", "/v1/vector/search"),
    ],
)
def test_other_routes_are_not_rewritten(bad_route: Route) -> None:
    assert not FMT.rewrites_request(bad_route)
    body = b'{"filter": "x) or (true"}'
    result = FMT.rewrite_request(
        body, bad_route, tenant="acme", tenant_key="tenant", overfetch_factor=2, overfetch_cap=9
    )
    assert result == RequestRewrite(body, (), tenant_filter=False, overfetched=False)


@pytest.mark.parametrize("action", ["search", "hybrid_search", "advanced_search", "query", "get"])
def test_filtered_routes_are_rewritten(action: str) -> None:
    assert FMT.rewrites_request(route(action))
    assert FMT.rewrites_request(Route("post", f"/V2/vectordb/entities/{action}/"))


# -- collections ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "collections"),
    [
        ({"collectionName": "docs"}, ("docs",)),
        ({"collectionName": "docs", "dbName": "default"}, ("docs",)),
        ({"collectionName": "docs", "dbName": ""}, ("docs",)),
        ({"collectionName": "docs", "dbName": "hr"}, ("hr.docs",)),
        ({}, ()),
    ],
)
def test_the_collection_the_body_names(body: dict[str, Any], collections: tuple[str, ...]) -> None:
    for action in ("search", "query", "get"):
        assert rewrite(body, action).collections == collections
    assert rewrite({**body, "search": []}, "hybrid_search").collections == collections
    assert rewrite(body, tenant_key=None, factor=2).collections == collections


# -- over-fetch -----------------------------------------------------------------------


@pytest.mark.parametrize("action", ["search", "query", "hybrid_search"])
def test_limit_is_raised_and_remembered(action: str) -> None:
    body = {"collectionName": "c", "limit": 5}
    if action == "hybrid_search":
        body["search"] = [{"data": [[0.1]], "limit": 7}]
    result = rewrite(body, action, factor=1.5)
    document = orjson.loads(result.body)
    assert document["limit"] == 8
    assert result.limits == (5,)
    assert result.overfetched
    if action == "hybrid_search":
        # The fused candidates stay those the app asked for.
        assert document["search"][0]["limit"] == 7


@pytest.mark.parametrize(
    ("body", "action"),
    [
        ({}, "search"),
        ({"limit": 0}, "query"),
        ({"limit": 5, "offset": 5}, "search"),
        ({"limit": 5, "offset": 5}, "query"),
        ({"limit": 5, "groupingField": "doc"}, "search"),
        ({"limit": 5, "groupingField": "doc", "search": []}, "hybrid_search"),
        ({"limit": 5, "functionScore": {"functions": [{"name": "decay"}]}}, "search"),
        ({"limit": 5, "functionChains": [{"x": 1}]}, "search"),
        ({"limit": 5, "searchAggregation": {"field": "x"}}, "search"),
        ({"limit": 5, "searchParams": {"offset": 2}}, "search"),
        ({"limit": 5, "searchParams": {"group_by_field": "doc"}}, "search"),
        ({"id": [1]}, "get"),
    ],
)
def test_limit_is_left_alone(body: dict[str, Any], action: str) -> None:
    if action == "hybrid_search":
        body = {"search": [], **body}
    result = rewrite(body, action, factor=3)
    assert orjson.loads(result.body).get("limit") == body.get("limit")
    assert result.limits == ()
    assert not result.overfetched


def test_offset_zero_and_empty_options_still_over_fetch() -> None:
    body = {"limit": 4, "offset": 0, "groupingField": "", "functionScore": {}, "searchParams": {}}
    assert rewrite(body, factor=2).limits == (4,)


def test_over_fetch_without_push_down_reads_no_filter() -> None:
    result = rewrite({"limit": 2, "filter": "x) or (true", "ids": [1]}, tenant_key=None, factor=2)
    assert orjson.loads(result.body) == {"limit": 4, "filter": "x) or (true", "ids": [1]}
    assert result.limits == (2,)


# -- properties: nothing the app or the tenant sends widens the filter ------------------------


@PROPERTIES
@given(app_filter=attempts, tenant=st.text(max_size=12))
def test_property_a_forwarded_filter_encloses_the_app_filter(app_filter: str, tenant: str) -> None:
    try:
        result = rewritten({"filter": app_filter}, tenant=tenant)
    except UnfilterableRequest as exc:
        assert re.fullmatch(_PROBLEM, str(exc)) or str(exc) == _TENANT_PROBLEM
        return
    expression = result["filter"]
    literal = string_literal(tenant)
    prefix = f"tenant == {literal}"
    assert expression.startswith(prefix)
    assert json.loads(literal) == tenant
    tokens = reference_tokens(expression)
    assert tokens is not None
    assert tokens[0] == ("literal", len("tenant == "), len(prefix))
    if app_filter.strip():
        assert expression == f"{prefix} and ({app_filter})"
        assert encloses(expression, len(prefix) + len(" and "))
    else:
        assert expression == prefix


@PROPERTIES
@given(app_filter=attempts)
def test_property_the_check_agrees_with_the_lexer(app_filter: str) -> None:
    accepted = expression_problem(app_filter) is None
    if accepted:
        assert balanced(app_filter)
    elif balanced(app_filter):
        # Refused though balanced: only for a line break inside a literal,
        # which a plain literal may continue with a backslash.
        assert any(
            "\n" in text[start:end] or "\r" in text[start:end]
            for text in [app_filter]
            for kind, start, end in reference_tokens(app_filter) or []
            if kind == "literal"
        )


@PROPERTIES
@given(tenant=st.text())
def test_property_the_tenant_literal_is_one_literal_holding_the_tenant(tenant: str) -> None:
    try:
        literal = string_literal(tenant)
    except UnfilterableRequest:
        assert any(
            ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) < 0xE000 for c in tenant
        )
        return
    assert reference_tokens(literal) == [("literal", 0, len(literal))]
    assert json.loads(literal) == tenant
