"""Qdrant's gRPC API (the ``qdrant.Points`` service): replies filtered, searches rewritten.

The twin of ``qdrant`` (REST) for ``qdrant-client`` with ``prefer_grpc=True``
and Qdrant's other gRPC clients. A call is ``POST /qdrant.Points/{Method}``
with one framed message each way; the messages are the gate's own trimmed
copies of Qdrant's (``proto/vendor/qdrant``), loaded by ``grpc_messages``.

Every method of the service is classified: ``Get``, ``Scroll``, ``Query*``,
``Search*``, ``Recommend*`` and ``Discover*`` are FILTERED; ``Count``,
``Facet`` and the distance matrix (``SearchMatrixPairs``/``Offsets``) are
CONTENT (counts, payload values and point ids across every tenant's points);
the rest write. The ``qdrant.Collections`` and ``qdrant.Snapshots`` services
are classified as the REST twin classifies the same operations (collection
info, listings and cluster info CONTENT, the existence check READ, changes
WRITE, snapshots CONTENT); their replies are never read. A method a newer
Qdrant adds to these services is CONTENT.

A hit is a ``ScoredPoint`` or ``RetrievedPoint``. The gate reads it as the
REST adapter reads a JSON point: the chunk id is the point id (a number in
decimal, a UUID in canonical lowercase form) or the payload field
``id_field``; the text is the payload field ``text_field``; payload values
are Qdrant's JSON-with-integers ``Value`` as the JSON they stand for, so the
same ``hashed_fields`` and ``releasable_fields`` hold over both APIs.

Replies are rebuilt from an allowlist, like the REST adapter's bodies:

- per point: ``id``, ``score``, ``version``, ``vectors``, ``shard_key``,
  ``order_value`` (fields a newer server adds are dropped), and of the payload
  only the text, the id field and the declared fields;
- per reply: the hits (per sub-result of a batch; groups with their id, hits
  and lookup, a group without kept hits removed) and ``time``. ``usage``
  goes: it measures work over every tenant's points. A group's id goes out
  only when the caller gets it anyway, as over REST (``check_group_id``):
  otherwise the reply is unreleasable.
- scroll's ``next_page_offset`` is the id right after the last released
  point, or absent when nothing was released (see ``qdrant``).

Unknown fields are dropped wherever they are (``grpc_messages.released``). A
reply of which nothing is removed, replaced or unknown is sent as it came.

Search requests are rewritten by ``grpc_request``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sidecar.core.hits import Route, RouteKind
from sidecar.formats import grpc_messages
from sidecar.formats.base import MalformedBody
from sidecar.formats.body import Selection
from sidecar.formats.grpc_adapter import GrpcReply, TwinGrpcAdapter, grpc_method
from sidecar.formats.hits import HitLayout, Hits
from sidecar.formats.options import AdapterOptions
from sidecar.formats.qdrant.grpc_request import (
    COLLECTIONS,
    SERVICE,
    SNAPSHOTS,
    QdrantGrpcRequests,
)
from sidecar.formats.qdrant.rest import QdrantFormat, check_group_id, next_offset_after

Message = Any  # a message class built at run time from the gate's descriptors


@dataclass(frozen=True, slots=True)
class _Reply:
    """The reply of one filtered method, and where its hits sit."""

    message: str  # the reply's full message name
    layout: str  # "points", "batch", "groups" or "scroll"


_METHODS: Final[Mapping[str, _Reply]] = {
    "Get": _Reply("qdrant.GetResponse", "points"),
    "Scroll": _Reply("qdrant.ScrollResponse", "scroll"),
    "Search": _Reply("qdrant.SearchResponse", "points"),
    "SearchBatch": _Reply("qdrant.SearchBatchResponse", "batch"),
    "SearchGroups": _Reply("qdrant.SearchGroupsResponse", "groups"),
    "Recommend": _Reply("qdrant.RecommendResponse", "points"),
    "RecommendBatch": _Reply("qdrant.RecommendBatchResponse", "batch"),
    "RecommendGroups": _Reply("qdrant.RecommendGroupsResponse", "groups"),
    "Discover": _Reply("qdrant.DiscoverResponse", "points"),
    "DiscoverBatch": _Reply("qdrant.DiscoverBatchResponse", "batch"),
    "Query": _Reply("qdrant.QueryResponse", "points"),
    "QueryBatch": _Reply("qdrant.QueryBatchResponse", "batch"),
    "QueryGroups": _Reply("qdrant.QueryGroupsResponse", "groups"),
}
# Reads the gate cannot filter: counts that answer "how many points match"
# (any filter, any tenant), payload values with their counts, and ids with
# their distances for sampled points of every tenant.
_CONTENT: Final = frozenset({"Count", "Facet", "SearchMatrixPairs", "SearchMatrixOffsets"})
_WRITES: Final = frozenset(
    {
        "Upsert",
        "Delete",
        "UpdateVectors",
        "DeleteVectors",
        "SetPayload",
        "OverwritePayload",
        "DeletePayload",
        "ClearPayload",
        "CreateFieldIndex",
        "DeleteFieldIndex",
        "CreateVectorName",
        "DeleteVectorName",
        "UpdateBatch",
    }
)
_REPLIES: Final = {method: reply.message for method, reply in _METHODS.items()}
_KINDS: Final[Mapping[str, RouteKind]] = {
    **dict.fromkeys(_METHODS, RouteKind.FILTERED),
    **dict.fromkeys(_CONTENT, RouteKind.CONTENT),
    **dict.fromkeys(_WRITES, RouteKind.WRITE),
}
# The Collections service, as the REST twin classifies the same operations.
# Collection info counts points (the REST twin filters it; this reply is not
# read, so it is content); the collection list, alias and shard key listings
# name other tenants' collections and shards; cluster info counts points per
# shard. Only the existence check reads.
_COLLECTION_KINDS: Final[Mapping[str, RouteKind]] = {
    "Get": RouteKind.CONTENT,
    "List": RouteKind.CONTENT,
    "ListCollectionAliases": RouteKind.CONTENT,
    "ListAliases": RouteKind.CONTENT,
    "CollectionClusterInfo": RouteKind.CONTENT,
    "ListShardKeys": RouteKind.CONTENT,
    "CollectionExists": RouteKind.READ,
    "Create": RouteKind.WRITE,
    "Update": RouteKind.WRITE,
    "Delete": RouteKind.WRITE,
    "UpdateAliases": RouteKind.WRITE,
    "UpdateCollectionClusterSetup": RouteKind.WRITE,
    "CreateShardKey": RouteKind.WRITE,
    "DeleteShardKey": RouteKind.WRITE,
}
# Every method of every service the format claims. Snapshots copy whole
# collections (or the whole storage) past every per-chunk check.
SERVICE_KINDS: Final[Mapping[str, Mapping[str, RouteKind]]] = {
    SERVICE: _KINDS,
    COLLECTIONS: _COLLECTION_KINDS,
    SNAPSHOTS: dict.fromkeys(
        ("Create", "List", "Delete", "CreateFull", "ListFull", "DeleteFull"), RouteKind.CONTENT
    ),
}
# What the request policy's ownership check is given for a call whose request
# the gate does not read for a collection (a listing of every collection, a
# full snapshot, alias changes, a newer server's method): every collection, a
# pattern that passes only when every collection policy data describes is the
# caller's.
EVERY_COLLECTION: Final = "*"

# The fields of a point that are Qdrant's own and go out with it (besides the
# id and the payload, which are rebuilt): messages are copied without unknown fields.
_POINT_MESSAGES: Final = ("vectors", "shard_key", "order_value")
_SCORED_SCALARS: Final = ("score", "version")

_INT64: Final = range(-(2**63), 2**63)


def python_value(value: Message) -> Any:
    """A ``qdrant.Value`` as the JSON value it stands for (None for null or no known kind).

    Recursive: protobuf's parser caps nesting depth (100), so the depth is bounded.
    """
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {key: python_value(item) for key, item in value.struct_value.fields.items()}
    if kind == "list_value":
        return [python_value(item) for item in value.list_value.values]
    if kind is None or kind == "null_value":
        return None
    return getattr(value, kind)


def fill_value(target: Message, value: Any) -> None:
    """Set the empty ``qdrant.Value`` ``target`` to the JSON value ``value``.

    An integer beyond int64 (only a replaced point's id, in the substitute
    marker, can be one) is written as its decimal string: exact, where a
    double would not be.
    """
    if value is None:
        target.null_value = 0
    elif isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        if value in _INT64:
            target.integer_value = value
        else:
            target.string_value = str(value)
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, str):
        target.string_value = value
    elif isinstance(value, dict):
        target.struct_value.SetInParent()
        for key, item in value.items():
            fill_value(target.struct_value.fields[key], item)
    elif isinstance(value, list):
        target.list_value.SetInParent()
        for item in value:
            fill_value(target.list_value.values.add(), item)
    else:
        raise MalformedBody("a payload value has no Qdrant form")


def point_id(point: Message) -> int | str | None:
    """The point id as the REST API writes it: an integer, or a UUID in canonical form.

    None when the point has no id; raises ValueError for a UUID field that
    holds no UUID.
    """
    kind = point.id.WhichOneof("point_id_options") if point.HasField("id") else None
    if kind == "num":
        return int(point.id.num)
    if kind == "uuid":
        return str(uuid.UUID(point.id.uuid))
    return None


def _set_point_id(target: Message, value: int | str) -> None:
    """Point ``target``'s ``id`` (a PointId) at ``value``: a number, or a UUID string."""
    if isinstance(value, int):
        if not 0 <= value < 2**64:
            # A substitute's decimal chunk id past Qdrant's unsigned 64-bit ids.
            raise MalformedBody("a substitute's id is no Qdrant point id")
        target.num = value
    else:
        target.uuid = value


@dataclass(eq=False)
class _QdrantGrpcBody(GrpcReply):
    """A parsed reply: its points by position, and how it is rebuilt."""

    layout: str  # the reply's ``_Reply.layout``
    points: list[Message]  # the point at each position, as it came
    views: list[dict[str, Any]]  # the same as {"id", "payload"}, for the layout
    id_from_point: bool  # the chunk id is the point id (no id_field)
    # The positions of each sub-result's points (or, for groups, of each group's
    # hits and lookup).
    spans: list[Any] = field(default_factory=list)

    def _rebuild(self, selection: Selection) -> Message:
        reply = type(self.reply)()
        reply.time = self.reply.time
        layout = self.layout
        if layout == "points":
            self._add_points(reply.result, self.spans[0], selection, selection.limits[0])
        elif layout == "scroll":
            self._rebuild_scroll(reply, selection)
        elif layout == "batch":
            for span, limit in zip(self.spans, selection.limits, strict=True):
                self._add_points(reply.result.add().result, span, selection, limit)
        else:
            reply.result.SetInParent()
            self._rebuild_groups(reply.result.groups, selection, selection.limits[0])
        return reply

    def _add_points(
        self, target: Any, positions: range, selection: Selection, limit: int | None
    ) -> list[int]:
        kept = selection.kept(positions)[:limit]
        for position in kept:
            self._send(target.add(), position, selection)
        return kept

    def _rebuild_scroll(self, reply: Message, selection: Selection) -> None:
        kept = self._add_points(reply.result, self.spans[0], selection, selection.limits[0])
        if not kept or not self.reply.HasField("next_page_offset"):
            # Nothing released (any cursor would name a rejected or unchecked
            # point), or the scroll had ended: it ends here.
            return
        # The cursor of the original point, not of a substitute in its place.
        following = next_offset_after(self.views[kept[-1]])
        if following is not None:
            _set_point_id(reply.next_page_offset, following)

    def _rebuild_groups(self, target: Any, selection: Selection, limit: int | None) -> None:
        # The limit counts groups returned, so emptied groups do not count;
        # group_size is never raised, so a group's hits are not trimmed.
        for group, hits, lookup in self.spans:
            if limit is not None and len(target) >= limit:
                break
            kept = selection.kept(hits)
            if not kept:
                # The group id is the group_by value of its hits: it goes with them.
                continue
            out = target.add()
            if group.HasField("id"):
                out.id.CopyFrom(grpc_messages.released(group.id))
            for position in kept:
                self._send(out.hits.add(), position, selection)
            # Qdrant leaves the lookup out when the looked-up point does not
            # exist: a rejected one looks exactly like a missing one.
            looked_up = None
            if lookup is not None and lookup in selection:
                looked_up = self._send(out.lookup, lookup, selection).get("id")
            # A substitute takes the place of the hit it replaces, in the group too.
            payloads = [self._layout.released(self.views[p]).get("payload") for p in kept]
            check_group_id(_group_id(group), payloads, looked_up)

    def _send(self, target: Message, position: int, selection: Selection) -> dict[str, Any]:
        """Write the point at ``position`` into the empty ``target``, as it goes out;
        returns it as the JSON point it stands for."""
        original = self.points[position]
        view = selection.send(position, self.views[position])
        target.SetInParent()  # a group's lookup is there even if it had nothing to copy
        if self.id_from_point and selection.replaced(position):
            _set_point_id(target.id, view["id"])
        elif original.HasField("id"):
            target.id.CopyFrom(grpc_messages.released(original.id))
        payload = view.get("payload")
        if isinstance(payload, dict):
            for key, value in payload.items():
                fill_value(target.payload[key], value)
        if "score" in original.DESCRIPTOR.fields_by_name:  # a ScoredPoint
            for name in _SCORED_SCALARS:
                setattr(target, name, getattr(original, name))
        for name in _POINT_MESSAGES:
            if original.HasField(name):
                getattr(target, name).CopyFrom(grpc_messages.released(getattr(original, name)))
        released: dict[str, Any] = view
        return released


def _group_id(group: Message) -> int | str | None:
    """A ``PointGroup``'s id as the JSON value it stands for (None when it has none)."""
    if not group.HasField("id"):
        return None
    kind = group.id.WhichOneof("kind")
    return None if kind is None else getattr(group.id, kind)


class QdrantGrpcFormat(TwinGrpcAdapter, QdrantGrpcRequests):
    """Adapter for Qdrant's gRPC API: filters replies, rewrites search requests.

    FILTERED are the methods that return points, CONTENT counts, facets and
    distance matrices, WRITE the rest of the Points service; the Collections
    and Snapshots services are classified too (``SERVICE_KINDS``). A method
    of those services the gate does not know (a newer Qdrant's) is CONTENT,
    as for every gRPC adapter.
    """

    name = "qdrant_grpc"
    service = SERVICE
    kinds = _KINDS
    replies = _REPLIES

    def route_kind(self, route: Route) -> RouteKind | None:
        """What a method of ``qdrant.Points``, ``qdrant.Collections`` or
        ``qdrant.Snapshots`` does (``SERVICE_KINDS``; CONTENT for one the gate does
        not know); None for other paths."""
        for service, kinds in SERVICE_KINDS.items():
            called = grpc_method(route, service)
            if called is not None:
                return kinds.get(called, RouteKind.CONTENT)
        return None

    def route_collections(self, route: Route) -> list[str]:
        """[] for a call whose request is read for its collections (``rewrites_request``);
        ``EVERY_COLLECTION`` for any other call of the claimed services."""
        if self.route_kind(route) is None or self.rewrites_request(route):
            return []
        return [EVERY_COLLECTION]

    def _twin(self, options: AdapterOptions) -> QdrantFormat:
        # A point is read as the JSON point {"id", "payload"} it stands for.
        return QdrantFormat(options)

    def _read(self, document: tuple[bytes, Message], shape: str) -> _QdrantGrpcBody:
        body, reply = document
        reader = _Reader(self._layout, self.id_field is None)
        layout = _METHODS[shape].layout
        if layout in ("points", "scroll"):
            spans: list[Any] = [reader.points(reply.result)]
            sub_results = 1
        elif layout == "batch":
            spans = [reader.points(batch.result) for batch in reply.result]
            sub_results = len(spans)
        else:
            spans = [
                (
                    group,
                    reader.points(group.hits),
                    reader.point(group.lookup) if group.HasField("lookup") else None,
                )
                for group in reply.result.groups
            ]
            sub_results = 1
        return _QdrantGrpcBody(
            reader.hits,
            body,
            reply,
            grpc_messages.has_unknown_fields(reply),
            layout,
            reader.messages,
            reader.views,
            self.id_field is None,
            spans,
            sub_results=sub_results,
        )


class _Reader:
    """Numbers the points of one reply and makes their candidates."""

    def __init__(self, layout: HitLayout, id_from_point: bool) -> None:
        self.hits = Hits(layout)
        self.messages: list[Message] = []
        self.views: list[dict[str, Any]] = []
        self._id_from_point = id_from_point

    def points(self, points: Any) -> range:
        start = len(self.messages)
        for point in points:
            self.point(point)
        return range(start, len(self.messages))

    def point(self, point: Message) -> int:
        """Register ``point``; returns its position."""
        try:
            chunk_id = point_id(point)
            bad_uuid = False
        except ValueError:
            chunk_id, bad_uuid = None, True
        payload = {key: python_value(value) for key, value in point.payload.items()}
        # An empty payload map is what a reply without payload has.
        view = {"id": chunk_id, "payload": payload or None}
        self.messages.append(point)
        self.views.append(view)
        if bad_uuid and self._id_from_point:
            layout = self.hits.layout
            _, text = layout.read(view)
            return self.hits.add_found(
                (None, "point id is not a UUID"), text, self.hits.hashed(layout.holder(view))
            )
        return self.hits.add(view)
