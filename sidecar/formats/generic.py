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

A replacement sets the id and text where they were found (an integer id stays
an integer when the new id is one). In the hits layout the object holding the
text also gets the marker, the old id; parallel arrays have no object for it.

Options are checked when the format is built (``generic_options``); a body
that does not fit the selectors is MalformedBody when it is parsed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from sidecar.core.hits import Route, RouteKind
from sidecar.formats.base import MalformedBody, ResponseAdapter, load_json
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.generic_options import Layout, checked_layout, checked_name, checked_routes
from sidecar.formats.hits import Field, HitLayout, Hits
from sidecar.formats.selectors import Match, Path, Selector

# What the entries of a filtered array are, for placing a replacement: the
# hits, the "id" or "text" of their rows, or other values that go with them.
_Role = Literal["hit", "id", "text", "other"]


@dataclass(frozen=True, slots=True)
class _Column:
    """One array filtered by the kept indexes of its hit list."""

    path: Path
    items: list[Any]
    role: _Role


@dataclass(frozen=True, slots=True)
class _HitList:
    """The arrays of one hit list (the hits, or the ids and their aligned arrays).

    ``rows`` are what a hit is read from and replaced in: the hit objects, or
    ``{"id": ..., "text": ...}`` rows of the ids and texts arrays.
    """

    start: int  # position of the first entry
    indexes: tuple[int, ...]  # what the [*] steps above the list took
    rows: list[Any]
    columns: tuple[_Column, ...]


@dataclass(frozen=True, slots=True)
class _Count:
    path: Path
    lists: tuple[int, ...]  # the hit lists (indexes into _GenericBody.lists) it counts


@dataclass(frozen=True, slots=True)
class _Fields:
    """The count fields and the fields to remove that one body has."""

    counts: tuple[_Count, ...]
    removes: tuple[Path, ...]


_DELETE: Final = object()


def _edited(value: Any, edits: Mapping[Path, Any]) -> Any:
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
            copy[key] = _edited(value[key], sub)
    return copy


def _id_like(old: Any, new: str) -> Any:
    """``new`` as an integer when the id it replaces was one: the API's id type stays."""
    if isinstance(old, int) and not isinstance(old, bool) and new.isascii() and new.isdigit():
        number = int(new)
        if str(number) == new:
            return number
    return new


@dataclass(eq=False)
class _GenericBody(HitBody):
    """Every array of a hit list keeps the same indexes; count fields become the
    number of kept hits they count; remove fields are left out."""

    document: Any
    lists: tuple[_HitList, ...]
    fields: _Fields

    def _rebuild(self, selection: Selection) -> Any:
        edits: dict[Path, Any] = {}
        survivors: list[int] = []
        for hit_list in self.lists:
            start = hit_list.start
            kept = selection.kept(range(start, start + len(hit_list.rows)))
            sent = [selection.send(position, hit_list.rows[position - start]) for position in kept]
            survivors.append(len(sent))
            for column in hit_list.columns:
                edits[column.path] = [
                    _entry(column, position - start, row)
                    for position, row in zip(kept, sent, strict=True)
                ]
        for count in self.fields.counts:
            edits[count.path] = sum(survivors[i] for i in count.lists)
        for path in self.fields.removes:
            edits[path] = _DELETE
        return _edited(self.document, edits)


def _entry(column: _Column, index: int, row: Any) -> Any:
    """The entry of ``column`` for a hit sent as ``row``."""
    if column.role == "hit":
        return row
    if column.role == "other":
        return column.items[index]
    return row[column.role]


class GenericFormat(ResponseAdapter[Layout]):
    """Adapter for a JSON search API described by routes and selectors.

    Exactly one layout is given: ``hits``, ``id`` and ``text`` (hit objects),
    or ``ids`` and ``texts`` with optional ``parallel`` arrays. The chunk id
    and text are read with these selectors.
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
    ) -> None:
        self.name = checked_name(name)
        self._routes = checked_routes(routes)
        self._layout = checked_layout(
            hits, id, text, ids, texts, parallel, count_fields, remove_fields
        )
        self._hit_layout = _hit_layout(self._layout)

    def route_kind(self, route: Route) -> RouteKind | None:
        """FILTERED for the configured routes; None otherwise (nothing else is known)."""
        if any(template.matches(route) for template in self._routes):
            return RouteKind.FILTERED
        return None

    def _shape(self, route: Route) -> Layout | None:
        return None if self.route_kind(route) is None else self._layout

    def _load(self, body: bytes, shape: Layout) -> Any:
        # Any JSON value: an in-house API may answer with a bare array ("$[*]").
        return load_json(body)

    def _read(self, document: Any, shape: Layout) -> _GenericBody:
        found = _lists(shape.lists, document)
        if shape.hit_id is not None:
            columns = [[_Column(match.path, match.value, "hit")] for match in found]
            rows = [match.value for match in found]
        else:
            columns, rows = _columns(shape, document, found)
        hits = Hits(self._hit_layout)
        lists: list[_HitList] = []
        for match, list_columns, list_rows in zip(found, columns, rows, strict=True):
            start = len(hits.candidates)
            for row in list_rows:
                hits.add(row)
            lists.append(_HitList(start, match.indexes, list_rows, tuple(list_columns)))
        return _GenericBody(hits, document, tuple(lists), _fields(shape, document, lists))


def _hit_layout(layout: Layout) -> HitLayout:
    """Where a hit keeps its id and text: the selectors' fields, or the rows of the
    ids and texts arrays."""
    if layout.hit_id is not None and layout.hit_text is not None:
        hit_id, hit_text = layout.hit_id, layout.hit_text
        return HitLayout(
            "hit",
            Field(_names(hit_id), f"hit field {hit_id.text!r}"),
            Field(_names(hit_text), f"hit field {hit_text.text!r}"),
            # The marker goes next to the text, in the hit's own object for it.
            _names(hit_text)[:-1],
            _id_like,
        )
    assert layout.texts is not None  # the parallel layout
    return HitLayout(
        "hit",
        Field(("id",), f"entry of {layout.lists.text!r}"),
        Field(("text",), f"entry of {layout.texts.text!r}"),
        None,
        _id_like,
    )


def _names(selector: Selector) -> tuple[str, ...]:
    """The field names of a one-value selector (checked to have no [*])."""
    return tuple(step for step in selector.steps if isinstance(step, str))


def _columns(
    layout: Layout, document: Any, ids: Sequence[Match]
) -> tuple[list[list[_Column]], list[list[Any]]]:
    """Per ids array: it and the arrays aligned with it; the rows of its ids and texts."""
    assert layout.texts is not None  # the parallel layout
    columns = [[_Column(match.path, match.value, "id")] for match in ids]
    texts: list[list[Any]] = [[None] * len(match.value) for match in ids]
    roles: list[tuple[Selector, _Role]] = [(layout.texts, "text")]
    roles += [(selector, "other") for selector in layout.parallel]
    for selector, role in roles:
        for i, array in enumerate(_paired(selector, document, ids)):
            if array is not None:
                columns[i].append(_Column(array.path, array.value, role))
                if role == "text":
                    texts[i] = array.value
    rows = [
        [{"id": entry, "text": text} for entry, text in zip(match.value, list_texts, strict=True)]
        for match, list_texts in zip(ids, texts, strict=True)
    ]
    return columns, rows


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


def _fields(layout: Layout, document: Any, lists: Sequence[_HitList]) -> _Fields:
    counts = tuple(
        _Count(match.path, _enclosed(match.indexes, lists))
        for selector in layout.counts
        for match in selector.find(document)
        if _is_count(match.value, selector)
    )
    removes = tuple(match.path for s in layout.removes for match in s.find(document))
    return _Fields(counts, removes)


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
