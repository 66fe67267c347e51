"""What every adapter needs: guarded parsing and reading ids and texts out of hits.

Problems returned here name the field, never its value: they end up in audit
records, which must not carry chunk text.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, TypeVar

import orjson

from sidecar.core.hits import Candidate
from sidecar.formats.base import MalformedBody

T = TypeVar("T")


def parse_guarded(format_name: str, parse: Callable[[], T]) -> T:
    """Run an adapter's parse; any failure other than MalformedBody becomes one.

    A body the adapter cannot read must never pass, even when the reason is a
    bug in the adapter.
    """
    try:
        return parse()
    except MalformedBody:
        raise
    except orjson.JSONDecodeError:
        message = "body is not valid UTF-8 JSON"
    except Exception:
        message = f"body could not be read as a {format_name} response"
    # Raised outside the handler so that nothing is chained: a decode error's
    # .doc attribute holds the whole body.
    raise MalformedBody(message)


def load_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; raises MalformedBody (or orjson's error) otherwise."""
    document = orjson.loads(body)
    if not isinstance(document, dict):
        raise MalformedBody("top level is not a JSON object")
    return document


def usable_id(value: Any, label: str) -> tuple[str | None, str | None]:
    """``(chunk id, None)`` for a non-empty string or integer, else ``(None, problem)``."""
    if value is None:
        return None, f"{label} missing"
    # bool is an int subclass, but True is no chunk id.
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None, f"{label} is not a string or integer"
    if value == "":
        return None, f"{label} is empty"
    return str(value), None


def usable_text(value: Any, label: str) -> tuple[str | None, str | None]:
    """``(text, None)`` for a string, else ``(None, problem)``."""
    if value is None:
        return None, f"{label} missing"
    if not isinstance(value, str):
        return None, f"{label} is not a string"
    return value, None


def make_candidate(
    position: int,
    chunk_id: tuple[str | None, str | None],
    text: tuple[str | None, str | None],
) -> Candidate:
    """A Candidate from ``usable_id`` and ``usable_text`` results, problems joined once."""
    problems = dict.fromkeys(p for p in (chunk_id[1], text[1]) if p is not None)
    return Candidate(position, chunk_id[0], text[0], "; ".join(problems) or None)


def no_limits(limits: Sequence[int | None] | None) -> None:
    """Formats without a request rewriter never over-fetch, so limits must be empty."""
    if limits:
        raise MalformedBody("this format does not trim over-fetched results")


def kept_in_order(positions: Iterable[int], keep: Collection[int]) -> list[int]:
    """``positions`` (in body order) that are in ``keep``."""
    return [position for position in positions if position in keep]


def check_fields(text_field: object, id_field: object) -> None:
    """Validate the ``text_field`` and ``id_field`` options every adapter takes.

    Raises ValueError naming the option: both are non-empty strings, and
    ``id_field`` may be None (the database's own hit id).
    """
    if not isinstance(text_field, str) or not text_field:
        raise ValueError("text_field must be a non-empty string")
    if id_field is not None and (not isinstance(id_field, str) or not id_field):
        raise ValueError("id_field must be a non-empty string, or unset for the hit's own id")
