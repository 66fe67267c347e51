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
from sidecar.core.decision_core import DecisionCore
from sidecar.core.hits import Candidate, Route
from sidecar.core.modes import Mode, RoutePolicies, RoutePolicy
from sidecar.core.outcome import Outcome
from sidecar.enforcement.candidates import CandidateList, CandidatesAnswer
from sidecar.enforcement.deciding import Decider
from sidecar.enforcement.recording import Recorder, ResponseFacts
from sidecar.enforcement.releasing import release
from sidecar.formats.base import (
    MalformedBody,
    ParsedBody,
    ReportedError,
    RequestRewrite,
    ResponseFormat,
)
from sidecar.formats.registry import FormatTable
from sidecar.metrics import GateMetrics
from sidecar.refusals import GrpcStatus, Refusal, code_of
from sidecar.store.cache import CachedStore
from sidecar.tracing import DecisionSpan, Tracing

log = logging.getLogger(__name__)

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


def _warn_upstream_error(
    facts: ResponseFacts, upstream_code: str, gate_code: str, outcome: Outcome
) -> None:
    """One WARNING line per upstream error: where, the codes, and the audit record's id.

    Never the upstream's text: a database's error can quote the request (Milvus
    and Elasticsearch echo the filter expression, with the tenant's value and
    the client's query) or a document (a script error), and no bound makes a
    quotation safe. The codes are numbers or a database's short tokens
    (``ReportedError``); the record with the decision id holds the first KiB.
    """
    route = facts.route
    log.warning(
        "upstream error: decision %s, %s %s, format %s, upstream code %s, gate code %s, "
        "outcome %s (the upstream's text is in the audit record)",
        facts.decision_id,
        route.method,
        route.path,
        facts.format_name,
        upstream_code,
        gate_code,
        outcome,
    )


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
    own answer for a missing hit) instead of the upstream response.
    ``refusal`` is what went wrong (``sidecar.refusals``), also when audit
    mode passed the upstream answer; None when nothing did. ``grpc_status``:
    the status a gRPC client gets in place of the refusal's own (a gRPC
    upstream's, kept for its retry logic); None for the refusal's.
    """

    outcome: Outcome
    status: int
    body: bytes | None
    headers: dict[str, str] = field(default_factory=dict)
    refusal: Refusal | None = None
    grpc_status: int | None = None

    @property
    def code(self) -> str | None:
        """The refusal's code, for spans and logs; None when nothing went wrong."""
        return code_of(self.refusal)


# The upstream response headers a client of a filtered route gets (outside
# audit mode); every other one is removed. An allowlist, as for bodies: a header
# the gate does not know can describe unfiltered data (an ETag or a length over
# every tenant's hits, a database's timing or shard header). Envoy's own
# (server, x-envoy-*) and the gate's (x-retrieval-gate-*, set later) are not
# upstream headers.
RESPONSE_HEADERS_KEPT = frozenset(
    {
        # Clients pick their decoder by it (JSON, Elasticsearch's vendor type).
        "content-type",
        # Framing; the gate sets it to the length of the body it sends.
        "content-length",
        # An origin server must send it (RFC 9110, 6.6.1); it says only the time.
        "date",
        # elasticsearch-py refuses a 2xx answer without it; a constant, "Elasticsearch".
        "x-elastic-product",
    }
)
# A filtered gRPC answer also needs its response headers' counterpart: the
# trailers (grpc-status, and whatever else the server puts there).
GRPC_RESPONSE_HEADERS_KEPT = RESPONSE_HEADERS_KEPT | {"grpc-encoding"}
GRPC_TRAILERS_KEPT = frozenset({"grpc-status"})

# What a non-2xx upstream status that cannot be kept becomes.
_BAD_GATEWAY = 502
# The gRPC statuses an upstream error keeps for the client (1-16; OK is no error).
_GRPC_CODES = range(1, 17)


@dataclass(frozen=True, slots=True)
class ResponseStart:
    """What the response path makes of an upstream answer's headers.

    ``read_body``: the body is needed (to be filtered, or, for an upstream
    error, for its audit record); False passes the answer unread.
    ``kept_headers``: the upstream headers the client may get; None keeps
    them all (audit mode, and answers passed unread).
    ``upstream_error``: the upstream's HTTP status (502 when it sent none
    that reads as one) when the answer is an upstream error the gate answers
    once it has the body; None for a successful answer.
    """

    read_body: bool
    kept_headers: frozenset[str] | None = None
    upstream_error: int | None = None


_PASS_UNREAD = ResponseStart(read_body=False)


class ResponseFilter:
    """Decides search responses for one sidecar process."""

    def __init__(
        self,
        *,
        formats: FormatTable,
        store: CachedStore,
        core: DecisionCore,
        audit: AuditSink,
        metrics: GateMetrics,
        policies: RoutePolicies,
        max_hits: int = 10_000,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        tracer: Tracer | None = None,
        log_decisions: bool = False,
    ) -> None:
        """``max_hits``: a body with more candidates is refused (502), never decided.

        ``tracer``: one span per decision and per store lookup; None traces nothing.
        ``log_decisions``: one log line per decision (``audit.log_decisions``).
        """
        self._formats = formats
        self._policies = policies
        self._max_hits = max_hits
        self._collection_label = metrics.collection_label
        endpoint = store.endpoint
        self._tracing = Tracing(
            tracer,
            db_system=None if endpoint is None else endpoint.system,
            server_address=None if endpoint is None else endpoint.host,
            server_port=None if endpoint is None else endpoint.port,
        )
        self._decider = Decider(store, core, clock, self._tracing)
        self._recorder = Recorder(
            audit,
            metrics,
            clock,
            verdict_cache_on=core.verdict_cache is not None,
            log_decisions=log_decisions,
        )

    def format_for(self, route: Route) -> ResponseFormat | None:
        """The format whose responses on ``route`` must be filtered, or None to pass them."""
        return self._formats.response_format(route)

    def policy_for(self, route: Route) -> RoutePolicy:
        """The settings that apply to ``route`` (mode, upstream-error passthrough, ...)."""
        return self._policies.for_path(route.path)

    def start(
        self,
        fmt: ResponseFormat,
        route: Route,
        *,
        status: str,
        grpc: bool,
        grpc_error: str = "0",
        has_body: bool,
    ) -> ResponseStart:
        """What to do with an upstream answer on a filtered route, from its headers.

        ``status`` is the HTTP status as sent; ``grpc``: a gRPC answer, whose
        ``grpc_error`` is its status in its headers (a trailers-only error),
        "0" when it has none.
        A non-2xx answer, or a gRPC error, is an upstream error: its text can
        quote documents, so the gate answers it (``upstream_error``), unless
        the route passes upstream errors (``pass_upstream_errors``).
        """
        policy = self.policy_for(route)
        if not status.startswith("2") or grpc_error != "0":
            if policy.pass_upstream_errors:
                self.count_passthrough(fmt.name, route)
                return _PASS_UNREAD
            # The status as sent goes to the audit record (a gRPC error's is its 200).
            error = int(status) if status.isdigit() else _BAD_GATEWAY
            return ResponseStart(read_body=has_body, upstream_error=error)
        # Audit mode changes nothing the client gets; otherwise only allowlisted
        # upstream headers reach it.
        kept = GRPC_RESPONSE_HEADERS_KEPT if grpc else RESPONSE_HEADERS_KEPT
        kept_headers = None if policy.mode is Mode.AUDIT else kept
        if not has_body:
            # An empty answer: no hits to filter.
            self.count_passthrough(fmt.name, route)
        return ResponseStart(read_body=has_body, kept_headers=kept_headers)

    def kept_trailers(self, route: Route) -> frozenset[str] | None:
        """The trailers a filtered gRPC answer keeps: grpc-status; None (all) in audit mode.

        Trailers are metadata the server chose to send after the messages (a
        grpc-message, rich error details, a database's own counters); like
        response headers, what the gate does not know is removed.
        """
        return None if self.policy_for(route).mode is Mode.AUDIT else GRPC_TRAILERS_KEPT

    def count_passthrough(self, format_name: str, route: Route) -> None:
        """Count a response on a filtered route that passes unread (empty, or an upstream
        error passed as it came)."""
        self._recorder.passthrough(format_name, self._collection_for(route))

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
        mode = self.policy_for(route).mode
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
        *,
        rewrite: RequestRewrite | None = None,
        grpc_status: str | None = None,
    ) -> FilterResult:
        """Answer for a non-2xx upstream response, or a gRPC error, on a filtered route.

        ``status`` is the upstream's HTTP status; ``grpc_status`` a gRPC
        error's status as sent, ``body`` then being its message. The upstream's
        text can quote documents (an Elasticsearch script error, a 3xx or 4xx
        body with hits) or the query, so it goes to the audit record only; the
        client gets ``status`` (a gRPC client the upstream's gRPC status) with
        the gate's ``upstream_error`` body, or ``tenant_field_missing`` when
        the text says the collection lacks the field the tenant was pushed
        into (``rewrite``: what the request path did). In audit mode the result
        has no body: the upstream answer passes unchanged, recorded all the same.
        """
        policy = self.policy_for(route)
        facts = self._facts(fmt, route, caller, request_id, policy.mode, rewrite)
        with self._span(facts, route, trace_headers, rewrite) as span:
            result = self._upstream_error(facts, fmt, policy, status, body, rewrite, grpc_status)
            return _answered(span, result)

    def trailers_error(
        self,
        fmt: ResponseFormat,
        route: Route,
        caller: Caller,
        request_id: str,
        status: int,
        grpc_status: str,
        message: bytes,
        trace_headers: Mapping[str, str] | None = None,
        *,
        rewrite: RequestRewrite | None = None,
    ) -> FilterResult | None:
        """A gRPC error status in an answer's trailers, after response headers that
        said nothing of it: an upstream error (``upstream_error``), with ``message``
        its grpc-message; None when the route passes upstream errors.

        The server sent its headers first (and possibly a reply, which was then
        decided and recorded on its own): the error gets a record of its own,
        and the client, which reads the status and drops any reply, the gate's
        error in the trailers.
        """
        if self.policy_for(route).pass_upstream_errors:
            return None
        return self.upstream_error(
            fmt,
            route,
            caller,
            request_id,
            status,
            message,
            trace_headers,
            rewrite=rewrite,
            grpc_status=grpc_status,
        )

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
            route,
            mode,
            time.perf_counter() if started is None else started,
            self._collection_for(route, rewrite),
        )

    def _upstream_error(
        self,
        facts: ResponseFacts,
        fmt: ResponseFormat,
        policy: RoutePolicy,
        status: int,
        body: bytes,
        rewrite: RequestRewrite | None,
        grpc_status: str | None,
    ) -> FilterResult:
        """Record an upstream error answer and say what the client gets (``upstream_error``)."""
        audit_mode = facts.mode is Mode.AUDIT
        outcome = Outcome.PASSTHROUGH if audit_mode else Outcome.ERROR
        kept_grpc: int | None = None
        if grpc_status is None:
            upstream = UpstreamError.from_body(status, body)
        else:
            number = int(grpc_status) if grpc_status.isdigit() else None
            code = f"grpc:{'other' if number is None else number}"
            upstream = UpstreamError.from_body(status, body, code=code)
            # A status no client knows is UNAVAILABLE, as a gRPC client reads one.
            kept_grpc = number if number in _GRPC_CODES else GrpcStatus.UNAVAILABLE
        text = body.decode("utf-8", "replace")
        refusal = self._named_refusal(fmt, policy, rewrite, text)
        if refusal is None:
            kept = kept_grpc
            # Only a final status can answer; an interim (1xx) one, or none, is a 502.
            refusal = refusals.UPSTREAM_ERROR
            if grpc_status is None and 300 <= status <= 599:
                refusal = refusal.at_status(status)
        else:
            kept = None  # the gate's own answer, with its own status
        try:
            self._recorder.upstream_error(facts, outcome, refusal.code, upstream)
        except AuditError:
            return self._unrecorded(facts)
        _warn_upstream_error(facts, upstream.code, refusal.code, outcome)
        if audit_mode:
            return FilterResult(outcome, status, None, refusal=refusal)
        error = refusal.body(facts.decision_id)
        # The headers a rejected hit answered as absent gets too: the two look alike.
        headers = _gate_headers(facts.decision_id, 0)
        return FilterResult(outcome, refusal.http_status, error, headers, refusal, kept)

    def _named_refusal(
        self,
        fmt: ResponseFormat,
        policy: RoutePolicy,
        rewrite: RequestRewrite | None,
        error_text: str,
    ) -> Refusal | None:
        """The refusal that names what an upstream error says went wrong, where the
        name tells the client nothing about data; None for ``upstream_error``.

        ``tenant_field_missing``: the database says the collection has no field
        named as the tenant was pushed into, so no search of it can be confined
        to a tenant. That is the schema, the same for every caller, not content.
        """
        tenant_key = policy.tenant_key
        if rewrite is None or not rewrite.tenant_filter or tenant_key is None:
            return None
        if fmt.missing_field(error_text) == tenant_key:
            return refusals.TENANT_FIELD_MISSING
        return None

    def _reported_error(
        self,
        facts: ResponseFacts,
        policy: RoutePolicy,
        fmt: ResponseFormat,
        parsed: ParsedBody,
        reported: ReportedError,
        rewrite: RequestRewrite | None,
    ) -> FilterResult:
        """An answer that is only an error the database reported inside a 2xx body.

        Nothing was decided: the record says ``upstream_error`` (outcome
        ``error``) with the database's code and bounded text. The client gets
        the body as the adapter writes an error (the database's own shape and
        code, the gate's text), or ``tenant_field_missing``.
        """
        audit_mode = facts.mode is Mode.AUDIT
        outcome = Outcome.PASSTHROUGH if audit_mode else Outcome.ERROR
        upstream = UpstreamError.from_text(200, reported.code, reported.text)
        named = self._named_refusal(fmt, policy, rewrite, reported.text)
        refusal = refusals.UPSTREAM_ERROR if named is None else named
        body: bytes | None = None
        if not audit_mode and named is None:
            try:
                # No hit to trim: over-fetch limits would only be checked against
                # sub-results an error answer may not have.
                body = parsed.render(())
            except MalformedBody as exc:
                log.warning("malformed %s body on %s: %s", fmt.name, facts.route.path, exc)
                return self._unreadable(facts, refusals.UPSTREAM_BODY_MALFORMED)
        try:
            self._recorder.upstream_error(facts, outcome, refusal.code, upstream)
        except AuditError:
            return self._unrecorded(facts)
        _warn_upstream_error(facts, upstream.code, refusal.code, outcome)
        if audit_mode:
            return FilterResult(outcome, 200, None, refusal=refusal)
        headers = _gate_headers(facts.decision_id, 0)
        if body is None:
            error = refusal.body(facts.decision_id)
            return FilterResult(outcome, refusal.http_status, error, headers, refusal)
        return FilterResult(outcome, 200, body, headers, refusal)

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
        policy = self.policy_for(route)
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
            # What the answer repeats of the request is rebuilt from the request.
            echo = None if rewrite is None else rewrite.echo
            parsed = await _work(heavy, fmt.parse, body, route, echo)
        except MalformedBody as exc:
            log.warning("malformed %s body on %s: %s", fmt.name, route.path, exc)
            return self._unreadable(facts, refusals.UPSTREAM_BODY_MALFORMED)
        if len(parsed.candidates) > self._max_hits:
            log.warning("%s body on %s: more than max_hits hits", fmt.name, route.path)
            return self._unreadable(facts, refusals.UPSTREAM_TOO_MANY_HITS)
        reported = parsed.reported_error
        if reported is not None and not parsed.candidates:
            return self._reported_error(facts, policy, fmt, parsed, reported, rewrite)

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
        refusal = released.refusal
        if (
            refusal is not None
            and refusal.http_status == 403
            and refusal != refusals.REJECTED_CHUNKS
        ):
            log.info("%s response on %s blocked: %s", fmt.name, route.path, code_of(refusal))

        tenant_filter = rewrite is not None and rewrite.tenant_filter
        span.decided(
            decided.verdict,
            substituted=len(decided.replacements),
            released=len(released.positions),
            tenant_filter=tenant_filter,
            overfetched=limits is not None,
        )
        # Part of the answer failed in the database (a multi-search error item
        # beside other results): recorded with the decision.
        upstream = (
            None if reported is None else UpstreamError.from_text(200, reported.code, reported.text)
        )
        try:
            self._recorder.decided(
                facts,
                decided,
                released,
                tenant_filter=tenant_filter,
                overfetched=limits is not None,
                upstream=upstream,
            )
        except AuditError:
            # A decision that cannot be recorded is not released.
            return self._unrecorded(facts)
        if upstream is not None:
            gate_code = code_of(refusal) or "none"
            _warn_upstream_error(facts, upstream.code, gate_code, released.outcome)

        headers = _gate_headers(facts.decision_id, len(released.positions))
        if refusal is not None:
            if released.body is not None and policy.pass_upstream_errors:
                # Answered as absent where a missing hit gets the database's own
                # answer, unchanged: the same body, and no gate headers either.
                return FilterResult(
                    released.outcome, released.status, released.body, refusal=refusal
                )
            error = refusal.body(facts.decision_id)
            return FilterResult(released.outcome, released.status, error, headers, refusal)
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
        policy = self.policy_for(route)
        label = self._collection_label([] if collection is None else [collection])
        facts = ResponseFacts(
            uuid.uuid4().hex,
            request_id,
            caller,
            format_name,
            route,
            policy.mode,
            time.perf_counter(),
            label,
        )
        with self._span(facts, route, trace_headers) as span:
            if len(candidates) > self._max_hits:
                refused = _answered(span, self._unreadable(facts, refusals.UPSTREAM_TOO_MANY_HITS))
                # Audit mode records the refusal and answers as if nothing happened.
                audit_pass = refused.body is None
                return CandidatesAnswer(facts.decision_id, None if audit_pass else refused.refusal)
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
                return CandidatesAnswer(facts.decision_id, unrecorded.refusal)
            refusal = released.refusal
            span.answered(
                released.outcome, released.status, None if refusal is None else refusal.code
            )
            return CandidatesAnswer(
                facts.decision_id,
                refusal,
                decided.verdict.decisions,
                frozenset(released.positions),
            )

    def _unreadable(self, facts: ResponseFacts, refusal: Refusal) -> FilterResult:
        """A search response the gate cannot (or will not, over max_hits) decide.

        ``refusal`` (a 502), or in audit mode passed unchanged and recorded.
        """
        audit_mode = facts.mode is Mode.AUDIT
        outcome = Outcome.PASSTHROUGH if audit_mode else Outcome.ERROR
        try:
            self._recorder.unreadable(facts, outcome, refusal.code)
        except AuditError:
            # Not even an audit-mode pass goes out unrecorded.
            return self._unrecorded(facts)
        if audit_mode:
            return FilterResult(outcome, 200, None, refusal=refusal)
        body = refusal.body(facts.decision_id)
        return FilterResult(outcome, refusal.http_status, body, refusal=refusal)

    def _unrecorded(self, facts: ResponseFacts) -> FilterResult:
        """The answer for a response whose audit record could not be written: 500."""
        self._recorder.unrecorded(facts)
        refusal = refusals.AUDIT_UNAVAILABLE
        return FilterResult(Outcome.ERROR, refusal.http_status, refusal.body(), refusal=refusal)

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

    def _collection_for(self, route: Route, rewrite: RequestRewrite | None = None) -> str:
        """The metrics' collection label for ``route`` and the collections its body named.

        The path's collections come from the format table, which remembers them
        per route, with the names learned for those it names by id. A body
        naming others (a Milvus ``collectionName``) adds them, as the request
        policy saw them.
        """
        names = self._formats.collections(route)
        if rewrite is not None and rewrite.collections:
            names = (*names, *(n for n in rewrite.collections if n not in names))
        learned = self._formats.id_names(route)
        aliases = {id_: name for id_, name in learned.items() if name is not None}
        return self._collection_label(names, aliases)
