"""Qdrant REST responses: search, query, recommend, discover, groups, scroll, retrieve.

Every successful Qdrant response is an envelope ``{"result": ..., "status": "ok",
"time": ...}`` (sometimes with ``usage``). Where the hits sit inside ``result``
depends on the endpoint, so the route picks a *shape*: a function that checks
``result``, registers its hits as candidates and returns a renderer that
rebuilds ``result`` for a selection of kept positions and, per sub-result, the
number of hits (or groups) to keep at most.

The chunk id is the point id (``str(id)``), or the payload field ``id_field``
when set; the chunk text is the payload field ``text_field``. A substitute's
point id is an integer when it is written in ASCII digits (Qdrant point ids
are unsigned integers or UUID strings), and its payload gets the marker.

Bodies are rebuilt from the keys Qdrant's OpenAPI spec gives each response
(``status`` and ``time`` of the envelope, ``points``, ``groups`` and their
``id``/``hits``/``lookup``, a point's own keys); anything else, ``usage``
included, is dropped. Values are checked too, not only keys: the envelope's
``status`` of a successful answer is ``"ok"`` (any other value is not the
route's answer: malformed), and a group's ``id``, which is the value of the
grouped-by payload field of its hits, goes out only when it is a value the
caller gets anyway: one of the released payload values of the group's
released hits, or the id of its released lookup point (``with_lookup``
looks points up by group id). A group whose id is not (the ``group_by``
field is not declared in ``releasable_fields`` or ``hashed_fields``) makes
the answer unreleasable (``group_id_not_released``), rather than telling the
caller a value of a field it may not read (a substitute counts with the
payload of the hit whose place it takes). What describes points the gate
did not release is recomputed:

- scroll's ``next_page_offset`` is the id right after the last released
  point (Qdrant orders points by id: integers, then UUIDs as 128-bit
  numbers), so the next page starts there and re-reads the rejected points
  after it rather than revealing the id of the next unchecked one. A page in
  which nothing was released ends the scroll (``null``): any cursor would
  name a rejected or unchecked point.
- a rejected point fetched by id (``GET /collections/{c}/points/{id}``) is
  answered with Qdrant's own 404 for a missing point (``AbsentAnswer``).
- collection info (``GET /collections/{c}``) goes out without
  ``points_count``, ``indexed_vectors_count`` and the per-field point counts
  of ``payload_schema`` (set to 0): they count every tenant's points. Its
  ``status`` must be one of Qdrant's colours and ``segments_count`` a count;
  an ``optimizer_status`` error (``{"error": text}``) keeps its shape with the
  gate's text, as errors do everywhere.

Search requests are rewritten by ``rest_request``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from sidecar.core.hits import Route, RouteKind
from sidecar.formats.base import AbsentAnswer, MalformedBody, ResponseAdapter, Unreleasable
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.hits import Field, HitLayout, Hits, as_given
from sidecar.formats.options import DEFAULT_OPTIONS, AdapterOptions
from sidecar.formats.qdrant.rest_request import QdrantRequests, points_path

# Builds the filtered value of one sub-result for a selection and the most
# hits (groups, for groups) to keep; None means "leave the value out of its
# parent".
_Renderer = Callable[[Selection, int | None], Any]


@dataclass(frozen=True, slots=True)
class _Result:
    """A parsed ``result``: how many sub-results it has, and how to render it
    for a selection (which carries one limit per sub-result)."""

    sub_results: int
    render: Callable[[Selection], Any]


# Shapes of one sub-result. Each validates its value, registers hits in
# document order and returns the renderer for that value.
_SubShape = Callable[[Any, Hits], _Renderer]
# Shapes of a whole ``result``.
_Shape = Callable[[Any, Hits], _Result]


def _point_list(value: Any, hits: Hits) -> _Renderer:
    """``[point, ...]``: search, recommend, discover, retrieve."""
    start = hits.add_list(value, "expected a list of points").start
    return lambda selection, limit: selection.sent(value, start, limit)


def _query_points(value: Any, hits: Hits) -> _Renderer:
    """``{"points": [point, ...]}``: query."""
    if not isinstance(value, dict):
        raise MalformedBody("expected an object with 'points'")
    render_points = _point_list(value.get("points"), hits)
    return lambda selection, limit: {"points": render_points(selection, limit)}


def _scroll_points(value: Any, hits: Hits) -> _Renderer:
    """``{"points": [point, ...], "next_page_offset": id | null}``: scroll."""
    if not isinstance(value, dict):
        raise MalformedBody("expected an object with 'points'")
    points = value.get("points")
    if not isinstance(points, list):
        raise MalformedBody("expected a list of points")
    start = hits.add_list(points, "expected a list of points").start
    more = value.get("next_page_offset") is not None

    def render(selection: Selection, limit: int | None) -> dict[str, Any]:
        kept = selection.kept(range(start, start + len(points)))[:limit]
        next_offset = next_offset_after(points[kept[-1] - start]) if kept and more else None
        return {
            "points": [selection.send(position, points[position - start]) for position in kept],
            "next_page_offset": next_offset,
        }

    return render


def next_offset_after(point: Any) -> int | str | None:
    """The smallest point id after ``point``'s in Qdrant's order; None past the last one.

    Integer ids come first (unsigned 64-bit), then UUIDs ordered as 128-bit
    numbers.
    """
    point_id = point.get("id") if isinstance(point, dict) else None
    if type(point_id) is int:
        return point_id + 1 if point_id < 2**64 - 1 else str(uuid.UUID(int=0))
    if isinstance(point_id, str):
        try:
            number = uuid.UUID(point_id).int
        except ValueError:
            raise MalformedBody("a point id is neither an integer nor a UUID") from None
        return str(uuid.UUID(int=number + 1)) if number < 2**128 - 1 else None
    raise MalformedBody("a scrolled point has no usable id")


def _single(shape: _SubShape) -> _Shape:
    """A ``result`` that is one sub-result."""

    def parse(value: Any, hits: Hits) -> _Result:
        render = shape(value, hits)
        return _Result(1, lambda selection: render(selection, selection.limits[0]))

    return parse


def _batch(shape: _SubShape) -> _Shape:
    """``[sub-result, ...]``: the */batch endpoints."""

    def parse(value: Any, hits: Hits) -> _Result:
        if not isinstance(value, list):
            raise MalformedBody("expected a list of batch results")
        renderers = [shape(item, hits) for item in value]
        return _Result(
            len(renderers),
            lambda selection: [
                render(selection, limit)
                for render, limit in zip(renderers, selection.limits, strict=True)
            ],
        )

    return parse


def _groups(value: Any, hits: Hits) -> _Renderer:
    """``{"groups": [{"id", "hits", "lookup"?}, ...]}``: the */groups endpoints."""
    if not isinstance(value, dict) or not isinstance(value.get("groups"), list):
        raise MalformedBody("expected an object with a list of 'groups'")
    renderers = [_group(group, hits) for group in value["groups"]]

    def render(selection: Selection, limit: int | None) -> dict[str, Any]:
        # The limit counts groups returned, so emptied groups do not count.
        groups: list[dict[str, Any]] = []
        for render_group in renderers:
            if limit is not None and len(groups) >= limit:
                break
            if (group := render_group(selection)) is not None:
                groups.append(group)
        return {"groups": groups}

    return render


def _group(value: Any, hits: Hits) -> Callable[[Selection], dict[str, Any] | None]:
    if not isinstance(value, dict):
        raise MalformedBody("a group is not a JSON object")
    start = len(hits.candidates)
    render_hits = _point_list(value.get("hits"), hits)
    items: list[Any] = value["hits"]
    released = hits.layout.released
    # Qdrant writes hits before lookup, so the lookup record numbers after them.
    lookup = value.get("lookup")
    lookup_position = None if lookup is None else hits.add(lookup)

    def render(selection: Selection) -> dict[str, Any] | None:
        # The request's limit counts groups; group_size is never raised, so
        # the hits of a group are not trimmed.
        kept_hits = render_hits(selection, None)
        if not kept_hits:
            # The group id is the group_by payload value of its hits: it goes with them.
            return None
        group = {"id": value.get("id"), "hits": kept_hits}
        # Qdrant omits "lookup" when the looked-up point does not exist, so a
        # rejected lookup looks exactly like a missing one (PointGroup.lookup
        # is optional in the OpenAPI spec and in qdrant-client's model).
        if lookup_position is not None and lookup_position in selection:
            group["lookup"] = selection.send(lookup_position, lookup)
        # A substitute takes the place of the hit it replaces, in the group too.
        originals = (
            released(items[p - start]) for p in selection.kept(range(start, start + len(items)))
        )
        payloads = [hit.get("payload") for hit in originals if isinstance(hit, dict)]
        sent_lookup = group.get("lookup")
        looked_up = sent_lookup.get("id") if isinstance(sent_lookup, dict) else None
        check_group_id(group["id"], payloads, looked_up)
        return group

    return render


# The refusal of an answer with a group whose id the caller may not read.
GROUP_ID_NOT_RELEASED: Final = "group_id_not_released"


def check_group_id(group_id: Any, payloads: Sequence[Any], lookup_id: Any = None) -> None:
    """Raise Unreleasable unless ``group_id`` is a value the caller gets anyway.

    That is a value (at any depth) of one of the released ``payloads`` of the
    group's hits (as released, a substitute's are those of the hit whose
    place it takes), or the id of its released lookup point. Compared with
    its type: the integer 7 is not the string "7".
    """
    if _is_id_value(group_id) and (
        (type(lookup_id) is type(group_id) and lookup_id == group_id)
        or any(_holds(payload, group_id) for payload in payloads)
    ):
        return
    raise Unreleasable(
        GROUP_ID_NOT_RELEASED,
        "a group's id is a value of a field that is not released: declare the "
        "group_by field in releasable_fields or hashed_fields",
    )


def _is_id_value(value: Any) -> bool:
    return type(value) in (int, str)


def _holds(value: Any, wanted: int | str) -> bool:
    """True when ``wanted`` is ``value`` or a scalar inside it; a stack, not recursion."""
    pending = [value]
    while pending:
        item = pending.pop()
        if type(item) is type(wanted) and item == wanted:
            return True
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _single_point(point_id: str) -> _Shape:
    """``point``: GET /collections/{c}/points/{id}, for the id the path names."""

    def parse(value: Any, hits: Hits) -> _Result:
        position = hits.add(value)

        def render(selection: Selection) -> Any:
            if position not in selection:
                raise AbsentAnswer(404, _not_found(point_id))
            return selection.send(position, value)

        return _Result(1, render)

    return parse


def _not_found(point_id: str) -> bytes:
    """Qdrant's answer for a point that does not exist (its ``NotFound`` error).

    Qdrant prints the id it parsed: an integer without leading zeros, a UUID
    in lowercase hyphenated form.
    """
    shown = point_id
    if point_id.isascii() and point_id.isdigit():
        shown = str(int(point_id))
    else:
        # Not an id at all: Qdrant refuses the request itself, and its 4xx is kept.
        with contextlib.suppress(ValueError):
            shown = str(uuid.UUID(point_id))
    message = f"Not found: No point with id {shown} found"
    return orjson.dumps({"status": {"error": message}, "time": 0.0})


# Collection info keys that describe the collection, not how many points it has.
_COLLECTION_KEYS: Final = ("status", "optimizer_status", "segments_count", "config")
# CollectionStatus of the OpenAPI spec.
_COLLECTION_STATUSES: Final = frozenset({"green", "yellow", "grey", "red"})
# What an optimizer error says instead of Qdrant's text (which can name files and values).
OPTIMIZER_ERROR: Final = "the optimizer reported an error; its text is not released"


def _collection_info(value: Any, hits: Hits) -> _Result:
    """``CollectionInfo``: GET /collections/{c}, without what counts the points."""
    if not isinstance(value, dict):
        raise MalformedBody("expected a collection info object")
    schema = value.get("payload_schema", {})
    if not isinstance(schema, dict):
        raise MalformedBody("payload_schema is not an object")
    if "status" in value and value["status"] not in _COLLECTION_STATUSES:
        raise MalformedBody("the collection's status is none of Qdrant's")
    segments = value.get("segments_count", 0)
    if type(segments) is not int or segments < 0:
        raise MalformedBody("segments_count is not a count")
    optimizer = _optimizer_status(value.get("optimizer_status", "ok"))

    def render(selection: Selection) -> dict[str, Any]:
        info = {key: value[key] for key in _COLLECTION_KEYS if key in value}
        if "optimizer_status" in info:
            info["optimizer_status"] = optimizer
        # Each field's index info says how many points carry the field; the
        # spec requires the number, so it is 0 rather than absent.
        info["payload_schema"] = {
            name: {**index, "points": 0} if isinstance(index, dict) else index
            for name, index in schema.items()
        }
        return info

    return _Result(1, render)


def _optimizer_status(value: Any) -> Any:
    """``OptimizersStatus``: ``"ok"``, or ``{"error": text}`` with the gate's text."""
    if value == "ok":
        return value
    if isinstance(value, dict) and value.keys() == {"error"} and isinstance(value["error"], str):
        return {"error": OPTIMIZER_ERROR}
    raise MalformedBody("optimizer_status is neither 'ok' nor an error")


_POST_SHAPES: Final[Mapping[str, _Shape]] = {
    "": _single(_point_list),  # retrieve points by id
    "search": _single(_point_list),
    "search/batch": _batch(_point_list),
    "search/groups": _single(_groups),
    "query": _single(_query_points),
    "query/batch": _batch(_query_points),
    "query/groups": _single(_groups),
    "recommend": _single(_point_list),
    "recommend/batch": _batch(_point_list),
    "recommend/groups": _single(_groups),
    "discover": _single(_point_list),
    "discover/batch": _batch(_point_list),
    "scroll": _single(_scroll_points),
}
# POSTs below /collections/{c}/ that change points or the collection's setup
# (the rest read).
_POST_WRITES: Final = frozenset(
    {
        "points/delete",
        "points/payload",
        "points/payload/delete",
        "points/payload/clear",
        "points/vectors",
        "points/vectors/delete",
        "points/batch",
        "cluster",  # shard moves and replication (UpdateCollectionClusterSetup)
        "shards/delete",  # a shard key (DeleteShardKey)
    }
)
# Paths outside /collections that count every tenant's points: telemetry
# (points and vectors per collection and shard) and Prometheus metrics.
_COUNTING: Final = frozenset({"/telemetry", "/metrics", "/cluster/telemetry"})


# The keys of a point (ScoredPoint, Record) that are Qdrant's own: the payload
# is filtered by the layout's fields, everything else Qdrant adds later is dropped.
_POINT_KEYS: Final = frozenset(
    {"id", "version", "score", "payload", "vector", "shard_key", "order_value"}
)


def _point_id(old: Any, chunk_id: str) -> Any:
    """A substitute's point id: Qdrant point ids are unsigned integers or UUID strings."""
    return int(chunk_id) if chunk_id.isascii() and chunk_id.isdigit() else chunk_id


@dataclass(eq=False)
class _QdrantBody(HitBody):
    envelope: dict[str, Any]
    result: _Result

    def _rebuild(self, selection: Selection) -> dict[str, Any]:
        envelope: dict[str, Any] = {
            key: self.envelope[key] for key in ("status", "time") if key in self.envelope
        }
        envelope["result"] = self.result.render(selection)
        return envelope


def _lists_aliases(segments: list[str]) -> bool:
    """``/aliases``, ``/collections/aliases`` or ``/collections/{c}/aliases``."""
    match segments:
        case ["", "aliases"] | ["", "collections", "aliases"] | ["", "collections", _, "aliases"]:
            return True
    return False


class QdrantFormat(ResponseAdapter[_Shape], QdrantRequests):
    """Adapter for Qdrant's REST API: filters responses, rewrites search requests."""

    name = "qdrant"

    def __init__(self, options: AdapterOptions = DEFAULT_OPTIONS) -> None:
        """The text, the id (None: the point id) and the released fields are payload
        fields; every other payload field is dropped."""
        self.text_field = options.text_field
        self.id_field = options.id_field
        text = options.text_at("payload field", "payload")
        chunk_id = options.id_at(Field(("id",), "point id"), "payload field", "payload")
        self._layout = HitLayout(
            "point",
            chunk_id,
            text,
            ("payload",),
            as_given if self.id_field else _point_id,
            _POINT_KEYS,
            options.fields,
        )

    @property
    def twin_layout(self) -> HitLayout:
        """How a point is read and released; the gRPC twin reads its points so too."""
        return self._layout

    def route_kind(self, route: Route) -> RouteKind | None:
        """FILTERED for the point-reading endpoints of ``/collections/{c}/points``
        and collection info (rendered without point counts).

        READ: only ``GET``/``HEAD`` of ``/collections/{c}/exists``. Every
        other GET below a collection is CONTENT: snapshots (a whole
        collection, past every per-chunk check), alias and shard key listings
        (names of other tenants' collections and shards), cluster info
        (points per shard) and what Qdrant adds later. The collection list
        and alias listings name every collection; telemetry and metrics count
        every tenant's points: CONTENT too. POSTs that read without being
        filtered (count, facet, the distance matrix) are CONTENT; alias
        changes and anything else under ``/collections`` write. The gRPC
        twin (``grpc``) classifies the same operations alike. Other paths
        outside ``/collections`` are not claimed.
        """
        if self._shape(route) is not None:
            return RouteKind.FILTERED
        method = route.method.upper()
        path = route.path.removesuffix("/")
        segments = path.split("/")
        if path == "/collections/aliases" and method == "POST":
            return RouteKind.WRITE  # alias changes
        if "snapshots" in segments or path in _COUNTING or _lists_aliases(segments):
            return RouteKind.CONTENT
        if path == "/collections":
            return RouteKind.CONTENT if method in ("GET", "HEAD") else None
        if len(segments) == 3 and segments[1] == "collections" and segments[2].startswith("_"):
            # Collection info the gate cannot tell from an Elasticsearch API.
            return RouteKind.CONTENT
        if len(segments) < 3 or segments[1] != "collections":
            return None
        if method in ("GET", "HEAD"):
            return RouteKind.READ if segments[3:] == ["exists"] else RouteKind.CONTENT
        if method == "POST" and "/".join(segments[3:]) not in _POST_WRITES:
            # count (a match oracle), facet (payload values across every point),
            # search/matrix: reads the gate does not filter.
            return RouteKind.CONTENT
        return RouteKind.WRITE

    def _shape(self, route: Route) -> _Shape | None:
        method = route.method.upper()
        rest = points_path(route)
        if rest is None:
            match route.path.removesuffix("/").split("/"):
                # A name in "_" is an Elasticsearch API on an index called
                # "collections" as well (route_kind makes it content).
                case ["", "collections", name] if (
                    name and name != "aliases" and not name.startswith("_") and method == "GET"
                ):
                    return _collection_info
            return None
        if method == "POST":
            return _POST_SHAPES.get("/".join(rest))
        if method == "GET" and len(rest) == 1:
            return _single_point(rest[0])
        return None

    def _read(self, document: dict[str, Any], shape: _Shape) -> _QdrantBody:
        if "result" not in document:
            raise MalformedBody("no 'result' in body")
        if document.get("status", "ok") != "ok":
            # ApiStatus: a successful answer says "ok"; anything else is no
            # answer of this route (an error's text can quote documents).
            raise MalformedBody("the envelope's status is not 'ok'")
        elapsed = document.get("time", 0.0)
        if type(elapsed) not in (int, float):
            raise MalformedBody("the envelope's time is not a number")
        hits = Hits(self._layout)
        result = shape(document["result"], hits)
        return _QdrantBody(hits, document, result, sub_results=result.sub_results)
