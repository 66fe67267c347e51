"""Elasticsearch and OpenSearch routes: which API a path calls, what it does, which indices.

The rules are described in ``elasticsearch``'s module docstring and in
``ElasticsearchFormat.route_kind``: only search endpoints are FILTERED; every
other API is READ, WRITE or CONTENT by its family and the method.

``index_expression`` names the indices a path targets, for the request
policy's ownership check; ``index_names`` reads one index expression (a path
segment, or a multi-search header's ``index``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Enum, auto
from typing import Final

from sidecar.core.hits import Route, RouteKind

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
# values, _snapshot a whole index past every per-chunk check, _stats and
# _segments count every tenant's documents, _field_caps tells per field
# whether any document has a value (include_empty_fields=false) and
# evaluates an index_filter against every tenant's values, _disk_usage and
# _field_usage_stats measure every tenant's fields. DERIVED: _ml results and
# category examples quote documents, _text_structure samples an index,
# OpenSearch's ML memory holds conversations and its agents search indices,
# _tasks describes running requests (other callers' queries with them),
# _recovery measures every shard's data. The search endpoints are matched
# before these rules, which cover their other methods and sub-paths.
# fmt: off
_APIS: Final[Mapping[_Rule, tuple[str, ...]]] = {
    _Rule.READ: ("_analyze", "_cat", "_pit", "_render", "_resolve", "_search_shards"),
    _Rule.WRITE: (
        "_bulk", "_create", "_create_from", "_delete_by_query", "_update", "_update_by_query",
    ),
    _Rule.DOCUMENT: ("_doc", "_source"),
    _Rule.CONTENT: (
        "_async_search", "_eql", "_explain", "_graph", "_insights", "_mget", "_mtermvectors",
        "_mvt", "_query", "_rank_eval", "_rollup_search", "_snapshot", "_sql", "_terms_enum",
        "_termvectors", "_count", "_validate", "_stats", "_segments", "_field_caps",
        "_disk_usage", "_field_usage_stats",
        "_plugins/_asynchronous_search", "_plugins/_ppl", "_plugins/_sql",
    ),
    _Rule.DERIVED: (
        "_knn_search", "_msearch", "_search", "_ml", "_text_structure", "_tasks", "_recovery",
        "_plugins/_alerting", "_plugins/_ml", "_plugins/_observability",
        "_plugins/_search_relevance", "_plugins/_security_analytics",
    ),
    _Rule.ADMIN: (
        "_alias", "_aliases", "_application", "_autoscaling", "_block", "_cache", "_ccr",
        "_clone", "_close", "_cluster", "_component_template", "_connector", "_dangling",
        "_data_stream", "_downsample", "_encryption", "_enrich", "_features",
        "_fleet", "_flush", "_forcemerge", "_health_report", "_ilm",
        "_index_template", "_inference", "_info", "_ingest", "_license", "_lifecycle", "_list",
        "_logstash", "_ltr", "_mapping", "_migration", "_monitoring", "_nodes", "_open",
        "_project", "_project_routing", "_query_rules", "_refresh", "_reindex",
        "_reload_search_analyzers", "_remote", "_remotestore", "_rollover", "_rollup",
        "_script_context", "_script_language", "_scripts", "_searchable_snapshots",
        "_security", "_settings", "_shard_stores", "_shrink", "_slm", "_split",
        "_ssl", "_streams", "_synonyms", "_template", "_transform",
        "_upgrade", "_watcher", "_wlm", "_xpack",
        "_plugins/_flow_framework", "_plugins/_ism", "_plugins/_knn", "_plugins/_ltr",
        "_plugins/_neural", "_plugins/_notifications", "_plugins/_query",
        "_plugins/_replication", "_plugins/_rollup", "_plugins/_security", "_plugins/_sm",
        "_plugins/_transform", "_plugins/geospatial", "_plugins/ubi",
    ),
}
# fmt: on
RULES: Final[Mapping[str, _Rule]] = {api: rule for rule, apis in _APIS.items() for api in apis}

# Sub-paths of /_search that are not searches: clearing a scroll and opening
# or closing an OpenSearch point in time return no documents; search
# pipelines are configuration.
_SEARCH_SUB_RULES: Final[Mapping[str, _Rule]] = {
    "scroll": _Rule.READ,
    "point_in_time": _Rule.READ,
    "pipeline": _Rule.ADMIN,
}

# Reports of _cat that count every tenant's documents or measure their data
# (docs.count, indexing totals, disk use, field data, recovered bytes, the
# records ML jobs and transforms processed).
_CAT_COUNTING: Final = frozenset(
    {
        "count", "indices", "shards", "segments", "nodes", "allocation", "fielddata",
        "recovery", "ml", "transforms",
    }
)  # fmt: skip
# Sub-paths of read and administrative APIs that are statistics: of the
# cluster and nodes, data streams, transforms, CCR, enrich, searchable
# snapshots, OpenSearch's k-NN and neural plugins (graphs, documents and
# vectors counted), and feature usage (indices, fields and vectors counted).
_STATISTICS: Final = frozenset({"stats", "_stats", "usage"})

# Actions that return stored documents, or results computed from them, from
# inside otherwise administrative APIs: datafeed and transform previews, watch
# and monitor executions, agents, searches over plugin indices.
_CONTENT_ACTIONS: Final = frozenset(
    {"_execute", "_msearch", "_predict", "_preview", "_search", "_train_predict"}
)
# Actions of content APIs that write indices: restoring or mounting a snapshot.
_WRITE_ACTIONS: Final = frozenset({"_mount", "_restore"})

SINGLE: Final = "single"  # one search response
MULTI: Final = "multi"  # {"responses": [search response or error, ...]}


def endpoint(path: str) -> tuple[str, list[str]] | None:
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
            return SINGLE
        case ("_msearch", [] | ["template"]) | ("_fleet", ["_fleet_msearch"]):
            return MULTI
    return None


def shape(route: Route) -> str | None:
    """The body shape of a FILTERED route (SINGLE or MULTI); None for every other route."""
    found = endpoint(route.path)
    if found is None or route.method.upper() not in ("GET", "POST"):
        return None
    return _search_shape(*found)


def _kind(method: str, api: str, rest: list[str]) -> RouteKind:
    if method in ("HEAD", "OPTIONS"):
        # No body: Elasticsearch answers HEAD like GET without it, OPTIONS with CORS headers.
        return RouteKind.READ
    if method in ("GET", "POST") and _search_shape(api, rest) is not None:
        return RouteKind.FILTERED
    # Unknown APIs are assumed to return stored data when read.
    rule = RULES.get(api, _Rule.DERIVED)
    if api == "_search" and rest:
        rule = _SEARCH_SUB_RULES.get(rest[0], _Rule.DERIVED)
    if api == "_cat" and not _CAT_COUNTING.isdisjoint(rest):
        rule = _Rule.CONTENT
    statistics = method == "GET" and not _STATISTICS.isdisjoint(rest)
    if statistics and rule in (_Rule.READ, _Rule.ADMIN):
        rule = _Rule.CONTENT
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


def route_kind(route: Route) -> RouteKind | None:
    """What ``route`` does; see ``ElasticsearchFormat.route_kind``."""
    method = route.method.upper()
    found = endpoint(route.path)
    if found is None:
        segments = [segment for segment in route.path.split("/") if segment]
        if not segments:
            return RouteKind.READ if method in ("GET", "HEAD") else None
        if any(_API_SEGMENT.fullmatch(segment) for segment in segments[2:]):
            # A typed path (/{index}/{type}/_search, /{index}/{type}/{id}/_source)
            # that compatibility mode still serves: nothing the gate reads.
            return RouteKind.CONTENT
        return None
    return _kind(method, *found)


# "Every index": what ``_all`` and ``*`` mean, and what a path without an
# index expression targets on the APIs that default to all indices.
EVERY_INDEX: Final = "*"

# APIs that act on every index when the path names none (``GET /_search``),
# and those whose indices are named in the body or stored server-side (a
# query language, multi-get, reindex): for the ownership check both mean
# every index. Multi-search is not among them: its header lines name its
# indices (``RequestRewrite.collections``).
_EVERY_INDEX_APIS: Final = frozenset(
    {
        "_alias", "_aliases", "_async_search", "_cache", "_count", "_data_stream",
        "_field_caps", "_flush", "_forcemerge", "_mapping", "_mget", "_mtermvectors",
        "_query", "_rank_eval", "_recovery", "_refresh", "_reindex", "_search_shards",
        "_segments", "_settings", "_shard_stores", "_sql", "_stats", "_validate",
        "_plugins/_asynchronous_search", "_plugins/_ppl", "_plugins/_sql",
    }
)  # fmt: skip
# ``_cat`` reports that take an index expression after their name.
_CAT_BY_INDEX: Final = frozenset({"aliases", "count", "indices", "recovery", "segments", "shards"})
# ``cluster:name``: cluster names hold neither ":" nor "<" (date math may hold ":").
_REMOTE: Final = re.compile(r"(?:([^<:]*):)?(.*)", re.DOTALL)


def index_names(expression: str) -> list[str]:
    """The names and patterns of one index expression, in order, without repeats.

    ``docs,logs-*`` is two names; ``_all`` and ``*`` are ``EVERY_INDEX``;
    wildcards stay patterns; ``remote:docs`` keeps its cluster (another
    cluster's index, not a local one); a selector (``docs::failures``) names
    its data stream; date math (``<logs-{now/d}>``) becomes the pattern of
    every date (``logs-*``). Exclusions (``-logs-old``) are left out: they
    only narrow the patterns before them, so checking those alone is the
    stricter check. An expression of exclusions only, or of nothing, names
    every index.
    """
    names: list[str] = []
    for item in expression.split(","):
        item = item.removeprefix("+")
        if not item or item.startswith("-"):
            continue
        if "::" in item:
            item = item[: item.rindex("::")]
        found = _REMOTE.fullmatch(item)
        assert found is not None  # the pattern matches any string
        cluster, name = found.groups()
        name = _undated(name)
        if not name:
            continue  # no index (the database refuses it)
        if name in ("_all", EVERY_INDEX):
            name = EVERY_INDEX
        names.append(name if cluster is None else f"{cluster}:{name}")
    return list(dict.fromkeys(names)) or [EVERY_INDEX]


def _undated(name: str) -> str:
    """A date math name as the pattern of the names it resolves to; other names as they are.

    ``<logs-{now/d{yyyy.MM.dd|+12:00}}>`` is ``logs-*``: each (nested) brace
    group is one date; ``\\{`` is a literal brace. Unbalanced braces: every name.
    """
    if not (name.startswith("<") and name.endswith(">")):
        return name
    out: list[str] = []
    depth = 0
    escaped = False
    for char in name[1:-1]:
        if escaped:
            escaped = False
            if depth == 0:
                out.append(char)
        elif char == "\\":
            escaped = True
        elif char == "{":
            if depth == 0:
                out.append("*")
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                return EVERY_INDEX
        elif depth == 0:
            out.append(char)
    return "".join(out) if depth == 0 and not escaped else EVERY_INDEX


def index_expression(route: Route) -> list[str] | None:
    """The indices ``route`` targets, as ``index_names`` reads them; None when it names none.

    The index expression is the path's first segment (``/docs/_search``,
    ``/logs-*,-logs-old/_doc/1``, ``/docs``), or follows a ``_cat`` report or
    ``_resolve/index``. APIs that default to every index (``/_search``,
    ``/_count``, ``/_mapping``, ...) or read indices named in the body (SQL,
    ``_mget``, ``_reindex``) give ``[EVERY_INDEX]``. Everything else names
    no index (None): cluster APIs, scroll and point-in-time continuations
    (their ids carry the indices of a search already checked), and
    multi-search, whose indices are in its header lines.
    """
    segments = [segment for segment in route.path.split("/") if segment]
    if not segments:
        return None
    found = endpoint(route.path)
    if found is None or segments[0] == "_all" or not _API_SEGMENT.fullmatch(segments[0]):
        return index_names(segments[0])
    api, rest = found
    if api == "_cat" and rest and rest[0] in _CAT_BY_INDEX:
        return index_names(rest[1]) if len(rest) > 1 else [EVERY_INDEX]
    if api == "_resolve" and len(rest) > 1 and rest[0] == "index":
        return index_names(rest[1])
    if (api == "_search" and rest in ([], ["template"])) or api in _EVERY_INDEX_APIS:
        return [EVERY_INDEX]
    if api == "_application" and rest[:1] == ["search_application"] and rest[-1:] == ["_search"]:
        return [EVERY_INDEX]  # the application's indices are stored server-side
    return None
