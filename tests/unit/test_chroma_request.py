"""Chroma requests: tenant push-down into ``where``/``filter``, over-fetch, refusals.

Rewritten filters are checked with chromadb's own ``validate_where`` (the
grammar the Python client enforces) and, for search, with the client's
``Where.from_dict``; that the real server reads them so is shown end to end in
``tests/envoy/test_envoy_chroma.py``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from chromadb.api.types import validate_where
from chromadb.execution.expression.operator import Where
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Route
from sidecar.formats.base import MalformedRequest, RequestRewrite, UnfilterableRequest
from sidecar.formats.chroma.rest import ChromaFormat
from sidecar.formats.chroma.rest_request import ChromaEcho
from tests.fixtures.chroma_bodies import route
from tests.fixtures.format_strategies import PROPERTIES

TENANT = "acme"
KEY = "tenant"
CONDITION = {KEY: {"$eq": TENANT}}
EMBEDDINGS = [[0.1, 0.2]]

Request = dict[str, Any]


def rewrite(
    endpoint: str,
    request: Request | bytes,
    *,
    tenant: str = TENANT,
    tenant_key: str | None = KEY,
    factor: float = 1.0,
    cap: int = 1000,
) -> RequestRewrite:
    body = request if isinstance(request, bytes) else orjson.dumps(request)
    return ChromaFormat().rewrite_request(
        body,
        route(endpoint),
        tenant=tenant,
        tenant_key=tenant_key,
        overfetch_factor=factor,
        overfetch_cap=cap,
    )


def rewritten(endpoint: str, request: Request, **options: Any) -> Request:
    out: Request = orjson.loads(rewrite(endpoint, request, **options).body)
    return out


# -- which requests -------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "endpoint", "rewrites"),
    [
        ("POST", "query", True),
        ("POST", "get", True),
        ("POST", "search", True),
        ("post", "query", True),
        ("GET", "query", False),
        ("POST", "count", False),
        ("POST", "add", False),
        ("POST", "delete", False),
        ("POST", "upsert", False),
    ],
)
def test_rewrites_the_search_endpoints_only(method: str, endpoint: str, rewrites: bool) -> None:
    assert ChromaFormat().rewrites_request(Route(method, route(endpoint).path)) is rewrites


def test_other_routes_come_back_unchanged() -> None:
    body = b'{"ids": ["a"], "where": {"SECRET": 1}}'
    out = ChromaFormat().rewrite_request(
        body,
        Route("POST", route("delete").path),
        tenant=TENANT,
        tenant_key=KEY,
        overfetch_factor=2.0,
        overfetch_cap=100,
    )
    assert out == RequestRewrite(body, (), tenant_filter=False, overfetched=False)


# -- push-down ---------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["query", "get"])
@pytest.mark.parametrize("absent", [{}, {"where": None}])
def test_without_an_app_filter_the_condition_stands_alone(endpoint: str, absent: Request) -> None:
    request = {"query_embeddings": EMBEDDINGS, **absent} if endpoint == "query" else absent
    out = rewrite(endpoint, request)
    where = orjson.loads(out.body)["where"]
    assert where == CONDITION
    assert out.tenant_filter and not out.overfetched and out.limits == ()
    validate_where(where)


APP_WHERES: list[Request] = [
    {"rank": {"$gte": 4}},
    {"rank": 4},
    {"$or": [{"tenant": "globex"}, {"tenant": {"$ne": "acme"}}]},
    {"$and": []},
    {"$and": [{"a": 1}]},
    {"#id": {"$in": ["c-1"]}},
    {"tags": {"$contains": "x"}},
    {},  # Chroma refuses it, at the top level and as an operand alike
]


@pytest.mark.parametrize("endpoint", ["query", "get"])
@pytest.mark.parametrize("app_where", APP_WHERES)
def test_the_app_filter_is_the_second_operand_untouched(endpoint: str, app_where: Request) -> None:
    request = {
        "query_embeddings": EMBEDDINGS,
        "where": app_where,
        "where_document": {"$contains": "needle"},
        "include": ["documents"],
        "ids": ["c-1", "c-2"],
    }
    out = rewritten(endpoint, request)
    assert out == {**request, "where": {"$and": [CONDITION, app_where]}}


@pytest.mark.parametrize("app_where", APP_WHERES[:3] + APP_WHERES[6:7])
def test_rewritten_where_is_valid_for_the_client(app_where: Request) -> None:
    where = rewritten("get", {"where": app_where})["where"]
    validate_where(where)


@pytest.mark.parametrize("endpoint", ["query", "get"])
@pytest.mark.parametrize("bad", ["SECRET", ["SECRET"], 1, True])
def test_a_where_that_is_not_an_object_is_refused(endpoint: str, bad: Any) -> None:
    with pytest.raises(UnfilterableRequest) as raised:
        rewrite(endpoint, {"query_embeddings": EMBEDDINGS, "where": bad})
    assert raised.value.code == "request_not_filterable"
    assert "'where'" in str(raised.value) and "SECRET" not in str(raised.value)


def _search(**fields: Any) -> Request:
    """One search as the Python client's ``Search.to_dict`` writes it."""
    return {
        "filter": None,
        "rank": {"$knn": {"query": [0.1, 0.2]}},
        "group_by": {},
        "limit": {"offset": 0, "limit": 5},
        "select": {"keys": ["#document", "#score"]},
        **fields,
    }


def test_every_search_gets_the_condition() -> None:
    app = {"$and": [{"rank": {"$gte": 4}}, {"#document": {"$contains": "x"}}]}
    searches = [_search(), _search(filter=app), _search(filter={}), _search()]
    del searches[3]["filter"]
    out = rewritten("search", {"searches": searches, "read_level": "IndexAndWal"})
    filters = [search["filter"] for search in out["searches"]]
    assert filters == [CONDITION, {"$and": [CONDITION, app]}, CONDITION, CONDITION]
    assert out["read_level"] == "IndexAndWal"
    for where in filters:
        Where.from_dict(where)


@pytest.mark.parametrize(
    "body", [{}, {"searches": None}, {"searches": {"0": {}}}, {"searches": [{}, "SECRET"]}]
)
def test_searches_that_are_not_a_list_of_objects_are_refused(body: Request) -> None:
    with pytest.raises(UnfilterableRequest, match="'searches'") as raised:
        rewrite("search", body)
    assert "SECRET" not in str(raised.value)


def test_a_search_filter_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(UnfilterableRequest, match="'filter'"):
        rewrite("search", {"searches": [_search(filter=["SECRET"])]})


@pytest.mark.parametrize("key", ["$and", "#document", "$eq"])
def test_a_tenant_key_chroma_reads_as_an_operator_is_a_configuration_error(key: str) -> None:
    with pytest.raises(ValueError, match="tenant_key"):
        rewrite("get", {}, tenant_key=key)


_json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


@PROPERTIES
@given(
    tenant=st.text(),
    app_where=st.dictionaries(st.text(max_size=6), _json, max_size=3),
    endpoint=st.sampled_from(["query", "get"]),
)
def test_property_any_tenant_and_filter_nest_as_json_values(
    tenant: str, app_where: Request, endpoint: str
) -> None:
    """Whatever the tenant string and the app's filter hold (quotes, operators, "$or"),
    the tenant is one JSON string and the app's filter one operand of "$and"."""
    out = rewritten(endpoint, {"where": app_where}, tenant=tenant)
    assert out == {"where": {"$and": [{KEY: {"$eq": tenant}}, app_where]}}


# -- over-fetch ------------------------------------------------------------------------


def test_query_n_results_is_raised_and_remembered() -> None:
    out = rewrite("query", {"query_embeddings": EMBEDDINGS, "n_results": 4}, factor=1.5)
    assert orjson.loads(out.body)["n_results"] == 6
    assert out.limits == (4,) and out.overfetched


def test_query_without_n_results_raises_chromas_default_of_ten() -> None:
    out = rewrite("query", {"query_embeddings": EMBEDDINGS}, factor=2.0)
    assert orjson.loads(out.body)["n_results"] == 20
    assert out.limits == (10,)


@pytest.mark.parametrize(
    ("factor", "cap", "asked", "sent", "limits"),
    [
        (1.0, 1000, 4, 4, ()),
        (0.5, 1000, 4, 4, ()),
        (1.1, 1000, 10, 11, (10,)),
        (3.0, 7, 4, 7, (4,)),
        (3.0, 3, 4, 4, ()),  # a cap below the ask never lowers it
        (2.0, 1000, 0, 0, ()),
    ],
)
def test_over_fetch_arithmetic(
    factor: float, cap: int, asked: int, sent: int, limits: tuple[int, ...]
) -> None:
    out = rewrite(
        "query", {"query_embeddings": EMBEDDINGS, "n_results": asked}, factor=factor, cap=cap
    )
    assert orjson.loads(out.body)["n_results"] == sent
    assert out.limits == limits and out.overfetched is bool(limits)


@pytest.mark.parametrize(
    ("request_", "sent", "limits"),
    [
        ({"where": {"a": 1}, "limit": 3}, 6, (3,)),
        ({"where": {"a": 1}, "limit": 3, "offset": 0}, 6, (3,)),
        ({"where": {"a": 1}, "limit": 3, "offset": None}, 6, (3,)),
        # A later page: its offset counts records before the check.
        ({"where": {"a": 1}, "limit": 3, "offset": 3}, 3, ()),
        # No limit: every match comes back already.
        ({"where": {"a": 1}}, None, ()),
        ({"ids": ["a"], "limit": None}, None, ()),
    ],
)
def test_get_limit_is_raised_only_on_a_first_page(
    request_: Request, sent: int | None, limits: tuple[int, ...]
) -> None:
    out = rewrite("get", request_, factor=2.0)
    assert orjson.loads(out.body).get("limit") == sent
    assert out.limits == limits


def test_search_limits_per_search() -> None:
    searches = [
        _search(),
        _search(limit={"offset": 5, "limit": 5}),  # a later page
        _search(limit={"offset": 0}),  # every match
        _search(group_by={"keys": ["doc"], "aggregate": {"$min_k": {"keys": ["#score"], "k": 1}}}),
        _search(limit={"limit": 2}),
    ]
    del searches[4]["limit"]["limit"]
    searches[4]["limit"] = {"limit": 2}
    out = rewrite("search", {"searches": searches}, factor=2.0)
    pages = [search["limit"] for search in orjson.loads(out.body)["searches"]]
    assert pages == [
        {"offset": 0, "limit": 10},
        {"offset": 5, "limit": 5},
        {"offset": 0},
        {"offset": 0, "limit": 5},
        {"limit": 4},
    ]
    assert out.limits == (5, None, None, None, 2)


def test_a_search_without_a_page_is_left_alone() -> None:
    search = _search()
    del search["limit"]
    out = rewrite("search", {"searches": [search]}, factor=2.0)
    assert "limit" not in orjson.loads(out.body)["searches"][0]
    assert out.limits == ()


def test_over_fetch_without_push_down() -> None:
    out = rewrite(
        "query", {"query_embeddings": EMBEDDINGS, "n_results": 2}, tenant_key=None, factor=2
    )
    assert orjson.loads(out.body) == {"query_embeddings": EMBEDDINGS, "n_results": 4}
    assert not out.tenant_filter and out.limits == (2,)


def test_nothing_to_apply_leaves_the_body_as_it_was() -> None:
    body = b'{"where": {"a": 1}, "limit": 3}'
    out = rewrite("get", body, tenant_key=None)
    # The answer's include is still read: it comes from the request.
    echo = ChromaEcho(include=("documents", "metadatas"))
    assert out == RequestRewrite(body, (), tenant_filter=False, overfetched=False, echo=echo)


# -- bodies that cannot be read ------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("query", b""),
        ("query", b"{not json"),
        ("query", b"[]"),
        ("query", b'"SECRET"'),
        ("query", b'{"n_results": "SECRET"}'),
        ("query", b'{"n_results": -1}'),
        ("query", b'{"n_results": true}'),
        ("get", b'{"limit": 2.5}'),
        ("search", b'{"searches": [{"limit": "SECRET"}]}'),
        ("search", b'{"searches": [{"limit": {"limit": "SECRET"}}]}'),
    ],
)
def test_unreadable_bodies(endpoint: str, body: bytes) -> None:
    with pytest.raises(MalformedRequest) as raised:
        rewrite(endpoint, body, factor=2.0)
    assert "SECRET" not in str(raised.value)
    assert raised.value.__cause__ is None


# -- what the answer repeats of the request -----------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "body", "include"),
    [
        ("get", {}, ("documents", "metadatas")),  # the server's defaults (measured)
        ("query", {"query_embeddings": EMBEDDINGS}, ("documents", "metadatas", "distances")),
        ("get", {"include": ["uris", "uris", "documents"]}, ("uris", "uris", "documents")),
        ("query", {"include": []}, ()),
        ("get", {"include": None}, None),  # refused by the server: no include known
        ("get", {"include": ["documents", 1]}, None),
    ],
)
def test_the_include_a_request_asks_is_read_for_its_answer(
    endpoint: str, body: dict[str, Any], include: tuple[str, ...] | None
) -> None:
    for tenant_key in ("tenant", None):
        out = rewrite(endpoint, body, tenant_key=tenant_key)
        assert out.echo == ChromaEcho(include=include)


def test_the_keys_each_search_selects_are_read_for_its_answer() -> None:
    searches = [
        {"select": {"keys": ["#document", "title"]}},
        {},
        {"select": {"keys": "#document"}},
    ]
    out = rewrite("search", {"searches": searches})
    assert out.echo == ChromaEcho(selects=(("#document", "title"), (), None))
