"""Envoy's channel to the sidecar admits Envoy alone; the Gate service has a listener of its own.

Issue 27 found that any process reaching the sidecar's gRPC listener could open
an ext_proc stream whose metadata names a tenant, and read that tenant's
chunks. These tests run the real processes as they ship and try that stream
(tests.fixtures.channel_peers.forged_stream) from where a process that is not
Envoy would:

- ``serve`` with the Dockerfile's default command (paths moved into a
  temporary directory prepared as the image prepares them), and as a pod runs
  it (a setgid directory, as an emptyDir with an fsGroup is);
- ``proxy`` with its defaults;
- ``serve`` on TCP with mTLS and a pinned client identity, with certificates
  made here, directly and through a real Envoy;
- the Gate listener beside Envoy's, each refusing the other's services.

Another user is a forked child that drops to that user (root only: the tests
run as root here and in CI). Root itself passes every file permission, so
the forged stream that succeeds as root shows what the socket would give
anyone who could reach it: the control for the refusals.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.demo.upstream import CannedResponse, FixtureUpstream
from sidecar.runtime.bootstrap import SIDECAR_CLUSTER
from sidecar.runtime.ports import free_port
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.channel_peers import (
    NOBODY,
    connect_as,
    forged_check,
    forged_stream,
    gate_filter,
    grpc_target,
    listening_tcp,
    listening_unix,
    refusal,
)
from tests.fixtures.dockerfile import default_command
from tests.fixtures.harness import CLI, GateStack, HttpResult, http, search_ids, write_records
from tests.fixtures.pki import Authority, Issued
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.servers import stop_process
from tests.fixtures.stores import new_sqlite_url

pytestmark = pytest.mark.envoy

SEARCH = "/collections/docs/points/search"
RECORDS = [record_dict("1"), record_dict("2")]
POINTS = [qb.point(1, text_for("1")), qb.point(2, text_for("2"))]
ENVOY_ID = "spiffe://cluster.local/ns/gate/sa/envoy"
# A pod's fsGroup and istio-proxy's user (the ids Kubernetes and Istio use are
# the deployment's; these stand in for them).
FS_GROUP = 4242
ISTIO_PROXY = 1337


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A temporary directory every user may search (pytest's own are 0700, which would
    hide any socket in them from another user whatever the socket's mode)."""
    with tempfile.TemporaryDirectory(prefix="gate-channel-") as name:
        directory = Path(name)
        directory.chmod(0o755)
        yield directory


def _wait_for_socket(process: subprocess.Popen[bytes], path: Path, log: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no socket at {path}: {log.read_text()[-3000:]}"
        time.sleep(0.05)


def _config(directory: Path) -> Path:
    config = directory / "gate.toml"
    config.write_text(
        '[identity]\nmode = "trusted-headers"\n'
        f'[store]\nurl = "{new_sqlite_url(directory / "gate.db")}"\n'
    )
    return config


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _tcp_ports_refuse_the_stream(pid: int, expected: set[int]) -> None:
    """Every TCP port the process tree of ``pid`` listens on refuses a forged stream; the
    ports in ``expected`` are among them (the enumeration sees what it must)."""
    ports = listening_tcp(pid)
    assert expected <= {port for _, port in ports}, ports
    for host, port in ports:
        with pytest.raises(grpc.RpcError):
            forged_stream(grpc_target(host, port), timeout=3)


# --- serve as the container runs it ---------------------------------------------------------


def test_serve_as_the_image_runs_it_admits_only_its_user_and_group(public_tmp: Path) -> None:
    # The image: /etc/retrieval-gate (settings), /run/retrieval-gate (the gate's, 0750).
    etc = public_tmp / "etc" / "retrieval-gate"
    run = public_tmp / "run" / "retrieval-gate"
    etc.mkdir(parents=True)
    run.mkdir(parents=True)
    run.chmod(0o750)
    (etc / "gate.toml").write_text(_config(public_tmp).read_text())
    metrics = free_port()
    command = [
        arg.replace("/etc/retrieval-gate/", f"{etc}/")
        .replace("/run/retrieval-gate/", f"{run}/")
        .replace("127.0.0.1:9464", f"127.0.0.1:{metrics}")
        for arg in default_command()
    ]
    moved = [a for a, b in zip(command, default_command(), strict=True) if a != b]
    assert len(moved) == 3, command  # every path and port of the image's command, moved
    assert command[0] == "serve"
    log = public_tmp / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen([*CLI, *command], stdout=out, stderr=subprocess.STDOUT)
    try:
        socket_path = run / "envoy.sock"
        _wait_for_socket(process, socket_path, log)
        info = socket_path.stat()
        assert stat.S_ISSOCK(info.st_mode)
        assert (_mode(socket_path), info.st_uid, info.st_gid) == (
            0o660,
            os.geteuid(),
            os.getegid(),
        )
        assert _mode(run) == 0o750
        # Control: whoever reaches the socket is believed (root passes any mode).
        assert forged_stream(f"unix:{socket_path}").HasField("request_headers")
        # Another user: refused at the directory and at the socket.
        assert connect_as(socket_path, NOBODY, NOBODY) == errno.EACCES
        # Envoy's container, run with the gate's group (docs/container.md): admitted.
        assert connect_as(socket_path, NOBODY, NOBODY, (info.st_gid,)) == 0
        # No TCP port of the gate takes the stream (its only one is /metrics).
        _tcp_ports_refuse_the_stream(process.pid, {metrics})
    finally:
        stop_process(process)


def test_in_a_pods_setgid_directory_the_socket_takes_the_fs_group(public_tmp: Path) -> None:
    # An emptyDir with an fsGroup: owned by the group, setgid, writable by all (02777).
    channel = public_tmp / "channel"
    channel.mkdir()
    os.chown(channel, 0, FS_GROUP)
    channel.chmod(0o2777)
    socket_path = channel / "envoy.sock"
    log = public_tmp / "serve.log"
    command = [*CLI, "serve", "--config", str(_config(public_tmp))]
    command += ["--grpc-listen", f"unix:{socket_path}"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for_socket(process, socket_path, log)
        assert (_mode(socket_path), socket_path.stat().st_gid) == (0o660, FS_GROUP)
        # istio-proxy has the pod's fsGroup as a supplementary group: admitted.
        assert connect_as(socket_path, ISTIO_PROXY, ISTIO_PROXY, (FS_GROUP,)) == 0
        # A process of another user and group that reaches the directory: refused by
        # the socket's mode alone (in a pod, no other container mounts the volume).
        assert connect_as(socket_path, ISTIO_PROXY, ISTIO_PROXY) == errno.EACCES
    finally:
        stop_process(process)


# --- proxy with its defaults ------------------------------------------------------------------


def test_proxy_reaches_its_sidecar_over_a_socket_in_a_private_directory(tmp_path: Path) -> None:
    upstream = FixtureUpstream().start()
    upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS))))
    store = new_sqlite_url(tmp_path / "gate.db")
    chunks = write_records(tmp_path / "chunks.jsonl", RECORDS)
    loaded = subprocess.run([*CLI, "store", "load", "--store", store, str(chunks)], check=False)
    assert loaded.returncode == 0
    listen, metrics = free_port(), free_port()
    log = tmp_path / "proxy.log"
    command = [*CLI, "proxy", "--upstream", upstream.url, "--listen", f"127.0.0.1:{listen}"]
    command += ["--store", store, "--identity", "trusted-headers"]
    command += ["--metrics", f"127.0.0.1:{metrics}"]
    with log.open("wb") as out:
        proxy = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while b"proxy ready" not in log.read_bytes():
            assert proxy.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        (socket_path,) = [p for p in listening_unix(proxy.pid) if p.name == "gate.sock"]
        directory = socket_path.parent
        assert (_mode(directory), directory.stat().st_uid) == (0o700, os.geteuid())
        assert _mode(socket_path) == 0o660
        # Envoy (proxy's child, the same user) reaches it: the search is filtered.
        answered = http(
            "POST",
            f"http://127.0.0.1:{listen}{SEARCH}",
            b'{"vector":[0.1],"limit":2}',
            {"x-gate-tenant": "acme", "x-gate-principals": "group:qa"},
        )
        assert answered.status == 200 and search_ids(answered) == [1, 2]
        # Control: the socket believes whoever reaches it (root passes any mode) ...
        assert forged_stream(f"unix:{socket_path}").HasField("request_headers")
        # ... and no one else reaches it, not even in the socket's group.
        gid = socket_path.stat().st_gid
        assert connect_as(socket_path, NOBODY, NOBODY, (gid,)) == errno.EACCES
        # No TCP port of proxy, its Envoy's included, takes the stream.
        _tcp_ports_refuse_the_stream(proxy.pid, {listen, metrics})
    finally:
        stop_process(proxy)
        upstream.stop()


# --- TCP with mTLS and a pinned client identity -------------------------------------------------


class Pki:
    """The gate's CA and certificates: the sidecar's, Envoy's, an impostor's of the same CA,
    and one naming Envoy's identity from another CA."""

    def __init__(self, directory: Path) -> None:
        self.ca = Authority(directory, "gate-ca")
        loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
        self.server = self.ca.issue("sidecar", [loopback], server=True)
        self.envoy = self.ca.workload("envoy", ENVOY_ID)
        self.impostor = self.ca.workload("impostor", "spiffe://cluster.local/ns/apps/sa/rag")
        self.foreign = Authority(directory, "other-ca").workload("envoy", ENVOY_ID)

    def settings(self, port: int) -> dict[str, Any]:
        return {
            "grpc_listen": f"127.0.0.1:{port}",
            "grpc_cert_file": str(self.server.cert),
            "grpc_key_file": str(self.server.key),
            "grpc_client_ca_file": str(self.ca.bundle),
            "grpc_client_id": ENVOY_ID,
        }

    def client(self, issued: Issued | None) -> grpc.ChannelCredentials:
        if issued is None:
            return grpc.ssl_channel_credentials(self.ca.bundle.read_bytes())
        return grpc.ssl_channel_credentials(
            self.ca.bundle.read_bytes(), issued.key.read_bytes(), issued.cert.read_bytes()
        )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("gate-pki"))


def _with_client_certificate(cluster_client: Issued, pki: Pki) -> Any:
    """An edit of the bootstrap: the sidecar cluster over TLS with ``cluster_client``."""

    def edit(bootstrap: dict[str, Any]) -> None:
        (cluster,) = [
            c for c in bootstrap["static_resources"]["clusters"] if c["name"] == SIDECAR_CLUSTER
        ]
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                "UpstreamTlsContext",
                "common_tls_context": {
                    "tls_certificates": [
                        {
                            "certificate_chain": {"filename": str(cluster_client.cert)},
                            "private_key": {"filename": str(cluster_client.key)},
                        }
                    ],
                    "validation_context": {"trusted_ca": {"filename": str(pki.ca.bundle)}},
                    # gRPC servers require ALPN h2 over TLS.
                    "alpn_protocols": ["h2"],
                },
            },
        }

    return edit


def _mtls_stack(workdir: Path, pki: Pki, client: Issued) -> GateStack:
    stack = GateStack(
        workdir,
        RECORDS,
        config=pki.settings(free_port()),
        edit_bootstrap=_with_client_certificate(client, pki),
    ).start()
    stack.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS))))
    return stack


@pytest.fixture(scope="module")
def mtls_stack(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[GateStack]:
    stack = _mtls_stack(tmp_path_factory.mktemp("mtls"), pki, pki.envoy)
    yield stack
    stack.stop()


def _listen(stack: GateStack) -> str:
    return str(stack._config["grpc_listen"])


def test_envoy_with_the_pinned_certificate_is_served(mtls_stack: GateStack, pki: Pki) -> None:
    assert search_ids(mtls_stack.search(SEARCH)) == [1, 2]
    answer = forged_stream(_listen(mtls_stack), pki.client(pki.envoy))
    assert answer.HasField("request_headers")  # control: the pinned identity is served


@pytest.mark.parametrize(
    ("client", "code"),
    [
        ("impostor", grpc.StatusCode.PERMISSION_DENIED),  # the CA's, another identity
        ("foreign", grpc.StatusCode.UNAVAILABLE),  # the identity, another CA: no handshake
        ("none", grpc.StatusCode.UNAVAILABLE),  # no certificate: no handshake
        ("plaintext", grpc.StatusCode.UNAVAILABLE),
    ],
)
def test_any_other_peer_is_refused(
    mtls_stack: GateStack, pki: Pki, client: str, code: grpc.StatusCode
) -> None:
    credentials = {
        "impostor": pki.client(pki.impostor),
        "foreign": pki.client(pki.foreign),
        "none": pki.client(None),
        "plaintext": None,
    }[client]
    assert refusal(lambda: forged_stream(_listen(mtls_stack), credentials)) is code


def test_the_pinned_identity_holds_for_every_call(mtls_stack: GateStack, pki: Pki) -> None:
    def health(issued: Issued) -> health_pb2.HealthCheckResponse:
        with grpc.secure_channel(_listen(mtls_stack), pki.client(issued)) as channel:
            answer: health_pb2.HealthCheckResponse = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            return answer

    assert health(pki.envoy).status == health_pb2.HealthCheckResponse.SERVING
    assert refusal(lambda: health(pki.impostor)) is grpc.StatusCode.PERMISSION_DENIED
    log = (mtls_stack.workdir / "sidecar.log").read_text()
    assert "refused a call on listen.grpc" in log


def test_an_envoy_with_another_identity_fails_closed(tmp_path: Path, pki: Pki) -> None:
    stack = _mtls_stack(tmp_path, pki, pki.impostor)
    try:
        refused: HttpResult = stack.search(SEARCH)
        assert refused.status == 503
        assert text_for("1").encode() not in refused.body
        assert not [r for r in stack.upstream.requests if r.path == SEARCH]
    finally:
        stack.stop()


# --- The Gate listener and Envoy's, each without the other's services -------------------------


@pytest.fixture(scope="module")
def separated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    """Envoy's listener (a unix socket) and the Gate's on loopback TCP, in one sidecar."""
    stack = GateStack(
        tmp_path_factory.mktemp("separated"),
        RECORDS,
        config={"gate_listen": f"127.0.0.1:{free_port()}"},
    ).start()
    yield stack
    stack.stop()


def _gate(stack: GateStack) -> str:
    return str(stack._config["gate_listen"])


def test_gate_filter_is_served_on_its_listener_and_not_on_envoys(separated: GateStack) -> None:
    answer = gate_filter(_gate(separated))
    assert [d.id for d in answer.decisions] == ["1"]  # control: the Gate service answers
    code = refusal(lambda: gate_filter(f"unix:{separated.socket}"))
    assert code is grpc.StatusCode.UNIMPLEMENTED


def test_envoys_services_are_not_on_the_gate_listener(separated: GateStack) -> None:
    # Control: on Envoy's socket the forged stream and check are believed (root).
    assert forged_stream(f"unix:{separated.socket}").HasField("request_headers")
    assert forged_check(f"unix:{separated.socket}").status.code == 0
    for call in (forged_stream, forged_check):
        code = refusal(lambda call=call: call(_gate(separated)))
        assert code is grpc.StatusCode.UNIMPLEMENTED, call.__name__
    # The Gate listener's TCP port and /metrics are the sidecar's only ports: neither
    # takes an ext_proc stream.
    assert separated.sidecar is not None
    gate_port = int(_gate(separated).rpartition(":")[2])
    _tcp_ports_refuse_the_stream(separated.sidecar.pid, {gate_port, separated.metrics_port})


@pytest.mark.parametrize(("listener", "status"), [("grpc", 200), ("gate", 503)])
def test_an_envoy_sent_to_the_gate_listener_fails_closed(
    tmp_path: Path, listener: str, status: int
) -> None:
    gate_socket = tmp_path / "gate-service.sock"

    def point_at(bootstrap: dict[str, Any]) -> None:
        if listener == "gate":
            (cluster,) = [
                c for c in bootstrap["static_resources"]["clusters"] if c["name"] == SIDECAR_CLUSTER
            ]
            endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
            endpoint["endpoint"]["address"] = {"pipe": {"path": str(gate_socket)}}

    stack = GateStack(tmp_path, RECORDS, gate_service=True, edit_bootstrap=point_at).start()
    assert stack.gate_socket == gate_socket
    try:
        stack.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS))))
        answered = stack.search(SEARCH)
        assert answered.status == status
        if status != 200:
            assert text_for("1").encode() not in answered.body
    finally:
        stack.stop()
