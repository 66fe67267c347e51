"""Bodies whose objects name a key twice: found exactly, however the JSON is written.

``has_duplicate_keys`` decides from one count of the body and one walk of the
decoded document; the oracle here decodes pair by pair with the standard
library, which sees every key as written.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.formats.base import MalformedBody, has_duplicate_keys, load_object
from tests.fixtures.format_strategies import PROPERTIES

# Strings rich in what could confuse a count: colons, quotes, escapes.
_TEXT = st.text(alphabet=st.sampled_from(["a", ":", '"', "\\", " ", "é", "\n", "b"]), max_size=6)
_SCALARS = st.none() | st.booleans() | st.integers(-5, 5) | _TEXT
# Objects as lists of pairs, so that a key may repeat.
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3).map(lambda items: ("list", items))
        | st.lists(st.tuples(_TEXT, inner), max_size=3).map(lambda pairs: ("object", pairs))
    ),
    max_leaves=12,
)


def _written(value: Any, spaced: bool, escape_colons: bool) -> str:
    """``value`` as JSON text, pairs as given (repeats kept), in one of several styles."""
    colon, comma = (" : ", ", ") if spaced else (":", ",")

    def text(string: str) -> str:
        written = json.dumps(string, ensure_ascii=False)
        return written.replace(":", "\\u003a") if escape_colons else written

    if isinstance(value, tuple):
        kind, items = value
        if kind == "list":
            return "[" + comma.join(_written(i, spaced, escape_colons) for i in items) + "]"
        return (
            "{"
            + comma.join(text(k) + colon + _written(v, spaced, escape_colons) for k, v in items)
            + "}"
        )
    if isinstance(value, str):
        return text(value)
    return json.dumps(value)


def _repeats(text: str) -> bool:
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({key for key, _ in pairs}) != len(pairs):
            raise KeyError
        return dict(pairs)

    try:
        json.loads(text, object_pairs_hook=unique)
    except KeyError:
        return True
    return False


@PROPERTIES
@given(value=_JSON, spaced=st.booleans(), escape_colons=st.booleans())
def test_found_exactly_as_the_pairwise_decoder_finds_them(
    value: Any, spaced: bool, escape_colons: bool
) -> None:
    text = _written(value, spaced, escape_colons)
    body = text.encode()
    assert has_duplicate_keys(body, orjson.loads(body)) == _repeats(text)


@pytest.mark.parametrize(
    "body",
    [
        b'{"code":0,"data":[1],"code":1,"data":null}',
        b'{"a":{"b":1,"b":2}}',
        b'[{"x":"1:2"},{"y":":","y":":"}]',
        b'{"a" : 1 , "a" : 2}',
        b'{"a\\u003a":1,"a\\u003a":2}',
    ],
)
def test_a_body_with_a_repeated_key_is_never_read(body: bytes) -> None:
    with pytest.raises(MalformedBody, match="same key twice"):
        load_object(body) if body.startswith(b"{") else _load_list(body)


def _load_list(body: bytes) -> Any:
    document = orjson.loads(body)
    if has_duplicate_keys(body, document):
        raise MalformedBody("an object has the same key twice")
    return document


@pytest.mark.parametrize(
    "body",
    [b'{"text":"Note: a:b","a":{"b:c":"::"}}', b'{"a":"\\u003a","b":1}', b"{}", b'{"a" : []}'],
)
def test_colons_in_strings_are_not_keys(body: bytes) -> None:
    assert load_object(body) == orjson.loads(body)
