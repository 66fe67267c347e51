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
metadata gains the marker and loses the declared fields (they describe the
document it replaces); the hit is read and written as a row of its cells
(``{"ids": ..., "documents": ..., "metadatas": ...}``), one per column present.

A body is rebuilt from the keys its route's response has (``_SHAPES``):
every other key, known elsewhere or not, is dropped. Of each metadata object
only the marker, ``id_field`` and the declared ``hashed_fields`` and
``releasable_fields`` go out; the hashed ones go into the candidate for the
integrity check. What the answer repeats of the request comes from the
request (its ``ChromaEcho``), never from the database: a query's or get's
``include`` is the request's; a search's ``select`` keeps, of each search's
keys, those that search selected. Without the request (never, for an answer
the gate filters: these routes' bodies are always read) ``include`` must
name Chroma's columns and ``select`` keeps only Chroma's own ``#`` keys.

Shapes follow the server's OpenAPI document (``QueryResponse``,
``GetResponse``, ``SearchResponse``; chromadb 1.5, served at ``/openapi.json``)
and the Python client (``chromadb.api.fastapi``: ``QueryResult``,
``GetResult``, ``SearchResult``). Requests are rewritten by ``rest_request``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from sidecar.core.hits import Replacement, Route, RouteKind
from sidecar.formats.base import (
    SUBSTITUTED_FOR,
    CollectionId,
    MalformedBody,
    ResponseAdapter,
    load_json,
)
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.chroma.rest_request import ChromaEcho, ChromaRequests, collection_endpoint
from sidecar.formats.hits import (
    Field,
    Found,
    HitLayout,
    Hits,
    ReleasedFields,
    usable_id,
    usable_text,
)
from sidecar.formats.options import DEFAULT_OPTIONS, AdapterOptions

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
    # Record operations indexed, pending and in all: every tenant's writes, counted.
    ((*_COLLECTION, "indexing_status"), {"GET": _C}),
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


@dataclass(frozen=True, slots=True)
class _Shape:
    """The keys of one filtered route's responses: the per-hit columns and the one
    array describing the request (what it included or selected)."""

    nested: bool  # one inner list per query embedding (search), not one per record
    columns: tuple[str, ...]
    descriptive: str
    # One limit per inner list (search: one per search), not one for them all.
    limit_per_batch: bool = False


# "data" is what the Python server names loaded URIs; "scores" is search's
# name for distances.
_SHAPES: Final[Mapping[str, _Shape]] = {
    "query": _Shape(
        True, ("embeddings", "documents", "uris", "data", "metadatas", "distances"), "include"
    ),
    "get": _Shape(False, ("embeddings", "documents", "uris", "data", "metadatas"), "include"),
    "search": _Shape(
        True, ("documents", "embeddings", "metadatas", "scores"), "select", limit_per_batch=True
    ),
}
# A row's own keys: every column any route has.
_ROW_KEYS: Final = frozenset({"ids"}.union(*(shape.columns for shape in _SHAPES.values())))
# What ``include`` may name (the server's Include; "data" is the Python server's).
_INCLUDE_NAMES: Final = frozenset(
    {"distances", "documents", "embeddings", "metadatas", "uris", "data"}
)
# The keys a search selects that are Chroma's own, not metadata field names.
_OWN_SELECT_KEYS: Final = frozenset({"#id", "#document", "#embedding", "#metadata", "#score"})


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


def _columns(document: dict[str, Any], shape: _Shape) -> _Columns:
    ids = document.get("ids")
    if not isinstance(ids, list):
        raise MalformedBody("'ids' is not a list")
    batches: list[list[Any]] = ids if shape.nested else [ids]
    if not all(isinstance(batch, list) for batch in batches):
        raise MalformedBody("an 'ids' entry is not a list")
    arrays: dict[str, list[list[Any] | None]] = {}
    for column in shape.columns:
        value = document.get(column)
        if value is not None:
            arrays[column] = _aligned(column, value, batches, shape.nested)
    for inner in arrays.get("metadatas", ()):
        # Replacements write into metadata objects, and the spec allows only these.
        if inner is not None and not all(m is None or isinstance(m, dict) for m in inner):
            raise MalformedBody("a 'metadatas' entry is not an object or null")
    _check_descriptive(document.get(shape.descriptive), shape)
    return _Columns(shape.nested, batches, arrays)


def _check_descriptive(value: Any, shape: _Shape) -> None:
    """``include`` is a list of strings, ``select`` one such list per search."""
    if value is None:
        return
    lists = value if shape.descriptive == "select" else [value]
    if not isinstance(lists, list) or not all(
        isinstance(names, list) and all(isinstance(name, str) for name in names) for names in lists
    ):
        raise MalformedBody(f"'{shape.descriptive}' is not a list of names")


def _descriptive(value: Any, shape: _Shape, asked: ChromaEcho) -> Any:
    """``include`` or ``select`` (checked by ``_check_descriptive``) as it goes out,
    from what the request ``asked``."""
    if value is None:
        return None
    if shape.descriptive == "include":
        if asked.include is not None:
            return list(asked.include)
        if not set(value) <= _INCLUDE_NAMES:
            raise MalformedBody("'include' names what Chroma does not include")
        return value
    selects = asked.selects
    if selects is not None and len(selects) != len(value):
        raise MalformedBody("'select' does not have one entry per search")
    return [
        [key for key in keys if key in (_OWN_SELECT_KEYS if chosen is None else chosen)]
        for keys, chosen in zip(value, selects or [None] * len(value), strict=True)
    ]


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
    columns and the request's ``include``/``select`` stay as they are, any other
    key goes. Each result list keeps at most its limit (query's one limit holds
    for the list of every query embedding; search has one per search)."""

    document: dict[str, Any]
    shape: _Shape
    columns: _Columns
    # ``include`` or ``select`` as it goes out: what the request asked.
    descriptive: Any
    places: Sequence[tuple[int, int]]  # position -> (batch, index in batch)
    metadata: HitLayout  # what goes out of a metadata object
    # What a substitute's metadata keeps: the marker and the id field. Declared
    # fields describe the document it replaces, checked against that record.
    substitute_keeps: frozenset[str]

    def _rebuild(self, selection: Selection) -> dict[str, Any]:
        columns = self.columns
        # Per batch, the rows it sends, in rank order.
        sent: list[list[dict[str, Any]]] = [[] for _ in columns.ids]
        for position in selection.kept(range(len(self.places))):
            batch, index = self.places[position]
            limit = selection.limits[batch if self.shape.limit_per_batch else 0]
            if limit is not None and len(sent[batch]) >= limit:
                continue
            row = selection.send(position, columns.row(batch, index))
            if "metadatas" in row:
                row["metadatas"] = self.metadata.released_object(row["metadatas"])
            sent[batch].append(row)
        shape = self.shape
        out: dict[str, Any] = {}
        for key, value in self.document.items():
            if key == "ids" or key in columns.arrays:
                out[key] = self._column(key, sent)
            elif key in shape.columns:
                out[key] = value  # a null column
            elif key == shape.descriptive:
                out[key] = self.descriptive
        return out

    def _substituted(self, hit: Any, replacement: Replacement) -> Any:
        out = self._layout.substituted(hit, replacement)
        metadata = out.get("metadatas")
        if isinstance(metadata, dict):
            keeps = self.substitute_keeps
            out["metadatas"] = {key: value for key, value in metadata.items() if key in keeps}
        return out

    def _column(self, column: str, sent: list[list[dict[str, Any]]]) -> Any:
        source = self.columns.ids if column == "ids" else self.columns.arrays[column]
        inner_lists = [
            None if inner is None else [row[column] for row in rows]
            for inner, rows in zip(source, sent, strict=True)
        ]
        return inner_lists if self.columns.nested else inner_lists[0]


class ChromaFormat(ResponseAdapter[_Shape], ChromaRequests):
    """Adapter for Chroma's HTTP API v2: filters query, get and search responses,
    rewrites their requests."""

    name = "chroma"
    # The text is a record's document, a column of its own.
    options_not_taken = frozenset({"text_field"})

    def __init__(self, options: AdapterOptions = DEFAULT_OPTIONS) -> None:
        """The id (None: the record id) and the released fields are metadata fields;
        every other metadata field is dropped."""
        self.id_field = options.id_field
        fields = options.fields
        chunk_id = options.id_at(Field(("ids",), "id"), "metadata field", "metadatas")
        self._layout = HitLayout(
            "record",
            chunk_id,
            Field(("documents",), "document"),
            ("metadatas",),
            hit_keys=_ROW_KEYS,
            fields=fields,
        )
        # A metadata object as a hit of its own, to project it: it holds the
        # marker (as its "id" and "text", so that nothing else comes with them),
        # the id field and the declared fields.
        marker = Field((SUBSTITUTED_FOR,), "marker")
        own = () if self.id_field is None else ((self.id_field,),)
        self._metadata = HitLayout(
            "metadata",
            marker,
            marker,
            None,
            hit_keys=frozenset(),
            fields=ReleasedFields(fields.hashed, (*fields.releasable, *own)),
        )

    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does in Chroma's API; None outside ``/api/v2`` and ``/api/v1``.

        FILTERED: POST ``.../collections/{id}/query``, ``/get``, ``/search``.
        READ: heartbeat, version, health, identity, and the GETs of tenants,
        databases, collections, collection counts and attached functions. WRITE: every
        route that creates, changes or deletes. CONTENT: a collection's record
        count and its indexing status (they count every tenant's records and
        writes), the legacy ``/api/v1`` and any ``/api/v2`` route not in the
        API this adapter knows.
        """
        return _kind(route)

    def path_collections(self, route: Route) -> tuple[PathCollection, ...]:
        """The collections ``route``'s path names, and whether by id or by name.

        Measured against ``chroma run`` (chromadb 1.5): every route below
        ``.../collections/{c}/`` (query, get, search, count, add ...), PUT of
        ``.../collections/{c}`` and ``.../collections/by-id/{c}`` take the
        collection's id; GET (and HEAD) and DELETE of ``.../collections/{c}``
        and the cloud route ``/api/v2/collections/{tenant}:{database}:{name}``
        take its name. A method the API does not have there names it either
        way, so both are given. Other paths name no collection.
        """
        return _path_collections(route)

    def route_collections(self, route: Route) -> list[str]:
        """What the request policy checks ownership of (``ResponseFormat.route_collections``):
        the collection's id on every route that reads records (``id_collections``:
        the request path adds the name it learned for it), the name on the
        routes that take one (collection metadata, deletion)."""
        return [collection.value for collection in self.path_collections(route)]

    def id_collections(self, route: Route) -> tuple[CollectionId, ...]:
        """The collections the path names by id, in their tenant and database."""
        return tuple(
            CollectionId((c.tenant, c.database), c.value)
            for c in self.path_collections(route)
            if c.kind == "id" and c.tenant is not None and c.database is not None
        )

    def names_collections(self, route: Route) -> bool:
        """True for the answers that describe collections: a collection read by name, by
        id or by CRN, the list of a database's collections, a created (or got-or-created)
        and a forked collection."""
        return _describes_collections(route)

    def collection_names(self, route: Route, body: bytes) -> list[tuple[CollectionId, str]]:
        """The id and name of each collection the answer describes, in the tenant and
        database it names, which must be the path's (``names_collections``)."""
        if not _describes_collections(route):
            return []
        return _described(_scope_of(route), body)

    def renamed_collections(self, route: Route) -> tuple[CollectionId, ...]:
        """A PUT of ``.../collections/{id}`` may rename the collection."""
        if route.method.upper() != "PUT":
            return ()
        return self.id_collections(route)

    def _shape(self, route: Route) -> _Shape | None:
        """The keys of the route's responses; None for routes not filtered."""
        endpoint = collection_endpoint(route)
        return None if endpoint is None else _SHAPES[endpoint]

    def _read(self, document: dict[str, Any], shape: _Shape) -> _ChromaBody:
        return self._read_echoed(document, shape, None)

    def _read_echoed(self, document: dict[str, Any], shape: _Shape, echo: object) -> _ChromaBody:
        columns = _columns(document, shape)
        asked = echo if isinstance(echo, ChromaEcho) else ChromaEcho()
        descriptive = _descriptive(document.get(shape.descriptive), shape, asked)
        places = tuple(
            (batch, index)
            for batch, batch_ids in enumerate(columns.ids)
            for index in range(len(batch_ids))
        )
        hits = Hits(self._layout)
        for batch, index in places:
            metadatas = columns.inner("metadatas", batch)
            metadata = None if metadatas is None else metadatas[index]
            hits.add_found(
                self._chunk_id(columns, batch, index),
                self._text(columns, batch, index),
                hits.hashed(metadata),
            )
        # Search has one limit per search; query one for every query embedding.
        sub_results = len(columns.ids) if shape.limit_per_batch else 1
        return _ChromaBody(
            hits,
            document,
            shape,
            columns,
            descriptive,
            places,
            self._metadata,
            frozenset({SUBSTITUTED_FOR, *([self.id_field] if self.id_field else [])}),
            sub_results=sub_results,
        )

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


# -- collections named in paths ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PathCollection:
    """A collection as a Chroma path names it: by ``id`` (its UUID) or by ``name``.

    The two are different namespaces: a collection may be *named* like another
    collection's id (measured: ``GET .../collections/<uuid>`` finds the
    collection of that name, ``POST .../collections/<uuid>/get`` the one of
    that id). ``tenant`` and ``database`` are Chroma's own namespaces from the
    path (None where the path has none).
    """

    kind: Literal["id", "name"]
    value: str
    tenant: str | None
    database: str | None


def _path_collections(route: Route) -> tuple[PathCollection, ...]:
    segments = _v2_segments(route.path)
    if segments is None:
        return ()
    match segments:
        case ["collections", crn] if crn:
            scope, _, name = crn.rpartition(":")
            tenant, _, database = scope.partition(":")
            return (PathCollection("name", name, tenant or None, database or None),)
        case ["tenants", t, "databases", d, "collections", "by-id", c] if (
            t and d and c and route.method.upper() in ("GET", "HEAD")
        ):
            return (PathCollection("id", c, t, d),)
        case ["tenants", t, "databases", d, "collections", c] if t and d and c:
            method = route.method.upper()
            kinds: tuple[Literal["id", "name"], ...] = (
                ("id",)
                if method == "PUT"
                else ("name",)
                if method in ("GET", "HEAD", "DELETE")
                else ("id", "name")
            )
            return tuple(
                PathCollection(kind, _id_or(c) if kind == "id" else c, t, d) for kind in kinds
            )
        case ["tenants", t, "databases", d, "collections", c, *rest] if t and d and c and rest:
            return (PathCollection("id", _id_or(c), t, d),)
    return ()


# -- the names collection ids stand for -----------------------------------------------


def _describes_collections(route: Route) -> bool:
    segments = _v2_segments(route.path)
    method = route.method.upper()
    match segments:
        case ["collections", crn] if crn:
            return method == "GET"
        case ["tenants", t, "databases", d, "collections"] if t and d:
            return method in ("GET", "POST")  # the list; a create (or get-or-create)
        case ["tenants", t, "databases", d, "collections", "by-id", c] if t and d and c:
            return method == "GET"
        case ["tenants", t, "databases", d, "collections", c] if t and d and c:
            return method == "GET"  # by name
        case ["tenants", t, "databases", d, "collections", c, "fork"] if t and d and c:
            return method == "POST"
    return False


def _scope_of(route: Route) -> tuple[str, str] | None:
    """The tenant and database a collection route's path names (a CRN's too)."""
    match _v2_segments(route.path):
        case ["collections", crn]:
            scope, _, _ = crn.rpartition(":")
            tenant, _, database = scope.partition(":")
            return (tenant, database) if tenant and database else None
        case ["tenants", t, "databases", d, *_]:
            return t, d
    return None


def _described(scope: tuple[str, str] | None, body: bytes) -> list[tuple[CollectionId, str]]:
    """The collections ``body`` describes (a ``Collection`` object, or a list of them),
    those in ``scope`` only: an answer about another tenant's or database's
    collections teaches nothing about the ones this path can reach."""
    try:
        document = load_json(body)
    except (MalformedBody, ValueError):  # orjson's decode error is a ValueError
        return []
    described = document if isinstance(document, list) else [document]
    found = []
    for collection in described:
        if not isinstance(collection, dict):
            continue
        identifier, name = collection.get("id"), collection.get("name")
        where = (collection.get("tenant"), collection.get("database"))
        if not (isinstance(identifier, str) and isinstance(name, str) and name):
            continue
        try:
            identifier = str(uuid.UUID(identifier))
        except ValueError:
            continue
        if scope is not None and where == scope:
            found.append((CollectionId(scope, identifier), name))
    return found


def _id_or(segment: str) -> str:
    """A collection id in the one spelling policy data uses (lowercase, hyphenated).

    Chroma parses the id, so an uppercase, unhyphenated or ``urn:uuid:`` form
    names the same collection; a segment that is no UUID stays as written.
    """
    try:
        return str(uuid.UUID(segment))
    except ValueError:
        return segment
