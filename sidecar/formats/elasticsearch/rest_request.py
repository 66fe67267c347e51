"""Elasticsearch and OpenSearch search requests: tenant push-down, over-fetch, URL parameters.

Push-down confines every search to the documents whose ``tenant_key`` field
holds the caller's tenant, with the term query ``{"term": {tenant_key:
tenant}}`` (a JSON string: no tenant value can change the query's meaning).
The field must be a ``keyword``: a ``text`` field would match any tenant
sharing a token. Where the term goes in each kind of search, and what is
refused, is ``rest_query``'s docstring. Per endpoint:

- ``_search``, Fleet search and every search line of ``_msearch`` (NDJSON,
  Fleet's too) are confined; the header lines' ``index`` names become the
  request's collections (every index, for a header naming none on a path
  naming none). ``_knn_search`` takes the term in its top-level ``filter``.
- Search templates (``_search/template``, ``_msearch/template``) and search
  applications are refused: the query is rendered server-side.
- Scrolls are refused (``query_string_problem``): a continuation
  (``/_search/scroll``) carries no query, and continues the search that
  opened the scroll, confined to whoever opened it, for whoever holds its
  id; so the ``scroll`` parameter that opens one is refused too. A point in
  time with ``search_after`` pages instead: searches of a point in time
  (``pit`` in a ``_search`` body) are confined as any search; the
  ``index_filter`` of a point in time's opening (``/{index}/_pit``) is
  refused, whatever ``push_down`` says (``request_collections``).

Over-fetch raises ``size`` (default 10) of ``_search`` and multi-search
lines so that hits the response check rejects can be replaced;
``RequestRewrite.limits`` holds what the app asked for. Not raised:

- with ``from`` > 0: ``from`` counts hits before the check, so a page ending
  past the app's k would overlap the next page (``search_after`` pages are
  fine: they continue after the last hit the app saw);
- when a kNN search leaves ``k`` to default to ``size``, or with a
  retriever (``rank_window_size`` defaults to ``size``): the raised search
  would choose among other candidates, not extend the app's result;
- for scroll searches, whose later pages continue after the raised page:
  ``scroll``, like ``size`` and ``from`` given as URL parameters (which
  override the body), is invisible here, so ``overfetch_problem`` tells the
  request path to switch over-fetch off for such requests.

URL parameters that bypass the body (``q``, ``source``, ``suggest_field``)
or are not known to be safe are reported by ``query_string_problem``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final
from urllib.parse import parse_qsl

import orjson

from sidecar.core.hits import Route
from sidecar.formats.base import (
    MalformedRequest,
    RequestRewrite,
    UnfilterableRequest,
)
from sidecar.formats.elasticsearch import rest_query as query
from sidecar.formats.elasticsearch import rest_routes as routes
from sidecar.formats.rewriter import SearchRewriter, load_request

DEFAULT_SIZE: Final = 10


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """How the requests of one search endpoint are rewritten."""

    name: str  # for refusals
    lines: bool = False  # NDJSON: header and search lines
    template: bool = False  # the query is rendered server-side
    knn_search: bool = False  # Elasticsearch 8's _knn_search body


_SEARCH: Final = _Endpoint("search")
_APPLICATION: Final = _Endpoint("search application", template=True)
_ENDPOINTS: Final[Mapping[tuple[str, tuple[str, ...]], _Endpoint]] = {
    ("_search", ()): _SEARCH,
    ("_fleet", ("_fleet_search",)): _SEARCH,
    ("_search", ("template",)): _Endpoint("search template", template=True),
    ("_knn_search", ()): _Endpoint("kNN search", knn_search=True),
    ("_msearch", ()): _Endpoint("multi-search", lines=True),
    ("_fleet", ("_fleet_msearch",)): _Endpoint("multi-search", lines=True),
    ("_msearch", ("template",)): _Endpoint("multi-search template", lines=True, template=True),
}


class ElasticsearchRequests(SearchRewriter[_Endpoint]):
    """Rewrites the search requests of Elasticsearch's and OpenSearch's REST APIs."""

    def query_string_problem(self, route: Route, query_string: str) -> str | None:
        """See ``ResponseFormat.query_string_problem``: the module's ``query_string_problem``."""
        return query_string_problem(route, query_string)

    def overfetch_problem(self, route: Route, query_string: str) -> str | None:
        """See ``ResponseFormat.overfetch_problem``: the module's ``overfetch_problem``."""
        return overfetch_problem(route, query_string)

    def rewrite_request(
        self,
        body: bytes,
        route: Route,
        *,
        tenant: str,
        tenant_key: str | None,
        overfetch_factor: float,
        overfetch_cap: int,
    ) -> RequestRewrite:
        """See ``ResponseFormat.rewrite_request``.

        An empty search body means "match all" to the database, as ``{}``
        does. Multi-search bodies are NDJSON: the shared rewrite runs on their
        search lines, and the header lines' indices (``EVERY_INDEX`` for a
        header naming none on a path naming none) become ``collections``.
        """
        endpoint = self._request_endpoint(route)

        def rewrite(document: bytes) -> RequestRewrite:
            return SearchRewriter.rewrite_request(
                self,
                document,
                route,
                tenant=tenant,
                tenant_key=tenant_key,
                overfetch_factor=overfetch_factor,
                overfetch_cap=overfetch_cap,
            )

        if endpoint is None or not endpoint.lines:
            return rewrite(body or b"{}")
        headers, searches = _read_lines(body)
        collections = _headers_collections(headers, route)
        done = rewrite(orjson.dumps({"searches": searches}))
        if not done.tenant_filter and not done.overfetched:
            return replace(done, body=body, collections=collections)
        rewritten = orjson.loads(done.body)["searches"]
        pairs = zip(headers, rewritten, strict=True)
        lines = b"".join(orjson.dumps(line) + b"\n" for pair in pairs for line in pair)
        return replace(done, body=lines, collections=collections)

    def rewrites_request(self, route: Route) -> bool:
        """True for the search endpoints, and for opening a point in time: its body
        may hold an ``index_filter`` (``request_collections`` refuses it)."""
        return super().rewrites_request(route) or opens_point_in_time(route)

    def request_collections(self, body: bytes, route: Route) -> tuple[str, ...]:
        """The indices a multi-search's header lines name (see ``rewrite_request``);
        none for other searches, whose index is the path's.

        Opening a point in time names none either, but its ``index_filter`` is
        refused (UnfilterableRequest): Elasticsearch leaves out every shard
        where the filter can match no document, deciding from the shard's
        terms and value ranges, every tenant's values among them, and says
        how many it left out. No tenant condition confines that: a shard holding
        the caller's documents answers for its other tenants' values too.
        """
        if opens_point_in_time(route):
            _refuse_index_filter(body)
            return ()
        endpoint = self._request_endpoint(route)
        if endpoint is None or not endpoint.lines:
            return super().request_collections(body or b"{}", route)
        headers, _ = _read_lines(body)
        return _headers_collections(headers, route)

    def _request_endpoint(self, route: Route) -> _Endpoint | None:
        found = routes.endpoint(route.path)
        if found is None or route.method.upper() not in ("GET", "POST"):
            return None
        api, rest = found
        match api, rest:
            case "_application", ["search_application", _, "_search"]:
                return _APPLICATION
        return _ENDPOINTS.get((api, tuple(rest)))

    def _sub_requests(self, document: dict[str, Any], endpoint: _Endpoint) -> list[dict[str, Any]]:
        if not endpoint.lines:
            return [document]
        searches: list[dict[str, Any]] = document["searches"]
        return searches

    def _push_down(
        self, request: dict[str, Any], endpoint: _Endpoint, tenant_key: str, tenant: str
    ) -> None:
        if endpoint.template:
            problem = f"a {endpoint.name} is rendered by the database: not filterable"
            raise UnfilterableRequest(problem)
        term = {"term": {tenant_key: tenant}}
        if endpoint.knn_search:
            query.confine_knn_search(request, term)
        else:
            query.confine_search(request, term)

    def _overfetches(self, endpoint: _Endpoint) -> bool:
        return endpoint is _SEARCH or (endpoint.lines and not endpoint.template)

    def _limit(self, request: dict[str, Any], endpoint: _Endpoint) -> tuple[str, Any] | None:
        if request.get("from") not in (None, 0) or "retriever" in request:
            return None
        if query.k_from_size(request):
            return None
        return "size", request.get("size", DEFAULT_SIZE)


# -- multi-search NDJSON -------------------------------------------------------


def opens_point_in_time(route: Route) -> bool:
    """True for Elasticsearch's ``/{index}/_pit``, which opens a point in time."""
    found = routes.endpoint(route.path)
    return found == ("_pit", []) and route.method.upper() in ("GET", "POST")


def _refuse_index_filter(body: bytes) -> None:
    """Raise UnfilterableRequest when a point in time's body holds an ``index_filter``."""
    if not body.strip():
        return
    document = load_request(body)
    if not isinstance(document, dict):
        raise MalformedRequest("request body is not a JSON object")
    if "index_filter" in document:
        raise UnfilterableRequest(
            "an index_filter is decided per shard, over every tenant's values: "
            "open the point in time without one and search it with a query"
        )


def _headers_collections(headers: list[dict[str, Any]], route: Route) -> tuple[str, ...]:
    """The indices the header lines name, each once (``EVERY_INDEX`` for a header
    naming none on a path naming none)."""
    path_names = routes.index_expression(route) is not None
    named = (name for header in headers for name in _header_indices(header, path_names))
    return tuple(dict.fromkeys(named))


def _read_lines(body: bytes) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The header and search objects of a multi-search body, read as Elasticsearch does.

    Every line ends with a newline (a carriage return before it is
    whitespace); an empty first line is skipped; an empty header or search
    line is ``{}``. A header without its search line is refused (the
    database would ignore it).
    """
    if body and not body.endswith(b"\n"):
        raise MalformedRequest("a multi-search body does not end with a newline")
    lines = body.split(b"\n")[:-1]
    if lines[:1] == [b""]:
        lines = lines[1:]
    if len(lines) % 2:
        raise MalformedRequest("a multi-search header has no search line")
    objects = [_line(line) for line in lines]
    return objects[0::2], objects[1::2]


def _line(line: bytes) -> dict[str, Any]:
    if not line.strip():
        return {}
    value = load_request(line, "multi-search line")
    if not isinstance(value, dict):
        raise MalformedRequest("a multi-search line is not a JSON object")
    return value


def _header_indices(header: dict[str, Any], path_names: bool) -> list[str]:
    """The indices a multi-search header names (``index`` or ``indices``)."""
    names: list[str] = []
    for key in ("index", "indices"):
        value = header.get(key)
        if value is None:
            continue
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(item, str) for item in items):
            raise MalformedRequest(f"a multi-search header's {key!r} is not a string or a list")
        for item in items:
            names.extend(routes.index_names(item))
    if not names and not path_names:
        return [routes.EVERY_INDEX]
    return names


# -- URL parameters ----------------------------------------------------------------

# URL parameters of the search endpoints (Elasticsearch 9, OpenSearch 3)
# that neither carry a query nor bypass the body. Counting parameters
# (track_total_hits, terminate_after) are fine: the response's counts are
# recomputed from the hits released, and the search only sees the tenant.
_SAFE_PARAMETERS: Final = frozenset(
    {
        "_source", "_source_excludes", "_source_includes", "_source_exclude", "_source_include",
        "_source_exclude_vectors",
        "allow_no_indices", "allow_partial_search_results", "analyze_wildcard", "analyzer",
        "batched_reduce_size", "cancel_after_time_interval", "ccs_minimize_roundtrips",
        "default_operator", "df", "docvalue_fields", "error_trace", "expand_wildcards",
        "explain", "filter_path", "force_synthetic_source", "from", "human",
        "ignore_throttled", "ignore_unavailable", "include_named_queries_score", "lenient",
        "max_concurrent_searches", "max_concurrent_shard_requests", "phase_took",
        "pre_filter_shard_size", "preference", "pretty", "profile", "project_routing",
        "request_cache", "rest_total_hits_as_int", "routing", "search_pipeline", "search_type",
        "seq_no_primary_term", "size", "sort", "stats", "stored_fields", "terminate_after",
        "timeout", "track_scores", "track_total_hits", "typed_keys", "verbose_pipeline",
        "version", "wait_for_checkpoints", "min_compatible_shard_node",
    }
)  # fmt: skip
# Parameters that carry what the push-down would have to rewrite.
_BYPASSING: Final[Mapping[str, str]] = {
    "q": "replaces the body's query",
    "source": "carries a request body",
    "source_content_type": "carries a request body",
    "suggest_field": "asks for suggestions from every tenant's terms",
    "suggest_text": "asks for suggestions from every tenant's terms",
    "suggest_mode": "asks for suggestions from every tenant's terms",
    "suggest_size": "asks for suggestions from every tenant's terms",
    "scroll": "opens a scroll, which whoever holds its id could continue",
    "scroll_id": "continues a scroll, which carries no query",
}


def _continues_a_scroll(route: Route) -> bool:
    """True for ``/_search/scroll`` and ``/_search/scroll/{id}``."""
    found = routes.endpoint(route.path)
    return found is not None and found[0] == "_search" and found[1][:1] == ["scroll"]


# Parameters that set the page Elasticsearch returns, past the body.
_PAGING: Final = ("scroll", "size", "from")


def _parameter_names(query_string: str) -> list[str]:
    # Names are percent-decoded as the database decodes them (%71 is q).
    return [name for name, _ in parse_qsl(query_string, keep_blank_values=True)]


def query_string_problem(route: Route, query_string: str) -> str | None:
    """Why the URL parameters of a search request cannot be allowed; None when they can.

    Only search routes (those the format filters) are checked. ``q``
    replaces the body's query (the tenant filter with it), ``source`` sends a
    whole body past the rewrite, the ``suggest_*`` parameters ask for a term
    suggester, ``scroll`` opens a scroll; a parameter not known to be safe is
    refused too. A scroll continuation is refused whatever its parameters.
    The answer names the parameter, never its value.
    """
    if routes.shape(route) is None:
        return None
    if _continues_a_scroll(route):
        return "a scroll continuation carries no query: scrolls are refused"
    for name in _parameter_names(query_string):
        if name in _BYPASSING:
            return f"URL parameter {name!r} {_BYPASSING[name]}"
        if name not in _SAFE_PARAMETERS:
            label = query.named(name, "with an unusual name")
            return f"URL parameter {label} is not known to be safe"
    return None


def overfetch_problem(route: Route, query_string: str) -> str | None:
    """Why a search request must not be over-fetched; None when it may be.

    ``scroll`` makes later pages continue after the raised first page, and
    ``size`` and ``from`` in the URL override the body's, so the page the
    database returns is not the one the rewrite raised: over-fetch is then
    switched off (``overfetch_factor`` 1) for the request.
    """
    if routes.shape(route) is None:
        return None
    for name in _parameter_names(query_string):
        if name in _PAGING:
            return f"URL parameter {name!r} sets the page"
    return None
