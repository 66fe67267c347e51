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

Everything else in a body (``namespace``, ``usage``: read units measure the
work done, not what is returned) is kept as it is. Shapes follow the data-plane
OpenAPI specs (pinecone-io/pinecone-api, versions 2025-01 to 2026-07).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

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


@dataclass(frozen=True, slots=True)
class _HitShape:
    """Where a hit of one endpoint keeps its id and its free-form fields."""

    id_key: str
    fields_key: str


_MATCH: Final = _HitShape("id", "metadata")  # ScoredVector, from /query
_RECORD: Final = _HitShape("_id", "fields")  # Hit, from /records/namespaces/{ns}/search


class _Hits:
    """The hits of one body in document order, and their candidates."""

    def __init__(self, shape: _HitShape, text_field: str, id_field: str | None) -> None:
        self.shape = shape
        self.text_field = text_field
        self.id_field = id_field
        self.items: list[dict[str, Any]] = []
        self.candidates: list[Candidate] = []

    def add_list(self, value: Any) -> range:
        """Register a JSON array of hits; returns their positions."""
        if not isinstance(value, list):
            raise MalformedBody("a list of hits is not a JSON array")
        start = len(self.items)
        for hit in value:
            if not isinstance(hit, dict):
                raise MalformedBody("a hit is not a JSON object")
            self.candidates.append(self._candidate(len(self.items), hit))
            self.items.append(hit)
        return range(start, len(self.items))

    # Problems name the field, never its value: they end up in audit records.

    def _candidate(self, position: int, hit: dict[str, Any]) -> Candidate:
        key = self.shape.fields_key
        fields = hit.get(key)
        if not isinstance(fields, dict):
            # Absent or null: the request did not ask for metadata (or fields).
            problem = (None, f"no {key}" if fields is None else f"{key} is not an object")
            return make_candidate(
                position, problem if self.id_field else self._hit_id(hit), problem
            )
        text = usable_text(fields.get(self.text_field), f"{key} field {self.text_field!r}")
        if self.id_field:
            field_id = usable_id(fields.get(self.id_field), f"{key} field {self.id_field!r}")
            return make_candidate(position, field_id, text)
        return make_candidate(position, self._hit_id(hit), text)

    def _hit_id(self, hit: dict[str, Any]) -> tuple[str | None, str | None]:
        return usable_id(hit.get(self.shape.id_key), "hit id")

    def rendered(self, position: int, replacement: Replacement | None) -> dict[str, Any]:
        """The hit as sent: itself, or a copy carrying its substitute."""
        hit = self.items[position]
        if replacement is None:
            return hit
        key = self.shape.fields_key
        original = hit.get(key)
        fields = dict(original) if isinstance(original, dict) else {}
        old_id = fields.get(self.id_field) if self.id_field else hit.get(self.shape.id_key)
        fields[self.text_field] = replacement.text
        fields[SUBSTITUTED_FOR] = old_id
        substitute = {**hit, key: fields}
        if self.id_field:
            fields[self.id_field] = replacement.chunk_id
        else:
            substitute[self.shape.id_key] = replacement.chunk_id
        return substitute


# Renders the kept hits among some positions (a list of hits in the body).
_Kept = Callable[[range], list[Any]]
# Rebuilds the top-level object around the kept hits; containers are copied,
# hits are not, and the parsed document is never changed.
_Rebuild = Callable[[_Kept], dict[str, Any]]


def _hit_list(positions: range) -> Callable[[_Kept], list[Any]]:
    return lambda kept: kept(positions)


def _parse_query(document: dict[str, Any], hits: _Hits) -> _Rebuild:
    """``QueryResponse``: ``matches`` and the deprecated ``results``, in key order."""
    parts: dict[str, Callable[[_Kept], list[Any]]] = {}
    for key, value in document.items():
        if key == "matches":
            parts[key] = _hit_list(hits.add_list(value))
        elif key == "results":
            parts[key] = _legacy_results(value, hits)

    def rebuild(kept: _Kept) -> dict[str, Any]:
        return {key: parts[key](kept) if key in parts else value for key, value in document.items()}

    return rebuild


def _legacy_results(value: Any, hits: _Hits) -> Callable[[_Kept], list[Any]]:
    """``results``: one ``SingleQueryResults`` per query of a deprecated multi-query.

    Every entry stays, even when none of its matches do: entries answer the
    request's ``queries`` in order.
    """
    if not isinstance(value, list):
        raise MalformedBody("'results' is not a JSON array")
    entries: list[tuple[dict[str, Any], range | None]] = []
    for entry in value:
        if not isinstance(entry, dict):
            raise MalformedBody("a query result is not a JSON object")
        entries.append((entry, hits.add_list(entry["matches"]) if "matches" in entry else None))

    def render(kept: _Kept) -> list[Any]:
        return [
            entry if positions is None else {**entry, "matches": kept(positions)}
            for entry, positions in entries
        ]

    return render


def _parse_search(document: dict[str, Any], hits: _Hits) -> _Rebuild:
    """``SearchRecordsResponse``: ``result.hits``; both are required by the spec."""
    result = document.get("result")
    if not isinstance(result, dict) or "hits" not in result:
        raise MalformedBody("no 'result' object with 'hits'")
    positions = hits.add_list(result["hits"])
    return lambda kept: {**document, "result": {**result, "hits": kept(positions)}}


@dataclass(frozen=True, slots=True)
class _Endpoint:
    shape: _HitShape
    parse: Callable[[dict[str, Any], _Hits], _Rebuild]


_QUERY: Final = _Endpoint(_MATCH, _parse_query)
_SEARCH: Final = _Endpoint(_RECORD, _parse_search)


@dataclass(frozen=True, slots=True)
class _PineconeBody:
    candidates: Sequence[Candidate]
    _hits: _Hits
    _rebuild: _Rebuild

    def render(
        self,
        keep: Collection[int],
        limits: Sequence[int | None] | None = None,
        replacements: Mapping[int, Replacement] | None = None,
    ) -> bytes:
        """Serialise the body with only the hits whose position is in ``keep``.

        A replaced hit gets the substitute's text and id (the hit id, or
        ``id_field``) and a ``retrieval_gate_substituted_for`` field in its
        metadata (``fields`` for record hits); see ``ParsedBody.render``.
        """
        no_limits(limits)
        kept_positions = frozenset(keep)
        substitutes = replacements or {}

        def kept(positions: range) -> list[Any]:
            return [
                self._hits.rendered(position, substitutes.get(position))
                for position in positions
                if position in kept_positions
            ]

        return orjson.dumps(self._rebuild(kept))

    def released_positions(
        self, keep: Collection[int], limits: Sequence[int | None] | None = None
    ) -> list[int]:
        """The positions ``render`` sends, in body order: every kept one."""
        no_limits(limits)
        return kept_in_order(range(len(self.candidates)), keep)


_VECTOR_KINDS: Final[Mapping[str, RouteKind]] = {
    "fetch": RouteKind.CONTENT,  # vectors with their metadata, by id
    "fetch_by_metadata": RouteKind.CONTENT,  # the same, by metadata filter
    "list": RouteKind.READ,  # ids only (ListItem has nothing else)
    "upsert": RouteKind.WRITE,
    "update": RouteKind.WRITE,
    "delete": RouteKind.WRITE,
}
_DOCUMENT_KINDS: Final[Mapping[str, RouteKind]] = {
    "search": RouteKind.CONTENT,  # 2026-07 documents API: not filtered by this adapter
    "fetch": RouteKind.CONTENT,
    "list": RouteKind.READ,  # ids only
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


def _read_or_write(route: Route) -> RouteKind:
    """Collections of metadata (namespaces, aliases, imports): GET reads, the rest writes."""
    return RouteKind.READ if route.method.upper() in ("GET", "HEAD") else RouteKind.WRITE


class PineconeFormat:
    """Adapter for the data-plane REST API of a Pinecone index host.

    The chunk id is the hit id (``id`` of a query match, ``_id`` of a record
    hit), or the metadata (record) field ``id_field`` when set; the chunk text
    is the metadata (record) field ``text_field``.
    """

    def __init__(self, *, text_field: str = "text", id_field: str | None = None) -> None:
        check_fields(text_field, id_field)
        if id_field == text_field:
            raise ValueError("id_field must differ from text_field")
        self.text_field = text_field
        self.id_field = id_field

    @property
    def name(self) -> str:
        """Short stable name, used as the ``format`` metric label."""
        return "pinecone"

    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does on an index host; None for paths that are not its API.

        FILTERED: ``POST /query`` and ``POST /records/namespaces/{ns}/search``.
        CONTENT: vector fetches, the documents API's search and fetch, other
        methods on the filtered paths, and unknown paths under ``/vectors``,
        ``/records`` or ``/namespaces/{ns}/`` (they may return stored data).
        READ: index stats, vector and document id lists, GET on namespaces,
        namespace aliases and imports. WRITE: upserts, updates, deletes and
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
                return RouteKind.READ
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
                return _read_or_write(route)
        return None

    def parse(self, body: bytes, route: Route) -> ParsedBody:
        """Parse a successful response body; raise MalformedBody if it is not one.

        Raises ValueError if ``route`` is not one this format filters.
        """
        endpoint = _endpoint(route)
        if endpoint is None:
            raise ValueError("route is not handled by the pinecone format")
        return parse_guarded(self.name, lambda: self._parse(body, endpoint))

    def _parse(self, body: bytes, endpoint: _Endpoint) -> _PineconeBody:
        document = load_object(body)
        hits = _Hits(endpoint.shape, self.text_field, self.id_field)
        rebuild = endpoint.parse(document, hits)
        return _PineconeBody(tuple(hits.candidates), hits, rebuild)
