"""Chroma HTTP API v2 requests: tenant push-down and over-fetch for query, get and search.

Push-down ANDs the condition ``{tenant_key: {"$eq": tenant}}`` with the app's
metadata filter: ``where`` of query and get, ``filter`` of each search. The
app's filter becomes the second operand of ``{"$and": [condition, app_filter]}``,
untouched, so whatever it says (``$or``, ``$not_contains``, ``#id``, nested
``$and``) keeps its meaning and can only narrow the result further. Without an
app filter the condition stands alone. Measured against ``chroma run``
(chromadb 1.5): ``$and`` takes any number of operands (``[]`` matches every
record); ``where: {}`` is refused with 400 at the top level and as an operand
alike, so wrapping it changes nothing; ``where: null`` means no filter. A
search's ``filter`` is the same where grammar (the Python client's
``Search.to_dict``); ``{}`` there means no filter. ``where_document`` is a
separate condition the server ANDs with ``where``; it is left alone.

Over-fetch raises the number of results the app asked for, so hits the response
check rejects can be replaced; ``RequestRewrite.limits`` keeps the app's number
so that each result list is trimmed back to it:

- query: ``n_results``, default 10 (the server's, measured); the one limit
  applies to the result list of every query embedding.
- get: ``limit``, only without a non-zero ``offset`` (as for Qdrant: the offset
  counts records before the response check, so a longer page would overlap the
  next one). A get without ``limit`` returns every match and is left alone.
- search: each search's ``limit.limit`` (absent: every match), not with a
  non-zero ``limit.offset`` and not with ``group_by`` (the limit then counts
  what the grouping returns, which trimming hits cannot restore).

Bodies the gate cannot restrict are refused: a filter that is not a JSON
object, a batch of searches that is not a list of objects.

An answer repeats what its request asked: query and get answers carry the
request's ``include`` (measured against ``chroma run``, chromadb 1.5: as
sent, duplicates and order kept; without one, get's default
``["documents", "metadatas"]`` and query's ``["documents", "metadatas",
"distances"]``), search answers each search's selected keys. They are read
here as the request's ``ChromaEcho``, so that the answer's come from the
request (``rest``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from sidecar.core.hits import Route
from sidecar.formats.base import MalformedRequest, UnfilterableRequest
from sidecar.formats.rewriter import SearchRewriter


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """How the requests of one collection endpoint are rewritten."""

    name: str
    filter_key: str  # where the metadata filter sits in a (sub-)request
    # The field holding the number of results, and Chroma's default without it
    # (None: every match).
    limit_field: str
    default_limit: int | None = None


_QUERY: Final = _Endpoint("query", "where", "n_results", default_limit=10)
_GET: Final = _Endpoint("get", "where", "limit")
_SEARCH: Final = _Endpoint("search", "filter", "limit")
# A search's page: {"limit": {"limit": k, "offset": n}}.
_PAGE: Final = _Endpoint("search page", "filter", "limit")

_ENDPOINTS: Final[Mapping[str, _Endpoint]] = {e.name: e for e in (_QUERY, _GET, _SEARCH)}
# What the server includes when the request names nothing (measured).
_DEFAULT_INCLUDE: Final[Mapping[str, tuple[str, ...]]] = {
    "query": ("documents", "metadatas", "distances"),
    "get": ("documents", "metadatas"),
}


@dataclass(frozen=True, slots=True)
class ChromaEcho:
    """What a query or get request included, or each search of a search request
    selected; None where the request says it in no form the server takes (it
    then refuses the request)."""

    include: tuple[str, ...] | None = None
    selects: tuple[tuple[str, ...] | None, ...] | None = None


def _names(value: Any) -> tuple[str, ...] | None:
    """A JSON list of strings as a tuple; None for anything else."""
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return None


def _selected(search: Any) -> tuple[str, ...] | None:
    """The keys one search selects (none without ``select``)."""
    if not isinstance(search, dict) or search.get("select") is None:
        return ()
    select = search["select"]
    return _names(select.get("keys", [])) if isinstance(select, dict) else None


def collection_endpoint(route: Route) -> str | None:
    """``"query"``, ``"get"`` or ``"search"`` for a POST to one of those endpoints of a
    collection (``/api/v2/tenants/{t}/databases/{d}/collections/{id}/<endpoint>``)."""
    if route.method.upper() != "POST":
        return None
    match route.path.split("/"):
        case ["", "api", "v2", "tenants", t, "databases", d, "collections", c, name] if (
            t and d and c and name in _ENDPOINTS
        ):
            return name
    return None


class ChromaRequests(SearchRewriter[_Endpoint]):
    """Rewrites the query, get and search requests of Chroma's HTTP API v2."""

    def _request_endpoint(self, route: Route) -> _Endpoint | None:
        name = collection_endpoint(route)
        return None if name is None else _ENDPOINTS[name]

    def _sub_requests(self, document: dict[str, Any], endpoint: _Endpoint) -> list[dict[str, Any]]:
        if endpoint is not _SEARCH:
            return [document]
        searches = document.get("searches")
        if not isinstance(searches, list) or not all(isinstance(s, dict) for s in searches):
            raise UnfilterableRequest("'searches' is not a list of JSON objects")
        return searches

    def _push_down(
        self, request: dict[str, Any], endpoint: _Endpoint, tenant_key: str, tenant: str
    ) -> None:
        if tenant_key.startswith(("$", "#")):
            # Chroma reads such keys as operators ($and) or record fields (#id).
            raise ValueError("tenant_key names no Chroma metadata field")
        condition = {tenant_key: {"$eq": tenant}}
        key = endpoint.filter_key
        app_filter = request.get(key)
        if app_filter is None or (endpoint is _SEARCH and app_filter == {}):
            request[key] = condition
        elif isinstance(app_filter, dict):
            request[key] = {"$and": [condition, app_filter]}
        else:
            raise UnfilterableRequest(f"{key!r} is not a JSON object")

    def _overfetches(self, endpoint: _Endpoint) -> bool:
        return True

    def _echoes(self, endpoint: _Endpoint) -> bool:
        return True

    def _echo(self, document: dict[str, Any], endpoint: _Endpoint) -> ChromaEcho:
        if endpoint is _SEARCH:
            searches = document.get("searches")
            if not isinstance(searches, list):
                return ChromaEcho()
            return ChromaEcho(selects=tuple(_selected(search) for search in searches))
        if "include" not in document:
            return ChromaEcho(include=_DEFAULT_INCLUDE[endpoint.name])
        return ChromaEcho(include=_names(document["include"]))

    def _limit(self, request: dict[str, Any], endpoint: _Endpoint) -> tuple[str, Any] | None:
        if request.get("offset") not in (None, 0):
            return None
        asked = request.get(endpoint.limit_field)
        if asked is None:
            asked = endpoint.default_limit
        return None if asked is None else (endpoint.limit_field, asked)

    def _overfetch(
        self, request: dict[str, Any], endpoint: _Endpoint, factor: Decimal, cap: int
    ) -> int | None:
        if endpoint is not _SEARCH:
            return super()._overfetch(request, endpoint, factor, cap)
        # A search keeps its limit one level down, in its page.
        if request.get("group_by") not in (None, {}):
            return None
        page = request.get("limit")
        if page is None:
            return None
        if not isinstance(page, dict):
            raise MalformedRequest("a search's 'limit' is not a JSON object")
        return super()._overfetch(page, _PAGE, factor, cap)
