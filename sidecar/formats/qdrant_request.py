"""Qdrant search requests: tenant push-down and over-fetch.

Push-down ANDs the condition ``{"key": tenant_key, "match": {"value": tenant}}``
with whatever filter the app sent, as ``{"must": [condition, app_filter]}``.
Qdrant's ``Filter`` is itself a ``Condition`` (qdrant-client:
``Condition = Union[FieldCondition, ..., Filter]``), so the app's filter is
nested untouched and its ``must``/``should``/``must_not``/``min_should`` keep
exactly their meaning. ``points/query`` also gets the condition in every
prefetch, at every depth: prefetch results are the candidates of the final
query, and another tenant's points must not take their places.

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

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Final

import orjson

from sidecar.formats.base import MalformedRequest, RequestRewrite


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
ENDPOINTS: Final[Mapping[str, _Endpoint]] = {
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


def rewrite(
    body: bytes,
    endpoint_name: str,
    *,
    tenant: str,
    tenant_key: str | None,
    overfetch_factor: float,
    overfetch_cap: int,
) -> RequestRewrite:
    """Rewrite a request body for the POST endpoint ``endpoint_name``.

    See ``RequestRewriter.rewrite_request``. Endpoints outside ``ENDPOINTS``
    (retrieve by ids) and requests with nothing to apply come back unchanged.
    Raises ValueError if ``overfetch_factor`` is not finite (a configuration
    error, not the client's).
    """
    if not math.isfinite(overfetch_factor):
        raise ValueError("overfetch_factor is not a finite number")
    endpoint = ENDPOINTS.get(endpoint_name)
    overfetch = endpoint is not None and bool(endpoint.limit_fields) and overfetch_factor > 1
    if endpoint is None or (tenant_key is None and not overfetch):
        return RequestRewrite(body, (), tenant_filter=False, overfetched=False)
    # The factor as configured (1.1, not 1.100000000000000088...), so that
    # rounding up does not add a hit: 10 * 1.1 is 11.
    factor = Decimal(repr(overfetch_factor)) if overfetch else None

    document = _load(body)
    condition = None if tenant_key is None else {"key": tenant_key, "match": {"value": tenant}}
    limits: list[int | None] = []
    for request in _sub_requests(document, endpoint):
        if condition is not None:
            _push_down(request, condition, endpoint)
        limits.append(
            None if factor is None else _overfetch(request, endpoint, factor, overfetch_cap)
        )

    overfetched = any(limit is not None for limit in limits)
    return RequestRewrite(
        _dump(document),
        tuple(limits) if overfetched else (),
        tenant_filter=condition is not None,
        overfetched=overfetched,
    )


def _load(body: bytes) -> dict[str, Any]:
    try:
        document = orjson.loads(body)
        readable = True
    except orjson.JSONDecodeError:
        readable = False
    # Raised outside the handler so that nothing is chained: a decode error's
    # .doc attribute holds the whole body.
    if not readable:
        raise MalformedRequest("request body is not valid UTF-8 JSON")
    if not isinstance(document, dict):
        raise MalformedRequest("request body is not a JSON object")
    return document


def _dump(document: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(document)
    except orjson.JSONEncodeError:
        # Only nesting past orjson's depth limit gets here; Qdrant refuses
        # requests that deep itself.
        pass
    raise MalformedRequest("request body is nested too deeply")


def _sub_requests(document: dict[str, Any], endpoint: _Endpoint) -> list[dict[str, Any]]:
    if not endpoint.batch:
        return [document]
    searches = document.get("searches")
    if not isinstance(searches, list):
        raise MalformedRequest("'searches' is not a list")
    if not all(isinstance(request, dict) for request in searches):
        raise MalformedRequest("a batch request is not a JSON object")
    return searches


def _push_down(request: dict[str, Any], condition: dict[str, Any], endpoint: _Endpoint) -> None:
    _add_condition(request, condition)
    if endpoint.has_prefetch:
        for prefetch in _prefetches(request):
            _add_condition(prefetch, condition)


def _add_condition(request: dict[str, Any], condition: dict[str, Any]) -> None:
    app_filter = request.get("filter")
    if app_filter is None:
        request["filter"] = {"must": [condition]}
    elif isinstance(app_filter, dict):
        request["filter"] = {"must": [condition, app_filter]}
    else:
        raise MalformedRequest("'filter' is not a JSON object")


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


def _overfetch(
    request: dict[str, Any], endpoint: _Endpoint, factor: Decimal, cap: int
) -> int | None:
    """Raise the limit of ``request`` in place; return the app's limit, or None if unchanged."""
    if request.get("offset") not in (None, 0):
        return None
    field = next(
        (name for name in endpoint.limit_fields if request.get(name) is not None),
        endpoint.limit_fields[0],
    )
    asked = request.get(field)
    if asked is None:
        asked = endpoint.default_limit
        if asked is None:
            return None
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 0:
        raise MalformedRequest(f"{field!r} is not a non-negative integer")
    raised = min(cap, math.ceil(factor * asked))
    if raised <= asked:
        return None
    request[field] = raised
    return asked
