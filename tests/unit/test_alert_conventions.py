"""The conventions of deploy/prometheus and the dashboard that promtool does not check.

Every alert has a ``runbook_url`` to its own section of docs/alerts.md (which
exists, and lists the alert); aggregations keep ``cluster`` and every other
target label (``without (instance, pod)``, never ``by`` a fixed list, but for
the bypass detector's two sides, which share only ``cluster``); the
tampering and cross-tenant alerts keep firing after their window; the
dashboard filters by cluster and namespace and shows the alerts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS_DOC = ROOT / "docs" / "alerts.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "retrieval-gate.json"
RUNBOOK_BASE = "https://git.example.com/retrieval-gate/blob/main/docs/alerts.md#"
KEEP_FIRING = {
    "RetrievalGateHashMismatch",
    "RetrievalGateIndexTampering",
    "RetrievalGateCrossTenantHitsWithPushDown",
}
# Sums of series from different targets (the database's proxy, the gate):
# they share no label but the cluster.
BY_CLUSTER = {"retrieval_gate:database_requests:rate5m", "retrieval_gate:gate_requests:rate5m"}
_AGGREGATION = re.compile(r"\b(sum|min|max|count|avg|group)\s+(by|without)\s*\(([^)]*)\)")


def rules(name: str) -> list[dict[str, Any]]:
    document = yaml.safe_load((PROMETHEUS / name).read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules("prometheus_alerts.yaml")}


def test_every_alert_links_its_own_section_of_the_docs() -> None:
    doc = ALERTS_DOC.read_text(encoding="utf-8")
    headings = set(re.findall(r"^### (\w+)$", doc, flags=re.M))
    for name, rule in alerts().items():
        assert rule["annotations"]["runbook_url"] == RUNBOOK_BASE + name.lower(), name
        assert name in headings, f"docs/alerts.md has no section {name}"
        assert f"| [`{name}`](#{name.lower()}) |" in doc, f"{name} is not in the table"
    assert headings == set(alerts())


def test_aggregations_keep_cluster_and_the_other_target_labels() -> None:
    for rule in [*rules("prometheus_rules.yaml"), *rules("prometheus_alerts.yaml")]:
        name = rule.get("record") or rule["alert"]
        for _, kind, labels in _AGGREGATION.findall(rule["expr"]):
            if name in BY_CLUSTER:
                assert (kind, labels) == ("by", "cluster"), name
            else:
                assert kind == "without", f"{name}: {kind} ({labels}) drops target labels"
        # A bare sum() (no grouping) would drop every label.
        assert not re.search(r"\b(sum|max|min|count)\s*\(", rule["expr"]), name


def test_tampering_and_cross_tenant_alerts_keep_firing() -> None:
    for name, rule in alerts().items():
        if name in KEEP_FIRING:
            assert rule["keep_firing_for"] == "1h", name
        else:
            assert "keep_firing_for" not in rule, name


def test_the_dashboard_filters_by_cluster_and_namespace_and_shows_the_alerts() -> None:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    names = [v["name"] for v in board["templating"]["list"]]
    assert {"cluster", "namespace", "job", "envoy_job", "database"} <= set(names)
    (annotation,) = board["annotations"]["list"]
    assert annotation["expr"].startswith('ALERTS{alertname=~"RetrievalGate.*"')
    assert 'alertstate="firing"' in annotation["expr"]
    assert annotation["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    exprs = [
        t["expr"]
        for panel in board["panels"]
        for t in panel.get("targets", [])
        if "retrieval_gate_" in t["expr"]
    ]
    assert exprs
    for expr in exprs:
        assert 'cluster=~"$cluster"' in expr and 'namespace=~"$namespace"' in expr, expr
