"""The audit record of an answer verification: what was checked, never the text.

Written to the same sink as decision records and chained like them
(``sidecar.audit.chain``). ``kind`` tells it apart from a decision record (a
verification's id is never accepted as a decision id). Chunk texts and quotes
are the application's content: the record keeps only their SHA-256, so that
whoever holds the text can show it is the one that was checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from sidecar.audit.decisions import KIND_FIELD
from sidecar.core.answer_check import AnswerCheck, Claim

ANSWER_VERIFICATION: Final = "answer_verification"


def text_digest(text: str) -> str:
    """SHA-256 of ``text`` as UTF-8 (a lone surrogate as U+FFFD), as sent: no normalisation."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


@dataclass(frozen=True, slots=True)
class VerificationRecord:
    """One ``Gate/VerifyAnswer`` call: the caller, the decisions, the claims and verdicts."""

    verification_id: str
    request_id: str
    time: datetime
    tenant: str
    principals_sha256: str
    decision_ids: Sequence[str]
    texts_sha256: dict[str, str]  # chunk id -> text_digest of the text sent
    claims: Sequence[Claim]
    check: AnswerCheck
    latency_ms: float

    def to_dict(self) -> dict[str, object]:
        """The JSON object a sink writes (field names are part of the interface)."""
        return {
            "decision_id": self.verification_id,
            KIND_FIELD: ANSWER_VERIFICATION,
            "request_id": self.request_id,
            "time": self.time.isoformat(timespec="microseconds"),
            "tenant": self.tenant,
            "principals_sha256": self.principals_sha256,
            "decisions": list(self.decision_ids),
            "unknown_decisions": list(self.check.unknown_decisions),
            "chunks": [
                {"chunk_id": chunk_id, "text_sha256": digest}
                for chunk_id, digest in self.texts_sha256.items()
            ],
            "claims": [
                {
                    "position": position,
                    "chunk_ids": list(claim.chunk_ids),
                    "quotes_sha256": [text_digest(quote) for quote in claim.quotes],
                    "verdict": verdict.verdict,  # a StrEnum: serialises as its value
                    **({} if verdict.chunk_id is None else {"chunk_id": verdict.chunk_id}),
                    **({} if verdict.quote is None else {"quote": verdict.quote}),
                }
                for position, (claim, verdict) in enumerate(
                    zip(self.claims, self.check.claims, strict=True)
                )
            ],
            "supported": self.check.supported,
            "latency_ms": self.latency_ms,
        }
