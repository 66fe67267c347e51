"""Chroma HTTP API v2 responses: collection query, get and search.

Chroma answers in columns rather than hit objects: ``ids`` and, per hit, the
parallel arrays ``documents``, ``metadatas``, ``embeddings``, ``uris`` and
``distances`` (``scores`` for search). A column the request did not include is
null. ``get`` returns flat columns (one entry per record); ``query`` and
``search`` return one inner list per query embedding (per search), and an inner
list may be null. Filtering removes the same index from every column, so each
kept id keeps its own document, metadata, embedding and distance.

The chunk id is the Chroma record id (``ids[i]``), or the metadata field
``id_field`` when set. The chunk text is always the record's document
(``documents[i]``): Chroma stores text in its own column, so the adapter takes
no ``text_field``. A substitute takes the hit's id and document, and its
metadata gains the marker; the hit is read and written as a row of its cells
(``{"ids": ..., "documents": ..., "metadatas": ...}``), one per column present.

Shapes follow the server's OpenAPI document (``QueryResponse``,
``GetResponse``, ``SearchResponse``; chromadb 1.5, served at ``/openapi.json``)
and the Python client (``chromadb.api.fastapi``: ``QueryResult``,
``GetResult``, ``SearchResult``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sidecar.core.hits import Route, RouteKind
from sidecar.formats.base import MalformedBody, ResponseAdapter, id_field_option
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.hits import Field, Found, HitLayout, Hits, usable_id, usable_text

_C, _F, _R, _W = RouteKind.CONTENT, RouteKind.FILTERED, RouteKind.READ, RouteKind.WRITE
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
    ((*_COLLECTION, "count"), {"GET": _C}),  # records of every tenant in the collection
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

    def inner(self, column: str, batch: int) -> list[Any] | None:
        """The list of ``column`` for ``batch``; None when the body has none."""
        inner_lists = self.arrays.get(column)
        return None if inner_lists is None else inner_lists[batch if self.nested else 0]

    def row(self, batch: int, index: int) -> dict[str, Any]:
        """One hit as a row of its cells: ``ids`` and every column that has one for it."""
        cells = {"ids": self.ids[batch][index]}
        for column in self.arrays:
            inner = self.inner(column, batch)
            if inner is not None:
                cells[column] = inner[index]
        return cells


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


@dataclass(eq=False)
class _ChromaBody(HitBody):
    """Every column loses the same entries, so the arrays stay aligned; null
    columns and the request's ``include``/``select`` stay as they are."""

    document: dict[str, Any]
    columns: _Columns
    places: Sequence[tuple[int, int]]  # position -> (batch, index in batch)

    def _rebuild(self, selection: Selection) -> dict[str, Any]:
        columns = self.columns
        # Per batch, the rows it sends, in rank order.
        sent: list[list[dict[str, Any]]] = [[] for _ in columns.ids]
        for position in selection.kept(range(len(self.places))):
            batch, index = self.places[position]
            sent[batch].append(selection.send(position, columns.row(batch, index)))
        return {
            key: self._column(key, sent) if key == "ids" or key in columns.arrays else value
            for key, value in self.document.items()
        }

    def _column(self, column: str, sent: list[list[dict[str, Any]]]) -> Any:
        source = self.columns.ids if column == "ids" else self.columns.arrays[column]
        inner_lists = [
            None if inner is None else [row[column] for row in rows]
            for inner, rows in zip(source, sent, strict=True)
        ]
        return inner_lists if self.columns.nested else inner_lists[0]


class ChromaFormat(ResponseAdapter[bool]):
    """Adapter for Chroma's HTTP API v2: filters query, get and search responses."""

    name = "chroma"

    def __init__(self, *, id_field: str | None = None) -> None:
        self.id_field = id_field_option(id_field)
        if self.id_field is None:
            chunk_id = Field(("ids",), "id")
        else:
            chunk_id = Field((self.id_field,), f"metadata field {self.id_field!r}", "metadatas")
        self._layout = HitLayout(
            "record", chunk_id, Field(("documents",), "document"), ("metadatas",)
        )

    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does in Chroma's API; None outside ``/api/v2`` and ``/api/v1``.

        FILTERED: POST ``.../collections/{id}/query``, ``/get``, ``/search``.
        READ: heartbeat, version, health, identity, and the GETs of tenants,
        databases, collections, collection counts and attached functions. WRITE: every
        route that creates, changes or deletes. CONTENT: a collection's record
        count (it counts every tenant's records), the legacy ``/api/v1`` and
        any ``/api/v2`` route not in the API this adapter knows.
        """
        return _kind(route)

    def _shape(self, route: Route) -> bool | None:
        """Whether the columns are nested (query, search); None for routes not filtered."""
        if _kind(route) is not RouteKind.FILTERED:
            return None
        return _NESTED[route.path.rsplit("/", 1)[-1]]

    def _read(self, document: dict[str, Any], shape: bool) -> _ChromaBody:
        columns = _columns(document, shape)
        places = tuple(
            (batch, index)
            for batch, batch_ids in enumerate(columns.ids)
            for index in range(len(batch_ids))
        )
        hits = Hits(self._layout)
        for batch, index in places:
            hits.add_found(self._chunk_id(columns, batch, index), self._text(columns, batch, index))
        return _ChromaBody(hits, document, columns, places)

    # Problems name the field, never its value: they end up in audit records.

    def _text(self, columns: _Columns, batch: int, index: int) -> Found:
        documents = columns.inner("documents", batch)
        if documents is None:
            return None, "no documents"
        return usable_text(documents[index], self._layout.text.label)

    def _chunk_id(self, columns: _Columns, batch: int, index: int) -> Found:
        label = self._layout.chunk_id.label
        if self.id_field is None:
            return usable_id(columns.ids[batch][index], label)
        metadatas = columns.inner("metadatas", batch)
        if metadatas is None:
            return None, "no metadatas"
        metadata = metadatas[index]
        if metadata is None:
            return None, "metadata missing"
        return usable_id(metadata.get(self.id_field), label)
