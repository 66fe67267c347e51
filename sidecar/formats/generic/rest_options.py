"""The options of a generic format, checked when it is built: its routes and its selectors.

See ``generic`` for what the options mean. Every problem is a ValueError
that names the option.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sidecar.core.hits import Route
from sidecar.formats.generic.selectors import EACH, Selector

_NAME: Final = re.compile(r"[a-z0-9_-]{1,32}")
_METHOD: Final = re.compile(r"[A-Za-z]+")
_PLACEHOLDER: Final = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
# Characters a literal template segment may not hold: they would be encoded,
# ambiguous or a query, and the gate only ever sees canonical paths.
_NOT_LITERAL: Final = re.compile(r"[{}%?#\\\s]")


@dataclass(frozen=True, slots=True)
class RouteTemplate:
    """``METHOD /path/{x}``: a method and path segments; None stands for a ``{x}``."""

    method: str
    segments: tuple[str | None, ...]

    @classmethod
    def parse(cls, text: str, option: str) -> RouteTemplate:
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


def selector_option(option: str, value: object) -> Selector:
    """The selector of ``option``, parsed; ValueError naming the option."""
    if not isinstance(value, str):
        raise ValueError(f"{option}: expected a selector string")
    try:
        return Selector.parse(value)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def strings(option: str, value: object) -> list[str]:
    # A bare string is a Sequence[str] too; in a TOML file it is a mistake.
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"{option}: expected a list of strings")
    if not all(isinstance(item, str) for item in value):
        raise ValueError(f"{option}: expected a list of strings")
    return list(value)


def _hit_list(option: str, value: object) -> Selector:
    selector = selector_option(option, value)
    if not selector.steps or selector.steps[-1] is not EACH:
        raise ValueError(f"{option}: selector {selector.text!r} must end with [*]")
    return selector


def field_option(option: str, value: object, *, relative: bool) -> Selector:
    """A selector of ``option`` that ends with a field name (and has no ``[*]`` when
    ``relative``, for one value of a hit); ValueError naming the option."""
    selector = selector_option(option, value)
    if not selector.steps or selector.steps[-1] is EACH:
        raise ValueError(f"{option}: selector {selector.text!r} must end with a field name")
    if relative and selector.wildcards:
        raise ValueError(f"{option}: selector {selector.text!r} must select one value (no [*])")
    return selector


@dataclass(frozen=True, slots=True)
class Layout:
    """The checked selectors of a GenericFormat."""

    lists: Selector  # hits or ids
    hit_id: Selector | None  # hits layout: relative to a hit
    hit_text: Selector | None
    texts: Selector | None  # parallel layout
    parallel: tuple[Selector, ...]
    counts: tuple[Selector, ...]
    keeps: tuple[Selector, ...]


def _enclosing(option: str, selector: Selector, lists: Selector) -> Selector:
    """``selector``, checked to take only the ``[*]`` steps above the hit lists.

    Then each place it matches encloses whole hit lists (a count counts
    them) and lies on a path that the rebuilt body has anyway.
    """
    container = lists.head(len(lists.steps) - 1)
    last_each = max((i for i, s in enumerate(selector.steps) if s is EACH), default=-1)
    if not container.startswith(selector.head(last_each + 1)):
        raise ValueError(
            f"{option}: selector {selector.text!r} does not enclose the hit lists of {lists.text!r}"
        )
    return selector


def checked_layout(
    hits: str | None,
    hit_id: str | None,
    hit_text: str | None,
    ids: str | None,
    texts: str | None,
    parallel: Sequence[str],
    count_fields: Sequence[str],
    keep_fields: Sequence[str],
    remove_fields: Sequence[str],
) -> Layout:
    """The selectors of a generic format, checked; raises ValueError naming the option.

    ``remove_fields`` are checked and then have no effect: everything the
    other selectors do not name is left out of a filtered body anyway.
    """
    parallel_texts = strings("parallel", parallel)
    layout_id: Selector | None = None
    layout_text: Selector | None = None
    aligned: dict[str, Selector] = {}
    if hits is not None and ids is None and texts is None and not parallel_texts:
        if hit_id is None or hit_text is None:
            raise ValueError("id, text: both are needed with hits")
        lists = _hit_list("hits", hits)
        layout_id = field_option("id", hit_id, relative=True)
        layout_text = field_option("text", hit_text, relative=True)
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
    outside = {
        name: {
            f"{name}[{i}]": _enclosing(
                f"{name}[{i}]", field_option(f"{name}[{i}]", item, relative=False), lists
            )
            for i, item in enumerate(strings(name, values))
        }
        for name, values in (("count_fields", count_fields), ("keep_fields", keep_fields))
    }
    removes = {
        f"remove_fields[{i}]": field_option(f"remove_fields[{i}]", item, relative=False)
        for i, item in enumerate(strings("remove_fields", remove_fields))
    }
    # Every array that is filtered, every count that is set, every value
    # kept and every field that is removed must be a separate place in the
    # body: one inside another would be lost or contradict it.
    places = {
        "hits" if hits is not None else "ids": lists.head(len(lists.steps) - 1),
        **{option: s.head(len(s.steps) - 1) for option, s in aligned.items()},
        **outside["count_fields"],
        **outside["keep_fields"],
        **removes,
    }
    options = list(places)
    for i, first in enumerate(options):
        for second in options[i + 1 :]:
            if places[first].startswith(places[second]) or places[second].startswith(places[first]):
                raise ValueError(
                    f"{second}: selector {places[second].text!r} overlaps "
                    f"{first} ({places[first].text!r})"
                )
    return Layout(
        lists,
        layout_id,
        layout_text,
        aligned.get("texts"),
        tuple(selector for option, selector in aligned.items() if option != "texts"),
        tuple(outside["count_fields"].values()),
        tuple(outside["keep_fields"].values()),
    )


def checked_name(name: object) -> str:
    """The format's name, checked: it is a metric label and a configuration key."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError("name: expected 1 to 32 of a-z, 0-9, '_' and '-'")
    return name


def checked_routes(routes: object) -> tuple[RouteTemplate, ...]:
    """The ``routes`` option, parsed: at least one ``METHOD /path/{x}``."""
    route_texts = strings("routes", routes)
    if not route_texts:
        raise ValueError("routes: at least one route is needed")
    return tuple(RouteTemplate.parse(route, f"routes[{i}]") for i, route in enumerate(route_texts))
