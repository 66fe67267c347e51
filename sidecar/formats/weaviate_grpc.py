"""Weaviate's gRPC API (``weaviate.v1.Weaviate``): the format, its routes and its options.

The v4 client runs every ``collection.query.*`` and ``generate.*`` call as
``/weaviate.v1.Weaviate/Search``; its reply is one ``SearchReply``, read with
the gate's own copy of Weaviate's messages (``proto/vendor/weaviate``). The
work is split by concern:

- ``weaviate_grpc_hits``: which objects of a reply are hits (results, group
  objects and the objects their references return), their positions, chunk
  ids and texts;
- ``weaviate_grpc_reply``: the reply rebuilt for a selection (what of
  objects, groups, generated text and the iteration cursor may go out);
- ``weaviate_grpc_values``: property values (read, hashed, projected,
  substituted);
- ``weaviate_grpc_request``: Search requests (tenant push-down, over-fetch,
  the collections named).

This module classifies every method of the service and checks the options,
which mean what they mean for the GraphQL adapter (``weaviate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sidecar.core.hits import Route, RouteKind
from sidecar.formats import grpc_messages
from sidecar.formats.base import MalformedBody, id_field_option, text_field_option
from sidecar.formats.grpc_adapter import decode_unary, grpc_method
from sidecar.formats.hits import ReleasedFields
from sidecar.formats.weaviate import GENERATIVE_MODES
from sidecar.formats.weaviate_grpc_hits import Options, Reader, ResultGroup
from sidecar.formats.weaviate_grpc_reply import WeaviateGrpcBody
from sidecar.formats.weaviate_grpc_request import SERVICE, WeaviateGrpcRequests, is_search

SEARCH_REPLY: Final = "weaviate.v1.SearchReply"

# Every method of weaviate.v1.Weaviate. Aggregate computes over objects the
# gate never checks; TenantsGet lists who else uses a multi-tenant collection
# (as the REST adapter classifies GET /v1/schema/{c}/tenants). BatchSend and
# BatchStream are the batch writes of servers after 1.32.
_KINDS: Final[Mapping[str, RouteKind]] = {
    "Search": RouteKind.FILTERED,
    "Aggregate": RouteKind.CONTENT,
    "TenantsGet": RouteKind.CONTENT,
    "BatchObjects": RouteKind.WRITE,
    "BatchDelete": RouteKind.WRITE,
    "BatchSend": RouteKind.WRITE,
    "BatchStream": RouteKind.WRITE,
}
# Weaviate's gRPC server also serves the standard health service, which the v4
# client probes when it connects (unless told to skip its checks): a status only.
HEALTH_SERVICE: Final = "grpc.health.v1.Health"
_HEALTH: Final = frozenset({"Check", "Watch"})


class WeaviateGrpcFormat(WeaviateGrpcRequests):
    """Adapter for Weaviate's gRPC ``Search`` replies; rewrites their requests.

    Options as the GraphQL adapter's (``weaviate``): ``text_field`` (the text
    property), ``id_field`` (a property holding the chunk id; None for the
    object UUID), ``generative`` ("strip" or "block") and ``hashed_fields`` /
    ``releasable_fields`` (properties, dotted paths into object properties,
    released beside the text and id).
    """

    name = "weaviate_grpc"

    def __init__(
        self,
        *,
        text_field: str = "text",
        id_field: str | None = None,
        generative: str = "strip",
        hashed_fields: list[str] | None = None,
        releasable_fields: list[str] | None = None,
    ) -> None:
        text = text_field_option(text_field)
        id_property = id_field_option(id_field, text)
        if generative not in GENERATIVE_MODES:
            raise ValueError(f"generative must be one of {', '.join(GENERATIVE_MODES)}")
        fields = ReleasedFields.from_options(hashed_fields, releasable_fields)
        own = ((text,), *([(id_property,)] if id_property else []))
        self.text_field = text
        self.id_field = id_property
        self.generative = generative
        self._options = Options(
            text,
            id_property,
            fields.hashed,
            tuple(dict.fromkeys([*own, *fields.hashed, *fields.releasable])),
            own,
            generative == "block",
        )

    def route_kind(self, route: Route) -> RouteKind | None:
        """What a method of ``weaviate.v1.Weaviate`` does; None for other paths.

        FILTERED: Search. CONTENT: Aggregate, TenantsGet. WRITE: the batch
        methods. READ: the standard gRPC health service's Check and Watch. A
        method the service does not have is None (unknown).
        """
        method = grpc_method(route, SERVICE)
        if method is not None:
            return _KINDS.get(method)
        return RouteKind.READ if grpc_method(route, HEALTH_SERVICE) in _HEALTH else None

    def route_collections(self, route: Route) -> list[str]:
        """Empty: a gRPC path names no collection (``rewrite_request`` reads the body's)."""
        return []

    def parse(self, body: bytes, route: Route) -> WeaviateGrpcBody:
        """Parse a ``SearchReply`` body; raises MalformedBody if it is not one.

        Raises ValueError for a route this format does not filter.
        """
        if not is_search(route):
            raise ValueError(f"route is not handled by the {self.name} format")
        reply = decode_unary(body, SEARCH_REPLY)
        try:
            reader = Reader(self._options)
            results = [reader.result(result) for result in reply.results]
            groups = [
                ResultGroup(group, [reader.result(obj) for obj in group.objects])
                for group in reply.group_by_results
            ]
        except MalformedBody:
            raise
        except Exception:
            # Only a bug of the adapter gets here; the message names no value.
            raise MalformedBody("body could not be read as a Weaviate SearchReply") from None
        return WeaviateGrpcBody(
            body,
            reply,
            tuple(reader.candidates),
            results,
            groups,
            self._options,
            grpc_messages.has_unknown_fields(reply),
        )
