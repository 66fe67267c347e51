"""Tenant push-down for generic formats: the configured place and template.

The template is checked when the format is built (errors name the option);
at request time placeholders are replaced as whole JSON values, so the
properties check that nothing the tenant or the app sends can change the
template's structure.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Route
from sidecar.formats.base import MalformedRequest, RequestRewrite, UnfilterableRequest
from sidecar.formats.generic.rest import GenericFormat
from sidecar.formats.registry import build_format_table
from tests.fixtures.format_strategies import PROPERTIES, json_values
from tests.fixtures.generic_bodies import INHOUSE, generic_format

TEMPLATE = {"$and": [{"{tenant_key}": {"$eq": "{tenant}"}}, "{filter}"]}
PUSHING = {**INHOUSE, "tenant_filter_at": "$.filter", "tenant_filter": TEMPLATE}
ROUTE = Route("POST", "/api/retrieve")


def rewrite(
    fmt: GenericFormat,
    body: Any,
    route: Route = ROUTE,
    *,
    tenant: str = "acme",
    tenant_key: str | None = "tenant",
    factor: float = 1,
) -> RequestRewrite:
    return fmt.rewrite_request(
        orjson.dumps(body),
        route,
        tenant=tenant,
        tenant_key=tenant_key,
        overfetch_factor=factor,
        overfetch_cap=100,
    )


def rewritten(config: dict[str, Any], body: Any, **kwargs: Any) -> Any:
    return orjson.loads(rewrite(generic_format(config), body, **kwargs).body)


# -- options --------------------------------------------------------------------------


_AT = "$.filter"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tenant_filter_at": _AT}, "^tenant_filter_at, tenant_filter: give both"),
        ({"tenant_filter": TEMPLATE}, "^tenant_filter_at, tenant_filter: give both"),
        ({"tenant_filter_alone": {"t": "{tenant}"}}, "^tenant_filter_at, tenant_filter: give both"),
        (
            {"tenant_filter_at": "$.q[*]", "tenant_filter": TEMPLATE},
            r"^tenant_filter_at: .*must end with a field name",
        ),
        (
            {"tenant_filter_at": "$.bad[", "tenant_filter": TEMPLATE},
            r"^tenant_filter_at: selector '\$\.bad\['",
        ),
        (
            {"tenant_filter_at": 5, "tenant_filter": TEMPLATE},
            "^tenant_filter_at: expected a selector string",
        ),
        (
            {"tenant_filter_at": _AT, "tenant_filter": {"t": "{tenant}"}},
            '^tenant_filter: needs "{tenant}" and exactly one',
        ),
        (
            {"tenant_filter_at": _AT, "tenant_filter": ["{filter}"]},
            '^tenant_filter: needs "{tenant}" and exactly one',
        ),
        (
            {"tenant_filter_at": _AT, "tenant_filter": "{filter}"},
            '^tenant_filter: needs "{tenant}" and exactly one',
        ),
        (
            {"tenant_filter_at": _AT, "tenant_filter": ["{tenant}", "{filter}", "{filter}"]},
            '^tenant_filter: needs "{tenant}" and exactly one',
        ),
        (
            {"tenant_filter_at": _AT, "tenant_filter": ["tenant = '{tenant}'", "{filter}"]},
            "^tenant_filter: a placeholder must be a whole string",
        ),
        (
            {
                "tenant_filter_at": _AT,
                "tenant_filter": [{"t": "x{tenant}"}, "{filter}", "{tenant}"],
            },
            "^tenant_filter: a placeholder must be a whole string",
        ),
        (
            {"tenant_filter_at": _AT, "tenant_filter": [{"{tenant}": 1}, "{filter}"]},
            '^tenant_filter: only "{tenant_key}" may stand for an object key',
        ),
        (
            {
                "tenant_filter_at": _AT,
                "tenant_filter": [{"{tenant_key}.x": "{tenant}"}, "{filter}"],
            },
            "^tenant_filter: a placeholder must be a whole string",
        ),
        (
            {
                "tenant_filter_at": _AT,
                "tenant_filter": ["{tenant}", "{filter}", datetime.date(2026, 1, 1)],
            },
            "^tenant_filter: holds a value that is not JSON",
        ),
        (
            {"tenant_filter_at": _AT, "tenant_filter": ["{tenant}", "{filter}", math.nan]},
            "^tenant_filter: holds a value that is not JSON",
        ),
        (
            {
                "tenant_filter_at": _AT,
                "tenant_filter": ["{tenant}", "{filter}"],
                "tenant_filter_alone": ["{filter}"],
            },
            '^tenant_filter_alone: needs "{tenant}" and no "{filter}"',
        ),
        (
            {
                "tenant_filter_at": _AT,
                "tenant_filter": ["{tenant}", "{filter}"],
                "tenant_filter_alone": {"x": 1},
            },
            '^tenant_filter_alone: needs "{tenant}" and no "{filter}"',
        ),
        (
            {
                "tenant_filter_at": _AT,
                "tenant_filter": ["{tenant}", "{filter}"],
                "tenant_filter_alone": ["a{tenant}"],
            },
            "^tenant_filter_alone: a placeholder must be a whole string",
        ),
    ],
)
def test_invalid_tenant_filter_options(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generic_format({**INHOUSE, **changes})


def test_options_from_the_configuration_file_name_the_format() -> None:
    table = {"inhouse": {"adapter": "generic", **PUSHING, "tenant_filter": ["{filter}"]}}
    del table["inhouse"]["name"]
    with pytest.raises(ValueError, match=r"^formats\.inhouse: tenant_filter: needs"):
        build_format_table(table, {}, text_field="text", id_field=None)


def test_the_configuration_file_builds_a_rewriter() -> None:
    options = {k: v for k, v in PUSHING.items() if k != "name"}
    formats = build_format_table(
        {"inhouse": {"adapter": "generic", **options}}, {}, text_field="text", id_field=None
    )
    (fmt, *_) = formats.formats
    assert isinstance(fmt, GenericFormat)
    assert fmt.rewrites_request(ROUTE)


# -- push-down ------------------------------------------------------------------------


def test_the_filter_is_nested_as_the_app_sent_it() -> None:
    app = {"$or": [{"lang": "en"}, {"lang": {"$in": ["de"]}}]}
    body = rewritten(PUSHING, {"query": "q", "filter": app, "k": 3})
    assert body == {
        "query": "q",
        "filter": {"$and": [{"tenant": {"$eq": "acme"}}, app]},
        "k": 3,
    }


@pytest.mark.parametrize("app", [[1, 2], "lang:en", 0, False, {}, []])
def test_any_json_filter_is_nested_as_it_is(app: Any) -> None:
    assert rewritten(PUSHING, {"filter": app})["filter"] == {
        "$and": [{"tenant": {"$eq": "acme"}}, app]
    }


@pytest.mark.parametrize("body", [{"query": "q"}, {"query": "q", "filter": None}])
def test_no_filter_is_the_template_without_it(body: dict[str, Any]) -> None:
    assert rewritten(PUSHING, body)["filter"] == {"$and": [{"tenant": {"$eq": "acme"}}]}


def test_the_filter_entry_of_an_object_template_is_dropped_without_a_filter() -> None:
    config = {
        **PUSHING,
        "tenant_filter": {
            "bool": {"filter": [{"term": {"{tenant_key}": "{tenant}"}}], "must": "{filter}"}
        },
    }
    assert rewritten(config, {})["filter"] == {"bool": {"filter": [{"term": {"tenant": "acme"}}]}}
    assert rewritten(config, {"filter": {"match": {"t": "x"}}})["filter"] == {
        "bool": {"filter": [{"term": {"tenant": "acme"}}], "must": {"match": {"t": "x"}}}
    }


def test_a_configured_alone_form_is_used() -> None:
    config = {**PUSHING, "tenant_filter_alone": {"tenant": "{tenant}"}}
    assert rewritten(config, {})["filter"] == {"tenant": "acme"}


def test_the_tenant_key_fills_keys_and_values() -> None:
    config = {
        **PUSHING,
        "tenant_filter": {"and": [{"field": "{tenant_key}", "eq": "{tenant}"}, "{filter}"]},
    }
    assert rewritten(config, {"filter": 1}, tenant_key="org")["filter"] == {
        "and": [{"field": "org", "eq": "acme"}, 1]
    }


def test_every_place_a_wildcard_selects_is_filtered() -> None:
    config = {**PUSHING, "tenant_filter_at": "$.queries[*].where"}
    body = rewritten(config, {"queries": [{"where": {"a": 1}}, {"q": "x"}]})
    assert body == {
        "queries": [
            {"where": {"$and": [{"tenant": {"$eq": "acme"}}, {"a": 1}]}},
            {"q": "x", "where": {"$and": [{"tenant": {"$eq": "acme"}}]}},
        ]
    }


@pytest.mark.parametrize(
    ("at", "body"),
    [
        ("$.query.filter", {"q": 1}),
        ("$.queries[*].filter", {"queries": []}),
        ("$.queries[*].filter", {"queries": {"filter": {}}}),
    ],
)
def test_no_place_for_the_filter_is_refused(at: str, body: Any) -> None:
    fmt = generic_format({**PUSHING, "tenant_filter_at": at})
    with pytest.raises(UnfilterableRequest) as raised:
        rewrite(fmt, body)
    assert raised.value.code == "request_not_filterable"
    assert raised.value.__context__ is None


@pytest.mark.parametrize(
    ("at", "body"),
    [("$.queries[*].filter", {"queries": [{"filter": {}}, "x"]}), ("$.query.filter", {"query": 1})],
)
def test_a_place_that_is_no_object_is_unreadable(at: str, body: Any) -> None:
    fmt = generic_format({**PUSHING, "tenant_filter_at": at})
    with pytest.raises(MalformedRequest):
        rewrite(fmt, body)


def test_unreadable_bodies() -> None:
    fmt = generic_format(PUSHING)
    for body in (b"not json", b"[]"):
        with pytest.raises(MalformedRequest):
            fmt.rewrite_request(
                body, ROUTE, tenant="a", tenant_key="t", overfetch_factor=1, overfetch_cap=9
            )


def test_never_over_fetched() -> None:
    result = rewrite(generic_format(PUSHING), {"k": 3}, factor=3)
    assert result.limits == ()
    assert not result.overfetched
    assert result.tenant_filter


def test_no_tenant_key_no_push_down() -> None:
    result = rewrite(generic_format(PUSHING), {"filter": 1}, tenant_key=None, factor=3)
    assert result == RequestRewrite(b'{"filter":1}', (), tenant_filter=False, overfetched=False)


def test_without_the_options_requests_are_not_rewritten() -> None:
    fmt = generic_format(INHOUSE)
    assert not fmt.rewrites_request(ROUTE)
    body = b'{"filter": {"tenant": "globex"}}'
    result = fmt.rewrite_request(
        body, ROUTE, tenant="acme", tenant_key="tenant", overfetch_factor=2, overfetch_cap=9
    )
    assert result == RequestRewrite(body, (), tenant_filter=False, overfetched=False)


def test_only_the_configured_routes_are_rewritten() -> None:
    fmt = generic_format(PUSHING)
    assert fmt.rewrites_request(Route("POST", "/api/v1/collections/docs/search"))
    assert not fmt.rewrites_request(Route("GET", "/api/retrieve"))
    assert not fmt.rewrites_request(Route("POST", "/api/retrieve/batch"))


# -- properties -------------------------------------------------------------------------


@PROPERTIES
@given(
    tenant=st.text(max_size=12) | st.sampled_from(['"}', "{filter}", "{tenant}", "\\", "\x00"]),
    app=json_values,
)
def test_property_the_template_keeps_its_structure(tenant: str, app: Any) -> None:
    out = rewritten(PUSHING, {"filter": app}, tenant=tenant)["filter"]
    if app is None:
        assert out == {"$and": [{"tenant": {"$eq": tenant}}]}
        return
    assert out.keys() == {"$and"}
    condition, nested = out["$and"]
    assert condition == {"tenant": {"$eq": tenant}}
    assert nested == app
