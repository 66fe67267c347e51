"""The Kubernetes manifests (deploy/kubernetes) render, validate, and run the gate as `proxy` does.

Checked with the tools their users have: `kubectl kustomize` renders each
overlay, `kubernetes-validate --strict` checks every core object, and every
Envoy fragment of an EnvoyFilter (which Istio passes on unchecked) is built
into a bootstrap that `envoy --mode validate` must accept. The Envoy
configuration in them is compared with what `retrieval-gate proxy` generates
for the settings the pods run with (one source of truth), and the Istio
overlay's chain runs through a real Envoy. No cluster and no Istio control
plane run here: what Istio would generate is written out as named stand-ins.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.config import ConfigError, IdentityMode, Settings, load_settings
from sidecar.core.caller import IdentityError
from sidecar.demo.upstream import CannedResponse
from sidecar.identity import AuthRequest
from sidecar.identity.envoy_jwt import JWT_AUTHN_NAMESPACE
from sidecar.runtime.envoy_process import find_envoy
from sidecar.runtime.jwt_authn import jwt_authn_filter
from sidecar.runtime.server import build_identity, load_policy_data
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures import tokens
from tests.fixtures.envoy_configs import (
    EXT_AUTHZ,
    EXT_PROC,
    HCM,
    JWT_AUTHN,
    ROUTER,
    SIDECAR_CLUSTER,
    cluster,
    connection_manager,
    connection_manager_filter,
    deep_merge,
    gate_parts,
    generated,
    http_filter,
    listener,
    normalised,
    with_local_secrets,
    yaml_documents,
)
from tests.fixtures.harness import GateStack, HttpResult, search_ids
from tests.fixtures.kubernetes import (
    ENVOY,
    GATE,
    HEALTHCHECK,
    ISTIO_OVERLAYS,
    KUBERNETES,
    KUBERNETES_VERSIONS,
    OVERLAYS,
    ROOT,
    config_file,
    container,
    gated_deployment,
    kubernetes_validate,
    matches,
    objects,
    pod_labels,
    pod_settings,
    pod_spec,
    rendered,
)
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.settings import settings_of

ISTIO_KINDS = {
    *("EnvoyFilter", "RequestAuthentication", "AuthorizationPolicy", "ServiceEntry"),
    "PeerAuthentication",
}

# --- Stand-ins for what Istio generates (no Istio control plane runs here) ----------------------
#
# Istio >= 1.21 builds RequestAuthentication's jwt_authn filter (istio/istio,
# pilot/pkg/security/authn: convertToEnvoyJwtConfig) with the payload under
# this key (the constant EnvoyJwtFilterPayload; before 1.21 the key was the
# issuer), one provider per rule that a missing token passes (allow_missing)
# and an invalid one does not, and, as istiod fetches them by default, its
# keys inline.
ISTIO_PAYLOAD_KEY = "payload"


def istio_jwt_authn(issuer: str, audiences: list[str], jwks: dict[str, Any]) -> dict[str, Any]:
    """Stand-in: the jwt_authn filter Istio generates for one RequestAuthentication rule."""
    return {
        "name": JWT_AUTHN,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3."
            "JwtAuthentication",
            "providers": {
                "origins-0": {
                    "issuer": issuer,
                    "audiences": audiences,
                    "forward": True,  # the overlay's forwardOriginalToken
                    "payload_in_metadata": ISTIO_PAYLOAD_KEY,
                    "local_jwks": {"inline_string": json.dumps(jwks)},
                }
            },
            "rules": [
                {
                    "match": {"prefix": "/"},
                    "requires": {
                        "requires_any": {
                            "requirements": [
                                {"provider_name": "origins-0"},
                                {"allow_missing": {}},
                            ]
                        }
                    },
                }
            ],
            "bypass_cors_preflight": True,
        },
    }


def istio_ext_authz(provider: dict[str, Any]) -> dict[str, Any]:
    """Stand-in: the ext_authz filter Istio generates for an envoyExtAuthzGrpc provider."""
    grpc = provider["envoyExtAuthzGrpc"]
    status = {"503": "ServiceUnavailable", "403": "Forbidden"}[grpc["statusOnError"]]
    return {
        "name": EXT_AUTHZ,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
            "grpc_service": {
                "envoy_grpc": {"cluster_name": f"outbound|{grpc['port']}||{grpc['service']}"},
                "timeout": grpc["timeout"],
            },
            "transport_api_version": "V3",
            "failure_mode_allow": grpc["failOpen"],
            "status_on_error": {"code": status},
        },
    }


# --- Rendering -----------------------------------------------------------------------------------


def envoy_filter_patches(overlay: str) -> list[dict[str, Any]]:
    """Every config patch of every EnvoyFilter, in order."""
    return [p for f in objects(overlay, "EnvoyFilter") for p in f["spec"]["configPatches"]]


def envoy_validate(config: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`envoy --mode validate` on ``config``."""
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(config))
    return subprocess.run(
        [find_envoy(), "--mode", "validate", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_overlay_is_checked() -> None:
    assert {p.name for p in (KUBERNETES / "overlays").iterdir()} == set(OVERLAYS)


@pytest.mark.parametrize(
    ("overlay", "kinds"),
    [
        (
            "gateway",
            {
                "ConfigMap": 2,
                "Deployment": 1,
                "NetworkPolicy": 2,
                "PodDisruptionBudget": 1,
                "Service": 1,
                "ServiceAccount": 1,
            },
        ),
        (
            "istio",
            {
                "AuthorizationPolicy": 1,
                "ConfigMap": 1,
                "Deployment": 1,
                "EnvoyFilter": 1,
                "NetworkPolicy": 1,
                "PeerAuthentication": 1,
                "RequestAuthentication": 1,
                "Service": 1,
            },
        ),
        (
            "istio-ext-authz",
            {
                "AuthorizationPolicy": 2,
                "ConfigMap": 1,
                "Deployment": 1,
                "EnvoyFilter": 2,
                "NetworkPolicy": 1,
                "PeerAuthentication": 1,
                "RequestAuthentication": 1,
                "Service": 1,
                "ServiceEntry": 1,
            },
        ),
    ],
)
def test_overlay_renders_its_objects(overlay: str, kinds: dict[str, int]) -> None:
    found: dict[str, int] = {}
    for item in rendered(overlay):
        found[item["kind"]] = found.get(item["kind"], 0) + 1
    assert found == kinds


# --- kubernetes-validate --strict ----------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_pass_kubernetes_validate_strict(
    overlay: str, version: str, tmp_path: Path
) -> None:
    documents = rendered(overlay)
    done = kubernetes_validate(documents, version, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    core = [d for d in documents if d["kind"] not in ISTIO_KINDS]
    passed = [line for line in done.stdout.splitlines() if " passed for resource " in line]
    assert len(passed) == len(core), done.stdout
    # Istio's kinds have no schema here: kubernetes-validate only warns about them.
    unchecked = [line for line in done.stdout.splitlines() if "Couldn't find schema" in line]
    assert len(unchecked) == len(documents) - len(core), done.stdout


def test_kubernetes_validate_strict_refuses_a_misspelt_field(tmp_path: Path) -> None:
    documents = rendered("gateway")
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["initContainers"][0]["restartPolicyy"] = "Always"
    done = kubernetes_validate(documents, KUBERNETES_VERSIONS[-1], tmp_path)
    assert done.returncode != 0
    assert "restartPolicyy" in done.stdout + done.stderr


# --- The pods ------------------------------------------------------------------------------------


def effective_security(pod: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A container's security context with what it inherits from the pod's."""
    inherited = {
        k: v
        for k, v in pod.get("securityContext", {}).items()
        if k in ("runAsNonRoot", "runAsUser", "runAsGroup", "seccompProfile")
    }
    return {**inherited, **spec.get("securityContext", {})}


def shipped_containers(overlay: str) -> list[str]:
    """The containers this project defines in the overlay's pod (not the database's)."""
    return [GATE, ENVOY] if overlay == "gateway" else [GATE]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gate_is_a_native_sidecar(overlay: str) -> None:
    gate = container(overlay, GATE)
    assert gate["restartPolicy"] == "Always"
    assert gate in pod_spec(overlay)["initContainers"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_shipped_containers_are_locked_down(overlay: str) -> None:
    for name in shipped_containers(overlay):
        spec = container(overlay, name)
        security = effective_security(pod_spec(overlay), spec)
        assert security["runAsNonRoot"] is True, name
        assert security["runAsUser"] != 0, name
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"] == {"drop": ["ALL"]}, name
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for bound in ("requests", "limits"):
            assert set(spec["resources"][bound]) == {"cpu", "memory"}, (name, bound)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in spec, (name, probe)


def test_the_gateway_pod_calls_no_kubernetes_api() -> None:
    assert pod_spec("gateway")["automountServiceAccountToken"] is False
    (account,) = objects("gateway", "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert pod_spec("gateway")["serviceAccountName"] == account["metadata"]["name"]


CHANNEL = "retrieval-gate-channel"  # the volume holding Envoy's socket to the gate


def _mounts(spec: dict[str, Any], volume: str) -> list[dict[str, Any]]:
    return [m for m in spec.get("volumeMounts", []) if m["name"] == volume]


def istio_proxy_mounts(overlay: str) -> list[dict[str, Any]]:
    """What the pod asks Istio to mount in istio-proxy (sidecar.istio.io/userVolumeMount)."""
    annotations = gated_deployment(overlay)["spec"]["template"]["metadata"]["annotations"]
    mounts: list[dict[str, Any]] = json.loads(annotations["sidecar.istio.io/userVolumeMount"])
    return mounts


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gate_listens_on_a_socket_only_envoy_shares_and_its_probes_call_it(
    overlay: str, tmp_path: Path
) -> None:
    settings = pod_settings(overlay, tmp_path)
    # A unix socket: no TCP port, which every container of the pod could reach.
    assert settings.listen.grpc.startswith("unix:/")
    socket_path = Path(settings.listen.grpc.removeprefix("unix:"))
    assert not settings.listen.expose_grpc and settings.listen.gate is None
    pod = pod_spec(overlay)
    gate = container(overlay, GATE)
    (gate_mount,) = _mounts(gate, CHANNEL)
    assert gate_mount["mountPath"] == str(socket_path.parent)
    (volume,) = [v for v in pod["volumes"] if v["name"] == CHANNEL]
    assert set(volume) == {"name", "emptyDir"}  # the pod's own, gone with it
    # Mounted in the gate and in the one Envoy that calls it, nowhere else.
    every = [*pod["initContainers"], *pod["containers"]]
    mounted = {c["name"] for c in every if _mounts(c, CHANNEL)}
    if overlay == "gateway":
        assert mounted == {GATE, ENVOY}
        (envoy_mount,) = _mounts(container(overlay, ENVOY), CHANNEL)
        envoy_side = envoy_mount
        # Envoy runs as the gate's user: the socket's owner (mode 0660).
        envoy = effective_security(pod, container(overlay, ENVOY))
        assert envoy["runAsUser"] == effective_security(pod, gate)["runAsUser"]
    else:
        assert mounted == {GATE}
        (envoy_side,) = [m for m in istio_proxy_mounts(overlay) if m["name"] == CHANNEL]
        # istio-proxy's user is Istio's: the socket's group (the emptyDir's fsGroup,
        # every container's supplementary group) admits it.
        assert isinstance(pod["securityContext"]["fsGroup"], int)
    assert envoy_side["mountPath"] == str(socket_path.parent)
    assert envoy_side["readOnly"] is True  # Envoy connects; it cannot replace the socket
    env = {e["name"]: e.get("value") for e in gate["env"]}
    assert env["GATE_HEALTHCHECK_ADDRESS"] == settings.listen.grpc
    # The probes run the image's health check, where the Dockerfile puts it.
    copied = re.search(
        r"^COPY deploy/container/healthcheck\.py (\S+)$",
        (ROOT / "Dockerfile").read_text(),
        re.MULTILINE,
    )
    assert copied is not None
    assert gate["readinessProbe"]["exec"]["command"] == ["python", copied.group(1)]
    # A gate waiting NOT_SERVING for its store is alive: not restarted, and the
    # containers after it (perhaps the proxy it reaches the store through) start.
    for probe in ("startupProbe", "livenessProbe"):
        assert gate[probe]["exec"]["command"] == ["python", copied.group(1), "--alive"], probe


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_envoy_dials_the_gates_socket(overlay: str, tmp_path: Path) -> None:
    path = pod_settings(overlay, tmp_path).listen.grpc.removeprefix("unix:")
    if overlay == "gateway":
        (config,) = yaml_documents(config_file("gateway", "retrieval-gate-envoy", "envoy.yaml"))
        sidecar = cluster(config, SIDECAR_CLUSTER)
    else:
        sidecar = patch_value(overlay, "CLUSTER", "ADD")
    (group,) = sidecar["load_assignment"]["endpoints"]
    assert [e["endpoint"]["address"] for e in group["lb_endpoints"]] == [{"pipe": {"path": path}}]


def test_gateway_envoy_probes_reach_only_envoys_ready_endpoint() -> None:
    (config,) = yaml_documents(config_file("gateway", "retrieval-gate-envoy", "envoy.yaml"))
    envoy = container("gateway", ENVOY)
    ports = {p["name"]: p["containerPort"] for p in envoy["ports"]}
    readiness = envoy["readinessProbe"]["httpGet"]
    assert readiness["path"] == "/ready"
    ready = listener(config, "envoy_ready")
    assert ready["address"]["socket_address"]["port_value"] == ports[readiness["port"]]
    (host,) = connection_manager(ready)["route_config"]["virtual_hosts"]
    passed = [r for r in host["routes"] if "route" in r]
    assert [r["match"]["path"] for r in passed] == ["/ready"]
    admin_cluster = next(
        c
        for c in config["static_resources"]["clusters"]
        if c["name"] == passed[0]["route"]["cluster"]
    )
    (endpoint,) = admin_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert endpoint["endpoint"]["address"] == config["admin"]["address"]
    assert config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"


# --- The gateway's Service, disruption budget and network policies ------------------------------


def test_gateway_service_and_budget_select_the_gate_pods() -> None:
    labels = pod_labels("gateway")
    (service,) = objects("gateway", "Service")
    assert matches(service["spec"]["selector"], labels)
    (port,) = service["spec"]["ports"]
    envoy_ports = {p["name"]: p["containerPort"] for p in container("gateway", ENVOY)["ports"]}
    (config,) = yaml_documents(config_file("gateway", "retrieval-gate-envoy", "envoy.yaml"))
    gate_port = listener(config)["address"]["socket_address"]["port_value"]
    assert envoy_ports[port["targetPort"]] == gate_port
    (budget,) = objects("gateway", "PodDisruptionBudget")
    assert matches(budget["spec"]["selector"]["matchLabels"], labels)
    assert budget["spec"]["minAvailable"] >= 1
    assert gated_deployment("gateway")["spec"]["replicas"] > budget["spec"]["minAvailable"]


def test_only_the_gate_may_reach_the_vector_database() -> None:
    (config,) = yaml_documents(config_file("gateway", "retrieval-gate-envoy", "envoy.yaml"))
    db_ports = []
    for name in ("vector_db", "vector_db_grpc"):  # REST and gRPC
        (upstream,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
        (endpoint,) = upstream["load_assignment"]["endpoints"][0]["lb_endpoints"]
        db_ports.append(endpoint["endpoint"]["address"]["socket_address"]["port_value"])
    policy = next(
        p
        for p in objects("gateway", "NetworkPolicy")
        if not matches(p["spec"]["podSelector"]["matchLabels"], pod_labels("gateway"))
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # One rule, one peer: the gate's pods; the ports: those Envoy forwards to.
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}
    assert matches(peer["podSelector"]["matchLabels"], pod_labels("gateway"))
    assert rule["ports"] == [{"port": port, "protocol": "TCP"} for port in db_ports]


def test_the_gate_pods_admit_clients_only_on_envoys_port() -> None:
    (config,) = yaml_documents(config_file("gateway", "retrieval-gate-envoy", "envoy.yaml"))
    gate_port = listener(config)["address"]["socket_address"]["port_value"]
    policy = next(
        p
        for p in objects("gateway", "NetworkPolicy")
        if matches(p["spec"]["podSelector"]["matchLabels"], pod_labels("gateway"))
    )
    open_ports = {port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]}
    metrics = {p["name"]: p["containerPort"] for p in container("gateway", GATE)["ports"]}
    stats = {p["name"]: p["containerPort"] for p in container("gateway", ENVOY)["ports"]}
    assert open_ports == {gate_port, metrics["gate-metrics"], stats["envoy-stats"]}


# --- One source of truth: what the pods run is what `proxy` generates ----------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_shipped_settings_and_policy_data_load(overlay: str, tmp_path: Path) -> None:
    settings = pod_settings(overlay, tmp_path)
    assert settings.identity.mode is IdentityMode.ENVOY_JWT
    assert settings.store.url.startswith("postgresql://")  # shared by every replica
    assert ":" not in settings.store.url.split("//", 1)[1].split("@", 1)[0]  # no password in it
    data = tmp_path / "policy-data.json"
    data.write_text(config_file(overlay, "retrieval-gate-config", "policy-data.json"))
    assert settings.policy.data is not None
    assert load_policy_data(settings_of(policy_data=data)) is not None


@pytest.mark.envoy
def test_gateway_envoy_config_is_valid(tmp_path: Path) -> None:
    (config,) = yaml_documents(config_file("gateway", "retrieval-gate-envoy", "envoy.yaml"))
    done = envoy_validate(with_local_secrets(config, tmp_path), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_gateway_envoy_config_is_what_proxy_generates(tmp_path: Path) -> None:
    (config,) = yaml_documents(config_file("gateway", "retrieval-gate-envoy", "envoy.yaml"))
    assert gate_parts(config) == gate_parts(generated(pod_settings("gateway", tmp_path)))


def patch_value(overlay: str, apply_to: str, operation: str) -> dict[str, Any]:
    """The value of the overlay's one EnvoyFilter patch of this kind and operation."""
    (value,) = [
        p["patch"]["value"]
        for p in envoy_filter_patches(overlay)
        if p["applyTo"] == apply_to and p["patch"]["operation"] == operation
    ]
    found: dict[str, Any] = value
    return found


def test_envoy_filter_is_what_proxy_generates(tmp_path: Path) -> None:
    expected = generated(pod_settings("istio", tmp_path))
    gate_listener = listener(expected)
    ext_proc = patch_value("istio", "HTTP_FILTER", "INSERT_BEFORE")
    assert ext_proc["name"] == EXT_PROC
    assert normalised(ext_proc["typed_config"]) == normalised(http_filter(gate_listener, EXT_PROC))
    assert normalised(patch_value("istio", "CLUSTER", "ADD")) == normalised(
        next(c for c in expected["static_resources"]["clusters"] if c["name"] == SIDECAR_CLUSTER)
    )
    buffer = patch_value("istio", "LISTENER", "MERGE")
    assert buffer == {
        "per_connection_buffer_limit_bytes": gate_listener["per_connection_buffer_limit_bytes"]
    }
    paths = patch_value("istio", "NETWORK_FILTER", "MERGE")["typed_config"]
    hcm = connection_manager(gate_listener)
    assert {k: hcm[k] for k in paths if k != "@type"} == {
        k: v for k, v in paths.items() if k != "@type"
    }
    assert {"normalize_path", "merge_slashes", "path_with_escaped_slashes_action"} <= set(paths)


def test_the_comparison_sees_a_changed_fail_closed_setting(tmp_path: Path) -> None:
    expected = generated(pod_settings("istio", tmp_path))
    ext_proc = copy.deepcopy(patch_value("istio", "HTTP_FILTER", "INSERT_BEFORE"))
    ext_proc["typed_config"]["processing_mode"]["response_body_mode"] = "STREAMED"
    assert normalised(ext_proc["typed_config"]) != normalised(
        http_filter(listener(expected), EXT_PROC)
    )


def istio_proxy_config(overlay: str) -> dict[str, Any]:
    """What the gated pod asks of its istio-proxy (the proxy.istio.io/config annotation)."""
    annotations = gated_deployment(overlay)["spec"]["template"]["metadata"]["annotations"]
    (proxy_config,) = yaml_documents(annotations["proxy.istio.io/config"])
    found: dict[str, Any] = proxy_config
    return found


@pytest.mark.parametrize("overlay", ISTIO_OVERLAYS)
def test_istio_proxy_gets_the_runtime_proxy_generates(overlay: str, tmp_path: Path) -> None:
    # An EnvoyFilter cannot set runtime values; Istio takes them from the pod's
    # ProxyConfig, as strings.
    (layer,) = generated(pod_settings(overlay, tmp_path))["layered_runtime"]["layers"]
    expected = {key: json.dumps(value) for key, value in layer["static_layer"].items()}
    assert expected
    assert istio_proxy_config(overlay)["runtimeValues"] == expected


@pytest.mark.parametrize("overlay", ISTIO_OVERLAYS)
def test_istio_proxy_starts_before_the_gate(overlay: str) -> None:
    # The gate's first JWKS fetch and store connection go through istio-proxy.
    assert istio_proxy_config(overlay)["holdApplicationUntilProxyStarts"] is True


# --- EnvoyFilter patch values through `envoy --mode validate` ------------------------------------


def _inbound_bootstrap(istio_filters: list[dict[str, Any]]) -> dict[str, Any]:
    """Stand-in for an istio-proxy's inbound listener: Istio's filters, then the router."""
    inbound = "inbound|6333||"
    return {
        "static_resources": {
            "listeners": [
                {
                    "name": "virtualInbound",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": 15006}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": HCM,
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters."
                                        "network.http_connection_manager.v3.HttpConnectionManager",
                                        "stat_prefix": "inbound_0.0.0.0_6333",
                                        "route_config": {
                                            "name": "inbound|http|6333",
                                            "virtual_hosts": [
                                                {
                                                    "name": "inbound|http|6333",
                                                    "domains": ["*"],
                                                    "routes": [
                                                        {
                                                            "match": {"prefix": "/"},
                                                            "route": {"cluster": inbound},
                                                        }
                                                    ],
                                                }
                                            ],
                                        },
                                        "http_filters": [
                                            *istio_filters,
                                            {
                                                "name": ROUTER,
                                                "typed_config": {
                                                    "@type": "type.googleapis.com/envoy.extensions."
                                                    "filters.http.router.v3.Router"
                                                },
                                            },
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [_static_cluster(inbound, 6333)],
        }
    }


def _static_cluster(name: str, port: int) -> dict[str, Any]:
    endpoint = {
        "endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}
    }
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [endpoint]}]},
    }


def apply_patch(
    bootstrap: dict[str, Any], patch: dict[str, Any], listener_name: str = "virtualInbound"
) -> None:
    """Applies one EnvoyFilter config patch to ``bootstrap`` as Istio applies it."""
    match, value = patch["match"], copy.deepcopy(patch["patch"]["value"])
    assert match["context"] == "SIDECAR_INBOUND"  # the database's own inbound traffic
    target = listener(bootstrap, listener_name)
    kind = (patch["applyTo"], patch["patch"]["operation"])
    if kind == ("CLUSTER", "ADD"):
        bootstrap["static_resources"]["clusters"].append(value)
    elif kind == ("LISTENER", "MERGE"):
        assert match["listener"] == {"name": "virtualInbound"}
        deep_merge(target, value)
    elif kind == ("NETWORK_FILTER", "MERGE"):
        assert match["listener"]["filterChain"]["filter"]["name"] == HCM
        deep_merge(connection_manager_filter(target), value)
    elif patch["applyTo"] == "HTTP_FILTER":
        filter_match = match["listener"]["filterChain"]["filter"]
        assert filter_match["name"] == HCM
        filters = connection_manager(target)["http_filters"]
        names = [f["name"] for f in filters]
        at = names.index(filter_match["subFilter"]["name"])
        if kind[1] == "INSERT_BEFORE":
            filters.insert(at, value)
        elif kind[1] == "MERGE":
            deep_merge(filters[at], value)
        else:
            raise AssertionError(f"no check for an HTTP_FILTER {kind[1]} patch: add one here")
    else:
        raise AssertionError(f"no check for a {kind} patch: add one here")


def mesh_provider(name: str) -> dict[str, Any]:
    """The extension provider ``name`` of the shipped mesh configuration fragment."""
    path = KUBERNETES / "components" / "istio-ext-authz" / "istio-operator.yaml"
    (operator,) = yaml_documents(path.read_text())
    (provider,) = [
        p for p in operator["spec"]["meshConfig"]["extensionProviders"] if p["name"] == name
    ]
    found: dict[str, Any] = provider
    return found


def istio_filters(overlay: str, jwks: dict[str, Any]) -> list[dict[str, Any]]:
    """Stand-ins for the HTTP filters Istio puts in the inbound chain for this overlay's objects."""
    filters: list[dict[str, Any]] = []
    for authn in objects(overlay, "RequestAuthentication"):
        (rule,) = authn["spec"]["jwtRules"]
        filters.append(istio_jwt_authn(rule["issuer"], rule.get("audiences", []), jwks))
    for policy in objects(overlay, "AuthorizationPolicy"):
        if policy["spec"]["action"] == "CUSTOM":
            filters.append(istio_ext_authz(mesh_provider(policy["spec"]["provider"]["name"])))
    return filters


def bootstrap_from_envoy_filters(overlay: str) -> dict[str, Any]:
    """The EnvoyFilters' patches applied to a stand-in inbound listener, named clusters stubbed."""
    bootstrap = _inbound_bootstrap(istio_filters(overlay, tokens.jwks(tokens.KeyPair.rsa())))
    for patch in envoy_filter_patches(overlay):
        apply_patch(bootstrap, patch)
    defined = {c["name"] for c in bootstrap["static_resources"]["clusters"]}
    # The ext_proc filter's cluster is the EnvoyFilter's own, never one Istio may lack.
    ext_proc = http_filter(listener(bootstrap, "virtualInbound"), EXT_PROC)
    assert ext_proc["grpc_service"]["envoy_grpc"]["cluster_name"] in defined
    # Clusters Istio generates (the extension provider's): stubbed.
    named = {
        f["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        for f in connection_manager(listener(bootstrap, "virtualInbound"))["http_filters"]
        if "grpc_service" in f.get("typed_config", {})
    }
    for name in sorted(named - defined):
        bootstrap["static_resources"]["clusters"].append(_static_cluster(name, 9001))
    return bootstrap


@pytest.mark.envoy
@pytest.mark.parametrize("overlay", ISTIO_OVERLAYS)
def test_envoy_filter_patch_values_pass_envoy_validate(overlay: str, tmp_path: Path) -> None:
    bootstrap = bootstrap_from_envoy_filters(overlay)
    names = [
        f["name"] for f in connection_manager(listener(bootstrap, "virtualInbound"))["http_filters"]
    ]
    # The gate runs after Istio's identity and authorization filters, right before the router.
    assert names[-2:] == [EXT_PROC, ROUTER]
    assert names[0] == JWT_AUTHN
    done = envoy_validate(bootstrap, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.envoy
def test_envoy_validate_refuses_a_typo_inside_a_patch_value(tmp_path: Path) -> None:
    bootstrap = bootstrap_from_envoy_filters("istio")
    http_filter(listener(bootstrap, "virtualInbound"), EXT_PROC)["failure_mode_alow"] = True
    done = envoy_validate(bootstrap, tmp_path)
    assert done.returncode != 0
    assert "failure_mode_alow" in done.stdout + done.stderr


# --- Istio objects agree with each other and with the gate ---------------------------------------


@pytest.mark.parametrize("overlay", ISTIO_OVERLAYS)
def test_istio_objects_select_the_gated_pods(overlay: str) -> None:
    labels = pod_labels(overlay)
    for envoy_filter in objects(overlay, "EnvoyFilter"):
        assert matches(envoy_filter["spec"]["workloadSelector"]["labels"], labels)
    for kind in ("RequestAuthentication", "AuthorizationPolicy", "PeerAuthentication"):
        for item in objects(overlay, kind):
            assert matches(item["spec"]["selector"]["matchLabels"], labels), kind


def test_request_authentication_agrees_with_the_gate(tmp_path: Path) -> None:
    settings = pod_settings("istio", tmp_path)
    (authn,) = objects("istio", "RequestAuthentication")
    (rule,) = authn["spec"]["jwtRules"]
    assert rule["issuer"] == settings.identity.issuer
    assert settings.identity.audience in rule["audiences"]
    assert rule["jwksUri"] == settings.identity.jwks
    # The gate checks that the token Istio verified is the request's only one.
    assert rule["forwardOriginalToken"] is True
    # The gate reads the payload where Istio writes it.
    assert settings.identity.jwt_payload_key == ISTIO_PAYLOAD_KEY
    ext_proc = patch_value("istio", "HTTP_FILTER", "INSERT_BEFORE")["typed_config"]
    assert JWT_AUTHN_NAMESPACE in ext_proc["metadata_options"]["forwarding_namespaces"]["untyped"]


def test_the_ext_authz_provider_is_the_gate_and_fails_closed(tmp_path: Path) -> None:
    settings = pod_settings("istio-ext-authz", tmp_path)
    (policy,) = [
        p
        for p in objects("istio-ext-authz", "AuthorizationPolicy")
        if p["spec"]["action"] == "CUSTOM"
    ]
    assert policy["spec"]["action"] == "CUSTOM"
    assert policy["spec"]["rules"] == [{}]  # every request
    grpc = mesh_provider(policy["spec"]["provider"]["name"])["envoyExtAuthzGrpc"]
    assert grpc["failOpen"] is False
    assert grpc["statusOnError"] == "503"
    (entry,) = objects("istio-ext-authz", "ServiceEntry")
    assert grpc["service"] in entry["spec"]["hosts"]
    # The gate's socket (Istio's spelling of a unix address), which istio-proxy mounts.
    assert settings.listen.grpc.startswith("unix:/")
    path = settings.listen.grpc.removeprefix("unix:")
    assert [e["address"] for e in entry["spec"]["endpoints"]] == [f"unix://{path}"]
    assert [p["number"] for p in entry["spec"]["ports"]] == [grpc["port"]]
    # Istio's check carries no filter metadata unless told: the verified payload must go along.
    merge = next(
        p
        for p in envoy_filter_patches("istio-ext-authz")
        if p["applyTo"] == "HTTP_FILTER" and p["patch"]["operation"] == "MERGE"
    )
    namespaces = merge["patch"]["value"]["typed_config"]["metadata_context_namespaces"]
    assert JWT_AUTHN_NAMESPACE in namespaces


# --- The payload key: where the gate reads, where `proxy`'s Envoy writes -------------------------


def _identify(settings: Settings, metadata: dict[str, Any], token: str) -> Any:
    headers = {"authorization": f"Bearer {token}"}
    request = AuthRequest("POST", "/collections/docs/points/search", headers, metadata)
    return asyncio.run(build_identity(settings).identify(request))


def test_the_gate_reads_the_payload_under_the_configured_key() -> None:
    payload = tokens.claims(groups=["qa"])
    istio = {JWT_AUTHN_NAMESPACE: {ISTIO_PAYLOAD_KEY: payload}}
    identity = {
        "identity": "envoy-jwt",
        "issuer": tokens.ISSUER,
        "audience": tokens.AUDIENCE,
        "jwks": "https://idp.example.com/.well-known/jwks.json",
    }
    token = tokens.unsigned_token(payload)  # what Istio verified and forwarded
    settings = load_settings(None, {**identity, "jwt_payload_key": "payload"})
    assert _identify(settings, istio, token).tenant == payload["tenant"]
    with pytest.raises(IdentityError) as refused:
        _identify(load_settings(None, identity), istio, token)  # the default key: nothing there
    assert refused.value.code == "token_missing"


def test_proxy_writes_the_payload_under_the_configured_key() -> None:
    settings = load_settings(
        None,
        {
            "identity": "envoy-jwt",
            "issuer": tokens.ISSUER,
            "audience": tokens.AUDIENCE,
            "jwks": "https://idp.example.com/.well-known/jwks.json",
            "jwt_payload_key": "payload",
        },
    )
    (provider,) = jwt_authn_filter(settings)["typed_config"]["providers"].values()
    assert provider["payload_in_metadata"] == "payload"


def test_an_empty_payload_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="jwt_payload_key"):
        load_settings(None, {"jwt_payload_key": ""})


# --- The Istio overlay's chain through a real Envoy ----------------------------------------------

SEARCH = "/collections/docs/points/search"
RECORDS = [
    record_dict("1"),
    record_dict("2", allowed_principals=["user:alice"]),
    record_dict("3", status="draft"),
    record_dict("4", tenant_id="globex"),
]


def _as_istio_runs_it(
    issuer: str, audience: str, jwks: dict[str, Any]
) -> Callable[[dict[str, Any]], None]:
    """Replaces `proxy`'s filters with Istio's jwt_authn stand-in and the overlay's patches.

    `proxy`'s path settings and buffer limit go too: the patches must bring
    them back. The sidecar cluster stays `proxy`'s (the same settings; its
    address is the test's socket, not the pod's loopback port).
    """

    def edit(bootstrap: dict[str, Any]) -> None:
        gate_listener = listener(bootstrap)
        del gate_listener["per_connection_buffer_limit_bytes"]
        hcm = connection_manager(gate_listener)
        for setting in ("normalize_path", "merge_slashes", "path_with_escaped_slashes_action"):
            del hcm[setting]
        router = {"name": ROUTER, "typed_config": http_filter(gate_listener, ROUTER)}
        hcm["http_filters"] = [istio_jwt_authn(issuer, [audience], jwks), router]
        for patch in envoy_filter_patches("istio"):
            if patch["applyTo"] != "CLUSTER":
                apply_patch(bootstrap, patch, gate_listener["name"])

    return edit


@pytest.fixture(scope="module")
def istio_chain(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GateStack, tokens.KeyPair]]:
    key = tokens.KeyPair.rsa()
    workdir = tmp_path_factory.mktemp("istio-chain")
    jwks_file = workdir / "jwks.json"
    jwks_file.write_text(json.dumps(tokens.jwks(key)))
    # The payload key from the overlay's gate arguments; issuer and audience the test's.
    flags = dict(a.removeprefix("--").split("=", 1) for a in container("istio", GATE)["args"][1:])
    gate = GateStack(
        workdir,
        RECORDS,
        config={
            "identity": "envoy-jwt",
            "issuer": tokens.ISSUER,
            "audience": tokens.AUDIENCE,
            "jwks": str(jwks_file),
            "jwt_payload_key": flags["jwt-payload-key"],
        },
        edit_bootstrap=_as_istio_runs_it(tokens.ISSUER, tokens.AUDIENCE, tokens.jwks(key)),
    ).start()
    points = [qb.point(i, text_for(str(i))) for i in range(1, 5)]
    gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(points))))
    yield gate, key
    gate.stop()


def _search(gate: GateStack, token: str | None) -> HttpResult:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return gate.search(SEARCH, tenant=None, principals=None, headers=headers)


@pytest.mark.envoy
def test_istio_chain_admits_the_caller_of_the_payload_istio_verified(
    istio_chain: tuple[GateStack, tokens.KeyPair],
) -> None:
    gate, key = istio_chain
    response = _search(gate, tokens.token(key, tokens.claims(groups=["qa"])))
    assert response.status == 200, response.body
    assert search_ids(response) == [1, 2]  # 3 is a draft, 4 another tenant's
    assert "authorization" not in gate.upstream.requests[-1].headers


@pytest.mark.envoy
def test_istio_chain_without_a_token_gets_the_gates_401(
    istio_chain: tuple[GateStack, tokens.KeyPair],
) -> None:
    gate, _ = istio_chain
    before = len(gate.upstream.requests)
    response = _search(gate, None)
    assert response.status == 401
    assert response.json() == {"error": "token_missing"}
    assert len(gate.upstream.requests) == before


@pytest.mark.envoy
def test_istio_chain_refuses_a_token_of_another_key_before_the_gate(
    istio_chain: tuple[GateStack, tokens.KeyPair],
) -> None:
    gate, key = istio_chain
    before = len(gate.upstream.requests)
    forged = tokens.token(tokens.KeyPair.rsa(kid=key.kid), tokens.claims(groups=["qa"]))
    assert _search(gate, forged).status == 401
    assert len(gate.upstream.requests) == before


def test_docs_name_the_commands_that_check_the_manifests() -> None:
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    for overlay in OVERLAYS:
        assert f"kubectl kustomize deploy/kubernetes/overlays/{overlay}" in text
    for check in ("kubernetes-validate --strict", "envoy --mode validate", "test_kubernetes.py"):
        assert check in text


def run_gate_probe(address: str) -> subprocess.CompletedProcess[str]:
    """The gate container's probe command, run here against ``address``."""
    (_, script) = container("istio", GATE)["readinessProbe"]["exec"]["command"]
    assert script.endswith("/" + HEALTHCHECK.name)
    env = {**os.environ, "GATE_HEALTHCHECK_ADDRESS": address}
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK)], capture_output=True, text=True, env=env, timeout=30
    )


@pytest.mark.envoy
def test_the_gate_probe_passes_on_a_serving_gate_and_fails_without_one(
    istio_chain: tuple[GateStack, tokens.KeyPair], tmp_path: Path
) -> None:
    gate, _ = istio_chain
    assert run_gate_probe(f"unix:{gate.socket}").returncode == 0
    assert run_gate_probe(f"unix:{tmp_path / 'nothing.sock'}").returncode != 0


# --- Start order and rollouts (issue 25) ----------------------------------------------------


@pytest.mark.parametrize("overlay", ISTIO_OVERLAYS)
def test_istio_injects_its_proxy_as_a_native_sidecar_before_the_gate(overlay: str) -> None:
    annotations = gated_deployment(overlay)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["sidecar.istio.io/nativeSidecar"] == "true"
    # The graceful ext_proc close the gate needs exists from Envoy 1.34 (Istio 1.26) on.
    assert "Istio 1.26 or\nlater" in (ROOT / "docs" / "kubernetes.md").read_text()


def test_the_gateway_envoy_drains_before_it_stops() -> None:
    envoy = container("gateway", ENVOY)
    args = dict(a.removeprefix("--").split("=", 1) for a in envoy["args"] if "=" in a)
    assert args["drain-strategy"] == "immediate"
    command = envoy["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:3] == ["python", "-m", "sidecar.runtime.envoy_drain"]
    hook = dict(a.removeprefix("--").split("=", 1) for a in command[3:])
    (config,) = yaml_documents(config_file("gateway", "retrieval-gate-envoy", "envoy.yaml"))
    admin = config["admin"]["address"]["socket_address"]
    assert hook["admin"] == f"{admin['address']}:{admin['port_value']}"
    # The hook outlasts the route timeout and Envoy's drain; the pod's grace outlasts the hook.
    assert float(hook["max-seconds"]) >= float(args["drain-time-s"]) >= 60
    grace = pod_spec("gateway")["terminationGracePeriodSeconds"]
    assert grace >= float(hook["max-seconds"]) + 5
    # The module the hook runs is the gate's own, installed in the image.
    done = subprocess.run(
        [sys.executable, "-m", "sidecar.runtime.envoy_drain", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0 and "--max-seconds" in done.stdout
