"""Step three of a response: the audit record and the metrics, before the answer leaves.

A decision that cannot be recorded is not released: the audit write comes
first and its failure turns the answer into an error (``audit_unavailable``).
With ``audit.log_decisions`` each record written is also one INFO line on the
``sidecar.decisions`` logger: ids, route, codes, counts and latency, never a
text (chunk, query or upstream error).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sidecar.audit.record import AuditRecord, Release, Substitution, UpstreamError
from sidecar.audit.sink import AuditError, AuditSink
from sidecar.core.caller import Caller
from sidecar.core.decision import Verdict
from sidecar.core.hits import Route
from sidecar.core.modes import Mode
from sidecar.core.outcome import Outcome
from sidecar.core.reasons import Reason
from sidecar.enforcement.deciding import Decided
from sidecar.enforcement.releasing import Released
from sidecar.metrics import ADMITTED_REASON, UPSTREAM_ERROR_OUTCOME, GateMetrics
from sidecar.refusals import code_of

log = logging.getLogger(__name__)
# Its own logger, so that operators can route or silence the per-decision lines.
decision_log = logging.getLogger("sidecar.decisions")

_ADMITTED = ("admitted", ADMITTED_REASON)
# Principal-set digests remembered for audit records (a few hundred bytes each).
_DIGESTS_KEPT = 4096


@dataclass(slots=True)
class ResponseFacts:
    """What every audit record of one response says, whatever became of the response.

    Not frozen: one is built per response on the hot path (see ``deciding.Decided``).
    """

    decision_id: str
    request_id: str
    caller: Caller
    format_name: str
    route: Route
    mode: Mode
    started: float  # time.perf_counter() when the body arrived
    collection: str  # the metrics' collection label (GateMetrics.collection_label)


class Recorder:
    """Writes the audit record of each response and counts it in the metrics."""

    def __init__(
        self,
        audit: AuditSink,
        metrics: GateMetrics,
        clock: Callable[[], datetime],
        *,
        verdict_cache_on: bool,
        log_decisions: bool = False,
    ) -> None:
        """``clock`` dates each record (timezone-aware, as the decision core's is).

        ``verdict_cache_on``: count verdict-cache misses (only meaningful with a cache).
        ``log_decisions``: log one line per record written (``decision_log``).
        """
        self._audit = audit
        self._metrics = metrics
        self._clock = clock
        self._verdict_cache_on = verdict_cache_on
        self._log_decisions = log_decisions
        self._digests: dict[frozenset[str], str] = {}

    def decided(
        self,
        facts: ResponseFacts,
        decided: Decided,
        released: Released,
        *,
        tenant_filter: bool,
        overfetched: bool,
        upstream: UpstreamError | None = None,
    ) -> None:
        """Record and count a decided response; raises AuditError if it could not be recorded.

        ``upstream``: the error the body reported beside its hits, if any.
        Nothing is counted for a response whose record was not written: the
        caller answers with an error, which ``unrecorded`` counts.
        """
        verdict = decided.verdict
        self._write(
            self._record(
                facts,
                released.outcome,
                verdict=verdict,
                release=_release(decided, released, tenant_filter, overfetched),
                upstream=upstream,
            ),
            facts,
        )
        if decided.replacements:
            self._metrics.substitutions.inc(len(decided.replacements))
        self._count(facts, verdict, released.outcome, tenant_filter)

    def unreadable(self, facts: ResponseFacts, outcome: Outcome, error: str) -> None:
        """Record and count a body that could not be read; raises AuditError."""
        self._write(self._record(facts, outcome, error=error), facts)
        self._metrics.count_response(outcome, facts.format_name, facts.collection)

    def upstream_error(
        self, facts: ResponseFacts, outcome: Outcome, error: str, upstream: UpstreamError
    ) -> None:
        """Record and count an upstream error answer; raises AuditError.

        ``outcome`` is what the client got: ``error`` (the gate's answer,
        counted as ``upstream_error``) or ``passthrough`` (audit mode: the
        upstream's); ``error`` the gate's code for it.
        """
        self._write(self._record(facts, outcome, error=error, upstream=upstream), facts)
        label = UPSTREAM_ERROR_OUTCOME if outcome is Outcome.ERROR else outcome
        self._metrics.count_response(label, facts.format_name, facts.collection)

    def unrecorded(self, facts: ResponseFacts) -> None:
        """Count a response answered with an error because its record could not be written."""
        self._metrics.count_response(Outcome.ERROR, facts.format_name, facts.collection)

    def passthrough(self, format_name: str, collection: str) -> None:
        """Count a response on a route the gate does not inspect (or an upstream error)."""
        self._metrics.count_response(Outcome.PASSTHROUGH, format_name, collection)

    def policy_failed(self) -> None:
        """Count a policy evaluation that failed."""
        self._metrics.policy_errors.inc()

    def _record(
        self,
        facts: ResponseFacts,
        outcome: Outcome,
        *,
        verdict: Verdict | None = None,
        release: Release | None = None,
        error: str | None = None,
        upstream: UpstreamError | None = None,
    ) -> AuditRecord:
        return AuditRecord(
            decision_id=facts.decision_id,
            request_id=facts.request_id,
            time=self._clock(),
            tenant=facts.caller.tenant,
            principals_sha256=self._principals_digest(facts.caller),
            format=facts.format_name,
            mode=facts.mode,
            outcome=outcome,
            latency_ms=round((time.perf_counter() - facts.started) * 1000, 3),
            verdict=verdict,
            release=release,
            error=error,
            upstream=upstream,
        )

    def _count(
        self, facts: ResponseFacts, verdict: Verdict, outcome: Outcome, tenant_filter: bool
    ) -> None:
        counts: dict[tuple[str, str], int] = {}
        # Every reason of each rejected chunk: a tampered chunk that is also
        # superseded is still tampered (drift alerts read these).
        every: dict[str, int] = {}
        drifts: dict[str, int] = {}
        for decision in verdict.decisions:
            reasons = decision.reasons
            if reasons:
                key = ("rejected", reasons[0])
                for reason in reasons:
                    every[reason] = every.get(reason, 0) + 1
                drift = decision.drift
                if drift is not None:
                    drifts[drift] = drifts.get(drift, 0) + 1
            else:
                key = _ADMITTED
            counts[key] = counts.get(key, 0) + 1
        metrics = self._metrics
        format_name, collection = facts.format_name, facts.collection
        metrics.count_chunks(format_name, collection, counts)
        if every:
            metrics.count_reasons(format_name, collection, every)
            if drifts:
                metrics.count_drift(format_name, collection, drifts)
            leaked = every.get(Reason.TENANT_MISMATCH) if tenant_filter else None
            if leaked:
                # The database was asked for the caller's tenant only and
                # answered with another's: push-down is not working.
                metrics.pushdown_tenant_mismatches.labels(format_name, collection).inc(leaked)
        metrics.count_response(outcome, format_name, collection)
        if verdict.verdicts_cached:
            metrics.verdict_cache_hits.inc(verdict.verdicts_cached)
        if verdict.verdicts_evaluated and self._verdict_cache_on:
            metrics.verdict_cache_misses.inc(verdict.verdicts_evaluated)
        metrics.decision_seconds.observe(time.perf_counter() - facts.started)

    def _principals_digest(self, caller: Caller) -> str:
        """``caller.principals_digest()``, remembered per principal set (bounded)."""
        digest = self._digests.get(caller.principals)
        if digest is None:
            if len(self._digests) >= _DIGESTS_KEPT:
                self._digests.clear()
            digest = self._digests[caller.principals] = caller.principals_digest()
        return digest

    def _write(self, record: AuditRecord, facts: ResponseFacts) -> None:
        try:
            self._audit.write(record.to_dict())
        except AuditError:
            self._metrics.audit_errors.inc()
            log.error("audit record %s could not be written", record.decision_id)
            raise
        self._metrics.audit_records.inc()
        if self._log_decisions:
            _log_decision(record, facts.route)


def _log_decision(record: AuditRecord, route: Route) -> None:
    """The per-decision line: what the record says, counted; no text of any kind.

    The code is the gate's (``error`` or ``refusal``), the upstream code a
    number or a database's token (``UpstreamError``); ``-`` where there is none.
    """
    verdict, release, upstream = record.verdict, record.release, record.upstream
    decisions = () if verdict is None else verdict.decisions
    refusal = None if release is None else release.refusal
    decision_log.info(
        "decision %s %s %s format=%s mode=%s outcome=%s code=%s upstream_code=%s "
        "candidates=%d released=%d rejected=%d latency_ms=%.3f",
        record.decision_id,
        route.method,
        route.path,
        record.format,
        record.mode,
        record.outcome,
        record.error or refusal or "-",
        "-" if upstream is None else upstream.code,
        len(decisions),
        0 if release is None else len(release.released),
        sum(1 for decision in decisions if decision.reasons),
        record.latency_ms,
    )


def _release(
    decided: Decided, released: Released, tenant_filter: bool, overfetched: bool
) -> Release:
    """The audit view of what went out: ids as the client got them (substitutes by their own)."""
    replacements = decided.replacements
    by_position = {d.position: d.chunk_id for d in decided.verdict.decisions}
    ids = [
        replacements[p].chunk_id if p in replacements else by_position[p]
        for p in released.positions
    ]
    hashes = decided.hashes
    digests = [hashes.get(p) for p in released.positions]
    if not replacements:
        return Release(
            ids, tenant_filter, overfetched, refusal=code_of(released.refusal), sha256=digests
        )
    kept = decided.kept
    decisions = decided.verdict.decisions
    return Release(
        ids,
        tenant_filter,
        overfetched,
        admitted=[
            replacements[d.position].chunk_id if d.position in replacements else d.chunk_id
            for d in decisions
            if d.position in kept
        ],
        substituted=[
            Substitution(d.position, d.chunk_id, replacements[d.position].chunk_id)
            for d in decisions
            if d.position in replacements
        ],
        refusal=code_of(released.refusal),
        sha256=digests,
    )
