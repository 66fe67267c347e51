"""The Elasticsearch / OpenSearch adapter: routes, candidates, filtering, malformed bodies.

Routes follow the Elasticsearch REST API reference
(https://www.elastic.co/docs/api/doc/elasticsearch/) and the OpenSearch API reference
(https://docs.opensearch.org/latest/api-reference/), and are checked against every endpoint
the installed clients (elasticsearch-py 9, opensearch-py 3 with its plugins) can call. Body
shapes are built by ``tests/fixtures/elasticsearch_bodies.py`` (see its docstring for the spec
types they follow).

Neither client ships a validating response model, so rendered bodies are checked two ways.
Every body these tests render passes ``_check_spec``, a structural check written from the
specification's ``SearchResponse``, ``HitsMetadata``, ``Hit``, ``TotalHits``,
``ShardStatistics`` and multi-search item types. The client tests (examples and a property)
read filtered bodies back through the real clients, whose transport gets its answer from a
fake node that asks the adapter: elasticsearch-py's ``Elasticsearch`` transport with
``elasticsearch.dsl`` ``Search``, ``MultiSearch``, ``Document`` and
``elasticsearch.dsl.response.Response``, and opensearch-py's ``OpenSearch`` transport with
``opensearchpy.helpers.search`` ``Search``, ``MultiSearch`` and ``Response``.
"""

from __future__ import annotations

import ast
import copy
import warnings
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import elasticsearch
import opensearchpy
import orjson
import pytest
from elastic_transport import ApiResponseMeta, BaseNode, HttpHeaders
from elastic_transport._node import NodeApiResponse
from elasticsearch import Elasticsearch
from elasticsearch.dsl import Document, MultiSearch, Search, Text
from elasticsearch.dsl.response import Response
from elasticsearch.exceptions import GeneralAvailabilityWarning
from hypothesis import given
from hypothesis import strategies as st
from opensearchpy import OpenSearch
from opensearchpy.connection import Connection
from opensearchpy.helpers.response import Response as OpenSearchResponse
from opensearchpy.helpers.search import MultiSearch as OpenSearchMultiSearch
from opensearchpy.helpers.search import Search as OpenSearchSearch

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody, ParsedBody
from sidecar.formats.elasticsearch.rest import ElasticsearchFormat
from sidecar.formats.elasticsearch.rest_routes import RULES, endpoint, index_expression, index_names
from sidecar.formats.options import AdapterOptions
from tests.fixtures.elasticsearch_bodies import (
    AGGREGATIONS,
    INDEX,
    PROFILE,
    RAG_EXT,
    ROUTES,
    SUGGEST,
    Body,
    Hit,
    body_for,
    encode,
    error_item,
    hit,
    inner_hits,
    msearch_body,
    msearch_item,
    search_body,
)
from tests.fixtures.format_strategies import (
    PROPERTIES,
    SLOW_PROPERTIES,
    adapter,
    json_scalars,
    json_values,
)

FILTERED, READ, CONTENT, WRITE = (
    RouteKind.FILTERED,
    RouteKind.READ,
    RouteKind.CONTENT,
    RouteKind.WRITE,
)

HITS = [
    hit("a", "alpha", score=3.5, tenant="acme"),
    hit("b", "beta", score=2.0),
    hit("c", "gamma", score=1.25, tags=["x", "y"]),
    hit("d", "delta", score=0.5, nested={"k": [1, None]}),
]


def _released(item: Hit) -> Hit:
    """``item`` as the default format releases it: of its ``_source``, only the text,
    and of its highlights those of the text that quote it."""
    source = item["_source"]
    out = {**item, "_source": {k: v for k, v in source.items() if k == "text"}}
    if "highlight" in item:
        text = source.get("text")
        fragments = item["highlight"].get("text", [])
        quoting = [f for f in fragments if isinstance(text, str) and _untagged(f) in text]
        del out["highlight"]
        if quoting:
            out["highlight"] = {"text": quoting}
    return out


def _untagged(fragment: str) -> str:
    """A highlight fragment without Elasticsearch's default tags."""
    return fragment.replace("<em>", "").replace("</em>", "")


def _route(name: str) -> Route:
    return ROUTES[name][0]


def _shape(name: str) -> str:
    return ROUTES[name][1]


def _parse(body: Body, name: str = "search", fmt: ElasticsearchFormat | None = None) -> ParsedBody:
    return (fmt or ElasticsearchFormat()).parse(encode(body), _route(name))


def _render(
    body: Body,
    keep: Collection[int],
    name: str = "search",
    fmt: ElasticsearchFormat | None = None,
    replacements: Mapping[int, Replacement] | None = None,
) -> Body:
    out = _parse(body, name, fmt).render(keep, replacements=replacements)
    decoded: Body = orjson.loads(out)
    _check_spec(decoded, _shape(name))
    return decoded


# -- the specification's types, as a structural check --------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_spec(body: Body, shape: str) -> None:
    """``body`` has the types the specification gives a search or multi-search response."""
    if shape == "single":
        _check_search(body)
        return
    assert set(body) <= {"took", "responses"}
    assert isinstance(body["took"], int)
    for item in body["responses"]:
        if "error" in item:  # ErrorResponseBase
            assert isinstance(item["error"], dict)
            assert isinstance(item["error"]["type"], str)
            assert isinstance(item["status"], int)
        else:  # MultiSearchItem: a search response with its status
            _check_search(item)
            assert isinstance(item["status"], int)


def _check_search(body: Body) -> None:
    assert isinstance(body["took"], int)
    assert isinstance(body["timed_out"], bool)
    assert all(isinstance(body["_shards"][key], int) for key in ("total", "successful", "failed"))
    _check_hits_metadata(body["hits"])
    for key in ("aggregations", "suggest", "_clusters"):
        assert isinstance(body.get(key, {}), dict)
    for key in ("_scroll_id", "pit_id"):
        assert isinstance(body.get(key, ""), str)
    # Not the specification: what the adapter always removes.
    assert "profile" not in body
    assert "ext" not in body


def _check_hits_metadata(hits: Body) -> None:
    assert set(hits) <= {"total", "max_score", "hits"}
    total = hits.get("total")
    if isinstance(total, dict):
        assert set(total) == {"value", "relation"}
        assert isinstance(total["value"], int)
        assert total["relation"] in ("eq", "gte")
    else:
        assert total is None or (isinstance(total, int) and not isinstance(total, bool))
    assert hits.get("max_score") is None or _is_number(hits["max_score"])
    assert isinstance(hits["hits"], list)
    for item in hits["hits"]:
        _check_hit(item)


def _check_hit(item: Hit) -> None:
    assert isinstance(item["_index"], str)
    assert isinstance(item.get("_id", ""), str)
    assert item.get("_score") is None or _is_number(item["_score"])
    assert isinstance(item.get("_source", {}), dict)
    assert isinstance(item.get("fields", {}), dict)
    highlight = item.get("highlight", {})
    assert isinstance(highlight, dict)
    assert all(isinstance(f, str) for fragments in highlight.values() for f in fragments)
    for inner in item.get("inner_hits", {}).values():
        _check_hits_metadata(inner["hits"])
    assert isinstance(item.get("sort", []), list)
    assert isinstance(item.get("matched_queries", []), list | dict)


# -- the real clients, answered by the adapter ----------------------------------


class _Gate:
    """What the fake nodes answer: the upstream body, parsed and rendered by the adapter
    for the route the client called, which must be a filtered route."""

    def __init__(self) -> None:
        self.upstream = b""
        self.keep: Collection[int] = ()
        self.fmt = ElasticsearchFormat()
        self.replacements: Mapping[int, Replacement] = {}
        self.routes: list[Route] = []

    def serve(
        self,
        upstream: Body,
        keep: Collection[int],
        fmt: ElasticsearchFormat,
        replacements: Mapping[int, Replacement] | None = None,
    ) -> None:
        self.upstream, self.keep, self.fmt = encode(upstream), keep, fmt
        self.replacements = replacements or {}
        self.routes.clear()

    def answer(self, method: str, target: str) -> bytes:
        route = Route(method, target.partition("?")[0])
        assert self.fmt.route_kind(route) is FILTERED
        self.routes.append(route)
        parsed = self.fmt.parse(self.upstream, route)
        return parsed.render(self.keep, replacements=self.replacements)


_GATE = _Gate()


class _ElasticsearchNode(BaseNode):
    def perform_request(
        self,
        method: str,
        target: str,
        body: bytes | None = None,
        headers: HttpHeaders | None = None,
        request_timeout: Any = None,
    ) -> NodeApiResponse:
        answer_headers = HttpHeaders(
            {"content-type": "application/json", "x-elastic-product": "Elasticsearch"}
        )
        meta = ApiResponseMeta(200, "1.1", answer_headers, 0.0, self.config)
        return NodeApiResponse(meta, _GATE.answer(method, target))


class _OpenSearchConnection(Connection):
    def perform_request(
        self,
        method: str,
        url: str,
        params: Any = None,
        body: Any = None,
        timeout: Any = None,
        ignore: Any = (),
        headers: Any = None,
    ) -> tuple[int, dict[str, str], str]:
        return 200, {"content-type": "application/json"}, _GATE.answer(method, url).decode()


_ES = Elasticsearch("http://es.test:9200", node_class=_ElasticsearchNode)
_OS = OpenSearch(hosts=[{"host": "os.test", "port": 9200}], connection_class=_OpenSearchConnection)


class _Chunk(Document):
    text = Text()

    class Index:
        name = INDEX


def _ids(
    response: Response[Any] | OpenSearchResponse | None,
) -> list[tuple[str, str | None]] | None:
    """The (id, text) of each hit as the client reads them; None for an error item."""
    if response is None:
        return None
    assert response.success()
    read = [(item.meta.id, item.to_dict().get("text")) for item in response]
    if "total" in response.to_dict()["hits"]:
        hits: Any = response.hits
        total = hits.total
        assert (total if isinstance(total, int) else total.value) == len(read)
    return read


def _wrap(body: Any, shape: str) -> list[Any]:
    if shape == "single":
        return [_ids(Response(Search(), body))]
    return [
        None if "error" in item else _ids(Response(Search(), item)) for item in body["responses"]
    ]


def _read_elasticsearch(family: str, searches: int) -> list[Any]:
    """Call ``family`` through elasticsearch-py: the hit ids of each sub-response (None: error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GeneralAvailabilityWarning)
        match family:
            case "search":
                return [_ids(_Chunk.search(using=_ES).execute())]
            case "msearch":
                multi = MultiSearch(using=_ES, index=INDEX)
                for _ in range(searches):
                    multi = multi.add(Search())
                return [_ids(r) for r in multi.execute(raise_on_error=False)]
            case "scroll":
                return _wrap(_ES.scroll(scroll_id="c2Nyb2xs", scroll="1m").body, "single")
            case "template":
                return _wrap(_ES.search_template(index=INDEX, id="tpl").body, "single")
            case "knn":
                # The 9.x client dropped knn_search (8.x only); the raw call takes the same path.
                headers = {"accept": "application/json", "content-type": "application/json"}
                response = _ES.perform_request("POST", f"/{INDEX}/_knn_search", headers=headers)
                return _wrap(response.body, "single")
            case "application":
                return _wrap(_ES.search_application.search(name="app").body, "single")
            case "fleet":
                return _wrap(_ES.fleet.search(index=INDEX).body, "single")
            case "msearch-template":
                templates = [{}, {"id": "tpl"}] * searches  # header and body lines
                return _wrap(_ES.msearch_template(search_templates=templates).body, "multi")
            case "fleet-msearch":
                lines: list[dict[str, Any]] = [{}, {}] * searches
                return _wrap(_ES.fleet.msearch(index=INDEX, searches=lines).body, "multi")
    raise AssertionError(family)


def _read_opensearch(family: str, searches: int) -> list[Any]:
    """Call ``family`` through opensearch-py: the hit ids of each sub-response."""
    match family:
        case "search":
            return [_ids(OpenSearchSearch(using=_OS, index=INDEX).execute())]
        case "msearch":
            multi = OpenSearchMultiSearch(using=_OS, index=INDEX)
            for _ in range(searches):
                multi = multi.add(OpenSearchSearch())
            return [_ids(r) for r in multi.execute(raise_on_error=False)]
        case "scroll":
            return _wrap_opensearch(_OS.scroll(scroll_id="c2Nyb2xs", scroll="1m"), "single")
        case "template":
            return _wrap_opensearch(_OS.search_template(body={"id": "tpl"}, index=INDEX), "single")
        case "msearch-template":
            body = [{}, {"id": "tpl"}] * searches
            return _wrap_opensearch(_OS.msearch_template(body=body), "multi")
    raise AssertionError(family)


def _wrap_opensearch(body: Any, shape: str) -> list[Any]:
    search = OpenSearchSearch()
    if shape == "single":
        return [_ids(OpenSearchResponse(search, body))]
    return [
        None if "error" in item else _ids(OpenSearchResponse(search, item))
        for item in body["responses"]
    ]


ELASTICSEARCH_FAMILIES = {
    "search": "single",
    "scroll": "single",
    "template": "single",
    "knn": "single",
    "application": "single",
    "fleet": "single",
    "msearch": "multi",
    "msearch-template": "multi",
    "fleet-msearch": "multi",
}
OPENSEARCH_FAMILIES = {
    "search": "single",
    "scroll": "single",
    "template": "single",
    "msearch": "multi",
    "msearch-template": "multi",
}


def _read_with_clients(
    upstream: Body, shape: str, keep: Collection[int], fmt: ElasticsearchFormat | None = None
) -> Iterator[list[Any]]:
    """The ids each client reads from the filtered body, for every family of ``shape``."""
    searches = len(upstream["responses"]) if shape == "multi" else 1
    if not searches:
        return  # the clients refuse to send an empty multi-search
    for families, read in (
        (ELASTICSEARCH_FAMILIES, _read_elasticsearch),
        (OPENSEARCH_FAMILIES, _read_opensearch),
    ):
        for family, family_shape in families.items():
            if family_shape == shape:
                _GATE.serve(upstream, keep, fmt or ElasticsearchFormat())
                yield read(family, searches)
                assert _GATE.routes, family


def _expected_ids(batches: Sequence[Sequence[Hit] | None], keep: Collection[int]) -> list[Any]:
    """What ``_ids`` reads from each sub-response of the filtered body."""
    out: list[Any] = []
    position = 0
    for batch in batches:
        if batch is None:
            out.append(None)
            continue
        kept = [h for i, h in enumerate(batch, position) if i in keep]
        out.append([(h["_id"], h["_source"].get("text")) for h in kept])
        position += len(batch)
    return out


# -- routes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/_search"),
        ("POST", "/_search"),
        ("POST", "/docs/_search"),
        ("GET", "/docs,logs-*/_search"),
        ("POST", "/_all/_search"),
        ("POST", "/*/_search"),
        ("POST", "/logs-*,-logs-old/_search"),
        ("POST", "/remote:docs/_search"),
        ("POST", "/docs/_search/"),
        ("post", "/docs/_search"),
        ("GET", "/_search/scroll"),
        ("POST", "/_search/scroll"),
        ("GET", "/_search/scroll/DXF1ZXJ5QW5kRmV0Y2gBAAAAAAAAAD4WYm9laVYtZndUQlNsdDcwakFMNjU1QQ=="),
        ("GET", "/_search/template"),
        ("POST", "/docs/_search/template"),
        ("POST", "/docs/_knn_search"),
        ("GET", "/docs/_knn_search"),
        ("POST", "/_msearch"),
        ("GET", "/docs/_msearch"),
        ("POST", "/_msearch/template"),
        ("POST", "/docs/_msearch/template"),
        ("POST", "/_application/search_application/my-app/_search"),
        ("GET", "/_application/search_application/my-app/_search"),
        ("POST", "/docs/_fleet/_fleet_search"),
        ("POST", "/_fleet/_fleet_msearch"),
        ("POST", "/docs/_fleet/_fleet_msearch"),
    ],
)
def test_search_routes_are_filtered(method: str, path: str) -> None:
    assert ElasticsearchFormat().route_kind(Route(method, path)) is FILTERED


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("HEAD", "/"),
        ("GET", ""),
        ("POST", "/docs/_pit"),
        ("DELETE", "/_pit"),
        ("DELETE", "/_search/scroll"),
        ("DELETE", "/_search/scroll/c2Nyb2xs"),
        ("POST", "/docs/_search/point_in_time"),  # OpenSearch
        ("DELETE", "/_search/point_in_time/_all"),
        ("GET", "/_search/pipeline/rerank"),
        ("GET", "/_cluster/health"),
        ("GET", "/_cluster/state/metadata/docs"),
        ("GET", "/docs/_mapping"),
        ("GET", "/_mapping/field/text"),
        ("GET", "/docs/_settings"),
        ("GET", "/_all/_settings"),
        ("GET", "/_reindex/task-1"),
        ("POST", "/_analyze"),
        ("POST", "/docs/_search_shards"),
        ("POST", "/_render/template"),
        ("GET", "/_resolve/index/docs"),
        ("GET", "/_security/_authenticate"),
        ("GET", "/_ingest/pipeline"),
        ("GET", "/_watcher/watch/w1"),
        ("GET", "/_plugins/_security/whoami"),
        ("GET", "/_opendistro/_security/sslinfo"),
        ("HEAD", "/docs/_doc/1"),
        ("HEAD", "/docs/_source/1"),
        ("HEAD", "/docs/_search"),
        ("HEAD", "/_snapshot/repo/snap"),
        ("OPTIONS", "/docs/_search"),
    ],
)
def test_reads_without_content(method: str, path: str) -> None:
    assert ElasticsearchFormat().route_kind(Route(method, path)) is READ


@pytest.mark.parametrize(
    ("method", "path"),
    [
        # Document counts of every tenant.
        ("GET", "/_cat/indices"),
        ("GET", "/_cat/count/docs"),
        ("POST", "/_cat/count/docs"),
        ("GET", "/_cat/shards"),
        ("GET", "/docs/_stats"),
        ("GET", "/_stats"),
        ("GET", "/docs/_segments"),
        ("GET", "/_cluster/stats"),
        ("GET", "/_nodes/stats"),
        ("GET", "/_nodes/n1/stats/indices"),
        # Statistics, value existence and other callers' requests.
        ("GET", "/docs/_field_caps"),  # fields with values; an index_filter over values
        ("POST", "/docs/_field_caps"),
        ("GET", "/_field_caps"),
        ("POST", "/docs/_disk_usage"),
        ("GET", "/docs/_field_usage_stats"),
        ("GET", "/_tasks"),  # running requests, with their queries
        ("GET", "/_tasks/node:1"),
        ("GET", "/docs/_recovery"),
        ("GET", "/_transform/t1/_stats"),
        ("GET", "/_plugins/_knn/stats"),
        ("GET", "/_plugins/_neural/stats"),
        ("GET", "/_data_stream/logs/_stats"),
        ("GET", "/_ccr/stats"),
        ("GET", "/_enrich/_stats"),
        ("GET", "/_searchable_snapshots/stats"),
        ("GET", "/_xpack/usage"),
        ("GET", "/_cat/fielddata"),
        ("GET", "/_cat/recovery/docs"),
        ("GET", "/_cat/ml/anomaly_detectors"),
        ("GET", "/_cat/transforms"),
        ("GET", "/docs/_doc/1"),
        ("GET", "/docs/_source/1"),
        ("POST", "/_mget"),
        ("GET", "/docs/_mget"),
        ("POST", "/docs/_explain/1"),
        ("GET", "/docs/_termvectors/1"),
        ("POST", "/docs/_termvectors"),
        ("POST", "/_mtermvectors"),
        ("POST", "/docs/_async_search"),
        (
            "GET",
            "/_async_search/FmRldE8zREVEUzA2ZVpUeGs2ejJFUFEaMkZ5QTVrSTZSaVN3WlNFVmtlWHJsdzoxMDc=",
        ),
        ("POST", "/_sql"),
        ("GET", "/_sql/async/abc"),
        ("POST", "/_query"),
        ("POST", "/_query/async"),
        ("GET", "/_query/async/abc"),
        ("POST", "/docs/_eql/search"),
        ("POST", "/_plugins/_sql"),
        ("POST", "/_plugins/_ppl"),
        ("POST", "/_opendistro/_sql"),
        ("POST", "/_plugins/_asynchronous_search"),
        ("GET", "/_snapshot"),
        ("GET", "/_snapshot/repo/snap"),
        ("GET", "/_snapshot/repo/_status"),
        ("PUT", "/_snapshot/repo/snap"),
        ("POST", "/docs/_terms_enum"),
        ("POST", "/docs/_graph/explore"),
        ("POST", "/docs/_rank_eval"),
        ("POST", "/docs/_rollup_search"),
        ("POST", "/docs/_mvt/location/1/2/3"),
        ("GET", "/_insights/top_queries"),
        ("GET", "/_ml/anomaly_detectors/job/results/categories"),
        ("POST", "/_ml/datafeeds/feed/_preview"),
        ("POST", "/_transform/_preview"),
        ("POST", "/_transform/t1/_preview"),
        ("PUT", "/_watcher/watch/w1/_execute"),
        ("GET", "/_text_structure/find_field_structure"),
        ("POST", "/_plugins/_ml/agents/agent-1/_execute"),
        ("GET", "/_plugins/_ml/memory/m1/messages"),
        ("POST", "/_plugins/_ml/memory/_search"),
        ("POST", "/_plugins/_ml/models/m1/_predict"),
        ("POST", "/_plugins/_alerting/monitors/m1/_execute"),
        ("POST", "/_plugins/_transform/_preview"),
        ("GET", "/_plugins/_security_analytics/findings/_search"),
        ("GET", "/_plugins/_anomaly_detection/detectors/d1/results"),  # unknown plugin: read
        ("GET", "/_count"),  # counts any query: a match oracle
        ("POST", "/docs/_count"),
        ("POST", "/docs/_validate/query"),  # rewrites queries with terms of documents
        ("POST", "/docs/doc/_search"),  # typed paths: not read by the gate
        ("GET", "/docs/doc/1/_source"),
        ("GET", "/docs/ingestion/_state"),
        ("GET", "/_future_api"),  # unknown APIs may return documents
        ("GET", "/docs/_future_api/1"),
        ("GET", "/_search/future"),
    ],
)
def test_reads_of_stored_content(method: str, path: str) -> None:
    assert ElasticsearchFormat().route_kind(Route(method, path)) is CONTENT


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/_bulk"),
        ("PUT", "/docs/_bulk"),
        ("GET", "/_bulk"),
        ("PUT", "/docs/_doc/1"),
        ("POST", "/docs/_doc"),
        ("DELETE", "/docs/_doc/1"),
        ("POST", "/docs/_update/1"),
        ("PUT", "/docs/_create/1"),
        ("POST", "/docs/_delete_by_query"),
        ("POST", "/docs/_update_by_query"),
        ("POST", "/_reindex"),
        ("PUT", "/docs/_mapping"),
        ("PUT", "/docs/_settings"),
        ("POST", "/docs/_refresh"),
        ("POST", "/_aliases"),
        ("PUT", "/_cluster/settings"),
        ("PUT", "/_ingest/pipeline/p1"),
        ("PUT", "/_search/pipeline/rerank"),
        ("DELETE", "/_async_search/abc"),
        ("DELETE", "/_sql/async/delete/abc"),
        ("DELETE", "/_snapshot/repo/snap"),
        ("POST", "/_snapshot/repo/snap/_restore"),
        ("POST", "/_snapshot/repo/snap/_mount"),
        ("POST", "/_plugins/_ml/models/_register"),
        ("PATCH", "/_plugins/_security/api/roles"),
        ("PUT", "/docs/_search"),
        ("DELETE", "/_search"),
        ("DELETE", "/_msearch"),
        ("POST", "/_future_api"),  # unknown APIs may write
        ("POST", "/_tasks/node:1/_cancel"),
        ("PUT", "/_watcher/watch/stats"),  # a watch named "stats": not a statistics API
        ("PUT", "/docs/_doc/stats"),
    ],
)
def test_writes(method: str, path: str) -> None:
    assert ElasticsearchFormat().route_kind(Route(method, path)) is WRITE


@pytest.mark.parametrize(
    ("method", "path"),
    [
        # Other vector databases.
        ("POST", "/collections/docs/points/search"),
        ("GET", "/collections/docs"),
        ("POST", "/api/v2/tenants/t/databases/d/collections/c/query"),
        ("POST", "/v1/graphql"),
        ("GET", "/v1/objects/Doc/5c56c793-69f3-4fbf-87e6-c4bf54c28c26"),
        ("POST", "/v2/vectordb/entities/search"),
        ("POST", "/query"),
        ("GET", "/describe_index_stats"),
        ("POST", "/vectors/upsert"),
        ("GET", "/vectors/fetch"),
        ("POST", "/records/namespaces/__default__/search"),
        ("DELETE", "/namespaces/__default__"),
        # Index-level paths: the request policy's defaults for unknown routes fit them.
        ("GET", "/docs"),
        ("PUT", "/docs"),
        ("DELETE", "/docs"),
        ("POST", "/"),
        ("GET", "/_all"),
        # Not API segments.
        ("GET", "/_SEARCH"),
        ("GET", "/docs/_Search"),
        # A typed document path (Elasticsearch 7 / compatibility mode) looks like any
        # other path; the request policy refuses routes no format knows.
        ("GET", "/docs/doc/1"),
    ],
)
def test_other_paths_are_not_claimed(method: str, path: str) -> None:
    assert ElasticsearchFormat().route_kind(Route(method, path)) is None


def test_name() -> None:
    assert ElasticsearchFormat().name == "elasticsearch"


def test_parse_rejects_a_route_it_does_not_filter() -> None:
    for route in (Route("GET", "/docs/_doc/1"), Route("DELETE", "/_search"), Route("GET", "/")):
        with pytest.raises(ValueError, match="not handled"):
            ElasticsearchFormat().parse(encode(search_body(HITS)), route)


# -- every endpoint the clients know ----------------------------------------------


def _client_endpoints() -> set[tuple[str, str]]:
    """(method, path) of every endpoint elasticsearch-py and opensearch-py can call, with
    path parameters replaced by ``p``."""
    found: set[tuple[str, str]] = set()
    es_root = Path(elasticsearch.__file__).parent / "_sync" / "client"
    os_root = Path(opensearchpy.__file__).parent
    for file in [
        *es_root.glob("*.py"),
        *(os_root / "client").glob("*.py"),
        *(os_root / "plugins").glob("*.py"),
    ]:
        for function in ast.walk(ast.parse(file.read_text())):
            if isinstance(function, ast.FunctionDef):
                found.update(_function_endpoints(function))
    return found


def _function_endpoints(function: ast.FunctionDef) -> Iterator[tuple[str, str]]:
    paths: list[str] = []
    methods: set[str] = set()
    for node in ast.walk(function):
        # elasticsearch-py: __path = "/_x" or f"/{__path_parts['index']}/_x"
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__path" for t in node.targets
        ):
            paths.append(_template(node.value))
        # opensearch-py: _make_path("index", "_x", ...) or a literal path
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_make_path":
            paths.append("/" + "/".join(_template(arg) for arg in node.args))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "perform_request":
            for arg in node.args[:2]:
                for constant in ast.walk(arg):
                    if isinstance(constant, ast.Constant) and isinstance(constant.value, str):
                        if constant.value.isupper():
                            methods.add(constant.value)
                        elif constant.value.startswith("/"):
                            paths.append(constant.value)
    for path in paths:
        for method in methods:
            yield method, path


def _template(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_template(part) for part in node.values)
    return "p"


CLIENT_ENDPOINTS = sorted(_client_endpoints())


def test_client_endpoints_were_found() -> None:
    paths = {path for _, path in CLIENT_ENDPOINTS}
    assert len(paths) > 700
    assert {"/p/_search", "/_msearch", "/_plugins/_sql", "/p/_doc/p"} <= paths


def test_every_client_endpoint_is_known() -> None:
    """No endpoint of either client falls back to the rule for unknown APIs, and the only
    unclaimed ones are index-level paths, which the request policy's defaults fit."""
    unclaimed = set()
    for method, path in CLIENT_ENDPOINTS:
        found = endpoint(path)
        if found is None:
            unclaimed.add(path)
        else:
            assert found[0] in RULES, (method, path)
            assert ElasticsearchFormat().route_kind(Route(method, path)) is not None
    assert unclaimed == {
        "/",
        "/p",
        "/p/ingestion/_pause",
        "/p/ingestion/_resume",
        "/p/ingestion/_state",
    }


def test_client_search_endpoints_are_exactly_the_filtered_ones() -> None:
    fmt = ElasticsearchFormat()
    filtered = {path for m, path in CLIENT_ENDPOINTS if fmt.route_kind(Route(m, path)) is FILTERED}
    assert filtered == {
        "/_search",
        "/p/_search",
        "/_search/scroll",
        "/_search/template",
        "/p/_search/template",
        "/_msearch",
        "/p/_msearch",
        "/_msearch/template",
        "/p/_msearch/template",
        "/p/_fleet/_fleet_search",
        "/_fleet/_fleet_msearch",
        "/p/_fleet/_fleet_msearch",
        "/_application/search_application/p/_search",
    }


def test_no_client_endpoint_that_returns_documents_is_a_read() -> None:
    fmt = ElasticsearchFormat()
    for method, path in CLIENT_ENDPOINTS:
        if method == "GET" and any(
            marker in path for marker in ("/_doc/", "/_source/", "_mget", "_termvectors", "_sql")
        ):
            assert fmt.route_kind(Route(method, path)) is CONTENT, path


@pytest.mark.parametrize(
    "path",
    [
        "/docs/_doc/1",  # existence and size of a document
        "/docs/_source/1",
        "/docs/_search",  # the unfiltered body's length
        "/_search",
        "/docs/_msearch",
        "/_search/scroll/c2Nyb2xs",
        "/docs/_knn_search",
        "/docs/_count",
        "/docs/_termvectors/1",
    ],
)
def test_a_head_request_probes_a_get_that_returns_chunks(path: str) -> None:
    """The request path refuses HEAD where GET returns chunks (filtered or content):
    the adapter must say so of GET, whatever it answers for HEAD itself."""
    fmt = ElasticsearchFormat()
    assert fmt.route_kind(Route("GET", path)) in (FILTERED, CONTENT)
    assert fmt.route_kind(Route("HEAD", path)) is READ


def test_every_client_head_endpoint_is_a_probe_of_content_or_harmless() -> None:
    """HEAD endpoints of the clients: document existence probes GET content; the rest
    (alias and template existence, the root) are reads, and an index's existence is
    claimed by no format (refused unless the policy allows unknown routes)."""
    fmt = ElasticsearchFormat()
    kinds = {
        path: fmt.route_kind(Route("GET", path))
        for method, path in CLIENT_ENDPOINTS
        if method == "HEAD"
    }
    assert kinds == {
        "/": READ,
        "/_alias/p": READ,
        "/_component_template/p": READ,
        "/_index_template/p": READ,
        "/_template/p": READ,
        "/p": None,
        "/p/_alias/p": READ,
        "/p/_doc/p": CONTENT,
        "/p/_source/p": CONTENT,
    }


# -- index expressions ----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "names"),
    [
        ("/docs/_search", ["docs"]),
        ("/docs", ["docs"]),
        ("/docs/_doc/1", ["docs"]),
        ("/docs/doc/1", ["docs"]),  # a typed path: the index is first all the same
        ("/docs,logs-*/_search", ["docs", "logs-*"]),
        ("/docs,docs/_search", ["docs"]),
        ("/_all/_search", ["*"]),
        ("/_all", ["*"]),
        ("/*/_search", ["*"]),
        ("/docs,_all/_search", ["docs", "*"]),
        ("/logs-*,-logs-old/_search", ["logs-*"]),  # exclusions only narrow
        ("/-logs-old/_search", ["*"]),
        ("/remote:docs/_search", ["remote:docs"]),
        ("/*:docs,docs/_search", ["*:docs", "docs"]),
        ("/remote:_all/_search", ["remote:*"]),
        ("/docs::failures/_search", ["docs"]),
        ("/+docs/_search", ["docs"]),
        ("/<logs-{now}>/_search", ["logs-*"]),
        ("/_search", ["*"]),  # every index
        ("/_search/template", ["*"]),
        ("/_count", ["*"]),
        ("/_mapping", ["*"]),
        ("/_mget", ["*"]),  # documents name their index in the body
        ("/_sql", ["*"]),  # the query names its indices
        ("/_application/search_application/app/_search", ["*"]),
        ("/_cat/count/docs,logs", ["docs", "logs"]),
        ("/_cat/indices", ["*"]),
        ("/_resolve/index/docs*", ["docs*"]),
        ("/_msearch", None),  # the header lines name the indices
        ("/_msearch/template", None),
        ("/_fleet/_fleet_msearch", None),
        ("/_search/scroll", None),  # continues a search already checked
        ("/_search/scroll/c2Nyb2xs", None),
        ("/_pit", None),
        ("/_cluster/health", None),
        ("/_cat/health", None),
        ("/", None),
        ("", None),
    ],
)
def test_index_expression(path: str, names: list[str] | None) -> None:
    assert index_expression(Route("GET", path)) == names
    assert ElasticsearchFormat().route_collections(Route("POST", path)) == names


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("<logs-{now/d}>", ["logs-*"]),
        ("<logs-{now/d{yyyy.MM.dd|+12:00}}>", ["logs-*"]),  # a time zone holds ":"
        ("remote:<logs-{now/M}-x>", ["remote:logs-*-x"]),
        ("<logs-\\{literal\\}-{now}>", ["logs-{literal}-*"]),
        ("<logs-{now>", ["*"]),  # unbalanced: every name
        ("<logs-}now>", ["*"]),
        ("<logs-{now}\\>", ["*"]),
        ("<plain>", ["plain"]),
        ("", ["*"]),
        (",", ["*"]),
        ("a,,b", ["a", "b"]),
    ],
)
def test_index_names(expression: str, names: list[str]) -> None:
    assert index_names(expression) == names


# -- candidates ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_candidates_number_hits_in_document_order(name: str) -> None:
    batches = [HITS[:3], HITS[3:]]
    body = body_for(_shape(name), batches)
    hits = HITS[:3] if _shape(name) == "single" else HITS
    assert list(_parse(body, name).candidates) == [
        Candidate(i, h["_id"], h["_source"]["text"]) for i, h in enumerate(hits)
    ]


def _one(item: Hit, fmt: ElasticsearchFormat | None = None) -> Candidate:
    (candidate,) = _parse(search_body([item]), fmt=fmt).candidates
    return candidate


def _bare(**fields: Any) -> Hit:
    return {"_index": INDEX, "_score": 1.0, **fields}


@pytest.mark.parametrize(
    ("item", "chunk_id", "text", "problem"),
    [
        (_bare(_id="a", _source={"text": "t"}), "a", "t", None),
        (_bare(_id="a", _source={"text": ""}), "a", "", None),
        (_bare(_id="a"), "a", None, "no _source"),
        (_bare(_id="a", _source=None), "a", None, "no _source"),
        (_bare(_id="a", _source=["SECRET"]), "a", None, "_source is not an object"),
        (_bare(_id="a", _source={}), "a", None, "_source field 'text' missing"),
        (_bare(_id="a", _source={"text": None}), "a", None, "_source field 'text' missing"),
        (
            _bare(_id="a", _source={"text": ["t"]}),
            "a",
            None,
            "_source field 'text' is not a string",
        ),
        (
            _bare(_id="a", _source={"other": "t"}, fields={"text": ["t"]}),
            "a",
            None,
            "_source field 'text' missing",
        ),
        (_bare(_source={"text": "t"}), None, "t", "_id missing"),
        (_bare(_id="", _source={"text": "t"}), None, "t", "_id is empty"),
        (_bare(_id=True, _source={"text": "t"}), None, "t", "_id is not a string or integer"),
        (_bare(_id=["x"], _source={"text": "t"}), None, "t", "_id is not a string or integer"),
        (_bare(_id=7, _source={"text": "t"}), "7", "t", None),
        (_bare(_id=""), None, None, "_id is empty; no _source"),
    ],
)
def test_candidate_from_hit(
    item: Hit, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    assert _one(item) == Candidate(0, chunk_id, text, problem)


@pytest.mark.parametrize(
    ("source", "chunk_id", "text", "problem"),
    [
        ({"chunk": "c-1", "body": "b"}, "c-1", "b", None),
        ({"chunk": 12, "body": "b"}, "12", "b", None),
        ({"body": "b"}, None, "b", "_source field 'chunk' missing"),
        ({"chunk": "", "body": "b"}, None, "b", "_source field 'chunk' is empty"),
        (
            {"chunk": {"s": 1}, "body": "b"},
            None,
            "b",
            "_source field 'chunk' is not a string or integer",
        ),
        ({"chunk": "c-1", "text": "wrong field"}, "c-1", None, "_source field 'body' missing"),
        (None, None, None, "no _source"),
        ("SECRET", None, None, "_source is not an object"),
    ],
)
def test_candidate_from_source_fields(
    source: Any, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    fmt = ElasticsearchFormat(AdapterOptions(text_field="body", id_field="chunk"))
    assert _one(_bare(_id="ignored", _source=source), fmt) == Candidate(0, chunk_id, text, problem)


def test_problems_never_contain_values() -> None:
    candidate = _one(_bare(_id=["SECRET-ID"], _source={"text": {"v": "SECRET-TEXT"}}))
    assert candidate.problem is not None
    assert "SECRET" not in candidate.problem


# -- filtering ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ROUTES))
@pytest.mark.parametrize("keep", [set(), {0}, {1, 3}, {0, 2, 3}, set(range(4)), {3, 99, -1}])
def test_render_keeps_exactly_the_kept_hits(name: str, keep: set[int]) -> None:
    shape = _shape(name)
    batches = [HITS] if shape == "single" else [HITS[:1], HITS[1:]]
    out = _render(body_for(shape, batches), keep, name)
    kept = [[_released(h) for i, h in enumerate(HITS) if i in keep]]
    if shape == "multi":
        kept = [
            kept[0][: 1 if 0 in keep else 0],
            [_released(h) for i, h in enumerate(HITS) if i in keep and i],
        ]
    assert out == body_for(shape, kept, relation="eq")


def test_render_all_is_the_original_body_when_it_holds_only_what_is_released() -> None:
    hits = [_released(h) for h in HITS]
    for name in ROUTES:
        body = body_for(_shape(name), [hits[:2], hits[2:]])
        assert _render(body, range(4), name) == body


@pytest.mark.parametrize(
    ("upstream", "expected"),
    [
        ({}, {"value": 2, "relation": "eq"}),  # every match returned
        ({"total": 4}, {"value": 2, "relation": "eq"}),
        # More matched than returned (of any tenant): the caller learns only what it got.
        ({"total": 10}, {"value": 2, "relation": "eq"}),
        ({"total": 10000, "relation": "gte"}, {"value": 2, "relation": "eq"}),
        ({"total": 4, "relation": "gte"}, {"value": 2, "relation": "eq"}),
        ({"total_as_int": True}, 2),
        ({"total": 10, "total_as_int": True}, 2),
    ],
)
def test_total_counts_the_released_hits(upstream: dict[str, Any], expected: Any) -> None:
    out = _render(search_body(HITS, **upstream), {1, 3})
    assert out["hits"]["total"] == expected


@pytest.mark.parametrize("total", [0, 1, 10_000])
@pytest.mark.parametrize("relation", ["eq", "gte"])
def test_a_size_0_search_says_nothing_about_other_matches(total: int, relation: str) -> None:
    # The match oracle of issue 11: size 0, and eq or gte depending on whether
    # any document of any tenant matched. The answer is the same for every upstream.
    body = search_body([], total=total, relation=relation)
    body["terminated_early"] = total > 0
    body["_shards"]["skipped"] = 1 if total == 0 else 0
    out = _render(body, set())
    assert out == search_body([], total=0, relation="eq")


def test_total_absent_stays_absent() -> None:
    out = _render(search_body(HITS, track_total=False), {1})
    assert "total" not in out["hits"]
    assert out["hits"]["hits"] == [_released(HITS[1])]


def test_total_can_be_removed() -> None:
    fmt = ElasticsearchFormat(total="remove")
    for upstream in ({}, {"total_as_int": True}, {"total": 9, "relation": "gte"}):
        out = _render(search_body(HITS, **upstream), {0}, fmt=fmt)
        assert out["hits"] == {"max_score": 3.5, "hits": [_released(HITS[0])]}


@pytest.mark.parametrize(
    ("keep", "max_score"), [({0, 1}, 3.5), ({1, 2}, 2.0), ({3}, 0.5), (set(), None)]
)
def test_max_score_is_the_best_kept_score(keep: set[int], max_score: float | None) -> None:
    body = search_body(HITS)
    body["max_score"] = 3.5  # the specification also allows it at the top level
    out = _render(body, keep)
    assert out["hits"]["max_score"] == max_score
    assert out["max_score"] == max_score


def test_max_score_stays_null_when_upstream_had_none() -> None:
    # Sorted searches without track_scores: null scores, null max_score.
    hits = [hit("a", "alpha", score=None), hit("b", "beta", score=None)]
    hits[0]["sort"] = [5]
    out = _render(search_body(hits), {0})
    assert out["hits"]["max_score"] is None
    assert out["hits"]["hits"] == [hits[0]]


def test_max_score_ignores_kept_hits_without_score() -> None:
    hits = [hit("a", "alpha", score=None), hit("b", "beta", score=0.7)]
    body = search_body(hits)
    body["hits"]["max_score"] = 0.7
    assert _render(body, {0})["hits"]["max_score"] is None
    assert _render(body, {0, 1})["hits"]["max_score"] == 0.7


def _with_side_structures() -> Body:
    items = [dict(h) for h in HITS]
    items[0]["inner_hits"] = inner_hits("same_doc", [hit("other", "collapsed document")])
    items[0]["highlight"] = {"text": ["<em>alpha</em>"]}
    items[1]["matched_queries"] = ["q1"]
    items[1]["_explanation"] = {"value": 2.0, "description": "sum of:", "details": []}
    body = search_body(items, total=40)
    body.update(
        {
            "aggregations": AGGREGATIONS,
            "suggest": SUGGEST,
            "profile": PROFILE,
            "ext": RAG_EXT,
            "_scroll_id": "c2Nyb2xsLWlk",
            "pit_id": "cGl0LWlk",
            "_clusters": {
                "total": 1,
                "successful": 1,
                "skipped": 0,
                "running": 0,
                "partial": 0,
                "failed": 0,
            },
            "num_reduce_phases": 2,
            "terminated_early": False,
            "phase_took": {"query": 3, "fetch": 1},
            "fields": {"computed": ["over every document"]},
            "x-future": {"unknown": True},
        }
    )
    return body


def test_side_structures_are_removed_by_default() -> None:
    body = _with_side_structures()
    out = _render(body, {0, 1})
    assert list(out) == [
        "took",
        "timed_out",
        "_shards",
        "hits",
        "pit_id",
        "_clusters",
        "num_reduce_phases",
    ]
    # terminated_early and phase_took describe the search over every document.
    for key in ("pit_id", "_clusters", "num_reduce_phases", "_shards"):
        assert out[key] == body[key]
    # A scroll continues whoever opened it, for whoever holds the id.
    assert "_scroll_id" not in out
    first, second = out["hits"]["hits"]
    # inner_hits may be other documents; the hit's own highlight of the text stays.
    assert first == _released(HITS[0]) | {"highlight": {"text": ["<em>alpha</em>"]}}
    # An explanation's statistics count every tenant's documents.
    assert second == _released(HITS[1]) | {"matched_queries": ["q1"]}
    assert out["hits"]["total"] == {"value": 2, "relation": "eq"}


def test_side_structures_are_kept_when_asked() -> None:
    body = _with_side_structures()
    fmt = ElasticsearchFormat(aggregations="keep", suggest="keep", inner_hits="keep")
    out = _render(body, {0}, fmt=fmt)
    assert out["aggregations"] == AGGREGATIONS
    assert out["suggest"] == SUGGEST
    assert out["hits"]["hits"] == [_released(body["hits"]["hits"][0])]
    # Profiles, pipeline output and unknown keys go whatever the options.
    assert not {"profile", "ext", "fields", "x-future", "phase_took"} & set(out)


def test_each_option_is_independent() -> None:
    body = _with_side_structures()
    out = _render(body, {0}, fmt=ElasticsearchFormat(suggest="keep"))
    assert "suggest" in out
    assert "aggregations" not in out
    assert "inner_hits" not in out["hits"]["hits"][0]


def test_fields_keep_only_released_source_paths_without_lookup_shapes() -> None:
    item = hit("a", "alpha")
    item["fields"] = {
        "text": ["alpha"],
        "text.keyword": ["alpha"],
        "title": ["A title"],
        "metadata.source": ["s3://bucket/a"],
        "metadata.page": [3],
        "metadata_other": ["not under metadata"],
        "secret": ["unreleased"],
        "location": [{"type": "Point", "coordinates": [13.4, 52.5]}],
        # A lookup runtime field (objects of value lists) copies another index's fields.
        "author": [{"name": ["from another index"], "email": ["x@example.com"]}],
    }
    fmt = ElasticsearchFormat(
        AdapterOptions(
            hashed_fields=["title"], releasable_fields=["metadata", "location", "author"]
        )
    )
    out = _render(search_body([item]), {0}, fmt=fmt)
    assert out["hits"]["hits"][0]["fields"] == {
        "text": ["alpha"],
        "text.keyword": ["alpha"],
        "title": ["A title"],
        "metadata.source": ["s3://bucket/a"],
        "metadata.page": [3],
        "location": [{"type": "Point", "coordinates": [13.4, 52.5]}],
    }


def test_fields_left_empty_are_removed() -> None:
    item = hit("a", "alpha")
    item["fields"] = {"secret": ["unreleased"]}
    assert _render(search_body([item]), {0})["hits"]["hits"] == [hit("a", "alpha")]


def test_fields_of_the_id_field_are_released() -> None:
    item = {"_index": INDEX, "_id": "x", "_score": 1.0, "_source": {"chunk": "c", "text": "t"}}
    item["fields"] = {"chunk": ["c"], "other": [1]}
    out = _render(
        search_body([item]), {0}, fmt=ElasticsearchFormat(AdapterOptions(id_field="chunk"))
    )
    assert out["hits"]["hits"][0]["fields"] == {"chunk": ["c"]}


@pytest.mark.parametrize(
    ("highlight", "expected"),
    [
        ({"text": ["<em>alpha</em>"], "title": ["<em>other</em> field"]}, ["<em>alpha</em>"]),
        ({"text.english": ["<em>alpha</em>"]}, None),  # a sub-field: not the text checked
        ({"title": ["<em>other</em>"]}, None),
        ({"text": "not a list"}, None),
        ({"text": [1]}, None),
        ("not an object", None),
    ],
)
def test_highlight_keeps_only_the_text_fields_fragments(highlight: Any, expected: Any) -> None:
    item = hit("a", "alpha")
    item["highlight"] = highlight
    parsed = _parse(search_body([item]))
    (out,) = orjson.loads(parsed.render({0}))["hits"]["hits"]
    assert out.get("highlight") == (None if expected is None else {"text": expected})


@pytest.mark.parametrize(
    "fragment",
    [
        "<em>alpha</em>",
        "alpha",  # no_match_size: the start of the field, untagged
        '<em class="hlt3">alpha</em>',  # tags_schema: styled
        "<em></em>",
    ],
)
def test_a_fragment_quoting_the_released_text_goes_out(fragment: str) -> None:
    item = hit("a", "alpha beta")
    item["highlight"] = {"text": [fragment]}
    (out,) = orjson.loads(_parse(search_body([item])).render({0}))["hits"]["hits"]
    assert out["highlight"] == {"text": [fragment]}


@pytest.mark.parametrize(
    "fragment",
    [
        "<em>gamma</em> from another tenant's document",  # not this hit's text
        "<em>alpha</em> beta and more",  # longer than the text
        "<b>alpha</b>",  # other tags: the gate cannot tell them from text
        "&lt;alpha&gt;",  # HTML-encoded: neither
        '<em class="hlt11">alpha</em>',  # not a styled tag
    ],
)
def test_a_fragment_that_does_not_quote_the_released_text_goes(fragment: str) -> None:
    item = hit("a", "alpha beta")
    item["highlight"] = {"text": ["<em>alpha</em>", fragment]}
    (out,) = orjson.loads(_parse(search_body([item])).render({0}))["hits"]["hits"]
    assert out["highlight"] == {"text": ["<em>alpha</em>"]}
    item["highlight"] = {"text": [fragment]}
    (out,) = orjson.loads(_parse(search_body([item])).render({0}))["hits"]["hits"]
    assert "highlight" not in out


def test_highlights_of_released_fields_go_out_when_they_quote_their_values() -> None:
    fmt = ElasticsearchFormat(AdapterOptions(releasable_fields=["title", "meta.tags"]))
    item = hit("a", "alpha", title="Quarterly report", meta={"tags": ["x-ray", "yankee"]})
    item["_source"]["secret"] = "acme merger"
    item["highlight"] = {
        "title": ["<em>Quarterly</em> report", "<em>Annual</em> report"],
        "meta.tags": ["<em>yankee</em>"],
        "secret": ["<em>acme</em> merger"],  # a field that does not go out
    }
    (out,) = orjson.loads(fmt.parse(encode(search_body([item])), _route("search")).render({0}))[
        "hits"
    ]["hits"]
    assert out["highlight"] == {
        "title": ["<em>Quarterly</em> report"],
        "meta.tags": ["<em>yankee</em>"],
    }


def test_a_scroll_id_never_goes_out() -> None:
    body = {**search_body(HITS[:1]), "_scroll_id": "FGluY2x1ZGVfY29udGV4dF91dWlk"}
    for keep in ({0}, set()):
        assert "_scroll_id" not in orjson.loads(_parse(body).render(keep))


def test_hits_keep_only_elasticsearchs_own_keys() -> None:
    own = {
        "_index": INDEX,
        "_id": "a",
        "_score": 1.0,
        "_source": {"text": "alpha"},
        "_routing": "acme",
        "_version": 3,
        "_seq_no": 7,
        "_primary_term": 1,
        "sort": [1.0, "a"],
        "matched_queries": {"q1": 1.0},
        "_nested": {"field": "chunks", "offset": 0},
        "_shard": "[docs][0]",
        "_node": "n1",
        "_ignored": ["title.keyword"],
        "_rank": 1,
        "_type": "_doc",
    }
    other = {
        "_explanation": {"value": 1.0, "description": "idf, docFreq=12", "details": []},
        "_ignored_field_values": {"secret": ["x"]},
        "x-future": {"anything": True},
    }
    out = _render(search_body([own | other]), {0})
    assert out["hits"]["hits"] == [own]


def test_source_keeps_only_the_text_id_and_declared_fields() -> None:
    source = {
        "text": "alpha",
        "chunk": "c-1",
        "title": "T",
        "metadata": {"source": "s3://a", "page": 2, "owner": "x"},
        "secret": "s",
    }
    item = {"_index": INDEX, "_id": "x", "_score": 1.0, "_source": source}
    fmt = ElasticsearchFormat(
        AdapterOptions(
            id_field="chunk", hashed_fields=["title"], releasable_fields=["metadata.source"]
        )
    )
    (out,) = _render(search_body([item]), {0}, fmt=fmt)["hits"]["hits"]
    assert out["_source"] == {
        "text": "alpha",
        "chunk": "c-1",
        "title": "T",
        "metadata": {"source": "s3://a"},
    }


def test_hashed_fields_reach_the_candidate() -> None:
    item = hit("a", "alpha", title="T", secret="s")
    fmt = ElasticsearchFormat(AdapterOptions(hashed_fields=["title"]))
    (candidate,) = _parse(search_body([item]), fmt=fmt).candidates
    assert candidate.fields == '{"title":"T"}'


def test_render_preserves_key_order_and_other_fields() -> None:
    body = {
        "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
        "hits": {
            "hits": [_released(HITS[0]), _released(HITS[1])],
            "max_score": 3.5,
            "total": {"relation": "eq", "value": 2},
        },
        "timed_out": False,
        "took": 1,
    }
    out = _parse(body).render({1})
    assert out == orjson.dumps(
        {
            "_shards": body["_shards"],
            "hits": {
                "hits": [_released(HITS[1])],
                "max_score": 2.0,
                "total": {"value": 1, "relation": "eq"},  # rebuilt
            },
            "timed_out": False,
            "took": 1,
        }
    )


def test_render_can_be_called_again_and_never_mutates() -> None:
    body = _with_side_structures()
    original = copy.deepcopy(body)
    parsed = _parse(body)
    first = parsed.render({0, 2})
    replaced = parsed.render({0, 1}, replacements={0: Replacement("new", "new text")})
    assert orjson.loads(parsed.render(set()))["hits"]["hits"] == []
    assert parsed.render({0, 2}) == first
    assert orjson.loads(replaced)["hits"]["hits"][0]["_id"] == "new"
    assert parsed.render({0, 2}) == first
    assert body == original


def test_released_positions_are_the_kept_ones() -> None:
    parsed = _parse(body_for("multi", [HITS[:2], HITS[2:]]), "msearch")
    assert parsed.released_positions({3, 0, 7}) == [0, 3]
    assert parsed.released_positions(set(), None) == []


@pytest.mark.parametrize(
    ("limits", "expected"), [((2,), [0, 1]), ([None], [0, 1, 3]), ((), [0, 1, 3])]
)
def test_render_trims_to_the_apps_limit(limits: Sequence[int | None], expected: list[int]) -> None:
    # An over-fetched search (the request asked for more than the app did).
    parsed = _parse(search_body(HITS))
    out = orjson.loads(parsed.render({0, 1, 3}, limits))
    assert out == search_body([_released(HITS[i]) for i in expected])
    assert parsed.released_positions({0, 1, 3}, limits) == expected


def test_render_trims_each_multi_search_item() -> None:
    body = msearch_body([msearch_item(HITS[:2]), error_item(), msearch_item(HITS[2:])])
    parsed = _parse(body, "msearch")
    assert parsed.released_positions(range(4), (1, None, None)) == [0, 2, 3]
    assert parsed.released_positions(range(4), (None, 5, 1)) == [0, 1, 2]


@pytest.mark.parametrize(("name", "limits"), [("search", (1, 1)), ("msearch", (1,))])
def test_render_refuses_limits_for_other_sub_results(
    name: str, limits: Sequence[int | None]
) -> None:
    parsed = _parse(body_for(_shape(name), [HITS[:2], HITS[2:]]), name)
    with pytest.raises(MalformedBody, match="sub-results"):
        parsed.render(range(4), limits)
    with pytest.raises(MalformedBody, match="sub-results"):
        parsed.released_positions(range(4), limits)


# -- multi-search -----------------------------------------------------------------


def _reduced(status: int = 404) -> dict[str, object]:
    """An error item as the gate writes it: the upstream's status and no upstream text."""
    reason = "the search failed in the database; its error is not released"
    return {"error": {"type": "retrieval_gate_upstream_error", "reason": reason}, "status": status}


def test_multi_search_error_items_keep_only_their_status() -> None:
    body = msearch_body(
        [error_item(), msearch_item(HITS[:2], total=5), error_item(400), msearch_item(HITS[2:])]
    )
    parsed = _parse(body, "msearch")
    assert [c.chunk_id for c in parsed.candidates] == ["a", "b", "c", "d"]
    out = _render(body, {1, 3}, "msearch")
    assert out == msearch_body(
        [
            _reduced(),
            msearch_item([_released(HITS[1])]),
            _reduced(400),
            msearch_item([_released(HITS[3])]),
        ]
    )
    assert b"index_not_found" not in orjson.dumps(out)


@pytest.mark.parametrize("status", [None, "404", True, 4.5])
def test_an_error_items_odd_status_becomes_500(status: Any) -> None:
    item: dict[str, Any] = {"error": {"type": "script_exception", "reason": "quotes a document"}}
    if status is not None:
        item["status"] = status
    out = _render(msearch_body([item]), set(), "msearch")
    assert out == msearch_body([_reduced(500)])


def test_shard_failures_are_dropped_and_skipped_shards_count_as_successful() -> None:
    # A script error on a removed hit can quote its _source in the reason; a shard the
    # can-match phase skipped had no document (of any tenant) that could match.
    body = search_body(HITS[:2])
    body["_shards"] = {
        "total": 4,
        "successful": 3,
        "skipped": 2,
        "failed": 1,
        "failures": [{"shard": 0, "reason": {"type": "script_exception", "caused_by": "x"}}],
    }
    out = _render(body, {0})
    assert out["_shards"] == {"total": 4, "successful": 3, "skipped": 0, "failed": 1}


def test_clusters_keep_their_counts_only() -> None:
    body = search_body(HITS[:1])
    counts = {"total": 2, "successful": 1, "skipped": 1, "running": 0, "partial": 0, "failed": 0}
    details = {"remote": {"status": "skipped", "failures": [{"reason": {"type": "x"}}]}}
    body["_clusters"] = {**counts, "details": details}
    assert _render(body, {0})["_clusters"] == counts


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("took", "7"),
        ("took", True),
        ("timed_out", 0),
        ("num_reduce_phases", {"n": 2}),
        ("_scroll_id", ["id"]),
        ("pit_id", 1),
        ("_shards", "all"),
        ("_clusters", ["x"]),
    ],
)
def test_known_keys_of_an_unexpected_type_are_removed(key: str, value: Any) -> None:
    body = search_body(HITS[:1])
    body[key] = value
    out = orjson.loads(_parse(body).render({0}))
    assert key not in out


def test_multi_search_items_lose_their_side_structures() -> None:
    item = {**msearch_item(HITS), "aggregations": AGGREGATIONS, "profile": PROFILE}
    body = {"took": 3, "responses": [item], "x-future": 1}
    out = _render(body, {0}, "msearch")
    assert out == {"took": 3, "responses": [msearch_item([_released(HITS[0])])]}


def test_multi_search_keeps_key_order() -> None:
    body = {"responses": [msearch_item(HITS)], "took": 3}
    assert list(orjson.loads(_parse(body, "msearch").render({0}))) == ["responses", "took"]


def test_empty_multi_search() -> None:
    body = msearch_body([])
    parsed = _parse(body, "msearch")
    assert parsed.candidates == ()
    assert orjson.loads(parsed.render(set())) == body


# -- substitution -----------------------------------------------------------------


def test_replacement_takes_the_hit_id_and_text() -> None:
    items = [dict(h) for h in HITS[:2]]
    items[0]["highlight"] = {"text": ["<em>alpha</em> old revision"]}
    items[0]["fields"] = {"text": ["alpha"], "text.keyword": ["alpha"], "year": [2020]}
    items[0]["sort"] = [3.5, "a"]
    fmt = ElasticsearchFormat(AdapterOptions(releasable_fields=["tenant", "year"]))
    out = _render(
        search_body(items), {0, 1}, fmt=fmt, replacements={0: Replacement("a-v2", "alpha v2")}
    )
    first = out["hits"]["hits"][0]
    assert first == {
        "_index": INDEX,
        "_id": "a-v2",
        "_score": 3.5,
        # Declared fields, highlights and fields entries describe the replaced document.
        "_source": {"text": "alpha v2", SUBSTITUTED_FOR: "a"},
        "sort": [3.5, "a"],
    }
    assert out["hits"]["hits"][1] == _released(HITS[1])


def test_replacement_with_id_field() -> None:
    fmt = ElasticsearchFormat(AdapterOptions(text_field="body", id_field="chunk"))
    item = {
        "_index": INDEX,
        "_id": "es-1",
        "_score": 1.0,
        "_source": {"chunk": "c-1", "body": "old"},
    }
    out = _render(search_body([item]), {0}, fmt=fmt, replacements={0: Replacement("c-2", "new")})
    assert out["hits"]["hits"] == [
        {
            "_index": INDEX,
            "_id": "es-1",
            "_score": 1.0,
            "_source": {"chunk": "c-2", "body": "new", SUBSTITUTED_FOR: "c-1"},
        }
    ]


def test_replacement_in_a_multi_search() -> None:
    body = msearch_body([msearch_item(HITS[:2]), msearch_item(HITS[2:])])
    out = _render(body, {0, 2}, "msearch", replacements={2: Replacement("z", "zeta")})
    replaced = out["responses"][1]["hits"]["hits"][0]
    assert (replaced["_id"], replaced["_source"]["text"]) == ("z", "zeta")
    assert replaced["_source"][SUBSTITUTED_FOR] == "c"


def test_replacement_for_a_rejected_position_is_ignored() -> None:
    out = _render(search_body(HITS), {1}, replacements={0: Replacement("x", "y")})
    assert out["hits"]["hits"] == [_released(HITS[1])]


# -- options ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"total": "keep"}, "total"),
        ({"aggregations": "drop"}, "aggregations"),
        ({"suggest": True}, "suggest"),
        ({"inner_hits": None}, "inner_hits"),
        ({"text_field": ""}, "text_field"),
        ({"id_field": ""}, "id_field"),
    ],
)
def test_invalid_options_name_the_option(options: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        adapter(ElasticsearchFormat, **options)


# -- the real clients ---------------------------------------------------------------


@pytest.mark.parametrize("shape", ["single", "multi"])
@pytest.mark.parametrize("keep", [set(), {0}, {1, 2}, set(range(4))])
def test_clients_read_the_filtered_bodies(shape: str, keep: set[int]) -> None:
    hit_batches = [HITS] if shape == "single" else [HITS[:1], HITS[1:]]
    batches: list[list[Hit] | None] = list(hit_batches)
    upstream = _with_side_structures() if shape == "single" else body_for(shape, hit_batches)
    if shape == "single":
        upstream["hits"]["hits"] = HITS
    expected = _expected_ids(batches, keep)
    reads = list(_read_with_clients(upstream, shape, keep))
    assert len(reads) == (9 if shape == "single" else 5)
    for read in reads:
        assert read == expected


def test_clients_read_multi_search_error_items() -> None:
    batches: list[list[Hit] | None] = [HITS[:3], None, HITS[3:], None]
    upstream = msearch_body([error_item() if b is None else msearch_item(b) for b in batches])
    for read in _read_with_clients(upstream, "multi", {0, 3}):
        assert read == _expected_ids(batches, {0, 3})


def test_document_search_reads_the_substituted_text() -> None:
    replacements = {1: Replacement("b2", "beta v2")}
    _GATE.serve(search_body(HITS), {1, 2}, ElasticsearchFormat(), replacements)
    docs: list[Any] = list(_Chunk.search(using=_ES).execute())
    assert [(d.meta.id, d.text) for d in docs] == [("b2", "beta v2"), ("c", "gamma")]
    assert docs[0].meta.score == 2.0


# -- malformed bodies -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("search", b""),
        ("search", b"{not json"),
        ("search", b'{"hits": {"hits": []}, "took": "\xff"}'),
        ("search", b"[" * 2000),
        ("search", b"[]"),
        ("search", b"null"),
        ("search", b"{}"),
        ("search", b'{"took": 1, "timed_out": false}'),
        ("search", b'{"hits": null}'),
        ("search", b'{"hits": []}'),
        ("search", b'{"hits": {"total": 1}}'),
        ("search", b'{"hits": {"hits": {}}}'),
        ("search", b'{"hits": {"hits": ["SECRET"]}}'),
        ("search", b'{"hits": {"hits": [[]]}}'),
        ("search", b'{"hits": {"hits": [{"_id": "a", "_score": "SECRET"}]}}'),
        ("search", b'{"hits": {"hits": [{"_id": "a", "_score": true}]}}'),
        ("search", b'{"hits": {"hits": [{"_id": "a", "fields": ["SECRET"]}]}}'),
        ("search", b'{"hits": {"hits": [], "total": "SECRET"}}'),
        ("search", b'{"hits": {"hits": [], "total": true}}'),
        ("search", b'{"hits": {"hits": [], "total": {"value": 1}}}'),
        ("search", b'{"hits": {"hits": [], "total": {"value": "1", "relation": "eq"}}}'),
        ("search", b'{"hits": {"hits": [], "total": {"value": 1, "relation": "lte"}}}'),
        ("search", b'{"hits": {"hits": [], "max_score": "SECRET"}}'),
        ("search", b'{"hits": {"hits": []}, "max_score": []}'),
        ("search", b'{"responses": []}'),
        ("msearch", b'{"hits": {"hits": []}}'),
        ("msearch", b'{"responses": {}}'),
        ("msearch", b'{"responses": [null]}'),
        ("msearch", b'{"responses": [{"status": 200}]}'),
        ("msearch", b'{"responses": [{"hits": {"hits": [1]}, "error": {}}]}'),
        ("msearch", b'{"responses": [["SECRET"]]}'),
    ],
)
def test_malformed_bodies(name: str, body: bytes) -> None:
    with pytest.raises(MalformedBody) as raised:
        ElasticsearchFormat().parse(body, _route(name))
    assert "SECRET" not in str(raised.value)
    assert raised.value.__cause__ is None
    assert raised.value.__context__ is None


# -- properties (the shared ones are in tests/unit/test_format_contract.py) --------------

_scores = st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False)


@st.composite
def _hits(draw: st.DrawFn, min_size: int = 0, max_size: int = 6) -> list[Hit]:
    """Hits as the specification allows them: ``_id`` strings, texts or no text field,
    null scores, extra ``_source`` fields, highlights and sort values."""
    ids = draw(st.lists(st.text(min_size=1, max_size=8), min_size=min_size, max_size=max_size))
    out = []
    for doc_id in ids:
        source: dict[str, Any] = draw(
            st.dictionaries(
                # Not the text, nor a keyword of the fixture builder.
                st.text(max_size=6).filter(lambda k: k not in ("text", "score", "index", "doc_id")),
                json_values,
                max_size=2,
            )
        )
        item = hit(doc_id, draw(st.none() | st.text(max_size=12)), score=draw(_scores), **source)
        if draw(st.booleans()):
            fragment = st.text(max_size=6) | _quoting(item["_source"].get("text") or "")
            item["highlight"] = {"text": draw(st.lists(fragment, max_size=2))}
        if draw(st.booleans()):
            item["sort"] = draw(st.lists(json_scalars, max_size=2))
        out.append(item)
    return out


def _quoting(text: str) -> st.SearchStrategy[str]:
    """Highlight fragments quoting ``text``: a part of it with a term tagged."""
    return st.integers(0, len(text)).flatmap(
        lambda start: st.integers(start, len(text)).map(
            lambda end: f"{text[:start]}<em>{text[start:end]}</em>"
        )
    )


@st.composite
def _totals(draw: st.DrawFn, count: int) -> dict[str, Any]:
    """Upstream ``hits.total`` settings for a response returning ``count`` hits."""
    form = draw(st.sampled_from(["object", "int", "absent"]))
    total = draw(st.integers(min_value=count, max_value=count + 50))
    if form == "absent":
        return {"track_total": False}
    if form == "int":
        return {"total": total, "total_as_int": True}
    return {"total": total, "relation": draw(st.sampled_from(["eq", "gte"]))}


def _expected_total(upstream: dict[str, Any], kept: int) -> dict[str, Any]:
    if upstream.get("track_total") is False or upstream.get("total_as_int"):
        return {**upstream, "total": kept}
    return {"total": kept, "relation": "eq"}


@st.composite
def _bodies(draw: st.DrawFn) -> tuple[str, Body, Body | None, list[list[Hit] | None]]:
    """A route name, its upstream body, the body's items (multi) and its hit batches
    (None for error items)."""
    name = draw(st.sampled_from(sorted(ROUTES)))
    if _shape(name) == "single":
        hits = draw(_hits())
        return name, search_body(hits, **draw(_totals(len(hits)))), None, [hits]
    batches: list[list[Hit] | None] = draw(st.lists(st.none() | _hits(max_size=4), max_size=4))
    items = [
        error_item() if batch is None else msearch_item(batch, **draw(_totals(len(batch))))
        for batch in batches
    ]
    return name, msearch_body(items), msearch_body(items), batches


def _oracle(body: Body, batches: Sequence[Sequence[Hit] | None], keep: Collection[int]) -> Body:
    """The filtered body, built from scratch with the fixture builders."""
    sources = body.get("responses", [body])
    out, position = [], 0
    for source, batch in zip(sources, batches, strict=True):
        if batch is None:
            out.append(_reduced(source["status"]))
            continue
        kept = [_released(h) for i, h in enumerate(batch, position) if i in keep]
        position += len(batch)
        upstream = _upstream_total(source["hits"])
        built = search_body(kept, **_expected_total(upstream, len(kept)))
        if "status" in source:
            built["status"] = source["status"]
        out.append(built)
    return out[0] if "responses" not in body else msearch_body(out)


def _upstream_total(hits: Body) -> dict[str, Any]:
    total = hits.get("total")
    if total is None:
        return {"track_total": False}
    if isinstance(total, int):
        return {"total": total, "total_as_int": True}
    return {"total": total["value"], "relation": total["relation"]}


@PROPERTIES
@given(case=_bodies(), data=st.data())
def test_property_render_keeps_exactly_the_kept_hits(
    case: tuple[str, Body, Body | None, list[list[Hit] | None]], data: st.DataObject
) -> None:
    name, body, _, batches = case
    hits = [h for batch in batches if batch is not None for h in batch]
    keep = data.draw(st.sets(st.integers(min_value=-1, max_value=len(hits))))
    parsed = _parse(body, name)
    assert [c.chunk_id for c in parsed.candidates] == [h["_id"] for h in hits]
    assert [c.text for c in parsed.candidates] == [h["_source"].get("text") for h in hits]
    out = _render(body, keep, name)
    assert out == _oracle(body, batches, keep)
    # Side structures stay consistent: each total counts its kept hits, each max_score
    # is the best kept score.
    for item in out.get("responses", [out]):
        if "hits" not in item:
            continue
        total = item["hits"].get("total")
        count = len(item["hits"]["hits"])
        assert total is None or total == count or total["value"] == count
        scores = [h["_score"] for h in item["hits"]["hits"] if h["_score"] is not None]
        assert item["hits"]["max_score"] == (max(scores) if scores else None)
    # What is rendered parses again into the kept candidates, in order.
    again = ElasticsearchFormat().parse(orjson.dumps(out), _route(name)).candidates
    kept = [c for c in parsed.candidates if c.position in keep]
    assert [(c.chunk_id, c.text) for c in again] == [(c.chunk_id, c.text) for c in kept]


@SLOW_PROPERTIES
@given(case=_bodies(), data=st.data())
def test_property_clients_read_exactly_the_kept_hits(
    case: tuple[str, Body, Body | None, list[list[Hit] | None]], data: st.DataObject
) -> None:
    name, body, _, batches = case
    count = sum(len(b) for b in batches if b is not None)
    keep = data.draw(st.sets(st.integers(min_value=0, max_value=max(count - 1, 0))))
    for read in _read_with_clients(body, _shape(name), keep):
        assert read == _expected_ids(batches, keep)


@PROPERTIES
@given(
    hits=_hits(min_size=1),
    data=st.data(),
    aggregations=st.sampled_from(["remove", "keep"]),
    suggest=st.sampled_from(["remove", "keep"]),
    inner=st.sampled_from(["remove", "keep"]),
)
def test_property_side_structure_options(
    hits: list[Hit], data: st.DataObject, aggregations: str, suggest: str, inner: str
) -> None:
    for item in hits:
        item["inner_hits"] = inner_hits("collapsed", data.draw(_hits(max_size=2)))
    body = {**search_body(hits), "aggregations": AGGREGATIONS, "suggest": SUGGEST}
    keep = data.draw(st.sets(st.integers(min_value=0, max_value=len(hits) - 1)))
    fmt = ElasticsearchFormat(aggregations=aggregations, suggest=suggest, inner_hits=inner)  # type: ignore[arg-type]
    out = _render(body, keep, fmt=fmt)
    assert ("aggregations" in out) is (aggregations == "keep")
    assert ("suggest" in out) is (suggest == "keep")
    kept = [_released(h) for i, h in enumerate(hits) if i in keep]
    if inner == "keep":
        assert out["hits"]["hits"] == kept
    else:
        assert out["hits"]["hits"] == [
            {k: v for k, v in h.items() if k != "inner_hits"} for h in kept
        ]


@PROPERTIES
@given(expression=st.text(alphabet="ab*,-:<>{}/\\_+", max_size=12))
def test_property_index_names_are_single_names(expression: str) -> None:
    names = index_names(expression)
    assert names
    assert len(names) == len(set(names))
    assert all("," not in name and not name.startswith("-") and name for name in names)
    # Every item that is not an exclusion is covered by one of the names.
    items = [i for i in expression.split(",") if i and not i.startswith("-")]
    assert len(names) <= max(len(items), 1)
