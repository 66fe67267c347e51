"""Chroma HTTP API v2 responses: collection query, get and search.

Chroma answers in columns rather than hit objects: ``ids`` and, per hit, the
parallel arrays ``documents``, ``metadatas``, ``embeddings``, ``uris`` and
``distances`` (``scores`` for search). A column the request did not include is
null. ``get`` returns flat columns (one entry per record); ``query`` and
``search`` return one inner list per query embedding (per search), and an inner
list may be null. Filtering removes the same index from every column, so each
kept id keeps its own document, metadata, embedding and distance.

Shapes follow the server's OpenAPI document (``QueryResponse``,
``GetResponse``, ``SearchResponse``; chromadb 1.5, served at ``/openapi.json``)
and the Python client (``chromadb.api.fastapi``: ``QueryResult``,
``GetResult``, ``SearchResult``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
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

_F, _R, _W = RouteKind.FILTERED, RouteKind.READ, RouteKind.WRITE
_NAME: Final = "{}"  # a path segment that names something: tenant, database, collection ...
_DB: Final = ("tenants", _NAME, "databases", _NAME)
_COLLECTION: Final = (*_DB, "collections", _NAME)

# The v2 routes (after /api/v2) of chromadb 1.5's OpenAPI document and of the
# Python server's router. The first entry whose segments and method match
# wins, so the literal "by-id" comes before the collection name it looks like.
_ROUTES: Final[tuple[tuple[tuple[str, ...], Mapping[str, RouteKind]], ...]] = (
    ((), {"GET": _R}),  # the Python server's root: a heartbeat
    (("heartbeat",), {"GET": _R}),
    (("healthcheck",), {"GET": _R}),
    (("version",), {"GET": _R}),
    (("pre-flight-checks",), {"GET": _R}),
    (("auth", "identity"), {"GET": _R}),
    (("reset",), {"POST": _W}),
    (("tenants",), {"POST": _W}),
    (("tenants", _NAME), {"GET": _R, "PATCH": _W}),
    (("tenants", _NAME, "databases"), {"GET": _R, "POST": _W}),
    (_DB, {"GET": _R, "DELETE": _W}),
    ((*_DB, "collections"), {"GET": _R, "POST": _W}),
    ((*_DB, "collections_count"), {"GET": _R}),
    ((*_DB, "collections", "by-id", _NAME), {"GET": _R}),
    (_COLLECTION, {"GET": _R, "PUT": _W, "DELETE": _W}),
    ((*_COLLECTION, "query"), {"POST": _F}),
    ((*_COLLECTION, "get"), {"POST": _F}),
    ((*_COLLECTION, "search"), {"POST": _F}),
    ((*_COLLECTION, "count"), {"GET": _R}),
    ((*_COLLECTION, "fork_count"), {"GET": _R}),
    ((*_COLLECTION, "indexing_status"), {"GET": _R}),
    ((*_COLLECTION, "add"), {"POST": _W}),
    ((*_COLLECTION, "update"), {"POST": _W}),
    ((*_COLLECTION, "upsert"), {"POST": _W}),
    ((*_COLLECTION, "delete"), {"POST": _W}),
    ((*_COLLECTION, "fork"), {"POST": _W}),
    ((*_COLLECTION, "functions", "attach"), {"POST": _W}),
    ((*_COLLECTION, "functions", _NAME), {"GET": _R}),  # the attached function, no records
    ((*_COLLECTION, "attached_functions", _NAME, "detach"), {"POST": _W}),
    (("collections", _NAME), {"GET": _R}),  # a collection by CRN
)

# The per-hit arrays a body may carry. "data" is what the Python server names
# loaded URIs; "scores" is search's name for distances.
_COLUMNS: Final = frozenset(
    {"documents", "metadatas", "embeddings", "uris", "distances", "scores", "data"}
)
# Arrays that describe the request, not hits: what was included or selected.
_DESCRIPTIVE: Final = frozenset({"include", "included", "select"})


def _segments_match(pattern: tuple[str, ...], segments: Sequence[str]) -> bool:
    return len(pattern) == len(segments) and all(
        segment == expected or (expected == _NAME and segment != "")
        for expected, segment in zip(pattern, segments, strict=True)
    )


def _v2_segments(path: str) -> list[str] | None:
    """The path segments after ``/api/v2``; None when the path is not under it."""
    if path == "/api/v2":
        return []
    if path.startswith("/api/v2/"):
        return path.removeprefix("/api/v2/").split("/")
    return None


def _kind(route: Route) -> RouteKind | None:
    segments = _v2_segments(route.path)
    if segments is None:
        # The v1 API is gone from chromadb 1.x (it answers 410). An older server
        # behind the gate would return records there that this adapter does
        # not read, so the whole legacy API counts as unfiltered content.
        if route.path == "/api/v1" or route.path.startswith("/api/v1/"):
            return RouteKind.CONTENT
        return None
    method = route.method.upper()
    # HEAD answers a GET without its body; OPTIONS (CORS preflight) returns no data.
    lookup = "GET" if method == "HEAD" else method
    known_path = False
    for pattern, kinds in _ROUTES:
        if _segments_match(pattern, segments):
            known_path = True
            if lookup in kinds:
                return kinds[lookup]
    if known_path and method == "OPTIONS":
        return RouteKind.READ
    # A route this adapter does not know (a newer server's, or a malformed
    # path) may return records: treat it as one that does.
    return RouteKind.CONTENT


# Filtered endpoint (last path segment) -> whether its columns hold one inner
# list per query (query, search) rather than one entry per record (get).
_NESTED: Final[Mapping[str, bool]] = {"query": True, "search": True, "get": False}


@dataclass(frozen=True, slots=True)
class _Columns:
    """A body's ids and per-hit arrays, one list per sub-result (get has one).

    ``arrays`` holds only the columns present as arrays; an inner list is None
    where a sub-result's column is null.
    """

    nested: bool
    ids: list[list[Any]]
    arrays: dict[str, list[list[Any] | None]]

    def cell(self, column: str, batch: int, index: int) -> tuple[bool, Any]:
        """``(True, value)`` when the hit has an entry in ``column``, else ``(False, None)``."""
        inner_lists = self.arrays.get(column)
        inner = None if inner_lists is None else inner_lists[batch if self.nested else 0]
        if inner is None:
            return False, None
        return True, inner[index]


def _columns(document: dict[str, Any], nested: bool) -> _Columns:
    ids = document.get("ids")
    if not isinstance(ids, list):
        raise MalformedBody("'ids' is not a list")
    batches: list[list[Any]] = ids if nested else [ids]
    if not all(isinstance(batch, list) for batch in batches):
        raise MalformedBody("an 'ids' entry is not a list")
    arrays: dict[str, list[list[Any] | None]] = {}
    for key, value in document.items():
        if key in _COLUMNS:
            if value is not None:
                arrays[key] = _aligned(key, value, batches, nested)
        elif key != "ids" and key not in _DESCRIPTIVE and isinstance(value, list | dict):
            # An array we do not know could be one more per-hit column: left
            # as it is, it would carry the rejected hits' data.
            raise MalformedBody("unknown array or object at the top level")
    for inner in arrays.get("metadatas", ()):
        # Replacements write into metadata objects, and the spec allows only these.
        if inner is not None and not all(m is None or isinstance(m, dict) for m in inner):
            raise MalformedBody("a 'metadatas' entry is not an object or null")
    return _Columns(nested, batches, arrays)


def _aligned(
    column: str, value: Any, batches: list[list[Any]], nested: bool
) -> list[list[Any] | None]:
    """``value`` as one inner list per batch, checked to line up with ``ids``."""
    if not isinstance(value, list):
        raise MalformedBody(f"'{column}' is not a list or null")
    inner_lists: list[Any] = value if nested else [value]
    if len(inner_lists) != len(batches):
        raise MalformedBody(f"'{column}' does not line up with 'ids'")
    for inner, batch_ids in zip(inner_lists, batches, strict=True):
        if inner is None and nested:
            continue  # search leaves out the columns a search did not select
        if not isinstance(inner, list) or len(inner) != len(batch_ids):
            raise MalformedBody(f"'{column}' does not line up with 'ids'")
    return inner_lists


@dataclass(frozen=True, slots=True)
class _ChromaBody:
    candidates: Sequence[Candidate]
    _document: dict[str, Any]
    _columns: _Columns
    _hits: tuple[tuple[int, int], ...]  # position -> (batch, index in batch)
    _id_field: str | None

    def render(
        self,
        keep: Collection[int],
        limits: Sequence[int | None] | None = None,
        replacements: Mapping[int, Replacement] | None = None,
    ) -> bytes:
        """Serialise the body with only the hits whose position is in ``keep``.

        Every column loses the same entries, so the arrays stay aligned; null
        columns and the request's ``include``/``select`` stay as they are. A
        replaced hit takes the substitute's id (``ids`` entry, or the metadata
        field ``id_field``) and document, and its metadata gains
        ``retrieval_gate_substituted_for``; see ``ParsedBody.render``.
        """
        no_limits(limits)
        kept = self._kept_by_batch(keep)
        changed = self._substituted(kept, replacements or {})
        rendered: dict[str, Any] = {}
        for key, value in self._document.items():
            if key == "ids" or key in self._columns.arrays:
                rendered[key] = self._render_column(key, kept, changed)
            else:
                rendered[key] = value
        return orjson.dumps(rendered)

    def released_positions(
        self, keep: Collection[int], limits: Sequence[int | None] | None = None
    ) -> list[int]:
        """The positions ``render`` sends, in body order."""
        no_limits(limits)
        return kept_in_order(range(len(self._hits)), keep)

    def _kept_by_batch(self, keep: Collection[int]) -> list[list[tuple[int, int]]]:
        """Per batch, the kept ``(position, index)`` pairs in rank order."""
        kept: list[list[tuple[int, int]]] = [[] for _ in self._columns.ids]
        for position in kept_in_order(range(len(self._hits)), keep):
            batch, index = self._hits[position]
            kept[batch].append((position, index))
        return kept

    def _render_column(
        self,
        column: str,
        kept: list[list[tuple[int, int]]],
        changed: Mapping[tuple[int, str], Any],
    ) -> Any:
        source = self._columns.ids if column == "ids" else self._columns.arrays[column]
        inner_lists = [
            None
            if inner is None
            else [
                changed[(position, column)] if (position, column) in changed else inner[index]
                for position, index in batch_kept
            ]
            for inner, batch_kept in zip(source, kept, strict=True)
        ]
        return inner_lists if self._columns.nested else inner_lists[0]

    def _substituted(
        self, kept: list[list[tuple[int, int]]], replacements: Mapping[int, Replacement]
    ) -> dict[tuple[int, str], Any]:
        """New values of the cells that replacements change: ``(position, column) -> value``."""
        changed: dict[tuple[int, str], Any] = {}
        for batch, batch_kept in enumerate(kept):
            for position, index in batch_kept:
                replacement = replacements.get(position)
                if replacement is not None:
                    changed.update(self._replaced_cells(position, batch, index, replacement))
        return changed

    def _replaced_cells(
        self, position: int, batch: int, index: int, replacement: Replacement
    ) -> dict[tuple[int, str], Any]:
        columns = self._columns
        cells: dict[tuple[int, str], Any] = {}
        has_metadata, metadata = columns.cell("metadatas", batch, index)
        # A copy: the parsed document is never changed, render may run again.
        new_metadata = dict(metadata or {})
        if self._id_field is None:
            old_id = columns.ids[batch][index]
            cells[(position, "ids")] = replacement.chunk_id
        else:
            old_id = new_metadata.get(self._id_field)
            new_metadata[self._id_field] = replacement.chunk_id
        new_metadata[SUBSTITUTED_FOR] = old_id
        if has_metadata:
            cells[(position, "metadatas")] = new_metadata
        if columns.cell("documents", batch, index)[0]:
            cells[(position, "documents")] = replacement.text
        return cells


class ChromaFormat:
    """Adapter for Chroma's HTTP API v2: filters query, get and search responses.

    The chunk id is the Chroma record id (``ids[i]``), or the metadata field
    ``id_field`` when set. The chunk text is always the record's document
    (``documents[i]``): Chroma stores text in its own column, so ``text_field``
    is accepted for a uniform configuration and not used.
    """

    def __init__(self, *, text_field: str = "text", id_field: str | None = None) -> None:
        check_fields(text_field, id_field)
        self.text_field = text_field
        self.id_field = id_field

    @property
    def name(self) -> str:
        """Short stable name, used as the ``format`` metric label."""
        return "chroma"

    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does in Chroma's API; None outside ``/api/v2`` and ``/api/v1``.

        FILTERED: POST ``.../collections/{id}/query``, ``/get``, ``/search``.
        READ: heartbeat, version, health, identity, and the GETs of tenants,
        databases, collections, counts and attached functions. WRITE: every
        route that creates, changes or deletes. CONTENT: the legacy ``/api/v1``
        and any ``/api/v2`` route not in the API this adapter knows.
        """
        return _kind(route)

    def parse(self, body: bytes, route: Route) -> ParsedBody:
        """Parse a successful response body; raise MalformedBody if it is not one.

        Raises ValueError if ``route`` is not one this format filters.
        """
        if _kind(route) is not RouteKind.FILTERED:
            raise ValueError("route is not filtered by the chroma format")
        nested = _NESTED[route.path.rsplit("/", 1)[-1]]
        return parse_guarded(self.name, lambda: self._parse(body, nested))

    def _parse(self, body: bytes, nested: bool) -> _ChromaBody:
        document = load_object(body)
        columns = _columns(document, nested)
        hits = tuple(
            (batch, index)
            for batch, batch_ids in enumerate(columns.ids)
            for index in range(len(batch_ids))
        )
        candidates = tuple(
            self._candidate(position, columns, batch, index)
            for position, (batch, index) in enumerate(hits)
        )
        return _ChromaBody(candidates, document, columns, hits, self.id_field)

    # Problems name the field, never its value: they end up in audit records.

    def _candidate(self, position: int, columns: _Columns, batch: int, index: int) -> Candidate:
        has_document, document = columns.cell("documents", batch, index)
        text = usable_text(document, "document") if has_document else (None, "no documents")
        if self.id_field is None:
            return make_candidate(position, usable_id(columns.ids[batch][index], "id"), text)
        has_metadata, metadata = columns.cell("metadatas", batch, index)
        if not has_metadata:
            return make_candidate(position, (None, "no metadatas"), text)
        if metadata is None:
            return make_candidate(position, (None, "metadata missing"), text)
        field = usable_id(metadata.get(self.id_field), f"metadata field {self.id_field!r}")
        return make_candidate(position, field, text)
