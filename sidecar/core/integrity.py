"""Canonical chunk text, canonical payload fields, and their hashes.

A chunk record's ``sha256`` is the SHA-256 of the chunk text in its canonical
form, and its ``payload_sha256`` the SHA-256 of the canonical JSON of the
payload fields the operator declared; the gate compares both against the same
hashes of what a vector database returns. Operators compute them in their own
ingestion scripts, so both forms are a public contract and never change.

**Text.**

1. Unicode normalisation form NFC.
2. Line endings: every CRLF (``"\\r\\n"``) and every remaining lone CR
   (``"\\r"``) becomes LF (``"\\n"``).
3. Encode as UTF-8 (no byte order mark) and take SHA-256; the hash is written
   as 64 lowercase hexadecimal digits.

Nothing else changes: no trimming, no whitespace collapsing, no case folding,
no other newline characters (such as U+2028) converted. Steps 1 and 2 commute,
so their order does not matter. Text containing lone surrogates cannot be
encoded as UTF-8 and has no canonical hash (``UnicodeEncodeError``).

In Python::

    text = unicodedata.normalize("NFC", text)
    text = text.replace("\\r\\n", "\\n").replace("\\r", "\\n")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()

**Payload fields.** The declared fields present on a hit, as one JSON object:

1. Keys are the declared field paths as written in the configuration
   (``"title"``, ``"metadata.source"``), values are the fields' values as the
   hit carries them. A declared field the hit does not have is left out (it is
   not ``null``); a field whose value is ``null`` is in, as ``null``.
2. Every string in it, keys of nested objects included, is put in the
   canonical text form above (NFC, LF line endings). Objects and arrays may
   nest; array order is kept.
3. Serialised as Python's
   ``json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
   allow_nan=False)`` writes it: keys sorted by code point at every level, no
   whitespace, non-ASCII characters as they are, only ``"``, ``\\`` and
   U+0000-U+001F escaped (``\\n``, ``\\t``, ``\\u001f``...); ``true``,
   ``false``, ``null``; integers in full; floats as Python's ``repr`` gives
   them (``1.0``, ``0.1``, ``1e+16``, ``-0.0``). A JSON number with a
   fraction or an exponent is read as a float, one without as an integer, and
   ``1.0`` and ``1`` hash differently: ingestion must hash each number with
   the type the database returns it as.
4. Encode as UTF-8 and take SHA-256, 64 lowercase hexadecimal digits.

Values without a canonical form make ``canonical_fields`` raise ValueError:
NaN and infinite numbers, a non-string key, two keys of one object that are
equal once canonical, lone surrogates, anything that is not JSON, and nesting
deeper than Python's recursion limit allows (a few hundred levels).

In Python (or give the record ``payload`` and let ``store load`` compute it)::

    def canonical(value):
        if isinstance(value, str):
            value = unicodedata.normalize("NFC", value)
            return value.replace("\\r\\n", "\\n").replace("\\r", "\\n")
        if isinstance(value, dict):
            return {canonical(k): canonical(v) for k, v in value.items()}
        if isinstance(value, list):
            return [canonical(v) for v in value]
        return value

    fields = {"title": doc["title"], "metadata.source": doc["metadata"]["source"]}
    document = json.dumps(canonical(fields), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, allow_nan=False)
    payload_sha256 = hashlib.sha256(document.encode("utf-8")).hexdigest()
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from collections.abc import Mapping

# Field paths in messages are cut to this many characters.
_MAX_QUOTED = 80
# What json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
# allow_nan=False) uses, built once: json.dumps builds one per call, which
# costs more than the encoding of a hit's few fields.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_text(text: str) -> str:
    """Return ``text`` in canonical form (NFC, LF line endings)."""
    # Both checks are single C-level scans, far cheaper than normalize() and
    # replace(), which would copy the string even when nothing changes.
    if not text.isascii() and not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def canonical_sha256(text: str) -> str:
    """SHA-256 (64 lowercase hex digits) of the canonical form of ``text``."""
    return hashlib.sha256(canonical_text(text).encode("utf-8")).hexdigest()


def canonical_fields(values: Mapping[str, object]) -> str:
    """The canonical JSON of a hit's declared payload fields (field path -> value).

    ``values`` holds only the declared fields the hit has. Raises ValueError,
    naming the field path but never its value, for a value with no canonical
    form (see the module docstring).
    """
    canonical: dict[str, object] = {}
    for field, value in values.items():
        try:
            _put(canonical, field, value)
        except ValueError as exc:
            raise ValueError(f"payload field {_quoted(field)}: {exc}") from None
        except RecursionError:
            # Deeper than Python's stack allows: refused like any other value
            # without a canonical form, not left to crash the caller.
            raise ValueError(f"payload field {_quoted(field)}: nested too deeply") from None
    document = _ENCODER.encode(canonical)
    if not document.isascii() and not _utf8_encodable(document):
        # Rare: find the field to name, one at a time (``canonical`` keeps the order).
        field = next(
            field
            for field, value in zip(values, canonical.values(), strict=True)
            if not _utf8_encodable(json.dumps([field, value], ensure_ascii=False))
        )
        raise ValueError(f"payload field {_quoted(field)}: contains a lone surrogate")
    return document


def fields_sha256(canonical: str) -> str:
    """SHA-256 (64 lowercase hex digits) of the UTF-8 of ``canonical``, a
    ``canonical_fields`` result."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _quoted(field: object) -> str:
    """A field path for a message: JSON-quoted (so it cannot forge lines), at most 80 characters."""
    name = str(field)
    return json.dumps(name if len(name) <= _MAX_QUOTED else name[:_MAX_QUOTED] + "…")


def _utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _put(into: dict[str, object], key: object, value: object) -> None:
    """Set ``into[canonical key] = canonical value``, refusing keys that collide."""
    if not isinstance(key, str):
        raise ValueError(f"a key is not a string but {type(key).__name__}")
    name = canonical_text(key)
    if name in into:
        raise ValueError("two keys are equal in canonical form (NFC, LF line endings)")
    into[name] = _canonical(value)


def _canonical(value: object) -> object:
    """``value`` with every string in canonical text form; ValueError when not JSON."""
    # Most frequent types first: this runs for every hit of every response.
    if isinstance(value, str):
        return canonical_text(value)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("NaN and infinite numbers have no JSON form")
        return value
    if isinstance(value, dict):
        nested: dict[str, object] = {}
        for key, item in value.items():
            _put(nested, key, item)
        return nested
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    raise ValueError(f"a value is not JSON but {type(value).__name__}")
