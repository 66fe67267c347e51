"""The setting flags are generated from the settings' groups: every setting has a
flag (today's name, from before the groups) or is file-only with a reason, and
every flag reaches its setting."""

from __future__ import annotations

import argparse
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import build_parser, main
from sidecar.cli.exit_codes import ExitCode
from sidecar.cli.flags import settings_from_flags
from sidecar.config import SETTINGS, ConfigError, Setting, Settings
from sidecar.runtime.signals import DIED, STOPPED

FLAGGED = [spec for spec in SETTINGS if spec.flag is not None]
FILE_ONLY = {"principal_claims", "workloads"}

# Every setting flag of `serve` and `proxy`, as `retrieval-gate serve --help` listed
# them before the settings were grouped. Scripts and manifests use these names:
# a change here breaks them.
SETTING_FLAGS = {
    *("--identity", "--store", "--mode", "--text-field", "--id-field", "--policy-dir"),
    *("--policy-data", "--policy-engine", "--opa-url", "--opa-token-file", "--opa-timeout-ms"),
    *("--opa-ca-file", "--policy-bundle", "--policy-bundle-public-key"),
    *("--policy-bundle-key-algorithm", "--policy-bundle-key-id", "--policy-bundle-scope"),
    *("--policy-bundle-poll-seconds", "--custom-reasons", "--metric-collections", "--jwks"),
    *("--jwt-public-key", "--jwt-hmac-secret-file", "--issuer", "--audience", "--jwks-relay"),
    *("--jwt-credentials", "--jwt-leeway-seconds", "--jwt-payload-key", "--tenant-claim"),
    *("--drafts-scope", "--tls-cert-file", "--tls-key-file", "--tls-client-ca-file"),
    *("--tenant-key", "--overfetch-factor", "--overfetch-cap", "--max-hits"),
    *("--substitute-superseded", "--verdict-cache-size", "--request-cache-size"),
    *("--cache-ttl-seconds", "--cache-size", "--negative-cache-ttl-seconds"),
    *("--negative-cache-size", "--stale-if-error-seconds", "--max-body-bytes"),
    *("--allow-plain-http", "--expose-grpc-listen", "--grpc-listen", "--workers"),
    *("--event-loop", "--metrics", "--audit-log", "--audit-store", "--audit-chain-id"),
    *("--segment-bytes", "--segment-seconds", "--max-spool-bytes", "--retention-seconds"),
    "--message-timeout-ms",
    # Since issue 25: Envoy's caps and the database's credential (`proxy`), and the
    # PostgreSQL connection budget.
    *("--max-connections", "--max-heap-bytes", "--max-concurrent-streams"),
    *("--upstream-credential-file", "--upstream-credential-header"),
    "--upstream-credential-prefix",
    *("--store-pool-min", "--store-pool-max", "--store-pgbouncer", "--store-listen-url"),
    # Since issue 26: the per-decision log line.
    "--log-decisions",
    # Since issue 27: Envoy's channel (mTLS with a pinned client) and the Gate's listener.
    *("--grpc-cert-file", "--grpc-key-file", "--grpc-client-ca-file", "--grpc-client-id"),
    "--gate-listen",
    # Signed audit checkpoints (issue 29).
    *("--checkpoint-key-file", "--checkpoint-key-id", "--checkpoint-every-records"),
    "--checkpoint-every-seconds",
}
NEGATIONS = {
    *("--no-allow-plain-http", "--no-expose-grpc-listen", "--no-substitute-superseded"),
    *("--no-store-pgbouncer", "--no-log-decisions"),
}
PROXY_ONLY = {
    "--upstream",
    "--grpc-upstream",
    "--listen",
    "--envoy-concurrency",
    "--drain-seconds",
}
# `check` asks the database where `proxy` would forward (issue 26).
CHECK_ONLY = {"--upstream", "--grpc-upstream", "--database", "--collection", "--timeout", "--json"}

# Given before the flag under test (which, coming last, wins): enough for
# load_settings to accept any one of the others.
BASE = [
    *("--identity", "trusted-headers"),
    *("--jwks", "keys.json", "--issuer", "https://idp/", "--audience", "gate"),
    *("--audit-log", "spool.jsonl"),
]
# What a flag needs beside it to be accepted (a check between settings).
COMPANIONS = {
    "policy_engine": ["--opa-url", "http://127.0.0.1:8181"],
    "policy_bundle_public_key": ["--policy-bundle", "bundle.tar.gz"],
    "upstream_credential_file": ["--upstream-credential-header", "api-key"],
    "upstream_credential_header": ["--upstream-credential-file", "credential"],
    "upstream_credential_prefix": [
        *("--upstream-credential-file", "credential", "--upstream-credential-header", "api-key")
    ],
    "store_pool_min": ["--store-pool-max", "8"],
    "checkpoint_key_id": ["--checkpoint-key-file", "checkpoint.pem"],
    **{
        name: [
            *("--grpc-cert-file", "c.pem", "--grpc-key-file", "k.pem"),
            *("--grpc-client-ca-file", "ca.pem", "--grpc-client-id", "spiffe://td/envoy"),
        ]
        for name in ("grpc_cert_file", "grpc_key_file", "grpc_client_ca_file", "grpc_client_id")
    },
    **{
        name: ["--policy-bundle", "bundle.tar.gz", "--policy-bundle-public-key", "k.pem"]
        for name in ("policy_bundle_key_algorithm", "policy_bundle_key_id", "policy_bundle_scope")
    },
}


def parse(*argv: str, command: str = "serve") -> Settings:
    extra = (
        ["--upstream", "http://db:6333", "--listen", "127.0.0.1:1"] if command == "proxy" else []
    )
    return settings_from_flags(build_parser().parse_args([command, *argv, *extra]))


def value(settings: Settings, spec: Setting) -> Any:
    return getattr(getattr(settings, spec.group), spec.key)


# Settings whose bounds the generic sample values do not meet.
SAMPLES = {
    "segment_bytes": ("65536", 65536),
    "max_spool_bytes": ("67108864", 67108864),
}


def sample(spec: Setting) -> tuple[str, Any]:
    """A flag value differing from the default and from BASE, and the setting it gives."""
    if spec.name in SAMPLES:
        return SAMPLES[spec.name]
    value_type = spec.value_type
    if isinstance(value_type, type) and issubclass(value_type, Enum):
        taken = {spec.default, "trusted-headers"}  # StrEnum members equal their values
        member = next(m for m in value_type if m not in taken)
        return member.value, member
    if value_type is int:
        number = max(7, int(spec.info.minimum or 0))
        return str(number), number
    if value_type is float:
        return "2.5", 2.5
    if value_type is Path:
        return "/srv/gate/sample", Path("/srv/gate/sample")
    if spec.name == "store_listen_url":  # a PostgreSQL URL
        return "postgresql://gate@db/gate", "postgresql://gate@db/gate"
    if value_type is str:
        return "sample", "sample"
    if spec.name == "jwt_credentials":  # a list of known names
        return "api-key, bearer", ("api-key", "bearer")
    if value_type == tuple[str, ...]:
        return "ACME_HOLD, LEGAL_HOLD", ("ACME_HOLD", "LEGAL_HOLD")
    raise AssertionError(f"no sample for {spec.name}: {value_type}")


def option_strings(command: str) -> set[str]:
    commands = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    parser = commands.choices[command]
    return {flag for action in parser._actions for flag in action.option_strings}


@pytest.mark.parametrize("command", ["serve", "proxy", "check"])
def test_the_flags_are_todays_flags(command: str) -> None:
    expected = {"-h", "--help", "--config", *SETTING_FLAGS, *NEGATIONS}
    expected |= {"proxy": PROXY_ONLY, "check": CHECK_ONLY}.get(command, set())
    assert option_strings(command) == expected


def test_every_setting_has_a_flag_or_is_file_only_with_a_reason() -> None:
    assert {spec.flag for spec in FLAGGED} == SETTING_FLAGS
    for spec in SETTINGS:
        assert spec.info.help, spec.path
        if spec.key in FILE_ONLY:
            assert spec.info.file_only, spec.path
            assert spec.flag is None
        else:
            assert spec.info.file_only is None, spec.path
            assert spec.flag == "--" + spec.name.replace("_", "-")


def test_flags_whose_name_is_not_their_key() -> None:
    renamed = {spec.flag: spec.path for spec in FLAGGED if spec.name != spec.key}
    assert renamed == {
        "--grpc-listen": "listen.grpc",
        "--expose-grpc-listen": "listen.expose_grpc",
        "--gate-listen": "listen.gate",
        "--identity": "identity.mode",
        "--policy-engine": "policy.engine",
        "--policy-dir": "policy.dir",
        "--policy-data": "policy.data",
        "--policy-bundle": "policy.bundle",
        "--policy-bundle-public-key": "policy.bundle_public_key",
        "--policy-bundle-key-algorithm": "policy.bundle_key_algorithm",
        "--policy-bundle-key-id": "policy.bundle_key_id",
        "--policy-bundle-scope": "policy.bundle_scope",
        "--policy-bundle-poll-seconds": "policy.bundle_poll_seconds",
        "--store": "store.url",
        "--store-pool-min": "store.pool_min",
        "--store-pool-max": "store.pool_max",
        "--store-pgbouncer": "store.pgbouncer",
        "--store-listen-url": "store.listen_url",
        "--cache-ttl-seconds": "cache.ttl_seconds",
        "--cache-size": "cache.size",
        "--negative-cache-ttl-seconds": "cache.negative_ttl_seconds",
        "--negative-cache-size": "cache.negative_size",
        "--verdict-cache-size": "cache.verdict_size",
        "--request-cache-size": "cache.request_size",
        "--audit-log": "audit.log",
        "--audit-store": "audit.store",
        "--audit-chain-id": "audit.chain_id",
        "--upstream-credential-file": "upstream.credential_file",
        "--upstream-credential-header": "upstream.credential_header",
        "--upstream-credential-prefix": "upstream.credential_prefix",
    }


@pytest.mark.parametrize(
    "spec", [s for s in FLAGGED if s.value_type is not bool], ids=lambda s: s.name
)
@pytest.mark.parametrize("command", ["serve", "proxy"])
def test_each_flag_reaches_its_setting(spec: Setting, command: str) -> None:
    assert spec.flag is not None
    text, expected = sample(spec)
    companions = COMPANIONS.get(spec.name, [])
    settings = parse(*BASE, *companions, spec.flag, text, command=command)
    assert value(settings, spec) == expected
    assert expected != value(parse(*BASE, command=command), spec)


@pytest.mark.parametrize("spec", [s for s in FLAGGED if s.value_type is bool], ids=lambda s: s.name)
def test_boolean_settings_have_a_flag_and_its_negation(spec: Setting, tmp_path: Path) -> None:
    assert spec.flag is not None
    negation = "--no-" + spec.flag.removeprefix("--")
    assert value(parse(*BASE, spec.flag), spec) is True
    assert value(parse(*BASE, negation), spec) is False
    config = tmp_path / "gate.toml"
    config.write_text(f"[{spec.group}]\n{spec.key} = true\n")
    assert value(parse(*BASE, "--config", str(config)), spec) is True
    assert value(parse(*BASE, "--config", str(config), negation), spec) is False


@pytest.mark.parametrize("name", sorted(FILE_ONLY | {"routes", "formats"}))
def test_file_only_settings_have_no_flag(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--" + name.replace("_", "-"), "x"])
    assert exited.value.code == ExitCode.CANNOT_RUN
    assert "unrecognized arguments" in capsys.readouterr().err


def test_flags_not_given_leave_the_file_in_force(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        '[identity]\nmode = "trusted-headers"\n[filter]\nmode = "audit"\n'
        '[listen]\nworkers = 3\n[policy]\ncustom_reasons = ["HOLD"]\n'
    )
    settings = parse("--config", str(config), "--workers", "2")
    assert (settings.filter.mode.value, settings.listen.workers) == ("audit", 2)
    assert settings.policy.custom_reasons == ("HOLD",)


def test_flag_values_are_checked_like_file_values() -> None:
    with pytest.raises(ConfigError) as raised:
        parse(
            *BASE,
            *("--verdict-cache-size", "-1"),
            *("--negative-cache-ttl-seconds", "0"),
        )
    assert set(raised.value.problems) == {
        "cache.verdict_size (--verdict-cache-size): must be >= 0",
        "cache.negative_ttl_seconds (--negative-cache-ttl-seconds): must be > 0",
    }


def test_only_a_grpc_listen_flag_turns_off_the_proxy_private_socket() -> None:
    proxy = ["proxy", "--upstream", "http://db:1", "--listen", "127.0.0.1:1"]
    assert build_parser().parse_args(proxy).grpc_listen is None  # a private unix socket
    given = build_parser().parse_args([*proxy, "--grpc-listen", "127.0.0.1:9009"])
    assert given.grpc_listen == "127.0.0.1:9009"


def test_help_lists_the_flags_by_group(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    assert "[identity] settings:" in out
    listen = out[out.index("[listen] settings:") : out.index("[identity] settings:")]
    assert "--grpc-listen" in listen
    assert "[listen.grpc]" in listen  # each flag's help names its key in the file


def test_configuration_errors_exit_2_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gate.toml"
    config.write_text('tenant_claim = "org"\n[cache]\nsize = 0\n')
    assert main(["serve", "--config", str(config)]) == ExitCode.CANNOT_RUN
    assert capsys.readouterr().err.splitlines() == [
        "error: tenant_claim is now identity.tenant_claim "
        "(in the [identity] table: tenant_claim = ...)",
        "error: cache.size: must be >= 1",
        "error: identity.mode is required (--identity): "
        "jwt, envoy-jwt, trusted-headers or mesh-mtls",
    ]


def test_exit_codes_keep_their_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert [int(code) for code in ExitCode] == [0, 1, 2, 130]
    assert (STOPPED, DIED) == (ExitCode.OK, ExitCode.FAILED)  # what serve and proxy return
    assert main(["serve"]) == ExitCode.CANNOT_RUN  # no identity
    assert "identity.mode is required" in capsys.readouterr().err
    proxy = ["proxy", "--identity", "trusted-headers", "--upstream", "ftp://x", "--listen", "h:1"]
    assert main(proxy) == ExitCode.CANNOT_RUN
    assert "upstream must be" in capsys.readouterr().err
