"""Drift classes: what kind of difference a hash mismatch hides, without any model.

When a chunk's text hashes differently from its record and the record holds
the authoritative text, :func:`classify` compares the two and names the
difference (docs/metrics-and-audit.md, "Drift classes"):

- ``format_only``: only whitespace or line wrapping differs;
- ``edit``: a small change (words, numbers, characters);
- ``injection``: the authoritative text is still there and content was added;
- ``truncation``: part of the authoritative text is missing, nothing added;
- ``replacement``: little of the authoritative text remains.

The comparison is on whitespace-separated tokens of the canonical text
(integrity.canonical_text): the common leading and trailing tokens are
matched first (C-speed slice comparisons), and only the differing middle is
diffed with ``difflib.SequenceMatcher``, at most ``MAX_DIFF_TOKENS`` tokens of
it; a longer middle is compared by the runs of three tokens the two sides
share (multisets counted in C). So the work is bounded whatever the index returns:
linear in the texts' length, and past ``MAX_CLASSIFIED_CHARS`` nothing is
tokenised at all. The class is a triage hint for people and alerts: the chunk
is rejected HASH_MISMATCH whatever it is.
"""

from __future__ import annotations

from collections import Counter
from difflib import SequenceMatcher
from enum import StrEnum
from typing import Final

from sidecar.core.integrity import canonical_text


class Drift(StrEnum):
    """The drift classes. Metric label values and audit fields: add, never rename."""

    FORMAT_ONLY = "format_only"
    EDIT = "edit"
    INJECTION = "injection"
    TRUNCATION = "truncation"
    REPLACEMENT = "replacement"


# Drift classes that point at tampering; the others at stale re-ingestion.
TAMPERING: Final = frozenset({Drift.INJECTION, Drift.REPLACEMENT})

# Tokens of the differing middle diffed in order (both sides together); past
# this the middle is compared by shared runs of three tokens, so an index
# returning megabytes cannot make the gate spend quadratic time on one chunk.
MAX_DIFF_TOKENS: Final = 2000
# Past this many characters (both texts together) only containment is checked
# (injection at either end, truncation at either end) and anything else has no
# class: tokenising costs about 0.1 us per character. Chunks are usually a few KiB.
MAX_CLASSIFIED_CHARS: Final = 262_144
# Below this share of the authoritative tokens kept in place, text was
# added and little of the original remains: a replacement.
REPLACEMENT_BELOW: Final = 0.5
# An injection adds at least this many tokens in one run (a short instruction
# is longer than a changed word or number)...
INJECTION_MIN_TOKENS: Final = 4
# ... and adds at least this many times as many tokens as it removes (an
# injected sentence glued to the last word changes that word: one removal).
INJECTION_GROWTH: Final = 3
# A truncation removes at least this many tokens in one run, adding at most
# one (the token cut in the middle); fewer is an edit.
TRUNCATION_MIN_TOKENS: Final = 4


def classify(authoritative: str, returned: str) -> Drift | None:
    """The drift class of ``returned`` against the record's ``authoritative`` text.

    None when the two are the same text once canonical (no drift), and for
    texts longer than MAX_CLASSIFIED_CHARS together that are not one inside
    the other (unknown: alerts treat it as unclassified). Pure and
    deterministic; the thresholds are the module's constants.
    """
    expected, actual = canonical_text(authoritative), canonical_text(returned)
    if expected == actual:
        return None
    if len(expected) + len(actual) > MAX_CLASSIFIED_CHARS:
        return _containment(expected, actual)
    # str.split() splits on every Unicode whitespace run: line wrapping,
    # indentation, tabs and non-breaking spaces are all "format", and so is a
    # word broken across lines (re-wrapping at a hyphen).
    old, new = expected.split(), actual.split()
    if old == new or "".join(old) == "".join(new):
        return Drift.FORMAT_ONLY
    if not old:
        return Drift.INJECTION  # nothing to lose: everything returned was added
    if not new:
        return Drift.TRUNCATION
    diff = _diff(old, new)
    if diff.inserted <= 1 and diff.longest_deleted >= TRUNCATION_MIN_TOKENS:
        return Drift.TRUNCATION
    if diff.inserted > 1 and diff.kept < REPLACEMENT_BELOW * len(old):
        return Drift.REPLACEMENT
    if (
        diff.longest_inserted >= INJECTION_MIN_TOKENS
        and diff.inserted >= INJECTION_GROWTH * diff.deleted
    ):
        return Drift.INJECTION
    return Drift.EDIT


def _containment(expected: str, actual: str) -> Drift | None:
    """Texts too long to tokenise: only what whole-string comparisons (memcmp) tell."""
    if actual.startswith(expected) or actual.endswith(expected):
        return Drift.INJECTION
    if expected.startswith(actual) or expected.endswith(actual):
        return Drift.TRUNCATION
    return None


class _Diff:
    """Token counts of a diff: kept in order, deleted, inserted, longest runs."""

    __slots__ = ("deleted", "inserted", "kept", "longest_deleted", "longest_inserted")

    def __init__(self) -> None:
        self.kept = self.deleted = self.inserted = 0
        self.longest_deleted = self.longest_inserted = 0

    def change(self, deleted: int, inserted: int) -> None:
        self.deleted += deleted
        self.inserted += inserted
        self.longest_deleted = max(self.longest_deleted, deleted)
        self.longest_inserted = max(self.longest_inserted, inserted)


def _diff(old: list[str], new: list[str]) -> _Diff:
    """The token diff of ``old`` -> ``new``, bounded by MAX_DIFF_TOKENS."""
    diff = _Diff()
    prefix = _common_prefix(old, new)
    # The suffix may not overlap the prefix on either side.
    suffix = _common_suffix(old, new, min(len(old), len(new)) - prefix)
    diff.kept = prefix + suffix
    old_middle = old[prefix : len(old) - suffix]
    new_middle = new[prefix : len(new) - suffix]
    if not old_middle or not new_middle:
        diff.change(len(old_middle), len(new_middle))
    elif len(old_middle) + len(new_middle) <= MAX_DIFF_TOKENS:
        matcher = SequenceMatcher(None, old_middle, new_middle, autojunk=True)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                diff.kept += i2 - i1
            else:
                diff.change(i2 - i1, j2 - j1)
    else:
        _shingled(old_middle, new_middle, diff)
    return diff


def _shingled(old: list[str], new: list[str], diff: _Diff) -> None:
    """Too long to diff in order: the tokens kept are estimated by the runs of
    three tokens both sides share (counted in C; order-sensitive
    locally, so unrelated texts of one vocabulary share little). The runs of
    changes are unknown here: each side's whole change counts as one run."""
    shared = (_trigrams(old) & _trigrams(new)).total()
    kept = min(shared + 2 if shared else 0, len(old), len(new))
    diff.kept += kept
    diff.change(len(old) - kept, len(new) - kept)


def _trigrams(tokens: list[str]) -> Counter[tuple[str, str, str]]:
    # A multiset: a text repeating itself shares each repetition once.
    return Counter(zip(tokens, tokens[1:], tokens[2:], strict=False))


# Tokens compared per slice when matching a common prefix or suffix: one C-level
# comparison per block, then one by one inside the first block that differs.
_BLOCK = 256


def _common_prefix(a: list[str], b: list[str]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i + _BLOCK <= n and a[i : i + _BLOCK] == b[i : i + _BLOCK]:
        i += _BLOCK
    end = min(i + _BLOCK, n)
    while i < end and a[i] == b[i]:
        i += 1
    return i


def _common_suffix(a: list[str], b: list[str], limit: int) -> int:
    """How many trailing tokens ``a`` and ``b`` share, at most ``limit``."""
    la, lb = len(a), len(b)
    i = 0
    while i + _BLOCK <= limit and a[la - i - _BLOCK : la - i] == b[lb - i - _BLOCK : lb - i]:
        i += _BLOCK
    end = min(i + _BLOCK, limit)
    while i < end and a[la - i - 1] == b[lb - i - 1]:
        i += 1
    return i
