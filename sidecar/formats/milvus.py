"""Milvus RESTful API v2 responses: search, hybrid search, query and get.

Every v2 endpoint is a POST under ``/v2/vectordb/`` and answers HTTP 200 with
an envelope ``{"code": 0, "data": [...], "cost": ...}``. The four filtered
endpoints return ``data`` as a flat list of rows, one per hit: the primary
key, the requested output fields and, for searches, ``distance``. A search
with several query vectors concatenates their hits and says in ``topks`` how
many rows belong to each query (``recalls``, when present, has one entry per
query and is kept as it is). A failure is a non-zero ``code`` with a
``message`` and no rows; it is passed on untouched.

Shapes follow the Milvus RESTful v2 reference (milvus.io/api-reference/restful)
and the proxy's REST handler (milvus-io/milvus,
internal/distributed/proxy/httpserver/handler_v2.go).
"""

from __future__ import annotations

import re
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
        "get_stats",
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


@dataclass(frozen=True, slots=True)
class _MilvusBody:
    """A parsed response; ``_document`` is None for an error passed on untouched."""

    candidates: Sequence[Candidate]
    _body: bytes
    _document: dict[str, Any] | None
    _topks: tuple[int, ...] | None
    _text_field: str
    _id_field: str

    def render(
        self,
        keep: Collection[int],
        limits: Sequence[int | None] | None = None,
        replacements: Mapping[int, Replacement] | None = None,
    ) -> bytes:
        """Serialise the body with only the rows whose position is in ``keep``.

        ``topks`` is recounted per query vector. A replaced row gets the
        substitute's text and id (the ``id_field`` value, a number when the
        key is an Int64) and a ``retrieval_gate_substituted_for`` field; see
        ``ParsedBody.render``.
        """
        no_limits(limits)
        if self._document is None:
            return self._body
        rows = self._document["data"]
        kept = kept_in_order(range(len(rows)), frozenset(keep))
        substitutes = replacements or {}
        document = {
            **self._document,
            "data": [self._row(rows[position], substitutes.get(position)) for position in kept],
        }
        if self._topks is not None:
            document["topks"] = self._kept_topks(frozenset(kept))
        return orjson.dumps(document)

    def released_positions(
        self, keep: Collection[int], limits: Sequence[int | None] | None = None
    ) -> list[int]:
        """The positions ``render`` sends, in body order: every kept one."""
        no_limits(limits)
        return kept_in_order(range(len(self.candidates)), frozenset(keep))

    def _kept_topks(self, kept: frozenset[int]) -> list[int]:
        counts: list[int] = []
        start = 0
        for topk in self._topks or ():
            counts.append(sum(position in kept for position in range(start, start + topk)))
            start += topk
        return counts

    def _row(self, row: dict[str, Any], replacement: Replacement | None) -> dict[str, Any]:
        if replacement is None:
            return row
        old_id = row.get(self._id_field)
        substitute = dict(row)
        substitute[self._text_field] = replacement.text
        # Rows are the only free-form object of a hit (dynamic fields are
        # flattened into them), so the marker sits next to the output fields.
        substitute[SUBSTITUTED_FOR] = old_id
        substitute[self._id_field] = _typed_like(old_id, replacement.chunk_id)
        return substitute


def _topks(value: Any, rows: int) -> tuple[int, ...]:
    """``topks`` checked against the number of rows it divides."""
    if not isinstance(value, list) or not all(
        isinstance(topk, int) and not isinstance(topk, bool) and topk >= 0 for topk in value
    ):
        raise MalformedBody("'topks' is not a list of counts")
    if sum(value) != rows:
        raise MalformedBody("'topks' does not add up to the rows in 'data'")
    return tuple(value)


class MilvusFormat:
    """Adapter for the Milvus RESTful API v2.

    The chunk id is the output field ``id_field`` (default ``"id"``: name the
    collection's primary key field, or any output field holding chunk ids);
    the chunk text is the output field ``text_field``. Requests must list both
    in ``outputFields`` (queries and gets return all fields by default).
    """

    def __init__(self, *, text_field: str = "text", id_field: str | None = None) -> None:
        check_fields(text_field, id_field)
        if (id_field or _DEFAULT_ID_FIELD) == text_field:
            raise ValueError("id_field must differ from text_field")
        self.text_field = text_field
        self.id_field = id_field or _DEFAULT_ID_FIELD

    @property
    def name(self) -> str:
        """Short stable name, used as the ``format`` metric label."""
        return "milvus"

    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does in Milvus' REST APIs; None for other paths.

        FILTERED: POST ``/v2/vectordb/entities/`` search, hybrid_search
        (advanced_search, its old name), query and get. CONTENT: those paths
        with other methods, unknown ``entities`` actions, anything about
        snapshots (they export collections), and v1 search, query and get.
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
            case ["", "v2", "vectordb", _, *_, action]:
                return RouteKind.READ if action in _READS else RouteKind.WRITE
            case ["", "v1", "vector", action] if action in _V1_CONTENT:
                return RouteKind.CONTENT
            case ["", "v1", "vector", *rest] if rest:
                return RouteKind.READ if tuple(rest) in _V1_READS else RouteKind.WRITE
        return None

    def parse(self, body: bytes, route: Route) -> ParsedBody:
        """Parse a response body; raise MalformedBody if it is not one.

        An error envelope (non-zero ``code``, no rows) parses to a body
        without candidates that renders as the original bytes. Raises
        ValueError if ``route`` is not one this format filters.
        """
        if self.route_kind(route) is not RouteKind.FILTERED:
            raise ValueError("route is not handled by the milvus format")
        return parse_guarded(self.name, lambda: self._parse(body))

    def _parse(self, body: bytes) -> _MilvusBody:
        document = load_object(body)
        code = document.get("code")
        if isinstance(code, bool) or not isinstance(code, int):
            raise MalformedBody("no integer 'code' in body")
        rows = document.get("data")
        if code != 0 and rows in (None, [], {}):
            return _MilvusBody((), body, None, None, self.text_field, self.id_field)
        if code not in _SUCCESS:
            raise MalformedBody("an error code in a body with rows")
        if "aggTopks" in document:
            # Search aggregation nests hits in buckets: a shape not read here.
            raise MalformedBody("search aggregation results are not supported")
        if not isinstance(rows, list):
            raise MalformedBody("'data' is not a list of rows")
        # A null topks (Go's nil slice) says nothing to keep consistent.
        topks = None if document.get("topks") is None else _topks(document["topks"], len(rows))
        candidates = tuple(self._candidate(position, row) for position, row in enumerate(rows))
        return _MilvusBody(candidates, body, document, topks, self.text_field, self.id_field)

    # Problems name the field, never its value: they end up in audit records.

    def _candidate(self, position: int, row: Any) -> Candidate:
        if not isinstance(row, dict):
            raise MalformedBody("a row is not a JSON object")
        chunk_id = usable_id(row.get(self.id_field), f"field {self.id_field!r}")
        text = usable_text(row.get(self.text_field), f"field {self.text_field!r}")
        return make_candidate(position, chunk_id, text)
