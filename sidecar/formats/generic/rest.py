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

A filtered body is rebuilt from the configuration alone, as an allowlist:
the objects and arrays on the way to the hit lists, the hit lists, the
aligned arrays, the ``count_fields`` and the ``keep_fields``; everything else
the API sends (facets, aggregations, answer text, cursors, timings, fields it
adds later) is left out. ``count_fields`` are numbers that count hits, each
set to the number of kept hits in the hit lists it encloses: ``$.total``
counts all of them, ``$.batches[*].total`` those of its own batch.
``keep_fields`` are values released as they came (a query echo, a took
time): name only values that say nothing about the hits the gate removes.
``remove_fields`` is still accepted and checked, and has nothing left to do.

A hit of the hits layout is its own free-form object: it goes out with its
id and text, the substitute marker, its ``hit_fields`` (top-level keys that
are the API's own, such as a score: kept on substitutes too), and the
``hashed_fields`` (integrity checked against the chunk record) and
``releasable_fields`` (unverified) named as dotted paths within the hit
(``content.title``; a substitute carries none: they describe the document it
replaces); nothing else of it. The arrays of the parallel layout go out as configured (entry
by entry, for the kept hits): name in ``parallel`` only arrays you release
unverified.

A replacement sets the id and text where they were found (an integer id stays
an integer when the new id is one). In the hits layout the object holding the
text also gets the marker, the old id; parallel arrays have no object for it.

Options are checked when the format is built (``rest_options``,
``rest_request``); a body that does not fit the selectors is
MalformedBody when it is parsed. Requests are rewritten (tenant push-down)
only when the tenant filter options are given (``rest_request``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sidecar.core.hits import Route, RouteKind
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody, ResponseAdapter, load_json
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.generic.rest_options import (
    Layout,
    checked_layout,
    checked_name,
    checked_routes,
    strings,
)
from sidecar.formats.generic.rest_request import GenericRequests, checked_tenant_filter
from sidecar.formats.generic.selectors import EACH, Match, Path, Selector
from sidecar.formats.hits import Field, HitLayout, Hits, ReleasedFields
from sidecar.formats.options import DEFAULT_OPTIONS, AdapterOptions

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
    null: bool  # a null count stays null


@dataclass(frozen=True, slots=True)
class _Fields:
    """The count fields, the values kept as they are, and the aligned arrays that
    are null, of one body."""

    counts: tuple[_Count, ...]
    kept: tuple[Match, ...]


def _assembled(document: Any, values: Mapping[Path, Any]) -> Any:
    """A new body holding ``values`` at their paths, in ``document``'s order, and
    nothing else.

    The containers on the way are new objects with only the keys that lead to
    a value, and arrays of the same length. Every index of an array on the
    way leads to a value: such arrays are above hit lists, which the
    selectors require at every index.
    """
    if () in values:
        return values[()]
    children: dict[str | int, dict[Path, Any]] = {}
    for path, value in values.items():
        children.setdefault(path[0], {})[path[1:]] = value
    if isinstance(document, dict):
        return {
            key: _assembled(item, children[key])
            for key, item in document.items()
            if key in children
        }
    return [_assembled(item, children[index]) for index, item in enumerate(document)]


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
    number of kept hits they count; nothing else but the kept values goes out."""

    document: Any
    lists: tuple[_HitList, ...]
    nulls: tuple[Path, ...]  # aligned arrays the API left out (null)
    empties: tuple[Path, ...]  # empty arrays above hit lists: no value leads there
    fields: _Fields

    def _rebuild(self, selection: Selection) -> Any:
        values: dict[Path, Any] = dict.fromkeys(self.nulls)
        values.update((path, []) for path in self.empties)
        survivors: list[int] = []
        for hit_list in self.lists:
            start = hit_list.start
            kept = selection.kept(range(start, start + len(hit_list.rows)))
            sent = [selection.send(position, hit_list.rows[position - start]) for position in kept]
            survivors.append(len(sent))
            for column in hit_list.columns:
                values[column.path] = [
                    _entry(column, position - start, row)
                    for position, row in zip(kept, sent, strict=True)
                ]
        for count in self.fields.counts:
            values[count.path] = None if count.null else sum(survivors[i] for i in count.lists)
        for match in self.fields.kept:
            values[match.path] = match.value
        return _assembled(self.document, values)


def _entry(column: _Column, index: int, row: Any) -> Any:
    """The entry of ``column`` for a hit sent as ``row``."""
    if column.role == "hit":
        return row
    if column.role == "other":
        return column.items[index]
    return row[column.role]


class GenericFormat(ResponseAdapter[Layout], GenericRequests):
    """Adapter for a JSON search API described by routes and selectors.

    Exactly one layout is given: ``hits``, ``id`` and ``text`` (hit objects),
    or ``ids`` and ``texts`` with optional ``parallel`` arrays. The chunk id
    and text are read with these selectors.
    """

    # Its id and text are read with its own selectors (``id``, ``text``, ``ids``, ``texts``).
    options_not_taken = frozenset({"text_field", "id_field"})

    def __init__(
        self,
        options: AdapterOptions = DEFAULT_OPTIONS,
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
        keep_fields: Sequence[str] = (),
        remove_fields: Sequence[str] = (),
        hit_fields: Sequence[str] = (),
        tenant_filter_at: str | None = None,
        tenant_filter: Any = None,
        tenant_filter_alone: Any = None,
    ) -> None:
        """Raises ValueError naming the option that is wrong.

        ``hit_fields`` (hits layout only) are keys of a hit that are the
        API's own, not the document's (a score, a rank): they go out as they
        are, substitutes too. Of ``options`` only the released fields are read
        (hits layout only): dotted paths within a hit to document fields.
        The ``tenant_filter`` options are ``rest_request``'s.
        """
        self.name = checked_name(name)
        self._routes = checked_routes(routes)
        self._layout = checked_layout(
            hits, id, text, ids, texts, parallel, count_fields, keep_fields, remove_fields
        )
        self._hit_layout = _hit_layout(
            self._layout, options.fields, strings("hit_fields", hit_fields)
        )
        self._tenant_filter = checked_tenant_filter(
            tenant_filter_at, tenant_filter, tenant_filter_alone
        )

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
        nulls: list[Path] = []
        if shape.hit_id is not None:
            columns = [[_Column(match.path, match.value, "hit")] for match in found]
            rows = [match.value for match in found]
        else:
            columns, rows, nulls = _columns(shape, document, found)
        hits = Hits(self._hit_layout)
        lists: list[_HitList] = []
        for match, list_columns, list_rows in zip(found, columns, rows, strict=True):
            start = len(hits.candidates)
            for row in list_rows:
                hits.add(row)
            lists.append(_HitList(start, match.indexes, list_rows, tuple(list_columns)))
        empties = (
            path
            for selector in (shape.lists, *([shape.texts] if shape.texts else []), *shape.parallel)
            for path in _empty_arrays(selector, document)
        )
        return _GenericBody(
            hits,
            document,
            tuple(lists),
            tuple(nulls),
            tuple(dict.fromkeys(empties)),
            _fields(shape, document, lists),
        )


def _hit_layout(layout: Layout, fields: ReleasedFields, hit_fields: list[str]) -> HitLayout:
    """Where a hit keeps its id and text: the selectors' fields, or the rows of the
    ids and texts arrays. A hit is its own free-form object."""
    if layout.hit_id is not None and layout.hit_text is not None:
        hit_id, hit_text = layout.hit_id, layout.hit_text
        # The marker goes next to the text, in the hit's own object for it.
        marker = _names(hit_text)[:-1]
        # A hit field holding the id, the text or a declared field would
        # release the object around them whole.
        holders = {
            path[0]
            for path in (_names(hit_id), _names(hit_text), *fields.hashed, *fields.releasable)
        }
        for name in hit_fields:
            if not name or name in holders:
                raise ValueError(
                    f"hit_fields: {name!r} is empty or holds the id, the text or a declared field"
                )
        return HitLayout(
            "hit",
            Field(_names(hit_id), f"hit field {hit_id.text!r}"),
            Field(_names(hit_text), f"hit field {hit_text.text!r}"),
            marker,
            _id_like,
            frozenset(hit_fields),
            # The marker goes out with the hit wherever it sits.
            ReleasedFields(fields.hashed, (*fields.releasable, (*marker, SUBSTITUTED_FOR))),
        )
    if fields.hashed or fields.releasable or hit_fields:
        raise ValueError(
            "hit_fields, hashed_fields, releasable_fields: only with hits; "
            "the parallel arrays go out as configured"
        )
    assert layout.texts is not None  # the parallel layout
    return HitLayout(
        "hit",
        Field(("id",), f"entry of {layout.lists.text!r}"),
        Field(("text",), f"entry of {layout.texts.text!r}"),
        None,
        _id_like,
        frozenset(),
    )


def _names(selector: Selector) -> tuple[str, ...]:
    """The field names of a one-value selector (checked to have no [*])."""
    return tuple(step for step in selector.steps if isinstance(step, str))


def _columns(
    layout: Layout, document: Any, ids: Sequence[Match]
) -> tuple[list[list[_Column]], list[list[Any]], list[Path]]:
    """Per ids array: it and the arrays aligned with it; the rows of its ids and texts;
    and where an aligned array is null."""
    assert layout.texts is not None  # the parallel layout
    columns = [[_Column(match.path, match.value, "id")] for match in ids]
    texts: list[list[Any]] = [[None] * len(match.value) for match in ids]
    nulls: list[Path] = []
    roles: list[tuple[Selector, _Role]] = [(layout.texts, "text")]
    roles += [(selector, "other") for selector in layout.parallel]
    for selector, role in roles:
        paired, null_paths = _paired(selector, document, ids)
        nulls += null_paths
        for i, array in enumerate(paired):
            if array is not None:
                columns[i].append(_Column(array.path, array.value, role))
                if role == "text":
                    texts[i] = array.value
    rows = [
        [{"id": entry, "text": text} for entry, text in zip(match.value, list_texts, strict=True)]
        for match, list_texts in zip(ids, texts, strict=True)
    ]
    return columns, rows, nulls


def _empty_arrays(selector: Selector, document: Any) -> list[Path]:
    """The empty arrays that the ``[*]`` steps of ``selector`` above its hit lists
    (or aligned arrays) meet: the rebuilt body keeps them, empty."""
    return [
        match.path
        for i, step in enumerate(selector.steps[:-1])
        if step is EACH
        for match in selector.head(i).find(document)
        if match.value == []
    ]


def _lists(selector: Selector, document: Any) -> list[Match]:
    """The arrays matched by the last ``[*]`` of ``selector``; all must be there."""
    found = selector.head(len(selector.steps) - 1).require(document)
    if not all(isinstance(match.value, list) for match in found):
        raise MalformedBody(f"body does not fit {selector.text!r}: expected an array")
    return found


def _paired(
    selector: Selector, document: Any, ids: Sequence[Match]
) -> tuple[list[Match | None], list[Path]]:
    """For each ids array, the array of ``selector`` whose [*] steps took the same
    indexes, and where nulls stand for arrays.

    None where a null stands for it (the API left that data out). Every array
    must pair with an ids array of its length, and every ids array with an
    array or a null: an unpaired or misaligned array would keep entries of
    removed hits, or is not the configured shape.
    """
    nulls: list[Match] = []
    arrays: dict[tuple[int, ...], Match] = {}
    for match in selector.head(len(selector.steps) - 1).require(document, allow_null=True):
        if match.value is None:
            nulls.append(match)
        elif isinstance(match.value, list):
            arrays[match.indexes] = match
        else:
            raise MalformedBody(f"body does not fit {selector.text!r}: expected an array")
    paired: list[Match | None] = []
    for id_array in ids:
        array = arrays.pop(id_array.indexes, None)
        if array is None and not any(
            id_array.indexes[: len(n.indexes)] == n.indexes for n in nulls
        ):
            raise MalformedBody(f"{selector.text!r} has no array for some ids")
        if array is not None and len(array.value) != len(id_array.value):
            raise MalformedBody(f"{selector.text!r} is not aligned with the ids")
        paired.append(array)
    if arrays:
        raise MalformedBody(f"{selector.text!r} has more arrays than the ids")
    return paired, [null.path for null in nulls]


def _fields(layout: Layout, document: Any, lists: Sequence[_HitList]) -> _Fields:
    counts = tuple(
        _Count(match.path, _enclosed(match.indexes, lists), null=match.value is None)
        for selector in layout.counts
        for match in selector.find(document)
        if _is_count(match.value, selector)
    )
    kept = tuple(match for selector in layout.keeps for match in selector.find(document))
    return _Fields(counts, kept)


def _enclosed(indexes: tuple[int, ...], lists: Sequence[_HitList]) -> tuple[int, ...]:
    """The hit lists below the place whose [*] steps took ``indexes``."""
    return tuple(
        i for i, hit_list in enumerate(lists) if hit_list.indexes[: len(indexes)] == indexes
    )


def _is_count(value: Any, selector: Selector) -> bool:
    """True for a count (a number, or a null left null); MalformedBody otherwise."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise MalformedBody(f"{selector.text!r} is not a number")
    return True
