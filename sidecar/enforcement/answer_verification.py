"""Answer verification, protocol-free: an answer's claims in, a verdict per claim out.

Gathers what :func:`~sidecar.core.answer_check.check_answer` decides from:
the decisions from the audit trail (``sidecar.audit.decisions``), the cited
chunks' records from the store itself (not the cache: the question is whether
they changed *since*), then records the verification in the audit trail,
chained like decisions, and counts it. A verification that cannot be recorded
is not answered (:class:`VerificationFailed`), as a decision that cannot be
recorded is not released.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sidecar import refusals
from sidecar.audit.decisions import DecisionSource, DecisionsUnavailable
from sidecar.audit.sink import AuditError, AuditSink
from sidecar.audit.verification_record import VerificationRecord, text_digest
from sidecar.core.answer_check import AnswerCheck, Claim, check_answer
from sidecar.core.caller import Caller
from sidecar.metrics import GateMetrics
from sidecar.refusals import Refusal
from sidecar.store.cache import CachedStore
from sidecar.store.store import StoreUnavailable

log = logging.getLogger(__name__)

# Bounds on one call: the work and the audit record grow with them.
MAX_DECISIONS = 256
MAX_CLAIMS = 1024
MAX_CITATIONS = 64  # chunk ids or quotes per claim


class VerificationRefused(ValueError):
    """The request cannot be verified as sent (too large, a chunk sent twice)."""


class VerificationFailed(Exception):
    """The audit trail or the store could not be read, or the record written: no answer.

    ``refusal`` is what the caller is told (``audit_unavailable``,
    ``metadata_unavailable``).
    """

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.code)
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class Verification:
    """The verdicts, and the id of the audit record that keeps them."""

    verification_id: str
    check: AnswerCheck


class AnswerVerifier:
    """Checks answers for one sidecar process."""

    def __init__(
        self,
        decisions: DecisionSource,
        store: CachedStore,
        audit: AuditSink,
        metrics: GateMetrics,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._decisions = decisions
        self._store = store
        self._audit = audit
        self._metrics = metrics
        self._clock = clock

    async def verify(
        self,
        caller: Caller,
        request_id: str,
        decision_ids: Sequence[str],
        claims: Sequence[Claim],
        texts: Sequence[tuple[str, str]],
    ) -> Verification:
        """A verdict per claim of an answer the caller is about to show.

        ``texts``: (chunk id, text) as the application holds them. Raises
        VerificationRefused for a request out of bounds or ambiguous, and
        VerificationFailed when the trail or the store cannot be read or the
        record cannot be written.
        """
        started = time.perf_counter()
        held = _texts(texts)
        _check_bounds(decision_ids, claims)
        cited = list(dict.fromkeys(chunk_id for claim in claims for chunk_id in claim.chunk_ids))
        try:
            found = await self._decisions.find(decision_ids)
            current = await self._store.fetch_current(cited) if cited else {}
        except DecisionsUnavailable as exc:
            log.error("answer verification: %s", exc)
            raise VerificationFailed(refusals.AUDIT_UNAVAILABLE) from None
        except StoreUnavailable as exc:
            log.error("answer verification: the metadata store is unavailable: %s", exc)
            raise VerificationFailed(refusals.METADATA_UNAVAILABLE) from None
        decisions = {decision_id: found.get(decision_id) for decision_id in decision_ids}
        check = check_answer(caller, decisions, claims, held, current, self._clock())
        record = VerificationRecord(
            uuid.uuid4().hex,
            request_id,
            self._clock(),
            caller.tenant,
            caller.principals_digest(),
            list(dict.fromkeys(decision_ids)),
            {chunk_id: text_digest(text) for chunk_id, text in held.items()},
            claims,
            check,
            round((time.perf_counter() - started) * 1000, 3),
        )
        try:
            self._audit.write(record.to_dict())
        except AuditError:
            self._metrics.audit_errors.inc()
            log.error("verification %s could not be recorded", record.verification_id)
            raise VerificationFailed(refusals.AUDIT_UNAVAILABLE) from None
        self._metrics.audit_records.inc()
        self._metrics.count_verification(check)
        return Verification(record.verification_id, check)

    async def aclose(self) -> None:
        """Close the audit trail's reader."""
        await self._decisions.aclose()


def _texts(texts: Sequence[tuple[str, str]]) -> Mapping[str, str]:
    held: dict[str, str] = {}
    for chunk_id, text in texts:
        if held.get(chunk_id, text) != text:
            raise VerificationRefused("a chunk id is sent twice with different texts")
        held[chunk_id] = text
    return held


def _check_bounds(decision_ids: Sequence[str], claims: Sequence[Claim]) -> None:
    if not decision_ids:
        raise VerificationRefused("no decision id: verify against the retrievals' decisions")
    if len(decision_ids) > MAX_DECISIONS:
        raise VerificationRefused(f"more than {MAX_DECISIONS} decision ids")
    if len(claims) > MAX_CLAIMS:
        raise VerificationRefused(f"more than {MAX_CLAIMS} claims")
    for position, claim in enumerate(claims):
        if len(claim.chunk_ids) > MAX_CITATIONS or len(claim.quotes) > MAX_CITATIONS:
            raise VerificationRefused(
                f"claim {position}: more than {MAX_CITATIONS} chunk ids or quotes"
            )
