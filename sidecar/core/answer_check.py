"""Checking an answer's citations and quotes against the decisions that released them.

An application that shows a generated answer sends, with it, the decision ids
of its retrievals, per claim the chunk ids it cites and the spans it quotes,
and the texts of those chunks as it holds them. Each claim gets one verdict
(:class:`ClaimVerdict`), decided here from three things the caller cannot
change: what the audit trail says each decision released to whom (with the
SHA-256 of each released text), the chunk records as the store holds them
now, and the texts and quotes as sent. Pure: no store, no audit trail, no
protocol (``sidecar.enforcement.answer_verification`` gathers the inputs).

**Quote matching.** A quote is supported when, after :func:`normalise_quote`,
it is a substring of one of its claim's cited chunk texts after the same
normalisation. The normalisation:

1. Unicode normalisation form NFC;
2. quotation marks unified: the single ones (U+2018, U+2019, U+201A,
   U+201B, the prime U+2032, U+2039, U+203A and the ASCII apostrophe) become
   ``'``, the double ones (U+201C, U+201D, U+201E, U+201F, the double prime
   U+2033, U+00AB, U+00BB and ``"``) become ``"``;
3. every run of whitespace (``str.isspace``: spaces, tabs, line breaks,
   no-break and other Unicode spaces) becomes one space, and leading and
   trailing whitespace is removed.

Nothing else: case, punctuation other than quotation marks, dashes and
ellipses must match as written. An empty quote (after normalisation) is
never found: it would be a substring of anything.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.core.integrity import canonical_sha256


class ClaimVerdict(StrEnum):
    """What the gate can say of one claim, in the order the checks are made."""

    SUPPORTED = "supported"
    # A decision id is unknown or not this caller's, and a cited chunk is in none of the others.
    UNKNOWN_DECISION = "unknown_decision"
    # A cited chunk was not admitted and released to this caller by the given decisions.
    NOT_RELEASED = "not_released"
    # The text sent for a cited chunk is not the text whose hash the gate admitted.
    TEXT_MISMATCH = "text_mismatch"
    # The record was revoked, quarantined, withdrawn to draft or deleted since.
    REVOKED_SINCE = "revoked_since"
    # The record was superseded, expired or given another text since.
    SUPERSEDED_SINCE = "superseded_since"
    # A quote is not a literal span of the claim's cited texts (after normalisation).
    QUOTE_NOT_FOUND = "quote_not_found"


_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b\u2032\u2039\u203a"
_DOUBLE_QUOTES = '"\u201c\u201d\u201e\u201f\u2033\u00ab\u00bb'
_QUOTE_TABLE = str.maketrans(
    {**dict.fromkeys(_SINGLE_QUOTES, "'"), **dict.fromkeys(_DOUBLE_QUOTES, '"')}
)
# re's \s is Unicode-aware for str patterns: the same set as str.isspace.
_WHITESPACE = re.compile(r"\s+")
_REVOKED = frozenset({Status.REVOKED, Status.QUARANTINED, Status.DRAFT})


def normalise_quote(text: str) -> str:
    """``text`` as quotes are matched: NFC, quotation marks unified, whitespace collapsed."""
    text = unicodedata.normalize("NFC", text).translate(_QUOTE_TABLE)
    return _WHITESPACE.sub(" ", text).strip()


@dataclass(frozen=True, slots=True)
class ReleasedChunks:
    """One decision as the audit trail holds it: whose it was and what it released.

    ``released`` maps each chunk id the caller got, admitted, to the SHA-256
    of the canonical text the gate admitted (None when the record does not
    say: a record written before the hashes were kept, or a chunk released
    without being admitted, in audit mode).
    """

    tenant: str
    principals_sha256: str
    released: Mapping[str, str | None]


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim of an answer: the chunk ids it cites and the spans it quotes from them."""

    chunk_ids: tuple[str, ...]
    quotes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimCheck:
    """A claim's verdict, with the cited chunk or the quote (by index) it is about."""

    verdict: ClaimVerdict
    chunk_id: str | None = None
    quote: int | None = None


@dataclass(frozen=True, slots=True)
class AnswerCheck:
    """The verdict on every claim, in order, and the decision ids that were of no use."""

    claims: tuple[ClaimCheck, ...]
    unknown_decisions: tuple[str, ...]

    @property
    def supported(self) -> bool:
        """True when every claim is supported and every decision id was the caller's."""
        return not self.unknown_decisions and all(
            c.verdict is ClaimVerdict.SUPPORTED for c in self.claims
        )


def check_answer(
    caller: Caller,
    decisions: Mapping[str, ReleasedChunks | None],
    claims: Sequence[Claim],
    texts: Mapping[str, str],
    current: Mapping[str, ChunkRecord],
    now: datetime,
) -> AnswerCheck:
    """The verdict on each of ``claims``.

    ``decisions``: each decision id the application sent, with what the audit
    trail holds for it (None: no such decision). A decision made for another
    caller (tenant or principal set) counts as no decision, so that another
    tenant's decision ids cannot be probed. ``texts``: the chunk texts as the
    application holds them, by chunk id. ``current``: the cited chunks'
    records as the store holds them now (a missing id: deleted). ``now``:
    timezone-aware, for expiry.
    """
    digest = caller.principals_digest()
    unknown: list[str] = []
    released: dict[str, set[str | None]] = {}
    for decision_id, decision in decisions.items():
        if (
            decision is None
            or decision.tenant != caller.tenant
            or decision.principals_sha256 != digest
        ):
            unknown.append(decision_id)
            continue
        for chunk_id, sha256 in decision.released.items():
            released.setdefault(chunk_id, set()).add(sha256)
    normalised: dict[str, str] = {}
    checks = tuple(
        _check_claim(claim, released, bool(unknown), texts, current, now, normalised)
        for claim in claims
    )
    return AnswerCheck(checks, tuple(unknown))


def _check_claim(
    claim: Claim,
    released: Mapping[str, set[str | None]],
    some_unknown: bool,
    texts: Mapping[str, str],
    current: Mapping[str, ChunkRecord],
    now: datetime,
    normalised: dict[str, str],
) -> ClaimCheck:
    """One claim: released, then the same text, then unchanged since, then its quotes."""
    if not claim.chunk_ids:
        # Nothing cited: nothing the gate released supports it.
        return ClaimCheck(ClaimVerdict.NOT_RELEASED)
    for chunk_id in claim.chunk_ids:
        if chunk_id not in released:
            # It may have been released by the decision the gate could not use.
            missing = ClaimVerdict.UNKNOWN_DECISION if some_unknown else ClaimVerdict.NOT_RELEASED
            return ClaimCheck(missing, chunk_id)
    for chunk_id in claim.chunk_ids:
        text = texts.get(chunk_id)
        sha256 = None if text is None else _text_sha256(text)
        if sha256 is None or sha256 not in released[chunk_id]:
            return ClaimCheck(ClaimVerdict.TEXT_MISMATCH, chunk_id)
    for chunk_id in claim.chunk_ids:
        changed = _since(current.get(chunk_id), released[chunk_id], now)
        if changed is not None:
            return ClaimCheck(changed, chunk_id)
    cited = [_normalised(chunk_id, texts[chunk_id], normalised) for chunk_id in claim.chunk_ids]
    for index, quote in enumerate(claim.quotes):
        if not _found(normalise_quote(quote), cited):
            return ClaimCheck(ClaimVerdict.QUOTE_NOT_FOUND, quote=index)
    return ClaimCheck(ClaimVerdict.SUPPORTED)


def _text_sha256(text: str) -> str | None:
    try:
        return canonical_sha256(text)
    except UnicodeEncodeError:  # a lone surrogate: no canonical text, never a match
        return None


def _since(
    record: ChunkRecord | None, admitted: set[str | None], now: datetime
) -> ClaimVerdict | None:
    """How the record changed since the decision, or None when it did not."""
    if record is None or record.status in _REVOKED:
        return ClaimVerdict.REVOKED_SINCE
    if (
        record.status is Status.SUPERSEDED
        or record.sha256 not in admitted
        or (record.expires_at is not None and now >= record.expires_at)
    ):
        return ClaimVerdict.SUPERSEDED_SINCE
    return None


def _normalised(chunk_id: str, text: str, memo: dict[str, str]) -> str:
    found = memo.get(chunk_id)
    if found is None:
        found = memo[chunk_id] = normalise_quote(text)
    return found


def _found(quote: str, texts: Iterable[str]) -> bool:
    return bool(quote) and any(quote in text for text in texts)
