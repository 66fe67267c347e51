"""Qdrant gRPC requests: the collections they name, tenant push-down and over-fetch.

The rules are the REST rewriter's (``rest_request``), on Qdrant's request
messages instead of JSON:

- Push-down ANDs ``FieldCondition{key: tenant_key, match: {keyword: tenant}}``
  with the app's filter, as ``Filter{must: [condition, Condition{filter:
  app_filter}]}``: the app's filter is nested whole and keeps its meaning. It
  goes into every sub-request of a batch and every prefetch of a query, at
  every depth. The tenant is a protobuf string: no value can break out of it.
- With push-down, a request that uses a point id as an example (recommend
  ``positive``/``negative``, discover ``target``/``context``, a query that is
  an id or recommends, discovers, searches or asks feedback near one, at any
  prefetch depth) is refused: Qdrant looks the point up by id whatever the
  filter says.
- Also with push-down, a request holding a field the gate's copy of Qdrant's
  messages does not declare, where a query, an example or a collection sits
  (the request, its sub-requests, prefetches, queries, example vectors and
  lookups), is refused: a newer Qdrant's field there could be an id lookup,
  and fields the gate does not know are re-encoded after the ones it knows,
  which may change which member of a oneof the server reads.
- Over-fetch raises ``limit`` (the number of groups, for the groups methods)
  where there is no non-zero ``offset``; Query and QueryGroups default it to
  10 (Qdrant's ``DEFAULT_LIMIT``, which its gRPC conversion uses for both).
  Scroll and Get are never over-fetched, prefetch limits never raised.

Every method of the service names a collection in its request's
``collection_name``, which the gRPC path does not: the gate reads it (and
``lookup_from``/``with_lookup`` collections, and a batch entry's own name)
into ``RequestRewrite.collections`` for every method, rewriting only searches.
So it does for the methods of the Collections and Snapshots services whose
request has a ``collection_name``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from google.protobuf.unknown_fields import UnknownFieldSet

from sidecar.core.hits import Route
from sidecar.formats import grpc_messages
from sidecar.formats.base import (
    MalformedRequest,
    RequestCapabilities,
    RequestRewrite,
    UnfilterableRequest,
    unchanged_request,
)
from sidecar.formats.grpc_adapter import decode_request, encode_unary, grpc_method

SERVICE: Final = "qdrant.Points"
# Qdrant's other services: collections (info, aliases, cluster setup, shard
# keys) and snapshots. Their requests are read for the collection they name.
COLLECTIONS: Final = "qdrant.Collections"
SNAPSHOTS: Final = "qdrant.Snapshots"

Message = Any  # a message class built at run time from the gate's descriptors


@dataclass(frozen=True, slots=True)
class _Method:
    """How the request of one method is read and rewritten."""

    request: str  # the request's full message name
    # The field of a batch's sub-requests; None: the request is the only one.
    batch: str | None = None
    # Searches have a filter for push-down; other methods' requests are only read.
    search: bool = False
    # The field that holds the number of results (groups); None: never over-fetched.
    limit: str | None = None
    # Qdrant's limit when an optional limit field is absent.
    default_limit: int | None = None
    limit_max: int = 2**64 - 1  # the limit field's largest value


_U32: Final = 2**32 - 1


def _search(
    request: str,
    batch: str | None = None,
    default_limit: int | None = None,
    limit_max: int = 2**64 - 1,
) -> _Method:
    return _Method(request, batch, True, "limit", default_limit, limit_max)


_METHODS: Final[Mapping[str, _Method]] = {
    "Get": _Method("qdrant.GetPoints"),
    "Scroll": _Method("qdrant.ScrollPoints", search=True),
    "Search": _search("qdrant.SearchPoints"),
    "SearchBatch": _search("qdrant.SearchBatchPoints", "search_points"),
    "SearchGroups": _search("qdrant.SearchPointGroups", limit_max=_U32),
    "Recommend": _search("qdrant.RecommendPoints"),
    "RecommendBatch": _search("qdrant.RecommendBatchPoints", "recommend_points"),
    "RecommendGroups": _search("qdrant.RecommendPointGroups", limit_max=_U32),
    "Discover": _search("qdrant.DiscoverPoints"),
    "DiscoverBatch": _search("qdrant.DiscoverBatchPoints", "discover_points"),
    "Query": _search("qdrant.QueryPoints", default_limit=10),
    "QueryBatch": _search("qdrant.QueryBatchPoints", "query_points", default_limit=10),
    "QueryGroups": _search("qdrant.QueryPointGroups", default_limit=10),
    # Read for the collection they name only.
    "Count": _Method("qdrant.CountPoints"),
    "Facet": _Method("qdrant.FacetCounts"),
    "SearchMatrixPairs": _Method("qdrant.SearchMatrixPoints"),
    "SearchMatrixOffsets": _Method("qdrant.SearchMatrixPoints"),
    "Upsert": _Method("qdrant.UpsertPoints"),
    "Delete": _Method("qdrant.DeletePoints"),
    "UpdateVectors": _Method("qdrant.UpdatePointVectors"),
    "DeleteVectors": _Method("qdrant.DeletePointVectors"),
    "SetPayload": _Method("qdrant.SetPayloadPoints"),
    "OverwritePayload": _Method("qdrant.SetPayloadPoints"),
    "DeletePayload": _Method("qdrant.DeletePayloadPoints"),
    "ClearPayload": _Method("qdrant.ClearPayloadPoints"),
    "CreateFieldIndex": _Method("qdrant.CreateFieldIndexCollection"),
    "DeleteFieldIndex": _Method("qdrant.DeleteFieldIndexCollection"),
    "CreateVectorName": _Method("qdrant.CreateVectorNameRequest"),
    "DeleteVectorName": _Method("qdrant.DeleteVectorNameRequest"),
    "UpdateBatch": _Method("qdrant.UpdateBatchPoints"),
}
# The methods of the other services whose request names one collection
# (``collection_name``); the others name none, or name theirs where the gate's
# copy does not look (``grpc.QdrantGrpcFormat.route_collections``).
_SERVICES: Final[Mapping[str, Mapping[str, _Method]]] = {
    SERVICE: _METHODS,
    COLLECTIONS: {
        "Get": _Method("qdrant.GetCollectionInfoRequest"),
        "Create": _Method("qdrant.CreateCollection"),
        "Update": _Method("qdrant.UpdateCollection"),
        "Delete": _Method("qdrant.DeleteCollection"),
        "ListCollectionAliases": _Method("qdrant.ListCollectionAliasesRequest"),
        "CollectionClusterInfo": _Method("qdrant.CollectionClusterInfoRequest"),
        "CollectionExists": _Method("qdrant.CollectionExistsRequest"),
        "UpdateCollectionClusterSetup": _Method("qdrant.UpdateCollectionClusterSetupRequest"),
        "CreateShardKey": _Method("qdrant.CreateShardKeyRequest"),
        "DeleteShardKey": _Method("qdrant.DeleteShardKeyRequest"),
        "ListShardKeys": _Method("qdrant.ListShardKeysRequest"),
    },
    SNAPSHOTS: {
        "Create": _Method("qdrant.CreateSnapshotRequest"),
        "List": _Method("qdrant.ListSnapshotsRequest"),
        "Delete": _Method("qdrant.DeleteSnapshotRequest"),
    },
}

# The messages of a search request in which a query, an example, a point id
# looked up or another collection can sit. The gate's copies declare every
# field of these; the walk below goes through them and nowhere else (filters
# are nested whole, the stubs are never looked into).
_WALKED: Final = frozenset(
    {
        "qdrant.SearchPoints",
        "qdrant.SearchBatchPoints",
        "qdrant.SearchPointGroups",
        "qdrant.ScrollPoints",
        "qdrant.RecommendPoints",
        "qdrant.RecommendBatchPoints",
        "qdrant.RecommendPointGroups",
        "qdrant.DiscoverPoints",
        "qdrant.DiscoverBatchPoints",
        "qdrant.QueryPoints",
        "qdrant.QueryBatchPoints",
        "qdrant.QueryPointGroups",
        "qdrant.PrefetchQuery",
        "qdrant.Query",
        "qdrant.VectorInput",
        "qdrant.RecommendInput",
        "qdrant.DiscoverInput",
        "qdrant.ContextInput",
        "qdrant.ContextInputPair",
        "qdrant.NearestInputWithMmr",
        "qdrant.RelevanceFeedbackInput",
        "qdrant.FeedbackItem",
        "qdrant.TargetVector",
        "qdrant.VectorExample",
        "qdrant.ContextExamplePair",
        "qdrant.LookupLocation",
        "qdrant.WithLookup",
    }
)
# Point ids in walked messages that are not looked up: scroll's start position.
_NOT_EXAMPLES: Final = frozenset({("qdrant.ScrollPoints", "offset")})
_POINT_ID: Final = "qdrant.PointId"


class QdrantGrpcRequests(RequestCapabilities):
    """Reads every request that names a collection for its collections, and rewrites searches."""

    def rewrites_request(self, route: Route) -> bool:
        """True for every method of the Points service, and those of the Collections
        and Snapshots services that name one collection: the request message
        names the collection, which the path does not."""
        return _method(route) is not None

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

        See ``ResponseFormat.rewrite_request``. ``collections`` are the
        collections the request names, for every method. The body comes back
        as it was when nothing changes. Raises ValueError if
        ``overfetch_factor`` is not finite (a configuration error).
        """
        method = _method(route)
        if method is None:
            return unchanged_request(body)
        if not math.isfinite(overfetch_factor):
            raise ValueError("overfetch_factor is not a finite number")
        request = decode_request(body, method.request)
        requests = _sub_requests(request, method)
        collections = _collections(request, requests)
        # Only searches have a filter; the other methods are read for their collections.
        push_down_key = tenant_key if method.search else None
        push_down = push_down_key is not None
        overfetch = overfetch_factor > 1 and method.limit is not None
        if not push_down and not overfetch:
            return unchanged_request(body, collections)
        if push_down_key is not None:
            _check(request)
            condition = _tenant_condition(push_down_key, tenant)
            for holder in [*requests, *_prefetches(request)]:
                _add_condition(holder, condition)
        factor = Decimal(repr(overfetch_factor))
        limits = [
            _overfetch(sub, method, factor, overfetch_cap) if overfetch else None
            for sub in requests
        ]
        overfetched = any(limit is not None for limit in limits)
        if not push_down and not overfetched:
            return unchanged_request(body, collections)
        return RequestRewrite(
            encode_unary(request),
            tuple(limits) if overfetched else (),
            tenant_filter=push_down,
            overfetched=overfetched,
            collections=collections,
        )

    def request_collections(self, body: bytes, route: Route) -> tuple[str, ...]:
        """The collections a request names, as ``rewrite_request`` gives them; raises
        MalformedRequest for a body that is not its request."""
        method = _method(route)
        if method is None:
            return ()
        request = decode_request(body, method.request)
        return _collections(request, _sub_requests(request, method))


def _method(route: Route) -> _Method | None:
    for service, methods in _SERVICES.items():
        name = grpc_method(route, service)
        if name is not None:
            return methods.get(name)
    return None


def _sub_requests(request: Message, method: _Method) -> list[Message]:
    """The requests of ``request``, in the order their results come back."""
    return [request] if method.batch is None else list(getattr(request, method.batch))


def _collections(request: Message, requests: list[Message]) -> tuple[str, ...]:
    """The collections ``request`` names: its own, a batch entry's, lookups'."""
    if not request.collection_name:
        raise MalformedRequest("the request names no collection")
    names = [request.collection_name]
    names.extend(sub.collection_name for sub in requests if sub.collection_name)
    for message in _walk(request):
        full_name = message.DESCRIPTOR.full_name
        if full_name == "qdrant.LookupLocation":
            names.append(_named(message.collection_name, "lookup_from"))
        elif full_name == "qdrant.WithLookup":
            names.append(_named(message.collection, "with_lookup"))
    return tuple(dict.fromkeys(names))


def _named(name: str, field: str) -> str:
    if not name:
        raise MalformedRequest(f"{field!r} names no collection")
    return name


def _walk(request: Message) -> Iterator[Message]:
    """``request`` and every walked message (``_WALKED``) set inside it, at any depth.

    A stack rather than recursion: the depth is the client's.
    """
    pending = [request]
    while pending:
        message = pending.pop()
        yield message
        for field, value in message.ListFields():
            if field.message_type is None or field.message_type.full_name not in _WALKED:
                continue
            if field.is_repeated:
                pending.extend(value)
            else:
                pending.append(value)


def _check(request: Message) -> None:
    """Raise UnfilterableRequest where the tenant condition cannot confine ``request``:
    a point id as an example, or a field the gate does not know where one could be."""
    for message in _walk(request):
        if len(UnknownFieldSet(message)):
            raise UnfilterableRequest(
                f"a {message.DESCRIPTOR.name} field the gate does not know may reach past "
                "the tenant filter"
            )
        owner = message.DESCRIPTOR.full_name
        for field, _ in message.ListFields():
            if (
                field.message_type is not None
                and field.message_type.full_name == _POINT_ID
                and (owner, field.name) not in _NOT_EXAMPLES
            ):
                raise UnfilterableRequest(
                    "a point id as a query example is looked up past the tenant filter; "
                    "send its vector instead"
                )


def _prefetches(request: Message) -> Iterator[Message]:
    """Every prefetch below ``request`` (and its sub-requests), at any depth."""
    return (
        message
        for message in _walk(request)
        if message.DESCRIPTOR.full_name == "qdrant.PrefetchQuery"
    )


def _tenant_condition(tenant_key: str, tenant: str) -> Message:
    """``tenant_key`` matches ``tenant``, as a condition.

    Raises ValueError for a ``tenant_key`` protobuf cannot carry (a
    configuration error) and MalformedRequest for such a tenant: protobuf
    strings are valid Unicode.
    """
    condition = grpc_messages.message_class("qdrant.Condition")()
    condition.field.key = tenant_key
    try:
        condition.field.match.keyword = tenant
    except ValueError:
        # UnicodeEncodeError, which quotes the value: not chained.
        pass
    else:
        return condition
    raise MalformedRequest("the tenant cannot be written as a protobuf string")


def _add_condition(holder: Message, condition: Message) -> None:
    """AND ``condition`` with ``holder``'s filter (in place)."""
    confined = grpc_messages.message_class("qdrant.Filter")()
    confined.must.add().CopyFrom(condition)
    if holder.HasField("filter"):
        confined.must.add().filter.CopyFrom(holder.filter)
    holder.filter.CopyFrom(confined)


def _overfetch(request: Message, method: _Method, factor: Decimal, cap: int) -> int | None:
    """Raise the limit of ``request`` in place; the app's limit, or None if unchanged.

    Like ``rewriter.SearchRewriter``: the factor as configured, rounded up,
    capped, never below what the app asked for; no over-fetch past an offset.
    """
    field = method.limit
    if field is None:
        return None
    fields = request.DESCRIPTOR.fields_by_name
    if "offset" in fields and request.offset != 0:
        # Over-fetching past an offset would make pages overlap.
        return None
    if fields[field].has_presence and not request.HasField(field):
        if method.default_limit is None:
            return None
        asked = method.default_limit
    else:
        asked = getattr(request, field)
    raised = min(cap, method.limit_max, math.ceil(factor * asked))
    if raised <= asked:
        return None
    setattr(request, field, raised)
    return int(asked)
