"""The canonical text and payload-field forms and their hashes (a public contract,
see sidecar/core/integrity.py)."""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from random import Random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.integrity import (
    canonical_fields,
    canonical_sha256,
    canonical_text,
    fields_sha256,
)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_known_vectors() -> None:
    # FIPS 180-2 test vectors: ASCII text without CR is hashed unchanged.
    assert canonical_sha256("") == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    assert canonical_sha256("abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )


def test_crlf_and_lone_cr_become_lf() -> None:
    expected = sha256_hex(b"one\ntwo\nthree\n\nfour")
    assert canonical_sha256("one\r\ntwo\rthree\r\n\rfour") == expected


def test_text_is_nfc_normalised() -> None:
    decomposed = "Cafe\u0301 re\u0301sume\u0301"
    composed = "Caf\u00e9 r\u00e9sum\u00e9"
    assert canonical_sha256(decomposed) == canonical_sha256(composed)
    assert canonical_sha256(composed) == sha256_hex(composed.encode("utf-8"))


def test_nothing_else_changes() -> None:
    assert canonical_sha256(" text ") != canonical_sha256("text")
    assert canonical_sha256("text\n") != canonical_sha256("text")
    assert canonical_sha256("Text") != canonical_sha256("text")
    assert canonical_sha256("a\tb") != canonical_sha256("a b")
    # Only CR is a line ending to convert; U+2028 and NEL stay as they are.
    assert canonical_text("a\u2028b\u0085c") == "a\u2028b\u0085c"
    # NFC, not NFKC: compatibility characters such as the "fi" ligature stay.
    assert canonical_text("\ufb01") == "\ufb01"


def test_ascii_without_cr_is_returned_unchanged() -> None:
    text = "plain ascii text\nwith lines"
    assert canonical_text(text) is text


def test_lone_surrogate_has_no_canonical_hash() -> None:
    with pytest.raises(UnicodeEncodeError):
        canonical_sha256("bad \ud800 text")


def reference(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


unicode_text = st.text(
    alphabet=st.one_of(
        st.sampled_from("\r\n e\u0301\u00e9\u0308\u1100\u1161\u11a8"),
        st.characters(exclude_categories=["Cs"]),
    )
)


@given(unicode_text)
def test_matches_the_documented_recipe(text: str) -> None:
    assert canonical_sha256(text) == reference(text)


@given(unicode_text)
def test_steps_commute_and_the_form_is_idempotent(text: str) -> None:
    newlines_first = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    assert canonical_text(text) == newlines_first
    assert canonical_text(canonical_text(text)) == canonical_text(text)


# --- canonical payload fields --------------------------------------------------------------


def test_fields_known_vector() -> None:
    document = canonical_fields({"title": "Refunds", "metadata.source": "kb/7", "rank": 2})
    assert document == '{"metadata.source":"kb/7","rank":2,"title":"Refunds"}'
    assert fields_sha256(document) == sha256_hex(document.encode("utf-8"))
    assert len(fields_sha256(document)) == 64
    assert fields_sha256(document) == fields_sha256(document).lower()


def test_fields_absent_and_null_differ() -> None:
    assert canonical_fields({}) == "{}"
    assert canonical_fields({"title": None}) == '{"title":null}'


def test_fields_nest_and_keep_array_order() -> None:
    values = {"metadata": {"tags": ["b", "a"], "z": {"y": True, "x": False}}}
    assert canonical_fields(values) == '{"metadata":{"tags":["b","a"],"z":{"x":false,"y":true}}}'
    assert canonical_fields({"t": ["a", "b"]}) != canonical_fields({"t": ["b", "a"]})
    assert canonical_fields({"t": ("a", "b")}) == canonical_fields({"t": ["a", "b"]})


def test_fields_strings_are_canonical_text_and_written_unescaped() -> None:
    values = {"title": "Cafe\u0301\r\nmenu \u2603", "e\u0301": {"cle\u0301": "x"}}
    document = canonical_fields(values)
    assert document == '{"title":"Caf\u00e9\\nmenu \u2603","\u00e9":{"cl\u00e9":"x"}}'
    # Control characters are escaped as json.dumps escapes them, nothing else.
    assert (
        canonical_fields({"t": 'a\t"\\\u0001\u007f\u2028'})
        == '{"t":"a\\t\\"\\\\\\u0001\u007f\u2028"}'
    )


def test_fields_numbers_use_python_repr() -> None:
    assert canonical_fields({"n": 1}) == '{"n":1}'
    assert canonical_fields({"n": 1.0}) == '{"n":1.0}'
    assert canonical_fields({"n": 1e16}) == '{"n":1e+16}'
    assert canonical_fields({"n": 0.1}) == '{"n":0.1}'
    assert canonical_fields({"n": -0.0}) == '{"n":-0.0}'
    assert canonical_fields({"n": 10**20}) == '{"n":100000000000000000000}'
    assert canonical_fields({"n": True}) == '{"n":true}'


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_fields_refuse_nan_and_infinity(number: float) -> None:
    with pytest.raises(ValueError, match=r'^payload field "metadata.score": NaN'):
        canonical_fields({"title": "ok", "metadata.score": number})
    with pytest.raises(ValueError, match=r'^payload field "metadata": NaN'):
        canonical_fields({"metadata": {"scores": [1.0, number]}})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"m": {"e\u0301": 1, "\u00e9": 2}}, 'payload field "m": two keys are equal'),
        ({"m": {"a\r\nb": 1, "a\nb": 2}}, 'payload field "m": two keys are equal'),
        ({"e\u0301": 1, "\u00e9": 2}, 'payload field "\\u00e9": two keys are equal'),
        ({"m": {1: "x"}}, 'payload field "m": a key is not a string but int'),
        ({"m": {"b": b"secret"}}, 'payload field "m": a value is not JSON but bytes'),
        ({"m": {"s": {"secret"}}}, 'payload field "m": a value is not JSON but set'),
        ({"title": "secret \ud800"}, 'payload field "title": contains a lone surrogate'),
        ({"ok": "x", "t\ud800": "secret"}, 'payload field "t\\ud800": contains a lone surrogate'),
    ],
)
def test_fields_without_a_canonical_form_are_refused(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        canonical_fields(values)
    assert str(caught.value) == message or str(caught.value).startswith(message)
    assert "secret" not in str(caught.value)


def test_fields_nested_too_deeply_are_refused_not_a_crash() -> None:
    value: object = "secret"
    for _ in range(5000):
        value = {"a": [value]}
    with pytest.raises(ValueError, match=r'^payload field "m": nested too deeply$'):
        canonical_fields({"m": value})


def test_fields_messages_cut_long_field_paths() -> None:
    with pytest.raises(ValueError) as caught:
        canonical_fields({"x" * 500: math.nan})
    assert len(str(caught.value)) < 200


def reference_fields(values: dict[str, object]) -> str:
    """The recipe in the module docstring and docs/architecture.md, verbatim."""

    def canonical(value: object) -> object:
        if isinstance(value, str):
            value = unicodedata.normalize("NFC", value)
            return value.replace("\r\n", "\n").replace("\r", "\n")
        if isinstance(value, dict):
            return {canonical(k): canonical(v) for k, v in value.items()}
        if isinstance(value, list):
            return [canonical(v) for v in value]
        return value

    document = json.dumps(
        canonical(values),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(document.encode("utf-8")).hexdigest()


# Keys that stay distinct in canonical form, so the documented recipe and the
# refusal of colliding keys agree.
field_keys = st.text(alphabet="abcxyz.\u00e9\u2603 ", min_size=1, max_size=6)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | unicode_text,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(field_keys, children, max_size=3)
    ),
    max_leaves=10,
)
field_values = st.dictionaries(field_keys, json_values, max_size=4)


@given(field_values)
def test_fields_match_the_documented_recipe(values: dict[str, object]) -> None:
    assert fields_sha256(canonical_fields(values)) == reference_fields(values)


@given(field_values, st.randoms(use_true_random=False))
def test_fields_key_order_is_irrelevant(values: dict[str, object], random: Random) -> None:
    items = list(values.items())
    random.shuffle(items)
    assert canonical_fields(dict(items)) == canonical_fields(values)


def decomposed(value: object) -> object:
    """``value`` with every string, keys included, in NFD and with CRLF line endings."""
    if isinstance(value, str):
        return unicodedata.normalize("NFD", canonical_text(value)).replace("\n", "\r\n")
    if isinstance(value, dict):
        return {decomposed(k): decomposed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decomposed(v) for v in value]
    return value


@given(field_values)
def test_fields_nfc_equivalent_strings_hash_the_same(values: dict[str, object]) -> None:
    assert canonical_fields(decomposed(values)) == canonical_fields(values)  # type: ignore[arg-type]


@given(field_values)
def test_fields_canonical_form_is_idempotent(values: dict[str, object]) -> None:
    document = canonical_fields(values)
    assert canonical_fields(json.loads(document)) == document
