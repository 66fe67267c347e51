"""Weaviate GraphQL responses: ``Get`` hits, grouped hits, cross-references, generative text.

``POST /v1/graphql`` answers ``{"data": {...}, "errors": [...]}``; ``POST
/v1/graphql/batch`` answers a list of those. Hits are the objects of
``data.Get.<Class>`` (any number of classes, under aliases too). Positions
number every checked object in document order: a hit, then the objects nested
in it (its cross-references, its group's hits), then the next hit.

What else the body holds, and why it is handled so:

- Cross-references come back as lists of the referenced objects, properties
  included. Those objects are other chunks, so each one is a candidate of its
  own and stays in the list only when admitted. Without the schema a list of
  objects cannot be told from a nested ``object[]`` property, so those are
  checked the same way (and, carrying no id or text, are removed).
- ``_additional.group`` (``groupBy``): the result object stands for a group and
  is the group's first member. Its hits are candidates; when hits are removed,
  ``count``, ``minDistance`` and ``maxDistance`` are recomputed from the kept
  ones. Emptied groups, and groups whose hits were not selected (nothing in them
  can be checked), are dropped and the group ids of those after renumbered.
  When the group object carries anything of its own (properties,
  ``_additional.id`` ...) it is a candidate too; if rejected, those values
  become null and only its group is released.
- ``_additional.generate.groupedResult`` is generated from every object of the
  class result and sits on the first one. When any of them is removed or
  replaced, ``generative="strip"`` moves the slot to the first released object
  with ``groupedResult`` null and ``error`` saying the gate withheld it;
  ``"block"`` refuses the whole response. A replaced hit's ``singleResult``
  (and its debug prompt) was generated from the replaced text and is treated
  the same way.
- Only the root field ``Get`` is read. ``Aggregate`` and ``Explore`` results,
  and any other root field, are computed over (or point at) objects the gate
  never checks: they are set to null with an entry in ``errors``, as GraphQL
  does for a field it cannot resolve. Aliases can rename root fields, so names
  prove nothing: another field aliased ``Get`` is read like one (its rows carry
  no object id and chunk text, so they are rejected), and ``__schema`` may be
  an aliased ``Get``, so it is withheld too. A value under ``Get`` that is not
  a class result is a malformed body.
- Strings anywhere a field could only be ``__typename`` pass unchanged.

Weaviate objects have no free-form metadata object (a hit holds exactly the
class properties the query selected), so a substituted hit is not marked with
``SUBSTITUTED_FOR``.

Renderers copy only the objects they change; the parsed document is never
mutated, so ``render`` may be called any number of times.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.formats._common import (
    check_fields,
    load_object,
    make_candidate,
    no_limits,
    parse_guarded,
    usable_id,
    usable_text,
)
from sidecar.formats.base import MalformedBody, ParsedBody, Unreleasable

GENERATIVE_MODES: Final = ("strip", "block")

# What the gate writes into a generative "error" field it had to clear.
GENERATIVE_WITHHELD: Final = (
    "retrieval gate: generated text withheld, it was generated from objects the gate removed"
)

# First path segments under /v1 whose every route hands out stored values the
# gate does not check: backups and exports of whole collections, the REST
# Search API (/v1/search/{c}/..., /v1/aggregate/{c}) and MCP tool calls.
_CONTENT_ROOTS: Final = frozenset({"backups", "export", "search", "aggregate", "mcp"})
# First path segments whose GET/HEAD read metadata only; other methods write.
_READ_ROOTS: Final = frozenset(
    {
        ".well-known",
        "meta",
        "schema",
        "nodes",
        "cluster",
        "aliases",
        "users",
        "authz",
        "replication",
        "namespaces",
        "tasks",
        "classifications",
    }
)


def _withheld_field(key: str) -> dict[str, Any]:
    """The ``errors`` entry for a root field the gate does not release."""
    return {
        "message": f"retrieval gate: {key} is not released, only Get results are filtered",
        "path": [key],
    }


@dataclass(slots=True)
class _Object:
    """A parsed result object: a hit, a referenced object, a group hit or a group.

    ``position`` is None for a group object that carries nothing but its group.
    """

    position: int | None
    value: dict[str, Any]
    references: dict[str, list[_Object]] = field(default_factory=dict)
    group: _Group | None = None


@dataclass(slots=True)
class _Group:
    value: dict[str, Any]  # the _additional.group object
    hits: list[_Object]


@dataclass(slots=True)
class _Response:
    """One GraphQL response: its envelope, its ``Get`` classes, the root fields withheld."""

    envelope: dict[str, Any]
    classes: dict[str, list[_Object]]
    withheld: tuple[str, ...]


class _Parser:
    """Validates a body, numbers its objects in document order and makes their Candidates."""

    def __init__(self, text_field: str, id_field: str | None) -> None:
        self.candidates: list[Candidate] = []
        self._text_field = text_field
        self._id_field = id_field

    def response(self, value: Any) -> _Response:
        if not isinstance(value, dict):
            raise MalformedBody("a GraphQL response is not a JSON object")
        if "data" not in value and "errors" not in value:
            raise MalformedBody("a GraphQL response has neither 'data' nor 'errors'")
        if not isinstance(value.get("errors"), list | None):
            raise MalformedBody("'errors' is not a list")
        data = value.get("data")
        if data is None:
            return _Response(value, {}, ())
        if not isinstance(data, dict):
            raise MalformedBody("'data' is not a JSON object")
        classes: dict[str, list[_Object]] = {}
        withheld: list[str] = []
        for key, item in data.items():
            # Null needs nothing; a string can only be a __typename.
            if item is None or isinstance(item, str):
                continue
            if key == "Get" and isinstance(item, dict):
                classes = self._get(item)
            else:
                withheld.append(key)
        return _Response(value, classes, tuple(withheld))

    def _get(self, value: dict[str, Any]) -> dict[str, list[_Object]]:
        classes: dict[str, list[_Object]] = {}
        for key, item in value.items():
            if item is None or isinstance(item, str):
                continue
            if not isinstance(item, list):
                raise MalformedBody("a Get class result is not a list")
            classes[key] = [self._object(entry) for entry in item]
        return classes

    def _object(self, value: Any) -> _Object:
        if not isinstance(value, dict):
            raise MalformedBody("a result object is not a JSON object")
        additional = value.get("_additional")
        if not isinstance(additional, dict | None):
            raise MalformedBody("'_additional' is not a JSON object")
        group = None if additional is None else additional.get("group")
        if not isinstance(group, dict | None):
            raise MalformedBody("'_additional.group' is not a JSON object")
        # A group object is its first member: check it when it carries any of it.
        carries = group is None or _carries_more_than_its_group(value)
        parsed = _Object(self._add(value) if carries else None, value)
        # In key order, so that positions follow the document.
        for key, item in value.items():
            if key == "_additional":
                if group is not None:
                    parsed.group = _Group(group, [self._object(hit) for hit in _hits(group)])
            elif (objects := _objects_in(item)) is not None:
                parsed.references[key] = [self._object(entry) for entry in objects]
        return parsed

    def _add(self, value: dict[str, Any]) -> int:
        position = len(self.candidates)
        # Labels name the field, never its value: they end up in audit records.
        if self._id_field is None:
            additional = value.get("_additional") or {}
            chunk_id = usable_id(additional.get("id"), "_additional.id")
        else:
            chunk_id = usable_id(value.get(self._id_field), f"property {self._id_field!r}")
        text = usable_text(value.get(self._text_field), f"property {self._text_field!r}")
        self.candidates.append(make_candidate(position, chunk_id, text))
        return position


def _carries_more_than_its_group(value: dict[str, Any]) -> bool:
    own = (item for key, item in value.items() if key != "_additional")
    extra = (item for key, item in value["_additional"].items() if key != "group")
    return any(item is not None for item in (*own, *extra))


def _hits(group: dict[str, Any]) -> list[Any]:
    hits = group.get("hits")
    if hits is None:
        # Hits not selected: nothing in the group can be checked, so none is kept.
        return []
    if not isinstance(hits, list):
        raise MalformedBody("'_additional.group.hits' is not a list")
    return hits


def _objects_in(value: Any) -> list[Any] | None:
    """The objects of a property holding a list of objects (a cross-reference), else None."""
    if not isinstance(value, list) or not any(isinstance(item, dict) for item in value):
        return None
    if not all(isinstance(item, dict) for item in value):
        raise MalformedBody("a property mixes objects with other values")
    return value


class _Selection:
    """Which positions are kept, their substitutes, and what was released."""

    def __init__(
        self,
        keep: Collection[int],
        replacements: Mapping[int, Replacement],
        text_field: str,
        id_field: str | None,
        block_generated: bool,
    ) -> None:
        self.keep = frozenset(keep)
        self.replacements = replacements
        self.released: list[int] = []
        self._text_field = text_field
        self._id_field = id_field
        self._block_generated = block_generated

    def class_result(self, objects: list[_Object]) -> list[dict[str, Any]]:
        """A Get class result with only what may be released."""
        rendered: list[dict[str, Any] | None] = []
        groups = dropped = 0
        for parsed in objects:
            value = self._object(parsed)
            if parsed.group is not None and value is None:
                dropped += 1
            elif value is not None and parsed.group is not None:
                if dropped:
                    value = _renumbered(value, groups)
                groups += 1
            rendered.append(value)
        self._withhold_generated(objects, rendered)
        return [value for value in rendered if value is not None]

    def _object(self, parsed: _Object) -> dict[str, Any] | None:
        group = None
        if parsed.group is not None:
            group = self._group(parsed.group)
            if group is None:
                return None
        position = parsed.position
        if position is not None and position not in self.keep:
            # Only a group object survives a rejection, as its group alone.
            return None if group is None else _redacted(parsed.value, group)
        if position is not None:
            self.released.append(position)
        value = parsed.value
        replacement = None if position is None else self.replacements.get(position)
        if replacement is None and group is None and not parsed.references:
            return value
        out = dict(value)
        if group is not None:
            out["_additional"] = {**value["_additional"], "group": group}
        for key, references in parsed.references.items():
            out[key] = [ref for ref in map(self._object, references) if ref is not None]
        if replacement is not None:
            self._substitute(out, replacement)
        return out

    def _substitute(self, out: dict[str, Any], replacement: Replacement) -> None:
        out[self._text_field] = replacement.text
        if self._id_field is not None:
            out[self._id_field] = replacement.chunk_id
        else:
            out["_additional"] = {**out["_additional"], "id": replacement.chunk_id}
        generate = _generate_of(out)
        if generate is not None and _generated_single(generate):
            # Generated from the text that was just replaced.
            self._refuse_generated()
            withheld = dict(generate)
            for key in ("singleResult", "debug"):
                if key in withheld:
                    withheld[key] = None
            withheld["error"] = GENERATIVE_WITHHELD
            out["_additional"] = {**out["_additional"], "generate": withheld}

    def _group(self, group: _Group) -> dict[str, Any] | None:
        kept = [(hit, value) for hit in group.hits if (value := self._object(hit)) is not None]
        if not kept:
            return None
        out = {**group.value, "hits": [value for _, value in kept]}
        if len(kept) == len(group.hits):
            return out
        if "count" in out:
            out["count"] = len(kept)
        distances = [_distance(value) for _, value in kept]
        known = [d for d in distances if d is not None]
        complete = len(known) == len(distances)
        for key, pick in (("minDistance", min), ("maxDistance", max)):
            if key in out:
                out[key] = pick(known) if complete else None
        return out

    def _withhold_generated(
        self, objects: list[_Object], rendered: list[dict[str, Any] | None]
    ) -> None:
        """Clear a grouped generated answer that was generated from removed objects."""
        if not objects:
            return
        first = _generate_of(objects[0].value)
        if first is None or "groupedResult" not in first:
            return
        if first["groupedResult"] is None and first.get("error") is None:
            return
        removed = any(
            value is None
            or (parsed.position is not None and parsed.position not in self.keep)
            or parsed.position in self.replacements
            for parsed, value in zip(objects, rendered, strict=True)
        )
        if not removed:
            return
        if first["groupedResult"] is not None:
            self._refuse_generated()
        carrier = next((i for i, value in enumerate(rendered) if value is not None), None)
        if carrier is None:
            return
        value = rendered[carrier]
        assert value is not None
        own = _generate_of(value) or {}
        # The slot keeps the shape the query selected; its text goes, the error says
        # why. Of the carrier's own values only its single answer stays: anything
        # else there (a provider's token counts) may describe the grouped answer.
        generate = {**dict.fromkeys(first), **dict.fromkeys(own), "groupedResult": None}
        if "singleResult" in own:
            generate["singleResult"] = own["singleResult"]
        generate["error"] = GENERATIVE_WITHHELD
        additional = value.get("_additional") or {}
        rendered[carrier] = {**value, "_additional": {**additional, "generate": generate}}

    def _refuse_generated(self) -> None:
        if self._block_generated:
            raise Unreleasable(
                "generated_from_rejected_chunks",
                "the response carries text generated from objects the gate removed",
            )


def _redacted(value: dict[str, Any], group: dict[str, Any]) -> dict[str, Any]:
    """A rejected group object: every value of its own is null, its group stays."""
    additional: dict[str, Any] = dict.fromkeys(value["_additional"])
    additional["group"] = group
    out: dict[str, Any] = dict.fromkeys(value)
    out["_additional"] = additional
    return out


def _renumbered(value: dict[str, Any], group_id: int) -> dict[str, Any]:
    """The group object with its group id counting only released groups."""
    group = value["_additional"]["group"]
    if "id" not in group:
        return value
    return {**value, "_additional": {**value["_additional"], "group": {**group, "id": group_id}}}


def _generate_of(value: dict[str, Any]) -> dict[str, Any] | None:
    additional = value.get("_additional")
    generate = additional.get("generate") if isinstance(additional, dict) else None
    return generate if isinstance(generate, dict) else None


def _generated_single(generate: dict[str, Any]) -> bool:
    return generate.get("singleResult") is not None or generate.get("debug") is not None


def _distance(value: dict[str, Any]) -> float | None:
    additional = value.get("_additional")
    distance = additional.get("distance") if isinstance(additional, dict) else None
    if isinstance(distance, bool) or not isinstance(distance, int | float):
        return None
    return distance


@dataclass(frozen=True, slots=True)
class _WeaviateBody:
    candidates: Sequence[Candidate]
    _responses: tuple[_Response, ...]
    _batch: bool
    _text_field: str
    _id_field: str | None
    _block_generated: bool

    def render(
        self,
        keep: Collection[int],
        limits: Sequence[int | None] | None = None,
        replacements: Mapping[int, Replacement] | None = None,
    ) -> bytes:
        """Serialise the body with only the objects whose position is in ``keep``.

        See the module docstring for what happens to groups, references,
        generated text and other root fields. A replaced hit gets the
        substitute's text and id (``_additional.id``, or ``id_field``). Raises
        Unreleasable when ``generative="block"`` and generated text would
        outlive a removed object.
        """
        no_limits(limits)
        selection = self._selection(keep, replacements)
        rendered = [self._response(response, selection) for response in self._responses]
        return orjson.dumps(rendered if self._batch else rendered[0])

    def released_positions(
        self, keep: Collection[int], limits: Sequence[int | None] | None = None
    ) -> list[int]:
        """The positions ``render`` sends, in body order.

        Kept objects nested in a removed one (its references, its group's
        hits) are not sent.
        """
        no_limits(limits)
        selection = self._selection(keep, None)
        for response in self._responses:
            self._response(response, selection)
        return sorted(selection.released)

    def _selection(
        self, keep: Collection[int], replacements: Mapping[int, Replacement] | None
    ) -> _Selection:
        return _Selection(
            keep, replacements or {}, self._text_field, self._id_field, self._block_generated
        )

    def _response(self, response: _Response, selection: _Selection) -> dict[str, Any]:
        envelope = response.envelope
        if not response.classes and not response.withheld:
            return envelope
        data = dict(envelope["data"])
        if response.classes:
            data["Get"] = {
                **data["Get"],
                **{
                    key: selection.class_result(objects)
                    for key, objects in response.classes.items()
                },
            }
        if not response.withheld:
            return {**envelope, "data": data}
        data.update(dict.fromkeys(response.withheld))
        errors = [*(envelope.get("errors") or []), *map(_withheld_field, response.withheld)]
        return {**envelope, "data": data, "errors": errors}


class WeaviateFormat:
    """Adapter for Weaviate's GraphQL search responses (``/v1/graphql`` and its batch).

    The chunk id is the object UUID (``_additional.id``), or the property
    ``id_field`` when set; the chunk text is the property ``text_field``.
    ``generative`` says what to do with generated text computed from objects
    the gate removed: "strip" clears it, "block" refuses the response.
    """

    def __init__(
        self, *, text_field: str = "text", id_field: str | None = None, generative: str = "strip"
    ) -> None:
        check_fields(text_field, id_field)
        if generative not in GENERATIVE_MODES:
            raise ValueError(f"generative must be one of {', '.join(GENERATIVE_MODES)}")
        self.text_field = text_field
        self.id_field = id_field
        self.generative = generative

    @property
    def name(self) -> str:
        """Short stable name, used as the ``format`` metric label."""
        return "weaviate"

    def route_kind(self, route: Route) -> RouteKind | None:
        """What a route under ``/v1`` does; None for paths outside Weaviate's API.

        FILTERED: POST ``/v1/graphql`` and ``/v1/graphql/batch``. CONTENT: REST
        object reads, backups, exports, the REST search and aggregate API and
        MCP (all return stored values past the per-chunk check), and GETs of
        module-defined endpoints. READ: GET/HEAD of metadata, schema, cluster,
        user and role endpoints, permission checks and tokenisation. WRITE:
        everything else on those roots, batches and object changes.
        """
        segments = route.path.removesuffix("/").split("/")
        if segments[:2] != ["", "v1"] or not all(segments[2:]):
            return None
        rest = segments[2:]
        method = route.method.upper()
        reads = method in ("GET", "HEAD")
        if not rest:
            # The root lists the endpoints.
            return RouteKind.READ if reads else RouteKind.WRITE
        root = rest[0]
        if root == "graphql":
            if method == "POST" and rest[1:] in ([], ["batch"]):
                return RouteKind.FILTERED
            return RouteKind.CONTENT if reads else RouteKind.WRITE
        if root in _CONTENT_ROOTS:
            return RouteKind.CONTENT
        if root in ("objects", "modules"):
            return RouteKind.CONTENT if reads else RouteKind.WRITE
        if root == "batch":
            return RouteKind.WRITE
        if root == "tokenize":
            # Tokenises the text in the request; touches no stored object.
            return RouteKind.READ
        if root in _READ_ROOTS:
            if reads or (root == "authz" and rest[-1] == "has-permission"):
                return RouteKind.READ
            return RouteKind.WRITE
        return None

    def parse(self, body: bytes, route: Route) -> ParsedBody:
        """Parse a successful response body; raise MalformedBody if it is not one.

        Raises ValueError if ``route`` is not one this format filters.
        """
        if self.route_kind(route) is not RouteKind.FILTERED:
            raise ValueError("route is not filtered by the weaviate format")
        batch = route.path.removesuffix("/").endswith("/batch")
        return parse_guarded(self.name, lambda: self._parse(body, batch))

    def _parse(self, body: bytes, batch: bool) -> _WeaviateBody:
        parser = _Parser(self.text_field, self.id_field)
        if batch:
            document = orjson.loads(body)
            if not isinstance(document, list):
                raise MalformedBody("a GraphQL batch response is not a JSON list")
            responses = tuple(parser.response(item) for item in document)
        else:
            responses = (parser.response(load_object(body)),)
        return _WeaviateBody(
            tuple(parser.candidates),
            responses,
            batch,
            self.text_field,
            self.id_field,
            self.generative == "block",
        )
