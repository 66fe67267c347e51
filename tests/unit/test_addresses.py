"""host:port, unix:/path and http(s) URLs: one parser, the same forms everywhere."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from sidecar.config import IdentityMode
from sidecar.runtime.addresses import (
    HostPort,
    UnixSocket,
    parse_host_port,
    parse_http_url,
    parse_socket_address,
)
from sidecar.runtime.bootstrap import Upstream, build_bootstrap
from sidecar.runtime.envoy_process import read_admin_address
from sidecar.runtime.workers import worker_addresses, worker_settings
from tests.fixtures.settings import settings_of


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9001", HostPort("127.0.0.1", 9001)),
        ("localhost:0", HostPort("localhost", 0)),
        ("[::1]:9464", HostPort("::1", 9464)),
        ("::1:9464", HostPort("::1", 9464)),  # accepted before brackets were parsed
        ("gate.internal:65535", HostPort("gate.internal", 65535)),
    ],
)
def test_host_port_forms(text: str, expected: HostPort) -> None:
    assert parse_host_port(text) == expected
    assert parse_host_port(str(expected)) == expected


@pytest.mark.parametrize(
    "text", ["9001", ":9001", "host:", "host:port", "host:-1", "host:65536", "[::1]9001", "[:1", ""]
)
def test_host_port_errors_name_the_value(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"expected host:port, got {text!r}")):
        parse_host_port(text)


def test_default_port_applies_only_when_none_is_given() -> None:
    assert parse_host_port("db", default_port=80) == HostPort("db", 80)
    assert parse_host_port("[::1]", default_port=443) == HostPort("::1", 443)
    assert parse_host_port("db:6333", default_port=80) == HostPort("db", 6333)
    with pytest.raises(ValueError, match="expected host:port"):
        parse_host_port("db")


def test_host_port_prints_ipv6_in_brackets_and_picks_the_family() -> None:
    assert str(HostPort("::1", 9001)) == "[::1]:9001"
    assert HostPort("::1", 9001).family is socket.AF_INET6
    assert HostPort("127.0.0.1", 9001).family is socket.AF_INET


def test_socket_addresses() -> None:
    assert parse_socket_address("unix:/run/gate.sock") == UnixSocket("/run/gate.sock")
    assert str(UnixSocket("/run/gate.sock")) == "unix:/run/gate.sock"
    assert parse_socket_address("[::1]:9001") == HostPort("::1", 9001)
    with pytest.raises(ValueError, match="expected host:port"):
        parse_socket_address("/run/gate.sock")


def test_each_worker_serves_the_gate_on_its_own_address_beside_envoys() -> None:
    settings = settings_of(
        identity=IdentityMode.TRUSTED_HEADERS,
        grpc_listen="unix:/run/retrieval-gate/envoy.sock",
        gate_listen="127.0.0.1:9100",
        workers=2,
    )
    listens = [worker_settings(settings, i).listen for i in range(2)]
    assert [(w.grpc, w.gate) for w in listens] == [
        ("unix:/run/retrieval-gate/envoy.sock.0", "127.0.0.1:9100"),
        ("unix:/run/retrieval-gate/envoy.sock.1", "127.0.0.1:9101"),
    ]
    alone = settings_of(identity=IdentityMode.TRUSTED_HEADERS, workers=2)
    assert worker_settings(alone, 1).listen.gate is None


def test_worker_addresses_keep_ipv6_brackets() -> None:
    assert worker_addresses("[::1]:9001", 2) == ["[::1]:9001", "[::1]:9002"]
    with pytest.raises(ValueError, match="expected host:port"):
        worker_addresses("localhost", 2)


@pytest.mark.parametrize(
    ("url", "host", "port", "tls", "path"),
    [
        ("http://db:6333", "db", 6333, False, ""),
        ("https://Vectors.Example", "vectors.example", 443, True, ""),
        ("http://db/", "db", 80, False, "/"),
        ("https://[::1]:8443/.well-known/jwks.json", "::1", 8443, True, "/.well-known/jwks.json"),
    ],
)
def test_http_urls(url: str, host: str, port: int, tls: bool, path: str) -> None:
    endpoint = parse_http_url(url)
    assert (endpoint.host, endpoint.port, endpoint.tls, endpoint.path) == (host, port, tls, path)


@pytest.mark.parametrize(
    "url",
    ["ftp://db", "http://", "db:6333", "http://[::1", "http://db:x"],
)
def test_http_url_errors_name_the_url(url: str) -> None:
    with pytest.raises(ValueError, match="expected an http:// or https:// URL"):
        parse_http_url(url)


@pytest.mark.parametrize(
    "url", ["http://user:s3cret@db:6333", "https://s3cret@idp.example/jwks", "ftp://u:s3cret@db"]
)
def test_credentials_in_a_url_are_refused_and_never_quoted(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_http_url(url)
    assert "s3cret" not in str(refused.value)
    assert "***@" in str(refused.value)


def test_upstream_takes_ipv6_and_the_scheme_default_port() -> None:
    assert Upstream.parse("http://[::1]:6333") == Upstream("::1", 6333, False)
    assert Upstream.parse("https://vectors.example") == Upstream("vectors.example", 443, True)


def test_sidecar_endpoints_in_the_bootstrap() -> None:
    settings = settings_of(
        identity=IdentityMode.TRUSTED_HEADERS, grpc_listen="[::1]:9001", workers=2
    )
    bootstrap = build_bootstrap(
        settings, listen=("127.0.0.1", 1), upstream=Upstream.parse("http://db:1")
    )
    (sidecar,) = [
        c
        for c in bootstrap["static_resources"]["clusters"]
        if c["name"] == "retrieval_gate_sidecar"
    ]
    endpoints = sidecar["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["address"]["socket_address"] for e in endpoints] == [
        {"address": "::1", "port_value": 9001},
        {"address": "::1", "port_value": 9002},
    ]


def test_admin_address_is_read_once_envoy_wrote_it(tmp_path: Path) -> None:
    written = tmp_path / "admin"
    assert read_admin_address(written) is None
    written.write_text("127.0.0.1:")  # not all of it yet
    assert read_admin_address(written) is None
    written.write_text("127.0.0.1:15000\n")
    assert read_admin_address(written) == HostPort("127.0.0.1", 15000)
    written.write_text("[::1]:15000")
    assert read_admin_address(written) == HostPort("::1", 15000)
