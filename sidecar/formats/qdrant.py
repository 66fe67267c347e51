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

Search requests are rewritten by ``qdrant_request``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.core.hits import Route, RouteKind
from sidecar.formats.base import MalformedBody, ResponseAdapter, id_field_option, text_field_option
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.hits import Field, HitLayout, Hits, as_given
from sidecar.formats.qdrant_request import QdrantRequests, points_path, post_endpoint

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


def _points_object(value: Any, hits: Hits) -> _Renderer:
    """``{"points": [point, ...], ...}``: query, scroll (with next_page_offset)."""
    if not isinstance(value, dict):
        raise MalformedBody("expected an object with 'points'")
    render_points = _point_list(value.get("points"), hits)
    return lambda selection, limit: {**value, "points": render_points(selection, limit)}


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
        return {**value, "groups": groups}

    return render


def _group(value: Any, hits: Hits) -> Callable[[Selection], dict[str, Any] | None]:
    if not isinstance(value, dict):
        raise MalformedBody("a group is not a JSON object")
    render_hits = _point_list(value.get("hits"), hits)
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
        group = {**value, "hits": kept_hits}
        if lookup_position is not None and lookup_position in selection:
            group["lookup"] = selection.send(lookup_position, lookup)
        elif lookup_position is not None:
            # Qdrant omits "lookup" when the looked-up point does not exist, so a
            # rejected lookup looks exactly like a missing one (PointGroup.lookup
            # is optional in the OpenAPI spec and in qdrant-client's model).
            del group["lookup"]
        return group

    return render


def _single_point(value: Any, hits: Hits) -> _Renderer:
    """``point``: GET /collections/{c}/points/{id}."""
    position = hits.add(value)
    # A rejected point drops "result" from the envelope. That is how Qdrant
    # itself serialises an absent result; the spec declares "result" optional
    # but not nullable, and qdrant-client's model reads the omission as
    # result=None. An empty stand-in record would invent a point that does not
    # exist, and a null would break strict spec validation. The request names
    # the point, so there is no limit to trim to.
    return lambda selection, limit: (
        selection.send(position, value) if position in selection else None
    )


_POST_SHAPES: Final[Mapping[str, _Shape]] = {
    "": _single(_point_list),  # retrieve points by id
    "search": _single(_point_list),
    "search/batch": _batch(_point_list),
    "search/groups": _single(_groups),
    "query": _single(_points_object),
    "query/batch": _batch(_points_object),
    "query/groups": _single(_groups),
    "recommend": _single(_point_list),
    "recommend/batch": _batch(_point_list),
    "recommend/groups": _single(_groups),
    "discover": _single(_point_list),
    "discover/batch": _batch(_point_list),
    "scroll": _single(_points_object),
}
_GET_POINT_SHAPE: Final = _single(_single_point)
# POSTs under /collections/{c}/points that change points (the rest read).
_WRITES: Final = frozenset(
    {"delete", "payload", "payload/delete", "payload/clear", "vectors", "vectors/delete", "batch"}
)


def _point_id(old: Any, chunk_id: str) -> Any:
    """A substitute's point id: Qdrant point ids are unsigned integers or UUID strings."""
    return int(chunk_id) if chunk_id.isascii() and chunk_id.isdigit() else chunk_id


@dataclass(eq=False)
class _QdrantBody(HitBody):
    envelope: dict[str, Any]
    result: _Result

    def _rebuild(self, selection: Selection) -> dict[str, Any]:
        result = self.result.render(selection)
        envelope = dict(self.envelope)
        if result is None:
            del envelope["result"]
        else:
            envelope["result"] = result
        return envelope


class QdrantFormat(ResponseAdapter[_Shape], QdrantRequests):
    """Adapter for Qdrant's REST API: filters responses, rewrites search requests."""

    name = "qdrant"

    def __init__(self, text_field: str = "text", id_field: str | None = None) -> None:
        self.text_field = text_field_option(text_field)
        self.id_field = id_field_option(id_field)
        text = Field((self.text_field,), f"payload field {self.text_field!r}", within="payload")
        if self.id_field is None:
            chunk_id = Field(("id",), "point id")
        else:
            chunk_id = Field((self.id_field,), f"payload field {self.id_field!r}", "payload")
        self._layout = HitLayout(
            "point", chunk_id, text, ("payload",), as_given if self.id_field else _point_id
        )

    def route_kind(self, route: Route) -> RouteKind | None:
        """FILTERED for the point-reading endpoints of ``/collections/{c}/points``.

        Snapshots are CONTENT (a whole collection, past every per-chunk check);
        other reads are GET/HEAD and ``points/count``; anything else under
        ``/collections`` writes. Paths outside ``/collections`` are not claimed.
        """
        if self._shape(route) is not None:
            return RouteKind.FILTERED
        segments = route.path.removesuffix("/").split("/")
        if "snapshots" in segments:
            return RouteKind.CONTENT
        if len(segments) < 3 or segments[1] != "collections":
            return None
        if route.method.upper() in ("GET", "HEAD"):
            return RouteKind.READ
        if route.method.upper() == "POST" and post_endpoint(route) not in _WRITES:
            # count (a match oracle), facet (payload values across every point),
            # search/matrix: reads the gate does not filter.
            return RouteKind.CONTENT
        return RouteKind.WRITE

    def _shape(self, route: Route) -> _Shape | None:
        rest = points_path(route)
        if rest is None:
            return None
        method = route.method.upper()
        if method == "POST":
            return _POST_SHAPES.get("/".join(rest))
        if method == "GET" and len(rest) == 1:
            return _GET_POINT_SHAPE
        return None

    def _read(self, document: dict[str, Any], shape: _Shape) -> _QdrantBody:
        if "result" not in document:
            raise MalformedBody("no 'result' in body")
        hits = Hits(self._layout)
        result = shape(document["result"], hits)
        return _QdrantBody(hits, document, result, sub_results=result.sub_results)
