"""Tracing for one sidecar process, configured only by the standard ``OTEL_*`` variables.

``OTEL_TRACES_EXPORTER`` chooses: ``otlp`` (OTLP over gRPC to
``OTEL_EXPORTER_OTLP_ENDPOINT``), ``console`` (JSON on standard output), both
(``otlp,console``) or ``none``. Unset means off, unlike the SDK's own default
of ``otlp``: a gate that nobody asked to trace makes no spans and opens no
connection. Everything else (service name, resource attributes, sampler,
batching, endpoint, headers, TLS, timeouts, compression) the SDK and the
exporter read from their own variables.

Each process that serves streams starts its own provider (``Sidecar``
builds one per process; with ``workers = N`` that is once per worker), since
an exporter's thread and gRPC channel do not survive into another process.

``OTEL_PROPAGATORS`` chooses how the parent is read from a request's headers
(default ``tracecontext,baggage``; ``b3`` and ``b3multi`` for B3 meshes, from
opentelemetry-propagator-b3; ``none``). The names are looked up among the
installed ``opentelemetry_propagator`` entry points, as the SDK does, but an
unknown one is a ConfigError naming the valid ones rather than an exception
at import. It is read only when tracing is on.
"""

from __future__ import annotations

import logging
import os
import sys
from importlib.metadata import entry_points

from opentelemetry.environment_variables import OTEL_PROPAGATORS, OTEL_TRACES_EXPORTER
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_SDK_DISABLED,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Tracer

import sidecar
from sidecar.config import ConfigError
from sidecar.store.cache import CacheObserver
from sidecar.tracing import count_cache, no_propagation, set_propagator

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "retrieval-gate"
TRACER_NAME = "retrieval_gate"
EXPORTERS = ("otlp", "console", "none")
DEFAULT_PROPAGATORS = "tracecontext,baggage"  # the OpenTelemetry default
_PROPAGATOR_GROUP = "opentelemetry_propagator"


def exporter_names() -> list[str]:
    """The exporters the ``OTEL_*`` variables ask for; none when tracing is off.

    Raises ConfigError for an exporter or an OTLP protocol this build does not
    have: a typo must not silently lose every trace.
    """
    if os.environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in os.environ.get(OTEL_TRACES_EXPORTER, "").split(",")]
    names = [n for n in names if n and n != "none"]
    for name in names:
        if name not in EXPORTERS:
            raise ConfigError(
                f"{OTEL_TRACES_EXPORTER}: unknown exporter {name!r} (one of {', '.join(EXPORTERS)})"
            )
    if "otlp" in names:
        protocol = os.environ.get(
            OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, os.environ.get(OTEL_EXPORTER_OTLP_PROTOCOL, "grpc")
        )
        if protocol.strip().lower() != "grpc":
            raise ConfigError(
                f"OTLP protocol {protocol!r}: this build exports traces over grpc only"
            )
    return names


def propagator_names() -> list[str]:
    """The propagators this build has (the installed entry points), sorted."""
    return sorted({point.name for point in entry_points(group=_PROPAGATOR_GROUP)})


def propagator() -> TextMapPropagator:
    """The propagator ``OTEL_PROPAGATORS`` names (default ``tracecontext,baggage``).

    Raises ConfigError for a name this build does not have: a typo would start
    every decision's trace anew, detached from the application's.
    """
    text = os.environ.get(OTEL_PROPAGATORS, "").strip() or DEFAULT_PROPAGATORS
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if "none" in names:
        if names != ["none"]:
            raise ConfigError(f"{OTEL_PROPAGATORS}: 'none' cannot be combined with others")
        return no_propagation()
    available = {point.name: point for point in entry_points(group=_PROPAGATOR_GROUP)}
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ConfigError(
            f"{OTEL_PROPAGATORS}: unknown propagator {unknown[0]!r} "
            f"(one of {', '.join([*propagator_names(), 'none'])})"
        )
    return CompositePropagator([available[n].load()() for n in dict.fromkeys(names)])


def check_environment() -> None:
    """Raise ConfigError for an ``OTEL_*`` variable this build cannot honour (when tracing
    is on): what ``start_tracing`` would refuse, checked without starting anything."""
    if exporter_names():
        propagator()


def start_tracing() -> TracerProvider | None:
    """This process's tracer provider, as the ``OTEL_*`` variables say; None when tracing is off.

    Also sets the propagator that reads each decision's parent (``OTEL_PROPAGATORS``).
    Raises ConfigError as ``exporter_names`` and ``propagator`` do.
    """
    names = exporter_names()
    if not names:
        return None
    set_propagator(propagator())
    exporters = [_exporter(name) for name in names]
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info(
        "tracing on: service %s, exporters %s",
        resource.attributes.get(SERVICE_NAME),
        ", ".join(names),
    )
    return provider


def gate_tracer(provider: TracerProvider) -> Tracer:
    """The tracer the response path makes its spans with."""
    return provider.get_tracer(TRACER_NAME, sidecar.__version__)


def _exporter(name: str) -> SpanExporter:
    """The exporter ``name`` (one of ``exporter_names()``)."""
    if name == "console":
        # Standard output as it is now: the SDK's default is whatever it was at import.
        return ConsoleSpanExporter(out=sys.stdout)
    # Imported here: it takes about 0.2 s, which a gate that exports nothing need not pay.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


class TracedCacheObserver(CacheObserver):
    """Passes every cache event on to ``inner`` and counts hits and misses
    towards the traced store lookup running, if any (``sidecar.tracing.count_cache``)."""

    def __init__(self, inner: CacheObserver) -> None:
        self._inner = inner

    def hit(self, n: int) -> None:
        count_cache(hits=n)
        self._inner.hit(n)

    def miss(self, n: int) -> None:
        count_cache(misses=n)
        self._inner.miss(n)

    def store_error(self) -> None:
        self._inner.store_error()

    def store_latency(self, seconds: float) -> None:
        self._inner.store_latency(seconds)

    def evicted(self, n: int) -> None:
        self._inner.evicted(n)

    def invalidated(self, n: int) -> None:
        self._inner.invalidated(n)

    def cleared(self) -> None:
        self._inner.cleared()

    def watching(self, seen: bool) -> None:
        self._inner.watching(seen)

    def stale_served(self, n: int) -> None:
        self._inner.stale_served(n)
