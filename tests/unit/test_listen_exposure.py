"""The sidecar listens on this host, and fetches over plain http only from it, unless told.

Envoy's ext_proc and ext_authz streams carry no credential: the sidecar
believes the caller Envoy's ext_authz metadata names, so any peer that
reaches the listener would be believed as Envoy.
"""

from __future__ import annotations

import socket
from concurrent import futures

import grpc
import pytest

from sidecar.cli import main
from sidecar.cli.serve import check_exposure, check_plain_http
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


def test_an_exposed_listener_is_refused_without_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"believed as Envoy.*listen.expose_grpc"):
        check_exposure(settings(grpc_listen="0.0.0.0:9001"))


def test_the_setting_allows_it_and_loopback_needs_none() -> None:
    check_exposure(settings(grpc_listen="0.0.0.0:9001", expose_grpc_listen=True))
    check_exposure(settings(grpc_listen="127.0.0.1:9001"))


@pytest.mark.parametrize("command", ["serve", "proxy"])
def test_serve_and_proxy_exit_2_before_listening(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [command, "--identity", "trusted-headers", "--grpc-listen", "0.0.0.0:9001"]
    if command == "proxy":
        args += ["--upstream", "http://127.0.0.1:6333", "--listen", "127.0.0.1:6334"]
    assert main(args) == 2
    assert "--expose-grpc-listen" in capsys.readouterr().err


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
        return port != 0
    except RuntimeError:
        return False
    finally:
        server.stop(None)


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
