"""One hit of a response: where it keeps its chunk id, text and metadata.

An adapter describes its hits with a ``HitLayout``; ``Hits`` numbers the hits
of one body in document order and turns each into a Candidate, and
``HitLayout.substituted`` puts a replacement where the hit keeps its id and
text and marks it. What a hit is (a point, a row, a search hit, a virtual
row of parallel arrays) stays the adapter's business.

Problems name the field, never its value: they end up in audit records,
which must not carry chunk text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.core.hits import Candidate, Replacement
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody

# A value read from a hit: ``(value, None)``, or ``(None, problem)``.
Found = tuple[str | None, str | None]


def usable_id(value: Any, label: str) -> Found:
    """``(chunk id, None)`` for a non-empty string or integer, else ``(None, problem)``."""
    if value is None:
        return None, f"{label} missing"
    # bool is an int subclass, but True is no chunk id.
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None, f"{label} is not a string or integer"
    if value == "":
        return None, f"{label} is empty"
    return str(value), None


def usable_text(value: Any, label: str) -> Found:
    """``(text, None)`` for a string, else ``(None, problem)``."""
    if value is None:
        return None, f"{label} missing"
    if not isinstance(value, str):
        return None, f"{label} is not a string"
    return value, None


@dataclass(frozen=True, slots=True)
class Field:
    """Where a hit keeps one value, and how problems with it are named.

    ``path`` leads from the hit, or from the hit's object ``within`` (its
    payload, metadata, ``_source``), to the value. A missing object on the way
    means a missing value; ``within`` is checked on its own, so that a hit
    whose payload was not requested says so.
    """

    path: tuple[str, ...]
    label: str  # e.g. "payload field 'text'"
    within: str | None = None

    @property
    def steps(self) -> tuple[str, ...]:
        """The keys from the hit itself to the value."""
        return self.path if self.within is None else (self.within, *self.path)

    def find(self, hit: dict[str, Any]) -> tuple[Any, str | None]:
        """``(value, None)``, the value None when it is absent; ``(None, problem)``
        when ``within`` is absent or not an object."""
        value: Any = hit
        if self.within is not None:
            value = hit.get(self.within)
            if value is None:
                # Absent or null: the request did not ask for it.
                return None, f"no {self.within}"
            if not isinstance(value, dict):
                return None, f"{self.within} is not an object"
        for key in self.path:
            value = value.get(key) if isinstance(value, dict) else None
        return value, None


def as_given(old: Any, new: str) -> Any:
    """A substitute's id as it is: the API's ids are strings."""
    return new


@dataclass(frozen=True, slots=True)
class HitLayout:
    """Where the hits of one response shape keep their chunk id, text and metadata.

    ``marker`` is the free-form object a substitute's ``SUBSTITUTED_FOR``
    goes into (``()``: the hit itself); None when the hit has none, so a
    substitute is not marked. ``id_value`` gives a substitute's id as the hit
    keeps ids, from the id it replaces (a number where the API's ids are).
    """

    noun: str  # what a hit is called in problems: "point", "row", "hit"
    chunk_id: Field
    text: Field
    marker: tuple[str, ...] | None
    id_value: Callable[[Any, str], Any] = as_given

    def read(self, hit: Any) -> tuple[Found, Found]:
        """The chunk id and text of ``hit``; raises MalformedBody if it is not an object."""
        if not isinstance(hit, dict):
            raise MalformedBody(f"a {self.noun} is not a JSON object")
        value, problem = self.chunk_id.find(hit)
        chunk_id = (None, problem) if problem else usable_id(value, self.chunk_id.label)
        value, problem = self.text.find(hit)
        text = (None, problem) if problem else usable_text(value, self.text.label)
        return chunk_id, text

    def substituted(self, hit: Any, replacement: Replacement) -> dict[str, Any]:
        """A copy of ``hit`` with the replacement's text and id where it keeps them, marked.

        Only the objects on the way are copied; missing or null ones are
        created. Raises MalformedBody where a value on the way is no object.
        """
        old_id = self.chunk_id.find(hit)[0] if isinstance(hit, dict) else None
        out = _placed(hit, self.text.steps, replacement.text)
        if self.marker is not None:
            out = _placed(out, (*self.marker, SUBSTITUTED_FOR), old_id)
        return _placed(out, self.chunk_id.steps, self.id_value(old_id, replacement.chunk_id))


def _placed(value: Any, steps: Sequence[str], new: Any) -> dict[str, Any]:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise MalformedBody("a replacement cannot be placed in this hit")
    first, *rest = steps
    return {**value, first: _placed(value.get(first), rest, new) if rest else new}


class Hits:
    """Numbers the hits of one body in document order and makes their Candidates."""

    def __init__(self, layout: HitLayout) -> None:
        self.layout = layout
        self.candidates: list[Candidate] = []
        self._fast = _fast_keys(layout)

    def add(self, hit: Any) -> int:
        """Register ``hit`` as the next candidate; returns its position.

        Raises MalformedBody if ``hit`` is not an object. Takes a fast path
        for the common, well-formed hit as orjson decodes it (exact types: a
        bool is no id) where the layout allows one; anything else takes
        ``add_checked``, which accepts the same hits and names the problem with
        the others.
        """
        fast = self._fast
        if fast is not None and type(hit) is dict:
            text_within, text_key, id_key, id_within_too = fast
            holder = hit if text_within is None else hit.get(text_within)
            if type(holder) is dict:
                text = holder.get(text_key)
                if type(text) is str:
                    raw_id = (holder if id_within_too else hit).get(id_key)
                    if type(raw_id) is int:
                        raw_id = str(raw_id)
                    if type(raw_id) is str and raw_id:
                        position = len(self.candidates)
                        self.candidates.append(Candidate(position, raw_id, text))
                        return position
        return self.add_checked(hit)

    def add_checked(self, hit: Any) -> int:
        """``add`` without its fast path: every check, with the problem named."""
        return self.add_found(*self.layout.read(hit))

    def add_found(self, chunk_id: Found, text: Found) -> int:
        """Register a hit whose id and text the adapter read itself; returns its position."""
        position = len(self.candidates)
        # A problem both report (no payload) is said once.
        problems = dict.fromkeys(p for p in (chunk_id[1], text[1]) if p is not None)
        self.candidates.append(
            Candidate(position, chunk_id[0], text[0], "; ".join(problems) or None)
        )
        return position

    def add_list(self, value: Any, problem: str) -> range:
        """Register every hit of the JSON array ``value``; returns their positions.

        Raises MalformedBody with ``problem`` if ``value`` is not an array.
        """
        if not isinstance(value, list):
            raise MalformedBody(problem)
        start = len(self.candidates)
        for hit in value:
            self.add(hit)
        return range(start, len(self.candidates))


def _fast_keys(layout: HitLayout) -> tuple[str | None, str, str, bool] | None:
    """``(text's object, text key, id key, id in that object too)`` when the fast path
    applies: both values one key below the hit, or below the same object of it."""
    chunk_id, text = layout.chunk_id, layout.text
    if len(chunk_id.path) != 1 or len(text.path) != 1:
        return None
    if chunk_id.within is not None and chunk_id.within != text.within:
        return None
    return text.within, text.path[0], chunk_id.path[0], chunk_id.within is not None
