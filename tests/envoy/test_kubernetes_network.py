"""Who may reach what in the rendered overlays: NetworkPolicies, Istio's mTLS and
authorization, the database credential's Secret, Envoy's stats listener.

Rendered with `kubectl kustomize` and checked with `kubernetes-validate
--strict`, as tests/envoy/test_kubernetes.py does (its helpers). That a
network plugin enforces these policies, and that istiod applies the Istio
objects, cannot be checked here: no cluster runs on these machines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.envoy_configs import cluster, listener, yaml_documents
from tests.fixtures.kubernetes import (
    ENVOY,
    GATE,
    ISTIO_OVERLAYS,
    KUBERNETES_VERSIONS,
    OVERLAYS,
    config_file,
    container,
    gated_deployment,
    kubernetes_validate,
    matches,
    objects,
    pod_labels,
    pod_settings,
    pod_spec,
)

MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
GRPC_PORT = 6334  # the database's gRPC port (Qdrant, the example)
GATE_METRICS = 9464
ENVOY_STATS = 9902


def gateway_envoy() -> dict[str, Any]:
    (config,) = yaml_documents(config_file("gateway", "retrieval-gate-envoy", "envoy.yaml"))
    found: dict[str, Any] = config
    return found


def endpoint_port(cluster_config: dict[str, Any]) -> int:
    (endpoint,) = cluster_config["load_assignment"]["endpoints"][0]["lb_endpoints"]
    port: int = endpoint["endpoint"]["address"]["socket_address"]["port_value"]
    return port


def policy_for(overlay: str, *, gated: bool) -> dict[str, Any]:
    """The one NetworkPolicy that selects the gated pods (or the one that does not)."""
    (found,) = [
        p
        for p in objects(overlay, "NetworkPolicy")
        if matches(p["spec"]["podSelector"]["matchLabels"], pod_labels(overlay)) == gated
    ]
    return found


def admitted(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Port -> the peers admitted to it, over every ingress rule."""
    peers: dict[int, list[dict[str, Any]]] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            peers.setdefault(port["port"], []).extend(rule["from"])
    return peers


def container_ports(overlay: str, name: str) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container(overlay, name).get("ports", [])}


# --- The gateway overlay -------------------------------------------------------------------------


def test_the_database_admits_rest_and_grpc_from_the_gate_alone() -> None:
    config = gateway_envoy()
    rest = endpoint_port(cluster(config, "vector_db"))
    grpc = endpoint_port(cluster(config, "vector_db_grpc"))
    assert grpc == GRPC_PORT
    peers = admitted(policy_for("gateway", gated=False))
    # Without the gRPC port every gRPC call through the gate is a 503 where the
    # plugin enforces the policy.
    assert set(peers) == {rest, grpc}
    for port in (rest, grpc):
        (peer,) = peers[port]
        assert set(peer) == {"podSelector"}
        assert matches(peer["podSelector"]["matchLabels"], pod_labels("gateway"))


def test_the_metrics_ports_admit_the_monitoring_namespace_alone() -> None:
    peers = admitted(policy_for("gateway", gated=True))
    assert container_ports("gateway", GATE)["gate-metrics"] == GATE_METRICS
    assert container_ports("gateway", ENVOY)["envoy-stats"] == ENVOY_STATS
    for port in (GATE_METRICS, ENVOY_STATS):
        assert peers[port] == [MONITORING], port
    client_port = listener(gateway_envoy())["address"]["socket_address"]["port_value"]
    assert set(peers) == {client_port, GATE_METRICS, ENVOY_STATS}


def test_envoy_stats_serves_only_prometheus_from_the_loopback_admin() -> None:
    config = gateway_envoy()
    admin = config["admin"]["address"]["socket_address"]
    assert admin["address"] == "127.0.0.1"
    stats = listener(config, "envoy_stats")
    assert stats["address"]["socket_address"]["port_value"] == ENVOY_STATS
    assert stats["ignore_global_conn_limit"] is True  # scraped under overload too
    (chain,) = stats["filter_chains"]
    (hcm,) = chain["filters"]
    (host,) = hcm["typed_config"]["route_config"]["virtual_hosts"]
    forwarded = [r for r in host["routes"] if "route" in r]
    (route,) = forwarded
    assert route["match"]["path"] == "/stats/prometheus"
    assert route["match"]["headers"] == [{"name": ":method", "string_match": {"exact": "GET"}}]
    assert endpoint_port(cluster(config, route["route"]["cluster"])) == admin["port_value"]
    assert [r["direct_response"]["status"] for r in host["routes"] if "route" not in r] == [404]


def test_the_jwks_relay_is_not_on_a_port_envoy_listens_on(tmp_path: Path) -> None:
    relay = pod_settings("gateway", tmp_path).identity.jwks_relay
    relay_port = int(relay.rsplit(":", 1)[1])
    listening = {
        item["address"]["socket_address"]["port_value"]
        for item in gateway_envoy()["static_resources"]["listeners"]
    }
    assert relay_port not in listening | {
        gateway_envoy()["admin"]["address"]["socket_address"]["port_value"]
    }
    assert endpoint_port(cluster(gateway_envoy(), "jwks_relay")) == relay_port


def test_only_envoy_mounts_the_database_credential() -> None:
    (secret,) = gateway_envoy()["static_resources"]["secrets"]
    path = Path(secret["generic_secret"]["secret"]["filename"])
    volumes = {v["name"]: v for v in pod_spec("gateway")["volumes"]}
    (mount,) = [
        m
        for m in container("gateway", ENVOY)["volumeMounts"]
        if path.parent == Path(m["mountPath"])
    ]
    assert mount["readOnly"] is True
    source = volumes[mount["name"]]["secret"]
    assert source.get("optional", False) is False  # no credential, no pod
    assert [item["path"] for item in source["items"]] == [path.name]
    gate_mounts = {m["name"] for m in container("gateway", GATE)["volumeMounts"]}
    assert mount["name"] not in gate_mounts


# --- The Istio overlays --------------------------------------------------------------------------


def service_ports(overlay: str) -> set[int]:
    """The ports of the database's Service (its API)."""
    (service,) = [
        s
        for s in objects(overlay, "Service")
        if matches(s["spec"]["selector"], pod_labels(overlay))
    ]
    return {p["port"] for p in service["spec"]["ports"]}


def excluded_ports(overlay: str) -> set[int]:
    """The ports the pod excludes from istio-proxy's inbound capture."""
    annotations = gated_deployment(overlay)["spec"]["template"]["metadata"]["annotations"]
    text: str = annotations["traffic.sidecar.istio.io/excludeInboundPorts"]
    return {int(port) for port in text.split(",")}


@pytest.mark.parametrize("overlay", ISTIO_OVERLAYS)
def test_the_database_pod_admits_the_api_ports_and_metrics_from_monitoring(overlay: str) -> None:
    assert service_ports(overlay) == {6333, GRPC_PORT}
    assert excluded_ports(overlay) == {GATE_METRICS}
    peers = admitted(policy_for(overlay, gated=True))
    for port in service_ports(overlay):
        assert peers[port] == [{"namespaceSelector": {}}], port
    # What passes no Istio policy, and Istio's own telemetry: monitoring alone.
    outside = set(peers) - service_ports(overlay)
    assert excluded_ports(overlay) <= outside
    for port in outside:
        assert peers[port] == [MONITORING], port


@pytest.mark.parametrize("overlay", ISTIO_OVERLAYS)
def test_only_mutual_tls_reaches_the_database(overlay: str) -> None:
    (peer_authentication,) = objects(overlay, "PeerAuthentication")
    assert matches(peer_authentication["spec"]["selector"]["matchLabels"], pod_labels(overlay))
    assert peer_authentication["spec"]["mtls"] == {"mode": "STRICT"}
    assert "portLevelMtls" not in peer_authentication["spec"]


@pytest.mark.parametrize("overlay", ISTIO_OVERLAYS)
def test_the_api_ports_admit_only_mesh_identities(overlay: str) -> None:
    (policy,) = [
        p for p in objects(overlay, "AuthorizationPolicy") if p["spec"]["action"] == "ALLOW"
    ]
    assert matches(policy["spec"]["selector"]["matchLabels"], pod_labels(overlay))
    (rule,) = policy["spec"]["rules"]
    (source,) = rule["from"]
    assert source["source"]["principals"]  # a verified peer identity: mutual TLS
    (operation,) = rule["to"]
    assert {int(p) for p in operation["operation"]["ports"]} == service_ports(overlay)


@pytest.mark.parametrize("overlay", ISTIO_OVERLAYS)
def test_injection_is_enforced_on_the_database_pod(overlay: str) -> None:
    assert pod_labels(overlay)["sidecar.istio.io/inject"] == "true"


# --- kubernetes-validate -------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_network_policies_pass_kubernetes_validate_strict(
    overlay: str, version: str, tmp_path: Path
) -> None:
    policies = objects(overlay, "NetworkPolicy")
    assert policies
    done = kubernetes_validate(policies, version, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    passed = [line for line in done.stdout.splitlines() if " passed for resource " in line]
    assert len(passed) == len(policies), done.stdout
