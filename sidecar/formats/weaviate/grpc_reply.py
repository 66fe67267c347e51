"""A Weaviate gRPC ``SearchReply`` rebuilt for a selection: what of it may go out.

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
- ``iterator_next_uuid`` is where a filtered iteration continues (servers
  with filtered cursors: the object at which the scan stopped, which can be
  another tenant's object the filter skipped or one the gate rejects; the
  nil UUID when the scan did not stop early). It is always rebuilt from the
  released results: the UUID of the last result that goes out, so the next
  page starts right after it and re-reads (and refuses again) whatever was
  scanned past it, skipping and repeating nothing; the nil UUID, the end of
  the iteration, when no result goes out (any other cursor would name an
  object the caller may not see). An iteration can so end before the
  caller's last object, when a whole page of the scan released nothing.
- ``took`` stays.

A reply the gate knew all of and from which nothing was removed, replaced
or withheld goes out byte for byte.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sidecar.core.hits import Candidate, Replacement
from sidecar.formats.base import (
    MalformedBody,
    RenderLimits,
    Replacements,
    ReportedError,
    Unreleasable,
)
from sidecar.formats.grpc_adapter import released_body
from sidecar.formats.hits import FieldPath
from sidecar.formats.weaviate.grpc_hits import CheckedObject, Options, ResultGroup, object_uuid
from sidecar.formats.weaviate.grpc_values import (
    found,
    group_names,
    projected,
    substitute_properties,
)
from sidecar.formats.weaviate.rest_body import refuse_generated

# What a group's name becomes when it is not a released property value.
WITHHELD_GROUP_NAME: Final = "retrieval-gate-group-{}"
# The iteration cursor that ends an iteration: the nil UUID, as Weaviate sends it
# when its scan did not stop early (and refuses as a cursor to continue from).
NO_CURSOR: Final = bytes(16)

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


@dataclass(eq=False)
class WeaviateGrpcBody:
    """A parsed SearchReply: its candidates, and the reply with only some of them.

    One sub-result: ``limits`` (from an over-fetched request) trims the
    results, or the groups, to the app's limit.
    """

    body: bytes
    reply: Any
    candidates: tuple[Candidate, ...]
    results: list[CheckedObject]
    groups: list[ResultGroup]
    options: Options
    unknown_fields: bool
    _last: tuple[tuple[frozenset[int], int | None], list[int]] | None = field(
        default=None, init=False, repr=False
    )
    # Weaviate answers a failed search with a gRPC status, never inside a reply.
    reported_error: ReportedError | None = field(default=None, init=False, repr=False)

    def render(
        self, keep: Collection[int], limits: RenderLimits = None, replacements: Replacements = None
    ) -> bytes:
        """The framed reply with only the objects at ``keep``; see ``ParsedBody.render``."""
        walk = _Walk(self, frozenset(keep), _limit(limits), replacements or {})
        reply = walk.reply()
        self._last = ((walk.keep, walk.limit), sorted(walk.released))
        return released_body(self.body, self.reply, reply, unknown=self.unknown_fields)

    def released_positions(self, keep: Collection[int], limits: RenderLimits = None) -> list[int]:
        """The positions ``render(keep, limits)`` sends, in body order."""
        walk = _Walk(self, frozenset(keep), _limit(limits), {})
        if self._last is not None and self._last[0] == (walk.keep, walk.limit):
            return list(self._last[1])
        walk.reply()
        return sorted(walk.released)


def _limit(limits: RenderLimits) -> int | None:
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
        """The released SearchReply; records the positions it sends in ``released``."""
        source = self._body.reply
        out = self._new(source)
        out.took = source.took
        last: CheckedObject | None = None
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
                    refuse_generated(self._options.block_generated)
                else:
                    _copy_field(out, source, name)
        if source.HasField("iterator_next_uuid"):
            # From released data only: never the object the database's scan stopped at.
            out.iterator_next_uuid = NO_CURSOR if last is None else _uuid_bytes(last)
        return out

    def _result(self, obj: CheckedObject) -> Any:
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
                refuse_generated(self._options.block_generated)
        return out

    def _reference(self, obj: CheckedObject) -> Any:
        """A released referenced object (a PropertiesResult); None when not kept."""
        if obj.position not in self.keep:
            return None
        self.released.append(obj.position)
        return self._properties(obj, self._replacements.get(obj.position))

    def _properties(self, obj: CheckedObject, replacement: Replacement | None) -> Any:
        source = obj.properties
        out = self._new(source)
        out.target_collection = source.target_collection
        out.ref_props_requested = source.ref_props_requested
        if source.HasField("metadata"):
            out.metadata.CopyFrom(self._metadata(source.metadata, replacement))
        options = self._options
        paths = options.released if replacement is None else options.own
        if source.HasField("non_ref_props") or replacement is not None:
            out.non_ref_props.CopyFrom(projected(source.non_ref_props, paths))
        if replacement is not None:
            substitute_properties(
                out.non_ref_props,
                source.non_ref_props,
                replacement,
                options.text_field,
                options.id_field,
            )
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
            refuse_generated(self._options.block_generated)
            for name in _SINGLE_GENERATED:
                out.ClearField(name)
        if self._options.id_field is None:
            new_id = _substitute_uuid(replacement.chunk_id)
            if source.id:
                out.id = str(new_id)
            if source.id_as_bytes:
                out.id_as_bytes = new_id.bytes
        return out

    def _group(self, group: ResultGroup, index: int) -> Any:
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
            refuse_generated(self._options.block_generated)
        return out


def _copy_field(out: Any, source: Any, name: str) -> None:
    if not source.HasField(name):
        return
    value = getattr(source, name)
    if isinstance(value, str | bytes):
        setattr(out, name, value)
    else:
        getattr(out, name).CopyFrom(value)


def _uuid_bytes(obj: CheckedObject) -> bytes:
    """The 16 bytes of an object's own UUID (a substitute's place is its original's);
    the nil UUID, the end, when it has none that is usable."""
    chunk_id, _ = object_uuid(obj.metadata)
    return NO_CURSOR if chunk_id is None else uuid.UUID(chunk_id).bytes


def _substitute_uuid(chunk_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(chunk_id)
    except ValueError:
        pass
    raise Unreleasable(
        "substitute_id_not_uuid",
        "a substitute's chunk id is not a UUID, which a Weaviate object id must be",
    )


def _name_released(name: str, objects: list[CheckedObject], paths: Sequence[FieldPath]) -> bool:
    """True when a group's name is the value of a released property of one of ``objects``."""
    top = [path for path in paths if len(path) == 1]
    for obj in objects:
        if obj.properties is None:
            continue
        for _, value in found(obj.properties.non_ref_props, top):
            if name in group_names(value):
                return True
    return False
