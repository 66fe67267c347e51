"""Traces: one span per decision, a child span per store lookup, the parent from ``traceparent``.

The response path runs in process on the real parts (SQLite store behind the
metadata cache, the bundled Rego policy, the JSON Lines audit log) with
OpenTelemetry's in-memory exporter. The process set-up (``start_tracing``,
``Sidecar.from_settings``) is checked with the standard OTEL_* variables.
OTLP export through a real Envoy is in test_envoy_tracing.py.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind, StatusCode

from sidecar import tracing
from sidecar.audit.jsonl import JsonlAuditSink
from sidecar.cli import main as cli_main
from sidecar.cli.exit_codes import ExitCode
from sidecar.config import (
    ConfigError,
    IdentityMode,
    RouteOptions,
    Settings,
    default_policy_dir,
    format_table,
)
from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord
from sidecar.core.decision_core import DecisionCore
from sidecar.core.hits import Route
from sidecar.core.integrity import canonical_sha256
from sidecar.core.modes import Mode, RoutePolicies
from sidecar.core.reasons import Reason
from sidecar.enforcement.response_filter import FilterResult, ResponseFilter
from sidecar.formats.base import RequestRewrite
from sidecar.metrics import GateMetrics
from sidecar.postgres.dsn import parse_postgres_url
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.runtime.server import Sidecar
from sidecar.runtime.tracing import (
    DEFAULT_SERVICE_NAME,
    TracedCacheObserver,
    check_environment,
    gate_tracer,
    propagator,
    start_tracing,
)
from sidecar.store.cache import CachedStore
from sidecar.store.loader import parse_record
from sidecar.store.postgres import endpoint
from sidecar.store.sqlite import SqliteStore, migrate
from sidecar.store.store import StoreEndpoint, StoreUnavailable
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.ext_proc_stream import (
    request_headers,
    response_body,
    response_headers,
    run_stream,
)
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.settings import settings_of, with_values
from tests.fixtures.stores import new_sqlite_url

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tracing.md"
SEARCH = Route("POST", "/collections/docs/points/search")
ALICE = Caller("acme", frozenset({"user:alice", "group:qa"}))
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
POLICY = RegorusEngine.from_directory(default_policy_dir())
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
OTEL_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_PROPAGATORS",
)
SUCCESSOR_TEXT = "Revision 2 of chunk 5."
RECORDS = [
    record_dict("1"),
    record_dict("2", status="revoked"),
    record_dict("3"),  # the upstream sends it changed: HASH_MISMATCH
    record_dict("4", status="superseded", superseded_by="5"),
    record_dict("5", version="2", text=SUCCESSOR_TEXT, sha256=canonical_sha256(SUCCESSOR_TEXT)),
]
# 1 admitted, 2 revoked, 3 tampered, 9 unknown to the store.
MIXED = [
    qb.point(1, text_for("1")),
    qb.point(2, text_for("2")),
    qb.point(3, text_for("3") + " (edited in the index)"),
    qb.point(9, "a chunk the store never saw"),
]


@pytest.fixture(autouse=True)
def no_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts from a process environment without OTEL_* variables, and
    leaves the process's propagator (``start_tracing`` sets it) as it found it."""
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tracing, "_propagator", tracing._propagator)
    monkeypatch.setattr(tracing, "_fields", tracing._fields)


class OutageStore(SqliteStore):
    """A fake outage: the real SQLite store, made to fail while ``down``."""

    down = False

    async def fetch(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
        if self.down:
            raise StoreUnavailable("switched off by the test")
        return await super().fetch(chunk_ids)


class Traced:
    """A ResponseFilter wired as the sidecar wires it with tracing on; spans kept in memory."""

    def __init__(
        self,
        tmp_path: Path,
        settings: Settings | None = None,
        *,
        store_endpoint: StoreEndpoint | None = None,
    ) -> None:
        settings = settings or Settings()
        self.exporter = InMemorySpanExporter()
        # The SDK's default sampler, spelled out: the environment must not change it here.
        provider = TracerProvider(sampler=ParentBased(ALWAYS_ON))
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        migrate(tmp_path / "gate.db")
        self.inner = OutageStore(tmp_path / "gate.db")
        if store_endpoint is not None:
            self.inner.endpoint = store_endpoint  # as a PostgreSQL store says it
        observer = TracedCacheObserver(GateMetrics())
        self.store = CachedStore(self.inner, ttl=3600.0, observer=observer)
        self.store.upsert([parse_record(r) for r in RECORDS])
        self.audit_path = tmp_path / "audit.jsonl"
        self.filter = ResponseFilter(
            formats=format_table(settings),
            store=self.store,
            core=DecisionCore(POLICY),
            audit=JsonlAuditSink(self.audit_path),
            metrics=GateMetrics(),
            policies=RoutePolicies(settings.route_policy),
            clock=lambda: NOW,
            tracer=gate_tracer(provider),
        )

    def search(
        self,
        points: list[dict[str, Any]],
        trace_headers: Mapping[str, str] | None = None,
        *,
        route: Route = SEARCH,
        caller: Caller = ALICE,
        rewrite: RequestRewrite | None = None,
        body: bytes | None = None,
    ) -> FilterResult:
        fmt = self.filter.format_for(route)
        assert fmt is not None
        sent = qb.encode(qb.search_body(points)) if body is None else body
        return asyncio.run(
            self.filter.filter(fmt, route, caller, "req-1", sent, rewrite, trace_headers)
        )

    def spans(self) -> list[ReadableSpan]:
        """The spans finished since the last call."""
        finished = list(self.exporter.get_finished_spans())
        self.exporter.clear()
        return finished

    def last_audit(self) -> dict[str, Any]:
        record: dict[str, Any] = orjson.loads(self.audit_path.read_bytes().splitlines()[-1])
        return record


@pytest.fixture
def traced(tmp_path: Path) -> Traced:
    return Traced(tmp_path)


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, [span.name for span in spans]
    return found[0]


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_a_decision_is_one_span_with_what_was_decided(traced: Traced) -> None:
    result = traced.search(MIXED)

    spans = traced.spans()
    assert sorted(span.name for span in spans) == [tracing.DECISION_SPAN, tracing.LOOKUP_SPAN]
    decision = attributes(one(spans, tracing.DECISION_SPAN))
    audit = traced.last_audit()
    assert decision == {
        "retrieval_gate.decision_id": audit["decision_id"],
        "retrieval_gate.request_id": "req-1",
        "retrieval_gate.format": "qdrant",
        "retrieval_gate.mode": "enforce",
        "retrieval_gate.collections": ("docs",),
        "retrieval_gate.outcome": "filtered",
        "retrieval_gate.status_code": 200,
        "retrieval_gate.candidates": 4,
        "retrieval_gate.admitted": 1,
        "retrieval_gate.released": 1,
        "retrieval_gate.substituted": 0,
        "retrieval_gate.rejected.STATUS_REVOKED": 1,
        "retrieval_gate.rejected.HASH_MISMATCH": 1,
        "retrieval_gate.rejected.MISSING_METADATA": 1,
        "retrieval_gate.policy_version": audit["policy_version"],
        "retrieval_gate.policy_failed": False,
        "retrieval_gate.verdicts_cached": 0,
        "retrieval_gate.tenant_filter": False,
        "retrieval_gate.overfetched": False,
    }
    assert result.headers["x-retrieval-gate-decision-id"] == audit["decision_id"]
    assert one(spans, tracing.DECISION_SPAN).status.status_code is StatusCode.UNSET


def test_the_store_lookup_is_a_child_span_with_cache_hits_and_misses(traced: Traced) -> None:
    traced.search(MIXED)
    cold = traced.spans()
    traced.search(MIXED)
    warm = traced.spans()

    for spans, hits, misses in ((cold, 0, 4), (warm, 4, 0)):
        decision = one(spans, tracing.DECISION_SPAN)
        lookup = one(spans, tracing.LOOKUP_SPAN)
        assert lookup.parent is not None
        assert lookup.parent.span_id == decision.context.span_id
        assert lookup.context.trace_id == decision.context.trace_id
        # The gate calling its database: a CLIENT span (the decision is INTERNAL).
        assert lookup.kind is SpanKind.CLIENT
        assert decision.kind is SpanKind.INTERNAL
        assert attributes(lookup) == {
            "db.system.name": "sqlite",  # in process: no server.address
            "retrieval_gate.lookup.purpose": "candidates",
            "retrieval_gate.lookup.ids": 4,
            "retrieval_gate.lookup.found": 3,
            "retrieval_gate.lookup.unavailable": 0,
            "retrieval_gate.lookup.outcome": "ok",
            # Found and known-absent ids alike are answered by the cache once looked up.
            "retrieval_gate.cache.hits": hits,
            "retrieval_gate.cache.misses": misses,
        }
    # Three records and the decoy of the id without one (sidecar/core/decision_core.py).
    assert attributes(one(warm, tracing.DECISION_SPAN))["retrieval_gate.verdicts_cached"] == 4


def test_the_span_joins_the_trace_its_traceparent_names(traced: Traced) -> None:
    traced.search(MIXED, {"traceparent": TRACEPARENT, "tracestate": "app=7,vendor=x"})

    spans = traced.spans()
    decision = one(spans, tracing.DECISION_SPAN)
    assert decision.context.trace_id == int(TRACE_ID, 16)
    assert decision.parent is not None
    assert decision.parent.span_id == int(PARENT_ID, 16)
    assert decision.parent.is_remote
    assert decision.context.trace_state.get("app") == "7"
    assert one(spans, tracing.LOOKUP_SPAN).context.trace_id == int(TRACE_ID, 16)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"traceparent": "not a traceparent"},
        {"traceparent": f"00-{'0' * 32}-{PARENT_ID}-01"},  # an invalid (all-zero) trace id
    ],
    ids=["none", "malformed", "invalid"],
)
def test_without_a_usable_traceparent_the_decision_starts_its_own_trace(
    traced: Traced, headers: dict[str, str]
) -> None:
    # Whatever else is current (here an application span in the same task) is not the parent.
    with trace.get_tracer("a test").start_as_current_span("unrelated"):
        traced.search(MIXED, headers)

    decision = one(traced.spans(), tracing.DECISION_SPAN)
    assert decision.parent is None
    assert decision.context.trace_id != int(TRACE_ID, 16)


def test_a_trace_its_caller_did_not_sample_is_not_recorded(traced: Traced) -> None:
    result = traced.search(MIXED, {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"})

    assert result.status == 200
    assert traced.spans() == []  # neither the decision nor its lookup


def test_a_substitution_looks_successors_up_in_a_second_child_span(tmp_path: Path) -> None:
    routes = {"/collections/docs/": RouteOptions(substitute_superseded=True)}
    traced = Traced(tmp_path, settings_of(routes=routes))

    traced.search([qb.point(4, text_for("4")), qb.point(1, text_for("1"))])

    spans = traced.spans()
    decision = one(spans, tracing.DECISION_SPAN)
    lookups = [span for span in spans if span.name == tracing.LOOKUP_SPAN]
    assert [attributes(s)["retrieval_gate.lookup.purpose"] for s in lookups] == [
        "candidates",
        "successors",
    ]
    assert all(
        s.parent is not None and s.parent.span_id == decision.context.span_id for s in lookups
    )
    assert attributes(lookups[1])["retrieval_gate.lookup.ids"] == 1
    assert attributes(decision)["retrieval_gate.substituted"] == 1
    assert attributes(decision)["retrieval_gate.released"] == 2
    assert attributes(decision)["retrieval_gate.rejected.STATUS_SUPERSEDED"] == 1


def test_a_store_outage_marks_the_lookup_and_the_rejections(traced: Traced) -> None:
    traced.inner.down = True

    traced.search(MIXED)

    spans = traced.spans()
    lookup = one(spans, tracing.LOOKUP_SPAN)
    assert attributes(lookup)["retrieval_gate.lookup.outcome"] == "unavailable"
    assert attributes(lookup)["retrieval_gate.lookup.unavailable"] == 4
    assert lookup.status.status_code is StatusCode.ERROR
    assert attributes(lookup)["error.type"] == "StoreUnavailable"
    decision = attributes(one(spans, tracing.DECISION_SPAN))
    assert decision["retrieval_gate.rejected.METADATA_UNAVAILABLE"] == 4
    assert decision["retrieval_gate.outcome"] == "abstained"


def test_a_postgresql_lookup_names_its_server_never_its_url(tmp_path: Path) -> None:
    url = parse_postgres_url("postgresql://gate:s3cret@db.internal:6432/gate?sslmode=require")
    traced = Traced(tmp_path, store_endpoint=endpoint(url))
    traced.search(MIXED)

    lookup = one(traced.spans(), tracing.LOOKUP_SPAN)
    assert lookup.kind is SpanKind.CLIENT
    values = attributes(lookup)
    assert {k: v for k, v in values.items() if not k.startswith("retrieval_gate.")} == {
        "db.system.name": "postgresql",
        "server.address": "db.internal",
        "server.port": 6432,
    }
    assert not any("s3cret" in str(v) or "gate:" in str(v) for v in values.values())


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://gate@db:5433/gate", StoreEndpoint("postgresql", "db", 5433)),
        ("postgresql://gate@db/gate", StoreEndpoint("postgresql", "db", 5432)),
        ("postgresql://gate@a:5001,b:5002/gate", StoreEndpoint("postgresql", "a", 5001)),
        (
            "postgresql:///gate?host=/run/postgresql",
            StoreEndpoint("postgresql", "/run/postgresql", 5432),
        ),
        ("postgresql:///gate", StoreEndpoint("postgresql", None, 5432)),
    ],
)
def test_the_endpoint_is_where_libpq_connects_first(
    monkeypatch: pytest.MonkeyPatch, url: str, expected: StoreEndpoint
) -> None:
    monkeypatch.delenv("PGHOST", raising=False)
    monkeypatch.delenv("PGPORT", raising=False)
    assert endpoint(parse_postgres_url(url)) == expected


def test_an_exception_in_a_lookup_is_its_error_type() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traces = tracing.Tracing(gate_tracer(provider), db_system="postgresql")
    decision = traces.decision(
        None, decision_id="d", request_id="r", format_name="f", mode="enforce"
    )
    with decision, pytest.raises(asyncio.CancelledError), traces.lookup("candidates", 1):
        raise asyncio.CancelledError
    lookup = one(list(exporter.get_finished_spans()), tracing.LOOKUP_SPAN)
    assert attributes(lookup)["error.type"] == "CancelledError"
    assert lookup.status.status_code is StatusCode.ERROR


def test_an_undecidable_body_is_a_span_with_its_error_code(traced: Traced) -> None:
    traced.search([], body=b'{"result": [')

    decision = one(traced.spans(), tracing.DECISION_SPAN)
    assert attributes(decision) == {
        "retrieval_gate.decision_id": traced.last_audit()["decision_id"],
        "retrieval_gate.request_id": "req-1",
        "retrieval_gate.format": "qdrant",
        "retrieval_gate.mode": "enforce",
        "retrieval_gate.collections": ("docs",),
        "retrieval_gate.outcome": "error",
        "retrieval_gate.status_code": 502,
        "retrieval_gate.code": "upstream_body_malformed",
    }
    assert decision.status.status_code is StatusCode.ERROR
    assert decision.status.description == "upstream_body_malformed"


def test_strict_mode_blocking_is_an_outcome_not_an_error(tmp_path: Path) -> None:
    traced = Traced(
        tmp_path, settings_of(routes={"/collections/docs/": RouteOptions(mode=Mode.STRICT)})
    )

    result = traced.search(MIXED)

    decision = one(traced.spans(), tracing.DECISION_SPAN)
    assert result.status == 403
    assert attributes(decision)["retrieval_gate.outcome"] == "blocked"
    assert attributes(decision)["retrieval_gate.code"] == "rejected_chunks"
    assert attributes(decision)["retrieval_gate.released"] == 0
    assert decision.status.status_code is StatusCode.UNSET


def test_upstream_errors_and_unreadable_bodies_are_decisions_too(traced: Traced) -> None:
    fmt = traced.filter.format_for(SEARCH)
    assert fmt is not None
    parent = {"traceparent": TRACEPARENT}

    traced.filter.upstream_error(fmt, SEARCH, ALICE, "req-2", 503, b"shard failure", parent)
    traced.filter.reject_unreadable(fmt, SEARCH, ALICE, "req-3", "unknown coding", parent)

    first, second = (attributes(s) for s in traced.spans())
    assert (first["retrieval_gate.code"], first["retrieval_gate.status_code"]) == (
        "upstream_error",
        503,
    )
    assert (second["retrieval_gate.code"], second["retrieval_gate.status_code"]) == (
        "upstream_body_unreadable",
        502,
    )
    assert first["retrieval_gate.request_id"] == "req-2"


def test_every_attribute_is_documented() -> None:
    documented = DOCS.read_text(encoding="utf-8")
    names = [
        value
        for name, value in vars(tracing).items()
        if name.isupper() and isinstance(value, str) and value.startswith("retrieval_gate.")
    ]
    assert len(names) > 20
    names += [tracing.DB_SYSTEM_NAME, tracing.SERVER_ADDRESS, tracing.SERVER_PORT]
    names += [tracing.ERROR_TYPE]
    missing = [name for name in names if f"`{name}" not in documented]
    assert missing == []


# What must never reach a span: chunk text, query text, principals. Each carries
# a marker the test looks for again; hypothesis varies the texts, which hits
# were changed in the index, the query, the caller and the route's mode.
_MARKER = "ZQXJ"
_texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
_DOCUMENTED = {
    value
    for name, value in vars(tracing).items()
    if name.isupper() and isinstance(value, str) and value.startswith("retrieval_gate.")
}
_DOCUMENTED |= {tracing.DB_SYSTEM_NAME, tracing.SERVER_ADDRESS, tracing.SERVER_PORT}
_DOCUMENTED |= {tracing.ERROR_TYPE}
_REASON_COUNTS = {tracing.REJECTED_PREFIX + reason.value for reason in Reason}


@pytest.fixture(scope="module")
def traced_by_mode(tmp_path_factory: pytest.TempPathFactory) -> dict[Mode, Traced]:
    """One traced filter per mode, pushing the tenant down and substituting successors."""
    return {
        mode: Traced(
            tmp_path_factory.mktemp(mode),
            settings_of(mode=mode, tenant_key="tenant", substitute_superseded=True),
        )
        for mode in Mode
    }


def _values(span: ReadableSpan) -> list[str]:
    """Every string a span carries: name, status, attribute keys and values, events."""
    values = [span.name, span.status.description or ""]
    for key, value in (span.attributes or {}).items():
        values.append(key)
        values.extend(str(v) for v in (value if isinstance(value, tuple) else (value,)))
    for event in span.events:
        values.append(event.name)
        values.extend(str(v) for v in (event.attributes or {}).values())
    return values


@given(
    mode=st.sampled_from(list(Mode)),
    edits=st.lists(st.one_of(st.none(), _texts), min_size=5, max_size=5),
    query=_texts,
    principal=_texts,
)
def test_no_text_reaches_any_attribute(
    traced_by_mode: dict[Mode, Traced],
    mode: Mode,
    edits: list[str | None],
    query: str,
    principal: str,
) -> None:
    traced = traced_by_mode[mode]
    stored = [text_for(str(i)) for i in range(1, 6)]
    # None: the hit as stored; a text: the hit changed in the index (HASH_MISMATCH).
    sent = [
        text if edit is None else f"{text} {_MARKER}{edit}"
        for text, edit in zip(stored, edits, strict=True)
    ]
    hits = [qb.point(i, text) for i, text in enumerate(sent, start=1)]
    hits.append(qb.point(77, f"{_MARKER} a chunk the store does not know"))
    query_text = f"{_MARKER} query {query}"
    caller = Caller("acme", frozenset({f"user:{_MARKER}{principal}"}))
    fmt = traced.filter.format_for(SEARCH)
    assert fmt is not None and fmt.rewrites_request(SEARCH)
    request = {"vector": [0.1], "filter": {"must": [{"key": "t", "match": {"text": query_text}}]}}
    rewrite = fmt.rewrite_request(
        orjson.dumps(request),
        SEARCH,
        tenant=caller.tenant,
        tenant_key="tenant",
        overfetch_factor=1.0,
        overfetch_cap=1000,
    )
    assert _MARKER.encode() in rewrite.body  # the query is there to leak

    traced.search(hits, {"traceparent": TRACEPARENT}, caller=caller, rewrite=rewrite)

    spans = traced.spans()
    assert tracing.DECISION_SPAN in {span.name for span in spans}
    secrets = [_MARKER, SUCCESSOR_TEXT, *stored, *(canonical_sha256(t) for t in sent)]
    for span in spans:
        assert [s for s in secrets for v in _values(span) if s in v] == []
        for key in span.attributes or {}:
            assert key in _DOCUMENTED or key in _REASON_COUNTS, key


# The process: the OTEL_* variables decide, once per sidecar process.


def test_without_otel_variables_tracing_is_off(tmp_path: Path) -> None:
    assert start_tracing() is None
    built = Sidecar.from_settings(_settings(tmp_path))
    assert built.tracing is None


@pytest.mark.parametrize(
    "variables",
    [
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_TRACES_EXPORTER": ""},
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"},
    ],
)
def test_none_or_a_disabled_sdk_is_off(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str]
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert start_tracing() is None


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "unknown exporter 'jaeger'"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "grpc only",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
            "grpc only",
        ),
    ],
)
def test_an_exporter_this_build_lacks_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], message: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=re.escape(message)):
        start_tracing()


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_refuses_a_wrong_exporter_before_it_serves(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    workers: int,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    code = cli_main(
        [
            "serve",
            "--identity",
            "trusted-headers",
            "--store",
            new_sqlite_url(tmp_path / "gate.db"),
            "--grpc-listen",
            f"unix:{tmp_path / 'gate.sock'}",
            "--workers",
            str(workers),
        ]
    )
    # With workers the parent checks before it spawns any: a message, not a dead worker.
    assert code == ExitCode.CANNOT_RUN
    assert "unknown exporter 'jaeger'" in capsys.readouterr().err


B3_TRACE = "80f198ee56343ba864fe8b2a57d3eff7"
B3_SPAN = "e457b5a2e4d86bd1"


@pytest.mark.parametrize(
    ("propagators", "headers"),
    [
        (None, {"traceparent": TRACEPARENT}),
        ("tracecontext,baggage", {"traceparent": TRACEPARENT, "baggage": "k=v"}),
        ("b3", {"b3": f"{B3_TRACE}-{B3_SPAN}-1"}),
        (
            "b3multi",
            {"x-b3-traceid": B3_TRACE, "x-b3-spanid": B3_SPAN, "x-b3-sampled": "1"},
        ),
        (
            "tracecontext,b3multi",
            {"x-b3-traceid": B3_TRACE, "x-b3-spanid": B3_SPAN, "x-b3-sampled": "1"},
        ),
    ],
    ids=["default", "tracecontext", "b3", "b3multi", "either"],
)
def test_otel_propagators_chooses_the_headers_the_parent_is_read_from(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    propagators: str | None,
    headers: dict[str, str],
) -> None:
    if propagators is not None:
        monkeypatch.setenv("OTEL_PROPAGATORS", propagators)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    provider = start_tracing()  # sets the process's propagator
    assert provider is not None
    provider.shutdown()
    request = {**headers, "x-request-id": "r", "content-type": "application/json"}
    assert tracing.trace_context(request) == headers  # what the servicers pass on
    traced = Traced(tmp_path)
    traced.search(MIXED, tracing.trace_context(request))

    decision = one(traced.spans(), tracing.DECISION_SPAN)
    trace_id, span_id = (
        (B3_TRACE, B3_SPAN) if "traceparent" not in headers else (TRACE_ID, PARENT_ID)
    )
    assert decision.context.trace_id == int(trace_id, 16)
    assert decision.parent is not None and decision.parent.span_id == int(span_id, 16)


def test_otel_propagators_none_reads_no_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_PROPAGATORS", "none")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    provider = start_tracing()
    assert provider is not None
    provider.shutdown()
    assert tracing.trace_context({"traceparent": TRACEPARENT}) == {}
    traced = Traced(tmp_path)
    traced.search(MIXED, {"traceparent": TRACEPARENT})
    assert one(traced.spans(), tracing.DECISION_SPAN).parent is None


@pytest.mark.parametrize("value", ["b4", "tracecontext,jaeger", "none,b3"])
def test_an_unknown_propagator_stops_the_start_naming_the_valid_ones(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("OTEL_PROPAGATORS", value)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    with pytest.raises(ConfigError) as raised:
        start_tracing()
    (problem,) = raised.value.problems
    assert problem.startswith("OTEL_PROPAGATORS: ")
    assert "\n" not in problem
    if "none" not in value:
        assert problem.endswith("(one of b3, b3multi, baggage, tracecontext, none)")
    # Read only when tracing is on: a mesh-wide value the gate does not use stops nothing.
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")
    check_environment()
    assert start_tracing() is None


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_refuses_an_unknown_propagator_with_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    workers: int,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_PROPAGATORS", "b3single")
    code = cli_main(
        [
            "serve",
            "--identity",
            "trusted-headers",
            "--store",
            new_sqlite_url(tmp_path / "gate.db"),
            "--grpc-listen",
            f"unix:{tmp_path / 'gate.sock'}",
            "--workers",
            str(workers),
        ]
    )
    assert code == ExitCode.CANNOT_RUN
    assert int(code) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "OTEL_PROPAGATORS" in line]
    assert errors == [
        "error: OTEL_PROPAGATORS: unknown propagator 'b3single' "
        "(one of b3, b3multi, baggage, tracecontext, none)"
    ]


def test_propagator_defaults_to_w3c_trace_context_and_baggage() -> None:
    assert propagator().fields == {"traceparent", "tracestate", "baggage"}


def test_the_service_name_is_the_variables_or_retrieval_gate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    default = start_tracing()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gate-eu-1")
    named = start_tracing()
    assert default is not None and named is not None
    try:
        assert default.resource.attributes["service.name"] == DEFAULT_SERVICE_NAME
        assert named.resource.attributes["service.name"] == "gate-eu-1"
    finally:
        default.shutdown()
        named.shutdown()


def _settings(tmp_path: Path) -> Settings:
    return with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
        audit_log=tmp_path / "audit.jsonl",
    )


def test_the_sidecar_traces_a_stream_under_the_requests_traceparent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gate-under-test")
    built = Sidecar.from_settings(_settings(tmp_path))
    assert built.tracing is not None
    kept = InMemorySpanExporter()
    built.tracing.add_span_processor(SimpleSpanProcessor(kept))
    built.store.upsert([parse_record(record_dict("1"))])
    body = qb.encode(qb.search_body([qb.point(1, text_for("1")), qb.point(2, "unknown")]))

    answers = run_stream(
        built,
        [
            request_headers(SEARCH.path, traceparent=TRACEPARENT, tracestate="app=7"),
            response_headers(),
            response_body(body),
        ],
    )
    asyncio.run(built.aclose())  # exports what the batch processor still holds

    assert answers[-1].HasField("response_body")
    spans = list(kept.get_finished_spans())
    decision = one(spans, tracing.DECISION_SPAN)
    assert decision.context.trace_id == int(TRACE_ID, 16)
    assert decision.parent is not None and decision.parent.span_id == int(PARENT_ID, 16)
    assert decision.resource.attributes["service.name"] == "gate-under-test"
    assert attributes(decision)["retrieval_gate.rejected.MISSING_METADATA"] == 1
    # The sidecar's own cache reports to the span too.
    assert attributes(one(spans, tracing.LOOKUP_SPAN))["retrieval_gate.cache.misses"] == 2
    # And the configured exporter got them: the console one prints JSON.
    printed = capsys.readouterr().out
    assert f'"trace_id": "0x{TRACE_ID}"' in printed
    assert tracing.DECISION_SPAN in printed
