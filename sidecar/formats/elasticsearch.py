"""Elasticsearch and OpenSearch search responses: search, scroll, templates, kNN, multi-search.

Both databases answer every search endpoint with the same body (``took``,
``timed_out``, ``_shards``, ``hits: {total, max_score, hits: [...]}``, ...);
multi-search wraps one such body, or an error item, per request in
``responses``. Each hit is a candidate: its id is ``_id`` (or the ``_source``
field ``id_field``), its text the ``_source`` field ``text_field``.

Removing hits leaves the rest of a body describing documents that were never
checked, so rendering rebuilds it:

- ``hits.total`` is recomputed from the kept hits (``gte`` when more matched
  than were returned), or removed; the integer form stays an integer.
- ``hits.max_score`` (and a top-level ``max_score``) becomes the best kept
  ``_score``.
- ``aggregations`` and ``suggest`` are computed over every matching document
  (``top_hits`` and completion suggestions even carry their ``_source``): they
  are removed unless the operator keeps them.
- ``inner_hits`` of a kept hit may be other documents (parent/child, collapse):
  removed unless kept.
- ``fields`` entries shaped like a lookup runtime field (objects of value
  lists, which is also how nested fields come back) are removed: a lookup
  field copies fields of documents in another index.
- ``profile`` is removed: its rewritten queries can hold terms read from
  stored documents (``more_like_this``, terms lookup) and its collector counts
  cover every matching document.
- Any other key of a response or of its ``hits`` object is removed, known or
  not, because nothing says it was not computed from rejected hits;
  OpenSearch's ``ext`` holds search pipeline output such as a RAG answer
  generated from every hit. A multi-search body keeps ``took`` and
  ``responses``; its error items pass untouched.
- Kept as they are: ``took``, ``timed_out``, ``_shards``, ``_clusters``,
  ``_scroll_id``, ``pit_id`` (the next page is a filtered search too),
  ``num_reduce_phases``, ``terminated_early``, ``phase_took``, ``status``,
  and every other field of a kept hit (``highlight``, ``sort``,
  ``matched_queries``, ``_explanation``, ...), which describe that hit's own
  document.

These rules hold for every render, even one that keeps every hit (to
substitute a chunk): aggregations and the rest were computed over matches
beyond the returned page as well.

The adapter claims only paths with an API segment (``_name``) first or after
an index expression, plus ``/``. Index-level paths (``PUT /{index}``, ``GET
/{index}``) are left unclaimed: the request policy reads unknown GETs as
reads and other unknown methods as writes, which is what they are. Legacy
typed paths (``/{index}/{type}/{id}``, Elasticsearch 7 and REST
compatibility mode) are not recognised.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Final, Literal, get_args

import orjson

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.formats._common import (
    check_fields,
    kept_in_order,
    load_object,
    make_candidate,
    no_limits,
    parse_guarded,
    usable_id,
    usable_text,
)
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody, ParsedBody

TotalMode = Literal["recompute", "remove"]
KeepMode = Literal["remove", "keep"]

# -- routes -------------------------------------------------------------------

# Index names cannot start with "_", so such a segment names an endpoint;
# "_all" is the one index expression that does.
_API_SEGMENT: Final = re.compile(r"_[a-z][a-z0-9_]*")


class _Rule(Enum):
    """How the method decides the kind of an endpoint family."""

    ADMIN = auto()  # settings, stats, configuration: GET reads, anything else writes
    READ = auto()  # returns no stored content, whatever the method (counts, PIT, validate)
    WRITE = auto()  # changes documents, whatever the method
    DOCUMENT = auto()  # one document by id: GET returns it, other methods write it
    CONTENT = auto()  # returns stored documents or values taken from them; DELETE writes
    DERIVED = auto()  # analytics over stored data: GET returns content, other methods write


# Every API of Elasticsearch 9 and OpenSearch 3 (with its plugins), by rule.
# CONTENT: _count answers how many documents match any query (rejected ones
# included: an oracle for their text), _validate rewrites queries with terms
# read from documents, _graph returns terms of documents, _insights other callers'
# queries, _mvt hit fields, _rank_eval per-query hits, _terms_enum field
# values, _snapshot a whole index past every per-chunk check. DERIVED: _ml
# results and category examples quote documents, _text_structure samples an
# index, OpenSearch's ML memory holds conversations and its agents search
# indices. The search endpoints are matched before these rules, which cover
# their other methods and sub-paths.
# fmt: off
_APIS: Final[Mapping[_Rule, tuple[str, ...]]] = {
    _Rule.READ: (
        "_analyze", "_cat", "_disk_usage", "_field_caps", "_pit", "_render",
        "_resolve", "_search_shards",
    ),
    _Rule.WRITE: (
        "_bulk", "_create", "_create_from", "_delete_by_query", "_update", "_update_by_query",
    ),
    _Rule.DOCUMENT: ("_doc", "_source"),
    _Rule.CONTENT: (
        "_async_search", "_eql", "_explain", "_graph", "_insights", "_mget", "_mtermvectors",
        "_mvt", "_query", "_rank_eval", "_rollup_search", "_snapshot", "_sql", "_terms_enum",
        "_termvectors", "_count", "_validate",
        "_plugins/_asynchronous_search", "_plugins/_ppl", "_plugins/_sql",
    ),
    _Rule.DERIVED: (
        "_knn_search", "_msearch", "_search", "_ml", "_text_structure",
        "_plugins/_alerting", "_plugins/_ml", "_plugins/_observability",
        "_plugins/_search_relevance", "_plugins/_security_analytics",
    ),
    _Rule.ADMIN: (
        "_alias", "_aliases", "_application", "_autoscaling", "_block", "_cache", "_ccr",
        "_clone", "_close", "_cluster", "_component_template", "_connector", "_dangling",
        "_data_stream", "_downsample", "_encryption", "_enrich", "_features",
        "_field_usage_stats", "_fleet", "_flush", "_forcemerge", "_health_report", "_ilm",
        "_index_template", "_inference", "_info", "_ingest", "_license", "_lifecycle", "_list",
        "_logstash", "_ltr", "_mapping", "_migration", "_monitoring", "_nodes", "_open",
        "_project", "_project_routing", "_query_rules", "_recovery", "_refresh", "_reindex",
        "_reload_search_analyzers", "_remote", "_remotestore", "_rollover", "_rollup",
        "_script_context", "_script_language", "_scripts", "_searchable_snapshots",
        "_security", "_segments", "_settings", "_shard_stores", "_shrink", "_slm", "_split",
        "_ssl", "_stats", "_streams", "_synonyms", "_tasks", "_template", "_transform",
        "_upgrade", "_watcher", "_wlm", "_xpack",
        "_plugins/_flow_framework", "_plugins/_ism", "_plugins/_knn", "_plugins/_ltr",
        "_plugins/_neural", "_plugins/_notifications", "_plugins/_query",
        "_plugins/_replication", "_plugins/_rollup", "_plugins/_security", "_plugins/_sm",
        "_plugins/_transform", "_plugins/geospatial", "_plugins/ubi",
    ),
}
# fmt: on
_RULES: Final[Mapping[str, _Rule]] = {api: rule for rule, apis in _APIS.items() for api in apis}

# Sub-paths of /_search that are not searches: clearing a scroll and opening
# or closing an OpenSearch point in time return no documents; search
# pipelines are configuration.
_SEARCH_SUB_RULES: Final[Mapping[str, _Rule]] = {
    "scroll": _Rule.READ,
    "point_in_time": _Rule.READ,
    "pipeline": _Rule.ADMIN,
}

# Actions that return stored documents, or results computed from them, from
# inside otherwise administrative APIs: datafeed and transform previews, watch
# and monitor executions, agents, searches over plugin indices.
_CONTENT_ACTIONS: Final = frozenset(
    {"_execute", "_msearch", "_predict", "_preview", "_search", "_train_predict"}
)
# Actions of content APIs that write indices: restoring or mounting a snapshot.
_WRITE_ACTIONS: Final = frozenset({"_mount", "_restore"})

_SINGLE: Final = "single"  # one search response
_MULTI: Final = "multi"  # {"responses": [search response or error, ...]}


def _endpoint(path: str) -> tuple[str, list[str]] | None:
    """The API name of a path and the segments after it; None when it has none."""
    segments = [segment for segment in path.split("/") if segment]
    if segments and segments[0] != "_all" and _API_SEGMENT.fullmatch(segments[0]):
        api_at = 0
    elif len(segments) > 1 and _API_SEGMENT.fullmatch(segments[1]):
        api_at = 1  # after an index expression: a name, a comma list, a pattern, _all
    else:
        return None
    api, rest = segments[api_at], segments[api_at + 1 :]
    if api in ("_plugins", "_opendistro") and rest:
        # OpenSearch plugins (and their Open Distro aliases) are APIs of their own.
        api, rest = f"_plugins/{rest[0]}", rest[1:]
    return api, rest


def _search_shape(api: str, rest: list[str]) -> str | None:
    match api, rest:
        case (
            ("_search", [] | ["template"] | ["scroll"] | ["scroll", _])
            | ("_knn_search", [])
            | ("_fleet", ["_fleet_search"])
            | ("_application", ["search_application", _, "_search"])
        ):
            return _SINGLE
        case ("_msearch", [] | ["template"]) | ("_fleet", ["_fleet_msearch"]):
            return _MULTI
    return None


def _shape(route: Route) -> str | None:
    """The body shape of a FILTERED route; None for every other route."""
    endpoint = _endpoint(route.path)
    if endpoint is None or route.method.upper() not in ("GET", "POST"):
        return None
    return _search_shape(*endpoint)


def _kind(method: str, api: str, rest: list[str]) -> RouteKind:
    if method in ("HEAD", "OPTIONS"):
        # No body: Elasticsearch answers HEAD like GET without it, OPTIONS with CORS headers.
        return RouteKind.READ
    if method in ("GET", "POST") and _search_shape(api, rest) is not None:
        return RouteKind.FILTERED
    # Unknown APIs are assumed to return stored data when read.
    rule = _RULES.get(api, _Rule.DERIVED)
    if api == "_search" and rest:
        rule = _SEARCH_SUB_RULES.get(rest[0], _Rule.DERIVED)
    match rule:
        case _Rule.READ:
            return RouteKind.READ
        case _Rule.WRITE:
            return RouteKind.WRITE
        case _Rule.DOCUMENT:
            return RouteKind.CONTENT if method == "GET" else RouteKind.WRITE
        case _Rule.CONTENT:
            writes = method == "DELETE" or not _WRITE_ACTIONS.isdisjoint(rest)
            return RouteKind.WRITE if writes else RouteKind.CONTENT
    if not _CONTENT_ACTIONS.isdisjoint(rest):
        return RouteKind.CONTENT
    if method == "GET":
        return RouteKind.CONTENT if rule is _Rule.DERIVED else RouteKind.READ
    return RouteKind.WRITE


# -- bodies -------------------------------------------------------------------

# Top-level keys of a search response that say nothing about rejected hits.
_KEPT_KEYS: Final = frozenset(
    {
        "took",
        "timed_out",
        "_shards",
        "_clusters",
        "_scroll_id",
        "pit_id",
        "num_reduce_phases",
        "terminated_early",
        "phase_took",  # OpenSearch per-phase timings
        "status",  # on multi-search items
    }
)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_score(value: Any, label: str) -> None:
    if value is not None and not _is_number(value):
        raise MalformedBody(f"{label} is not a number")


def _check_total(total: Any) -> None:
    """``hits.total``: absent, an integer (rest_total_hits_as_int) or ``{value, relation}``."""
    if total is None or (isinstance(total, int) and not isinstance(total, bool)):
        return
    if (
        isinstance(total, dict)
        and isinstance(total.get("value"), int)
        and not isinstance(total["value"], bool)
        and total.get("relation") in ("eq", "gte")
    ):
        return
    raise MalformedBody("hits.total is neither a count nor {value, relation}")


def _lookup_shaped(values: Any) -> bool:
    """True for a ``fields`` entry shaped like a lookup runtime field: ``[{"f": [..]}]``."""
    return isinstance(values, list) and any(
        isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values())
        for value in values
    )


@dataclass(frozen=True, slots=True)
class _Response:
    """One search response: the whole body, or one item of a multi-search."""

    document: dict[str, Any]
    hits: dict[str, Any]  # the ``hits`` object, its list already checked
    start: int  # position of the first hit


class _Reader:
    """Checks search responses and numbers their hits as candidates, in body order."""

    def __init__(self, text_field: str, id_field: str | None) -> None:
        self.candidates: list[Candidate] = []
        self._text_field = text_field
        self._id_field = id_field

    def response(self, document: Any) -> _Response:
        if not isinstance(document, dict):
            raise MalformedBody("a search response is not a JSON object")
        hits = document.get("hits")
        if not isinstance(hits, dict) or not isinstance(hits.get("hits"), list):
            # filter_path can drop hits.hits; a body without them cannot be checked.
            raise MalformedBody("a search response has no hits.hits list")
        _check_total(hits.get("total"))
        _check_score(hits.get("max_score"), "hits.max_score")
        _check_score(document.get("max_score"), "max_score")
        start = len(self.candidates)
        for hit in hits["hits"]:
            self._add(hit)
        return _Response(document, hits, start)

    def _add(self, hit: Any) -> None:
        if not isinstance(hit, dict):
            raise MalformedBody("a hit is not a JSON object")
        _check_score(hit.get("_score"), "a hit's _score")
        if "fields" in hit and not isinstance(hit["fields"], dict):
            raise MalformedBody("a hit's fields is not an object")
        source = hit.get("_source")
        chunk_id = usable_id(hit.get("_id"), "_id")
        # Problems name the field, never its value: they end up in audit records.
        if isinstance(source, dict):
            label = f"_source field {self._text_field!r}"
            text = usable_text(source.get(self._text_field), label)
            if self._id_field is not None:
                label = f"_source field {self._id_field!r}"
                chunk_id = usable_id(source.get(self._id_field), label)
        else:
            # Absent: _source is disabled in the mapping or excluded by the request.
            problem = "no _source" if source is None else "_source is not an object"
            text = (None, problem)
            if self._id_field is not None:
                chunk_id = (None, problem)
        self.candidates.append(make_candidate(len(self.candidates), chunk_id, text))


@dataclass(frozen=True, slots=True)
class _Options:
    text_field: str
    id_field: str | None
    total: TotalMode
    aggregations: KeepMode
    suggest: KeepMode
    inner_hits: KeepMode


def _max_score(upstream: Any, hits: Sequence[dict[str, Any]]) -> Any:
    """The best kept ``_score``; null when the upstream had none or no kept hit has one."""
    if upstream is None:
        return None
    scores = [hit["_score"] for hit in hits if _is_number(hit.get("_score"))]
    return max(scores, default=None)


def _total(upstream: Any, returned: int, kept: int) -> Any:
    if not isinstance(upstream, dict):
        return kept  # the integer form cannot say "at least"
    # Matches beyond this page were never checked: the kept count is a lower bound.
    more = upstream["relation"] == "gte" or upstream["value"] > returned
    return {**upstream, "value": kept, "relation": "gte" if more else "eq"}


class _Renderer:
    """Rebuilds search responses for one set of kept positions; never mutates them."""

    def __init__(
        self, options: _Options, keep: frozenset[int], replacements: Mapping[int, Replacement]
    ) -> None:
        self._options = options
        self._keep = keep
        self._replacements = replacements

    def response(self, response: _Response) -> dict[str, Any]:
        items: list[Any] = response.hits["hits"]
        positions = range(response.start, response.start + len(items))
        hits = [
            self._hit(items[position - response.start], self._replacements.get(position))
            for position in kept_in_order(positions, self._keep)
        ]
        options = self._options
        hits_object: dict[str, Any] = {}
        for key, value in response.hits.items():
            if key == "hits":
                hits_object[key] = hits
            elif key == "total" and options.total == "recompute":
                hits_object[key] = _total(value, len(items), len(hits))
            elif key == "max_score":
                hits_object[key] = _max_score(value, hits)
        out: dict[str, Any] = {}
        for key, value in response.document.items():
            if key == "hits":
                out[key] = hits_object
            elif key == "max_score":
                out[key] = _max_score(value, hits)
            elif key in _COUNTS_ONLY:
                out[key] = _counts(value)
            elif (
                key in _KEPT_KEYS
                or (key == "aggregations" and options.aggregations == "keep")
                or (key == "suggest" and options.suggest == "keep")
            ):
                out[key] = value
        return out

    def _hit(self, hit: dict[str, Any], replacement: Replacement | None) -> dict[str, Any]:
        out = dict(hit)
        if self._options.inner_hits == "remove":
            out.pop("inner_hits", None)
        if "fields" in out:
            out["fields"] = {k: v for k, v in out["fields"].items() if not _lookup_shaped(v)}
        if replacement is not None:
            self._substitute(out, replacement)
        return out

    def _substitute(self, out: dict[str, Any], replacement: Replacement) -> None:
        text_field, id_field = self._options.text_field, self._options.id_field
        source = out.get("_source")
        source = dict(source) if isinstance(source, dict) else {}
        old_id = source.get(id_field) if id_field else out.get("_id")
        source[text_field] = replacement.text
        if id_field:
            source[id_field] = replacement.chunk_id
        else:
            out["_id"] = replacement.chunk_id
        source[SUBSTITUTED_FOR] = old_id
        out["_source"] = source
        # Highlights quote the replaced text, and fields may hold copies of it
        # (stored or docvalue fields); the substitute's own would need a new search.
        out.pop("highlight", None)
        if "fields" in out:
            out["fields"] = {
                k: v for k, v in out["fields"].items() if k not in (text_field, id_field)
            }


# Shard and cluster statistics: their counts stay, their failure lists go
# (a failure's reason can quote a document, e.g. a script error on a hit the
# gate removed).
_COUNTS_ONLY: Final = frozenset({"_shards", "_clusters"})


def _counts(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {
        k: v for k, v in value.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _error_item(item: Any) -> Any:
    """A multi-search error item as sent on: its status and error type, not its reason text."""
    error = item.get("error") if isinstance(item, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    out: dict[str, Any] = {"error": {"type": kind if isinstance(kind, str) else "error"}}
    if isinstance(item, dict) and "status" in item:
        out["status"] = item["status"]
    return out


@dataclass(frozen=True, slots=True)
class _ElasticsearchBody:
    candidates: Sequence[Candidate]
    _document: dict[str, Any]
    # A plain search: its response. A multi-search: one entry per item, None
    # for error items, which pass untouched.
    _single: _Response | None
    _items: tuple[_Response | None, ...]
    _options: _Options

    def render(
        self,
        keep: Collection[int],
        limits: Sequence[int | None] | None = None,
        replacements: Mapping[int, Replacement] | None = None,
    ) -> bytes:
        """Serialise the body with only the hits whose position is in ``keep``.

        Side structures are rebuilt as the module docstring describes. A
        replaced hit gets the substitute's text and id (``_id``, or
        ``id_field``), a ``retrieval_gate_substituted_for`` ``_source`` field
        naming the chunk it replaced, and loses its highlights of the old
        text. See ``ParsedBody.render``.
        """
        no_limits(limits)
        renderer = _Renderer(self._options, frozenset(keep), replacements or {})
        if self._single is not None:
            return orjson.dumps(renderer.response(self._single))
        responses = [
            renderer.response(item) if item is not None else _error_item(original)
            for item, original in zip(self._items, self._document["responses"], strict=True)
        ]
        # A multi-search body has nothing else to say about its searches.
        out = {
            key: responses if key == "responses" else value
            for key, value in self._document.items()
            if key in ("took", "responses")
        }
        return orjson.dumps(out)

    def released_positions(
        self, keep: Collection[int], limits: Sequence[int | None] | None = None
    ) -> list[int]:
        """The positions ``render`` sends, in body order: every kept one."""
        no_limits(limits)
        return kept_in_order(range(len(self.candidates)), keep)


class ElasticsearchFormat:
    """Adapter for Elasticsearch's and OpenSearch's REST APIs (same search response).

    The chunk id is the hit's ``_id``, or the ``_source`` field ``id_field``
    when set; the chunk text is the ``_source`` field ``text_field`` (top
    level of ``_source``; a hit without ``_source`` is a malformed chunk).

    ``total``: "recompute" (default) or "remove" ``hits.total``.
    ``aggregations``, ``suggest``, ``inner_hits``: "remove" (default) or
    "keep". Keeping them is unsafe: they are computed from, or are, documents
    the gate never checked.
    """

    def __init__(
        self,
        *,
        text_field: str = "text",
        id_field: str | None = None,
        total: TotalMode = "recompute",
        aggregations: KeepMode = "remove",
        suggest: KeepMode = "remove",
        inner_hits: KeepMode = "remove",
    ) -> None:
        check_fields(text_field, id_field)
        for option, value, allowed in (
            ("total", total, get_args(TotalMode)),
            ("aggregations", aggregations, get_args(KeepMode)),
            ("suggest", suggest, get_args(KeepMode)),
            ("inner_hits", inner_hits, get_args(KeepMode)),
        ):
            if value not in allowed:
                raise ValueError(f"{option} must be one of {', '.join(map(repr, allowed))}")
        self._options = _Options(text_field, id_field, total, aggregations, suggest, inner_hits)

    @property
    def name(self) -> str:
        """Short stable name, used as the ``format`` metric label."""
        return "elasticsearch"

    def route_kind(self, route: Route) -> RouteKind | None:
        """FILTERED for the search endpoints; the kind of any other API path.

        Searches: ``_search``, ``_search/scroll``, ``_search/template``,
        ``_msearch``, ``_msearch/template``, ``_knn_search``, search
        applications and Fleet searches. Document reads (``_doc``,
        ``_source``, ``_mget``, ...), query languages (SQL, ES|QL, EQL, PPL),
        async searches and snapshots are CONTENT; counts, PIT, cat and
        cluster reads are READ; anything that changes data is WRITE. Unknown
        API paths count as content when read and as writes otherwise. Paths
        without an API segment are not claimed, except ``/``.
        """
        method = route.method.upper()
        endpoint = _endpoint(route.path)
        if endpoint is None:
            segments = [segment for segment in route.path.split("/") if segment]
            if not segments:
                return RouteKind.READ if method in ("GET", "HEAD") else None
            if any(_API_SEGMENT.fullmatch(segment) for segment in segments[2:]):
                # A typed path (/{index}/{type}/_search, /{index}/{type}/{id}/_source)
                # that compatibility mode still serves: nothing the gate reads.
                return RouteKind.CONTENT
            return None
        return _kind(method, *endpoint)

    def parse(self, body: bytes, route: Route) -> ParsedBody:
        """Parse a successful response body; raise MalformedBody if it is not one.

        Raises ValueError if ``route`` is not a search this format filters.
        """
        shape = _shape(route)
        if shape is None:
            raise ValueError("route is not handled by the elasticsearch format")
        return parse_guarded(self.name, lambda: self._parse(body, shape))

    def _parse(self, body: bytes, shape: str) -> _ElasticsearchBody:
        document = load_object(body)
        reader = _Reader(self._options.text_field, self._options.id_field)
        if shape == _SINGLE:
            single = reader.response(document)
            return _ElasticsearchBody(tuple(reader.candidates), document, single, (), self._options)
        responses = document.get("responses")
        if not isinstance(responses, list):
            raise MalformedBody("a multi-search body has no responses list")
        items = tuple(self._item(reader, item) for item in responses)
        return _ElasticsearchBody(tuple(reader.candidates), document, None, items, self._options)

    @staticmethod
    def _item(reader: _Reader, item: Any) -> _Response | None:
        """A multi-search item: a search response, or None for an error item."""
        if isinstance(item, dict) and "hits" not in item and "error" in item:
            return None
        return reader.response(item)
