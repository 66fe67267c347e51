"""The hits of a Weaviate gRPC ``SearchReply``: which objects, in what order, and their candidates.

Hits are the objects of ``results`` and of every ``group_by_results[].objects``,
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

The objects read here keep their messages: ``grpc_reply`` rebuilds
the reply from them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sidecar.core.hits import Candidate
from sidecar.core.integrity import canonical_fields
from sidecar.formats.hits import FieldPath
from sidecar.formats.weaviate.grpc_values import found, plain, property_id, property_text


@dataclass(frozen=True, slots=True)
class Options:
    """What the format's options say about one object."""

    text_field: str
    id_field: str | None
    hashed: tuple[FieldPath, ...]
    # Paths of non_ref_props that go out: the text, the id property, the declared fields.
    released: tuple[FieldPath, ...]
    # The same without the declared fields: what a substitute keeps.
    own: tuple[FieldPath, ...]
    block_generated: bool


@dataclass(slots=True)
class CheckedObject:
    """A checked object: a result, a group's object or a referenced object.

    ``result`` is its SearchResult (None for a referenced object, which is a
    PropertiesResult only); ``end`` is one past the last position of its
    referenced objects.
    """

    position: int
    result: Any
    properties: Any
    metadata: Any
    references: list[tuple[Any, list[CheckedObject]]]
    end: int = 0


@dataclass(slots=True)
class ResultGroup:
    """A GroupByResult and its checked objects."""

    group: Any
    objects: list[CheckedObject]

    @property
    def positions(self) -> range:
        """The positions of the group's objects and of the objects they reference."""
        if not self.objects:
            return range(0)
        return range(self.objects[0].position, self.objects[-1].end)


class Reader:
    """Numbers the objects of one reply in document order and makes their candidates."""

    def __init__(self, options: Options) -> None:
        self._options = options
        self.candidates: list[Candidate] = []

    def result(self, result: Any) -> CheckedObject:
        """A SearchResult and its referenced objects."""
        properties = result.properties if result.HasField("properties") else None
        metadata = result.metadata if result.HasField("metadata") else None
        return self._object(result, properties, metadata)

    def _object(self, result: Any, properties: Any, metadata: Any) -> CheckedObject:
        position = len(self.candidates)
        self.candidates.append(self._candidate(position, properties, metadata))
        references = []
        for reference in properties.ref_props if properties is not None else ():
            objects = [
                self._object(None, target, target.metadata if target.HasField("metadata") else None)
                for target in reference.properties
            ]
            references.append((reference, objects))
        return CheckedObject(
            position, result, properties, metadata, references, len(self.candidates)
        )

    def _candidate(self, position: int, properties: Any, metadata: Any) -> Candidate:
        options = self._options
        values = properties.non_ref_props if properties is not None else None
        if options.id_field is None:
            chunk_id, id_problem = object_uuid(metadata)
        else:
            chunk_id, id_problem = property_id(values, options.id_field)
        text, text_problem = property_text(values, options.text_field)
        fields, fields_problem = None, None
        if options.hashed:
            try:
                fields = canonical_fields(
                    {".".join(path): plain(value) for path, value in found(values, options.hashed)}
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
    chunk_id = from_bytes or from_text
    return (chunk_id, None) if chunk_id is not None else (None, "metadata.id missing")
