"""One hit of a response: where it keeps its chunk id, text and metadata.

An adapter describes its hits with a ``HitLayout``; ``Hits`` numbers the hits
of one body in document order and turns each into a Candidate, and
``HitLayout.substituted`` puts a replacement where the hit keeps its id and
text and marks it. What a hit is (a point, a row, a search hit, a virtual
row of parallel arrays) stays the adapter's business.

``HitLayout.released`` is a kept hit as it goes out: only the hit's own keys
the adapter lists as safe (``hit_keys``), and of its free-form object (the
payload, ``_source``, metadata; or the hit itself where the database keeps
document fields beside its own) only the chunk text and id, the fields whose
hash the chunk record carries (``ReleasedFields.hashed``) and the fields the
operator declared releasable unverified (``ReleasedFields.releasable``).
Anything else a database returns, known or not, is dropped.

Problems name the field, never its value: they end up in audit records,
which must not carry chunk text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.hits import Candidate, Replacement
from sidecar.core.integrity import canonical_fields
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


FieldPath = tuple[str, ...]


def field_paths_option(value: object, name: str) -> tuple[FieldPath, ...]:
    """A ``hashed_fields`` / ``releasable_fields`` option, checked: a list of dotted paths.

    ``"metadata.source"`` names the key ``source`` of the object ``metadata``.
    """
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of field names (dotted paths)")
    paths = []
    for dotted in value:
        path = tuple(dotted.split("."))
        if not all(path):
            raise ValueError(f"{name}: {dotted!r} is not a dotted path of non-empty names")
        paths.append(path)
    return tuple(dict.fromkeys(paths))


@dataclass(frozen=True, slots=True)
class ReleasedFields:
    """Which fields of a hit's free-form object go out beside its text and id.

    ``hashed`` fields are integrity-checked: their canonical JSON goes into
    the candidate and must match the chunk record's ``payload_sha256``.
    ``releasable`` fields go out unverified because the operator said so.
    """

    hashed: tuple[FieldPath, ...] = ()
    releasable: tuple[FieldPath, ...] = ()

    @classmethod
    def from_options(cls, hashed: object, releasable: object) -> ReleasedFields:
        """The ``hashed_fields`` and ``releasable_fields`` options of a format, checked."""
        return cls(
            field_paths_option(hashed, "hashed_fields"),
            field_paths_option(releasable, "releasable_fields"),
        )


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

    The free-form object is the one the text sits in (``text.within``), or
    the hit itself when the text is one of its own keys. ``hit_keys`` are the
    keys of the hit that are the database's own and safe to send (scores,
    vectors, versions); ``fields`` says which document fields go with them.
    """

    noun: str  # what a hit is called in problems: "point", "row", "hit"
    chunk_id: Field
    text: Field
    marker: tuple[str, ...] | None
    id_value: Callable[[Any, str], Any] = as_given
    hit_keys: frozenset[str] = frozenset()
    fields: ReleasedFields = ReleasedFields()
    # Paths in the free-form object that go out, and their first keys.
    _object_paths: tuple[FieldPath, ...] = field(init=False, repr=False, compare=False)
    _object_keys: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        within = self.text.within
        own = [self.text.path]
        if self.chunk_id.within == within:
            own.append(self.chunk_id.path)
        paths = tuple(
            dict.fromkeys([*own, (SUBSTITUTED_FOR,), *self.fields.hashed, *self.fields.releasable])
        )
        object.__setattr__(self, "_object_paths", paths)
        object.__setattr__(self, "_object_keys", frozenset(path[0] for path in paths))

    def holder(self, hit: dict[str, Any]) -> Any:
        """The free-form object of ``hit``: where its document fields are."""
        within = self.text.within
        return hit if within is None else hit.get(within)

    def hashed_values(self, holder: Any) -> str | None:
        """The canonical JSON of the hashed fields in the free-form object ``holder``;
        None when none are declared.

        Raises ValueError when they have no canonical form (a float that is
        not finite, text that is not valid Unicode).
        """
        if not self.fields.hashed:
            return None
        found = {}
        for path in self.fields.hashed:
            value: Any = holder
            for key in path:
                value = value.get(key, _ABSENT) if isinstance(value, dict) else _ABSENT
            if value is not _ABSENT:
                found[".".join(path)] = value
        return canonical_fields(found)

    def released(self, hit: Any) -> Any:
        """``hit`` as it goes out: its safe keys and the declared fields of its object.

        A hit that holds nothing else is sent as it is (no copy).
        """
        if not isinstance(hit, dict):
            return hit
        within = self.text.within
        if within is None:
            allowed = self.hit_keys | self._object_keys
            if hit.keys() <= allowed and self._flat:
                return hit
            out = {key: value for key, value in hit.items() if key in self.hit_keys}
            # A path into one of the hit's own keys (Weaviate's _additional.id) is
            # already there whole.
            out.update(project_fields(hit, self._paths_beside_hit_keys))
            return out
        holder = hit.get(within)
        if hit.keys() <= self.hit_keys and (
            not isinstance(holder, dict) or (self._flat and holder.keys() <= self._object_keys)
        ):
            return hit
        out = {key: value for key, value in hit.items() if key in self.hit_keys}
        if isinstance(holder, dict):
            out[within] = project_fields(holder, self._object_paths)
        return out

    def released_object(self, holder: Any) -> Any:
        """A free-form object kept apart from its hit (a Chroma metadata) as it goes out."""
        if not isinstance(holder, dict):
            return holder
        if self._flat and holder.keys() <= self._object_keys:
            return holder
        return project_fields(holder, self._object_paths)

    def _without_fields(self, hit: Any) -> Any:
        """``hit`` without its declared fields: they describe the document a
        substitute replaces, and were checked against that document's record."""
        paths = (*self.fields.hashed, *self.fields.releasable)
        if not paths or not isinstance(hit, dict):
            return hit
        within = self.text.within
        if within is None:
            return without_declared(hit, paths)
        if not isinstance(hit.get(within), dict):
            return hit
        return {**hit, within: without_declared(hit[within], paths)}

    @property
    def _paths_beside_hit_keys(self) -> tuple[FieldPath, ...]:
        return tuple(path for path in self._object_paths if path[0] not in self.hit_keys)

    @property
    def _flat(self) -> bool:
        """True when every path that goes out is one key deep, so a key check suffices."""
        return all(len(path) == 1 for path in self._object_paths)

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
        out = self._without_fields(hit)
        out = _placed(out, self.text.steps, replacement.text)
        if self.marker is not None:
            out = _placed(out, (*self.marker, SUBSTITUTED_FOR), old_id)
        return _placed(out, self.chunk_id.steps, self.id_value(old_id, replacement.chunk_id))


def without_declared(holder: Any, paths: Iterable[FieldPath]) -> Any:
    """``holder`` without the values at ``paths`` (copied where one goes)."""
    if not isinstance(holder, dict):
        return holder
    out = holder
    for path in paths:
        out = _removed(out, path)
    return out


def _removed(value: dict[str, Any], path: FieldPath) -> dict[str, Any]:
    first, *rest = path
    if first not in value:
        return value
    if not rest:
        return {key: item for key, item in value.items() if key != first}
    inner = value[first]
    if not isinstance(inner, dict):
        return value
    return {**value, first: _removed(inner, tuple(rest))}


def _placed(value: Any, steps: Sequence[str], new: Any) -> dict[str, Any]:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise MalformedBody("a replacement cannot be placed in this hit")
    first, *rest = steps
    return {**value, first: _placed(value.get(first), rest, new) if rest else new}


_ABSENT = object()


def project_fields(holder: dict[str, Any], paths: Iterable[FieldPath]) -> dict[str, Any]:
    """The values of ``holder`` at ``paths`` (where present), nested as they were."""
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = holder
        for key in path:
            value = value.get(key, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is _ABSENT:
            continue
        target = out
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value
    return out


class Hits:
    """Numbers the hits of one body in document order and makes their Candidates."""

    def __init__(self, layout: HitLayout) -> None:
        self.layout = layout
        self.candidates: list[Candidate] = []
        # Hashed fields are read by the checked path only.
        self._fast = None if layout.fields.hashed else _fast_keys(layout)

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
        chunk_id, text = self.layout.read(hit)
        return self.add_found(chunk_id, text, self.hashed(self.layout.holder(hit)))

    def hashed(self, holder: Any) -> Found:
        """The canonical JSON of the hashed fields in the free-form object ``holder``."""
        try:
            return self.layout.hashed_values(holder), None
        except (ValueError, UnicodeEncodeError):
            return None, "hashed fields have no canonical form"

    def add_found(self, chunk_id: Found, text: Found, fields: Found = (None, None)) -> int:
        """Register a hit whose id and text (and hashed fields) the adapter read itself;
        returns its position."""
        position = len(self.candidates)
        # A problem both report (no payload) is said once.
        problems = dict.fromkeys(p for p in (chunk_id[1], text[1], fields[1]) if p is not None)
        if fields[1] is not None:
            # Unverifiable fields make the chunk unusable, like unreadable text.
            text = (None, text[1])
        self.candidates.append(
            Candidate(position, chunk_id[0], text[0], "; ".join(problems) or None, fields[0])
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
