"""Pinecone gRPC data-plane requests: tenant push-down, over-fetch and namespaces.

The gRPC API (``VectorService``, no proto package) carries the same query as
the REST API's ``POST /query``, so a ``QueryRequest`` is confined exactly as
REST confines one (``rest_request``): its query part (``id``, ``filter``,
``top_k``, ``namespace`` and the deprecated ``queries`` entries' ``filter``
and ``namespace``) is projected to the REST API's JSON shape, goes through the
REST rewriter, and what that rewriter changed is written back into the
message. So push-down ANDs ``{tenant_key: {"$eq": tenant}}`` with the app's
metadata filter as ``{"$and": [condition, app_filter]}`` in ``filter`` and in
every ``queries`` entry, a query by stored vector ``id`` is refused under
push-down, over-fetch raises ``top_k`` (never for the multi-query), and the
namespaces the request names (``""``: ``__default__``) go to the request
policy. A filter is a ``google.protobuf.Struct``; under push-down one holding
a number that is not finite, or a ``Value`` with no kind, has no JSON form to
nest and is refused as unreadable. Without push-down filters are left alone.

A ``QueryRequest`` with fields the gate's copy of the proto does not declare
is refused under push-down: a newer client's field could query by something
the tenant filter does not cover (as ``id`` does).

``FetchRequest`` is read for its namespace only: it names vectors by id and
has no filter; the response check removes other tenants' vectors. The body
goes on unchanged.
"""

from __future__ import annotations

import math
from typing import Any, Final

import orjson

from sidecar.core.hits import Route
from sidecar.formats import grpc_adapter, grpc_messages
from sidecar.formats.base import (
    MalformedRequest,
    RequestCapabilities,
    RequestRewrite,
    UnfilterableRequest,
    unchanged_request,
)
from sidecar.formats.pinecone.rest_request import DEFAULT_NAMESPACE, PineconeRequests

SERVICE: Final = "VectorService"
QUERY: Final = "Query"
FETCH: Final = "Fetch"
# The REST twin's route for the query a QueryRequest carries.
_REST_QUERY: Final = Route("POST", "/query")
_REST: Final = PineconeRequests()


def method(route: Route) -> str | None:
    """The ``VectorService`` method ``route`` calls (``"Query"``), or None."""
    return grpc_adapter.grpc_method(route, SERVICE)


def python_value(value: Any, *, finite: bool = False) -> Any:
    """A ``google.protobuf.Value`` as the JSON value it stands for.

    Integral numbers below 2**53 become ints, as the REST API's JSON writes
    them (``2019``, not ``2019.0``), so fields hash the same over both APIs.
    Raises ValueError for a Value with no kind, and with ``finite`` for a
    number that is NaN or infinite (JSON has no such number).
    """
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        number = value.number_value
        if not math.isfinite(number):
            if finite:
                raise ValueError("a number is not finite")
            return number
        return int(number) if number.is_integer() and abs(number) < 2**53 else number
    if kind == "bool_value":
        return value.bool_value
    if kind == "null_value":
        return None
    if kind == "struct_value":
        return python_struct(value.struct_value, finite=finite)
    if kind == "list_value":
        return [python_value(item, finite=finite) for item in value.list_value.values]
    raise ValueError("a Value has no kind")


def python_struct(struct: Any, *, finite: bool = False) -> dict[str, Any]:
    """A ``google.protobuf.Struct`` as a JSON object (see ``python_value``)."""
    return {key: python_value(item, finite=finite) for key, item in struct.fields.items()}


class PineconeGrpcRequests(RequestCapabilities):
    """Rewrites ``Query`` requests and reads ``Fetch`` requests of ``VectorService``."""

    def rewrites_request(self, route: Route) -> bool:
        """True for ``Query`` (push-down, over-fetch) and ``Fetch`` (its namespace)."""
        return method(route) in (QUERY, FETCH)

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
        """Restrict a ``Query`` to ``tenant`` and raise its ``top_k``; see the module
        docstring. Other methods' bodies come back unchanged."""
        called = method(route)
        if called == FETCH:
            return unchanged_request(body, _fetch_namespace(body))
        if called != QUERY:
            return unchanged_request(body)
        request = grpc_adapter.decode_request(body, "QueryRequest")
        if tenant_key is not None and grpc_messages.has_unknown_fields(request):
            raise UnfilterableRequest(
                "the query has fields the gate does not know; it cannot be confined to the tenant"
            )
        rest = _REST.rewrite_request(
            orjson.dumps(_rest_query(request, filters=tenant_key is not None)),
            _REST_QUERY,
            tenant=tenant,
            tenant_key=tenant_key,
            overfetch_factor=overfetch_factor,
            overfetch_cap=overfetch_cap,
        )
        if not rest.tenant_filter and not rest.overfetched:
            return unchanged_request(body, rest.collections)
        _write_back(request, orjson.loads(rest.body))
        return RequestRewrite(
            grpc_adapter.encode_unary(request),
            rest.limits,
            tenant_filter=rest.tenant_filter,
            overfetched=rest.overfetched,
            collections=rest.collections,
        )

    def request_collections(self, body: bytes, route: Route) -> tuple[str, ...]:
        """The namespaces a ``Query`` or ``Fetch`` reads, as ``rewrite_request`` gives
        them (a query's read by the REST rewriter); raises MalformedRequest for a
        body that is not its request."""
        called = method(route)
        if called == FETCH:
            return _fetch_namespace(body)
        if called != QUERY:
            return ()
        request = grpc_adapter.decode_request(body, "QueryRequest")
        rest = orjson.dumps(_rest_query(request, filters=False))
        return _REST.request_collections(rest, _REST_QUERY)


def _fetch_namespace(body: bytes) -> tuple[str, ...]:
    fetch = grpc_adapter.decode_request(body, "FetchRequest")
    return (fetch.namespace or DEFAULT_NAMESPACE,)


def _filter(message: Any, where: str) -> dict[str, Any]:
    try:
        return python_struct(message.filter, finite=True)
    except ValueError as exc:
        raise MalformedRequest(f"{where!r}: {exc}") from None


def _rest_query(request: Any, *, filters: bool) -> dict[str, Any]:
    """The query part of ``request`` as the REST API writes it (proto3 defaults absent).

    Filters only with ``filters`` (under push-down): without it they are
    neither read nor rewritten.
    """
    query: dict[str, Any] = {"topK": request.top_k, "namespace": request.namespace}
    if request.id:
        query["id"] = request.id
    if filters and request.HasField("filter"):
        query["filter"] = _filter(request, "filter")
    entries = []
    for i, entry in enumerate(request.queries):
        rest_entry: dict[str, Any] = {"namespace": entry.namespace}
        if filters and entry.HasField("filter"):
            rest_entry["filter"] = _filter(entry, f"queries[{i}].filter")
        entries.append(rest_entry)
    if entries:
        query["queries"] = entries
    return query


def _write_back(request: Any, rest: dict[str, Any]) -> None:
    """Put what the REST rewriter set (filters, ``topK``) into ``request``."""
    request.top_k = rest["topK"]
    if "filter" in rest:
        _set_filter(request, rest["filter"])
    for entry, rest_entry in zip(request.queries, rest.get("queries", ()), strict=True):
        if "filter" in rest_entry:
            _set_filter(entry, rest_entry["filter"])


def _set_filter(message: Any, value: dict[str, Any]) -> None:
    message.ClearField("filter")
    message.filter.SetInParent()
    message.filter.update(value)
