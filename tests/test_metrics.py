"""GateMetrics helpers that keep Prometheus children instead of calling labels() per chunk."""

from __future__ import annotations

from sidecar.core.outcome import Outcome
from sidecar.metrics import UPSTREAM_ERROR_OUTCOME, GateMetrics


def sample(metrics: GateMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_count_chunks_adds_per_decision_reason_and_format() -> None:
    metrics = GateMetrics()
    metrics.count_chunks("qdrant", {("admitted", "NONE"): 3, ("rejected", "EXPIRED"): 2})
    metrics.count_chunks("qdrant", {("admitted", "NONE"): 1})
    metrics.count_chunks("chroma", {("rejected", "EXPIRED"): 4})
    name = "retrieval_gate_chunks_total"
    assert sample(metrics, name, decision="admitted", reason="NONE", format="qdrant") == 4
    assert sample(metrics, name, decision="rejected", reason="EXPIRED", format="qdrant") == 2
    assert sample(metrics, name, decision="rejected", reason="EXPIRED", format="chroma") == 4
    assert sample(metrics, name, decision="admitted", reason="NONE", format="chroma") is None


def test_count_response_counts_per_outcome_and_format() -> None:
    metrics = GateMetrics()
    for _ in range(3):
        metrics.count_response("filtered", "qdrant")
    metrics.count_response("blocked", "qdrant")
    name = "retrieval_gate_responses_total"
    assert sample(metrics, name, outcome="filtered", format="qdrant") == 3
    assert sample(metrics, name, outcome="blocked", format="qdrant") == 1


def test_kept_children_are_the_ones_the_registry_exports() -> None:
    metrics = GateMetrics()
    metrics.count_chunks("qdrant", {("admitted", "NONE"): 1})
    # Whoever still calls labels() directly adds to the same series.
    metrics.chunks.labels("admitted", "NONE", "qdrant").inc(2)
    metrics.count_chunks("qdrant", {("admitted", "NONE"): 1})
    name = "retrieval_gate_chunks_total"
    assert sample(metrics, name, decision="admitted", reason="NONE", format="qdrant") == 4


def test_verdict_cache_counters_exist_from_the_start() -> None:
    metrics = GateMetrics()
    assert sample(metrics, "retrieval_gate_verdict_cache_hits_total") == 0
    assert sample(metrics, "retrieval_gate_verdict_cache_misses_total") == 0


def test_upstream_errors_are_an_outcome_of_their_own() -> None:
    # Apart from the gate's own failures (error), which an operator alerts on.
    assert UPSTREAM_ERROR_OUTCOME not in {outcome.value for outcome in Outcome}
    metrics = GateMetrics()
    metrics.count_response(UPSTREAM_ERROR_OUTCOME, "qdrant")
    name = "retrieval_gate_responses_total"
    assert sample(metrics, name, outcome="upstream_error", format="qdrant") == 1
    assert sample(metrics, name, outcome="error", format="qdrant") is None
