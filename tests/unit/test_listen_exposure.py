"""Envoy's listener admits Envoy alone, and the sidecar fetches over plain http only from
this host, unless told.

Envoy's ext_proc and ext_authz streams carry no credential: the sidecar
believes the caller Envoy's ext_authz metadata names, so any peer that
reaches the listener would be believed as Envoy. A unix socket (the default)
admits the sidecar's user and group; a TCP port, loopback included, needs
mTLS with a pinned client identity or ``listen.expose_grpc``.
"""

from __future__ import annotations

import socket
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from sidecar.cli import main
from sidecar.cli.serve import check_exposure, check_gate_listener, check_plain_http
from sidecar.config import ConfigError, Settings, load_settings
from sidecar.runtime.addresses import parse_socket_address, reachable_from_elsewhere


@pytest.mark.parametrize(
    "address", ["127.0.0.1:9001", "127.8.0.1:9001", "[::1]:9001", "localhost:9001", "unix:/s"]
)
def test_loopback_and_unix_sockets_stay_on_this_host(address: str) -> None:
    assert not reachable_from_elsewhere(parse_socket_address(address))


@pytest.mark.parametrize(
    "address", ["0.0.0.0:9001", "[::]:9001", "10.0.0.5:9001", "gate.internal:9001"]
)
def test_any_other_address_can_be_reached_from_elsewhere(address: str) -> None:
    assert reachable_from_elsewhere(parse_socket_address(address))


def settings(**values: object) -> Settings:
    return load_settings(None, {"identity": "trusted-headers", **values})


MTLS = {
    "grpc_cert_file": "/etc/gate/tls.crt",
    "grpc_key_file": "/etc/gate/tls.key",
    "grpc_client_ca_file": "/etc/gate/ca.crt",
    "grpc_client_id": "spiffe://cluster.local/ns/gate/sa/envoy",
}


@pytest.mark.parametrize("address", ["0.0.0.0:9001", "127.0.0.1:9001", "[::1]:9001"])
def test_a_tcp_listener_is_refused_without_mtls_or_the_setting(address: str) -> None:
    # Loopback too: every process of the host reaches it.
    with pytest.raises(ConfigError, match=r"believed as Envoy.*unix:.*listen.expose_grpc"):
        check_exposure(settings(grpc_listen=address))


def test_a_unix_socket_mtls_or_the_setting_allow_it() -> None:
    check_exposure(settings())  # the default: a unix socket
    assert settings().listen.grpc.startswith("unix:/")
    check_exposure(settings(grpc_listen="unix:/run/gate/envoy.sock"))
    check_exposure(settings(grpc_listen="0.0.0.0:9001", **MTLS))
    check_exposure(settings(grpc_listen="0.0.0.0:9001", expose_grpc_listen=True))
    check_exposure(settings(grpc_listen="127.0.0.1:9001", expose_grpc_listen=True))


def test_half_of_mtls_is_refused_naming_what_is_missing() -> None:
    partial = {k: v for k, v in MTLS.items() if k != "grpc_client_id"}
    with pytest.raises(ConfigError, match=r"needs listen\.grpc_client_id \(--grpc-client-id\)"):
        settings(grpc_listen="0.0.0.0:9001", **partial)


@pytest.mark.parametrize("command", ["serve", "proxy"])
@pytest.mark.parametrize("address", ["0.0.0.0:9001", "127.0.0.1:9001"])
def test_serve_and_proxy_exit_2_before_listening(
    command: str, address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [command, "--identity", "trusted-headers", "--grpc-listen", address]
    if command == "proxy":
        args += ["--upstream", "http://127.0.0.1:6333", "--listen", "127.0.0.1:6334"]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert "--expose-grpc-listen" in error
    assert len(error.strip().splitlines()) == 1


def test_a_settings_file_with_the_old_default_exits_2_naming_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gate.toml"
    config.write_text('[identity]\nmode = "trusted-headers"\n[listen]\ngrpc = "127.0.0.1:9001"\n')
    assert main(["serve", "--config", str(config)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "listen.grpc 127.0.0.1:9001 is a TCP port every process of this host can reach" in line
    assert "unix:/run/retrieval-gate/envoy.sock" in line


PROXY = ["proxy", "--upstream", "http://127.0.0.1:6333", "--listen", "127.0.0.1:6334"]


def test_proxy_does_not_use_the_files_listen_grpc_so_does_not_refuse_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A plain-http bundle URL makes proxy stop at the check after the exposure
    # check, before anything starts: which check spoke shows which passed.
    config = tmp_path / "gate.toml"
    config.write_text(
        '[identity]\nmode = "trusted-headers"\n[listen]\ngrpc = "0.0.0.0:9001"\n'
        '[policy]\nbundle = "http://bundles.example/gate.tar.gz"\n'
    )
    assert main([*PROXY, "--config", str(config)]) == 2
    assert "fetches the policy over plain http" in capsys.readouterr().err
    # Control: the same address given as the flag is used, and refused.
    assert main([*PROXY, "--config", str(config), "--grpc-listen", "0.0.0.0:9001"]) == 2
    assert "believed as Envoy" in capsys.readouterr().err


def test_proxy_refuses_mtls_settings_its_envoy_could_not_meet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        '[identity]\nmode = "trusted-headers"\n[listen]\n'
        + "".join(f'{key} = "{value}"\n' for key, value in MTLS.items())
    )
    assert main([*PROXY, "--config", str(config)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "proxy's own Envoy" in line


@pytest.mark.parametrize(
    ("gate", "problem"),
    [
        ("unix:/run/retrieval-gate/envoy.sock", "is listen.grpc"),
        ("0.0.0.0:+9002", "not an address the gate can check"),
    ],
)
def test_the_gate_listener_is_never_envoys(gate: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=rf"listen\.gate .*{problem}"):
        check_gate_listener(settings(gate_listen=gate))
    check_gate_listener(settings(gate_listen="unix:/run/gate-apps/gate.sock"))
    check_gate_listener(settings(gate_listen="0.0.0.0:9002"))


# Keys, policy and decisions fetched over the network: plain http only on this host.


@pytest.mark.parametrize(
    "values",
    [
        {"jwks": "http://idp.example/jwks.json"},
        {"policy_bundle": "HTTP://bundles.internal:8080/gate.tar.gz"},
        {"policy_engine": "opa", "opa_url": "http://10.0.0.7:8181"},
    ],
    ids=["jwks", "policy_bundle", "opa_url"],
)
def test_plain_http_to_another_host_is_refused_without_the_setting(
    values: dict[str, str],
) -> None:
    name = {"jwks": "identity.jwks", "policy_bundle": "policy.bundle", "opa_url": "policy.opa_url"}[
        next(k for k in values if k != "policy_engine")
    ]
    with pytest.raises(ConfigError, match=rf"{name} .*plain http.*allow_plain_http"):
        check_plain_http(settings(**values))
    check_plain_http(settings(**values, allow_plain_http=True))


@pytest.mark.parametrize(
    "values",
    [
        {"jwks": "https://idp.example/jwks.json"},
        {"jwks": "http://127.0.0.1:8080/jwks.json"},
        {"policy_bundle": "http://localhost:8888/gate.tar.gz"},
        {"policy_bundle": "/etc/retrieval-gate/gate.tar.gz"},
        {"policy_engine": "opa", "opa_url": "http://[::1]:8181"},
    ],
)
def test_https_files_and_loopback_need_no_setting(values: dict[str, str]) -> None:
    check_plain_http(settings(**values))


@pytest.mark.parametrize("command", ["serve", "proxy"])
def test_serve_and_proxy_refuse_plain_http_before_they_start(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [command, "--identity", "jwt", "--jwks", "http://idp.example/jwks.json"]
    args += ["--issuer", "https://idp.example", "--audience", "retrieval-gate"]
    if command == "proxy":
        args += ["--upstream", "http://127.0.0.1:6333", "--listen", "127.0.0.1:6334"]
    assert main(args) == 2
    assert "fetches the token keys over plain http" in capsys.readouterr().err


# Spellings gRPC binds that the address parser does not read: refused, never waved through.
GRPC_SPELLINGS = [
    "0.0.0.0:+{port}",
    "0.0.0.0: {port}",
    "0.0.0.0",
    "[::]:{port}",
    "0.0.0.0:0{port}",
]


def _grpc_binds(address: str) -> bool:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    try:
        port: int = server.add_insecure_port(address)
    except RuntimeError:
        return False
    finally:
        server.stop(None)
    return port != 0


@pytest.mark.parametrize("spelling", GRPC_SPELLINGS)
def test_every_spelling_grpc_binds_is_checked_or_refused(spelling: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = spelling.format(port=port)
    if not _grpc_binds(address):
        pytest.fail(f"gRPC no longer binds {address!r}: the list needs a spelling it does bind")
    # Each of these binds beyond loopback (a control above shows loopback passes).
    with pytest.raises(ConfigError, match=r"listen\.grpc"):
        check_exposure(settings(grpc_listen=address))
