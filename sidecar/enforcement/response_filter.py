"""The response path, protocol-free: body in, filtered body (or an error) out.

One response goes through three steps, each in its own module: ``deciding``
(the cached store looks every candidate up in one batch, the decision core
decides), ``releasing`` (the route's mode decides what the client gets; the
adapter renders it) and ``recording`` (the audit record and the metrics,
written before the answer leaves). Any failure ends in an error answer, never
in the unfiltered body, except in audit mode, whose whole point is to pass
bodies through.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sidecar import refusals
from sidecar.audit.sink import AuditError, AuditSink
from sidecar.core.caller import Caller
from sidecar.core.gate import Gate
from sidecar.core.hits import Route
from sidecar.core.modes import Mode, RoutePolicy
from sidecar.core.outcome import Outcome
from sidecar.enforcement.deciding import Decider
from sidecar.enforcement.recording import Recorder, ResponseFacts
from sidecar.enforcement.releasing import release
from sidecar.formats.base import (
    MalformedBody,
    RequestRewrite,
    RequestRewriter,
    ResponseFormat,
)
from sidecar.formats.registry import FormatTable
from sidecar.metrics import GateMetrics
from sidecar.store.cache import CachedStore

log = logging.getLogger(__name__)

# Route policies remembered per request path.
_POLICIES_KEPT = 4096


@dataclass(slots=True)
class FilterResult:
    """What to send the client instead of the upstream body (not frozen: see ``Decided``).

    ``body`` is the replacement body for a 200 (None: pass the upstream body
    unchanged). For any other ``status`` the client gets that status and
    ``body`` (a small JSON error) instead of the upstream response.
    """

    outcome: Outcome
    status: int
    body: bytes | None
    headers: dict[str, str] = field(default_factory=dict)


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
        self._route_policy = route_policy
        self._policies: dict[str, RoutePolicy] = {}
        self._overfetch_cap = overfetch_cap
        self._decider = Decider(store, gate, clock)
        self._recorder = Recorder(
            audit, metrics, clock, verdict_cache_on=gate.verdict_cache is not None
        )

    def format_for(self, route: Route) -> ResponseFormat | None:
        """The format whose responses on ``route`` must be filtered, or None to pass them."""
        return self._formats.response_format(route)

    def rewriter_for(self, fmt: ResponseFormat, route: Route) -> RequestRewriter | None:
        """The format's request rewriter when this route pushes the tenant down or over-fetches."""
        policy = self._policy_for(route.path)
        if policy.tenant_key is None and policy.overfetch_factor <= 1:
            return None
        if not isinstance(fmt, RequestRewriter) or not fmt.rewrites_request(route):
            return None
        return fmt

    def rewrite_request(
        self, rewriter: RequestRewriter, route: Route, caller: Caller, body: bytes
    ) -> RequestRewrite:
        """Inject the caller's tenant filter and over-fetch; raises MalformedRequest."""
        policy = self._policy_for(route.path)
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
        self._recorder.passthrough(format_name)

    def reject_unreadable(
        self, fmt: ResponseFormat, route: Route, caller: Caller, request_id: str, why: str
    ) -> FilterResult:
        """Answer for a search response the gate cannot read (e.g. compressed): 502."""
        log.warning("unreadable %s response on %s: %s", fmt.name, route.path, why)
        mode = self._policy_for(route.path).mode
        facts = ResponseFacts(
            uuid.uuid4().hex, request_id, caller, fmt.name, mode, time.perf_counter()
        )
        return self._unreadable(facts, refusals.UPSTREAM_BODY_UNREADABLE)

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
        policy = self._policy_for(route.path)
        facts = ResponseFacts(uuid.uuid4().hex, request_id, caller, fmt.name, policy.mode, started)
        try:
            parsed = fmt.parse(body, route)
        except MalformedBody as exc:
            log.warning("malformed %s body on %s: %s", fmt.name, route.path, exc)
            return self._unreadable(facts, refusals.UPSTREAM_BODY_MALFORMED)

        substitute = policy.substitute_superseded and policy.mode is not Mode.AUDIT
        decided = await self._decider.decide(caller, parsed.candidates, substitute=substitute)
        if decided.verdict.policy_failed:
            self._recorder.policy_failed()

        limits = rewrite.limits if rewrite is not None and rewrite.overfetched else None
        try:
            released = release(policy.mode, parsed, decided, limits)
        except MalformedBody as exc:
            # E.g. fewer sub-results than the rewritten request had sub-queries.
            log.warning("malformed %s body on %s: %s", fmt.name, route.path, exc)
            return self._unreadable(facts, refusals.UPSTREAM_BODY_MALFORMED)
        if released.status == 403 and released.refusal != refusals.REJECTED_CHUNKS:
            log.info("%s response on %s blocked: %s", fmt.name, route.path, released.refusal)

        try:
            self._recorder.decided(
                facts,
                decided,
                released,
                tenant_filter=rewrite is not None and rewrite.tenant_filter,
                overfetched=limits is not None,
            )
        except AuditError:
            # A decision that cannot be recorded is not released.
            return self._unrecorded(fmt.name)

        headers = {
            "x-retrieval-gate-decision-id": facts.decision_id,
            # What the client got, never what was kept: the difference would
            # count the rejected hits, which the client must not learn.
            "x-retrieval-gate-admitted": str(len(released.positions)),
        }
        if released.status != 200:
            assert released.refusal is not None
            error = refusals.error_body(released.refusal, decision_id=facts.decision_id)
            return FilterResult(released.outcome, released.status, error, headers)
        return FilterResult(released.outcome, 200, released.body, headers)

    def _unreadable(self, facts: ResponseFacts, error: str) -> FilterResult:
        """A search response the gate cannot read: 502, or passed and recorded in audit mode."""
        audit_mode = facts.mode is Mode.AUDIT
        outcome = Outcome.PASSTHROUGH if audit_mode else Outcome.ERROR
        try:
            self._recorder.unreadable(facts, outcome, error)
        except AuditError:
            # Not even an audit-mode pass goes out unrecorded.
            return self._unrecorded(facts.format_name)
        if audit_mode:
            return FilterResult(outcome, 200, None)
        body = refusals.error_body(error, decision_id=facts.decision_id)
        return FilterResult(outcome, 502, body)

    def _unrecorded(self, format_name: str) -> FilterResult:
        """The answer for a response whose audit record could not be written: 500."""
        self._recorder.unrecorded(format_name)
        return FilterResult(Outcome.ERROR, 500, refusals.error_body(refusals.AUDIT_UNAVAILABLE))

    def _policy_for(self, path: str) -> RoutePolicy:
        """``route_policy(path)``, remembered per path (bounded).

        Settings never change while the sidecar runs, and resolving the route
        overrides costs more than the rest of a small response's bookkeeping.
        """
        policy = self._policies.get(path)
        if policy is None:
            if len(self._policies) >= _POLICIES_KEPT:
                self._policies.clear()  # paths are the client's: keep the memo bounded
            policy = self._policies[path] = self._route_policy(path)
        return policy
