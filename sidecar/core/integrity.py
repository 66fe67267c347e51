"""Canonical chunk text and its hash.

A chunk record's ``sha256`` is the SHA-256 of the chunk text in this canonical
form, and the gate compares it against the same hash of the text a vector
database returns. Operators compute it in their own ingestion scripts, so the
form is a public contract and never changes:

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
"""

from __future__ import annotations

import hashlib
import unicodedata


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
