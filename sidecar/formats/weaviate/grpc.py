"""Weaviate's gRPC API (``weaviate.v1.Weaviate``): the format, its routes and its options.

The v4 client runs every ``collection.query.*`` and ``generate.*`` call as
``/weaviate.v1.Weaviate/Search``; its reply is one ``SearchReply``, read with
the gate's own copy of Weaviate's messages (``proto/vendor/weaviate``). The
work is split by concern:

- ``grpc_hits``: which objects of a reply are hits (results, group
  objects and the objects their references return), their positions, chunk
  ids and texts;
- ``grpc_reply``: the reply rebuilt for a selection (what of
  objects, groups, generated text and the iteration cursor may go out);
- ``grpc_values``: property values (read, hashed, projected,
  substituted);
- ``grpc_request``: Search requests (tenant push-down, over-fetch,
  the collections named).

This module classifies every method of the service and checks the options,
which mean what they mean for the GraphQL adapter (``weaviate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sidecar.core.hits import Route, RouteKind
from sidecar.formats import grpc_messages
from sidecar.formats.grpc_adapter import GrpcAdapter, grpc_method
from sidecar.formats.options import DEFAULT_OPTIONS, AdapterOptions
from sidecar.formats.weaviate import errors as weaviate_errors
from sidecar.formats.weaviate.grpc_hits import Options, Reader, ResultGroup
from sidecar.formats.weaviate.grpc_reply import WeaviateGrpcBody
from sidecar.formats.weaviate.grpc_request import SERVICE, WeaviateGrpcRequests
from sidecar.formats.weaviate.rest import generative_option, own_properties, released_properties

SEARCH_REPLY: Final = "weaviate.v1.SearchReply"
_REPLIES: Final[Mapping[str, str]] = {"Search": SEARCH_REPLY}

# Every method of weaviate.v1.Weaviate, classified as the REST adapter
# classifies the same operations. Aggregate computes over objects the gate
# never checks (POST /v1/aggregate/{c}); TenantsGet lists who else uses a
# multi-tenant collection (GET /v1/schema/{c}/tenants). BatchSend and
# BatchStream are the batch writes of servers after 1.32, BatchReferences
# POST /v1/batch/references.
_KINDS: Final[Mapping[str, RouteKind]] = {
    "Search": RouteKind.FILTERED,
    "Aggregate": RouteKind.CONTENT,
    "TenantsGet": RouteKind.CONTENT,
    "BatchObjects": RouteKind.WRITE,
    "BatchDelete": RouteKind.WRITE,
    "BatchReferences": RouteKind.WRITE,
    "BatchSend": RouteKind.WRITE,
    "BatchStream": RouteKind.WRITE,
}
# Weaviate's gRPC server also serves the standard health service, which the v4
# client probes when it connects (unless told to skip its checks): a status only.
HEALTH_SERVICE: Final = "grpc.health.v1.Health"
_HEALTH: Final = frozenset({"Check", "Watch"})


class WeaviateGrpcFormat(GrpcAdapter, WeaviateGrpcRequests):
    """Adapter for Weaviate's gRPC ``Search`` replies; rewrites their requests.

    Options as the GraphQL adapter's (``weaviate``): ``text_field`` (the text
    property), ``id_field`` (a property holding the chunk id; None for the
    object UUID), ``generative`` ("strip" or "block") and ``hashed_fields`` /
    ``releasable_fields`` (properties, dotted paths into object properties,
    released beside the text and id).
    """

    name = "weaviate_grpc"
    service = SERVICE
    kinds = _KINDS
    replies = _REPLIES

    def __init__(
        self, options: AdapterOptions = DEFAULT_OPTIONS, *, generative: str = "strip"
    ) -> None:
        """The options of the GraphQL ``WeaviateFormat``, with the same meaning; the id
        property must not be the text property."""
        self.text_field = options.text_field
        self.id_field = options.distinct_id_field()
        self.generative = generative_option(generative)
        self._options = Options(
            self.text_field,
            self.id_field,
            options.fields.hashed,
            released_properties(options),
            own_properties(options),
            self.generative == "block",
        )

    def route_kind(self, route: Route) -> RouteKind | None:
        """What a method of ``weaviate.v1.Weaviate`` does; None for other paths.

        FILTERED: Search. CONTENT: Aggregate, TenantsGet, and a method the gate
        does not know (a newer server's may return stored objects). WRITE: the
        batch methods. READ: the standard gRPC health service's Check and Watch.
        """
        kind = super().route_kind(route)
        if kind is not None:
            return kind
        return RouteKind.READ if grpc_method(route, HEALTH_SERVICE) in _HEALTH else None

    def missing_field(self, error_text: str) -> str | None:
        """The property a Weaviate error (a failed call's status message) names as
        missing from the class (``errors``)."""
        return weaviate_errors.missing_field(error_text)

    def _read(self, document: tuple[bytes, Any], shape: str) -> WeaviateGrpcBody:
        body, reply = document
        reader = Reader(self._options)
        results = [reader.result(result) for result in reply.results]
        groups = [
            ResultGroup(group, [reader.result(obj) for obj in group.objects])
            for group in reply.group_by_results
        ]
        return WeaviateGrpcBody(
            body,
            reply,
            tuple(reader.candidates),
            results,
            groups,
            self._options,
            grpc_messages.has_unknown_fields(reply),
        )
