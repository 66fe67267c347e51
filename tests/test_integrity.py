"""The canonical text form and its hash (a public contract, see sidecar/integrity.py)."""

from __future__ import annotations

import hashlib
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.integrity import canonical_sha256, canonical_text


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
