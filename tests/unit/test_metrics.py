"""GateMetrics: children kept instead of labels() per chunk, the bounded collection
label, the series alerts need from the start, and what a decided response counts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from sidecar.audit.sink import NullAuditSink
from sidecar.config import ConfigError, Settings, default_policy_dir, format_table, load_settings
from sidecar.core.caller import Caller
from sidecar.core.decision_core import DecisionCore
from sidecar.core.hits import Route
from sidecar.core.modes import RoutePolicies
from sidecar.core.outcome import Outcome
from sidecar.enforcement.response_filter import ResponseFilter
from sidecar.formats.base import RequestRewrite
from sidecar.metrics import (
    UPSTREAM_ERROR_OUTCOME,
    GateMetrics,
    check_metric_collections,
)
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.store.cache import CachedStore
from sidecar.store.loader import parse_record
from tests.fixtures import milvus_bodies as mb
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.stores import new_sqlite_store


def sample(metrics: GateMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_count_chunks_adds_per_decision_reason_format_and_collection() -> None:
    metrics = GateMetrics()
    metrics.count_chunks("qdrant", "other", {("admitted", "NONE"): 3, ("rejected", "EXPIRED"): 2})
    metrics.count_chunks("qdrant", "other", {("admitted", "NONE"): 1})
    metrics.count_chunks("chroma", "other", {("rejected", "EXPIRED"): 4})
    metrics.count_chunks("chroma", "none", {("rejected", "EXPIRED"): 1})
    name = "retrieval_gate_chunks_total"

    def chunks(decision: str, reason: str, fmt: str, collection: str = "other") -> float | None:
        labels = {"decision": decision, "reason": reason, "format": fmt, "collection": collection}
        return sample(metrics, name, **labels)

    assert chunks("admitted", "NONE", "qdrant") == 4
    assert chunks("rejected", "EXPIRED", "qdrant") == 2
    assert chunks("rejected", "EXPIRED", "chroma") == 4
    assert chunks("rejected", "EXPIRED", "chroma", "none") == 1
    assert chunks("admitted", "NONE", "chroma") is None


def test_count_response_counts_per_outcome_format_and_collection() -> None:
    metrics = GateMetrics()
    for _ in range(3):
        metrics.count_response("filtered", "qdrant", "other")
    metrics.count_response("blocked", "qdrant", "other")
    name = "retrieval_gate_responses_total"
    labels = {"format": "qdrant", "collection": "other"}
    assert sample(metrics, name, outcome="filtered", **labels) == 3
    assert sample(metrics, name, outcome="blocked", **labels) == 1


def test_kept_children_are_the_ones_the_registry_exports() -> None:
    metrics = GateMetrics()
    metrics.count_chunks("qdrant", "other", {("admitted", "NONE"): 1})
    # Whoever still calls labels() directly adds to the same series.
    metrics.chunks.labels("admitted", "NONE", "qdrant", "other").inc(2)
    metrics.count_chunks("qdrant", "other", {("admitted", "NONE"): 1})
    name = "retrieval_gate_chunks_total"
    labels = {"decision": "admitted", "reason": "NONE", "format": "qdrant", "collection": "other"}
    assert sample(metrics, name, **labels) == 4


def test_verdict_cache_counters_exist_from_the_start() -> None:
    metrics = GateMetrics()
    assert sample(metrics, "retrieval_gate_verdict_cache_hits_total") == 0
    assert sample(metrics, "retrieval_gate_verdict_cache_misses_total") == 0


def test_upstream_errors_are_an_outcome_of_their_own() -> None:
    # Apart from the gate's own failures (error), which an operator alerts on.
    assert UPSTREAM_ERROR_OUTCOME not in {outcome.value for outcome in Outcome}
    metrics = GateMetrics()
    metrics.count_response(UPSTREAM_ERROR_OUTCOME, "qdrant", "other")
    name = "retrieval_gate_responses_total"
    labels = {"format": "qdrant", "collection": "other"}
    assert sample(metrics, name, outcome="upstream_error", **labels) == 1
    assert sample(metrics, name, outcome="error", **labels) is None


@pytest.mark.parametrize(
    ("names", "label"),
    [
        (["sops"], "sops"),
        (["hr"], "hr"),
        (["payroll"], "other"),  # not on the allowlist
        (["sops", "hr"], "other"),  # several: the hits cannot be told apart
        (["sops*"], "other"),  # a pattern, even one only allowlisted names match
        ([], "none"),
    ],
)
def test_the_collection_label_is_an_allowlisted_name_other_or_none(
    names: list[str], label: str
) -> None:
    assert GateMetrics(collections=["sops", "hr"]).collection_label(names) == label


CHROMA_ID = "45af66b2-2ca0-476a-b6a3-926b26ba75d1"


@pytest.mark.parametrize(
    ("allowlist", "aliases", "label"),
    [
        (["sops"], {CHROMA_ID: "sops"}, "sops"),  # by the name learned for the id
        ([CHROMA_ID], {CHROMA_ID: "sops"}, CHROMA_ID),  # an allowlisted id still counts
        (["sops"], {}, "other"),  # the name is not known (yet)
        (["hr"], {CHROMA_ID: "sops"}, "other"),
    ],
)
def test_a_collection_named_by_id_counts_under_its_learned_name(
    allowlist: list[str], aliases: dict[str, str], label: str
) -> None:
    assert GateMetrics(collections=allowlist).collection_label([CHROMA_ID], aliases) == label


def test_without_an_allowlist_every_collection_is_other() -> None:
    assert GateMetrics().collection_label(["sops"]) == "other"


@pytest.mark.parametrize("taken", ["other", "none", ""])
def test_the_allowlist_cannot_take_a_reserved_label_value(taken: str) -> None:
    with pytest.raises(ValueError):
        check_metric_collections(["sops", taken])
    with pytest.raises(ValueError):
        GateMetrics(collections=[taken])
    with pytest.raises(ConfigError, match="metric_collections"):
        load_settings(None, {"identity": "trusted-headers", "metric_collections": [taken]})


def test_the_allowlist_setting_is_read_from_the_file(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        '[identity]\nmode = "trusted-headers"\n'
        '[telemetry]\nmetric_collections = ["sops", "hr", "sops"]\n'
    )
    assert load_settings(config).telemetry.metric_collections == ("sops", "hr")
    assert Settings().telemetry.metric_collections == ()


# Written out, not read from sidecar.metrics: the series an alert waits for on
# the first occurrence (a tampered chunk, a policy or store failure, a drift, a
# refusal). A value dropped from the implementation's list must fail here.
ALERTED_REASONS = {"HASH_MISMATCH", "PAYLOAD_HASH_MISMATCH", "METADATA_UNAVAILABLE", "POLICY_ERROR"}
DRIFT_KINDS = {"format_only", "edit", "injection", "truncation", "replacement"}
REFUSAL_STATUSES = {"400", "401", "403", "405", "500", "503"}


def series(metrics: GateMetrics, name: str, label: str) -> dict[tuple[str, str], set[str]]:
    """The values of ``label`` in ``name``'s series, by (format, collection), all at 0."""
    found: dict[tuple[str, str], set[str]] = {}
    for family in metrics.registry.collect():
        for sample_ in family.samples:
            if sample_.name != name:
                continue
            assert sample_.value == 0, sample_
            key = (sample_.labels["format"], sample_.labels["collection"])
            found.setdefault(key, set()).add(sample_.labels[label])
    return found


def test_preset_creates_the_alerted_series_at_zero_for_every_format_and_label() -> None:
    metrics = GateMetrics(collections=["sops"])
    metrics.preset(["qdrant", "milvus"])
    keys = {(f, c) for f in ("qdrant", "milvus") for c in ("sops", "other", "none")}
    # Exactly those series: a reason no alert waits for on its first occurrence
    # (EXPIRED, say) has no series yet, and every alerted one has, at 0.
    reasons = series(metrics, "retrieval_gate_chunk_reasons_total", "reason")
    assert reasons == dict.fromkeys(keys, ALERTED_REASONS)
    assert series(metrics, "retrieval_gate_drift_total", "kind") == dict.fromkeys(keys, DRIFT_KINDS)
    for fmt, collection in keys:
        labels = {"format": fmt, "collection": collection}
        assert sample(metrics, "retrieval_gate_pushdown_tenant_mismatches_total", **labels) == 0
    labels = {"format": "qdrant", "collection": "sops", "reason": "EXPIRED"}
    assert sample(metrics, "retrieval_gate_chunk_reasons_total", **labels) is None


def test_preset_creates_every_refusal_status_at_zero() -> None:
    metrics = GateMetrics(collections=[])
    metrics.preset(["qdrant"])
    statuses = {
        sample_.labels["status"]
        for family in metrics.registry.collect()
        for sample_ in family.samples
        if sample_.name == "retrieval_gate_request_refusals_total" and sample_.value == 0
    }
    assert statuses == REFUSAL_STATUSES


# --- What one decided response counts, through the real ResponseFilter ----------

ALICE = Caller("acme", frozenset({"user:alice", "group:qa"}))
TAMPERED = "Text of chunk 2, edited in the index."
RECORDS = [
    record_dict("1"),
    # Superseded and tampered: the primary reason is the status, yet the text differs.
    record_dict("2", status="superseded"),
    record_dict("3", tenant_id="globex"),
]


@pytest.fixture
def counted(tmp_path: Path) -> tuple[ResponseFilter, GateMetrics]:
    metrics = GateMetrics(collections=["sops"])
    store = CachedStore(new_sqlite_store(tmp_path / "gate.db"), ttl=3600.0, observer=metrics)
    store.upsert([parse_record(r) for r in RECORDS])
    response_filter = ResponseFilter(
        formats=format_table(Settings()),
        store=store,
        core=DecisionCore(RegorusEngine.from_directory(default_policy_dir())),
        audit=NullAuditSink(),
        metrics=metrics,
        policies=RoutePolicies(Settings().route_policy),
    )
    return response_filter, metrics


def run(
    response_filter: ResponseFilter, route: Route, body: bytes, rewrite: RequestRewrite | None
) -> None:
    fmt = response_filter.format_for(route)
    assert fmt is not None
    asyncio.run(response_filter.filter(fmt, route, ALICE, "req-1", body, rewrite))


def qdrant_search(collection: str) -> tuple[Route, bytes]:
    points = [
        qb.point(1, text_for("1")),
        qb.point(2, TAMPERED),
        qb.point(3, text_for("3")),
    ]
    route = Route("POST", f"/collections/{collection}/points/search")
    return route, qb.encode(qb.search_body(points))


def pushed_down(*collections: str) -> RequestRewrite:
    return RequestRewrite(b"{}", (), tenant_filter=True, overfetched=False, collections=collections)


def test_a_decided_response_counts_every_reason_under_its_collection(
    counted: tuple[ResponseFilter, GateMetrics],
) -> None:
    response_filter, metrics = counted
    run(response_filter, *qdrant_search("sops"), None)
    labels = {"format": "qdrant", "collection": "sops"}
    reasons = "retrieval_gate_chunk_reasons_total"
    assert sample(metrics, reasons, reason="STATUS_SUPERSEDED", **labels) == 1
    # Not the primary reason, counted all the same: this is what drift alerts read.
    assert sample(metrics, reasons, reason="HASH_MISMATCH", **labels) == 1
    assert sample(metrics, reasons, reason="TENANT_MISMATCH", **labels) == 1
    chunks = "retrieval_gate_chunks_total"
    assert sample(metrics, chunks, decision="rejected", reason="STATUS_SUPERSEDED", **labels) == 1
    assert sample(metrics, chunks, decision="rejected", reason="HASH_MISMATCH", **labels) is None
    assert sample(metrics, chunks, decision="admitted", reason="NONE", **labels) == 1
    responses = "retrieval_gate_responses_total"
    assert sample(metrics, responses, outcome="filtered", **labels) == 1
    # Without push-down another tenant's chunk is the database doing as asked.
    assert sample(metrics, "retrieval_gate_pushdown_tenant_mismatches_total", **labels) is None


def test_another_tenants_chunk_after_push_down_is_counted_as_a_leak(
    counted: tuple[ResponseFilter, GateMetrics],
) -> None:
    response_filter, metrics = counted
    route, body = qdrant_search("payroll")
    run(response_filter, route, body, pushed_down())
    leaks = "retrieval_gate_pushdown_tenant_mismatches_total"
    assert sample(metrics, leaks, format="qdrant", collection="other") == 1
    # A body naming a second collection makes the response's label "other" too.
    run(response_filter, *qdrant_search("sops"), pushed_down("hr"))
    assert sample(metrics, leaks, format="qdrant", collection="other") == 2
    assert sample(metrics, leaks, format="qdrant", collection="sops") is None


def test_a_collection_named_only_in_the_body_labels_the_response(
    counted: tuple[ResponseFilter, GateMetrics],
) -> None:
    # Milvus names the collection in the body (collectionName), never in the path.
    response_filter, metrics = counted
    body = mb.encode(mb.search_body([[mb.row(1, text_for("1"), distance=0.1)]]))
    run(response_filter, mb.route("search"), body, pushed_down("sops"))
    run(response_filter, mb.route("search"), body, None)
    responses = "retrieval_gate_responses_total"
    assert sample(metrics, responses, outcome="filtered", format="milvus", collection="sops") == 1
    assert sample(metrics, responses, outcome="filtered", format="milvus", collection="none") == 1


def test_a_decided_response_never_labels_a_chunk_id_or_text(
    counted: tuple[ResponseFilter, GateMetrics],
) -> None:
    response_filter, metrics = counted
    run(response_filter, *qdrant_search("sops"), pushed_down())
    exported = orjson.dumps(
        [s.labels for family in metrics.registry.collect() for s in family.samples]
    )
    assert b"edited in the index" not in exported
    assert b"acme" not in exported and b"globex" not in exported
