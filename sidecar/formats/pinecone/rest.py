"""Pinecone data-plane responses: vector queries and record searches.

Two endpoints of an index host return hits with their stored fields, and only
these are filtered:

- ``POST /query`` returns a ``QueryResponse``: ``matches`` (``ScoredVector``
  objects: ``id``, ``score``, ``values``, ``sparseValues``, ``metadata``) and,
  from API versions that still declare it, the deprecated ``results`` array of
  per-query ``{"matches", "namespace"}`` objects. The chunk text is the
  metadata field ``text_field``.
- ``POST /records/namespaces/{namespace}/search`` returns a
  ``SearchRecordsResponse``: ``result.hits`` (``_id``, ``_score``, ``fields``).
  The chunk text is ``fields[text_field]``.

The chunk id is the hit id (``id`` of a query match, ``_id`` of a record hit),
or the metadata (record) field ``id_field`` when set. A substitute takes the
hit's text and id, and the marker goes into its metadata (``fields`` for
record hits).

The body that goes out is rebuilt from known keys only. A query response
keeps ``matches`` (at most the over-fetched request's ``topK``), ``results``
(each entry's ``matches``, likewise, and ``namespace``) and ``namespace``
(the one the request named); a records search keeps ``result.hits`` (at most ``top_k``).
A hit keeps its own keys listed above, and of its metadata (``fields``) only
the text and id fields and the declared ``hashed_fields`` and
``releasable_fields``. Read units are computed over every record of the
namespace, whichever tenant's, so ``usage`` is dropped from a query
response (the client models it as optional) and a records search's (which
the client requires) goes out as ``{"read_units": 0}`` with
``embed_total_tokens`` (the tokens of the caller's own query text) kept.
Everything else is dropped. A body on ``POST /query`` with neither
``matches`` nor ``results`` is not a Pinecone query response (an in-house
``/query`` API, say) and is refused as malformed, never passed.

Shapes follow the data-plane OpenAPI specs (pinecone-io/pinecone-api,
versions 2025-01 to 2026-07). Requests are rewritten by ``rest_request``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.core.hits import Route, RouteKind
from sidecar.formats.base import MalformedBody, ResponseAdapter
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.hits import Field, HitLayout, Hits
from sidecar.formats.options import DEFAULT_OPTIONS, AdapterOptions
from sidecar.formats.pinecone.rest_request import Endpoint, PineconeRequests, endpoint

# Rebuilds the top-level object for a selection; the parsed document is
# never changed.
_Rebuild = Callable[[Selection], dict[str, Any]]
_HITS_PROBLEM: Final = "a list of hits is not a JSON array"
# The keys of a hit that are Pinecone's own (ScoredVector; search Hit).
_MATCH_KEYS: Final = frozenset({"id", "score", "values", "sparseValues", "metadata"})
_RECORD_KEYS: Final = frozenset({"_id", "_score", "fields"})


def _hit_list(value: Any, hits: Hits, trimmed: bool) -> Callable[[Selection], list[Any]]:
    """A list of hits; ``trimmed`` ones keep at most the request's limit."""
    start = hits.add_list(value, _HITS_PROBLEM).start
    if trimmed:
        return lambda selection: selection.sent(value, start, selection.limits[0])
    return lambda selection: selection.sent(value, start)


def _namespace(value: Any) -> Any:
    if value is not None and not isinstance(value, str):
        raise MalformedBody("'namespace' is not a string")
    return value


def _parse_query(document: dict[str, Any], hits: Hits) -> _Rebuild:
    """``QueryResponse``: ``matches``, the deprecated ``results`` and ``namespace``,
    in key order."""
    if "matches" not in document and "results" not in document:
        raise MalformedBody("no 'matches' in body")
    parts: dict[str, Callable[[Selection], Any]] = {}
    for key, value in document.items():
        if key == "matches":
            parts[key] = _hit_list(value, hits, trimmed=True)
        elif key == "results":
            parts[key] = _legacy_results(value, hits)
    namespace = _namespace(document.get("namespace"))

    def rebuild(selection: Selection) -> dict[str, Any]:
        out = {key: part(selection) for key, part in parts.items()}
        if "namespace" in document:
            out["namespace"] = namespace
        return out

    return rebuild


def _legacy_results(value: Any, hits: Hits) -> Callable[[Selection], list[Any]]:
    """``results``: one ``SingleQueryResults`` per query of a deprecated multi-query.

    Every entry stays, even when none of its matches do: entries answer the
    request's ``queries`` in order. Multi-queries are never over-fetched, so
    the one limit trims only an answer in this shape to a single query,
    which was: each entry to the app's ``topK``.
    """
    if not isinstance(value, list):
        raise MalformedBody("'results' is not a JSON array")
    entries: list[tuple[Callable[[Selection], list[Any]] | None, Any, bool]] = []
    for entry in value:
        if not isinstance(entry, dict):
            raise MalformedBody("a query result is not a JSON object")
        matches = _hit_list(entry["matches"], hits, trimmed=True) if "matches" in entry else None
        entries.append((matches, _namespace(entry.get("namespace")), "namespace" in entry))

    def render(selection: Selection) -> list[Any]:
        rendered = []
        for matches, namespace, has_namespace in entries:
            entry: dict[str, Any] = {} if matches is None else {"matches": matches(selection)}
            if has_namespace:
                entry["namespace"] = namespace
            rendered.append(entry)
        return rendered

    return render


def _parse_search(document: dict[str, Any], hits: Hits) -> _Rebuild:
    """``SearchRecordsResponse``: ``result.hits``, and ``usage`` as the gate writes it."""
    result = document.get("result")
    if not isinstance(result, dict) or "hits" not in result:
        raise MalformedBody("no 'result' object with 'hits'")
    usage = document.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise MalformedBody("'usage' is not a JSON object")
    written: dict[str, Any] = {"read_units": 0}
    tokens = (usage or {}).get("embed_total_tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        written["embed_total_tokens"] = tokens
    render_hits = _hit_list(result["hits"], hits, trimmed=True)
    return lambda selection: {"result": {"hits": render_hits(selection)}, "usage": written}


@dataclass(frozen=True, slots=True)
class _Shape:
    """Where the hits of an endpoint keep their id and free-form fields, and its body."""

    id_key: str
    fields_key: str
    hit_keys: frozenset[str]
    parse: Callable[[dict[str, Any], Hits], _Rebuild]


_QUERY: Final = _Shape("id", "metadata", _MATCH_KEYS, _parse_query)  # ScoredVector
_SEARCH: Final = _Shape("_id", "fields", _RECORD_KEYS, _parse_search)  # search Hit


@dataclass(eq=False)
class _PineconeBody(HitBody):
    rebuild: _Rebuild

    def _rebuild(self, selection: Selection) -> dict[str, Any]:
        return self.rebuild(selection)


_VECTOR_KINDS: Final[Mapping[str, RouteKind]] = {
    "fetch": RouteKind.CONTENT,  # vectors with their metadata, by id
    "fetch_by_metadata": RouteKind.CONTENT,  # the same, by metadata filter
    # The ids of every tenant's vectors, and with a prefix a match test on them.
    "list": RouteKind.CONTENT,
    "upsert": RouteKind.WRITE,
    "update": RouteKind.WRITE,
    "delete": RouteKind.WRITE,
}
_DOCUMENT_KINDS: Final[Mapping[str, RouteKind]] = {
    "search": RouteKind.CONTENT,  # 2026-07 documents API: not filtered by this adapter
    "fetch": RouteKind.CONTENT,
    "list": RouteKind.CONTENT,  # the ids of every tenant's documents
    "upsert": RouteKind.WRITE,
    "update": RouteKind.WRITE,
    "delete": RouteKind.WRITE,
}


def _segments(route: Route) -> list[str]:
    # Lower case: a case variant of a route must not be claimed less strictly
    # than the route itself, whatever the host's router does with it.
    return route.path.removesuffix("/").lower().split("/")


def _listing_or_write(route: Route) -> RouteKind:
    """Collections that name or count records (namespaces, their aliases, imports):
    reading them is content, the rest writes."""
    return RouteKind.CONTENT if route.method.upper() in ("GET", "HEAD") else RouteKind.WRITE


class PineconeFormat(ResponseAdapter[Endpoint], PineconeRequests):
    """Adapter for the data-plane REST API of a Pinecone index host: filters
    responses, rewrites search requests."""

    name = "pinecone"

    def __init__(self, options: AdapterOptions = DEFAULT_OPTIONS) -> None:
        """The text, the id (None: the hit's id, not the text field) and the released
        fields are metadata (record ``fields``) paths; everything else is dropped."""
        self.text_field = options.text_field
        self.id_field = options.distinct_id_field()
        self._layouts = {shape: self._layout(shape, options) for shape in (_QUERY, _SEARCH)}

    @property
    def twin_layout(self) -> HitLayout:
        """How a ``/query`` match is read and released; the gRPC twin reads its matches
        (ScoredVectors) so too."""
        return self._layouts[_QUERY]

    def _layout(self, shape: _Shape, options: AdapterOptions) -> HitLayout:
        key = shape.fields_key
        text = options.text_at(f"{key} field", key)
        chunk_id = options.id_at(Field((shape.id_key,), "hit id"), f"{key} field", key)
        return HitLayout(
            "hit", chunk_id, text, (key,), hit_keys=shape.hit_keys, fields=options.fields
        )

    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does on an index host; None for paths that are not its API.

        FILTERED: ``POST /query`` and ``POST /records/namespaces/{ns}/search``.
        CONTENT: vector fetches, the documents API's search and fetch, other
        methods on the filtered paths, unknown paths under ``/vectors``,
        ``/records`` or ``/namespaces/{ns}/`` (they may return stored data),
        and what counts, lists or names records of every tenant: index stats,
        vector and document id lists, GET on namespaces and on namespace
        aliases (each names its namespace), GET on bulk imports (their source
        URIs and ``recordsImported``). WRITE: upserts, updates, deletes and
        every other method on those collections.
        """
        if endpoint(route) is not None:
            return RouteKind.FILTERED
        match _segments(route):
            case ["", "records", "namespaces", namespace, "upsert"] if namespace:
                return RouteKind.WRITE
            case ["", "vectors", action]:
                return _VECTOR_KINDS.get(action, RouteKind.CONTENT)
            case ["", "query"] | ["", "records", *_] | ["", "vectors", *_]:
                return RouteKind.CONTENT
            case ["", "describe_index_stats"]:
                # Vector counts per namespace, and with a filter the count of
                # matches: an oracle for other tenants' metadata.
                return RouteKind.CONTENT
            case ["", "namespaces", namespace, "documents", action] if namespace:
                return _DOCUMENT_KINDS.get(action, RouteKind.CONTENT)
            case ["", "namespaces", namespace, _, *_] if namespace:
                return RouteKind.CONTENT
            case (
                ["", "namespaces"]
                | ["", "namespaces", _]
                | ["", "namespace-aliases"]
                | ["", "namespace-aliases", _]
                | ["", "bulk", "imports"]
                | ["", "bulk", "imports", _]
            ):
                # Namespace names and record counts (often one namespace per
                # tenant), aliases naming them, imports' source URIs and counts.
                return _listing_or_write(route)
        return None

    def _shape(self, route: Route) -> Endpoint | None:
        return endpoint(route)

    def _read(self, document: dict[str, Any], shape: Endpoint) -> _PineconeBody:
        body_shape = _SEARCH if shape.records else _QUERY
        hits = Hits(self._layouts[body_shape])
        rebuild = body_shape.parse(document, hits)
        return _PineconeBody(hits, rebuild, sub_results=1)
