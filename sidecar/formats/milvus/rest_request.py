"""Milvus RESTful v2 requests: tenant push-down, over-fetch, and the collection they name.

Push-down turns the ``filter`` expression of ``search`` and ``query``, and of
every sub-search of ``hybrid_search`` (``advanced_search``), into
``<tenant_key> == "<tenant>" and (<app filter>)``, or the condition alone
when the app sent none (absent, null, or blank: Milvus' own test for an
empty expression). Three things make that string safe; the grammar is the
proxy's (milvus-io/milvus, internal/parser/planparserv2/Plan.g4):

- The tenant field is checked at every rewrite to be an identifier
  (``[A-Za-z_][A-Za-z0-9_]*``) that is no keyword of the grammar in any
  case (``and``, ``like``, ``true`` ...): a bad ``tenant_key`` is a
  configuration error (ValueError), never a request's.
- The tenant is a double-quoted string literal in which only ``\\`` and
  ``"`` are escaped (as ``\\\\`` and ``\\"``). Every other character stands
  for itself in the grammar's ``DoubleSChar``, and the proxy reads the
  literal with Go's ``strconv.Unquote``, which gives the tenant back. Tenant
  ids holding a control character (C0, DEL or C1: a line break ends a
  literal, the others need escapes whose decoding the gate would have to
  trust) or a surrogate are refused (UnfilterableRequest), not escaped.
- The app's filter is checked with the lexer's rules for what can contain
  a parenthesis: every string literal (``"..."`` or ``'...'``, with or
  without an ``r``/``u8``/``u``/``U``/``L`` prefix) is closed on its line
  and a backslash in one takes the next character; outside literals there
  is no backslash, and the parentheses balance without ever closing more
  than they opened. So the gate's ``(`` and ``)`` enclose the whole filter
  as one sub-expression: ``x) or (true`` is refused, not wrapped. Anything
  else the filter holds is Milvus' to parse; an expression it refuses is
  an error answer, never rows.

Go's JSON decoder matches field names case-insensitively, so a body with
``"Filter"`` next to the gate's ``"filter"`` could replace it: a key that
differs from one the gate reads only in case is refused. Searches by
primary key (``ids``) are refused under push-down: the query vectors are
then stored rows, which the filter does not cover.

``get`` takes primary keys and no filter, so nothing is pushed down: the
response check removes a rejected row, and a rejected key then reads
exactly as a missing one (Milvus answers both with the rows it found).

Over-fetch raises ``limit`` (search: per query vector; hybrid_search: the
final limit, sub-search limits stay so the fused candidates are the same)
only where the app gave one and nothing else depends on it: not with an
``offset``, grouping, function scores or search aggregation. A request's
``collectionName`` (qualified ``db.collection`` when ``dbName`` names
another database than ``default``) goes to the request policy.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from sidecar.core.hits import Route
from sidecar.formats.base import MalformedRequest, RequestRewrite, UnfilterableRequest
from sidecar.formats.rewriter import SearchRewriter

_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Every keyword of Plan.g4, lower-cased: an identifier spelled like one in
# any case is refused, though the lexer only knows some spellings.
_KEYWORDS: Final = frozenset(
    {
        "like",
        "exists",
        "text_match",
        "phrase_match",
        "random_sample",
        "match_all",
        "match_any",
        "match_least",
        "match_most",
        "match_exact",
        "interval",
        "iso",
        "minimum_should_match",
        "threshold",
        "and",
        "or",
        "not",
        "in",
        "is",
        "null",
        "json_contains",
        "json_contains_all",
        "json_contains_any",
        "array_contains",
        "array_contains_all",
        "array_contains_any",
        "array_length",
        "element_filter",
        "st_equals",
        "st_touches",
        "st_overlaps",
        "st_crosses",
        "st_contains",
        "st_intersects",
        "st_within",
        "st_dwithin",
        "st_isvalid",
        "true",
        "false",
    }
)
_DEFAULT_DB: Final = "default"
# Keys the gate reads, in the body and in each sub-search. A key differing
# from one of them only in case would be read by Milvus in its place.
_READ_KEYS: Final = (
    "collectionName",
    "dbName",
    "filter",
    "limit",
    "offset",
    "search",
    "ids",
    "searchParams",
    "groupingField",
    "functionScore",
    "functionChains",
    "searchAggregation",
)
_FOLDED: Final[Mapping[str, str]] = {key.casefold(): key for key in _READ_KEYS}
# searchParams keys that make a longer result list a different one.
_PAGING_PARAMS: Final = frozenset({"offset", "group_by_field", "group_by_fields"})
_NO_OVERFETCH_WITH: Final = (
    "groupingField",
    "functionScore",
    "functionChains",
    "searchAggregation",
)


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """How the requests of one ``entities`` action are rewritten."""

    # The filter is in the body itself (search, query) or in each of its
    # ``search`` entries (hybrid_search); neither for get.
    filter_at: str  # "body", "search" or "none"
    overfetches: bool


_ENDPOINTS: Final[Mapping[str, _Endpoint]] = {
    "search": _Endpoint("body", overfetches=True),
    "query": _Endpoint("body", overfetches=True),
    "hybrid_search": _Endpoint("search", overfetches=True),
    "advanced_search": _Endpoint("search", overfetches=True),
    "get": _Endpoint("none", overfetches=False),
}


def tenant_field(name: str) -> str:
    """``name`` checked as a filter field; raises ValueError (a configuration error)."""
    if not _IDENTIFIER.fullmatch(name) or name.lower() in _KEYWORDS:
        raise ValueError("tenant_key must be a Milvus field name (an identifier, not a keyword)")
    return name


def string_literal(value: str) -> str:
    """``value`` as a double-quoted filter literal; UnfilterableRequest if it cannot be one.

    The problem never names the value: it is the caller's tenant id.
    """
    if any(unicodedata.category(char) in ("Cc", "Cs") for char in value):
        raise UnfilterableRequest("the tenant id holds a character a Milvus filter cannot quote")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def expression_problem(text: str) -> str | None:
    """Why ``text`` cannot be enclosed in parentheses as one expression; None if it can.

    Scans with the lexer's rules for string literals (see the module
    docstring); problems name no part of the text.
    """
    depth = 0
    quote: str | None = None
    escaped = False
    for char in text:
        if quote is not None:
            if char in "\r\n":
                return "a string literal is not closed on its line"
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "\\":
            return "a backslash outside a string literal"
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                return "a ')' closes a parenthesis it did not open"
    if quote is not None:
        return "a string literal is not closed"
    if depth:
        return "a '(' is not closed"
    return None


def restricted(app_filter: Any, condition: str, where: str) -> str:
    """``condition`` ANDed with the app's filter at ``where``; refused if it cannot be."""
    if app_filter is None or (isinstance(app_filter, str) and not app_filter.strip()):
        return condition
    if not isinstance(app_filter, str):
        raise MalformedRequest(f"{where!r} is not a string")
    problem = expression_problem(app_filter)
    if problem is not None:
        raise UnfilterableRequest(f"{where!r}: {problem}")
    return f"{condition} and ({app_filter})"


class MilvusRequests(SearchRewriter[_Endpoint]):
    """Rewrites the search, hybrid search and query requests of Milvus' REST API v2."""

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
        """``SearchRewriter.rewrite_request``; a ``get`` is never said to be filtered.

        Raises ValueError if ``tenant_key`` is not a field name a filter can use.
        """
        rewrite = super().rewrite_request(
            body,
            route,
            tenant=tenant,
            tenant_key=tenant_key,
            overfetch_factor=overfetch_factor,
            overfetch_cap=overfetch_cap,
        )
        if self._request_endpoint(route) is _ENDPOINTS["get"] and rewrite.tenant_filter:
            return replace(rewrite, tenant_filter=False)
        return rewrite

    def _request_endpoint(self, route: Route) -> _Endpoint | None:
        if route.method.upper() != "POST":
            return None
        match route.path.removesuffix("/").lower().split("/"):
            case ["", "v2", "vectordb", "entities", action]:
                return _ENDPOINTS.get(action)
        return None

    def _names_collections(self, endpoint: _Endpoint) -> bool:
        return True

    def _collections(self, request: dict[str, Any]) -> list[str]:
        """The collection the body names, ``db.collection`` outside the default database.

        Read for every request, so a key Milvus would read in place of one
        the gate reads is refused here, before anything else.
        """
        _check_keys(request)
        name = request.get("collectionName")
        database = request.get("dbName")
        if name is None:
            # Milvus refuses a request without one.
            return []
        if not isinstance(name, str) or not (database is None or isinstance(database, str)):
            raise MalformedRequest("'collectionName' or 'dbName' is not a string")
        if database in (None, "", _DEFAULT_DB):
            return [name]
        return [f"{database}.{name}"]

    def _push_down(
        self, request: dict[str, Any], endpoint: _Endpoint, tenant_key: str, tenant: str
    ) -> None:
        tenant_field(tenant_key)
        if endpoint.filter_at == "none":
            return
        condition = f"{tenant_key} == {string_literal(tenant)}"
        if endpoint.filter_at == "body":
            _refuse_ids(request, "ids")
            request["filter"] = restricted(request.get("filter"), condition, "filter")
            return
        searches = request.get("search")
        if not isinstance(searches, list):
            raise MalformedRequest("'search' is not a list")
        for i, search in enumerate(searches):
            if not isinstance(search, dict):
                raise MalformedRequest("an entry of 'search' is not a JSON object")
            _check_keys(search)
            _refuse_ids(search, f"search[{i}].ids")
            search["filter"] = restricted(search.get("filter"), condition, f"search[{i}].filter")

    def _overfetches(self, endpoint: _Endpoint) -> bool:
        return endpoint.overfetches

    def _limit(self, request: dict[str, Any], endpoint: _Endpoint) -> tuple[str, Any] | None:
        if request.get("offset") not in (None, 0):
            return None
        if any(request.get(key) not in (None, "", {}, []) for key in _NO_OVERFETCH_WITH):
            return None
        params = request.get("searchParams")
        if isinstance(params, dict) and _PAGING_PARAMS & params.keys():
            return None
        asked = request.get("limit")
        # Without a limit Milvus applies its own, which the gate does not guess.
        return None if asked in (None, 0) else ("limit", asked)


def _refuse_ids(request: dict[str, Any], where: str) -> None:
    if request.get("ids") not in (None, []):
        raise UnfilterableRequest(
            f"{where!r}: a search by primary key uses stored vectors "
            "the tenant filter does not cover",
        )


def _check_keys(request: dict[str, Any]) -> None:
    """Refuse a key that Milvus would read as one the gate reads (another case of it)."""
    for key in request:
        known = _FOLDED.get(key.casefold())
        if known is not None and key != known:
            raise UnfilterableRequest(f"a key differs from {known!r} only in case")
