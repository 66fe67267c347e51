"""Milvus gRPC requests: tenant push-down, over-fetch, and the collections they name.

pymilvus calls ``/milvus.proto.milvus.MilvusService/<Method>``; three methods
carry a filter expression and are rewritten, as the REST twin
(``rest_request``) rewrites its search, hybrid search and query:

- ``Search`` (``SearchRequest``): the filter is ``dsl``; a request may carry
  ``sub_reqs`` (``SubSearchRequest``, each with its own ``dsl``).
- ``HybridSearch`` (``HybridSearchRequest``): one ``SearchRequest`` per
  sub-search in ``requests``, each with its own ``dsl``; the final limit is
  ``rank_params["limit"]``.
- ``Query`` (``QueryRequest``): the filter is ``expr``. pymilvus' ``get``
  is a query too (``<pk> in [...]``), so it is confined like any other;
  the response check still removes what is not admitted.

Push-down turns every filter into ``<tenant_key> == "<tenant>" and (<app
filter>)``, or the condition alone when the app sent none, with the REST
twin's checks, imported from it, not copied: the tenant field must be an
identifier that is no keyword of the grammar (ValueError: a configuration
error), the tenant a double-quoted literal in which nothing can end the
string (tenant ids with control characters are refused), and the app's
filter one parenthesised expression (literals closed, parentheses balanced)
or the request is refused (UnfilterableRequest). The filter language is
Milvus' boolean expressions whatever ``dsl_type`` says (the proxy reads
``dsl`` so; the gate sets ``BoolExprV1`` where it wrote the filter). Refused
under push-down as well: a search by primary keys (``ids``, or the old
``search_by_primary_keys`` flag), whose query vectors are stored rows the
filter does not cover, and any request holding a field the gate's copy of
the proto does not declare (a newer client's field could search by
something the filter does not cover). Requests are decoded and encoded
again: Milvus reads exactly the message the gate checked.

Over-fetch raises the number of results the app asked for, where the app
gave one and nothing else depends on it, capped at ``overfetch_cap`` and at
Milvus' own largest ``topk`` (16384): ``search_params["topk"]`` of a
search (per query vector), ``rank_params["limit"]`` of a hybrid search (the
sub-searches' limits stay, so the fused candidates are the same) and
``query_params["limit"]`` of a query. Never with an offset, grouping, an
iterator (its cursor would move past rows the app never saw), function
scores or chains, search aggregation, sub-requests, aggregating output
fields (``count(*)``), a key given twice (Milvus reads the first) or a
number not written plainly in decimal (Milvus also reads ``0x10`` and
``010``).

A search iterator's page (``search_iter_v2``) repeats two values of its
request in its answer: the iterator's ``token`` (``search_iter_id``, once the
first page named it) and, when no row comes back, the bound the page started
from (``search_iter_last_bound``). Both are read here as the request's
``RequestRewrite.echo`` (``IteratorEcho``), so that the answer's are rebuilt
from the request (``grpc_replies``).

The collection a request names (``collection_name``, qualified
``db.collection`` when ``db_name`` names another database than
``default``; a hybrid search's sub-searches name theirs too) goes to the
request policy. pymilvus sends the database in ``dbname`` metadata and an
empty ``db_name``; the metadata is not the body's, and is left to the
request path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from sidecar.core.hits import Route
from sidecar.formats import grpc_adapter, grpc_messages
from sidecar.formats.base import (
    RequestCapabilities,
    RequestRewrite,
    UnfilterableRequest,
    unchanged_request,
)
from sidecar.formats.milvus.rest_request import restricted, string_literal, tenant_field

SERVICE: Final = "milvus.proto.milvus.MilvusService"
SEARCH: Final = "Search"
HYBRID_SEARCH: Final = "HybridSearch"
QUERY: Final = "Query"
_DEFAULT_DB: Final = "default"
_BOOL_EXPR_V1: Final = 1  # common.DslType.BoolExprV1
# Milvus refuses a topk (and offset + limit) above this (quotaAndLimits.limits.topK).
MILVUS_MAX_K: Final = 16384
_DECIMAL: Final = re.compile(r"0|[1-9][0-9]*")
_FALSE: Final = frozenset({"", "0", "false", "False", "FALSE"})


@dataclass(frozen=True, slots=True)
class _Method:
    """How the requests of one method are read."""

    message: str  # the request message's full name
    params: str  # the key-value list that holds the limit
    limit_key: str
    # Keys of ``params`` that make a longer result list a different one, when
    # present with any value but a false one.
    no_overfetch: frozenset[str]


# Keys of an iterator's requests: present at all, whatever their value (a query
# iterator seeks its start with iterator=False), they move a cursor.
_ITERATOR_KEYS: Final = frozenset(
    {
        "iterator",
        "search_iter_v2",
        "search_iter_batch_size",
        "search_iter_last_bound",
        "search_iter_id",
        "query_iter_last_pk",
        "query_iter_last_element_offset",
    }
)
METHODS: Final = {
    SEARCH: _Method(
        "milvus.proto.milvus.SearchRequest",
        "search_params",
        "topk",
        # "limit": a second limit the gate does not raise.
        frozenset({"offset", "group_by_field", "group_by_fields", "limit"}),
    ),
    HYBRID_SEARCH: _Method(
        "milvus.proto.milvus.HybridSearchRequest",
        "rank_params",
        "limit",
        frozenset({"offset", "group_by_field", "group_size", "rank_group_scorer"}),
    ),
    QUERY: _Method(
        "milvus.proto.milvus.QueryRequest",
        "query_params",
        "limit",
        frozenset({"offset", "reduce_stop_for_best", "group_by_fields"}),
    ),
}


@dataclass(frozen=True, slots=True)
class IteratorEcho:
    """What a search iterator's request says of the iteration: its ``token``
    (``search_iter_id``) and the bound its page starts from
    (``search_iter_last_bound``); None where it does not say (the first page)."""

    token: str | None
    last_bound: float | None


def iterator_echo(request: Any) -> IteratorEcho | None:
    """The iteration a ``SearchRequest`` continues; None when it is no search iterator's.

    Milvus reads the first of a key given twice, and a bound as a float32.
    """
    values: dict[str, str] = {}
    for pair in request.search_params:
        values.setdefault(pair.key, pair.value)
    if "search_iter_v2" not in values:
        return None
    bound = None
    if "search_iter_last_bound" in values:
        try:
            bound = float(values["search_iter_last_bound"])
        except ValueError:
            bound = None  # Milvus refuses the request; the answer is an error
    return IteratorEcho(values.get("search_iter_id") or None, bound)


def method(route: Route) -> str | None:
    """The ``MilvusService`` method ``route`` calls (``"Search"``), or None."""
    return grpc_adapter.grpc_method(route, SERVICE)


def qualified(database: str, collection: str) -> list[str]:
    """The collection as the request policy names it: ``db.collection`` outside the
    default database; [] when the request names none (Milvus refuses it)."""
    if not collection:
        return []
    if database in ("", _DEFAULT_DB):
        return [collection]
    return [f"{database}.{collection}"]


class MilvusGrpcRequests(RequestCapabilities):
    """Rewrites the ``Search``, ``HybridSearch`` and ``Query`` requests of ``MilvusService``."""

    def rewrites_request(self, route: Route) -> bool:
        """True for the methods that carry a filter expression."""
        return method(route) in METHODS

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
        """Restrict a request to ``tenant`` and raise its limit; see the module docstring.

        Raises ValueError for a ``tenant_key`` no filter can use or a factor
        that is not finite (configuration errors), MalformedRequest for a body
        that is not one request message, UnfilterableRequest for one that
        cannot be confined. Other methods' bodies come back unchanged.
        """
        called = method(route)
        spec = METHODS.get(called or "")
        if spec is None:
            return unchanged_request(body)
        if not math.isfinite(overfetch_factor):
            raise ValueError("overfetch_factor is not a finite number")
        if tenant_key is not None:
            tenant_field(tenant_key)
        request = grpc_adapter.decode_request(body, spec.message)
        collections = _named(request, called)
        echo = iterator_echo(request) if called == SEARCH else None
        unknown = grpc_messages.has_unknown_fields(request)
        if tenant_key is not None:
            if unknown:
                raise UnfilterableRequest(
                    "the request has fields the gate does not know; "
                    "it cannot be confined to the tenant"
                )
            _push_down(request, called, f"{tenant_key} == {string_literal(tenant)}")
        asked = None
        if overfetch_factor > 1 and not unknown and _may_overfetch(request, called):
            asked = _overfetch(
                getattr(request, spec.params),
                spec,
                Decimal(repr(overfetch_factor)),
                min(overfetch_cap, MILVUS_MAX_K),
            )
        if tenant_key is None and asked is None:
            return unchanged_request(body, collections, echo)
        return RequestRewrite(
            grpc_adapter.encode_unary(request),
            () if asked is None else (asked,),
            tenant_filter=tenant_key is not None,
            overfetched=asked is not None,
            collections=collections,
            echo=echo,
        )

    def request_collections(self, body: bytes, route: Route) -> tuple[str, ...]:
        """The collections a request with a filter expression names, as
        ``rewrite_request`` gives them; raises MalformedRequest for a body that is
        not its request."""
        called = method(route)
        spec = METHODS.get(called or "")
        if spec is None:
            return ()
        return _named(grpc_adapter.decode_request(body, spec.message), called)


def _named(request: Any, called: str | None) -> tuple[str, ...]:
    """The collections ``request`` names, each once."""
    return tuple(dict.fromkeys(_collections(request, called)))


def _collections(request: Any, called: str | None) -> Iterator[str]:
    yield from qualified(request.db_name, request.collection_name)
    if called == HYBRID_SEARCH:
        for search in request.requests:
            yield from qualified(search.db_name or request.db_name, search.collection_name)


def _push_down(request: Any, called: str | None, condition: str) -> None:
    if called == QUERY:
        request.expr = restricted(request.expr, condition, "expr")
    elif called == SEARCH:
        _confine_search(request, condition, "")
    else:
        for i, search in enumerate(request.requests):
            _confine_search(search, condition, f"requests[{i}].")


def _confine_search(search: Any, condition: str, where: str) -> None:
    """AND ``condition`` into a ``SearchRequest``'s filter and its sub-requests' filters."""
    if search.WhichOneof("search_input") == "ids" or search.search_by_primary_keys:
        raise UnfilterableRequest(
            f"{where}ids: a search by primary key uses stored vectors "
            "the tenant filter does not cover",
        )
    search.dsl = restricted(search.dsl, condition, f"{where}dsl")
    search.dsl_type = _BOOL_EXPR_V1
    for i, sub in enumerate(search.sub_reqs):
        sub.dsl = restricted(sub.dsl, condition, f"{where}sub_reqs[{i}].dsl")
        sub.dsl_type = _BOOL_EXPR_V1


def _may_overfetch(request: Any, called: str | None) -> bool:
    """False when something beside the limit depends on how many results come back."""
    if called == QUERY:
        # Aggregates (count(*), sum(x) ...) are one row over every match.
        return not any("(" in name for name in request.output_fields)
    if len(request.function_score.functions) or len(request.function_chains):
        return False
    if called == SEARCH:
        return not (len(request.sub_reqs) or request.HasField("search_aggregation"))
    return True


def _overfetch(params: Any, spec: _Method, factor: Decimal, cap: int) -> int | None:
    """Raise the limit in the key-value list ``params`` in place; the app's limit, or
    None when it is left alone."""
    found = [pair for pair in params if pair.key == spec.limit_key]
    if len(found) != 1 or _pages(params, spec.no_overfetch):
        return None
    if len({pair.key for pair in params}) != len(params):
        return None  # a key given twice: Milvus reads the first, a reader may not
    text = found[0].value
    if not _DECIMAL.fullmatch(text):
        return None
    asked = int(text)
    raised = min(cap, math.ceil(factor * asked))
    if raised <= asked:
        return None
    found[0].value = str(raised)
    return asked


def _pages(params: Iterable[Any], keys: frozenset[str]) -> bool:
    """True for an iterator's request, or when a key of ``keys`` is present with a
    value other than false or zero."""
    return any(
        pair.key in _ITERATOR_KEYS or (pair.key in keys and pair.value.strip() not in _FALSE)
        for pair in params
    )
