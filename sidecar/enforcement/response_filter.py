"""The response path, protocol-free: body in, filtered body (or an error) out.

Ties the pieces together for one response: the format adapter parses the
body, the cached store looks every chunk up in one batch, the gate decides,
the mode (enforce, strict, audit) decides what the client gets, and metrics
and the audit record are written before the answer leaves. Any failure ends
in an error answer, never in the unfiltered body (except in audit mode, whose
whole point is to pass bodies through).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import orjson

from sidecar.audit.jsonl import AuditError, AuditSink
from sidecar.core.caller import Caller
from sidecar.core.decision import Verdict
from sidecar.core.gate import Gate
from sidecar.core.hits import Candidate, Replacement, Route
from sidecar.core.modes import Mode, RoutePolicy
from sidecar.core.outcome import Outcome
from sidecar.core.reasons import Reason
from sidecar.core.record import ChunkRecord
from sidecar.formats.base import (
    MalformedBody,
    RequestRewrite,
    RequestRewriter,
    ResponseFormat,
    Unreleasable,
)
from sidecar.formats.registry import FormatTable
from sidecar.metrics import ADMITTED_REASON, GateMetrics
from sidecar.store.cache import CachedStore

log = logging.getLogger(__name__)


_ADMITTED = ("admitted", ADMITTED_REASON)
# Principal-set digests remembered for audit records (a few hundred bytes each).
_DIGESTS_KEPT = 4096

# What may be wrong with a superseded chunk for its successor to take its place.
_SUBSTITUTABLE = frozenset({Reason.STATUS_SUPERSEDED, Reason.EXPIRED})


@dataclass(frozen=True, slots=True)
class FilterResult:
    """What to send the client instead of the upstream body.

    ``body`` is the replacement body for a 200 (None: pass the upstream body
    unchanged). For any other ``status`` the client gets that status and
    ``body`` (a small JSON error) instead of the upstream response.
    """

    outcome: str
    status: int
    body: bytes | None
    headers: dict[str, str] = field(default_factory=dict)


def _error_body(code: str, decision_id: str | None = None) -> bytes:
    document: dict[str, str] = {"error": code}
    if decision_id is not None:
        document["decision_id"] = decision_id
    return orjson.dumps(document)


class ResponseFilter:
    """Decides search responses for one sidecar process."""

    def __init__(
        self,
        *,
        formats: FormatTable,
        store: CachedStore,
        gate: Gate,
        audit: AuditSink,
        metrics: GateMetrics,
        route_policy: Callable[[str], RoutePolicy],
        overfetch_cap: int = 1000,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._formats = formats
        self._store = store
        self._gate = gate
        self._audit = audit
        self._metrics = metrics
        self._route_policy = route_policy
        self._overfetch_cap = overfetch_cap
        self._clock = clock
        self._digests: dict[frozenset[str], str] = {}

    def format_for(self, route: Route) -> ResponseFormat | None:
        """The format whose responses on ``route`` must be filtered, or None to pass them."""
        return self._formats.response_format(route)

    def rewriter_for(self, fmt: ResponseFormat, route: Route) -> RequestRewriter | None:
        """The format's request rewriter when this route pushes the tenant down or over-fetches."""
        policy = self._route_policy(route.path)
        if policy.tenant_key is None and policy.overfetch_factor <= 1:
            return None
        if not isinstance(fmt, RequestRewriter) or not fmt.rewrites_request(route):
            return None
        return fmt

    def rewrite_request(
        self, rewriter: RequestRewriter, route: Route, caller: Caller, body: bytes
    ) -> RequestRewrite:
        """Inject the caller's tenant filter and over-fetch; raises MalformedRequest."""
        policy = self._route_policy(route.path)
        return rewriter.rewrite_request(
            body,
            route,
            tenant=caller.tenant,
            tenant_key=policy.tenant_key,
            overfetch_factor=policy.overfetch_factor,
            overfetch_cap=self._overfetch_cap,
        )

    def count_passthrough(self, format_name: str) -> None:
        """Count a response on a route the gate does not inspect (or an upstream error)."""
        self._metrics.count_response(Outcome.PASSTHROUGH, format_name)

    def reject_unreadable(
        self, fmt: ResponseFormat, route: Route, caller: Caller, request_id: str, why: str
    ) -> FilterResult:
        """Answer for a search response the gate cannot read (e.g. compressed): 502."""
        log.warning("unreadable %s response on %s: %s", fmt.name, route.path, why)
        return self._unreadable(
            "upstream_body_unreadable", fmt, route, caller, request_id, time.perf_counter()
        )

    async def filter(
        self,
        fmt: ResponseFormat,
        route: Route,
        caller: Caller,
        request_id: str,
        body: bytes,
        rewrite: RequestRewrite | None = None,
    ) -> FilterResult:
        """Decide one successful search response body.

        ``rewrite`` is what the request path did to the query, if anything: its
        limits trim over-fetched results back to what the application asked for.
        """
        started = time.perf_counter()
        route_policy = self._route_policy(route.path)
        mode = route_policy.mode
        decision_id = uuid.uuid4().hex
        try:
            parsed = fmt.parse(body, route)
        except MalformedBody as exc:
            log.warning("malformed %s body on %s: %s", fmt.name, route.path, exc)
            return self._unreadable(
                "upstream_body_malformed", fmt, route, caller, request_id, started
            )

        candidates = parsed.candidates
        ids = {c.chunk_id for c in candidates if c.chunk_id is not None and c.text is not None}
        lookup = await self._store.fetch_partial(ids)
        now = self._clock()
        verdict = self._gate.decide(caller, candidates, lookup.records, lookup.unavailable, now)
        if verdict.policy_failed:
            self._metrics.policy_errors.inc()
        replacements: dict[int, Replacement] = {}
        if route_policy.substitute_superseded and mode is not Mode.AUDIT:
            replacements = await self._successors(caller, verdict, lookup.records, now)

        limits = rewrite.limits if rewrite is not None and rewrite.overfetched else None
        kept = verdict.admitted_positions | replacements.keys()
        refusal = "rejected_chunks"  # the error a client gets when the response is blocked
        rendered: list[frozenset[int]] = []  # the keep set the body was rendered with

        def render(keep: frozenset[int]) -> bytes:
            rendered.append(keep)
            return parsed.render(keep, limits, replacements)

        try:
            outcome, status, new_body = self._apply_mode(
                mode,
                kept,
                len(verdict.decisions),
                render,
                trims=limits is not None,
            )
            # The client may get fewer hits than were kept: over-fetch trims
            # admitted hits beyond k, and a format drops a kept hit whose
            # container went (an emptied group, a reference inside a removed hit).
            # Unrendered, it gets every hit (audit mode) or none (blocked).
            if rendered:
                released = parsed.released_positions(rendered[-1], limits)
            else:
                released = list(range(len(verdict.decisions))) if status == 200 else []
        except MalformedBody as exc:
            # E.g. fewer sub-results than the rewritten request had sub-queries.
            log.warning("malformed %s body on %s: %s", fmt.name, route.path, exc)
            return self._unreadable(
                "upstream_body_malformed", fmt, route, caller, request_id, started
            )
        except Unreleasable as exc:
            # What is left would still carry what was removed (e.g. generated text).
            log.info("%s response on %s blocked: %s", fmt.name, route.path, exc.code)
            outcome, status, new_body, released, refusal = Outcome.BLOCKED, 403, None, [], exc.code
        headers = {
            "x-retrieval-gate-decision-id": decision_id,
            # What the client got, never what was kept: the difference would
            # count the rejected hits, which the client must not learn.
            "x-retrieval-gate-admitted": str(len(released)),
        }
        record = self._record(decision_id, request_id, caller, fmt, mode, verdict, started)
        record["tenant_filter"] = rewrite is not None and rewrite.tenant_filter
        record["overfetched"] = limits is not None
        if status != 200:
            record["refusal"] = refusal
        by_position = {d.position: d.chunk_id for d in verdict.decisions}
        record["released"] = [
            replacements[p].chunk_id if p in replacements else by_position[p] for p in released
        ]
        if replacements:
            record["admitted"] = [
                replacements[d.position].chunk_id if d.position in replacements else d.chunk_id
                for d in verdict.decisions
                if d.position in kept
            ]
            record["substituted"] = [
                {
                    "position": d.position,
                    "chunk_id": d.chunk_id,
                    "substitute": replacements[d.position].chunk_id,
                }
                for d in verdict.decisions
                if d.position in replacements
            ]
            self._metrics.substitutions.inc(len(replacements))
        try:
            self._write_audit(record | {"outcome": outcome})
        except AuditError:
            # A decision that cannot be recorded is not released.
            self._metrics.count_response(Outcome.ERROR, fmt.name)
            return FilterResult(Outcome.ERROR, 500, _error_body("audit_unavailable"))

        counts: dict[tuple[str, str], int] = {}
        for decision in verdict.decisions:
            reasons = decision.reasons
            key = ("rejected", reasons[0]) if reasons else _ADMITTED
            counts[key] = counts.get(key, 0) + 1
        metrics = self._metrics
        metrics.count_chunks(fmt.name, counts)
        metrics.count_response(outcome, fmt.name)
        if verdict.verdicts_cached:
            metrics.verdict_cache_hits.inc(verdict.verdicts_cached)
        if verdict.verdicts_evaluated and self._gate.verdict_cache is not None:
            metrics.verdict_cache_misses.inc(verdict.verdicts_evaluated)
        metrics.decision_seconds.observe(time.perf_counter() - started)
        if status != 200:
            return FilterResult(outcome, status, _error_body(refusal, decision_id), headers)
        return FilterResult(outcome, 200, new_body, headers)

    def _unreadable(
        self,
        error: str,
        fmt: ResponseFormat,
        route: Route,
        caller: Caller,
        request_id: str,
        started: float,
    ) -> FilterResult:
        """A search response the gate cannot read: 502, or passed and recorded in audit mode."""
        mode = self._route_policy(route.path).mode
        decision_id = uuid.uuid4().hex
        outcome = Outcome.PASSTHROUGH if mode is Mode.AUDIT else Outcome.ERROR
        self._write_audit(
            self._record(decision_id, request_id, caller, fmt, mode, None, started)
            | {"outcome": outcome, "error": error}
        )
        self._metrics.count_response(outcome, fmt.name)
        if mode is Mode.AUDIT:
            return FilterResult(outcome, 200, None)
        return FilterResult(outcome, 502, _error_body(error, decision_id))

    async def _successors(
        self,
        caller: Caller,
        verdict: Verdict,
        records: Mapping[str, ChunkRecord],
        now: datetime,
    ) -> dict[int, Replacement]:
        """Successors that take the place of superseded chunks, where they pass every check.

        A chunk qualifies only when superseded (and perhaps expired with it) is
        all that is wrong with it; the successor's text comes from the store and
        is decided like any candidate, so nothing the caller may not read is
        substituted.
        """
        wanted: dict[int, str] = {}
        for decision in verdict.decisions:
            reasons = set(decision.reasons)
            if Reason.STATUS_SUPERSEDED not in reasons or not reasons <= _SUBSTITUTABLE:
                continue
            record = records.get(decision.chunk_id or "")
            if record is not None and record.superseded_by:
                wanted[decision.position] = record.superseded_by
        if not wanted:
            return {}
        lookup = await self._store.fetch_partial(set(wanted.values()))
        successors = [
            Candidate(position, chunk_id, lookup.records[chunk_id].text)
            for position, chunk_id in wanted.items()
            if chunk_id in lookup.records
        ]
        decided = self._gate.decide(caller, successors, lookup.records, lookup.unavailable, now)
        return {
            d.position: Replacement(d.chunk_id, text)
            for d, candidate in zip(decided.decisions, successors, strict=True)
            if d.admitted and d.chunk_id is not None and (text := candidate.text) is not None
        }

    @staticmethod
    def _apply_mode(
        mode: Mode,
        kept: frozenset[int],
        total: int,
        render: Callable[[frozenset[int]], bytes],
        *,
        trims: bool,
    ) -> tuple[str, int, bytes | None]:
        if mode is Mode.AUDIT:
            # Over-fetched results still go back to the asked-for size.
            return Outcome.PASSTHROUGH, 200, render(frozenset(range(total))) if trims else None
        if len(kept) == total:
            # Nothing removed, but still rendered: some formats carry side
            # structures computed beyond the returned hits (Elasticsearch
            # aggregations, Weaviate Aggregate) that never go out unfiltered.
            return Outcome.FILTERED, 200, render(kept)
        if mode is Mode.STRICT:
            return Outcome.BLOCKED, 403, None
        outcome = Outcome.ABSTAINED if not kept else Outcome.FILTERED
        return outcome, 200, render(kept)

    def _record(
        self,
        decision_id: str,
        request_id: str,
        caller: Caller,
        fmt: ResponseFormat,
        mode: Mode,
        verdict: Verdict | None,
        started: float,
    ) -> dict[str, object]:
        record: dict[str, object] = {
            "decision_id": decision_id,
            "request_id": request_id,
            "time": datetime.now(UTC).isoformat(timespec="microseconds"),
            "tenant": caller.tenant,
            "principals_sha256": self._principals_digest(caller),
            "format": fmt.name,
            "mode": mode.value,
        }
        if verdict is not None:
            candidates: list[str | None] = []
            rejected: list[dict[str, object]] = []
            admitted: list[str | None] = []
            for d in verdict.decisions:
                candidates.append(d.chunk_id)
                if d.reasons:
                    entry: dict[str, object] = {
                        "position": d.position,
                        "chunk_id": d.chunk_id,
                        "reasons": list(d.reasons),
                    }
                    if d.detail:
                        entry["detail"] = d.detail
                    rejected.append(entry)
                else:
                    admitted.append(d.chunk_id)
            record["policy_version"] = verdict.policy_version
            record["candidates"] = candidates
            record["rejected"] = rejected
            record["admitted"] = admitted
        record["latency_ms"] = round((time.perf_counter() - started) * 1000, 3)
        return record

    def _principals_digest(self, caller: Caller) -> str:
        """``caller.principals_digest()``, remembered per principal set (bounded)."""
        digest = self._digests.get(caller.principals)
        if digest is None:
            if len(self._digests) >= _DIGESTS_KEPT:
                self._digests.clear()
            digest = self._digests[caller.principals] = caller.principals_digest()
        return digest

    def _write_audit(self, record: dict[str, object]) -> None:
        try:
            self._audit.write(record)
        except AuditError:
            self._metrics.audit_errors.inc()
            log.error("audit record %s could not be written", record["decision_id"])
            raise
        self._metrics.audit_records.inc()
