"""Identity mode mesh-mtls through a real Envoy that terminates mTLS.

The tests make a CA, the listener's certificate and client certificates
(``cryptography``); the caller is the SPIFFE id of the client certificate
Envoy verified, mapped by the workload table. The stacks run the bootstrap
`proxy` generates (tests.fixtures.harness.GateStack, whose Envoy statistics show how
a handshake failed); one test runs the `proxy` command itself. The upstream
is the fixture server (a fake Qdrant, sidecar.demo.upstream).
"""

from __future__ import annotations

import http.client
import ipaddress
import signal
import ssl
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from sidecar.core.caller import Caller
from sidecar.demo.upstream import CannedResponse, FixtureUpstream
from sidecar.runtime.ports import free_port
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import CLI, GateStack, HttpResult, search_ids, wait_until, write_records
from tests.fixtures.pki import Authority, Issued
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.stores import new_sqlite_url

pytestmark = pytest.mark.envoy

SEARCH = "/collections/docs/points/search"
BODY = b'{"vector":[0.1,0.2],"limit":10}'
RAG = "spiffe://cluster.local/ns/acme/sa/rag"
INDEXER = "spiffe://cluster.local/ns/globex/sa/indexer"
PARTNER = "spiffe://partner.example/ns/acme/sa/rag"  # same CA, no entry for its trust domain
WORKLOADS = {
    RAG: {"tenant": "acme", "principals": ["service:rag"]},
    "spiffe://cluster.local/ns/{namespace}/sa/*": {"tenant": "{namespace}"},
}
RECORDS = [
    record_dict("1", allowed_principals=["service:rag"]),
    record_dict("2", allowed_principals=[RAG]),  # the workload's own id is a principal
    record_dict("3", tenant_id="globex", allowed_principals=[INDEXER]),
    record_dict("4", tenant_id="globex", allowed_principals=["group:hr"]),
]
POINTS = [qb.point(i, text_for(str(i))) for i in range(1, 5)]
# What a client sees of a handshake Envoy refused: the alert or the closed
# connection (an SSLError), or, when the close overtakes the alert, a reset.
REFUSED = (ssl.SSLError, ConnectionError)
FORGED = {
    "x-gate-tenant": "acme",
    "x-gate-principals": "service:rag",
    "x-forwarded-client-cert": f"By=spiffe://cluster.local/ns/db/sa/qdrant;URI={RAG}",
    "authorization": "Bearer not-a-workload",
}


@dataclass(frozen=True)
class Pki:
    ca: Authority
    other_ca: Authority
    server: Issued

    def listener_settings(self) -> dict[str, str]:
        """The proxy's mTLS listener settings."""
        return {
            "tls_cert_file": str(self.server.cert),
            "tls_key_file": str(self.server.key),
            "tls_client_ca_file": str(self.ca.bundle),
        }


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = Authority(directory, "mesh-ca")
    server = ca.issue("listener", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))], server=True)
    return Pki(ca, Authority(directory, "other-ca"), server)


def call(
    port: int,
    pki: Pki,
    client: Issued | None,
    headers: Mapping[str, str] | None = None,
) -> HttpResult:
    """POST a search over TLS, verifying the listener by the mesh CA, as ``client``."""
    context = ssl.create_default_context(cafile=str(pki.ca.bundle))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=15)
    try:
        connection.request(
            "POST",
            SEARCH,
            body=BODY,
            headers={"content-type": "application/json", **(headers or {})},
        )
        response = connection.getresponse()
        return HttpResult(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        connection.close()


def _mesh_stack(workdir: Path, pki: Pki, **kwargs: Any) -> GateStack:
    gate = GateStack(
        workdir,
        RECORDS,
        config={
            "identity": "mesh-mtls",
            "workloads": WORKLOADS,
            "tenant_key": "tenant_id",
            **pki.listener_settings(),
        },
        **kwargs,
    ).start()
    gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS))))
    return gate


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[GateStack]:
    gate = _mesh_stack(tmp_path_factory.mktemp("mesh-mtls"), pki)
    yield gate
    gate.stop()


def _decision(gate: GateStack, response: HttpResult) -> dict[str, Any]:
    decision_id = response.headers["x-retrieval-gate-decision-id"]
    return next(r for r in gate.audit_records() if r["decision_id"] == decision_id)


def _ssl_stat(gate: GateStack, name: str) -> int:
    return gate.envoy_stat(f"listener.127.0.0.1_{gate.listen_port}.ssl.{name}")


# --- Mapped workloads ---------------------------------------------------------------------------


def test_a_mapped_workload_gets_its_tenant_and_principals(stack: GateStack, pki: Pki) -> None:
    # RAG matches its exact entry and the namespace pattern: the exact entry wins.
    response = call(stack.listen_port, pki, pki.ca.workload("rag", RAG))
    assert response.status == 200, response.body
    assert search_ids(response) == [1, 2]
    record = _decision(stack, response)
    assert record["tenant"] == "acme"
    assert (
        record["principals_sha256"]
        == Caller("acme", frozenset({"service:rag", RAG})).principals_digest()
    )


def test_a_pattern_mapped_workload_gets_the_tenant_of_its_namespace(
    stack: GateStack, pki: Pki
) -> None:
    response = call(stack.listen_port, pki, pki.ca.workload("indexer", INDEXER))
    assert response.status == 200, response.body
    assert search_ids(response) == [3]
    record = _decision(stack, response)
    assert record["tenant"] == "globex"
    assert record["principals_sha256"] == Caller("globex", frozenset({INDEXER})).principals_digest()


# --- Refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sans", "code"),
    [
        ([x509.UniformResourceIdentifier(PARTNER)], "workload_unmapped"),
        ([x509.UniformResourceIdentifier("spiffe://cluster.local/rag")], "workload_unmapped"),
        ([x509.UniformResourceIdentifier("https://acme.example/rag")], "spiffe_id_malformed"),
        ([x509.UniformResourceIdentifier(RAG + "/")], "spiffe_id_malformed"),
        ([x509.DNSName("rag.acme.svc.cluster.local")], "spiffe_id_malformed"),
        ([], "spiffe_id_malformed"),
    ],
    ids=["other-trust-domain", "no-entry", "not-spiffe", "trailing-slash", "dns-only", "no-san"],
)
def test_a_verified_certificate_without_a_mapped_spiffe_id_is_401(
    stack: GateStack, pki: Pki, sans: list[x509.GeneralName], code: str
) -> None:
    stack.upstream.requests.clear()
    response = call(stack.listen_port, pki, pki.ca.issue(code, sans))
    assert (response.status, response.json()) == (401, {"error": code})
    assert stack.upstream.requests == []


def test_a_client_without_a_certificate_fails_the_handshake(stack: GateStack, pki: Pki) -> None:
    stack.upstream.requests.clear()
    before = _ssl_stat(stack, "fail_verify_no_cert")
    # TLS 1.3: the client's handshake completes before Envoy checks for its
    # certificate, so the refusal comes when the client sends its request or
    # reads the answer (REFUSED); Envoy's counter says why.
    with pytest.raises(REFUSED):
        call(stack.listen_port, pki, None, FORGED)
    assert _ssl_stat(stack, "fail_verify_no_cert") == before + 1
    assert stack.upstream.requests == []


def test_a_certificate_of_another_ca_fails_the_handshake(stack: GateStack, pki: Pki) -> None:
    stack.upstream.requests.clear()
    before = _ssl_stat(stack, "fail_verify_error")
    with pytest.raises(REFUSED):
        call(stack.listen_port, pki, pki.other_ca.workload("rag", RAG), FORGED)
    assert _ssl_stat(stack, "fail_verify_error") == before + 1
    assert stack.upstream.requests == []


# --- Headers never make the caller --------------------------------------------------------------


def test_no_header_can_impersonate_a_workload(stack: GateStack, pki: Pki) -> None:
    stack.upstream.requests.clear()
    indexer = call(stack.listen_port, pki, pki.ca.workload("indexer", INDEXER), FORGED)
    assert search_ids(indexer) == [3]  # still globex's indexer, not acme's rag
    assert _decision(stack, indexer)["tenant"] == "globex"
    seen = stack.upstream.requests[-1].headers
    assert not [name for name in seen if name.startswith("x-gate-")]
    assert "x-forwarded-client-cert" not in seen
    # Not the caller's identity in this mode: the database's own credential, passed on.
    assert seen["authorization"] == FORGED["authorization"]
    unmapped = call(stack.listen_port, pki, pki.ca.workload("partner", PARTNER), FORGED)
    assert (unmapped.status, unmapped.json()) == (401, {"error": "workload_unmapped"})


def test_only_the_first_uri_san_counts(stack: GateStack, pki: Pki) -> None:
    """Envoy hands over a certificate's first URI SAN (an X.509-SVID has exactly one)."""
    second = call(stack.listen_port, pki, pki.ca.workload("partner-then-rag", PARTNER, RAG))
    assert (second.status, second.json()) == (401, {"error": "workload_unmapped"})
    first = call(stack.listen_port, pki, pki.ca.workload("rag-then-partner", RAG, PARTNER))
    assert search_ids(first) == [1, 2]


def _certificates_optional(bootstrap: dict[str, Any]) -> None:
    """An Envoy that lets clients without a certificate in (e.g. a mesh in permissive mode)."""
    chain = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]
    chain["transport_socket"]["typed_config"]["require_client_certificate"] = False


def test_without_a_certificate_the_sidecar_answers_401_whatever_the_headers(
    tmp_path: Path, pki: Pki
) -> None:
    gate = _mesh_stack(tmp_path, pki, edit_bootstrap=_certificates_optional)
    try:
        response = call(gate.listen_port, pki, None, FORGED)
        assert (response.status, response.json()) == (401, {"error": "client_certificate_missing"})
        assert gate.upstream.requests == []
        assert search_ids(call(gate.listen_port, pki, pki.ca.workload("rag", RAG))) == [1, 2]
    finally:
        gate.stop()


# --- The proxy command --------------------------------------------------------------------------


def test_proxy_terminates_mtls_with_the_tls_settings(tmp_path: Path, pki: Pki) -> None:
    store = new_sqlite_url(tmp_path / "gate.db")
    chunks = write_records(tmp_path / "chunks.jsonl", RECORDS)
    subprocess.run([*CLI, "store", "load", "--store", store, str(chunks)], check=True)
    config = tmp_path / "gate.toml"
    config.write_text(
        "[identity.workloads]\n"
        f'"{RAG}" = {{tenant = "acme", principals = ["service:rag"]}}\n'
        '"spiffe://cluster.local/ns/{namespace}/sa/*" = {tenant = "{namespace}"}\n'
    )
    upstream = FixtureUpstream().start()
    upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS))))
    port = free_port()
    tls_flags = [
        f"--{name.replace('_', '-')}={path}" for name, path in pki.listener_settings().items()
    ]
    log_path = tmp_path / "proxy.log"
    with log_path.open("wb") as log:
        proxy = subprocess.Popen(
            [
                *CLI,
                "proxy",
                *("--upstream", upstream.url, "--listen", f"127.0.0.1:{port}"),
                *("--config", str(config), "--store", store, "--identity", "mesh-mtls"),
                *("--tenant-key", "tenant_id", *tls_flags),
            ],
            stdout=log,
            stderr=log,
        )
    try:
        assert wait_until(
            lambda: b"proxy ready" in log_path.read_bytes() or proxy.poll() is not None
        )
        assert proxy.poll() is None, log_path.read_text()
        assert f"proxy ready: https://127.0.0.1:{port}" in log_path.read_text()
        assert search_ids(call(port, pki, pki.ca.workload("rag", RAG), FORGED)) == [1, 2]
        with pytest.raises(REFUSED):
            call(port, pki, None)
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=20)
        upstream.stop()


def test_proxy_refuses_mesh_mtls_without_the_tls_settings(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(f'[identity.workloads]\n"{RAG}" = {{tenant = "acme"}}\n')
    result = subprocess.run(
        [
            *CLI,
            "proxy",
            *("--upstream", "http://127.0.0.1:1", "--listen", f"127.0.0.1:{free_port()}"),
            *("--config", str(config), "--identity", "mesh-mtls"),
            # A store that exists: its absence would be refused first.
            *("--store", new_sqlite_url(tmp_path / "gate.db")),
        ],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert b"Envoy must terminate mTLS" in result.stderr
