"""Weaviate's gRPC API (``weaviate.v1.Weaviate``): routes, options and ``Search`` replies.

The v4 client runs every ``collection.query.*`` and ``generate.*`` call as
``/weaviate.v1.Weaviate/Search``; its reply is one ``SearchReply``, read with
the gate's own copy of Weaviate's messages (``proto/vendor/weaviate``). Hits
are the objects of ``results`` and of every ``group_by_results[].objects``,
each followed by the objects its references return
(``properties.ref_props[].properties``, at any depth): those are other
chunks, and each one is a candidate of its own. Positions number them in
that order: a result, its referenced objects, the next result, then the
groups' objects.

The chunk id is the object's UUID in canonical lowercase form, from
``metadata.id_as_bytes`` (16 bytes, what the client reads) or ``metadata.id``
(a referenced object's ``properties.metadata``); both present and different
is a problem of that hit. With ``id_field`` it is that property instead. The
text is the property ``text_field`` (``properties.non_ref_props``, a
``text_value``).

The reply is rebuilt from fields known to be safe; everything else goes,
unknown fields of a newer server included:

- a released object keeps, of its properties, only the text, the id
  property and the declared ``hashed_fields`` and ``releasable_fields``
  (dotted paths into object properties), its ``target_collection`` and whether
  references were asked for; a reference list goes out when its property is
  declared, with only its admitted objects. Of its metadata it keeps its id,
  vectors, timestamps, distance, certainty, score, rerank score and
  consistency flag; ``explain_score`` (text about the query and the other
  results) goes, as it does in the GraphQL adapter. The deprecated property
  encodings of servers before 1.25 (a Struct and typed arrays) are dropped.
- groups keep their kept objects; an emptied group goes. When a group lost
  objects its ``number_of_objects``, ``min_distance`` and ``max_distance``
  are recomputed from the kept ones (the distances 0 when one has none)
  and its rerank score goes. Its ``name`` is a property value of its objects:
  it goes out when it equals the value of a released property of one of its
  kept objects, else it becomes ``retrieval-gate-group-<n>`` (groups stay
  apart: the client keys them by name).
- generated text is handled as the GraphQL adapter's ``generative`` option
  says. A grouped answer (``generative_grouped_result(s)``, and a group's
  ``generative``/``generative_result``) is generated from every object of the
  reply (the group): when any of them is rejected, trimmed or replaced,
  "strip" removes it and "block" refuses the reply (``Unreleasable``). A
  replaced object's own answer (``generative``, ``metadata.generative``) was
  generated from the replaced text and is treated the same way.
- ``iterator_next_uuid`` (a cursor to the last object a filtered iteration
  scanned) becomes, when anything was removed, the id of the last released
  result, or empty (the end) when none was: it would otherwise name an
  object the gate never checked.
- ``took`` stays.

A reply the gate knew all of and from which nothing was removed, replaced
or withheld goes out byte for byte. Search requests are rewritten by
``weaviate_grpc_request``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.core.integrity import canonical_fields
from sidecar.formats import grpc_messages
from sidecar.formats.base import (
    MalformedBody,
    Unreleasable,
    id_field_option,
    text_field_option,
)
from sidecar.formats.grpc_adapter import decode_unary, grpc_method, released_body
from sidecar.formats.hits import FieldPath, ReleasedFields
from sidecar.formats.weaviate import GENERATIVE_MODES
from sidecar.formats.weaviate_grpc_request import SERVICE, WeaviateGrpcRequests, is_search

SEARCH_REPLY: Final = "weaviate.v1.SearchReply"
# What a group's name becomes when it is not a released property value.
WITHHELD_GROUP_NAME: Final = "retrieval-gate-group-{}"

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

# The fields of a released object's metadata (MetadataResult). Not
# explain_score(_present); generative(_present) is checked on its own.
_METADATA_KEPT: Final = frozenset(
    {
        "id",
        "id_as_bytes",
        "vector",
        "vector_bytes",
        "vectors",
        "creation_time_unix",
        "creation_time_unix_present",
        "last_update_time_unix",
        "last_update_time_unix_present",
        "distance",
        "distance_present",
        "certainty",
        "certainty_present",
        "score",
        "score_present",
        "rerank_score",
        "rerank_score_present",
        "is_consistent",
        "is_consistent_present",
        "generative",
        "generative_present",
    }
)
_SINGLE_GENERATED: Final = ("generative", "generative_present")
_TEXT_KINDS: Final = frozenset({"text_value", "string_value"})
_ID_KINDS: Final = frozenset({"text_value", "string_value", "uuid_value", "int_value"})
# Kinds whose value a group name can be (Weaviate groups by text, uuid, date, int).
_NAME_KINDS: Final = frozenset({"text_value", "string_value", "uuid_value", "date_value"})
_GENERATED_FROM_REJECTED: Final = "generated_from_rejected_chunks"


def _refuse_generated(block: bool) -> None:
    """Raise Unreleasable when generated text must block the reply."""
    if block:
        raise Unreleasable(
            _GENERATED_FROM_REJECTED,
            "the response carries text generated from objects the gate removed",
        )


@dataclass(frozen=True, slots=True)
class _Options:
    """What the format's options say about one object."""

    text_field: str
    id_field: str | None
    hashed: tuple[FieldPath, ...]
    # Paths of non_ref_props that go out: the text, the id property, the declared fields.
    released: tuple[FieldPath, ...]
    # The same without the declared fields: what a substitute keeps.
    own: tuple[FieldPath, ...]
    block_generated: bool


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
        self._options = _Options(
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
            reader = _Reader(self._options)
            results = [reader.result(result) for result in reply.results]
            groups = [
                _Group(group, [reader.result(obj) for obj in group.objects])
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


# -- reading ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Object:
    """A checked object: a result, a group's object or a referenced object.

    ``result`` is its SearchResult (None for a referenced object, which is a
    PropertiesResult only); ``end`` is one past the last position of its
    referenced objects.
    """

    position: int
    result: Any
    properties: Any
    metadata: Any
    references: list[tuple[Any, list[_Object]]]
    end: int = 0


@dataclass(slots=True)
class _Group:
    group: Any  # the GroupByResult
    objects: list[_Object]

    @property
    def positions(self) -> range:
        if not self.objects:
            return range(0)
        return range(self.objects[0].position, self.objects[-1].end)


class _Reader:
    """Numbers the objects of one reply in document order and makes their candidates."""

    def __init__(self, options: _Options) -> None:
        self._options = options
        self.candidates: list[Candidate] = []

    def result(self, result: Any) -> _Object:
        """A SearchResult and its referenced objects."""
        properties = result.properties if result.HasField("properties") else None
        metadata = result.metadata if result.HasField("metadata") else None
        return self._object(result, properties, metadata)

    def _object(self, result: Any, properties: Any, metadata: Any) -> _Object:
        position = len(self.candidates)
        self.candidates.append(self._candidate(position, properties, metadata))
        references = []
        for reference in properties.ref_props if properties is not None else ():
            objects = [
                self._object(None, target, target.metadata if target.HasField("metadata") else None)
                for target in reference.properties
            ]
            references.append((reference, objects))
        return _Object(position, result, properties, metadata, references, len(self.candidates))

    def _candidate(self, position: int, properties: Any, metadata: Any) -> Candidate:
        options = self._options
        values = properties.non_ref_props if properties is not None else None
        if options.id_field is None:
            chunk_id, id_problem = object_uuid(metadata)
        else:
            chunk_id, id_problem = _property_id(values, options.id_field)
        text, text_problem = _property_text(values, options.text_field)
        fields, fields_problem = None, None
        if options.hashed:
            try:
                fields = canonical_fields(
                    {".".join(path): plain(value) for path, value in _found(values, options.hashed)}
                )
            except (ValueError, UnicodeEncodeError):
                fields_problem = "hashed fields have no canonical form"
        if fields_problem is not None:
            # Unverifiable fields make the chunk unusable, like unreadable text.
            text = None
        problems = dict.fromkeys(p for p in (id_problem, text_problem, fields_problem) if p)
        return Candidate(position, chunk_id, text, "; ".join(problems) or None, fields)


def object_uuid(metadata: Any) -> tuple[str | None, str | None]:
    """``(uuid, None)``: an object's id, canonical lowercase; ``(None, problem)`` otherwise."""
    if metadata is None:
        return None, "no metadata"
    from_bytes = from_text = None
    if metadata.id_as_bytes:
        if len(metadata.id_as_bytes) != 16:
            return None, "metadata.id_as_bytes is not 16 bytes"
        from_bytes = str(uuid.UUID(bytes=metadata.id_as_bytes))
    if metadata.id:
        try:
            from_text = str(uuid.UUID(metadata.id))
        except ValueError:
            return None, "metadata.id is not a UUID"
    if from_bytes is not None and from_text is not None and from_bytes != from_text:
        return None, "metadata.id and metadata.id_as_bytes differ"
    found = from_bytes or from_text
    return (found, None) if found is not None else (None, "metadata.id missing")


def _property_id(values: Any, name: str) -> tuple[str | None, str | None]:
    label = f"property {name!r}"
    value = values.fields.get(name) if values is not None else None
    kind = None if value is None else value.WhichOneof("kind")
    if kind is None:
        return None, f"{label} missing"
    if kind not in _ID_KINDS:
        return None, f"{label} is not a string or integer"
    found = str(getattr(value, kind))
    return (found, None) if found else (None, f"{label} is empty")


def _property_text(values: Any, name: str) -> tuple[str | None, str | None]:
    label = f"property {name!r}"
    value = values.fields.get(name) if values is not None else None
    kind = None if value is None else value.WhichOneof("kind")
    if kind is None:
        return None, f"{label} missing"
    if kind not in _TEXT_KINDS:
        return None, f"{label} is not a string"
    text: str = getattr(value, kind)
    return text, None


def _found(values: Any, paths: Sequence[FieldPath]) -> Iterator[tuple[FieldPath, Any]]:
    """The (path, Value) of each of ``paths`` that ``values`` (a Properties) has."""
    for path in paths:
        value = _at(values, path)
        if value is not None:
            yield path, value


def _at(values: Any, path: FieldPath) -> Any:
    """The Value at ``path`` of a Properties, through object values; None when absent."""
    value = None
    for key in path:
        if values is None or key not in values.fields:
            return None
        value = values.fields[key]
        values = value.object_value if value.WhichOneof("kind") == "object_value" else None
    return value


def plain(value: Any) -> Any:
    """A property Value as Weaviate's REST API writes it in JSON, for the payload hash.

    Numbers without a fraction are integers (Go writes 3.0 as ``3``), geo
    coordinates keep float32 precision; raises ValueError for what has no
    JSON form (an unset Value, packed arrays of the wrong length).
    """
    kind = value.WhichOneof("kind")
    if kind in ("text_value", "string_value", "date_value", "uuid_value", "blob_value"):
        return getattr(value, kind)
    if kind == "number_value":
        return _number(value.number_value)
    if kind in ("int_value", "bool_value"):
        return getattr(value, kind)
    if kind == "null_value":
        return None
    if kind == "object_value":
        return _plain_properties(value.object_value)
    if kind == "list_value":
        return _plain_list(value.list_value)
    if kind == "geo_value":
        geo = value.geo_value
        return {"latitude": _float32(geo.latitude), "longitude": _float32(geo.longitude)}
    if kind == "phone_value":
        phone = value.phone_value
        # REST's camelCase keys, empty values left out as Go's omitempty does.
        keys = (
            ("countryCode", "country_code"),
            ("defaultCountry", "default_country"),
            ("input", "input"),
            ("internationalFormatted", "international_formatted"),
            ("national", "national"),
            ("nationalFormatted", "national_formatted"),
            ("valid", "valid"),
        )
        return {rest: getattr(phone, name) for rest, name in keys if getattr(phone, name)}
    raise ValueError("a property value of no known kind")


def _plain_properties(properties: Any) -> dict[str, Any]:
    return {key: plain(item) for key, item in properties.fields.items()}


def _plain_list(value: Any) -> list[Any]:
    kind = value.WhichOneof("kind")
    if kind is None:
        # Servers before 1.25 send a list as Values.
        return [plain(item) for item in value.values]
    if kind == "number_values":
        return [_number(n) for n in _unpacked("d", value.number_values.values)]
    if kind == "int_values":
        return list(_unpacked("q", value.int_values.values))
    if kind == "object_values":
        return [_plain_properties(item) for item in value.object_values.values]
    return list(getattr(value, kind).values)


def _unpacked(code: str, data: bytes) -> tuple[Any, ...]:
    if len(data) % 8:
        raise ValueError("a packed array is not a whole number of 8-byte values")
    return struct.unpack(f"<{len(data) // 8}{code}", data)


def _number(value: float) -> float | int:
    # Go's encoding/json writes whole float64s below 1e21 without a fraction.
    if value.is_integer() and abs(value) < 1e21:
        return int(value)
    return value


def _float32(value: float) -> float:
    """The shortest decimal that is the same float32, as Go writes a float32 in JSON."""
    packed = struct.pack("<f", value)
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("<f", candidate) == packed:
            return candidate
    return value


# -- rendering -------------------------------------------------------------------------


@dataclass(eq=False)
class WeaviateGrpcBody:
    """A parsed SearchReply: its candidates, and the reply with only some of them.

    One sub-result: ``limits`` (from an over-fetched request) trims the
    results, or the groups, to the app's limit.
    """

    body: bytes
    reply: Any
    candidates: tuple[Candidate, ...]
    results: list[_Object]
    groups: list[_Group]
    options: _Options
    unknown_fields: bool
    _last: tuple[tuple[frozenset[int], int | None], list[int]] | None = field(
        default=None, init=False, repr=False
    )

    def render(
        self,
        keep: Collection[int],
        limits: Sequence[int | None] | None = None,
        replacements: Mapping[int, Replacement] | None = None,
    ) -> bytes:
        """The framed reply with only the objects at ``keep``; see ``ParsedBody.render``."""
        walk = _Walk(self, frozenset(keep), _limit(limits), replacements or {})
        reply = walk.reply()
        self._last = ((walk.keep, walk.limit), sorted(walk.released))
        return released_body(self.body, self.reply, reply, unknown=self.unknown_fields)

    def released_positions(
        self, keep: Collection[int], limits: Sequence[int | None] | None = None
    ) -> list[int]:
        """The positions ``render(keep, limits)`` sends, in body order."""
        walk = _Walk(self, frozenset(keep), _limit(limits), {})
        if self._last is not None and self._last[0] == (walk.keep, walk.limit):
            return list(self._last[1])
        walk.reply()
        return sorted(walk.released)


def _limit(limits: Sequence[int | None] | None) -> int | None:
    if not limits:
        return None
    if len(limits) != 1:
        raise MalformedBody(f"response has 1 sub-result, the request had {len(limits)}")
    return limits[0]


class _Walk:
    """One render: the reply rebuilt for a selection, and the positions it sends."""

    def __init__(
        self,
        body: WeaviateGrpcBody,
        keep: frozenset[int],
        limit: int | None,
        replacements: Mapping[int, Replacement],
    ) -> None:
        self.keep = keep
        self.limit = limit
        self.released: list[int] = []
        self._body = body
        self._options = body.options
        self._replacements = replacements
        self._trimmed = False

    def _new(self, message: Any) -> Any:
        """An empty message of ``message``'s type."""
        return type(message)()

    def _changed(self, positions: range) -> bool:
        """True when an object at ``positions`` is rejected or replaced."""
        keep, replacements = self.keep, self._replacements
        return any(p not in keep or p in replacements for p in positions)

    def reply(self) -> Any:
        source = self._body.reply
        out = self._new(source)
        out.took = source.took
        last: _Object | None = None
        for obj in self._body.results:
            if self.limit is not None and len(out.results) >= self.limit:
                self._trimmed = True
                break
            value = self._result(obj)
            if value is not None:
                out.results.append(value)
                last = obj
        for group in self._body.groups:
            if self.limit is not None and len(out.group_by_results) >= self.limit:
                self._trimmed = True
                break
            value = self._group(group, len(out.group_by_results))
            if value is not None:
                out.group_by_results.append(value)
        changed = self._trimmed or self._changed(range(len(self._body.candidates)))
        for name in ("generative_grouped_result", "generative_grouped_results"):
            if source.HasField(name):
                if changed:
                    _refuse_generated(self._options.block_generated)
                else:
                    _copy_field(out, source, name)
        if source.HasField("iterator_next_uuid"):
            # Changed: the cursor goes back to the last object released (re-read
            # rejected ones are rejected again), or ends the iteration.
            cursor = source.iterator_next_uuid
            if changed:
                cursor = b"" if last is None else _uuid_bytes(last)
            out.iterator_next_uuid = cursor
        return out

    def _result(self, obj: _Object) -> Any:
        """A released SearchResult; None when the object is not kept."""
        if obj.position not in self.keep:
            return None
        self.released.append(obj.position)
        replacement = self._replacements.get(obj.position)
        source = obj.result
        out = self._new(source)
        if obj.properties is not None:
            out.properties.CopyFrom(self._properties(obj, replacement))
        if obj.metadata is not None:
            out.metadata.CopyFrom(self._metadata(obj.metadata, replacement))
        if source.HasField("generative"):
            if replacement is None:
                out.generative.CopyFrom(source.generative)
            else:
                _refuse_generated(self._options.block_generated)
        return out

    def _reference(self, obj: _Object) -> Any:
        """A released referenced object (a PropertiesResult); None when not kept."""
        if obj.position not in self.keep:
            return None
        self.released.append(obj.position)
        return self._properties(obj, self._replacements.get(obj.position))

    def _properties(self, obj: _Object, replacement: Replacement | None) -> Any:
        source = obj.properties
        out = self._new(source)
        out.target_collection = source.target_collection
        out.ref_props_requested = source.ref_props_requested
        if source.HasField("metadata"):
            out.metadata.CopyFrom(self._metadata(source.metadata, replacement))
        options = self._options
        paths = options.released if replacement is None else options.own
        if source.HasField("non_ref_props") or replacement is not None:
            out.non_ref_props.CopyFrom(_projected(source.non_ref_props, paths))
        if replacement is not None:
            _substitute_properties(out.non_ref_props, source.non_ref_props, replacement, options)
            # A substitute's references belong to the document it replaced.
            return out
        declared = {path[0] for path in options.released}
        for reference, objects in obj.references:
            if reference.prop_name not in declared:
                continue
            kept = out.ref_props.add()
            kept.prop_name = reference.prop_name
            for target in objects:
                value = self._reference(target)
                if value is not None:
                    kept.properties.append(value)
        return out

    def _metadata(self, source: Any, replacement: Replacement | None) -> Any:
        out = self._new(source)
        out.CopyFrom(source)
        for descriptor, _ in source.ListFields():
            if descriptor.name not in _METADATA_KEPT:
                out.ClearField(descriptor.name)
        if replacement is None:
            return out
        if source.generative_present or source.generative:
            # Generated from the text that was just replaced.
            _refuse_generated(self._options.block_generated)
            for name in _SINGLE_GENERATED:
                out.ClearField(name)
        if self._options.id_field is None:
            new_id = _substitute_uuid(replacement.chunk_id)
            if source.id:
                out.id = str(new_id)
            if source.id_as_bytes:
                out.id_as_bytes = new_id.bytes
        return out

    def _group(self, group: _Group, index: int) -> Any:
        """A released GroupByResult; None when none of its objects is kept."""
        kept = [(obj, value) for obj in group.objects if (value := self._result(obj)) is not None]
        if not kept:
            return None
        source = group.group
        out = self._new(source)
        for _, value in kept:
            out.objects.append(value)
        # A substitute's properties are its replaced document's: they vouch for nothing.
        own = [obj for obj, _ in kept if obj.position not in self._replacements]
        released = _name_released(source.name, own, self._options.released)
        out.name = source.name if released else WITHHELD_GROUP_NAME.format(index)
        if not self._changed(group.positions):
            out.min_distance = source.min_distance
            out.max_distance = source.max_distance
            out.number_of_objects = source.number_of_objects
            for name in ("rerank", "generative", "generative_result"):
                _copy_field(out, source, name)
            return out
        out.number_of_objects = len(kept)
        distances = [
            value.metadata.distance for _, value in kept if value.metadata.distance_present
        ]
        if len(distances) == len(kept):
            out.min_distance, out.max_distance = min(distances), max(distances)
        if source.HasField("generative") or source.HasField("generative_result"):
            _refuse_generated(self._options.block_generated)
        return out


def _copy_field(out: Any, source: Any, name: str) -> None:
    if not source.HasField(name):
        return
    value = getattr(source, name)
    if isinstance(value, str | bytes):
        setattr(out, name, value)
    else:
        getattr(out, name).CopyFrom(value)


def _uuid_bytes(obj: _Object) -> bytes:
    """The 16 bytes of an object's own UUID; empty when it has none that is usable."""
    found, _ = object_uuid(obj.metadata)
    return b"" if found is None else uuid.UUID(found).bytes


def _substitute_uuid(chunk_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(chunk_id)
    except ValueError:
        pass
    raise Unreleasable(
        "substitute_id_not_uuid",
        "a substitute's chunk id is not a UUID, which a Weaviate object id must be",
    )


def _projected(values: Any, paths: Sequence[FieldPath]) -> Any:
    """The Properties with only the values at ``paths``, nested as they were."""
    if all(len(path) == 1 for path in paths) and values.fields.keys() <= {p[0] for p in paths}:
        return values
    out = type(values)()
    for path, value in _found(values, paths):
        target = out
        for key in path[:-1]:
            target = target.fields[key].object_value
        target.fields[path[-1]].CopyFrom(value)
    return out


def _substitute_properties(
    out: Any, source: Any, replacement: Replacement, options: _Options
) -> None:
    """Put the substitute's text (and id property) where the object keeps them."""
    text = out.fields[options.text_field]
    text.Clear()
    text.text_value = replacement.text
    if options.id_field is None:
        return
    kind = (
        source.fields[options.id_field].WhichOneof("kind")
        if options.id_field in source.fields
        else None
    )
    value = out.fields[options.id_field]
    value.Clear()
    new_id = replacement.chunk_id
    if kind == "int_value" and new_id.isascii() and new_id.lstrip("-").isdigit():
        value.int_value = int(new_id)
    elif kind == "uuid_value" and _is_uuid(new_id):
        value.uuid_value = str(uuid.UUID(new_id))
    else:
        value.text_value = new_id


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _name_released(name: str, objects: list[_Object], paths: Sequence[FieldPath]) -> bool:
    """True when a group's name is the value of a released property of one of ``objects``."""
    top = [path for path in paths if len(path) == 1]
    for obj in objects:
        if obj.properties is None:
            continue
        for _, value in _found(obj.properties.non_ref_props, top):
            if name in _names(value):
                return True
    return False


def _names(value: Any) -> Iterator[str]:
    """The group names a property Value can stand for (an array groups by each element)."""
    kind = value.WhichOneof("kind")
    if kind in _NAME_KINDS:
        yield getattr(value, kind)
    elif kind == "int_value":
        yield str(value.int_value)
    elif kind == "list_value":
        array = value.list_value.WhichOneof("kind")
        if array in ("text_values", "uuid_values", "date_values"):
            yield from getattr(value.list_value, array).values
