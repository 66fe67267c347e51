"""A response format described by configuration: routes and selectors.

For in-house retrieval APIs that no built-in adapter knows. Two layouts:

- *hits*: ``hits`` (ending in ``[*]``) finds the hit objects; ``id`` and
  ``text`` are selectors relative to one hit.
- *parallel arrays* (Chroma-like): ``ids`` finds the ids, ``texts`` the texts
  at the same indexes, and each ``parallel`` selector another array aligned
  with the ids (scores, metadata ...), filtered by the same indexes.

A *hit list* is each array matched by the last ``[*]`` of ``hits`` (or
``ids``); with nested wildcards (``$.batches[*].hits[*]``, ``$.ids[*][*]``)
a body has several, numbered through in document order. The ``texts`` and
``parallel`` arrays pair with the ids array whose ``[*]`` steps took the same
indexes, and must have its length.

``count_fields`` are numbers that count hits. Each is set to the number of
kept hits in the hit lists it encloses: ``$.total`` counts all of them,
``$.batches[*].total`` those of its own batch. ``remove_fields`` are values
computed over the whole match set (facets, aggregations, answer text): the
gate can vouch for none of them, even when every returned hit passes, so they
are always removed; that also keeps the filtered body's shape from telling
whether anything was filtered.

Options are checked when the format is built; a body that does not fit the
selectors is MalformedBody when it is parsed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

import orjson

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.formats._common import (
    kept_in_order,
    make_candidate,
    no_limits,
    parse_guarded,
    usable_id,
    usable_text,
)
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody, ParsedBody
from sidecar.formats.selectors import EACH, Match, Path, Selector

_NAME: Final = re.compile(r"[a-z0-9_-]{1,32}")
_METHOD: Final = re.compile(r"[A-Za-z]+")
_PLACEHOLDER: Final = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
# Characters a literal template segment may not hold: they would be encoded,
# ambiguous or a query, and the gate only ever sees canonical paths.
_NOT_LITERAL: Final = re.compile(r"[{}%?#\\\s]")


@dataclass(frozen=True, slots=True)
class _RouteTemplate:
    """``METHOD /path/{x}``: a method and path segments; None stands for a ``{x}``."""

    method: str
    segments: tuple[str | None, ...]

    @classmethod
    def parse(cls, text: str, option: str) -> _RouteTemplate:
        method, _, path = text.partition(" ")
        if not _METHOD.fullmatch(method) or not path.startswith("/"):
            raise ValueError(f"{option}: expected 'METHOD /path', got {text!r}")
        segments: list[str | None] = []
        for segment in path.removesuffix("/").split("/")[1:]:
            if _PLACEHOLDER.fullmatch(segment):
                segments.append(None)
            elif not segment or segment in (".", "..") or _NOT_LITERAL.search(segment):
                raise ValueError(
                    f"{option}: path segment {segment!r} of {text!r} is neither a literal "
                    "nor a whole-segment {placeholder}"
                )
            else:
                segments.append(segment)
        return cls(method.upper(), tuple(segments))

    def matches(self, route: Route) -> bool:
        """Method and path match exactly (case included); one trailing slash is ignored.

        Case is not folded so that a route matches exactly when the per-route
        settings (``routes`` prefixes: modes) match it; a case variant is a
        route no format knows, which the request policy refuses.
        """
        if route.method.upper() != self.method or not route.path.startswith("/"):
            return False
        segments = route.path.removesuffix("/").split("/")[1:]
        return len(segments) == len(self.segments) and all(
            bool(segment) if expected is None else segment == expected
            for segment, expected in zip(segments, self.segments, strict=True)
        )


def _selector(option: str, value: object) -> Selector:
    if not isinstance(value, str):
        raise ValueError(f"{option}: expected a selector string")
    try:
        return Selector.parse(value)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def _strings(option: str, value: object) -> list[str]:
    # A bare string is a Sequence[str] too; in a TOML file it is a mistake.
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"{option}: expected a list of strings")
    if not all(isinstance(item, str) for item in value):
        raise ValueError(f"{option}: expected a list of strings")
    return list(value)


def _hit_list(option: str, value: object) -> Selector:
    selector = _selector(option, value)
    if not selector.steps or selector.steps[-1] is not EACH:
        raise ValueError(f"{option}: selector {selector.text!r} must end with [*]")
    return selector


def _field(option: str, value: object, *, relative: bool) -> Selector:
    selector = _selector(option, value)
    if not selector.steps or selector.steps[-1] is EACH:
        raise ValueError(f"{option}: selector {selector.text!r} must end with a field name")
    if relative and selector.wildcards:
        raise ValueError(f"{option}: selector {selector.text!r} must select one value (no [*])")
    return selector


class _Role(Enum):
    """What the entries of a filtered array are, for placing a replacement."""

    HIT = "hit"
    ID = "id"
    TEXT = "text"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class _Column:
    """One array filtered by the kept indexes of its hit list."""

    path: Path
    items: list[Any]
    role: _Role


@dataclass(frozen=True, slots=True)
class _HitList:
    """The arrays of one hit list (the hits, or the ids and their aligned arrays)."""

    start: int  # position of the first entry
    length: int
    indexes: tuple[int, ...]  # what the [*] steps above the list took
    columns: tuple[_Column, ...]


@dataclass(frozen=True, slots=True)
class _Count:
    path: Path
    lists: tuple[int, ...]  # the hit lists (indexes into _GenericBody._lists) it counts


_DELETE: Final = object()


def _rebuild(value: Any, edits: Mapping[Path, Any]) -> Any:
    """``value`` with each path set to its edit (or removed, for _DELETE).

    Only the containers on edited paths are copied; no edited path lies below
    another (the options are checked for that), so the order does not matter.
    """
    if () in edits:
        return edits[()]
    children: dict[str | int, dict[Path, Any]] = {}
    for path, edit in edits.items():
        children.setdefault(path[0], {})[path[1:]] = edit
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    for key, sub in children.items():
        if sub.get(()) is _DELETE:
            del copy[key]
        else:
            copy[key] = _rebuild(value[key], sub)
    return copy


def _assign(value: Any, steps: Sequence[Any], new: Any) -> dict[str, Any]:
    """A copy of the object ``value`` with ``new`` at the field path ``steps``.

    Missing or null objects on the way are created. Only a hit whose id or text
    was not found can need that; the gate admits no such hit, but a caller of
    ``render`` may still name one.
    """
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise MalformedBody("a replacement cannot be placed in this hit")
    first, *rest = steps
    return {**value, first: _assign(value.get(first), rest, new) if rest else new}


def _id_like(old: Any, new: str) -> Any:
    """``new`` as an integer when the id it replaces was one: the API's id type stays."""
    if isinstance(old, int) and not isinstance(old, bool) and new.isascii() and new.isdigit():
        number = int(new)
        if str(number) == new:
            return number
    return new


@dataclass(frozen=True, slots=True)
class _Layout:
    """The checked selectors of a GenericFormat."""

    lists: Selector  # hits or ids
    hit_id: Selector | None  # hits layout: relative to a hit
    hit_text: Selector | None
    texts: Selector | None  # parallel layout
    parallel: tuple[Selector, ...]
    counts: tuple[Selector, ...]
    removes: tuple[Selector, ...]


@dataclass(frozen=True, slots=True)
class _GenericBody:
    candidates: Sequence[Candidate]
    _document: Any
    _layout: _Layout
    _lists: tuple[_HitList, ...]
    _counts: tuple[_Count, ...]
    _removes: tuple[Path, ...]

    def render(
        self,
        keep: Collection[int],
        limits: Sequence[int | None] | None = None,
        replacements: Mapping[int, Replacement] | None = None,
    ) -> bytes:
        """Serialise the body with only the hits whose position is in ``keep``.

        Every array of a hit list keeps the same indexes; count fields become
        the number of kept hits they count; remove fields are left out. A
        replaced hit gets the substitute's id and text where they were found
        (see ``GenericFormat``).
        """
        no_limits(limits)
        kept = frozenset(keep)
        replacements = replacements or {}
        edits: dict[Path, Any] = {}
        survivors: list[int] = []
        for hit_list in self._lists:
            positions = range(hit_list.start, hit_list.start + hit_list.length)
            kept_here = kept_in_order(positions, kept)
            survivors.append(len(kept_here))
            for column in hit_list.columns:
                edits[column.path] = [
                    self._entry(
                        column.role,
                        column.items[position - hit_list.start],
                        replacements.get(position),
                    )
                    for position in kept_here
                ]
        for count in self._counts:
            edits[count.path] = sum(survivors[i] for i in count.lists)
        for path in self._removes:
            edits[path] = _DELETE
        return orjson.dumps(_rebuild(self._document, edits))

    def released_positions(
        self, keep: Collection[int], limits: Sequence[int | None] | None = None
    ) -> list[int]:
        """The positions ``render`` sends, in body order."""
        no_limits(limits)
        return kept_in_order(range(len(self.candidates)), keep)

    def _entry(self, role: _Role, item: Any, replacement: Replacement | None) -> Any:
        if replacement is None or role is _Role.OTHER:
            return item
        if role is _Role.ID:
            return _id_like(item, replacement.chunk_id)
        if role is _Role.TEXT:
            return replacement.text
        return self._replaced_hit(item, replacement)

    def _replaced_hit(self, hit: dict[str, Any], replacement: Replacement) -> dict[str, Any]:
        hit_id, hit_text = self._layout.hit_id, self._layout.hit_text
        assert hit_id is not None and hit_text is not None  # HIT columns: hits layout
        old_id = _value(hit_id, hit)
        substitute = _assign(hit, hit_id.steps, _id_like(old_id, replacement.chunk_id))
        # The marker goes next to the text, in the hit's own object for it.
        parent = [*hit_text.steps[:-1], SUBSTITUTED_FOR]
        substitute = _assign(substitute, parent, old_id)
        return _assign(substitute, hit_text.steps, replacement.text)


def _value(selector: Selector, hit: Any) -> Any:
    """The value of a one-value selector in ``hit``; None when it is not there."""
    found = selector.find(hit)
    return found[0].value if found else None


class GenericFormat:
    """Adapter for a JSON search API described by routes and selectors.

    Exactly one layout is given: ``hits``, ``id`` and ``text`` (hit objects),
    or ``ids`` and ``texts`` with optional ``parallel`` arrays. The chunk id
    and text are read with these selectors; ``text_field`` and ``id_field``
    are accepted so that every format is built the same way, but not used.

    A replacement sets the id and text where they were found (an integer id
    stays an integer when the new id is one). In the hits layout the object
    holding the text also gets ``retrieval_gate_substituted_for``, the old id;
    parallel arrays have no object for it.
    """

    def __init__(
        self,
        *,
        name: str,
        routes: Sequence[str],
        hits: str | None = None,
        id: str | None = None,  # shadows a builtin: it is the configuration key's name
        text: str | None = None,
        ids: str | None = None,
        texts: str | None = None,
        parallel: Sequence[str] = (),
        count_fields: Sequence[str] = (),
        remove_fields: Sequence[str] = (),
        text_field: str = "text",
        id_field: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError("name: expected 1 to 32 of a-z, 0-9, '_' and '-'")
        if not isinstance(text_field, str) or not (id_field is None or isinstance(id_field, str)):
            raise ValueError("text_field, id_field: expected strings")
        route_texts = _strings("routes", routes)
        if not route_texts:
            raise ValueError("routes: at least one route is needed")
        self._name = name
        self._routes = tuple(
            _RouteTemplate.parse(route, f"routes[{i}]") for i, route in enumerate(route_texts)
        )
        self._layout = self._checked_layout(
            hits, id, text, ids, texts, parallel, count_fields, remove_fields
        )

    @staticmethod
    def _checked_layout(
        hits: str | None,
        hit_id: str | None,
        hit_text: str | None,
        ids: str | None,
        texts: str | None,
        parallel: Sequence[str],
        count_fields: Sequence[str],
        remove_fields: Sequence[str],
    ) -> _Layout:
        parallel_texts = _strings("parallel", parallel)
        layout_id: Selector | None = None
        layout_text: Selector | None = None
        aligned: dict[str, Selector] = {}
        if hits is not None and ids is None and texts is None and not parallel_texts:
            if hit_id is None or hit_text is None:
                raise ValueError("id, text: both are needed with hits")
            lists = _hit_list("hits", hits)
            layout_id = _field("id", hit_id, relative=True)
            layout_text = _field("text", hit_text, relative=True)
        elif ids is not None and hits is None and hit_id is None and hit_text is None:
            if texts is None:
                raise ValueError("texts: needed with ids")
            lists = _hit_list("ids", ids)
            aligned["texts"] = _hit_list("texts", texts)
            for i, item in enumerate(parallel_texts):
                aligned[f"parallel[{i}]"] = _hit_list(f"parallel[{i}]", item)
            for option, selector in aligned.items():
                if selector.wildcards != lists.wildcards:
                    raise ValueError(
                        f"{option}: selector {selector.text!r} must have as many [*] as ids"
                    )
        else:
            raise ValueError("hits, ids: give either hits, id and text, or ids, texts and parallel")
        counts = {
            f"count_fields[{i}]": _field(f"count_fields[{i}]", item, relative=False)
            for i, item in enumerate(_strings("count_fields", count_fields))
        }
        removes = {
            f"remove_fields[{i}]": _field(f"remove_fields[{i}]", item, relative=False)
            for i, item in enumerate(_strings("remove_fields", remove_fields))
        }
        container = lists.head(len(lists.steps) - 1)
        for option, selector in counts.items():
            # The count's own [*] steps must be those above the hit lists, so
            # that each count encloses whole hit lists.
            last_each = max((i for i, s in enumerate(selector.steps) if s is EACH), default=-1)
            if not container.startswith(selector.head(last_each + 1)):
                raise ValueError(
                    f"{option}: selector {selector.text!r} does not enclose the hit lists "
                    f"of {lists.text!r}"
                )
        # Every array that is filtered, every count that is set and every field
        # that is removed must be a separate place in the body: an edit inside
        # another would be lost or would undo it.
        places = {
            "hits" if hits is not None else "ids": container,
            **{option: s.head(len(s.steps) - 1) for option, s in aligned.items()},
            **counts,
            **removes,
        }
        options = list(places)
        for i, first in enumerate(options):
            for second in options[i + 1 :]:
                if places[first].startswith(places[second]) or places[second].startswith(
                    places[first]
                ):
                    raise ValueError(
                        f"{second}: selector {places[second].text!r} overlaps "
                        f"{first} ({places[first].text!r})"
                    )
        return _Layout(
            lists,
            layout_id,
            layout_text,
            aligned.get("texts"),
            tuple(selector for option, selector in aligned.items() if option != "texts"),
            tuple(counts.values()),
            tuple(removes.values()),
        )

    @property
    def name(self) -> str:
        """Short stable name, used as the ``format`` metric label."""
        return self._name

    def route_kind(self, route: Route) -> RouteKind | None:
        """FILTERED for the configured routes; None otherwise (nothing else is known)."""
        if any(template.matches(route) for template in self._routes):
            return RouteKind.FILTERED
        return None

    def parse(self, body: bytes, route: Route) -> ParsedBody:
        """Parse a successful response body; raise MalformedBody if it is not one.

        Raises ValueError if ``route`` is not one of the configured routes.
        """
        if self.route_kind(route) is None:
            raise ValueError(f"route is not handled by the {self._name} format")
        return parse_guarded(self._name, lambda: self._parse(body))

    def _parse(self, body: bytes) -> _GenericBody:
        # Any JSON value: an in-house API may answer with a bare array ("$[*]").
        document = orjson.loads(body)
        layout = self._layout
        found = _lists(layout.lists, document)
        if layout.hit_id is not None and layout.hit_text is not None:
            hit_id, hit_text = layout.hit_id, layout.hit_text
            columns = [[_Column(match.path, match.value, _Role.HIT)] for match in found]
            entries = [[_hit(hit, hit_id, hit_text) for hit in match.value] for match in found]
        else:
            columns, entries = self._columns(document, found)
        candidates: list[Candidate] = []
        lists: list[_HitList] = []
        for match, list_columns, list_entries in zip(found, columns, entries, strict=True):
            start = len(candidates)
            candidates.extend(
                make_candidate(start + i, chunk_id, text)
                for i, (chunk_id, text) in enumerate(list_entries)
            )
            lists.append(_HitList(start, len(match.value), match.indexes, tuple(list_columns)))
        counts = tuple(
            _Count(match.path, _enclosed(match.indexes, lists))
            for selector in layout.counts
            for match in selector.find(document)
            if _is_count(match.value, selector)
        )
        removes = tuple(match.path for s in layout.removes for match in s.find(document))
        return _GenericBody(tuple(candidates), document, layout, tuple(lists), counts, removes)

    def _columns(
        self, document: Any, ids: Sequence[Match]
    ) -> tuple[list[list[_Column]], list[list[_Entry]]]:
        """Per ids array: it and the arrays aligned with it; the id and text of each entry."""
        layout = self._layout
        assert layout.texts is not None  # the parallel layout
        columns = [[_Column(match.path, match.value, _Role.ID)] for match in ids]
        texts: list[list[Any]] = [[None] * len(match.value) for match in ids]
        roles = [(layout.texts, _Role.TEXT)] + [(s, _Role.OTHER) for s in layout.parallel]
        for selector, role in roles:
            for i, array in enumerate(_paired(selector, document, ids)):
                if array is not None:
                    columns[i].append(_Column(array.path, array.value, role))
                    if role is _Role.TEXT:
                        texts[i] = array.value
        id_label = f"entry of {layout.lists.text!r}"
        text_label = f"entry of {layout.texts.text!r}"
        entries = [
            [
                (usable_id(entry, id_label), usable_text(text, text_label))
                for entry, text in zip(match.value, list_texts, strict=True)
            ]
            for match, list_texts in zip(ids, texts, strict=True)
        ]
        return columns, entries


# A hit's chunk id and text, each as (value, None) or (None, problem).
_Entry = tuple[tuple[str | None, str | None], tuple[str | None, str | None]]


def _hit(hit: Any, hit_id: Selector, hit_text: Selector) -> _Entry:
    if not isinstance(hit, dict):
        raise MalformedBody("a hit is not a JSON object")
    return (
        usable_id(_value(hit_id, hit), f"hit field {hit_id.text!r}"),
        usable_text(_value(hit_text, hit), f"hit field {hit_text.text!r}"),
    )


def _lists(selector: Selector, document: Any) -> list[Match]:
    """The arrays matched by the last ``[*]`` of ``selector``; all must be there."""
    found = selector.head(len(selector.steps) - 1).require(document)
    if not all(isinstance(match.value, list) for match in found):
        raise MalformedBody(f"body does not fit {selector.text!r}: expected an array")
    return found


def _paired(selector: Selector, document: Any, ids: Sequence[Match]) -> list[Match | None]:
    """For each ids array, the array of ``selector`` whose [*] steps took the same indexes.

    None where a null stands for it (the API left that data out). Every array
    must pair with an ids array of its length, and every ids array with an
    array or a null: an unpaired or misaligned array would keep entries of
    removed hits, or is not the configured shape.
    """
    nulls: list[tuple[int, ...]] = []
    arrays: dict[tuple[int, ...], Match] = {}
    for match in selector.head(len(selector.steps) - 1).require(document, allow_null=True):
        if match.value is None:
            nulls.append(match.indexes)
        elif isinstance(match.value, list):
            arrays[match.indexes] = match
        else:
            raise MalformedBody(f"body does not fit {selector.text!r}: expected an array")
    paired: list[Match | None] = []
    for id_array in ids:
        array = arrays.pop(id_array.indexes, None)
        if array is None and not any(id_array.indexes[: len(n)] == n for n in nulls):
            raise MalformedBody(f"{selector.text!r} has no array for some ids")
        if array is not None and len(array.value) != len(id_array.value):
            raise MalformedBody(f"{selector.text!r} is not aligned with the ids")
        paired.append(array)
    if arrays:
        raise MalformedBody(f"{selector.text!r} has more arrays than the ids")
    return paired


def _enclosed(indexes: tuple[int, ...], lists: Sequence[_HitList]) -> tuple[int, ...]:
    """The hit lists below the place whose [*] steps took ``indexes``."""
    return tuple(
        i for i, hit_list in enumerate(lists) if hit_list.indexes[: len(indexes)] == indexes
    )


def _is_count(value: Any, selector: Selector) -> bool:
    """True for a count to set; False for a null one (left alone); MalformedBody otherwise."""
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedBody(f"{selector.text!r} is not a number")
    return True
