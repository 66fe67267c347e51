"""A tiny selector language for locating values in a JSON document.

It is the part of JSONPath that configuration needs to say where hits, ids,
texts and side fields sit in a response, and nothing more:

- ``$`` is the value the selector is applied to (the body, or one hit). It
  may be left out: ``meta.id`` means ``$.meta.id``.
- ``.name`` selects a field of an object; a name written this way is letters,
  digits, ``_`` and ``-``.
- ``['name']`` (or ``["name"]``) selects a field with any other name, for
  example one containing dots; ``\\`` escapes the quote and the backslash.
- ``[*]`` selects every element of an array, in order.

There are no filters, slices, indexes or recursive descent: each step either
names one field or takes every element of one array, so the places a
selector can match never overlap those of another selector unless one
selector's steps start with the other's (``startswith``). ``[*]`` does not
iterate over an object's values, whose order an API rarely promises.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal

from sidecar.formats.base import MalformedBody


class _Each(Enum):
    EACH = "[*]"


EACH: Final = _Each.EACH
"""The ``[*]`` step: every element of an array."""

Step = str | Literal[_Each.EACH]
# Where a value sits: object keys and array indexes, one per step.
Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Match:
    """A value found by a selector, where it was found, and the array index each ``[*]`` took."""

    path: Path
    indexes: tuple[int, ...]
    value: Any


def _is_name_char(char: str) -> bool:
    return char.isalnum() or char in "_-"


@dataclass(frozen=True, slots=True)
class Selector:
    """A parsed selector: ``text`` as written, ``steps`` as field names and ``EACH``."""

    text: str
    steps: tuple[Step, ...]

    @classmethod
    def parse(cls, text: str) -> Selector:
        """Parse ``text``; raises ValueError naming the selector and the (0-based) position."""
        return cls(text, _Parser(text).steps())

    @property
    def wildcards(self) -> int:
        """How many ``[*]`` steps the selector has."""
        return self.steps.count(EACH)

    def startswith(self, other: Selector) -> bool:
        """True when every place ``self`` matches lies at or below a place ``other`` matches."""
        return self.steps[: len(other.steps)] == other.steps

    def head(self, count: int) -> Selector:
        """The selector made of the first ``count`` steps."""
        return Selector(self.text, self.steps[:count])

    def find(self, document: Any) -> list[Match]:
        """Every match in document order; branches that do not fit the steps find nothing."""
        return self._walk(document, strict=False, allow_null=False)

    def require(self, document: Any, *, allow_null: bool = False) -> list[Match]:
        """Every match in document order; raises MalformedBody where a step cannot be taken.

        A step cannot be taken from a value that is not an object holding the
        field, or not an array for ``[*]``. With ``allow_null`` a null met on
        the way ends its branch instead: it is returned as a match there, with
        a shorter path (the API left out everything below it).
        """
        return self._walk(document, strict=True, allow_null=allow_null)

    def _walk(self, document: Any, *, strict: bool, allow_null: bool) -> list[Match]:
        current = [Match((), (), document)]
        for step in self.steps:
            following: list[Match] = []
            for match in current:
                value = match.value
                if value is None and allow_null:
                    following.append(match)
                elif step is EACH and isinstance(value, list):
                    following.extend(
                        Match((*match.path, i), (*match.indexes, i), item)
                        for i, item in enumerate(value)
                    )
                elif step is not EACH and isinstance(value, dict) and step in value:
                    following.append(Match((*match.path, step), match.indexes, value[step]))
                elif strict:
                    # Names the configured selector only: the body's content stays out.
                    expected = "an array" if step is EACH else f"an object with field {step!r}"
                    raise MalformedBody(f"body does not fit {self.text!r}: expected {expected}")
            current = following
        return current


class _Parser:
    """A recursive-descent reader of one selector string."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._at = 0

    def _fail(self, problem: str, position: int | None = None) -> ValueError:
        at = self._at if position is None else position
        return ValueError(f"selector {self._text!r}: {problem} at position {at}")

    def _peek(self) -> str:
        return self._text[self._at] if self._at < len(self._text) else ""

    def steps(self) -> tuple[Step, ...]:
        if not self._text:
            raise self._fail("empty selector")
        steps: list[Step] = []
        if self._peek() == "$":
            self._at += 1
        elif self._peek() != "[":
            # Relative form: "meta.id" is "$.meta.id".
            steps.append(self._name())
        while self._at < len(self._text):
            char = self._peek()
            if char == ".":
                self._at += 1
                if self._peek() == ".":
                    raise self._fail("recursive descent '..' is not supported")
                steps.append(self._name())
            elif char == "[":
                steps.append(self._bracket())
            else:
                raise self._fail(f"unexpected {char!r}")
        return tuple(steps)

    def _name(self) -> str:
        start = self._at
        while self._at < len(self._text) and _is_name_char(self._text[self._at]):
            self._at += 1
        if self._at == start:
            found = repr(self._peek()) if self._peek() else "the end"
            raise self._fail(
                f"expected a name (letters, digits, '_', '-'; others in ['...']), found {found}"
            )
        return self._text[start : self._at]

    def _bracket(self) -> Step:
        start = self._at
        self._at += 1  # "["
        char = self._peek()
        if char == "*":
            self._at += 1
            step: Step = EACH
        elif char in ("'", '"'):
            step = self._quoted(char)
        else:
            raise self._fail("expected [*] or a quoted name in brackets", start)
        if self._peek() != "]":
            raise self._fail("expected ']'")
        self._at += 1
        return step

    def _quoted(self, quote: str) -> str:
        start = self._at
        self._at += 1  # opening quote
        name: list[str] = []
        while (char := self._peek()) != quote:
            if not char:
                raise self._fail("unterminated quoted name", start)
            if char == "\\":
                self._at += 1
                char = self._peek()
                if char not in (quote, "\\"):
                    raise self._fail("only the quote and '\\' may follow '\\'")
            name.append(char)
            self._at += 1
        self._at += 1  # closing quote
        return "".join(name)
