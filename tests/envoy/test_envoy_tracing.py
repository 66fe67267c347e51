"""Traces through a real Envoy, exported over OTLP/gRPC to a collector the test runs.

The sidecar is the real ``retrieval-gate serve`` process, configured only by
the OTEL_* variables it inherits; its exporter is the real OTLP/gRPC one. The
receiving end is a fake collector: OTLP's own ``TraceService`` (the
opentelemetry-proto messages and service the exporter speaks) served with
grpc.aio in a thread of the test, standing in for an OpenTelemetry Collector,
Jaeger or Langfuse's OTLP endpoint, none of which can be installed here.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sidecar import tracing
from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import GateStack, wait_until
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

SEARCH = "/collections/docs/points/search"
BODY = qb.encode(qb.search_body([qb.point(1, text_for("1")), qb.point(2, text_for("2"))]))
RECORDS = [record_dict("1"), record_dict("2", status="revoked")]


def _value(attribute: KeyValue) -> Any:
    kind = attribute.value.WhichOneof("value")
    if kind == "array_value":
        return tuple(v.string_value for v in attribute.value.array_value.values)
    return getattr(attribute.value, kind) if kind is not None else None


class ExportedSpan:
    """One span as the collector received it, with its resource's attributes."""

    def __init__(self, span: Span, resource: dict[str, Any]) -> None:
        self.name = span.name
        self.trace_id = span.trace_id.hex()
        self.span_id = span.span_id.hex()
        self.parent_span_id = span.parent_span_id.hex()
        self.trace_state = span.trace_state
        self.attributes = {a.key: _value(a) for a in span.attributes}
        self.resource = resource


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """A fake OTLP trace collector: keeps every span it is sent."""

    def __init__(self) -> None:
        self._spans: list[ExportedSpan] = []
        self._lock = threading.Lock()

    async def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.aio.ServicerContext,
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                received += [ExportedSpan(span, resource) for span in scope_spans.spans]
        with self._lock:
            self._spans += received
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self, name: str) -> list[ExportedSpan]:
        with self._lock:
            return [span for span in self._spans if span.name == name]

    def spans_of_trace(self, trace_id: str) -> list[ExportedSpan]:
        with self._lock:
            return [span for span in self._spans if span.trace_id == trace_id]

    def decision(self, trace_id: str) -> ExportedSpan | None:
        """The decision span of trace ``trace_id``, once it has arrived."""
        found = [s for s in self.spans(tracing.DECISION_SPAN) if s.trace_id == trace_id]
        assert len(found) <= 1
        return found[0] if found else None


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    """The collector, serving on a free loopback port from a thread of its own."""
    servicer = Collector()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    port = 0
    server: grpc.aio.Server | None = None

    async def start() -> None:
        nonlocal port, server
        server = grpc.aio.server()
        # Generated without type hints (no .pyi for the service module).
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        started.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=run, name="otlp-collector", daemon=True)
    thread.start()
    assert started.wait(10), "the collector did not start"
    yield servicer, port
    assert server is not None
    asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def traced_stack(
    workdir: Path,
    port: int,
    monkeypatch: pytest.MonkeyPatch,
    workers: int = 1,
    *,
    envoy_traces: bool = False,
) -> GateStack:
    """A stack whose sidecar process exports its spans to the collector on ``port``;
    with ``envoy_traces`` Envoy too (its OpenTelemetry tracer, as a mesh's sidecar)."""
    # The sidecar process inherits the test's environment.
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gate-under-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not 5 s
    edit = (lambda bootstrap: _envoy_traces_to(bootstrap, port)) if envoy_traces else None
    stack = GateStack(workdir, RECORDS, config={"workers": workers}, edit_bootstrap=edit)
    stack.start()
    stack.upstream.respond("POST", SEARCH, CannedResponse(BODY))
    return stack


ENVOY_SERVICE = "front-envoy"


def _envoy_traces_to(bootstrap: dict[str, Any], port: int) -> None:
    """Envoy's own tracing on (every request sampled), exported to the collector on ``port``."""
    listener = bootstrap["static_resources"]["listeners"][0]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    manager["tracing"] = {
        "random_sampling": {"value": 100},
        "provider": {
            "name": "envoy.tracers.opentelemetry",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
                "grpc_service": {"envoy_grpc": {"cluster_name": "otlp_collector"}},
                "service_name": ENVOY_SERVICE,
            },
        },
    }
    bootstrap["static_resources"]["clusters"].append(
        {
            "name": "otlp_collector",
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/"
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}},
                }
            },
            "load_assignment": {
                "cluster_name": "otlp_collector",
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": {
                                        "socket_address": {
                                            "address": "127.0.0.1",
                                            "port_value": port,
                                        }
                                    }
                                }
                            }
                        ]
                    }
                ],
            },
        }
    )


def new_trace() -> tuple[str, str]:
    """A fresh trace id and parent span id, as an application would send them."""
    return secrets.token_hex(16), secrets.token_hex(8)


def test_a_request_with_a_traceparent_yields_a_decision_span_in_that_trace(
    tmp_path: Path, collector: tuple[Collector, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    spans, port = collector
    stack = traced_stack(tmp_path, port, monkeypatch)
    try:
        trace_id, parent_id = new_trace()
        traced = stack.search(
            SEARCH,
            headers={"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "app=7"},
        )
        untraced = stack.search(SEARCH)

        assert [h["id"] for h in traced.json()["result"]] == [1]
        assert wait_until(lambda: spans.decision(trace_id) is not None)
        decision = spans.decision(trace_id)
        assert decision is not None
        assert decision.parent_span_id == parent_id
        assert decision.trace_state == "app=7"
        assert decision.resource["service.name"] == "gate-under-test"
        decision_id = traced.headers["x-retrieval-gate-decision-id"]
        assert decision.attributes["retrieval_gate.decision_id"] == decision_id
        assert decision.attributes["retrieval_gate.format"] == "qdrant"
        assert decision.attributes["retrieval_gate.collections"] == ("docs",)
        assert decision.attributes["retrieval_gate.outcome"] == "filtered"
        assert decision.attributes["retrieval_gate.rejected.STATUS_REVOKED"] == 1
        assert decision.attributes["retrieval_gate.admitted"] == 1
        lookups = [s for s in spans.spans(tracing.LOOKUP_SPAN) if s.trace_id == trace_id]
        assert [s.parent_span_id for s in lookups] == [decision.span_id]

        # A request without one starts a trace of its own.
        other_id = untraced.headers["x-retrieval-gate-decision-id"]
        assert wait_until(
            lambda: any(
                s.attributes["retrieval_gate.decision_id"] == other_id
                for s in spans.spans(tracing.DECISION_SPAN)
            )
        )
        (own,) = [
            s
            for s in spans.spans(tracing.DECISION_SPAN)
            if s.attributes["retrieval_gate.decision_id"] == other_id
        ]
        assert own.parent_span_id == ""
        assert own.trace_id != trace_id
    finally:
        stack.stop()


def test_each_worker_process_exports_its_own_spans(
    tmp_path: Path, collector: tuple[Collector, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    spans, port = collector
    stack = traced_stack(tmp_path, port, monkeypatch, workers=2)
    try:
        traces = [new_trace() for _ in range(24)]

        def send(ids: tuple[str, str]) -> int:
            headers = {"traceparent": f"00-{ids[0]}-{ids[1]}-01"}
            return stack.search(SEARCH, headers=headers).status

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(send, traces)) == {200}

        assert wait_until(lambda: all(spans.decision(t) is not None for t, _ in traces))
        decisions = [spans.decision(trace_id) for trace_id, _ in traces]
        assert [d.parent_span_id if d else None for d in decisions] == [p for _, p in traces]
        # Every worker started a provider of its own (a resource per process).
        instances = {d.resource["service.instance.id"] for d in decisions if d is not None}
        assert len(instances) == 2
    finally:
        stack.stop()


def test_behind_a_tracing_envoy_the_decision_is_a_sibling_of_envoys_span(
    tmp_path: Path, collector: tuple[Collector, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Envoy's router injects its own span into the request only after ext_proc
    # has read the headers: the gate sees the application's traceparent, so
    # its decision and Envoy's span are both children of the application's span.
    spans, port = collector
    stack = traced_stack(tmp_path, port, monkeypatch, envoy_traces=True)
    try:
        trace_id, parent_id = new_trace()
        response = stack.search(SEARCH, headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
        assert response.status == 200

        def envoy_span() -> ExportedSpan | None:
            found = [
                s
                for s in spans.spans_of_trace(trace_id)
                if s.resource.get("service.name") == ENVOY_SERVICE and s.parent_span_id == parent_id
            ]
            return found[0] if found else None

        assert wait_until(lambda: spans.decision(trace_id) is not None)
        assert wait_until(lambda: envoy_span() is not None, timeout=30)
        decision, envoy = spans.decision(trace_id), envoy_span()
        assert decision is not None and envoy is not None
        assert decision.parent_span_id == parent_id  # not Envoy's span
        assert envoy.parent_span_id == parent_id
        # The database got Envoy's span as its parent: injected after the gate read the headers.
        (seen,) = [r for r in stack.upstream.requests if r.path == SEARCH]
        assert seen.headers["traceparent"].split("-")[1:3] == [trace_id, envoy.span_id]
    finally:
        stack.stop()


def test_a_b3_mesh_gets_decision_spans_in_its_traces(
    tmp_path: Path, collector: tuple[Collector, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    spans, port = collector
    monkeypatch.setenv("OTEL_PROPAGATORS", "b3multi")
    stack = traced_stack(tmp_path, port, monkeypatch)
    try:
        trace_id, parent_id = new_trace()
        headers = {"x-b3-traceid": trace_id, "x-b3-spanid": parent_id, "x-b3-sampled": "1"}
        assert stack.search(SEARCH, headers=headers).status == 200
        assert wait_until(lambda: spans.decision(trace_id) is not None)
        decision = spans.decision(trace_id)
        assert decision is not None and decision.parent_span_id == parent_id
    finally:
        stack.stop()
