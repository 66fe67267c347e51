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
record hits). Everything else in a body (``namespace``, ``usage``: read units
measure the work done, not what is returned) is kept as it is. Shapes follow the data-plane
OpenAPI specs (pinecone-io/pinecone-api, versions 2025-01 to 2026-07).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.core.hits import Route, RouteKind
from sidecar.formats.base import MalformedBody, ResponseAdapter, id_field_option, text_field_option
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.hits import Field, HitLayout, Hits

# Rebuilds the top-level object for a selection; containers are copied, hits
# are not, and the parsed document is never changed.
_Rebuild = Callable[[Selection], dict[str, Any]]
_HITS_PROBLEM: Final = "a list of hits is not a JSON array"


def _hit_list(value: Any, hits: Hits) -> Callable[[Selection], list[Any]]:
    start = hits.add_list(value, _HITS_PROBLEM).start
    return lambda selection: selection.sent(value, start)


def _parse_query(document: dict[str, Any], hits: Hits) -> _Rebuild:
    """``QueryResponse``: ``matches`` and the deprecated ``results``, in key order."""
    parts: dict[str, Callable[[Selection], list[Any]]] = {}
    for key, value in document.items():
        if key == "matches":
            parts[key] = _hit_list(value, hits)
        elif key == "results":
            parts[key] = _legacy_results(value, hits)

    def rebuild(selection: Selection) -> dict[str, Any]:
        return {
            key: parts[key](selection) if key in parts else value for key, value in document.items()
        }

    return rebuild


def _legacy_results(value: Any, hits: Hits) -> Callable[[Selection], list[Any]]:
    """``results``: one ``SingleQueryResults`` per query of a deprecated multi-query.

    Every entry stays, even when none of its matches do: entries answer the
    request's ``queries`` in order.
    """
    if not isinstance(value, list):
        raise MalformedBody("'results' is not a JSON array")
    entries: list[tuple[dict[str, Any], Callable[[Selection], list[Any]] | None]] = []
    for entry in value:
        if not isinstance(entry, dict):
            raise MalformedBody("a query result is not a JSON object")
        entries.append((entry, _hit_list(entry["matches"], hits) if "matches" in entry else None))

    def render(selection: Selection) -> list[Any]:
        return [
            entry if matches is None else {**entry, "matches": matches(selection)}
            for entry, matches in entries
        ]

    return render


def _parse_search(document: dict[str, Any], hits: Hits) -> _Rebuild:
    """``SearchRecordsResponse``: ``result.hits``; both are required by the spec."""
    result = document.get("result")
    if not isinstance(result, dict) or "hits" not in result:
        raise MalformedBody("no 'result' object with 'hits'")
    render_hits = _hit_list(result["hits"], hits)
    return lambda selection: {**document, "result": {**result, "hits": render_hits(selection)}}


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """A filtered endpoint: where its hits keep their id and free-form fields, and its body."""

    id_key: str
    fields_key: str
    parse: Callable[[dict[str, Any], Hits], _Rebuild]


_QUERY: Final = _Endpoint("id", "metadata", _parse_query)  # ScoredVector, from /query
# Hit, from /records/namespaces/{ns}/search
_SEARCH: Final = _Endpoint("_id", "fields", _parse_search)


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


def _endpoint(route: Route) -> _Endpoint | None:
    """The filtered endpoint ``route`` calls, if any."""
    if route.method.upper() != "POST":
        return None
    match _segments(route):
        case ["", "query"]:
            return _QUERY
        case ["", "records", "namespaces", namespace, "search"] if namespace:
            return _SEARCH
    return None


def _listing_or_write(route: Route) -> RouteKind:
    """Collections of records' metadata (namespaces): reading them is content, the rest writes."""
    return RouteKind.CONTENT if route.method.upper() in ("GET", "HEAD") else RouteKind.WRITE


def _read_or_write(route: Route) -> RouteKind:
    """Collections of metadata (namespaces, aliases, imports): GET reads, the rest writes."""
    return RouteKind.READ if route.method.upper() in ("GET", "HEAD") else RouteKind.WRITE


class PineconeFormat(ResponseAdapter[_Endpoint]):
    """Adapter for the data-plane REST API of a Pinecone index host."""

    name = "pinecone"

    def __init__(self, *, text_field: str = "text", id_field: str | None = None) -> None:
        self.text_field = text_field_option(text_field)
        self.id_field = id_field_option(id_field, self.text_field)

    def _layout(self, endpoint: _Endpoint) -> HitLayout:
        key = endpoint.fields_key
        text = Field((self.text_field,), f"{key} field {self.text_field!r}", key)
        if self.id_field is None:
            chunk_id = Field((endpoint.id_key,), "hit id")
        else:
            chunk_id = Field((self.id_field,), f"{key} field {self.id_field!r}", key)
        return HitLayout("hit", chunk_id, text, (key,))

    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does on an index host; None for paths that are not its API.

        FILTERED: ``POST /query`` and ``POST /records/namespaces/{ns}/search``.
        CONTENT: vector fetches, the documents API's search and fetch, other
        methods on the filtered paths, unknown paths under ``/vectors``,
        ``/records`` or ``/namespaces/{ns}/`` (they may return stored data),
        and what counts or lists records of every tenant: index stats, vector
        and document id lists, GET on namespaces. READ: GET on namespace
        aliases and imports. WRITE: upserts, updates, deletes and
        every other method on those collections.
        """
        if _endpoint(route) is not None:
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
            case ["", "namespaces"] | ["", "namespaces", _]:
                # Namespace names and record counts: often one namespace per tenant.
                return _listing_or_write(route)
            case (
                ["", "namespace-aliases"]
                | ["", "namespace-aliases", _]
                | ["", "bulk", "imports"]
                | ["", "bulk", "imports", _]
            ):
                return _read_or_write(route)
        return None

    def _shape(self, route: Route) -> _Endpoint | None:
        return _endpoint(route)

    def _read(self, document: dict[str, Any], shape: _Endpoint) -> _PineconeBody:
        hits = Hits(self._layout(shape))
        rebuild = shape.parse(document, hits)
        return _PineconeBody(hits, rebuild)
