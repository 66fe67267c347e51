"""The answer check (sidecar/core/answer_check.py): verdicts, their order, quote normalisation.

The hypothesis property: no answer quoting a span that is absent from every
released text is supported, whatever else is right about it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.answer_check import (
    Claim,
    ClaimVerdict,
    ReleasedChunks,
    check_answer,
    normalise_quote,
)
from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.core.integrity import canonical_sha256
from tests.fixtures.records import chunk_record

NOW = datetime(2026, 1, 1, tzinfo=UTC)
CALLER = Caller("acme", frozenset({"group:qa"}))
TEXTS = {"a": "The pump\u2019s valve\nmust be \u201cclosed\u201d  first.", "b": "Drain the tank."}


def _decision(texts: dict[str, str] = TEXTS, caller: Caller = CALLER) -> ReleasedChunks:
    return ReleasedChunks(
        caller.tenant,
        caller.principals_digest(),
        {chunk_id: canonical_sha256(text) for chunk_id, text in texts.items()},
    )


def _current(texts: dict[str, str] = TEXTS, **changes: object) -> dict[str, ChunkRecord]:
    return {
        chunk_id: chunk_record(chunk_id, sha256=canonical_sha256(text), **changes)
        for chunk_id, text in texts.items()
    }


def _check(claims: list[Claim], **kwargs: object) -> list[ClaimVerdict]:
    arguments: dict[str, object] = {
        "caller": CALLER,
        "decisions": {"d1": _decision()},
        "claims": claims,
        "texts": TEXTS,
        "current": _current(),
        "now": NOW,
        **kwargs,
    }
    answer = check_answer(**arguments)  # type: ignore[arg-type]
    return [c.verdict for c in answer.claims]


def test_quotes_match_after_nfc_quote_marks_and_whitespace() -> None:
    quote = 'pump\'s valve must be "closed" first'
    assert _check([Claim(("a",), (quote,))]) == [ClaimVerdict.SUPPORTED]
    # Decomposed e + combining acute is found in a composed text, and the reverse.
    assert normalise_quote("cafe\u0301") == normalise_quote("caf\u00e9")
    assert normalise_quote("  a\u00a0\u2028b\t") == "a b"
    # Case, dashes and other punctuation are not normalised.
    assert _check([Claim(("a",), ("The Pump",))]) == [ClaimVerdict.QUOTE_NOT_FOUND]
    assert _check([Claim(("a",), ("   ",))]) == [ClaimVerdict.QUOTE_NOT_FOUND]


def test_a_quote_must_be_in_the_claims_own_citations() -> None:
    assert _check([Claim(("b",), ("valve",))]) == [ClaimVerdict.QUOTE_NOT_FOUND]
    assert _check([Claim(("a", "b"), ("valve", "Drain"))]) == [ClaimVerdict.SUPPORTED]


def test_verdicts_in_order_released_text_since_quotes() -> None:
    other = Caller("globex", frozenset({"group:qa"}))
    assert _check([Claim(("c",))]) == [ClaimVerdict.NOT_RELEASED]
    assert _check([Claim(())]) == [ClaimVerdict.NOT_RELEASED]
    assert _check([Claim(("a",))], decisions={"d1": _decision(caller=other)}) == [
        ClaimVerdict.UNKNOWN_DECISION
    ]
    assert _check([Claim(("a",))], decisions={"d1": _decision(), "d2": None}) == [
        ClaimVerdict.SUPPORTED
    ]
    assert _check([Claim(("c",))], decisions={"d1": _decision(), "d2": None}) == [
        ClaimVerdict.UNKNOWN_DECISION
    ]
    tampered = {**TEXTS, "a": TEXTS["a"] + " "}
    assert _check([Claim(("a",), ("nowhere",))], texts=tampered) == [ClaimVerdict.TEXT_MISMATCH]
    assert _check([Claim(("a",))], texts={"b": TEXTS["b"]}) == [ClaimVerdict.TEXT_MISMATCH]
    for status in (Status.REVOKED, Status.QUARANTINED, Status.DRAFT):
        assert _check([Claim(("a",), ("nowhere",))], current=_current(status=status)) == [
            ClaimVerdict.REVOKED_SINCE
        ]
    assert _check([Claim(("a",))], current={}) == [ClaimVerdict.REVOKED_SINCE]
    assert _check([Claim(("a",))], current=_current(status=Status.SUPERSEDED)) == [
        ClaimVerdict.SUPERSEDED_SINCE
    ]
    assert _check([Claim(("a",))], current=_current(expires_at=NOW - timedelta(1))) == [
        ClaimVerdict.SUPERSEDED_SINCE
    ]
    changed = {chunk_id: chunk_record(chunk_id, sha256="0" * 64) for chunk_id in TEXTS}
    assert _check([Claim(("a",))], current=changed) == [ClaimVerdict.SUPERSEDED_SINCE]


def test_a_released_chunk_without_its_admitted_hash_matches_no_text() -> None:
    unhashed = ReleasedChunks("acme", CALLER.principals_digest(), {"a": None})
    assert _check([Claim(("a",))], decisions={"d1": unhashed}) == [ClaimVerdict.TEXT_MISMATCH]
    surrogate = {**TEXTS, "a": "\ud800"}
    assert _check([Claim(("a",))], decisions={"d1": unhashed}, texts=surrogate) == [
        ClaimVerdict.TEXT_MISMATCH
    ]


def test_the_answer_is_supported_only_when_every_claim_and_decision_is() -> None:
    good = Claim(("a",), ("valve",))
    answer = check_answer(CALLER, {"d1": _decision()}, [good], TEXTS, _current(), NOW)
    assert answer.supported
    answer = check_answer(CALLER, {"d1": _decision(), "x": None}, [good], TEXTS, _current(), NOW)
    assert not answer.supported and answer.unknown_decisions == ("x",)


_text = st.text(alphabet=st.sampled_from("ab \u2019'\"\u201c\n\u00e9e\u0301."), max_size=30)


@settings(max_examples=300, deadline=None)
@given(
    texts=st.dictionaries(st.sampled_from("abcd"), _text, min_size=1, max_size=4),
    quote=_text,
    others=st.lists(_text, max_size=3),
    cite=st.data(),
)
def test_no_answer_quoting_a_span_absent_from_every_released_text_is_supported(
    texts: dict[str, str], quote: str, others: list[str], cite: st.DataObject
) -> None:
    absent = normalise_quote(quote)
    if any(absent in normalise_quote(text) for text in texts.values()):
        return  # the span is somewhere: not the case this property is about
    cited = tuple(cite.draw(st.lists(st.sampled_from(sorted(texts)), min_size=1, max_size=3)))
    quotes = [*others, quote]
    position = cite.draw(st.integers(0, len(quotes) - 1))
    quotes.insert(position, quotes.pop())
    claims = [Claim(cited, tuple(quotes))]
    answer = check_answer(CALLER, {"d1": _decision(texts)}, claims, texts, _current(texts), NOW)
    assert answer.claims[0].verdict is not ClaimVerdict.SUPPORTED
    assert not answer.supported
