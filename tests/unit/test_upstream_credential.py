"""The database credential `proxy`'s Envoy adds ([upstream]), and Envoy's limits, as
settings and in the generated bootstrap. The credential reaching a real database
is tests/envoy/test_upstream_credential.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.cli.exit_codes import ExitCode
from sidecar.config import ConfigError, Settings, load_settings
from sidecar.runtime.bootstrap import (
    Upstream,
    build_bootstrap,
    check_upstream_credential,
)

SECRET = "db-key-7f3a9c"


def settings(**values: Any) -> Settings:
    return load_settings(None, {"identity": "trusted-headers", **values})


def bootstrap(settings: Settings) -> dict[str, Any]:
    return build_bootstrap(
        settings, listen=("127.0.0.1", 16334), upstream=Upstream.parse("http://db:6333")
    )


def filters(config: dict[str, Any]) -> list[dict[str, Any]]:
    (listener,) = config["static_resources"]["listeners"]
    (chain,) = listener["filter_chains"]
    (hcm,) = chain["filters"]
    found: list[dict[str, Any]] = hcm["typed_config"]["http_filters"]
    return found


def connection_manager(config: dict[str, Any]) -> dict[str, Any]:
    (listener,) = config["static_resources"]["listeners"]
    found: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return found


@pytest.fixture
def credential(tmp_path: Path) -> Path:
    path = tmp_path / "credential"
    path.write_text(SECRET + "\n")
    return path


def test_no_credential_by_default() -> None:
    config = bootstrap(settings())
    assert "secrets" not in config["static_resources"]
    names = [f["name"] for f in filters(config)]
    assert "envoy.filters.http.credential_injector" not in names


def test_the_injector_runs_after_the_gate_and_overwrites_the_clients_value(
    credential: Path,
) -> None:
    config = bootstrap(
        settings(
            upstream_credential_file=str(credential),
            upstream_credential_header="Authorization",
            upstream_credential_prefix="ApiKey ",
        )
    )
    names = [f["name"] for f in filters(config)]
    # ext_proc strips the client's identity headers first; the router sends.
    assert names == [
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.credential_injector",
        "envoy.filters.http.router",
    ]
    injector = filters(config)[1]["typed_config"]
    assert injector["overwrite"] is True
    assert injector["allow_request_without_credential"] is False
    generic = injector["credential"]["typed_config"]
    assert generic["header"] == "authorization"  # lowercased: HTTP/2 needs it
    assert generic["header_value_prefix"] == "ApiKey "
    (secret,) = config["static_resources"]["secrets"]
    assert generic["credential"] == {"name": secret["name"]}
    assert secret["generic_secret"] == {"secret": {"filename": str(credential)}}


def test_the_bootstrap_names_the_file_never_its_value(credential: Path) -> None:
    config = bootstrap(
        settings(upstream_credential_file=str(credential), upstream_credential_header="api-key")
    )
    text = json.dumps(config)
    assert SECRET not in text
    assert str(credential) in text


def test_a_link_is_named_as_given_not_resolved(tmp_path: Path, credential: Path) -> None:
    # A Kubernetes secret volume's file is a link the kubelet re-points.
    link = tmp_path / "mounted"
    link.symlink_to(credential)
    config = bootstrap(
        settings(upstream_credential_file=str(link), upstream_credential_header="api-key")
    )
    (secret,) = config["static_resources"]["secrets"]
    assert secret["generic_secret"]["secret"]["filename"] == str(link)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (
            {"upstream_credential_file": "/run/key"},
            "upstream.credential_file needs upstream.credential_header",
        ),
        (
            {"upstream_credential_header": "api-key"},
            "upstream.credential_header and upstream.credential_prefix need "
            "upstream.credential_file",
        ),
        (
            {"upstream_credential_prefix": "Bearer "},
            "upstream.credential_header and upstream.credential_prefix need "
            "upstream.credential_file",
        ),
    ],
)
def test_the_settings_go_together(values: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        settings(**values)
    (found,) = raised.value.problems
    assert found.startswith(problem)


@pytest.mark.parametrize(
    "header", ["host", "Content-Length", ":authority", "x-envoy-original-path", "x-gate-tenant"]
)
def test_a_header_that_cannot_carry_the_credential_is_refused(header: str) -> None:
    with pytest.raises(ConfigError) as raised:
        settings(upstream_credential_file="/run/key", upstream_credential_header=header)
    assert raised.value.problems[0].startswith("upstream.credential_header")


def test_a_prefix_with_a_line_break_is_refused() -> None:
    with pytest.raises(ConfigError) as raised:
        settings(
            upstream_credential_file="/run/key",
            upstream_credential_header="authorization",
            upstream_credential_prefix="Bearer\r\nx-gate-tenant: acme ",
        )
    assert raised.value.problems[0].startswith("upstream.credential_prefix")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read"),
        (b"", "is empty"),
        (b" \n", "is empty"),
        (f"{SECRET}\n{SECRET}-2\n".encode(), "one line"),
        (f"{SECRET}\x07".encode(), "one line"),
    ],
)
def test_an_unusable_file_is_refused_without_its_value(
    tmp_path: Path, content: bytes | None, problem: str
) -> None:
    path = tmp_path / "credential"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as raised:
        check_upstream_credential(
            settings(upstream_credential_file=str(path), upstream_credential_header="api-key")
        )
    (line,) = str(raised.value).splitlines()
    assert line.startswith("upstream.credential_file: ") and str(path) in line
    assert problem in line and SECRET not in line


def test_a_readable_file_passes(credential: Path) -> None:
    check_upstream_credential(
        settings(upstream_credential_file=str(credential), upstream_credential_header="api-key")
    )


def test_proxy_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["proxy", "--identity", "trusted-headers", "--upstream", "http://127.0.0.1:1"]
    argv += ["--listen", "127.0.0.1:1", "--upstream-credential-header", "api-key"]
    argv += ["--upstream-credential-file", str(tmp_path / "absent")]
    assert main(argv) == ExitCode.CANNOT_RUN
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: upstream.credential_file: cannot read ")


def test_serve_refuses_a_credential_it_would_not_use(
    credential: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--identity", "trusted-headers", "--upstream-credential-header", "api-key"]
    argv += ["--upstream-credential-file", str(credential)]
    assert main(argv) == ExitCode.CANNOT_RUN
    err = capsys.readouterr().err
    assert "used by `proxy` only" in err and SECRET not in err


# --- Envoy's overload manager and caps -----------------------------------------------------------


def test_the_overload_manager_caps_connections_and_heap() -> None:
    config = bootstrap(
        settings(max_connections=10, max_heap_bytes=64 * 1024 * 1024, max_concurrent_streams=7)
    )
    manager = config["overload_manager"]
    monitors = {m["name"]: m["typed_config"] for m in manager["resource_monitors"]}
    connections = monitors["envoy.resource_monitors.global_downstream_max_connections"]
    assert connections["max_active_downstream_connections"] == 10
    assert monitors["envoy.resource_monitors.fixed_heap"]["max_heap_size_bytes"] == 64 * 2**20
    actions = {a["name"]: a["triggers"][0]["threshold"]["value"] for a in manager["actions"]}
    assert actions == {
        "envoy.overload_actions.shrink_heap": 0.90,
        "envoy.overload_actions.stop_accepting_requests": 0.95,
    }
    hcm = connection_manager(config)
    assert hcm["http2_protocol_options"]["max_concurrent_streams"] == 7
    assert hcm["common_http_protocol_options"]["headers_with_underscores_action"] == "DROP_HEADER"
    assert hcm["request_headers_timeout"] == "10s"


def test_the_limits_have_floors() -> None:
    with pytest.raises(ConfigError) as raised:
        settings(max_connections=0, max_heap_bytes=1024, max_concurrent_streams=0)
    assert {p.split(":")[0] for p in raised.value.problems} == {
        "listen.max_connections (--max-connections)",
        "listen.max_heap_bytes (--max-heap-bytes)",
        "listen.max_concurrent_streams (--max-concurrent-streams)",
    }
