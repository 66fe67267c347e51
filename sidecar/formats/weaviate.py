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

from dataclasses import dataclass, field
from typing import Any, Final

from sidecar.core.hits import Replacement, Route, RouteKind
from sidecar.formats.base import (
    MalformedBody,
    ResponseAdapter,
    Unreleasable,
    id_field_option,
    load_json,
    load_object,
    text_field_option,
)
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.hits import Field, HitLayout, Hits

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
    """Validates a body and numbers its objects in document order."""

    def __init__(self, hits: Hits) -> None:
        self._hits = hits

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
        parsed = _Object(self._hits.add(value) if carries else None, value)
        # In key order, so that positions follow the document.
        for key, item in value.items():
            if key == "_additional":
                if group is not None:
                    parsed.group = _Group(group, [self._object(hit) for hit in _hits(group)])
            elif (objects := _objects_in(item)) is not None:
                parsed.references[key] = [self._object(entry) for entry in objects]
        return parsed


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


class _Renderer:
    """Renders GraphQL responses for one selection."""

    def __init__(self, selection: Selection, block_generated: bool) -> None:
        self._selection = selection
        self._block_generated = block_generated

    def response(self, response: _Response) -> dict[str, Any]:
        """One GraphQL response with only what may be released."""
        envelope = response.envelope
        if not response.classes and not response.withheld:
            return envelope
        data = dict(envelope["data"])
        if response.classes:
            data["Get"] = {
                **data["Get"],
                **{key: self.class_result(objects) for key, objects in response.classes.items()},
            }
        if not response.withheld:
            return {**envelope, "data": data}
        data.update(dict.fromkeys(response.withheld))
        errors = [*(envelope.get("errors") or []), *map(_withheld_field, response.withheld)]
        return {**envelope, "data": data, "errors": errors}

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
        if position is not None and position not in self._selection:
            # Only a group object survives a rejection, as its group alone.
            return None if group is None else _redacted(parsed.value, group)
        value = parsed.value if position is None else self._selection.send(position, parsed.value)
        if group is None and not parsed.references:
            return value
        out = dict(value)
        if group is not None:
            out["_additional"] = {**value["_additional"], "group": group}
        for key, references in parsed.references.items():
            out[key] = [ref for ref in map(self._object, references) if ref is not None]
        return out

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
            or (
                parsed.position is not None
                and (
                    parsed.position not in self._selection
                    or self._selection.replaced(parsed.position)
                )
            )
            for parsed, value in zip(objects, rendered, strict=True)
        )
        if not removed:
            return
        if first["groupedResult"] is not None:
            _refuse_generated(self._block_generated)
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


def _refuse_generated(block: bool) -> None:
    if block:
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


@dataclass(eq=False)
class _WeaviateBody(HitBody):
    """Raises Unreleasable when ``generative="block"`` and generated text would
    outlive a removed or replaced object."""

    responses: tuple[_Response, ...]
    batch: bool
    block_generated: bool

    def _rebuild(self, selection: Selection) -> Any:
        renderer = _Renderer(selection, self.block_generated)
        rendered = [renderer.response(response) for response in self.responses]
        return rendered if self.batch else rendered[0]

    def _substituted(self, hit: Any, replacement: Replacement) -> dict[str, Any]:
        out = self._layout.substituted(hit, replacement)
        generate = _generate_of(out)
        if generate is not None and _generated_single(generate):
            # Generated from the text that was just replaced.
            _refuse_generated(self.block_generated)
            withheld = dict(generate)
            for key in ("singleResult", "debug"):
                if key in withheld:
                    withheld[key] = None
            withheld["error"] = GENERATIVE_WITHHELD
            out["_additional"] = {**out["_additional"], "generate": withheld}
        return out


class WeaviateFormat(ResponseAdapter[bool]):
    """Adapter for Weaviate's GraphQL search responses (``/v1/graphql`` and its batch).

    The chunk id is the object UUID (``_additional.id``), or the property
    ``id_field`` when set; the chunk text is the property ``text_field``.
    ``generative`` says what to do with generated text computed from objects
    the gate removed: "strip" clears it, "block" refuses the response.
    """

    name = "weaviate"

    def __init__(
        self, *, text_field: str = "text", id_field: str | None = None, generative: str = "strip"
    ) -> None:
        self.text_field = text_field_option(text_field)
        self.id_field = id_field_option(id_field)
        if generative not in GENERATIVE_MODES:
            raise ValueError(f"generative must be one of {', '.join(GENERATIVE_MODES)}")
        self.generative = generative
        if self.id_field is None:
            chunk_id = Field(("_additional", "id"), "_additional.id")
        else:
            chunk_id = Field((self.id_field,), f"property {self.id_field!r}")
        text = Field((self.text_field,), f"property {self.text_field!r}")
        self._layout = HitLayout("result object", chunk_id, text, None)

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

    def _shape(self, route: Route) -> bool | None:
        """Whether the route is the batch endpoint; None for routes not filtered."""
        if self.route_kind(route) is not RouteKind.FILTERED:
            return None
        return route.path.removesuffix("/").endswith("/batch")

    def _load(self, body: bytes, shape: bool) -> Any:
        if not shape:
            return load_object(body)
        document = load_json(body)
        if not isinstance(document, list):
            raise MalformedBody("a GraphQL batch response is not a JSON list")
        return document

    def _read(self, document: Any, shape: bool) -> _WeaviateBody:
        hits = Hits(self._layout)
        parser = _Parser(hits)
        if shape:
            responses = tuple(parser.response(item) for item in document)
        else:
            responses = (parser.response(document),)
        return _WeaviateBody(hits, responses, shape, self.generative == "block")
