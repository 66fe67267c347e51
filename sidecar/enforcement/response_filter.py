"""The response path, protocol-free: body in, filtered body (or an error) out.

One response goes through three steps, each in its own module: ``deciding``
(the cached store looks every candidate up in one batch, the decision core
decides), ``releasing`` (the route's mode decides what the client gets; the
adapter renders it) and ``recording`` (the audit record and the metrics,
written before the answer leaves). Any failure ends in an error answer, never
in the unfiltered body, except in audit mode, whose whole point is to pass
bodies through. A large body is parsed and rendered in a worker thread, and
decided in slices, so that it never holds up other callers' responses. Each
decision is one span (``sidecar.tracing``) when tracing is on.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import ParamSpec, TypeVar

from opentelemetry.trace import Tracer

from sidecar import refusals
from sidecar.audit.record import UpstreamError
from sidecar.audit.sink import AuditError, AuditSink
from sidecar.core.caller import Caller
from sidecar.core.gate import Gate
from sidecar.core.hits import Candidate, Route, RouteKind
from sidecar.core.modes import Mode, RoutePolicy
from sidecar.core.outcome import Outcome
from sidecar.enforcement.candidates import CandidateList, CandidatesAnswer
from sidecar.enforcement.deciding import Decider
from sidecar.enforcement.recording import Recorder, ResponseFacts
from sidecar.enforcement.releasing import release
from sidecar.formats.base import MalformedBody, RequestRewrite, ResponseFormat
from sidecar.formats.registry import FormatTable
from sidecar.metrics import NO_COLLECTION, GateMetrics
from sidecar.store.cache import CachedStore
from sidecar.tracing import DecisionSpan, Tracing

log = logging.getLogger(__name__)

# Route policies remembered per request path.
_POLICIES_KEPT = 4096

# A body is parsed, and its answer rendered, in a worker thread rather than on
# the event loop that serves every stream when the work would hold the loop
# for about a millisecond or more. The work grows with the hits more than
# with the bytes. Measured on the 2-core build machine with Qdrant search
# bodies: a round trip through asyncio.to_thread costs about 75 us at the
# median; parsing costs about 3 us a hit plus 1 us a KiB (56 us for 20 hits
# in 5 KiB, 77 us for 20 in 41 KiB, 0.9 ms for 300 in 309 KiB, 8.6 ms for
# 3,000 in 461 KiB). So a body goes to a thread when it is large and holds
# many objects (two per hit, roughly: the hit and its document), and an
# answer is rendered in one when it has many hits; a few large hits stay on
# the loop, where the hop would cost as much as the work.
_OFF_LOOP_MIN_BYTES = 32 * 1024
_OFF_LOOP_OBJECTS = 512
_OFF_LOOP_HITS = 256
_OFF_LOOP_ALWAYS_BYTES = 1024 * 1024


def _heavy_body(body: bytes) -> bool:
    """True when parsing ``body`` is worth a worker thread (see above)."""
    if len(body) <= _OFF_LOOP_MIN_BYTES:
        return False
    return len(body) > _OFF_LOOP_ALWAYS_BYTES or body.count(b"{") > _OFF_LOOP_OBJECTS


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _answered(span: DecisionSpan, result: FilterResult) -> FilterResult:
    """``result``, once ``span`` knows what the client got."""
    span.answered(result.outcome, result.status, result.code)
    return result


def _gate_headers(decision_id: str, released: int) -> dict[str, str]:
    """The headers the gate adds to an answer it decided."""
    return {
        "x-retrieval-gate-decision-id": decision_id,
        # What the client got, never what was kept: the difference would
        # count the rejected hits, which the client must not learn.
        "x-retrieval-gate-admitted": str(released),
    }


async def _work(off_loop: bool, work: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``work(*args, **kwargs)``, in a worker thread when ``off_loop``."""
    if off_loop:
        return await asyncio.to_thread(work, *args, **kwargs)
    return work(*args, **kwargs)


@dataclass(slots=True)
class FilterResult:
    """What to send the client instead of the upstream body (not frozen: see ``Decided``).

    ``body`` None passes the upstream answer unchanged (audit mode); otherwise
    it is the replacement body for a 200, and for any other ``status`` the
    client gets that status and ``body`` (a small JSON error, or the database's
    own answer for a missing hit) instead of the upstream response. ``code``
    is the gate's code for what went wrong (``sidecar.refusals``), also when
    audit mode passed the upstream answer; None when nothing did.
    """

    outcome: Outcome
    status: int
    body: bytes | None
    headers: dict[str, str] = field(default_factory=dict)
    code: str | None = None


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
        max_hits: int = 10_000,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        tracer: Tracer | None = None,
    ) -> None:
        """``max_hits``: a body with more candidates is refused (502), never decided.

        ``tracer``: one span per decision and per store lookup; None traces nothing.
        """
        self._formats = formats
        self._route_policy = route_policy
        self._policies: dict[str, RoutePolicy] = {}
        self._overfetch_cap = overfetch_cap
        self._max_hits = max_hits
        self._collection_label = metrics.collection_label
        self._tracing = Tracing(tracer)
        self._decider = Decider(store, gate, clock, self._tracing)
        self._recorder = Recorder(
            audit, metrics, clock, verdict_cache_on=gate.verdict_cache is not None
        )

    def format_for(self, route: Route) -> ResponseFormat | None:
        """The format whose responses on ``route`` must be filtered, or None to pass them."""
        return self._formats.response_format(route)

    def policy_for(self, route: Route) -> RoutePolicy:
        """The settings that apply to ``route`` (mode, upstream-error passthrough, ...)."""
        return self._policy_for(route.path)

    def rewriter_for(self, fmt: ResponseFormat, route: Route) -> ResponseFormat | None:
        """The format's request rewriter for ``route``, if its requests carry a query.

        Its bodies are read even without push-down or over-fetch: they can
        name collections the request policy must see.
        """
        return fmt if fmt.rewrites_request(route) else None

    def collections_reader(self, route: Route) -> ResponseFormat | None:
        """For a route the gate does not filter, the rewriter that reads the collections
        its request bodies name; None when there is none.

        A gRPC call names its collection only in its body (a Qdrant upsert's
        ``collection_name``), so the request policy's ownership check needs
        the body on every route the format reads, not only on searches.
        """
        found = self._formats.classify(route)
        if found is None or found[1] is RouteKind.FILTERED:
            return None
        return self.rewriter_for(found[0], route)

    def body_collections(
        self, reader: ResponseFormat, route: Route, body: bytes
    ) -> tuple[str, ...]:
        """The collections ``body`` names, as ``reader`` reads them; raises MalformedRequest.

        Nothing is rewritten: no tenant condition, no over-fetch.
        """
        return reader.request_collections(body, route)

    def pushes_down(self, route: Route) -> bool:
        """True when searches on ``route`` are restricted to the caller's tenant."""
        return self._policy_for(route.path).tenant_key is not None

    def request_problem(self, fmt: ResponseFormat, route: Route, query_string: str) -> str | None:
        """Why a search on ``route`` cannot be restricted to the tenant as its URL stands;
        None when it can (or the route does not push down)."""
        if not self.pushes_down(route):
            return None
        return fmt.query_string_problem(route, query_string)

    def rewrite_request(
        self,
        rewriter: ResponseFormat,
        route: Route,
        caller: Caller,
        body: bytes,
        query_string: str = "",
    ) -> RequestRewrite:
        """Inject the caller's tenant filter and over-fetch; raises MalformedRequest.

        URL parameters that make the database page differently from the body
        (``ResponseFormat.overfetch_problem``) turn over-fetch off.
        """
        policy = self._policy_for(route.path)
        factor = policy.overfetch_factor
        if rewriter.overfetch_problem(route, query_string):
            factor = 1.0
        return rewriter.rewrite_request(
            body,
            route,
            tenant=caller.tenant,
            tenant_key=policy.tenant_key,
            overfetch_factor=factor,
            overfetch_cap=self._overfetch_cap,
        )

    def count_request_refusal(self, status: int) -> None:
        """Count a request refused before the database was asked (identity, policy, body)."""
        self._recorder.request_refused(status)

    def count_passthrough(self, format_name: str, route: Route | None = None) -> None:
        """Count a response on a route the gate does not inspect (or an upstream error).

        Without ``route`` (no search route) the collection label is ``none``.
        """
        collection = NO_COLLECTION if route is None else self._collection_for(route)
        self._recorder.passthrough(format_name, collection)

    def reject_unreadable(
        self,
        fmt: ResponseFormat,
        route: Route,
        caller: Caller,
        request_id: str,
        why: str,
        trace_headers: Mapping[str, str] | None = None,
    ) -> FilterResult:
        """Answer for a search response the gate cannot read (e.g. compressed): 502.

        ``trace_headers``: the request's ``traceparent`` and ``tracestate``, if any.
        """
        log.warning("unreadable %s response on %s: %s", fmt.name, route.path, why)
        mode = self._policy_for(route.path).mode
        facts = self._facts(fmt, route, caller, request_id, mode)
        with self._span(facts, route, trace_headers) as span:
            return _answered(span, self._unreadable(facts, refusals.UPSTREAM_BODY_UNREADABLE))

    def upstream_error(
        self,
        fmt: ResponseFormat,
        route: Route,
        caller: Caller,
        request_id: str,
        status: int,
        body: bytes,
        trace_headers: Mapping[str, str] | None = None,
    ) -> FilterResult:
        """Answer for a non-2xx upstream response on a filtered route.

        The upstream's text can quote documents (an Elasticsearch script error,
        a 3xx or 4xx body with hits), so it goes to the audit record only; the
        client gets ``status`` with the gate's ``upstream_error`` body. In audit
        mode the result has no body: the upstream answer passes unchanged,
        recorded all the same.
        """
        mode = self._policy_for(route.path).mode
        facts = self._facts(fmt, route, caller, request_id, mode)
        with self._span(facts, route, trace_headers) as span:
            return _answered(span, self._upstream_error(facts, status, body))

    def _facts(
        self,
        fmt: ResponseFormat,
        route: Route,
        caller: Caller,
        request_id: str,
        mode: Mode,
        rewrite: RequestRewrite | None = None,
        started: float | None = None,
    ) -> ResponseFacts:
        """What every answer to one response records: a new decision id, the caller,
        the format, the mode, when it started and the collection label."""
        return ResponseFacts(
            uuid.uuid4().hex,
            request_id,
            caller,
            fmt.name,
            mode,
            time.perf_counter() if started is None else started,
            self._collection_for(route, rewrite),
        )

    def _upstream_error(self, facts: ResponseFacts, status: int, body: bytes) -> FilterResult:
        """Record an upstream error answer and say what the client gets (``upstream_error``)."""
        audit_mode = facts.mode is Mode.AUDIT
        outcome = Outcome.PASSTHROUGH if audit_mode else Outcome.ERROR
        upstream = UpstreamError.from_body(status, body)
        code = refusals.UPSTREAM_ERROR
        try:
            self._recorder.upstream_error(facts, outcome, code, upstream)
        except AuditError:
            return self._unrecorded(facts)
        if audit_mode:
            return FilterResult(outcome, status, None, code=code)
        error = refusals.error_body(code, decision_id=facts.decision_id)
        # The headers a rejected hit answered as absent gets too: the two look alike.
        return FilterResult(outcome, status, error, _gate_headers(facts.decision_id, 0), code)

    async def filter(
        self,
        fmt: ResponseFormat,
        route: Route,
        caller: Caller,
        request_id: str,
        body: bytes,
        rewrite: RequestRewrite | None = None,
        trace_headers: Mapping[str, str] | None = None,
    ) -> FilterResult:
        """Decide one successful search response body.

        ``rewrite`` is what the request path did to the query, if anything: its
        limits trim over-fetched results back to what the application asked for.
        ``trace_headers``: the request's ``traceparent`` and ``tracestate``, if any.
        """
        started = time.perf_counter()
        policy = self._policy_for(route.path)
        facts = self._facts(fmt, route, caller, request_id, policy.mode, rewrite, started)
        with self._span(facts, route, trace_headers, rewrite) as span:
            result = await self._filter(facts, policy, fmt, route, body, rewrite, span)
            return _answered(span, result)

    async def _filter(
        self,
        facts: ResponseFacts,
        policy: RoutePolicy,
        fmt: ResponseFormat,
        route: Route,
        body: bytes,
        rewrite: RequestRewrite | None,
        span: DecisionSpan,
    ) -> FilterResult:
        """Parse, decide, release and record one body (``filter``)."""
        caller = facts.caller
        try:
            heavy = _heavy_body(body)
            parsed = await _work(heavy, fmt.parse, body, route)
        except MalformedBody as exc:
            log.warning("malformed %s body on %s: %s", fmt.name, route.path, exc)
            return self._unreadable(facts, refusals.UPSTREAM_BODY_MALFORMED)
        if len(parsed.candidates) > self._max_hits:
            log.warning("%s body on %s: more than max_hits hits", fmt.name, route.path)
            return self._unreadable(facts, refusals.UPSTREAM_TOO_MANY_HITS)

        substitute = policy.substitute_superseded and policy.mode is not Mode.AUDIT
        decided = await self._decider.decide(caller, parsed.candidates, substitute=substitute)
        if decided.verdict.policy_failed:
            self._recorder.policy_failed()

        limits = rewrite.limits if rewrite is not None and rewrite.overfetched else None
        try:
            many = heavy or len(parsed.candidates) > _OFF_LOOP_HITS
            released = await _work(many, release, policy.mode, parsed, decided, limits)
        except MalformedBody as exc:
            # E.g. fewer sub-results than the rewritten request had sub-queries.
            log.warning("malformed %s body on %s: %s", fmt.name, route.path, exc)
            return self._unreadable(facts, refusals.UPSTREAM_BODY_MALFORMED)
        if released.status == 403 and released.refusal != refusals.REJECTED_CHUNKS:
            log.info("%s response on %s blocked: %s", fmt.name, route.path, released.refusal)

        tenant_filter = rewrite is not None and rewrite.tenant_filter
        span.decided(
            decided.verdict,
            substituted=len(decided.replacements),
            released=len(released.positions),
            tenant_filter=tenant_filter,
            overfetched=limits is not None,
        )
        try:
            self._recorder.decided(
                facts,
                decided,
                released,
                tenant_filter=tenant_filter,
                overfetched=limits is not None,
            )
        except AuditError:
            # A decision that cannot be recorded is not released.
            return self._unrecorded(facts)

        headers = _gate_headers(facts.decision_id, len(released.positions))
        if released.status != 200:
            assert released.refusal is not None
            if released.body is not None and policy.pass_upstream_errors:
                # Answered as absent where a missing hit gets the database's own
                # answer, unchanged: the same body, and no gate headers either.
                return FilterResult(
                    released.outcome, released.status, released.body, code=released.refusal
                )
            error = refusals.error_body(released.refusal, decision_id=facts.decision_id)
            return FilterResult(released.outcome, released.status, error, headers, released.refusal)
        return FilterResult(released.outcome, 200, released.body, headers)

    async def decide_candidates(
        self,
        route: Route,
        caller: Caller,
        request_id: str,
        candidates: Sequence[Candidate],
        *,
        format_name: str,
        collection: str | None,
        trace_headers: Mapping[str, str] | None = None,
    ) -> CandidatesAnswer:
        """Decide, release and record candidates sent without a body (the gate's own service).

        The same steps as ``filter``, with the mode of ``route``'s settings;
        no substitution (there is no body to put a successor in) and no
        over-fetch. ``collection`` is the metrics' collection, by its name.
        """
        policy = self._policy_for(route.path)
        label = self._collection_label([] if collection is None else [collection])
        facts = ResponseFacts(
            uuid.uuid4().hex,
            request_id,
            caller,
            format_name,
            policy.mode,
            time.perf_counter(),
            label,
        )
        with self._span(facts, route, trace_headers) as span:
            if len(candidates) > self._max_hits:
                refused = self._unreadable(facts, refusals.UPSTREAM_TOO_MANY_HITS)
                _answered(span, refused)
                return CandidatesAnswer(facts.decision_id, refused.status, refused.code)
            decided = await self._decider.decide(caller, candidates, substitute=False)
            if decided.verdict.policy_failed:
                self._recorder.policy_failed()
            released = release(policy.mode, CandidateList(candidates), decided, None)
            span.decided(
                decided.verdict,
                substituted=0,
                released=len(released.positions),
                tenant_filter=False,
                overfetched=False,
            )
            try:
                self._recorder.decided(
                    facts, decided, released, tenant_filter=False, overfetched=False
                )
            except AuditError:
                unrecorded = _answered(span, self._unrecorded(facts))
                return CandidatesAnswer(facts.decision_id, unrecorded.status, unrecorded.code)
            span.answered(released.outcome, released.status, released.refusal)
            return CandidatesAnswer(
                facts.decision_id,
                released.status,
                released.refusal,
                decided.verdict.decisions,
                frozenset(released.positions),
            )

    def _unreadable(self, facts: ResponseFacts, error: str) -> FilterResult:
        """A search response the gate cannot (or will not, over max_hits) decide.

        502 with ``error``, or in audit mode passed unchanged and recorded.
        """
        audit_mode = facts.mode is Mode.AUDIT
        outcome = Outcome.PASSTHROUGH if audit_mode else Outcome.ERROR
        try:
            self._recorder.unreadable(facts, outcome, error)
        except AuditError:
            # Not even an audit-mode pass goes out unrecorded.
            return self._unrecorded(facts)
        if audit_mode:
            return FilterResult(outcome, 200, None, code=error)
        body = refusals.error_body(error, decision_id=facts.decision_id)
        return FilterResult(outcome, 502, body, code=error)

    def _unrecorded(self, facts: ResponseFacts) -> FilterResult:
        """The answer for a response whose audit record could not be written: 500."""
        self._recorder.unrecorded(facts)
        code = refusals.AUDIT_UNAVAILABLE
        return FilterResult(Outcome.ERROR, 500, refusals.error_body(code), code=code)

    def _span(
        self,
        facts: ResponseFacts,
        route: Route,
        trace_headers: Mapping[str, str] | None,
        rewrite: RequestRewrite | None = None,
    ) -> DecisionSpan:
        """The span of the decision ``facts`` begin, with the collections the request named."""
        span = self._tracing.decision(
            trace_headers,
            decision_id=facts.decision_id,
            request_id=facts.request_id,
            format_name=facts.format_name,
            mode=facts.mode,
        )
        if span.recording:
            named = [*self._formats.collections(route), *(rewrite.collections if rewrite else ())]
            span.collections(list(dict.fromkeys(named)))
        return span

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

    def _collection_for(self, route: Route, rewrite: RequestRewrite | None = None) -> str:
        """The metrics' collection label for ``route`` and the collections its body named.

        The path's collections come from the format table, which remembers them
        per route. A body naming others (a Milvus ``collectionName``) adds them,
        as the request policy saw them.
        """
        names = self._formats.collections(route)
        if rewrite is not None and rewrite.collections:
            names = (*names, *(n for n in rewrite.collections if n not in names))
        return self._collection_label(names)
