"""Elasticsearch / OpenSearch search requests: tenant push-down, over-fetch, URL parameters.

Request shapes follow the Elasticsearch search API reference
(https://www.elastic.co/docs/api/doc/elasticsearch/operation/operation-search, the kNN,
retriever and msearch pages) and OpenSearch's (k-NN, neural and hybrid queries). Rewritten
``_search`` bodies are read back with elasticsearch-py's DSL (``Search.from_dict``, ``Q``),
which refuses query types it does not know; OpenSearch-only queries are checked by shape.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from elasticsearch.dsl import Q, Search
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Route
from sidecar.formats.base import (
    MalformedRequest,
    RequestRewrite,
    UnfilterableRequest,
)
from sidecar.formats.elasticsearch.rest import ElasticsearchFormat
from sidecar.formats.elasticsearch.rest_request import overfetch_problem, query_string_problem
from tests.fixtures.format_strategies import PROPERTIES, json_values

TENANT = "acme"
KEY = "tenant"
TERM = {"term": {KEY: TENANT}}
SEARCH = Route("POST", "/docs/_search")
MSEARCH = Route("POST", "/_msearch")
FMT = ElasticsearchFormat()

Body = dict[str, Any]


def rewrite(
    body: Body | bytes,
    route: Route = SEARCH,
    *,
    tenant_key: str | None = KEY,
    tenant: str = TENANT,
    factor: float = 1.0,
    cap: int = 1000,
) -> RequestRewrite:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return FMT.rewrite_request(
        raw, route, tenant=tenant, tenant_key=tenant_key, overfetch_factor=factor, overfetch_cap=cap
    )


def rewritten(body: Body | bytes, route: Route = SEARCH, **options: Any) -> Body:
    """The rewritten body, checked by elasticsearch-py's DSL when it is Elasticsearch's."""
    out: Body = orjson.loads(rewrite(body, route, **options).body)
    if not _opensearch_only(out):
        assert Search.from_dict(copy.deepcopy(out)).to_dict() is not None
    return out


def _opensearch_only(body: Body) -> bool:
    text = orjson.dumps(body)
    return any(marker in text for marker in (b'"hybrid"', b'"neural"', b'"vector"'))


def refused(body: Body | bytes, route: Route = SEARCH) -> str:
    with pytest.raises(UnfilterableRequest) as raised:
        rewrite(body, route)
    assert raised.value.code == "request_not_filterable"
    return str(raised.value)


def lines(*objects: Body) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objects)


def read_lines(body: bytes) -> list[Body]:
    assert body.endswith(b"\n") or not body
    return [orjson.loads(line) for line in body.split(b"\n")[:-1]]


# -- which routes are rewritten ---------------------------------------------------


def test_the_format_declares_its_request_checks() -> None:
    search = Route("POST", "/docs/_search")
    assert FMT.rewrites_request(search)
    assert FMT.query_string_problem(search, "q=title:x") is not None
    assert FMT.overfetch_problem(search, "size=5") is not None


@pytest.mark.parametrize(
    ("method", "path", "rewrites"),
    [
        ("POST", "/docs/_search", True),
        ("GET", "/docs/_search", True),
        ("POST", "/_search", True),
        ("POST", "/_all/_search", True),
        ("POST", "/docs,logs-*/_search", True),
        ("POST", "/docs/_knn_search", True),
        ("POST", "/_msearch", True),
        ("GET", "/docs/_msearch", True),
        ("POST", "/docs/_fleet/_fleet_search", True),
        ("POST", "/_fleet/_fleet_msearch", True),
        # Templates: read, to be refused when the tenant is pushed down.
        ("POST", "/_search/template", True),
        ("POST", "/_msearch/template", True),
        ("POST", "/_application/search_application/app/_search", True),
        # No query to rewrite, or not a search.
        ("POST", "/_search/scroll", False),
        ("GET", "/_search/scroll/c2Nyb2xs", False),
        ("DELETE", "/_search/scroll", False),
        ("PUT", "/docs/_search", False),
        ("GET", "/docs/_doc/1", False),
        ("POST", "/docs/_count", False),
        ("DELETE", "/_pit", False),
        ("GET", "/", False),
        # Read for an index_filter, to be refused.
        ("POST", "/docs/_pit", True),
        ("POST", "/logs-*/_pit", True),
    ],
)
def test_rewritten_routes(method: str, path: str, rewrites: bool) -> None:
    assert FMT.rewrites_request(Route(method, path)) is rewrites


PIT = Route("POST", "/docs/_pit")


@pytest.mark.parametrize(
    "index_filter",
    [
        {"range": {"salary": {"gte": 100000}}},
        {"term": {KEY: TENANT}},  # even the caller's own tenant: decided per shard
        {"match_all": {}},
    ],
)
def test_a_point_in_times_index_filter_is_refused(index_filter: Any) -> None:
    body = orjson.dumps({"index_filter": index_filter})
    with pytest.raises(UnfilterableRequest) as raised:
        FMT.request_collections(body, PIT)
    assert raised.value.code == "request_not_filterable"
    assert b"100000" not in str(raised.value).encode()


@pytest.mark.parametrize("body", [b"", b" ", b"{}"])
def test_a_point_in_time_opened_without_a_filter_names_nothing(body: bytes) -> None:
    assert FMT.request_collections(body, PIT) == ()


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'{"index_filter": 1, "index_filter": 2}'])
def test_an_unreadable_point_in_time_body_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedRequest) as raised:
        FMT.request_collections(body, PIT)
    assert not isinstance(raised.value, UnfilterableRequest)


def test_a_search_of_a_point_in_time_is_confined_like_any_search() -> None:
    body = {"pit": {"id": "46ToAwMDaWR5", "keep_alive": "1m"}, "query": {"match": {"text": "x"}}}
    out = rewritten(body, Route("POST", "/_search"))
    assert out["pit"] == body["pit"]
    assert out["query"] == {"bool": {"filter": [TERM], "must": [body["query"]]}}


# -- the query ------------------------------------------------------------------------


def test_query_is_wrapped_and_keeps_scoring() -> None:
    query = {"match": {"text": "what the app asked"}}
    out = rewritten({"query": query, "size": 5})
    assert out == {"query": {"bool": {"filter": [TERM], "must": [query]}}, "size": 5}
    assert Q(out["query"]).to_dict() == out["query"]


@pytest.mark.parametrize("body", [{}, b"", {"size": 3}])
def test_no_query_means_match_all_of_the_tenant(body: Body | bytes) -> None:
    out = rewritten(body)
    assert out["query"] == {"bool": {"filter": [TERM], "must": [{"match_all": {}}]}}


def test_an_app_filter_keeps_its_meaning() -> None:
    # A should-only bool matches documents of any tenant; nested under the
    # gate's filter, it can only narrow them.
    query = {"bool": {"should": [{"term": {KEY: "globex"}}], "minimum_should_match": 1}}
    out = rewritten({"query": query, "post_filter": {"term": {KEY: "globex"}}})
    assert out["query"] == {"bool": {"filter": [TERM], "must": [query]}}
    assert out["post_filter"] == {"term": {KEY: "globex"}}


@PROPERTIES
@given(query=st.dictionaries(st.text(max_size=8), json_values, max_size=3), tenant=st.text())
def test_property_the_app_query_is_nested_untouched(query: Body, tenant: str) -> None:
    # Any tenant value stays one JSON string: it cannot change the query's meaning.
    query = {k: v for k, v in query.items() if k not in ("hybrid",)}
    original = copy.deepcopy(query)
    out = orjson.loads(rewrite({"query": query}, tenant=tenant).body)
    assert out["query"] == {"bool": {"filter": [{"term": {KEY: tenant}}], "must": [original]}}


def test_rewrite_flags() -> None:
    done = rewrite({"query": {"match_all": {}}})
    assert (done.tenant_filter, done.overfetched, done.limits) == (True, False, ())
    same = b'{"query":{"match_all":{}}}'
    untouched = rewrite(same, tenant_key=None)
    assert (untouched.body, untouched.tenant_filter) == (same, False)


# -- kNN ----------------------------------------------------------------------------------

KNN = {"field": "vector", "query_vector": [0.1, 0.2], "k": 5, "num_candidates": 50}


@pytest.mark.parametrize(
    ("app_filter", "expected"),
    [
        (None, TERM),
        ({"term": {"lang": "en"}}, {"bool": {"filter": [TERM, {"term": {"lang": "en"}}]}}),
        ([{"term": {"lang": "en"}}], {"bool": {"filter": [TERM, {"term": {"lang": "en"}}]}}),
        ([], {"bool": {"filter": [TERM]}}),
    ],
)
def test_top_level_knn_gets_the_term_in_its_filter(app_filter: Any, expected: Body) -> None:
    knn = KNN if app_filter is None else {**KNN, "filter": app_filter}
    out = rewritten({"knn": knn})
    assert out == {"knn": {**KNN, "filter": expected}}  # no query: it would add hits


def test_every_knn_of_a_list_gets_the_term_and_a_query_is_wrapped_beside_them() -> None:
    other = {**KNN, "field": "title_vector", "query_vector_builder": {"text_embedding": {}}}
    del other["query_vector"]
    query = {"match": {"text": "x"}}
    out = rewritten({"knn": [KNN, other], "query": query})
    assert out["knn"] == [{**KNN, "filter": TERM}, {**other, "filter": TERM}]
    assert out["query"] == {"bool": {"filter": [TERM], "must": [query]}}


@pytest.mark.parametrize(
    "knn",
    [[1], "vector", {"query_vector": [1.0]}, {"field": "v"}, {"field": 1, "query_vector": []}],
)
def test_a_knn_the_gate_cannot_read_is_malformed(knn: Any) -> None:
    with pytest.raises(MalformedRequest):
        rewrite({"knn": knn})


@pytest.mark.parametrize("app_filter", ["tenant", 3, True])
def test_a_knn_filter_that_is_no_query_is_malformed(app_filter: Any) -> None:
    with pytest.raises(MalformedRequest):
        rewrite({"knn": {**KNN, "filter": app_filter}})


def test_knn_queries_at_any_depth_are_prefiltered() -> None:
    # Outside the kNN clause a filter applies after the k nearest are chosen: the hits
    # left would count other tenants' vectors among the nearest.
    knn_query = {"field": "vector", "query_vector": [0.3], "num_candidates": 20, "k": 4}
    query = {"bool": {"should": [{"knn": knn_query}, {"match": {"text": "x"}}]}}
    out = rewritten({"query": query})
    inner = out["query"]["bool"]["must"][0]["bool"]["should"][0]["knn"]
    assert inner == {**knn_query, "filter": TERM}


def test_opensearch_knn_and_neural_queries_are_prefiltered() -> None:
    knn = {"knn": {"vector": {"vector": [0.1], "k": 3, "filter": {"term": {"lang": "en"}}}}}
    neural = {"neural": {"emb": {"query_text": "q", "model_id": "m", "k": 3}}}
    out = rewritten({"query": {"bool": {"should": [knn, neural]}}})
    should = out["query"]["bool"]["must"][0]["bool"]["should"]
    assert should[0]["knn"]["vector"]["filter"] == {
        "bool": {"filter": [TERM, {"term": {"lang": "en"}}]}
    }
    assert should[1]["neural"]["emb"]["filter"] == TERM


@pytest.mark.parametrize(
    "query",
    [
        {"term": {"knn": "a field named knn"}},
        {"match": {"knn": {"query": "text"}}},
        {"range": {"neural": {"gte": 1}}},
    ],
)
def test_fields_named_like_vector_queries_are_left_alone(query: Body) -> None:
    out = rewritten({"query": query, "aggs": {"knn": {"terms": {"field": "x"}}}})
    assert out["query"] == {"bool": {"filter": [TERM], "must": [query]}}
    assert out["aggs"] == {"knn": {"terms": {"field": "x"}}}


def test_opensearch_hybrid_query_stays_top_level_with_each_query_wrapped() -> None:
    queries = [{"match": {"text": "x"}}, {"neural": {"emb": {"query_text": "x", "k": 5}}}]
    out = rewritten({"query": {"hybrid": {"queries": queries, "pagination_depth": 10}}})
    hybrid = out["query"]["hybrid"]
    assert hybrid["pagination_depth"] == 10
    assert hybrid["queries"][0] == {"bool": {"filter": [TERM], "must": [queries[0]]}}
    neural = hybrid["queries"][1]["bool"]["must"][0]["neural"]["emb"]
    assert neural == {"query_text": "x", "k": 5, "filter": TERM}


def test_a_hybrid_query_without_a_list_is_malformed() -> None:
    with pytest.raises(MalformedRequest):
        rewrite({"query": {"hybrid": {"queries": {"match_all": {}}}}})


def test_knn_search_endpoint_gets_a_top_level_filter() -> None:
    route = Route("POST", "/docs/_knn_search")
    out = rewritten({"knn": KNN, "filter": [{"term": {"lang": "en"}}], "_source": ["text"]}, route)
    assert out == {
        "knn": KNN,  # takes no filter of its own on this endpoint
        "filter": {"bool": {"filter": [TERM, {"term": {"lang": "en"}}]}},
        "_source": ["text"],
    }
    assert rewritten({"knn": KNN}, route)["filter"] == TERM
    assert "query" in refused({"knn": KNN, "query": {"match_all": {}}}, route)


# -- retrievers -----------------------------------------------------------------------


def test_standard_and_knn_retrievers_get_the_term() -> None:
    standard = {"standard": {"query": {"match": {"text": "x"}}}}
    out = rewritten({"retriever": standard})
    assert out == {"retriever": {"standard": {"query": {"match": {"text": "x"}}, "filter": TERM}}}
    out = rewritten({"retriever": {"knn": KNN}})
    assert out == {"retriever": {"knn": {**KNN, "filter": TERM}}}


def test_composite_retrievers_are_walked() -> None:
    app_filter = {"term": {"lang": "en"}}
    tree = {
        "text_similarity_reranker": {
            "field": "text",
            "inference_id": "rerank",
            "inference_text": "x",
            "retriever": {
                "rrf": {
                    "retrievers": [
                        {"standard": {"query": {"match": {"text": "x"}}, "filter": app_filter}},
                        {"knn": KNN},
                        {"linear": {"retrievers": [{"retriever": {"knn": KNN}, "weight": 2}]}},
                    ],
                    "rank_window_size": 50,
                }
            },
        }
    }
    out = rewritten({"retriever": tree})
    rrf = out["retriever"]["text_similarity_reranker"]["retriever"]["rrf"]
    standard, knn, linear = rrf["retrievers"]
    assert standard["standard"]["filter"] == {"bool": {"filter": [TERM, app_filter]}}
    assert knn["knn"]["filter"] == TERM
    assert linear["linear"]["retrievers"][0]["retriever"]["knn"]["filter"] == TERM
    assert "query" not in out


@pytest.mark.parametrize(
    ("retriever", "named"),
    [
        ({"rule": {"retriever": {"standard": {}}, "ruleset_ids": ["r"]}}, "'rule'"),
        ({"pinned": {"ids": ["1"], "retriever": {"standard": {}}}}, "'pinned'"),
        ({"rrf": {"query": "x", "fields": ["text"]}}, "'fields'"),
        ({"linear": {"retrievers": [], "query": "x"}}, "'query'"),
        ({"rrf": {"retrievers": [{"future": {}}]}}, "'future'"),
    ],
)
def test_retrievers_the_gate_cannot_confine_are_refused(retriever: Body, named: str) -> None:
    assert named in refused({"retriever": retriever})


@pytest.mark.parametrize(
    "retriever", [[], "standard", {"standard": {}, "knn": KNN}, {"standard": []}, {"knn": {}}]
)
def test_a_retriever_the_gate_cannot_read_is_malformed(retriever: Any) -> None:
    with pytest.raises(MalformedRequest):
        rewrite({"retriever": retriever})


# -- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "suggest",  # every tenant's terms; collate runs an unfiltered query
        "runtime_mappings",  # could shadow the tenant field itself
        "derived",  # OpenSearch's runtime fields
        "script_fields",
        "rank",
        "sub_searches",
        "search_pipeline",  # request processors rewrite the query
        "future_key",
    ],
)
def test_top_level_keys_not_known_to_be_safe_are_refused(key: str) -> None:
    message = refused({key: {"SECRET": "SECRET"}, "query": {"match_all": {}}})
    assert repr(key) in message
    assert "SECRET" not in message


def test_an_odd_key_is_not_quoted() -> None:
    assert "a key" in refused({"x\n" * 40: 1})


@pytest.mark.parametrize(
    "query",
    [
        {"terms": {"user": {"index": "other", "id": "2", "path": "followers"}}},
        {"more_like_this": {"fields": ["text"], "like": [{"_index": "other", "_id": "1"}]}},
        {"mlt": {"like": {"_id": "1"}}},
        {"more_like_this": {"like": "text", "unlike": [{"_id": "1"}]}},
        {"geo_shape": {"location": {"indexed_shape": {"index": "shapes", "id": "x"}}}},
        {"percolate": {"field": "query", "index": "other", "id": "1"}},
        {"has_child": {"type": "chunk", "query": {"match_all": {}}}},
        {"has_parent": {"parent_type": "doc", "query": {"match_all": {}}}},
        {"wrapper": {"query": "eyJtYXRjaF9hbGwiOnt9fQ=="}},
    ],
)
def test_queries_reading_documents_past_the_filter_are_refused(query: Body) -> None:
    refused({"query": {"bool": {"should": [query]}}})
    refused({"post_filter": query})
    refused({"aggs": {"a": {"filter": query}}})


@pytest.mark.parametrize(
    "query",
    [
        {"terms": {"lang": ["en", "de"]}},
        {"more_like_this": {"fields": ["text"], "like": ["text", {"doc": {"text": "x"}}]}},
        {"percolate": {"field": "query", "document": {"text": "x"}}},
        {"ids": {"values": ["1", "2"]}},
    ],
)
def test_queries_that_read_only_what_the_request_holds_pass(query: Body) -> None:
    out = rewritten(
        {"query": query, "aggs": {"t": {"terms": {"field": "lang", "order": {"_count": "asc"}}}}}
    )
    assert out["query"]["bool"]["must"] == [query]


@pytest.mark.parametrize(
    "route",
    [
        Route("POST", "/_search/template"),
        Route("GET", "/docs/_search/template"),
        Route("POST", "/_application/search_application/app/_search"),
    ],
)
def test_templates_are_refused_when_the_tenant_is_pushed_down(route: Route) -> None:
    assert "rendered by the database" in refused({"id": "tpl", "params": {"q": "x"}}, route)


def test_templates_pass_unchanged_without_push_down() -> None:
    route = Route("POST", "/_search/template")
    body = b'{"id":"tpl","params":{"size":5}}'
    done = rewrite(body, route, tenant_key=None, factor=2.0)
    assert (done.body, done.tenant_filter, done.overfetched) == (body, False, False)


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'"x"', b" ", b'{"query": []}'])
def test_malformed_bodies(body: bytes) -> None:
    with pytest.raises(MalformedRequest) as raised:
        rewrite(body)
    assert not isinstance(raised.value, UnfilterableRequest)


# -- over-fetch -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "size", "limits"),
    [
        ({}, 20, (10,)),  # Elasticsearch's default size
        ({"size": 4}, 8, (4,)),
        ({"size": 4, "from": 0}, 8, (4,)),
        ({"size": 4, "search_after": [1.5, "a"]}, 8, (4,)),  # continues after the app's last
        ({"size": 600}, 1000, (600,)),  # capped
        ({"size": 0}, 0, ()),
        ({"size": 4, "from": 8}, 4, ()),  # would overlap the next page
        ({"size": 4, "retriever": {"knn": KNN}}, 4, ()),  # rank_window_size follows size
        ({"size": 4, "knn": KNN}, 8, (4,)),  # k given: the kNN part stays the app's
        # k left to follow size: raising it would choose among other candidates.
        ({"size": 4, "knn": {k: v for k, v in KNN.items() if k != "k"}}, 4, ()),
        ({"size": 4, "query": {"knn": {"field": "v", "query_vector": [1.0]}}}, 4, ()),
    ],
)
def test_overfetch_raises_size(body: Body, size: int, limits: tuple[int, ...]) -> None:
    done = rewrite(body, factor=2.0)
    assert orjson.loads(done.body)["size"] == size
    assert done.limits == limits
    assert done.overfetched is bool(limits)


def test_overfetch_without_push_down() -> None:
    done = rewrite({"query": {"match_all": {}}, "size": 3}, tenant_key=None, factor=1.5)
    assert orjson.loads(done.body) == {"query": {"match_all": {}}, "size": 5}
    assert (done.limits, done.tenant_filter) == ((3,), False)


@pytest.mark.parametrize("size", ["10", -1, 2.5, True])
def test_a_size_the_gate_cannot_raise_is_malformed(size: Any) -> None:
    with pytest.raises(MalformedRequest):
        rewrite({"size": size}, factor=2.0)


def test_knn_search_endpoint_is_not_overfetched() -> None:
    done = rewrite({"knn": KNN}, Route("POST", "/docs/_knn_search"), tenant_key=None, factor=2.0)
    assert not done.overfetched


# -- multi-search -----------------------------------------------------------------------


def test_every_search_line_is_confined_and_headers_kept() -> None:
    query = {"match": {"text": "x"}}
    body = lines({"index": "docs"}, {"query": query}, {}, {"knn": KNN}, {"index": "logs"}, {})
    done = rewrite(body, MSEARCH)
    assert read_lines(done.body) == [
        {"index": "docs"},
        {"query": {"bool": {"filter": [TERM], "must": [query]}}},
        {},
        {"knn": {**KNN, "filter": TERM}},
        {"index": "logs"},
        {"query": {"bool": {"filter": [TERM], "must": [{"match_all": {}}]}}},
    ]
    assert done.collections == ("docs", "*", "logs")


@pytest.mark.parametrize(
    ("route", "headers", "collections"),
    [
        (MSEARCH, [{"index": "docs,logs-*"}], ("docs", "logs-*")),
        (MSEARCH, [{"index": ["docs", "remote:a"]}], ("docs", "remote:a")),
        (MSEARCH, [{"indices": "docs"}, {"index": "docs"}], ("docs",)),
        (MSEARCH, [{"index": "_all"}], ("*",)),
        (MSEARCH, [{}], ("*",)),  # no index anywhere: every index
        (Route("POST", "/docs/_msearch"), [{}], ()),  # the path's index (checked by route)
        (Route("POST", "/docs/_msearch"), [{"index": "other"}], ("other",)),  # overrides
        (Route("POST", "/_fleet/_fleet_msearch"), [{"index": "docs"}], ("docs",)),
    ],
)
def test_header_indices_are_the_collections(
    route: Route, headers: list[Body], collections: tuple[str, ...]
) -> None:
    body = lines(*[line for header in headers for line in (header, {})])
    assert rewrite(body, route).collections == collections
    # Also when nothing is rewritten: the policy checks them all the same.
    untouched = rewrite(body, route, tenant_key=None)
    assert (untouched.body, untouched.collections) == (body, collections)


def test_ndjson_as_elasticsearch_reads_it() -> None:
    # A leading empty line is skipped; empty header and search lines are {}; a carriage
    # return before a newline is whitespace.
    body = b'\n\n{"size": 2}\r\n{"index":"docs"}\n\n'
    done = rewrite(body, MSEARCH)
    match_all = {"query": {"bool": {"filter": [TERM], "must": [{"match_all": {}}]}}}
    assert read_lines(done.body) == [{}, {"size": 2, **match_all}, {"index": "docs"}, match_all]


@pytest.mark.parametrize(
    "body",
    [
        b'{}\n{"query": {"match_all": {}}}',  # no final newline
        b"{}\n",  # a header without its search line
        b"{}\n[]\n",
        b"[]\n{}\n",
        b"{}\n{not json\n",
        b'{"index": 1}\n{}\n',
        b'{"index": ["a", 1]}\n{}\n',
    ],
)
def test_malformed_multi_search_bodies(body: bytes) -> None:
    with pytest.raises(MalformedRequest):
        rewrite(body, MSEARCH)


def test_a_refused_line_refuses_the_whole_multi_search() -> None:
    body = lines({}, {"query": {"match_all": {}}}, {}, {"suggest": {}})
    assert "'suggest'" in refused(body, MSEARCH)


def test_multi_search_templates_are_refused() -> None:
    body = lines({"index": "docs"}, {"id": "tpl", "params": {}})
    refused(body, Route("POST", "/_msearch/template"))
    untouched = rewrite(body, Route("POST", "/_msearch/template"), tenant_key=None, factor=2.0)
    assert (untouched.body, untouched.collections) == (body, ("docs",))


def test_multi_search_lines_are_overfetched_one_by_one() -> None:
    body = lines({}, {"size": 3}, {}, {"size": 2, "from": 4}, {}, {})
    done = rewrite(body, MSEARCH, tenant_key=None, factor=2.0)
    searches = read_lines(done.body)[1::2]
    assert [s.get("size") for s in searches] == [6, 2, 20]
    assert done.limits == (3, None, 10)


def test_an_empty_multi_search_stays_empty() -> None:
    done = rewrite(b"", MSEARCH)
    assert (done.body, done.collections) == (b"", ())


# -- URL parameters ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query_string", "problem"),
    [
        ("", None),
        ("size=5&from=0&typed_keys=true&rest_total_hits_as_int=true", None),
        ("track_total_hits=true&terminate_after=1", None),  # counts are recomputed
        ("filter_path=hits.hits._source&pretty&search_pipeline=rag", None),
        ("df=text&analyzer=standard", None),  # without q they do nothing
        ("q=SECRET", "'q' replaces the body's query"),
        ("%71=SECRET", "'q' replaces the body's query"),  # decoded as the database does
        ("size=1&q", "'q' replaces the body's query"),
        ("source=%7B%22SECRET%22%7D&source_content_type=application/json", "'source'"),
        ("suggest_field=text&suggest_text=SECRET", "'suggest_field'"),
        ("future_param=SECRET", "'future_param' is not known to be safe"),
        ("%0A%0D=SECRET", "URL parameter with an unusual name is not known to be safe"),
    ],
)
def test_query_string_problem(query_string: str, problem: str | None) -> None:
    found = query_string_problem(SEARCH, query_string)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
        assert "SECRET" not in found


@pytest.mark.parametrize(
    "route",
    [
        Route("GET", "/_search"),
        Route("POST", "/_msearch"),
        Route("POST", "/_search/template"),
        Route("POST", "/docs/_knn_search"),
    ],
)
def test_every_search_route_checks_its_parameters(route: Route) -> None:
    assert query_string_problem(route, "q=x") is not None
    assert query_string_problem(route, "typed_keys=true") is None


@pytest.mark.parametrize(
    "route",
    [
        Route("POST", "/_search/scroll"),
        Route("GET", "/_search/scroll"),
        Route("GET", "/_search/scroll/FGluY2x1ZGVfY29udGV4dF91dWlk"),
    ],
)
def test_a_scroll_continuation_is_refused_whatever_its_parameters(route: Route) -> None:
    # It carries no query: it continues whoever opened the scroll, for whoever holds its id.
    for query_string in ("", "typed_keys=true", "scroll_id=FGluY2x1ZGVfY29udGV4dF91dWlk"):
        found = query_string_problem(route, query_string)
        assert found is not None and "scroll" in found
        assert "FGluY2x1" not in found


@pytest.mark.parametrize("query_string", ["scroll=1m", "scroll_id=abc", "size=5&scroll=30s"])
def test_opening_or_naming_a_scroll_is_refused(query_string: str) -> None:
    for route in (SEARCH, Route("POST", "/_msearch"), Route("GET", "/_search")):
        found = query_string_problem(route, query_string)
        assert found is not None and "'scroll" in found


def test_other_routes_are_not_checked() -> None:
    for route in (Route("GET", "/docs/_doc/1"), Route("GET", "/docs/_count")):
        assert query_string_problem(route, "q=x&anything=1") is None


@pytest.mark.parametrize(
    ("query_string", "problem"),
    [
        ("", None),
        ("typed_keys=true&track_total_hits=false", None),
        ("scroll=1m", "'scroll'"),
        ("size=50", "'size'"),
        ("from=10", "'from'"),
    ],
)
def test_overfetch_problem(query_string: str, problem: str | None) -> None:
    found = overfetch_problem(SEARCH, query_string)
    assert found == problem if problem is None else problem in (found or "")
    assert overfetch_problem(Route("GET", "/docs/_doc/1"), query_string) is None


_names = st.text(alphabet="abcxyz-*", min_size=1, max_size=6).filter(lambda n: n[0] != "-")
_searches = st.fixed_dictionaries(
    {},
    optional={
        "size": st.integers(min_value=0, max_value=50),
        "query": st.fixed_dictionaries({"match": st.fixed_dictionaries({"text": st.text()})}),
        "_source": st.lists(st.sampled_from(["text", "title"]), max_size=2),
    },
)
_headers = st.fixed_dictionaries(
    {}, optional={"index": _names | st.lists(_names, min_size=1, max_size=3), "routing": _names}
)


@PROPERTIES
@given(pairs=st.lists(st.tuples(_headers, _searches), max_size=5), tenant=st.text())
def test_property_every_multi_search_line_is_confined(
    pairs: list[tuple[Body, Body]], tenant: str
) -> None:
    body = lines(*[line for pair in pairs for line in pair])
    done = rewrite(body, MSEARCH, tenant=tenant, factor=2.0)
    out = read_lines(done.body)
    assert out[0::2] == [header for header, _ in pairs]
    term = {"term": {KEY: tenant}}
    for (_, search), confined, limit in zip(
        pairs, out[1::2], done.limits or [None] * len(pairs), strict=True
    ):
        query = search.get("query", {"match_all": {}})
        assert confined["query"] == {"bool": {"filter": [term], "must": [query]}}
        assert confined.get("_source") == search.get("_source")
        asked = search.get("size", 10)
        assert limit == (asked or None)
        assert confined.get("size", 10) == (2 * asked if asked else asked)
    for header, _ in pairs:
        named = header.get("index", "*")
        for name in named if isinstance(named, list) else named.split(","):
            assert name in done.collections


def test_a_multi_search_header_with_a_duplicate_key_is_malformed() -> None:
    # Which index would the database read: the first "index" or the gate's last?
    body = b'{"index":"finance","index":"docs"}\n{}\n'
    with pytest.raises(MalformedRequest, match="same key twice"):
        rewrite(body, Route("POST", "/_msearch"))
