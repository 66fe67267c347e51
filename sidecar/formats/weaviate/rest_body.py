"""Weaviate GraphQL responses, parsed and rendered: ``Get`` hits, groups, cross-references,
generative text, and the envelope around them.

``POST /v1/graphql`` answers ``{"data": {...}, "errors": [...]}``; ``POST
/v1/graphql/batch`` answers a list of those. Hits are the objects of
``data.Get.<Class>`` (any number of classes, under aliases too). Positions
number every checked object in document order: a hit, then the objects nested
in it (its cross-references, its group's hits), then the next hit.

A response is rebuilt from what is known to be safe, everything else goes:

- The envelope keeps ``data`` and ``errors``. Upstream errors may quote stored
  text (a module's error, a failed filter), so a non-empty ``errors`` list
  becomes one entry the gate writes (``UPSTREAM_ERROR``; GraphQL clients need a
  list of ``{message}``); ``extensions`` and any other key are dropped. The
  body reports the upstream's errors as its ``reported_error`` (``errors``),
  for the audit record.
- Under ``data``, ``Get`` is rebuilt and null stays null. ``Aggregate``,
  ``Explore`` and any other root field are computed over (or point at) objects
  the gate never checks: they become null with an ``errors`` entry, as GraphQL
  does for a field it cannot resolve. Aliases can rename root fields, so names
  prove nothing: another field aliased ``Get`` is read like one (its rows carry
  no object id and chunk text, so they are rejected), and ``__schema`` may be an
  aliased ``Get``, so it is withheld too. Strings (``__typename``) are dropped,
  here and under ``Get``; a value under ``Get`` that is neither a class
  result, null nor a string is a malformed body.
- A result object keeps its properties as the layout releases them (the text,
  the id, hashed and releasable ones), ``__typename`` and ``_additional`` with
  only ``_ADDITIONAL_KEYS``. Cross-references come back as lists of the
  referenced objects: those are other chunks, so each one is a candidate of its
  own and stays in the list only when admitted (the list itself goes out when
  its property is declared, like any other property). Without the schema a list of
  objects cannot be told from a nested ``object[]`` property, so those are
  checked the same way (and, carrying no id or text, are removed).
- ``_additional.group`` (``groupBy``): the result object stands for a group
  and is the group's first member. Its hits are candidates; when hits are
  removed, ``count``, ``minDistance`` and ``maxDistance`` are recomputed from
  the kept ones. Emptied groups, and groups whose hits were not selected
  (nothing in them can be checked), are dropped and the group ids of those
  after renumbered. ``groupedBy.value`` is a property value of the group's
  hits: it goes out only when that property is one the layout releases. When
  the group object carries anything of its own (properties,
  ``_additional.id`` ...) it is a candidate too; if rejected, those values
  become null and only its group is released.
- ``_additional.generate.groupedResult`` is generated from every object of the
  class result and sits on the first one. When any of them is removed,
  trimmed or replaced, ``generative="strip"`` moves the slot to the first
  released object with ``groupedResult`` null and ``error`` saying the gate
  withheld it; ``"block"`` refuses the whole response. A replaced hit's
  ``singleResult`` (and its debug prompt) was generated from the replaced
  text and is treated the same way.

Over-fetched class results are trimmed back to the app's limit: a plain
query's ``limits`` hold one entry per class result, ordered by response key
(see ``rest_request``).

Renderers copy only the objects they change; the parsed document is never
mutated, so ``render`` may be called any number of times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sidecar.core.hits import Replacement
from sidecar.formats.base import MalformedBody, ReportedError, Unreleasable
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.hits import FieldPath, Hits
from sidecar.formats.weaviate import errors as weaviate_errors

# What the gate writes into a generative "error" field it had to clear.
GENERATIVE_WITHHELD: Final = (
    "retrieval gate: generated text withheld, it was generated from objects the gate removed"
)
# The errors entry standing for what the database reported.
UPSTREAM_ERROR: Final = {
    "message": "retrieval gate: the database reported an error; its text is withheld"
}

# The keys of _additional a released object keeps: its own id, scores, vectors
# and timestamps, reranker scores, generated text (checked below) and its group
# (rebuilt). Module output computed from other objects or unchecked properties
# (featureProjection, answer, summary, nearestNeighbors, classification ...) and
# explainScore go.
_ADDITIONAL_KEYS: Final = frozenset(
    {
        "id",
        "distance",
        "certainty",
        "score",
        "vector",
        "vectors",
        "creationTimeUnix",
        "lastUpdateTimeUnix",
        "rerank",
        "generate",
        "group",
    }
)
_GENERATE_KEYS: Final = frozenset({"singleResult", "groupedResult", "error", "debug"})
_GROUP_KEYS: Final = frozenset({"id", "groupedBy", "count", "maxDistance", "minDistance", "hits"})


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
    """One GraphQL response: its envelope, its ``Get`` class results (None where a
    class result is null), the root fields withheld."""

    envelope: dict[str, Any]
    classes: dict[str, list[_Object] | None]
    withheld: tuple[str, ...]


class Parser:
    """Validates a body and numbers its objects in document order."""

    def __init__(self, hits: Hits) -> None:
        self._hits = hits

    def response(self, value: Any) -> _Response:
        """One GraphQL response, checked; raises MalformedBody."""
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
        classes: dict[str, list[_Object] | None] = {}
        withheld: list[str] = []
        for key, item in data.items():
            if item is None or isinstance(item, str):
                continue
            if key == "Get" and isinstance(item, dict):
                classes = self._get(item)
            else:
                withheld.append(key)
        return _Response(value, classes, tuple(withheld))

    def _get(self, value: dict[str, Any]) -> dict[str, list[_Object] | None]:
        classes: dict[str, list[_Object] | None] = {}
        for key, item in value.items():
            if isinstance(item, str):
                continue
            if item is not None and not isinstance(item, list):
                raise MalformedBody("a Get class result is not a list")
            classes[key] = None if item is None else [self._object(entry) for entry in item]
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


def reported(responses: Sequence[_Response]) -> ReportedError | None:
    """The errors ``responses`` report, all of them (``errors.reported``); None for none."""
    errors = [error for response in responses for error in response.envelope.get("errors") or ()]
    return weaviate_errors.reported(errors)


def sub_results(response: _Response) -> int:
    """The number of class results of a plain query's response: one limit each."""
    return len(response.classes)


@dataclass(frozen=True, slots=True)
class Release:
    """What goes out of an object beyond the hit's layout: ``released`` is the
    layout's (``HitLayout.released``), ``group_paths`` the property paths whose
    value a group's ``groupedBy`` may show, ``block_generated`` the
    ``generative="block"`` option."""

    released: Callable[[Any], Any]
    group_paths: frozenset[FieldPath]
    block_generated: bool


class _Renderer:
    """Renders GraphQL responses for one selection."""

    def __init__(self, selection: Selection, release: Release) -> None:
        self._selection = selection
        self._release = release

    def response(self, response: _Response, limits: tuple[int | None, ...]) -> dict[str, Any]:
        """One GraphQL response with only what may be released; ``limits`` has one
        entry per class result in response key order, or none."""
        envelope = response.envelope
        errors = envelope.get("errors")
        gate_errors = [UPSTREAM_ERROR] if errors else []
        gate_errors.extend(map(_withheld_field, response.withheld))
        out: dict[str, Any] = {}
        for key in envelope:
            if key == "data":
                out["data"] = self._data(response, limits)
            elif key == "errors":
                out["errors"] = gate_errors if gate_errors or errors is not None else None
        if gate_errors and "errors" not in out:
            out["errors"] = gate_errors
        return out

    def _data(self, response: _Response, limits: tuple[int | None, ...]) -> Any:
        data = response.envelope["data"]
        if data is None:
            return None
        out: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, str):
                continue
            if value is None or key in response.withheld:
                out[key] = None
            else:
                out[key] = self._get(response.classes, limits)
        return out

    def _get(
        self, classes: dict[str, list[_Object] | None], limits: tuple[int | None, ...]
    ) -> dict[str, Any]:
        # One limit per class result, by response key (none: nothing is trimmed).
        limit_of = dict(zip(sorted(classes), limits, strict=False))
        return {
            key: None if objects is None else self.class_result(objects, limit_of.get(key))
            for key, objects in classes.items()
        }

    def class_result(self, objects: list[_Object], limit: int | None) -> list[dict[str, Any]]:
        """A Get class result with only what may be released, at most ``limit`` objects."""
        rendered: list[dict[str, Any] | None] = []
        groups = dropped = sent = 0
        for parsed in objects:
            value = None if limit is not None and sent >= limit else self._object(parsed)
            if parsed.group is not None and value is None:
                dropped += 1
            elif value is not None and parsed.group is not None:
                if dropped:
                    value = _renumbered(value, groups)
                groups += 1
            sent += value is not None
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
            return None if group is None else self._redacted(parsed.value, group)
        if position is None:
            value = self._release.released(parsed.value)
        else:
            value = self._selection.send(position, parsed.value)
        out = dict(value)
        additional = value.get("_additional")
        if isinstance(additional, dict):
            out["_additional"] = _additional(additional)
            if group is not None:
                out["_additional"]["group"] = group
        for key, references in parsed.references.items():
            # A list of references is a property like any other: it goes out when
            # declared, present whether or not anything in it was removed.
            if key in out:
                out[key] = [ref for ref in map(self._object, references) if ref is not None]
        return out

    def _redacted(self, value: dict[str, Any], group: dict[str, Any]) -> dict[str, Any]:
        """A rejected group object: every value it would release is null, its group stays."""
        out: dict[str, Any] = dict.fromkeys(self._release.released(value))
        additional: dict[str, Any] = dict.fromkeys(_additional(value["_additional"]))
        additional["group"] = group
        out["_additional"] = additional
        return out

    def _group(self, group: _Group) -> dict[str, Any] | None:
        kept = [value for hit in group.hits if (value := self._object(hit)) is not None]
        if not kept:
            return None
        out = {key: value for key, value in group.value.items() if key in _GROUP_KEYS}
        out["hits"] = kept
        if "groupedBy" in out:
            out["groupedBy"] = self._grouped_by(out["groupedBy"])
        if len(kept) == len(group.hits):
            return out
        if "count" in out:
            out["count"] = len(kept)
        distances = [_distance(value) for value in kept]
        known = [d for d in distances if d is not None]
        complete = len(known) == len(distances)
        for key, pick in (("minDistance", min), ("maxDistance", max)):
            if key in out:
                out[key] = pick(known) if complete else None
        return out

    def _grouped_by(self, value: Any) -> dict[str, Any] | None:
        """``groupedBy``: its path, and its value where the property is one that goes out."""
        if not isinstance(value, dict):
            return None
        path = value.get("path")
        names = isinstance(path, list) and all(isinstance(step, str) for step in path)
        shown = isinstance(path, list) and names and tuple(path) in self._release.group_paths
        out = {}
        if "path" in value:
            out["path"] = path if names else None
        if "value" in value:
            out["value"] = value["value"] if shown else None
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
            refuse_generated(self._release.block_generated)
        carrier = next((i for i, value in enumerate(rendered) if value is not None), None)
        if carrier is None:
            return
        value = rendered[carrier]
        assert value is not None
        own = _generate_of(value) or {}
        # The slot keeps the shape the query selected; its text goes, the error says
        # why. Of the carrier's own values only its single answer stays: anything
        # else there (a provider's token counts) may describe the grouped answer.
        slot = (key for key in (*first, *own) if key in _GENERATE_KEYS)
        generate = {**dict.fromkeys(slot), "groupedResult": None}
        if "singleResult" in own:
            generate["singleResult"] = own["singleResult"]
        generate["error"] = GENERATIVE_WITHHELD
        additional = value.get("_additional") or {}
        rendered[carrier] = {**value, "_additional": {**additional, "generate": generate}}


def refuse_generated(block: bool) -> None:
    """Raise Unreleasable when generated text must block the response."""
    if block:
        raise Unreleasable(
            "generated_from_rejected_chunks",
            "the response carries text generated from objects the gate removed",
        )


def _additional(value: dict[str, Any]) -> dict[str, Any]:
    """``_additional`` with only the keys a released object keeps."""
    out = {key: item for key, item in value.items() if key in _ADDITIONAL_KEYS}
    generate = out.get("generate")
    if isinstance(generate, dict):
        out["generate"] = {key: item for key, item in generate.items() if key in _GENERATE_KEYS}
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
class WeaviateBody(HitBody):
    """Raises Unreleasable when ``generative="block"`` and generated text would
    outlive a removed or replaced object."""

    responses: tuple[_Response, ...]
    batch: bool
    release: Release

    def _rebuild(self, selection: Selection) -> Any:
        renderer = _Renderer(selection, self.release)
        limits = () if self.batch else selection.limits
        rendered = [renderer.response(response, limits) for response in self.responses]
        return rendered if self.batch else rendered[0]

    def _substituted(self, hit: Any, replacement: Replacement) -> dict[str, Any]:
        out = self._layout.substituted(hit, replacement)
        generate = _generate_of(out)
        if generate is not None and _generated_single(generate):
            # Generated from the text that was just replaced.
            refuse_generated(self.release.block_generated)
            withheld = dict(generate)
            for key in ("singleResult", "debug"):
                if key in withheld:
                    withheld[key] = None
            withheld["error"] = GENERATIVE_WITHHELD
            out["_additional"] = {**out["_additional"], "generate": withheld}
        return out
