"""A parsed response body, rendered again with fewer hits: the part every adapter shares.

``HitBody`` is a template: ``render`` and ``released_positions`` check the
limits, run the adapter's ``_rebuild`` with a ``Selection`` and remember what
the last render sent, so that ``released_positions`` after a ``render`` (the
usual call order) costs nothing. The adapter's ``_rebuild`` walks its own
shapes and sends each kept hit through the selection, which puts a
replacement in its place and records the position as released.

Rebuilds copy only the containers they change; hits are never copied unless
replaced, and the parsed document is never mutated, so ``render`` may be
called any number of times.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any

import orjson

from sidecar.core.hits import Candidate, Replacement
from sidecar.formats.base import MalformedBody, RenderLimits, Replacements, ReportedError
from sidecar.formats.hits import HitLayout, Hits

Limits = tuple[int | None, ...]


class Selection:
    """What one render keeps and replaces, and the positions it sends."""

    __slots__ = ("_released", "_replacements", "_substituted", "keep", "limits", "released")

    def __init__(
        self,
        keep: frozenset[int],
        limits: Limits,
        replacements: Mapping[int, Replacement],
        substituted: Callable[[Any, Replacement], Any],
        released: Callable[[Any], Any],
    ) -> None:
        self.keep = keep
        # One entry per sub-result (the most hits, or groups, it keeps; None:
        # all), or empty for a format that never trims.
        self.limits = limits
        self.released: list[int] = []
        self._replacements = replacements
        self._substituted = substituted
        self._released = released

    def __contains__(self, position: object) -> bool:
        return position in self.keep

    def kept(self, positions: Iterable[int]) -> list[int]:
        """The kept ones of ``positions``, in their order."""
        keep = self.keep
        return [position for position in positions if position in keep]

    def send(self, position: int, hit: Any) -> Any:
        """``hit`` as sent at ``position``: carrying its replacement if it has one, and
        only what the layout releases of it (``HitLayout.released``).

        The position counts as released.
        """
        self.released.append(position)
        replacement = self._replacements.get(position)
        if replacement is not None:
            hit = self._substituted(hit, replacement)
        return self._released(hit)

    def sent(self, items: Sequence[Any], start: int, limit: int | None = None) -> list[Any]:
        """The kept hits of the array ``items`` (at positions from ``start``) as sent,
        at most ``limit`` of them."""
        kept = self.kept(range(start, start + len(items)))
        return [self.send(position, items[position - start]) for position in kept[:limit]]

    def replaced(self, position: int) -> bool:
        """True when the hit at ``position`` gets a replacement."""
        return position in self._replacements


@dataclass(eq=False)
class HitBody(ABC):
    """A parsed body: its candidates, and how it is sent with only some of them.

    Adapters subclass it as dataclasses holding what their ``_rebuild``
    needs. ``sub_results`` is the number of limits a render takes (one per
    sub-result: one for a plain search, one per request of a batch); None for
    a format whose requests are never over-fetched, which takes none.
    ``reported_error``: the error the body reports (``ParsedBody``), if any.
    """

    hits: InitVar[Hits]
    sub_results: int | None = field(default=None, kw_only=True)
    reported_error: ReportedError | None = field(default=None, kw_only=True)
    candidates: Sequence[Candidate] = field(init=False)
    _layout: HitLayout = field(init=False, repr=False)
    # ((keep, limits), released positions) of the last render.
    _last_release: tuple[tuple[frozenset[int], Limits], list[int]] | None = field(
        init=False, default=None, repr=False
    )

    def __post_init__(self, hits: Hits) -> None:
        self.candidates = tuple(hits.candidates)
        self._layout = hits.layout

    def render(
        self, keep: Collection[int], limits: RenderLimits = None, replacements: Replacements = None
    ) -> bytes:
        """Serialise the body with only the hits whose position is in ``keep``.

        See ``ParsedBody.render``: ``limits`` trims each sub-result, and a
        replaced hit gets the substitute's text and id where the hit keeps
        them, marked with ``SUBSTITUTED_FOR`` where it has an object for it.
        """
        selection = self._selection(keep, limits, replacements)
        document = self._rebuild(selection)
        # A rebuild may send nested hits before the object holding them.
        selection.released.sort()
        # Replacements change what a hit carries, never which hits go out.
        self._last_release = ((selection.keep, selection.limits), selection.released)
        return self._encode(document)

    def _encode(self, document: Any) -> bytes:
        """The bytes of a rebuilt document: JSON, unless the adapter's bodies are not."""
        return orjson.dumps(document)

    def released_positions(self, keep: Collection[int], limits: RenderLimits = None) -> list[int]:
        """The positions ``render(keep, limits)`` sends, in body order."""
        selection = self._selection(keep, limits, None)
        last = self._last_release
        if last is not None and last[0] == (selection.keep, selection.limits):
            return list(last[1])
        self._rebuild(selection)
        return sorted(selection.released)

    @abstractmethod
    def _rebuild(self, selection: Selection) -> Any:
        """The body as sent for ``selection``, as a JSON value.

        Sends every hit that goes out through ``selection.send`` (or
        ``selection.sent``), and trims sub-result ``i`` to
        ``selection.limits[i]`` where limits are given.
        """

    def _substituted(self, hit: Any, replacement: Replacement) -> Any:
        """``hit`` carrying ``replacement``; adapters with more to change extend it."""
        return self._layout.substituted(hit, replacement)

    def _selection(
        self,
        keep: Collection[int],
        limits: RenderLimits,
        replacements: Replacements,
    ) -> Selection:
        return Selection(
            frozenset(keep),
            self._checked_limits(limits),
            replacements or {},
            self._substituted,
            self._layout.released,
        )

    def _checked_limits(self, limits: RenderLimits) -> Limits:
        count = self.sub_results
        if count is None:
            # Formats without a request rewriter never over-fetch.
            if limits:
                raise MalformedBody("this format does not trim over-fetched results")
            return ()
        if not limits:
            return (None,) * count
        if len(limits) != count:
            raise MalformedBody(f"response has {count} sub-results, the request had {len(limits)}")
        return tuple(limits)
