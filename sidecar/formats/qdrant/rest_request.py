"""Qdrant search requests: tenant push-down and over-fetch.

Push-down ANDs the condition ``{"key": tenant_key, "match": {"value": tenant}}``
with whatever filter the app sent, as ``{"must": [condition, app_filter]}``.
Qdrant's ``Filter`` is itself a ``Condition`` (qdrant-client:
``Condition = Union[FieldCondition, ..., Filter]``), so the app's filter is
nested untouched and its ``must``/``should``/``must_not``/``min_should`` keep
exactly their meaning. ``points/query`` also gets the condition in every
prefetch, at every depth: prefetch results are the candidates of the final
query, and another tenant's points must not take their places.

With push-down, a request that uses a point id as a query example (recommend
``positive``/``negative``, discover ``target``/``context``, a query that is an
id or recommends, discovers or searches near one, at any prefetch depth) is
refused: Qdrant looks the point up by id whatever the filter says, so the
answer (results, or its 404 for a missing id) would tell whether another
tenant's point exists and, through the results, where its vector lies.

Over-fetch multiplies a request's ``limit`` (the number of groups, for the
groups endpoints; ``group_size`` is left alone) so that hits the response
check rejects can be replaced; ``RequestRewrite.limits`` remembers what the app
asked for so the response can be trimmed back to it. Defaults and aliases
follow Qdrant's REST API (OpenAPI spec, and the server's request structs):

- search, recommend and discover require ``limit``, also accepted as the
  deprecated ``top``; the groups endpoints of search and recommend require
  ``limit``. A request without one is left as it is: Qdrant refuses it.
- query and query/groups default ``limit`` to 10.
- Requests with a non-zero ``offset`` are not over-fetched. The offset counts
  hits before the response check, so a page that ends past the app's k would
  overlap the next page's start.
- scroll is never over-fetched: its pages continue from ``next_page_offset``,
  which a longer page would move past hits the app never saw.
- Prefetch limits are not raised: the final query then ranks the same
  candidates as it would for the app, and its first k hits stay the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from sidecar.core.hits import Route
from sidecar.formats.base import MalformedRequest, UnfilterableRequest
from sidecar.formats.rewriter import SearchRewriter


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """How the (sub-)requests of one endpoint are rewritten."""

    # Fields that may carry the limit, in the order Qdrant reads them; empty
    # when the endpoint is never over-fetched.
    limit_fields: tuple[str, ...]
    # Qdrant's limit when the request has none; None when Qdrant requires one.
    default_limit: int | None = None
    has_prefetch: bool = False
    # The body is {"searches": [request, ...]}.
    batch: bool = False


_SEARCH: Final = _Endpoint(limit_fields=("limit", "top"))
_GROUPS: Final = _Endpoint(limit_fields=("limit",))
_QUERY: Final = _Endpoint(limit_fields=("limit",), default_limit=10, has_prefetch=True)

# Keyed by the path after /collections/{c}/points, for POST.
_ENDPOINTS: Final[Mapping[str, _Endpoint]] = {
    "search": _SEARCH,
    "search/batch": replace(_SEARCH, batch=True),
    "search/groups": _GROUPS,
    "query": _QUERY,
    "query/batch": replace(_QUERY, batch=True),
    "query/groups": _QUERY,
    "recommend": _SEARCH,
    "recommend/batch": replace(_SEARCH, batch=True),
    "recommend/groups": _GROUPS,
    "discover": _SEARCH,
    "discover/batch": replace(_SEARCH, batch=True),
    "scroll": _Endpoint(limit_fields=()),
}


def points_path(route: Route) -> list[str] | None:
    """The path segments after ``/collections/{c}/points``; None for other paths."""
    match route.path.removesuffix("/").split("/"):
        case ["", "collections", collection, "points", *rest] if collection and all(rest):
            return rest
    return None


def post_endpoint(route: Route) -> str | None:
    """The endpoint name of a POST under ``/collections/{c}/points`` ("search", ...)."""
    rest = points_path(route)
    if rest is None or route.method.upper() != "POST":
        return None
    return "/".join(rest)


class QdrantRequests(SearchRewriter[_Endpoint]):
    """Rewrites the search, query, recommend, discover and scroll requests of Qdrant's REST API.

    Retrieving points by id takes no filter, so its requests are not read.
    """

    def _request_endpoint(self, route: Route) -> _Endpoint | None:
        name = post_endpoint(route)
        return None if name is None else _ENDPOINTS.get(name)

    def _sub_requests(self, document: dict[str, Any], endpoint: _Endpoint) -> list[dict[str, Any]]:
        if not endpoint.batch:
            return [document]
        searches = document.get("searches")
        if not isinstance(searches, list):
            raise MalformedRequest("'searches' is not a list")
        if not all(isinstance(request, dict) for request in searches):
            raise MalformedRequest("a batch request is not a JSON object")
        return searches

    def _push_down(
        self, request: dict[str, Any], endpoint: _Endpoint, tenant_key: str, tenant: str
    ) -> None:
        _refuse_point_examples(request)
        condition = {"key": tenant_key, "match": {"value": tenant}}
        _add_condition(request, condition)
        if endpoint.has_prefetch:
            for prefetch in _prefetches(request):
                _add_condition(prefetch, condition)

    def _names_collections(self, endpoint: _Endpoint) -> bool:
        return True

    def _collections(self, request: dict[str, Any]) -> list[str]:
        """``lookup_from`` (of the request and its prefetches) and ``with_lookup``:
        other collections whose points or vectors the request reads."""
        names = []
        for holder in [request, *_prefetches(request)]:
            lookup_from = holder.get("lookup_from")
            if lookup_from is not None:
                names.append(_collection_name(lookup_from, "lookup_from"))
        with_lookup = request.get("with_lookup")
        if with_lookup is not None:
            names.append(_collection_name(with_lookup, "with_lookup"))
        return names

    def _overfetches(self, endpoint: _Endpoint) -> bool:
        return bool(endpoint.limit_fields)

    def _limit(self, request: dict[str, Any], endpoint: _Endpoint) -> tuple[str, Any] | None:
        if request.get("offset") not in (None, 0):
            return None
        field = next(
            (name for name in endpoint.limit_fields if request.get(name) is not None),
            endpoint.limit_fields[0],
        )
        asked = request.get(field)
        if asked is None:
            asked = endpoint.default_limit
        return None if asked is None else (field, asked)


def _add_condition(request: dict[str, Any], condition: dict[str, Any]) -> None:
    app_filter = request.get("filter")
    if app_filter is None:
        request["filter"] = {"must": [condition]}
    elif isinstance(app_filter, dict):
        request["filter"] = {"must": [condition, app_filter]}
    else:
        raise MalformedRequest("'filter' is not a JSON object")


# How a field holds examples (vectors, documents, or point ids Qdrant looks up):
# one example (or an object of more fields), a list of examples, or objects
# (and lists of objects) with example fields.
_EXAMPLE_FIELDS: Final[Mapping[str, str]] = {
    "query": "one",
    "nearest": "one",
    "target": "one",
    "positive": "list",
    "negative": "list",
    "recommend": "nested",
    "discover": "nested",
    "context": "nested",
}


def _refuse_point_examples(request: dict[str, Any]) -> None:
    """Raise UnfilterableRequest when ``request`` (or a prefetch) uses a point id as an example.

    An id is an integer or a string; vectors are arrays, documents and sparse
    vectors objects. A stack rather than recursion: the depth is the client's.
    """
    pending: list[tuple[Any, str]] = [
        (holder, "nested") for holder in [request, *_prefetches(request)]
    ]
    while pending:
        value, kind = pending.pop()
        if kind == "list" and isinstance(value, list):
            pending.extend((item, "one") for item in value)
        elif isinstance(value, dict):
            pending.extend(
                (value[key], how) for key, how in _EXAMPLE_FIELDS.items() if key in value
            )
        elif kind == "nested" and isinstance(value, list):
            pending.extend((item, "nested") for item in value)
        elif isinstance(value, str) or (type(value) is int):
            raise UnfilterableRequest(
                "a point id as a query example is looked up past the tenant filter; "
                "send its vector instead",
            )


def _collection_name(value: Any, field: str) -> str:
    """The collection of a ``lookup_from`` or ``with_lookup`` (a name, or an object with one)."""
    name = value.get("collection") if isinstance(value, dict) else value
    if not isinstance(name, str) or not name:
        raise MalformedRequest(f"{field!r} names no collection")
    return name


def _prefetches(request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every prefetch below ``request``, at any depth.

    A stack rather than recursion: the depth comes from the client.
    """
    pending = [request]
    while pending:
        nested = pending.pop().get("prefetch")
        if nested is None:
            continue
        # Qdrant takes one prefetch or a list of them.
        for prefetch in nested if isinstance(nested, list) else [nested]:
            if not isinstance(prefetch, dict):
                raise MalformedRequest("a prefetch is not a JSON object")
            yield prefetch
            pending.append(prefetch)
