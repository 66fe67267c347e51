"""The decision core: caller + candidates + records + clock -> one decision per chunk.

Pure: no I/O, no Envoy, no HTTP. The caller of :meth:`Gate.decide` has already
looked the candidates up in the metadata store; the gate runs the checks that
need no policy (shape, presence, integrity), evaluates the Rego policy once for
the whole batch, and merges everything into reasons in canonical order.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sidecar.formats.base import Candidate
from sidecar.identity import Caller
from sidecar.integrity import canonical_sha256
from sidecar.policy.engine import PolicyEngine, PolicyError
from sidecar.reasons import Reason, ReasonOrder
from sidecar.records import ChunkRecord

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MICROSECOND = timedelta(microseconds=1)


def to_epoch_ns(moment: datetime) -> int:
    """Nanoseconds since the Unix epoch, exact to the microsecond (no float rounding)."""
    return (moment - _EPOCH) // _ONE_MICROSECOND * 1000


@dataclass(frozen=True, slots=True)
class ChunkDecision:
    position: int
    chunk_id: str | None
    reasons: tuple[str, ...]  # canonical order; empty means admitted
    detail: str | None = None  # why a chunk is MALFORMED_CHUNK; never chunk text

    @property
    def admitted(self) -> bool:
        return not self.reasons

    @property
    def primary(self) -> str | None:
        """The first failing reason: the one counted in metrics."""
        return self.reasons[0] if self.reasons else None


@dataclass(frozen=True, slots=True)
class Verdict:
    decisions: tuple[ChunkDecision, ...]
    policy_version: str
    policy_failed: bool

    @property
    def admitted_positions(self) -> frozenset[int]:
        return frozenset(d.position for d in self.decisions if d.admitted)

    @property
    def admitted_count(self) -> int:
        return sum(1 for d in self.decisions if d.admitted)

    @property
    def rejected_count(self) -> int:
        return len(self.decisions) - self.admitted_count


def policy_input(caller: Caller, records: Sequence[ChunkRecord], now: datetime) -> dict[str, Any]:
    """Build the policy input document (contract in policies/README.md)."""
    return {
        "caller": {
            "tenant": caller.tenant,
            "principals": sorted(caller.principals),
            "drafts_allowed": caller.drafts_allowed,
        },
        "now_ns": to_epoch_ns(now),
        "chunks": [
            {
                "id": r.chunk_id,
                "doc_id": r.doc_id,
                "version": r.version,
                "tenant_id": r.tenant_id,
                "allowed_principals": list(r.allowed_principals),
                "status": r.status.value,
                "effective_at_ns": to_epoch_ns(r.effective_at),
                "expires_at_ns": None if r.expires_at is None else to_epoch_ns(r.expires_at),
                "requires_signature": r.requires_signature,
                "source_uri": r.source_uri,
            }
            for r in records
        ],
    }


def _text_matches(text: str, expected_sha256: str) -> bool:
    try:
        return canonical_sha256(text) == expected_sha256
    except UnicodeEncodeError:
        # Lone surrogates have no canonical hash, so they cannot match any record.
        return False


class Gate:
    """Decides, per candidate chunk, whether this caller may use it now."""

    def __init__(self, policy: PolicyEngine, order: ReasonOrder | None = None) -> None:
        self._policy = policy
        self._order = order or ReasonOrder()

    def decide(
        self,
        caller: Caller,
        candidates: Sequence[Candidate],
        records: Mapping[str, ChunkRecord],
        unavailable: Collection[str],
        now: datetime,
    ) -> Verdict:
        """Return one decision per candidate, in candidate order.

        ``records`` holds the store's answer for the candidates' ids; an id in
        ``unavailable`` could not be looked up. ``now`` must be timezone-aware.
        """
        if now.tzinfo is None:
            raise ValueError("now must be timezone-aware")

        # Policy input is per unique record: batch responses repeat chunks.
        to_evaluate: dict[str, ChunkRecord] = {}
        for candidate in candidates:
            if candidate.chunk_id is not None and candidate.text is not None:
                record = records.get(candidate.chunk_id)
                if record is not None and candidate.chunk_id not in unavailable:
                    to_evaluate[candidate.chunk_id] = record

        policy_reasons: Mapping[str, list[str]] | None = {}
        if to_evaluate:
            try:
                policy_reasons = self._policy.evaluate(
                    policy_input(caller, list(to_evaluate.values()), now)
                )
            except PolicyError:
                policy_reasons = None

        decisions = tuple(
            self._decide_one(candidate, to_evaluate, unavailable, policy_reasons)
            for candidate in candidates
        )
        return Verdict(
            decisions=decisions,
            policy_version=self._policy.version,
            policy_failed=policy_reasons is None,
        )

    def _decide_one(
        self,
        candidate: Candidate,
        evaluated: Mapping[str, ChunkRecord],
        unavailable: Collection[str],
        policy_reasons: Mapping[str, list[str]] | None,
    ) -> ChunkDecision:
        chunk_id = candidate.chunk_id
        if chunk_id is None or candidate.text is None:
            detail = candidate.problem or "hit has no id or no text"
            return ChunkDecision(candidate.position, chunk_id, (Reason.MALFORMED_CHUNK,), detail)
        if chunk_id in unavailable:
            return ChunkDecision(candidate.position, chunk_id, (Reason.METADATA_UNAVAILABLE,))
        record = evaluated.get(chunk_id)
        if record is None:
            return ChunkDecision(candidate.position, chunk_id, (Reason.MISSING_METADATA,))

        reasons: list[str] = []
        if policy_reasons is None:
            reasons.append(Reason.POLICY_ERROR)
        else:
            verdict = policy_reasons.get(chunk_id)
            if verdict is None:
                # A policy that says nothing about a chunk has not admitted it.
                reasons.append(Reason.POLICY_ERROR)
            else:
                reasons.extend(r if self._order.known(r) else Reason.POLICY_DENY for r in verdict)
        if not _text_matches(candidate.text, record.sha256):
            reasons.append(Reason.HASH_MISMATCH)
        if record.requires_signature and not record.signature_valid:
            reasons.append(Reason.SIGNATURE_MISSING)
        return ChunkDecision(candidate.position, chunk_id, self._order.sort(reasons))
