"""The Grafana dashboard (deploy/grafana/) is generated, and every panel query works.

The committed JSON is what the generator prints, byte for byte. Every panel's
PromQL, with the template variables set to "All", is run against a real
Prometheus (Debian ``prometheus``, started by tests/fixtures/prometheus.py)
scraping a real gate (two workers) behind a real Envoy that has served a
scenario with every drift reason and every refusal cause: each must parse and
return series.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from deploy.grafana import dashboard
from sidecar.core.integrity import canonical_sha256
from sidecar.demo.upstream import CannedResponse
from sidecar.metrics import GateMetrics
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.grafana import (
    _VARIABLE,
    COMMITTED,
    GENERATOR,
    Target,
    as_sent,
    committed,
    panels,
    targets,
)
from tests.fixtures.harness import GateStack
from tests.fixtures.prometheus import Prometheus, require_prometheus
from tests.fixtures.records import record_dict, text_for


def test_committed_json_is_what_the_generator_prints() -> None:
    printed = subprocess.run(
        [sys.executable, str(GENERATOR)], capture_output=True, check=True, timeout=60
    ).stdout
    assert printed == COMMITTED.read_bytes(), (
        "deploy/grafana/retrieval-gate.json is stale: run "
        "`python deploy/grafana/dashboard.py > deploy/grafana/retrieval-gate.json`"
    )
    assert dashboard.render().encode() == printed


# Grafana's own variables; anything else after a $ must be one of the dashboard's.
_BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range"}

_UNSCOPED = re.compile(r'\bretrieval_gate_\w+(?!\w|\{job=~"\$job")')


def test_every_query_uses_defined_variables_and_the_chosen_data_source() -> None:
    board = committed()
    defined = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "job", "format", "collection"} <= defined
    for target in targets(board):
        used = set(_VARIABLE.findall(target.expr)) - _BUILTIN_VARIABLES
        assert used <= defined, f"{target}: undefined {used - defined}"
        # Each deployment on its own when a job is chosen: no selector escapes it.
        unscoped = _UNSCOPED.findall(target.expr)
        assert not unscoped, f"{target}: {unscoped} not limited to $job"
    for panel in panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for query in panel["targets"]:
            assert query["datasource"] == panel["datasource"]


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    board = committed()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def test_every_gate_metric_has_a_panel() -> None:
    # A metric added to sidecar/metrics.py without a panel fails here.
    queried = {name for t in targets(committed()) for name in _NAME.findall(t.expr)}
    suffix = {"counter": "_total", "histogram": "_bucket", "gauge": ""}
    exported = [m.name + suffix[m.type] for m in GateMetrics().registry.collect()]
    assert exported
    assert [name for name in exported if name not in queried] == []


# The drift scenario: what the fixture upstream (a fake Qdrant) returns per
# collection, and what the store knows. Every panel's filter is met by some hit.
PAST = "2025-06-01T00:00:00Z"
RECORDS = [
    record_dict("ok"),
    # Holds its text: the mismatch gets a drift class (replacement).
    record_dict(
        "tampered", sha256=canonical_sha256("the text as ingested"), text="the text as ingested"
    ),
    record_dict("old", doc_id="SOP", status="superseded", superseded_by="new"),
    record_dict("new", doc_id="SOP", version="2"),
    record_dict("revoked", status="revoked"),
    record_dict("expired", expires_at=PAST),
    record_dict("foreign", tenant_id="globex"),
]
# "unknown" has no record: MISSING_METADATA.
DRIFTED = ["ok", "tampered", "old", "revoked", "expired", "foreign", "unknown"]
MAX_HITS = 10
# Searched last, once the store is broken: its chunk is refused METADATA_UNAVAILABLE.
OUTAGE = "outage"
SCENARIO: dict[str, tuple[list[str], int]] = {
    # collection: (chunk ids the index returns, upstream status)
    "docs": (DRIFTED, 200),  # filtered, every drift reason
    "sops": (["old", "ok"], 200),  # superseded chunk substituted
    "strict": (["ok", "tampered"], 200),  # blocked
    "archive": (["revoked", "expired"], 200),  # abstained; not allowlisted: "other"
    "broken": ([], 500),  # upstream_error
    "huge": (["ok"] * (MAX_HITS + 1), 200),  # error: over max_hits
}
CONFIG = {
    "id_field": "chunk_id",
    "max_hits": MAX_HITS,
    # Two workers: the parent's /metrics aggregates them (multiprocess mode).
    "workers": 2,
    "metric_collections": ["docs", "sops", "strict", "broken", "huge", OUTAGE],
    "routes": {
        "/collections/sops/": {"substitute_superseded": True},
        "/collections/strict/": {"mode": "strict"},
    },
}


def hit_body(chunk_ids: list[str]) -> bytes:
    points = [
        qb.point(n, text_for(chunk_id), chunk_id=chunk_id, tenant="acme")
        for n, chunk_id in enumerate(chunk_ids, start=1)
    ]
    return qb.encode(qb.search_body(points))


def drive(stack: GateStack) -> None:
    """One search on every collection of the scenario."""
    for collection in SCENARIO:
        stack.search(f"/collections/{collection}/points/search")


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    """A gate behind Envoy that has answered every collection of the scenario once."""
    stack = GateStack(tmp_path_factory.mktemp("grafana-gate"), RECORDS, config=CONFIG).start()
    try:
        for collection, (chunk_ids, status) in SCENARIO.items():
            body = hit_body(chunk_ids) if status == 200 else b'{"status":{"error":"down"}}'
            path = f"/collections/{collection}/points/search"
            stack.upstream.respond("POST", path, CannedResponse(body, status=status))
        drive(stack)
        yield stack
    finally:
        stack.stop()


def break_the_store(stack: GateStack) -> None:
    """Take the store's table away and search a chunk no cache holds: the lookup fails.

    A real failure of the real store (SQLite answers "no such table"), so the
    fail-closed counters move as in an outage.
    """
    store = sqlite3.connect(stack.workdir / "gate.db")
    with store:
        store.execute("ALTER TABLE chunks RENAME TO chunks_gone")
    store.close()
    path = f"/collections/{OUTAGE}/points/search"
    stack.upstream.respond("POST", path, CannedResponse(hit_body(["never-looked-up"])))
    stack.search(path)


@pytest.fixture(scope="module")
def prometheus(gate: GateStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Prometheus scraping ``gate``, which serves the scenario again once scraped.

    The second round makes every rate positive: the first round's counters
    were born before the first scrape, so Prometheus saw them only at their total.
    The last search finds the store broken.
    """
    workdir = tmp_path_factory.mktemp("grafana-prometheus")
    jobs = {"gate": [f"127.0.0.1:{gate.metrics_port}"]}
    server = Prometheus(workdir, jobs, executable=require_prometheus()).start()
    try:
        server.wait_for(
            "the first scrape of the gate",
            lambda: server.query("retrieval_gate_chunks_total"),
            ANSWER_TIMEOUT,
        )
        drive(gate)
        served = responses_served(gate)

        def caught_up() -> bool:
            # Every response so far is in Prometheus, not some of them.
            return server.value("sum(retrieval_gate_responses_total)") == served

        server.wait_for("the second round in Prometheus", caught_up, ANSWER_TIMEOUT)
        break_the_store(gate)
        served = responses_served(gate)
        server.wait_for("the outage in Prometheus", caught_up, ANSWER_TIMEOUT)
        yield server
    finally:
        server.stop()


def responses_served(stack: GateStack) -> float:
    """``retrieval_gate_responses_total`` on the gate's /metrics, all series added up."""
    return sum(
        value
        for sample, value in stack.metrics().items()
        if sample.startswith("retrieval_gate_responses_total{")
    )


# Panel queries whose series this scenario (one gate, scraped alone) does not
# produce: they must parse here; tests/envoy/test_alerting_end_to_end.py runs
# them where their series exist (the gates' Envoys, the database's proxy as
# Istio's stand-in).
ELSEWHERE = {
    ("Envoy ext_proc failures", "A"),
    ("Envoy ext_proc failures", "B"),
    ("Envoy ext_proc failures", "C"),
    ("Gated listener answers by class", "A"),
    ("Bypass: database requests vs gate requests", "A"),
}
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
# Series appear a scrape or two after the traffic; rates need two samples.
ANSWER_TIMEOUT = 45.0


def instant_results(prometheus: Prometheus, wanted: list[Target]) -> dict[Target, list[Any]]:
    """Each target's instant-query result, polled until every one has series or time is up.

    A query Prometheus cannot parse or evaluate fails at once, naming the panel.
    """
    results: dict[Target, list[Any]] = {}
    deadline = time.monotonic() + ANSWER_TIMEOUT
    while True:
        for target in wanted:
            if target in results:
                continue
            try:
                series = prometheus.query(as_sent(target.expr))
            except AssertionError as error:
                pytest.fail(f"{target}: Prometheus refused the query: {error}")
            if series:
                results[target] = series
        if len(results) == len(wanted) or time.monotonic() > deadline:
            return results
        time.sleep(0.5)


# Label values some panels must show moving (rate above 0) in the scenario: the
# per-collection attribution and the causes the panels are there to tell apart.
# Not just present: the gate presets some of these series at 0.
EXPECTED_ACTIVE: dict[tuple[str, str], tuple[str, set[str]]] = {
    ("Responses by outcome", "A"): (
        "outcome",
        {"filtered", "abstained", "blocked", "error", "upstream_error"},
    ),
    ("Refusals by cause", "A"): ("outcome", {"error", "upstream_error", "blocked"}),
    ("Fail-closed errors", "C"): ("collection", {OUTAGE}),
    ("Hash mismatches", "A"): ("collection", {"docs", "strict"}),
    ("Hash mismatches by drift class", "A"): ("kind", {"replacement"}),
    ("Missing metadata", "A"): ("collection", {"docs"}),
    ("Cross-tenant hits", "A"): ("collection", {"docs"}),
    ("Stale retrieval", "A"): ("reason", {"STATUS_SUPERSEDED", "STATUS_REVOKED", "EXPIRED"}),
    ("Revoked chunks still retrieved", "A"): ("collection", {"docs", "other"}),
}


@pytest.mark.envoy
@pytest.mark.prometheus
def test_every_panel_query_parses_and_returns_series(prometheus: Prometheus) -> None:
    every = targets(committed())
    wanted = [t for t in every if (t.panel, t.ref_id) not in ELSEWHERE]
    for target in every:
        if target not in wanted:
            prometheus.query(as_sent(target.expr))  # parses and evaluates, series or not
    assert len(every) - len(wanted) == len(ELSEWHERE)
    results = instant_results(prometheus, wanted)
    empty = [str(t) for t in wanted if t not in results]
    assert not empty, f"no series for: {empty}"
    for target, series in results.items():
        for label in _LEGEND_LABEL.findall(target.legend):
            assert all(label in s["metric"] for s in series), f"{target}: no {label} label"
    for (panel, ref_id), (label, values) in EXPECTED_ACTIVE.items():
        target = next(t for t in results if (t.panel, t.ref_id) == (panel, ref_id))
        moving = {s["metric"][label] for s in results[target] if float(s["value"][1]) > 0}
        assert values <= moving, f"{target}: {label} {values - moving} not above 0"
    admitted = next(t for t in results if t.panel == "Admitted ratio per collection")
    ratios = {s["metric"]["collection"]: float(s["value"][1]) for s in results[admitted]}
    # "other" (archive) admits nothing: it shows as 0, not as a missing line.
    assert ratios["other"] == 0
    assert 0 < ratios["docs"] < 1
    assert ratios["sops"] > 0


@pytest.mark.envoy
@pytest.mark.prometheus
def test_template_variables_offer_the_scenario_values(prometheus: Prometheus) -> None:
    variables = {v["name"]: v for v in committed()["templating"]["list"]}
    expected = {"job": {"gate"}, "format": {"qdrant"}, "collection": {"docs", "sops", "other"}}
    for name, values in expected.items():
        query = re.fullmatch(r"label_values\((\w+), (\w+)\)", variables[name]["query"])
        assert query is not None, variables[name]["query"]
        metric, label = query.groups()
        assert label == name
        offered = prometheus.api(f"label/{label}/values", **{"match[]": metric})
        assert values <= set(offered), offered
