"""The project's alert rules in a real Prometheus, scraping real gates.

The Debian ``prometheus`` server scrapes a clean gate and a drifting one
(``workers = 2``: the parent's multiprocess aggregation is what Prometheus
sees) and evaluates deploy/prometheus in its fast copy (every duration / 60,
tests/fixtures/prometheus.py). The drift raises exactly its alerts, labelled
with the collection and format; the clean gate raises none, not even pending.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.runtime.workers import worker_audit_log
from tests.fixtures.prometheus import (  # noqa: F401
    DRIFT_ALERTS,
    OTHER_SEARCHES,
    ScrapedGates,
    fast_rules,
    scaled,
    scraped_gates_fixture,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.envoy]

# Longer than any alert's `for:` in the fast copy (10m -> 10 s), plus the
# 5 s windows filling and an evaluation or two.
FIRING_TIMEOUT = 40.0


def firing(scraped: ScrapedGates, job: str) -> dict[str, dict[str, Any]]:
    """Alert name -> labels of the alerts firing now for ``job``."""
    return {
        alert["labels"]["alertname"]: alert["labels"]
        for alert in scraped.prometheus.alerts()
        if alert["labels"].get("job") == job and alert["state"] == "firing"
    }


def test_the_drift_raises_its_alerts_and_no_other(scraped_gates: ScrapedGates) -> None:
    prometheus = scraped_gates.prometheus
    groups = prometheus.rule_groups()
    assert {group["name"] for group in groups} >= {"retrieval-gate.rules", "retrieval-gate.drift"}
    for group in groups:
        for rule in group["rules"]:
            assert rule["health"] != "err", rule  # every expression evaluates

    seen: dict[str, dict[str, Any]] = {}

    def all_firing() -> bool:
        seen.clear()
        seen.update(firing(scraped_gates, "drift"))
        return set(seen) >= DRIFT_ALERTS

    prometheus.wait_for(f"{sorted(DRIFT_ALERTS)} to fire", all_firing, FIRING_TIMEOUT)
    assert set(seen) == DRIFT_ALERTS
    for name, labels in seen.items():
        # Which collection (by its allowlisted name) and which format drifted.
        assert (labels["collection"], labels["format"]) == ("sops", "qdrant"), name
    assert seen["RetrievalGateHashMismatch"]["reason"] == "HASH_MISMATCH"
    assert seen["RetrievalGateMissingMetadata"]["reason"] == "MISSING_METADATA"
    # Not even pending, at any time: ALERTS keeps each evaluation's state.
    others = "|".join(sorted(DRIFT_ALERTS))
    unexpected = f'count_over_time(ALERTS{{job="drift",alertname!~"{others}"}}[10m])'
    assert prometheus.query(unexpected) == []
    # The hr searches (label "other") were all clean: nothing fired for them.
    assert prometheus.query('count_over_time(ALERTS{job="drift",collection!="sops"}[10m])') == []
    assert scraped_gates.traffic.failures == []


def test_a_clean_gate_raises_nothing(scraped_gates: ScrapedGates) -> None:
    prometheus = scraped_gates.prometheus
    # Its answers were scraped and its series evaluated by the rules ...
    decided = prometheus.value('sum(retrieval_gate:chunks:rate5m{job="clean"})')
    assert decided is not None and decided > 0
    ratio = 'retrieval_gate:abstained_responses:ratio_rate5m{job="clean",collection="other"}'
    assert prometheus.value(ratio) == 0
    # ... and no alert was ever pending or firing for it.
    assert prometheus.query('count_over_time(ALERTS{job="clean"}[10m])') == []


def test_the_workers_counters_add_up_in_prometheus(scraped_gates: ScrapedGates) -> None:
    prometheus = scraped_gates.prometheus
    # Exactly OTHER_SEARCHES hr searches, answered by two worker processes.
    other = '{job="drift",collection="other",format="qdrant"}'
    series = prometheus.query(f"retrieval_gate_responses_total{other}")
    assert [s["metric"]["outcome"] for s in series] == ["filtered"]
    assert "pid" not in series[0]["metric"]  # one series for the pool, not one per worker
    assert float(series[0]["value"][1]) == OTHER_SEARCHES
    admitted = prometheus.value(f'retrieval_gate_chunks_total{{decision="admitted",{other[1:]}')
    assert admitted == 2 * OTHER_SEARCHES
    audit = scraped_gates.drift.audit_log
    assert all(worker_audit_log(audit, index, 2).exists() for index in range(2))
    # The series the one-off alerts wait for were there before anything happened.
    preset = prometheus.query(
        'retrieval_gate_chunk_reasons_total{job="drift",collection="other",'
        'format="qdrant",reason="METADATA_UNAVAILABLE"}'
    )
    assert [float(s["value"][1]) for s in preset] == [0.0]


def test_the_fast_copy_divides_every_duration(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n- name: g\n  interval: 1m\n  rules:\n"
        "  - alert: A\n    expr: rate(x[5m] offset 1h) > rate(x[1d])\n    for: 15m\n"
    )
    text = fast_rules(rules, tmp_path / "fast.yaml").read_text()
    assert "rate(x[5s] offset 60s) > rate(x[1440s])" in text
    assert "for: 15s" in text and "interval: 1s" in text
    # A duration that would not be whole seconds is refused, never rounded to 0.
    with pytest.raises(ValueError):
        scaled("30s")
