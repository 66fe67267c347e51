"""Shipped and generated Envoy configurations are accepted by the real Envoy."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sidecar.config import IdentityMode, Settings
from sidecar.demo.upstream import CannedResponse
from sidecar.runtime.bootstrap import Upstream, build_bootstrap
from sidecar.runtime.envoy_process import find_envoy
from sidecar.runtime.jwt_authn import write_generated_jwks
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.envoy_configs import (
    EXT_PROC,
    REFERENCE_IDENTITY,
    gate_parts,
    generated,
    http_filter,
    listener,
    with_local_secrets,
    yaml_documents,
)
from tests.fixtures.harness import GateStack, wait_until
from tests.fixtures.records import record_dict
from tests.fixtures.settings import settings_of

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.envoy


def validate(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_envoy(), "--mode", "validate", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_reference_envoy_yaml_is_valid(tmp_path: Path) -> None:
    (shipped,) = yaml_documents((ROOT / "deploy" / "envoy" / "envoy.yaml").read_text())
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(with_local_secrets(shipped, tmp_path)))
    done = validate(config)
    assert done.returncode == 0, done.stdout + done.stderr


def test_reference_envoy_yaml_is_what_proxy_generates() -> None:
    # One source of truth: the commented reference and the code may differ
    # only in addresses, so a fail-closed setting changed in one is caught.
    (shipped,) = yaml_documents((ROOT / "deploy" / "envoy" / "envoy.yaml").read_text())
    assert gate_parts(shipped) == gate_parts(generated(settings_of(**REFERENCE_IDENTITY)))


def test_the_comparison_sees_a_changed_fail_closed_setting() -> None:
    (shipped,) = yaml_documents((ROOT / "deploy" / "envoy" / "envoy.yaml").read_text())
    http_filter(listener(shipped), EXT_PROC)["failure_mode_allow"] = True
    assert gate_parts(shipped) != gate_parts(generated(settings_of(**REFERENCE_IDENTITY)))


@pytest.mark.parametrize("upstream", ["http://127.0.0.1:6333", "https://vectors.example:443"])
@pytest.mark.parametrize("sidecar", ["unix:/tmp/gate.sock", "127.0.0.1:9001"])
def test_generated_bootstrap_is_valid(tmp_path: Path, upstream: str, sidecar: str) -> None:
    settings = settings_of(identity=IdentityMode.TRUSTED_HEADERS, grpc_listen=sidecar)
    bootstrap = build_bootstrap(
        settings, listen=("127.0.0.1", 16334), upstream=Upstream.parse(upstream)
    )
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(bootstrap))
    done = validate(config)
    assert done.returncode == 0, done.stdout + done.stderr


def test_generated_bootstrap_fails_closed() -> None:
    bootstrap = build_bootstrap(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        listen=("127.0.0.1", 1),
        upstream=Upstream.parse("http://db:1"),
    )
    listener = bootstrap["static_resources"]["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    filters = {f["name"]: f["typed_config"] for f in hcm["http_filters"]}
    # One ext_proc stream admits and filters each request; no separate ext_authz call.
    assert "envoy.filters.http.ext_authz" not in filters
    assert filters["envoy.filters.http.ext_proc"]["failure_mode_allow"] is False
    assert filters["envoy.filters.http.ext_proc"]["status_on_error"] == {
        "code": "ServiceUnavailable"
    }
    assert filters["envoy.filters.http.ext_proc"]["processing_mode"]["response_body_mode"] == (
        "BUFFERED"
    )
    assert listener["per_connection_buffer_limit_bytes"] == Settings().listen.max_body_bytes


@pytest.mark.parametrize("bad", ["ftp://x", "http://", "http://db:6333/prefix", "db:6333"])
def test_upstream_url_errors(bad: str) -> None:
    with pytest.raises(ValueError, match="upstream"):
        Upstream.parse(bad)


@pytest.mark.parametrize("keys", ["jwks_file", "jwks_url", "pem", "hmac"])
def test_envoy_jwt_bootstrap_is_valid(tmp_path: Path, keys: str) -> None:
    from tests.fixtures import tokens

    key = tokens.KeyPair.ec()
    options: dict[str, object] = {"issuer": tokens.ISSUER, "audience": tokens.AUDIENCE}
    if keys == "jwks_file":
        (tmp_path / "jwks.json").write_text(json.dumps(tokens.jwks(key)))
        options["jwks"] = str(tmp_path / "jwks.json")
    elif keys == "jwks_url":
        options["jwks"] = "https://idp.example.com/.well-known/jwks.json"
    elif keys == "pem":
        (tmp_path / "key.pem").write_bytes(key.public_pem())
        options["jwt_public_key"] = tmp_path / "key.pem"
    else:
        (tmp_path / "secret").write_bytes(tokens.hmac_secret())
        options["jwt_hmac_secret_file"] = tmp_path / "secret"
    settings = settings_of(identity=IdentityMode.ENVOY_JWT, **options)
    generated = None
    if keys != "jwks_url":
        generated = tmp_path / "generated.json"
        write_generated_jwks(settings, generated)
        assert generated.stat().st_mode & 0o077 == 0  # only the owner may read the key
    bootstrap = build_bootstrap(
        settings,
        listen=("127.0.0.1", 16335),
        upstream=Upstream.parse("http://127.0.0.1:6333"),
        generated_jwks=generated,
    )
    assert "inline_string" not in json.dumps(bootstrap)  # no key material in the config
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    names = [f["name"] for f in hcm["typed_config"]["http_filters"]]
    assert names[:2] == ["envoy.filters.http.jwt_authn", "envoy.filters.http.ext_proc"]
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(bootstrap))
    done = validate(config)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("kind", "message"),
    [("short-hmac", "at least 32"), ("small-rsa", "unsupported key type")],
)
def test_envoy_jwt_refuses_weak_keys(tmp_path: Path, kind: str, message: str) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    if kind == "short-hmac":
        (tmp_path / "key").write_bytes(b"too short")
        settings = settings_of(
            identity=IdentityMode.ENVOY_JWT, jwt_hmac_secret_file=tmp_path / "key"
        )
    else:
        weak = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
        pem = weak.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        (tmp_path / "key").write_bytes(pem)
        settings = settings_of(identity=IdentityMode.ENVOY_JWT, jwt_public_key=tmp_path / "key")
    with pytest.raises(ValueError, match=message):
        write_generated_jwks(settings, tmp_path / "out.json")


def test_envoy_jwt_gets_only_the_jwks_file_keys_jwt_mode_would_use(tmp_path: Path) -> None:
    from tests.fixtures import tokens

    strong = tokens.KeyPair.rsa(kid="strong")
    weak = tokens.KeyPair.rsa(kid="weak", bits=1024)
    (tmp_path / "jwks.json").write_text(json.dumps(tokens.jwks(strong, weak)))
    settings = settings_of(identity=IdentityMode.ENVOY_JWT, jwks=str(tmp_path / "jwks.json"))

    write_generated_jwks(settings, tmp_path / "generated.json")

    generated = json.loads((tmp_path / "generated.json").read_text())
    assert [key["kid"] for key in generated["keys"]] == ["strong"]
    (tmp_path / "weak.json").write_text(json.dumps(tokens.jwks(weak)))
    with pytest.raises(ValueError, match="no usable signature verification key"):
        write_generated_jwks(
            settings_of(identity=IdentityMode.ENVOY_JWT, jwks=str(tmp_path / "weak.json")),
            tmp_path / "out.json",
        )


def test_generated_bootstrap_lists_every_worker(tmp_path: Path) -> None:
    settings = settings_of(
        identity=IdentityMode.TRUSTED_HEADERS, grpc_listen="unix:/tmp/gate.sock", workers=3
    )
    bootstrap = build_bootstrap(
        settings, listen=("127.0.0.1", 16336), upstream=Upstream.parse("http://127.0.0.1:6333")
    )
    (sidecar,) = [
        c
        for c in bootstrap["static_resources"]["clusters"]
        if c["name"] == "retrieval_gate_sidecar"
    ]
    endpoints = sidecar["load_assignment"]["endpoints"][0]["lb_endpoints"]
    paths = [e["endpoint"]["address"]["pipe"]["path"] for e in endpoints]
    assert paths == ["/tmp/gate.sock.0", "/tmp/gate.sock.1", "/tmp/gate.sock.2"]
    assert sidecar["lb_policy"] == "LEAST_REQUEST"
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(bootstrap))
    done = validate(config)
    assert done.returncode == 0, done.stdout + done.stderr


def test_connections_beyond_the_cap_are_closed_and_underscored_headers_dropped(
    tmp_path: Path,
) -> None:
    # Envoy's overload manager as `proxy` generates it, in a real Envoy: with
    # listen.max_connections 2, a third connection is closed at accept while
    # the first two are held.
    stack = GateStack(tmp_path, [record_dict("c-01")], config={"max_connections": 2})
    stack.start()
    held: list[socket.socket] = []
    try:
        held = [socket.create_connection(("127.0.0.1", stack.listen_port)) for _ in range(2)]
        time.sleep(0.5)  # the resource monitor refreshes every 0.25 s
        with socket.create_connection(("127.0.0.1", stack.listen_port), timeout=5) as third:
            try:
                third.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = third.recv(1024)
            except ConnectionResetError:
                answer = b""
        assert answer == b""  # closed, never answered
        for conn in held:
            conn.close()
        # Capacity back: a request is answered, and a header spelt with
        # underscores never reaches the database.
        path = "/collections/docs/points/search"
        stack.upstream.respond("POST", path, CannedResponse(qb.encode(qb.search_body([]))))

        def answered() -> bool:
            # Closed connections leave the count when the monitor next refreshes.
            try:
                return stack.search(path, headers={"x_gate_tenant": "globex"}).status == 200
            except OSError:
                return False

        assert wait_until(answered)
        seen = [r for r in stack.upstream.requests if r.path == path][-1]
        assert not [name for name in seen.headers if "_" in name]
    finally:
        for conn in held:
            conn.close()
        stack.stop()
