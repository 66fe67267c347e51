"""Traces of the response path: one span per decision, a child span per store lookup.

Only the OpenTelemetry API is used here; whether spans are made at all, and
where they go, is decided once per process by ``sidecar.runtime.tracing``
from the standard ``OTEL_*`` variables. With no tracer, ``Tracing(None)``
hands out one shared span that does nothing, so the response path pays a
method call per step, not a span.

A decision span's parent is the trace context of the request's headers, read
by the process's propagator (W3C ``traceparent`` and ``tracestate`` unless
``OTEL_PROPAGATORS`` names others, such as B3; ``set_propagator``), so it
joins the application's trace; a request without one starts a trace of its
own. Attributes say what was decided, never about what: counts, reason codes,
the gate's own identifiers (decision id, Envoy's request id), format, mode,
collection names and the policy version. Never chunk text, query text,
tokens, tenants or principals.

A lookup span is a database CLIENT span in OpenTelemetry's terms
(``db.system.name``, ``server.address``, ``server.port``, ``error.type``),
without a query text or a URL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sidecar.core.decision import Verdict
from sidecar.core.outcome import Outcome

# The request headers that carry the parent with the default propagator (W3C Trace Context).
TRACE_HEADERS = ("traceparent", "tracestate")
DECISION_SPAN = "retrieval_gate.decision"
LOOKUP_SPAN = "retrieval_gate.store_lookup"
# Attribute names; ``REJECTED_PREFIX`` + a reason code counts rejections by primary reason.
DECISION_ID = "retrieval_gate.decision_id"
REQUEST_ID = "retrieval_gate.request_id"
FORMAT = "retrieval_gate.format"
MODE = "retrieval_gate.mode"
COLLECTIONS = "retrieval_gate.collections"
OUTCOME = "retrieval_gate.outcome"
STATUS_CODE = "retrieval_gate.status_code"
CODE = "retrieval_gate.code"
CANDIDATES = "retrieval_gate.candidates"
ADMITTED = "retrieval_gate.admitted"
RELEASED = "retrieval_gate.released"
SUBSTITUTED = "retrieval_gate.substituted"
REJECTED_PREFIX = "retrieval_gate.rejected."
POLICY_VERSION = "retrieval_gate.policy_version"
POLICY_FAILED = "retrieval_gate.policy_failed"
VERDICTS_CACHED = "retrieval_gate.verdicts_cached"
TENANT_FILTER = "retrieval_gate.tenant_filter"
OVERFETCHED = "retrieval_gate.overfetched"
LOOKUP_PURPOSE = "retrieval_gate.lookup.purpose"
LOOKUP_IDS = "retrieval_gate.lookup.ids"
LOOKUP_FOUND = "retrieval_gate.lookup.found"
LOOKUP_UNAVAILABLE = "retrieval_gate.lookup.unavailable"
LOOKUP_OUTCOME = "retrieval_gate.lookup.outcome"
CACHE_HITS = "retrieval_gate.cache.hits"
CACHE_MISSES = "retrieval_gate.cache.misses"
# OpenTelemetry's semantic conventions for a database client span.
DB_SYSTEM_NAME = "db.system.name"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
# error.type of a lookup the store could not answer (the gate's StoreUnavailable).
STORE_UNAVAILABLE = "StoreUnavailable"

# A path or body can name many collections (an index expression); a span keeps the first few.
_MAX_COLLECTIONS = 32
_propagator: TextMapPropagator = TraceContextTextMapPropagator()
_fields: tuple[str, ...] = TRACE_HEADERS


def set_propagator(propagator: TextMapPropagator) -> None:
    """Read the parent of every decision span of this process with ``propagator``
    (``sidecar.runtime.tracing`` sets the one ``OTEL_PROPAGATORS`` names)."""
    global _propagator, _fields
    _propagator = propagator
    _fields = tuple(sorted(propagator.fields))


def no_propagation() -> TextMapPropagator:
    """A propagator that reads nothing (``OTEL_PROPAGATORS=none``)."""
    return CompositePropagator([])


def trace_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The request's trace-context headers that the propagator reads (by default
    ``traceparent`` and ``tracestate``), if any."""
    return {name: headers[name] for name in _fields if name in headers}


class _Span:
    """A span as a context manager; this base records nothing."""

    def __enter__(self) -> Self:
        self._opened()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._closed(exc_type)

    def _opened(self) -> None:
        """The span's context begins (a recording span makes itself current)."""

    def _closed(self, exc_type: type[BaseException] | None) -> None:
        """The span's context ends, with the type of what was raised in it, if anything."""


class DecisionSpan(_Span):
    """The span of one decision. This base class records nothing: tracing is off,
    or the request's trace is not sampled."""

    recording = False

    def collections(self, names: Sequence[str]) -> None:
        """The collections the request named (its path, and its body beyond the path)."""

    def decided(
        self,
        verdict: Verdict,
        *,
        substituted: int,
        released: int,
        tenant_filter: bool,
        overfetched: bool,
    ) -> None:
        """What the decision core said about the candidates, and how many went out."""

    def answered(self, outcome: str, status: int, code: str | None) -> None:
        """What the client got: the outcome, the HTTP status and the gate's code, if any."""


class LookupSpan(_Span):
    """The span of one store lookup; this base class records nothing."""

    def answered(self, found: int, unavailable: int) -> None:
        """How many ids had a record, and how many could not be looked up (store down)."""


_NOT_RECORDING = DecisionSpan()
_NO_LOOKUP = LookupSpan()


@dataclass(slots=True)
class _CacheTally:
    hits: int = 0
    misses: int = 0


# The tally of the lookup running in this task, if it is traced (see ``count_cache``).
_TALLY: ContextVar[_CacheTally | None] = ContextVar("retrieval_gate_cache_tally", default=None)


def count_cache(hits: int = 0, misses: int = 0) -> None:
    """Count cache hits and misses towards the traced lookup running in this task, if any.

    The metadata cache reports per batch to its observer, not to its caller;
    the observer that ``sidecar.runtime.tracing`` installs calls this.
    """
    tally = _TALLY.get()
    if tally is not None:
        tally.hits += hits
        tally.misses += misses


class Tracing:
    """Makes the spans of the response path with ``tracer``; none at all when it is None.

    ``db_system``, ``server_address``, ``server_port``: the store the lookups
    go to (``postgresql`` and its server, or ``sqlite``), for the lookup spans.
    """

    def __init__(
        self,
        tracer: Tracer | None,
        *,
        db_system: str | None = None,
        server_address: str | None = None,
        server_port: int | None = None,
    ) -> None:
        self._tracer = tracer
        database: dict[str, str | int] = {}
        if db_system is not None:
            database[DB_SYSTEM_NAME] = db_system
        if server_address is not None:
            database[SERVER_ADDRESS] = server_address
            if server_port is not None:
                database[SERVER_PORT] = server_port
        self._database = database

    def decision(
        self,
        trace_headers: Mapping[str, str] | None,
        *,
        decision_id: str,
        request_id: str,
        format_name: str,
        mode: str,
    ) -> DecisionSpan:
        """The span of one decision, current while it is entered (lookups become its children).

        Its parent is the one ``trace_headers`` (``trace_context``) name; none
        when they name none, whatever else is current.
        """
        if self._tracer is None:
            return _NOT_RECORDING
        parent = _propagator.extract(trace_headers or {}, context=Context())
        span = self._tracer.start_span(
            DECISION_SPAN,
            context=parent,
            attributes={
                DECISION_ID: decision_id,
                REQUEST_ID: request_id,
                FORMAT: format_name,
                MODE: str(mode),
            },
            record_exception=False,  # an exception's text may quote a body
            set_status_on_exception=False,
        )
        if not span.is_recording():
            return _NOT_RECORDING
        return _RecordingDecision(span)

    def lookup(self, purpose: str, ids: int) -> LookupSpan:
        """The span of one store lookup of ``ids`` ids, a child of the current decision span.

        ``purpose``: ``candidates`` (the body's hits) or ``successors`` (for substitution).
        A CLIENT span (the gate calls its database), with the store's
        ``db.system.name`` and ``server.*`` attributes. Nothing is recorded
        outside a recording decision span.
        """
        if self._tracer is None or not trace.get_current_span().is_recording():
            return _NO_LOOKUP
        span = self._tracer.start_span(
            LOOKUP_SPAN,
            kind=SpanKind.CLIENT,
            attributes={LOOKUP_PURPOSE: purpose, LOOKUP_IDS: ids, **self._database},
            record_exception=False,
            set_status_on_exception=False,
        )
        return _RecordingLookup(span, ids)


NO_TRACING = Tracing(None)


def _end(span: Span, exc_type: type[BaseException] | None, *, error_type: bool = False) -> None:
    """End ``span``; an error status naming ``exc_type`` if one was raised in it
    (and ``error.type`` with ``error_type``, as database client spans have it)."""
    if exc_type is not None:
        # The type only: an exception's message may quote what it failed on.
        span.set_status(Status(StatusCode.ERROR, exc_type.__name__))
        if error_type:
            span.set_attribute(ERROR_TYPE, exc_type.__qualname__)
    span.end()


class _RecordingDecision(DecisionSpan):
    recording = True

    def __init__(self, span: Span) -> None:
        self._span = span
        self._token: Token[Context] | None = None

    def _opened(self) -> None:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))

    def _closed(self, exc_type: type[BaseException] | None) -> None:
        try:
            _end(self._span, exc_type)
        finally:
            if self._token is not None:
                otel_context.detach(self._token)

    def collections(self, names: Sequence[str]) -> None:
        self._span.set_attribute(COLLECTIONS, list(names[:_MAX_COLLECTIONS]))

    def decided(
        self,
        verdict: Verdict,
        *,
        substituted: int,
        released: int,
        tenant_filter: bool,
        overfetched: bool,
    ) -> None:
        rejected: dict[str, int] = {}
        for decision in verdict.decisions:
            if decision.reasons:
                primary = decision.reasons[0]
                rejected[primary] = rejected.get(primary, 0) + 1
        attributes: dict[str, str | bool | int] = {
            CANDIDATES: len(verdict.decisions),
            ADMITTED: len(verdict.decisions) - sum(rejected.values()),
            RELEASED: released,
            SUBSTITUTED: substituted,
            POLICY_VERSION: verdict.policy_version,
            POLICY_FAILED: verdict.policy_failed,
            VERDICTS_CACHED: verdict.verdicts_cached,
            TENANT_FILTER: tenant_filter,
            OVERFETCHED: overfetched,
        }
        for reason, count in rejected.items():
            attributes[REJECTED_PREFIX + reason] = count
        self._span.set_attributes(attributes)

    def answered(self, outcome: str, status: int, code: str | None) -> None:
        self._span.set_attribute(OUTCOME, str(outcome))
        self._span.set_attribute(STATUS_CODE, status)
        if code is not None:
            self._span.set_attribute(CODE, code)
        if outcome == Outcome.ERROR:
            self._span.set_status(Status(StatusCode.ERROR, code))


class _RecordingLookup(LookupSpan):
    def __init__(self, span: Span, ids: int) -> None:
        self._span = span
        self._ids = ids
        self._tally = _CacheTally()
        self._token: Token[_CacheTally | None] | None = None

    def _opened(self) -> None:
        self._token = _TALLY.set(self._tally)

    def _closed(self, exc_type: type[BaseException] | None) -> None:
        if self._token is not None:
            _TALLY.reset(self._token)
        self._span.set_attributes({CACHE_HITS: self._tally.hits, CACHE_MISSES: self._tally.misses})
        _end(self._span, exc_type, error_type=True)

    def answered(self, found: int, unavailable: int) -> None:
        if not unavailable:
            outcome = "ok"
        elif unavailable < self._ids:
            outcome = "partial"
        else:
            outcome = "unavailable"
        self._span.set_attributes(
            {LOOKUP_FOUND: found, LOOKUP_UNAVAILABLE: unavailable, LOOKUP_OUTCOME: outcome}
        )
        if unavailable:
            # Ids are unavailable only when the store raised StoreUnavailable
            # (the cache answers for the store; its error is not passed on).
            self._span.set_attribute(ERROR_TYPE, STORE_UNAVAILABLE)
            self._span.set_status(Status(StatusCode.ERROR, "metadata store unavailable"))
