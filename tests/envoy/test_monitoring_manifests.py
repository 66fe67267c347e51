"""Scrape configuration for the gate (deploy/kubernetes/components/monitoring, scrape-annotations).

Each overlay is rendered with the monitoring component added (as a user adds
it to their overlay's ``components:``) by `kubectl kustomize`, and the result
checked with `kubernetes-validate --strict` (the PodMonitor is a CRD: it only
warns). The PodMonitor must select the gated pods, name ports those pods
declare, and name its jobs as the shipped rules select them; the Istio
overlays scrape the gate by annotation, on the port istio-proxy leaves alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.envoy_configs import yaml_documents
from tests.fixtures.servers import server_missing

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
MONITORING = KUBERNETES / "components" / "monitoring"
ALERTS = ROOT / "deploy" / "prometheus" / "prometheus_alerts.yaml"
RULES = ROOT / "deploy" / "prometheus" / "prometheus_rules.yaml"
OVERLAYS = ("gateway", "istio", "istio-ext-authz")
ISTIO_OVERLAYS = ("istio", "istio-ext-authz")
UNCHECKED_KINDS = {
    "PodMonitor",
    "EnvoyFilter",
    "RequestAuthentication",
    "AuthorizationPolicy",
    "ServiceEntry",
    "PeerAuthentication",
}
GATE = "retrieval-gate"  # the gate's container
GATE_JOB = "retrieval-gate"
ENVOY_JOB = "retrieval-gate-envoy"
# The contract with the gateway overlay's Envoy (issue 25): a listener that
# serves only /stats/prometheus, on this port, under this name.
ENVOY_STATS = ("envoy-stats", 9902)


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        server_missing("kubectl is not installed: `kubectl kustomize` renders the manifests")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return yaml_documents(done.stdout)


def with_monitoring(overlay: str, tmp_path: Path) -> list[dict[str, Any]]:
    """``overlay`` rendered with the monitoring component added, as a user's overlay would."""
    here = tmp_path / f"with-monitoring-{overlay}"
    here.mkdir()
    # kustomize takes relative paths only.
    (here / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources:\n- {os.path.relpath(KUBERNETES / 'overlays' / overlay, here)}\n"
        f"components:\n- {os.path.relpath(MONITORING, here)}\n"
    )
    return kustomize(here)


def gated_deployment(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [
        d
        for d in documents
        if d["kind"] == "Deployment"
        and any(c["name"] == GATE for c in d["spec"]["template"]["spec"].get("initContainers", []))
    ]
    return found


def declared_ports(deployment: dict[str, Any]) -> dict[str, int]:
    """Port name -> containerPort over every container of the pod."""
    spec = deployment["spec"]["template"]["spec"]
    return {
        port["name"]: port["containerPort"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]
        for port in container.get("ports", [])
        if "name" in port
    }


def pod_monitor(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == "PodMonitor"]
    return found


def endpoint(monitor: dict[str, Any], port: str) -> dict[str, Any]:
    endpoints: list[dict[str, Any]] = monitor["spec"]["podMetricsEndpoints"]
    (found,) = [e for e in endpoints if e["port"] == port]
    return found


def job_of(endpoint: dict[str, Any]) -> str:
    (relabel,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    assert relabel.get("action", "replace") == "replace"
    replacement: str = relabel["replacement"]
    return replacement


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_monitor_selects_the_gated_pods(overlay: str, tmp_path: Path) -> None:
    documents = with_monitoring(overlay, tmp_path)
    monitor = pod_monitor(documents)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    pod = gated_deployment(documents)["spec"]["template"]["metadata"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["labels"].items()
    # The other Deployments' pods (none in the shipped overlays) are not scraped as gates.
    for other in documents:
        if other["kind"] == "Deployment" and other is not gated_deployment(documents):
            assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gate_endpoint_names_the_gates_metrics_port(overlay: str, tmp_path: Path) -> None:
    documents = with_monitoring(overlay, tmp_path)
    deployment = gated_deployment(documents)
    ports = declared_ports(deployment)
    gate = endpoint(pod_monitor(documents), "gate-metrics")
    assert ports["gate-metrics"] == 9464
    assert gate["path"] == "/metrics"
    # The gate serves its metrics on that port, on every interface of the pod.
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["initContainers"] if c["name"] == GATE
    ]
    assert "--metrics=0.0.0.0:9464" in container["args"]


def test_the_envoy_endpoint_names_the_gateway_envoys_stats_port(tmp_path: Path) -> None:
    documents = with_monitoring("gateway", tmp_path)
    stats = endpoint(pod_monitor(documents), ENVOY_STATS[0])
    assert stats["path"] == "/stats/prometheus"
    ports = declared_ports(gated_deployment(documents))
    assert ports[ENVOY_STATS[0]] == ENVOY_STATS[1]


def test_the_jobs_are_the_ones_the_rules_select(tmp_path: Path) -> None:
    monitor = pod_monitor(with_monitoring("gateway", tmp_path))
    jobs = {e["port"]: job_of(e) for e in monitor["spec"]["podMetricsEndpoints"]}
    assert jobs == {
        "gate-metrics": GATE_JOB,
        "envoy-stats": ENVOY_JOB,
        "http-envoy-prom": ENVOY_JOB,
    }
    selected = set(
        re.findall(r'job=~?"([^"]+)"', ALERTS.read_text() + RULES.read_text(), flags=re.M)
    )
    assert selected == {GATE_JOB, f"{GATE_JOB}|{ENVOY_JOB}"}


@pytest.mark.parametrize("overlay", ISTIO_OVERLAYS)
def test_istio_overlays_are_scraped_by_annotation_around_istio_proxy(overlay: str) -> None:
    documents = kustomize(KUBERNETES / "overlays" / overlay)
    assert not [d for d in documents if d["kind"] == "PodMonitor"]  # opt-in: needs the CRDs
    annotations = gated_deployment(documents)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9464"
    assert annotations["prometheus.io/path"] == "/metrics"
    # The target is the gate itself, not Istio's agent merging it with istio-proxy's.
    assert annotations["prometheus.istio.io/merge-metrics"] == "false"
    # The port Prometheus scrapes does not pass istio-proxy (nor the gate).
    excluded = annotations["traffic.sidecar.istio.io/excludeInboundPorts"].split(",")
    assert "9464" in excluded


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_with_monitoring_pass_kubernetes_validate_strict(
    overlay: str, tmp_path: Path
) -> None:
    executable = Path(sys.executable).parent / "kubernetes-validate"
    if not executable.exists():
        server_missing("kubernetes-validate is not installed (pip install -e '.[test]')")
    documents = with_monitoring(overlay, tmp_path)
    path = tmp_path / "rendered.yaml"
    path.write_text("\n---\n".join(json.dumps(d) for d in documents))
    done = subprocess.run(
        [str(executable), "--strict", "--kubernetes-version", "1.37.0", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    core = [d for d in documents if d["kind"] not in UNCHECKED_KINDS]
    passed = [line for line in done.stdout.splitlines() if " passed for resource " in line]
    assert len(passed) == len(core), done.stdout
    # The PodMonitor has no schema here: kubernetes-validate only warns about it.
    unchecked = [line for line in done.stdout.splitlines() if "Couldn't find schema" in line]
    assert len(unchecked) == len(documents) - len(core), done.stdout
