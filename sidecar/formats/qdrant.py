"""Qdrant REST responses: search, query, recommend, discover, groups, scroll, retrieve.

Every successful Qdrant response is an envelope ``{"result": ..., "status": "ok",
"time": ...}`` (sometimes with ``usage``). Where the hits sit inside ``result``
depends on the endpoint, so the route picks a *shape*: a function that checks
``result``, registers its hits as candidates and returns a renderer that
rebuilds ``result`` for a given set of kept positions and, per sub-result, the
number of hits (or groups) to keep at most.

Renderers copy only the containers they change (lists, group objects, the
envelope); hits are never copied and the parsed document is never mutated, so
``render`` may be called any number of times.

Search requests are rewritten by ``qdrant_request``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.formats import qdrant_request
from sidecar.formats._common import (
    check_fields,
    load_object,
    make_candidate,
    parse_guarded,
    usable_id,
    usable_text,
)
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody, ParsedBody, RequestRewrite


class _Selection:
    """Which positions are kept, and the substitutes for some of them."""

    def __init__(
        self,
        keep: frozenset[int],
        replacements: Mapping[int, Replacement],
        text_field: str,
        id_field: str | None,
    ) -> None:
        self.keep = keep
        self._replacements = replacements
        self._text_field = text_field
        self._id_field = id_field
        self.released: list[int] = []  # positions rendered, in body order

    def __contains__(self, position: object) -> bool:
        return position in self.keep

    def hit(self, position: int, item: Any) -> Any:
        """The hit as rendered: itself, or a copy carrying its substitute."""
        self.released.append(position)
        replacement = self._replacements.get(position)
        if replacement is None:
            return item
        payload = dict(item.get("payload") or {})
        old_id = payload.get(self._id_field) if self._id_field else item.get("id")
        payload[self._text_field] = replacement.text
        payload[SUBSTITUTED_FOR] = old_id
        substitute = {**item, "payload": payload}
        if self._id_field:
            payload[self._id_field] = replacement.chunk_id
        else:
            # Qdrant point ids are unsigned integers or UUID strings.
            chunk_id = replacement.chunk_id
            substitute["id"] = (
                int(chunk_id) if chunk_id.isascii() and chunk_id.isdigit() else chunk_id
            )
        return substitute


# Builds the filtered value of one sub-result for the kept positions and the
# most hits (groups, for groups) to keep; None means "leave the value out of
# its parent".
_Renderer = Callable[[_Selection, int | None], Any]


class _Hits:
    """Numbers hits in document order and turns each into a Candidate."""

    def __init__(self, text_field: str, id_field: str | None) -> None:
        self.candidates: list[Candidate] = []
        self._text_field = text_field
        self._id_field = id_field

    def add(self, hit: Any) -> int:
        # Fast path for the common, well-formed hit as orjson decodes it (exact
        # types: a bool is no id); anything else takes the checks below, which
        # accept the same hits and name the problem with the others.
        if type(hit) is dict:
            payload = hit.get("payload")
            if type(payload) is dict:
                raw_id = hit.get("id") if self._id_field is None else payload.get(self._id_field)
                text = payload.get(self._text_field)
                if type(text) is str:
                    if type(raw_id) is int:
                        raw_id = str(raw_id)
                    if type(raw_id) is str and raw_id:
                        position = len(self.candidates)
                        self.candidates.append(Candidate(position, raw_id, text))
                        return position
        return self.add_checked(hit)

    def add_checked(self, hit: Any) -> int:
        """``add`` without its fast path: every check, with the problem named."""
        if not isinstance(hit, dict):
            raise MalformedBody("a point is not a JSON object")
        position = len(self.candidates)
        # make_candidate says a missing payload once when both report it.
        self.candidates.append(make_candidate(position, self._chunk_id(hit), self._text(hit)))
        return position

    # Problems name the field, never its value: they end up in audit records.

    def _chunk_id(self, hit: dict[str, Any]) -> tuple[str | None, str | None]:
        if self._id_field is None:
            return usable_id(hit.get("id"), "point id")
        payload, problem = _payload(hit)
        if payload is None:
            return None, problem
        return usable_id(payload.get(self._id_field), f"payload field {self._id_field!r}")

    def _text(self, hit: dict[str, Any]) -> tuple[str | None, str | None]:
        payload, problem = _payload(hit)
        if payload is None:
            return None, problem
        return usable_text(payload.get(self._text_field), f"payload field {self._text_field!r}")


def _payload(hit: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    payload = hit.get("payload")
    if payload is None:
        # Absent or null: the request said with_payload=false.
        return None, "no payload"
    if not isinstance(payload, dict):
        return None, "payload is not an object"
    return payload, None


@dataclass(frozen=True, slots=True)
class _Result:
    """A parsed ``result``: how many sub-results it has, and how to render it
    for kept positions and one limit per sub-result."""

    sub_results: int
    render: Callable[[_Selection, Sequence[int | None]], Any]


# Shapes of one sub-result. Each validates its value, registers hits in
# document order and returns the renderer for that value.
_SubShape = Callable[[Any, _Hits], _Renderer]
# Shapes of a whole ``result``.
_Shape = Callable[[Any, _Hits], _Result]


def _point_list(value: Any, hits: _Hits) -> _Renderer:
    """``[point, ...]``: search, recommend, discover, retrieve."""
    if not isinstance(value, list):
        raise MalformedBody("expected a list of points")
    start = len(hits.candidates)
    for item in value:
        hits.add(item)

    def render(keep: _Selection, limit: int | None) -> list[Any]:
        kept = [position for position in range(start, start + len(value)) if position in keep]
        return [keep.hit(position, value[position - start]) for position in kept[:limit]]

    return render


def _points_object(value: Any, hits: _Hits) -> _Renderer:
    """``{"points": [point, ...], ...}``: query, scroll (with next_page_offset)."""
    if not isinstance(value, dict):
        raise MalformedBody("expected an object with 'points'")
    render_points = _point_list(value.get("points"), hits)
    return lambda keep, limit: {**value, "points": render_points(keep, limit)}


def _single(shape: _SubShape) -> _Shape:
    """A ``result`` that is one sub-result."""

    def parse(value: Any, hits: _Hits) -> _Result:
        render = shape(value, hits)
        return _Result(1, lambda keep, limits: render(keep, limits[0]))

    return parse


def _batch(shape: _SubShape) -> _Shape:
    """``[sub-result, ...]``: the */batch endpoints."""

    def parse(value: Any, hits: _Hits) -> _Result:
        if not isinstance(value, list):
            raise MalformedBody("expected a list of batch results")
        renderers = [shape(item, hits) for item in value]
        return _Result(
            len(renderers),
            lambda keep, limits: [
                render(keep, limit) for render, limit in zip(renderers, limits, strict=True)
            ],
        )

    return parse


def _groups(value: Any, hits: _Hits) -> _Renderer:
    """``{"groups": [{"id", "hits", "lookup"?}, ...]}``: the */groups endpoints."""
    if not isinstance(value, dict) or not isinstance(value.get("groups"), list):
        raise MalformedBody("expected an object with a list of 'groups'")
    renderers = [_group(group, hits) for group in value["groups"]]

    def render(keep: _Selection, limit: int | None) -> dict[str, Any]:
        # The limit counts groups returned, so emptied groups do not count.
        groups: list[dict[str, Any]] = []
        for render_group in renderers:
            if limit is not None and len(groups) >= limit:
                break
            if (group := render_group(keep)) is not None:
                groups.append(group)
        return {**value, "groups": groups}

    return render


def _group(value: Any, hits: _Hits) -> Callable[[_Selection], dict[str, Any] | None]:
    if not isinstance(value, dict):
        raise MalformedBody("a group is not a JSON object")
    render_hits = _point_list(value.get("hits"), hits)
    # Qdrant writes hits before lookup, so the lookup record numbers after them.
    lookup = value.get("lookup")
    lookup_position = None if lookup is None else hits.add(lookup)

    def render(keep: _Selection) -> dict[str, Any] | None:
        # The request's limit counts groups; group_size is never raised, so
        # the hits of a group are not trimmed.
        kept_hits = render_hits(keep, None)
        if not kept_hits:
            # The group id is the group_by payload value of its hits: it goes with them.
            return None
        group = {**value, "hits": kept_hits}
        if lookup_position is not None and lookup_position in keep:
            group["lookup"] = keep.hit(lookup_position, lookup)
        elif lookup_position is not None:
            # Qdrant omits "lookup" when the looked-up point does not exist, so a
            # rejected lookup looks exactly like a missing one (PointGroup.lookup
            # is optional in the OpenAPI spec and in qdrant-client's model).
            del group["lookup"]
        return group

    return render


def _single_point(value: Any, hits: _Hits) -> _Renderer:
    """``point``: GET /collections/{c}/points/{id}."""
    position = hits.add(value)
    # A rejected point drops "result" from the envelope. That is how Qdrant
    # itself serialises an absent result; the spec declares "result" optional
    # but not nullable, and qdrant-client's model reads the omission as
    # result=None. An empty stand-in record would invent a point that does not
    # exist, and a null would break strict spec validation. The request names
    # the point, so there is no limit to trim to.
    return lambda keep, limit: keep.hit(position, value) if position in keep else None


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
# POSTs under /collections/{c}/points that read without returning points.
# POSTs under /collections/{c}/points that change points (the rest read).
_WRITES: Final = frozenset(
    {"delete", "payload", "payload/delete", "payload/clear", "vectors", "vectors/delete", "batch"}
)


def _points_path(route: Route) -> list[str] | None:
    """The path segments after ``/collections/{c}/points``; None for other paths."""
    match route.path.removesuffix("/").split("/"):
        case ["", "collections", collection, "points", *rest] if collection and all(rest):
            return rest
    return None


def _shape(route: Route) -> _Shape | None:
    rest = _points_path(route)
    if rest is None:
        return None
    method = route.method.upper()
    if method == "POST":
        return _POST_SHAPES.get("/".join(rest))
    if method == "GET" and len(rest) == 1:
        return _GET_POINT_SHAPE
    return None


def _search_endpoint(route: Route) -> str | None:
    """The endpoint name of a POST under ``/collections/{c}/points`` ("search", ...)."""
    rest = _points_path(route)
    if rest is None or route.method.upper() != "POST":
        return None
    return "/".join(rest)


@dataclass(frozen=True, slots=True)
class _QdrantBody:
    candidates: Sequence[Candidate]
    _envelope: dict[str, Any]
    _result: _Result
    _text_field: str
    _id_field: str | None
    # ((keep, limits), released positions) of the last render: released_positions
    # after a render (the usual call order) need not render again.
    _last_release: list[Any] = field(default_factory=list)

    def render(
        self,
        keep: Collection[int],
        limits: Sequence[int | None] | None = None,
        replacements: Mapping[int, Replacement] | None = None,
    ) -> bytes:
        """Serialise the body with only the hits whose position is in ``keep``.

        With ``limits``, each sub-result keeps at most that many of its kept
        hits (groups, for groups endpoints), in rank order. A replaced hit
        gets the substitute's text and id (the point id, or ``id_field``) and
        a ``retrieval_gate_substituted_for`` payload field naming the chunk it
        replaced; see ``ParsedBody.render``.
        """
        checked = self._checked_limits(limits)
        selection = self._selection(keep, replacements)
        result = self._result.render(selection, checked)
        # Replacements change what a hit carries, never which hits go out.
        self._last_release[:] = [(selection.keep, tuple(checked)), selection.released]
        envelope = dict(self._envelope)
        if result is None:
            del envelope["result"]
        else:
            envelope["result"] = result
        return orjson.dumps(envelope)

    def released_positions(
        self, keep: Collection[int], limits: Sequence[int | None] | None = None
    ) -> list[int]:
        """The positions ``render`` would send, in body order (trimming included)."""
        checked = self._checked_limits(limits)
        last = self._last_release
        if last and last[0] == (frozenset(keep), tuple(checked)):
            return list(last[1])
        selection = self._selection(keep, None)
        self._result.render(selection, checked)
        return selection.released

    def _checked_limits(self, limits: Sequence[int | None] | None) -> Sequence[int | None]:
        if not limits:
            return (None,) * self._result.sub_results
        if len(limits) != self._result.sub_results:
            raise MalformedBody(
                f"response has {self._result.sub_results} sub-results, "
                f"the request had {len(limits)}"
            )
        return limits

    def _selection(
        self, keep: Collection[int], replacements: Mapping[int, Replacement] | None
    ) -> _Selection:
        return _Selection(frozenset(keep), replacements or {}, self._text_field, self._id_field)


class QdrantFormat:
    """Adapter for Qdrant's REST API: filters responses, rewrites search requests.

    The chunk id is the point id (``str(id)``), or the payload field ``id_field``
    when set; the chunk text is the payload field ``text_field``.
    """

    def __init__(self, text_field: str = "text", id_field: str | None = None) -> None:
        check_fields(text_field, id_field)
        self.text_field = text_field
        self.id_field = id_field

    @property
    def name(self) -> str:
        """Short stable name, used as the ``format`` metric label."""
        return "qdrant"

    def route_kind(self, route: Route) -> RouteKind | None:
        """FILTERED for the point-reading endpoints of ``/collections/{c}/points``.

        Snapshots are CONTENT (a whole collection, past every per-chunk check);
        other reads are GET/HEAD and ``points/count``; anything else under
        ``/collections`` writes. Paths outside ``/collections`` are not claimed.
        """
        if _shape(route) is not None:
            return RouteKind.FILTERED
        segments = route.path.removesuffix("/").split("/")
        if "snapshots" in segments:
            return RouteKind.CONTENT
        if len(segments) < 3 or segments[1] != "collections":
            return None
        if route.method.upper() in ("GET", "HEAD"):
            return RouteKind.READ
        if route.method.upper() == "POST" and _search_endpoint(route) not in _WRITES:
            # count (a match oracle), facet (payload values across every point),
            # search/matrix: reads the gate does not filter.
            return RouteKind.CONTENT
        return RouteKind.WRITE

    def parse(self, body: bytes, route: Route) -> ParsedBody:
        """Parse a successful response body; raise MalformedBody if it is not one.

        Raises ValueError if ``route`` is not one this format handles.
        """
        shape = _shape(route)
        if shape is None:
            raise ValueError("route is not handled by the qdrant format")
        return parse_guarded(self.name, lambda: self._parse(body, shape))

    def _parse(self, body: bytes, shape: _Shape) -> _QdrantBody:
        envelope = load_object(body)
        if "result" not in envelope:
            raise MalformedBody("no 'result' in body")
        hits = _Hits(self.text_field, self.id_field)
        result = shape(envelope["result"], hits)
        return _QdrantBody(tuple(hits.candidates), envelope, result, self.text_field, self.id_field)

    def rewrites_request(self, route: Route) -> bool:
        """True for the search, query, recommend, discover and scroll endpoints.

        Retrieving points by id takes no filter, so its requests are not read.
        """
        return _search_endpoint(route) in qdrant_request.ENDPOINTS

    def rewrite_request(
        self,
        body: bytes,
        route: Route,
        *,
        tenant: str,
        tenant_key: str | None,
        overfetch_factor: float,
        overfetch_cap: int,
    ) -> RequestRewrite:
        """Restrict a search request to ``tenant`` and raise its limits.

        See ``RequestRewriter.rewrite_request`` and ``qdrant_request``.
        """
        endpoint = _search_endpoint(route)
        if endpoint is None:
            return RequestRewrite(body, (), tenant_filter=False, overfetched=False)
        return qdrant_request.rewrite(
            body,
            endpoint,
            tenant=tenant,
            tenant_key=tenant_key,
            overfetch_factor=overfetch_factor,
            overfetch_cap=overfetch_cap,
        )
