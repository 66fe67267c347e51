"""Milvus RESTful API v2 responses: search, hybrid search, query and get.

Every v2 endpoint is a POST under ``/v2/vectordb/`` and answers HTTP 200 with
an envelope ``{"code": 0, "data": [...], "cost": ...}``. The four filtered
endpoints return ``data`` as a flat list of rows, one per hit: the primary
key, the requested output fields and, for searches, ``distance``. A search
with several query vectors concatenates their hits and says in ``topks`` how
many rows belong to each query (``recalls``, when present, has one entry per
query and is kept as it is). A failure is a non-zero ``code`` with a
``message`` and no rows; it is passed on untouched, byte for byte.

The chunk id and text are the output fields ``id_field`` (default ``"id"``)
and ``text_field`` of a row. Rows are the only free-form object of a hit
(dynamic fields are flattened into them), so a substitute's marker sits next
to its output fields; its id is a number where the key it replaces is one
(Int64 primary keys).

Shapes follow the Milvus RESTful v2 reference (milvus.io/api-reference/restful)
and the proxy's REST handler (milvus-io/milvus,
internal/distributed/proxy/httpserver/handler_v2.go).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import orjson

from sidecar.core.hits import Route, RouteKind
from sidecar.formats.base import (
    MalformedBody,
    ResponseAdapter,
    id_field_option,
    load_object,
    text_field_option,
)
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.hits import Field, HitLayout, Hits

# The primary key field of Milvus' quick-setup collections.
_DEFAULT_ID_FIELD: Final = "id"

# v2 reports success as 0; the 2.3 reference documents 200.
_SUCCESS: Final = frozenset({0, 200})
_FILTERED: Final = frozenset({"search", "hybrid_search", "advanced_search", "query", "get"})
_ENTITY_WRITES: Final = frozenset({"insert", "upsert", "delete"})
# Actions that only report on metadata, jobs or the cluster, in any v2 group.
_READS: Final = frozenset(
    {
        "list",
        "has",
        "describe",
        "get_load_state",
        "get_progress",
        "get_compaction_state",
        "run_analyzer",  # tokenises the request's own text
    }
)
_V1_CONTENT: Final = frozenset({"search", "query", "get"})
_V1_READS: Final = frozenset(
    {
        ("collections",),
        ("collections", "describe"),
        ("bulkinsert", "describe"),
        ("bulkinsert", "list"),
    }
)
_INTEGER: Final = re.compile(r"-?[0-9]+")


def _segments(route: Route) -> list[str]:
    # Lower case: a case variant of a route must not be claimed less strictly
    # than the route itself, whatever the router does with it.
    return route.path.removesuffix("/").lower().split("/")


def _typed_like(old: Any, chunk_id: str) -> Any:
    """``chunk_id`` as a number when the value it replaces is one (Int64 keys)."""
    if isinstance(old, int) and not isinstance(old, bool) and _INTEGER.fullmatch(chunk_id):
        return int(chunk_id)
    return chunk_id


@dataclass(eq=False)
class _Rows(HitBody):
    """A response with rows; ``topks`` is recounted per query vector."""

    document: dict[str, Any]
    topks: tuple[int, ...] | None

    def _rebuild(self, selection: Selection) -> dict[str, Any]:
        document = {**self.document, "data": selection.sent(self.document["data"], 0)}
        if self.topks is not None:
            counts: list[int] = []
            start = 0
            for topk in self.topks:
                counts.append(len(selection.kept(range(start, start + topk))))
                start += topk
            document["topks"] = counts
        return document


@dataclass(eq=False)
class _Untouched(HitBody):
    """An error envelope: no rows, sent exactly as it came."""

    body: bytes

    def _rebuild(self, selection: Selection) -> orjson.Fragment:
        return orjson.Fragment(self.body)


class _Loaded(NamedTuple):
    """A decoded body and its bytes, which an error envelope is passed on as."""

    document: dict[str, Any]
    body: bytes


def _topks(value: Any, rows: int) -> tuple[int, ...]:
    """``topks`` checked against the number of rows it divides."""
    if not isinstance(value, list) or not all(
        isinstance(topk, int) and not isinstance(topk, bool) and topk >= 0 for topk in value
    ):
        raise MalformedBody("'topks' is not a list of counts")
    if sum(value) != rows:
        raise MalformedBody("'topks' does not add up to the rows in 'data'")
    return tuple(value)


class MilvusFormat(ResponseAdapter[str]):
    """Adapter for the Milvus RESTful API v2.

    ``id_field`` defaults to ``"id"``: name the collection's primary key
    field, or any output field holding chunk ids. Requests must list both
    fields in ``outputFields`` (queries and gets return all fields by default).
    """

    name = "milvus"

    def __init__(self, *, text_field: str = "text", id_field: str | None = None) -> None:
        self.text_field = text_field_option(text_field)
        self.id_field = id_field_option(id_field) or _DEFAULT_ID_FIELD
        if self.id_field == self.text_field:
            raise ValueError("id_field must differ from text_field")
        self._layout = HitLayout(
            "row",
            Field((self.id_field,), f"field {self.id_field!r}"),
            Field((self.text_field,), f"field {self.text_field!r}"),
            (),
            _typed_like,
        )

    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does in Milvus' REST APIs; None for other paths.

        FILTERED: POST ``/v2/vectordb/entities/`` search, hybrid_search
        (advanced_search, its old name), query and get. CONTENT: those paths
        with other methods, unknown ``entities`` actions, anything about
        snapshots (they export collections), ``get_stats`` (row counts of
        every tenant), and v1 search, query and get.
        READ: list, has, describe and the other status actions of any v2 group;
        the v1 collection and bulk-insert listings. WRITE: everything else
        under ``/v2/vectordb/`` and ``/v1/vector/``.
        """
        match _segments(route):
            case ["", "v2", "vectordb", "entities", action] if action in _FILTERED:
                return RouteKind.FILTERED if route.method.upper() == "POST" else RouteKind.CONTENT
            case ["", "v2", "vectordb", "entities", action] if action in _ENTITY_WRITES:
                return RouteKind.WRITE
            case ["", "v2", "vectordb", "entities", *_]:
                return RouteKind.CONTENT
            case ["", "v2", "vectordb", *rest] if {"snapshot", "snapshots"} & set(rest):
                return RouteKind.CONTENT
            case ["", "v2", "vectordb", _, "get_stats"]:
                return RouteKind.CONTENT  # row counts of every tenant
            case ["", "v2", "vectordb", _, *_, action]:
                return RouteKind.READ if action in _READS else RouteKind.WRITE
            case ["", "v1", "vector", action] if action in _V1_CONTENT:
                return RouteKind.CONTENT
            case ["", "v1", "vector", *rest] if rest:
                return RouteKind.READ if tuple(rest) in _V1_READS else RouteKind.WRITE
        return None

    def _shape(self, route: Route) -> str | None:
        """The action of a FILTERED route (search, query ...); None for others."""
        if self.route_kind(route) is not RouteKind.FILTERED:
            return None
        return _segments(route)[-1]

    def _load(self, body: bytes, shape: str) -> _Loaded:
        return _Loaded(load_object(body), body)

    def _read(self, document: _Loaded, shape: str) -> HitBody:
        """An error envelope (non-zero ``code``, no rows) parses to a body without
        candidates that renders as the original bytes."""
        envelope = document.document
        code = envelope.get("code")
        if isinstance(code, bool) or not isinstance(code, int):
            raise MalformedBody("no integer 'code' in body")
        rows = envelope.get("data")
        hits = Hits(self._layout)
        if code != 0 and rows in (None, [], {}):
            return _Untouched(hits, document.body)
        if code not in _SUCCESS:
            raise MalformedBody("an error code in a body with rows")
        if "aggTopks" in envelope:
            # Search aggregation nests hits in buckets: a shape not read here.
            raise MalformedBody("search aggregation results are not supported")
        if not isinstance(rows, list):
            raise MalformedBody("'data' is not a list of rows")
        # A null topks (Go's nil slice) says nothing to keep consistent.
        topks = None if envelope.get("topks") is None else _topks(envelope["topks"], len(rows))
        hits.add_list(rows, "'data' is not a list of rows")
        return _Rows(hits, envelope, topks)
