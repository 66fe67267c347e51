"""The setting flags are generated from the Settings fields: every setting has a
flag or is file-only with a reason, and every flag reaches its setting."""

from __future__ import annotations

import types
from dataclasses import Field, fields
from enum import Enum
from pathlib import Path
from typing import Any, get_args, get_type_hints

import pytest

from sidecar.cli import build_parser, main
from sidecar.cli.exit_codes import ExitCode
from sidecar.cli.flags import flag_name, settings_from_flags
from sidecar.config import ConfigError, Settings, setting_info
from sidecar.runtime.signals import DIED, STOPPED

SETTINGS = fields(Settings)
HINTS = get_type_hints(Settings)
FLAGGED = [f for f in SETTINGS if flag_name(f) is not None]
FILE_ONLY = {"routes", "formats", "principal_claims", "workloads"}

# Given before the flag under test (which, coming last, wins): enough for
# load_settings to accept any one of the others.
BASE = [
    *("--identity", "trusted-headers"),
    *("--jwks", "keys.json", "--issuer", "https://idp/", "--audience", "gate"),
    *("--audit-log", "spool.jsonl"),
]


def parse(*argv: str, command: str = "serve") -> Settings:
    extra = (
        ["--upstream", "http://db:6333", "--listen", "127.0.0.1:1"] if command == "proxy" else []
    )
    return settings_from_flags(build_parser().parse_args([command, *argv, *extra]))


def sample(setting_field: Field[Any]) -> tuple[str, Any]:
    """A flag value differing from the default and from BASE, and the setting it gives."""
    hint = HINTS[setting_field.name]
    value_type = get_args(hint)[0] if isinstance(hint, types.UnionType) else hint
    if isinstance(value_type, type) and issubclass(value_type, Enum):
        taken = {setting_field.default, "trusted-headers"}  # StrEnum members equal their values
        member = next(m for m in value_type if m not in taken)
        return member.value, member
    if value_type is int:
        return "7", 7
    if value_type is float:
        return "2.5", 2.5
    if value_type is Path:
        return "/srv/gate/sample", Path("/srv/gate/sample")
    if value_type is str:
        return "sample", "sample"
    if setting_field.name == "jwt_credentials":  # a list of known names
        return "api-key, bearer", ("api-key", "bearer")
    if value_type == tuple[str, ...]:
        return "ACME_HOLD, LEGAL_HOLD", ("ACME_HOLD", "LEGAL_HOLD")
    raise AssertionError(f"no sample for {setting_field.name}: {value_type}")


def test_every_setting_has_a_flag_or_is_file_only_with_a_reason() -> None:
    for setting_field in SETTINGS:
        info = setting_info(setting_field)
        assert info.help, setting_field.name
        if setting_field.name in FILE_ONLY:
            assert info.file_only, setting_field.name
            assert flag_name(setting_field) is None
        else:
            assert info.file_only is None, setting_field.name
            assert flag_name(setting_field) == "--" + setting_field.name.replace("_", "-")


@pytest.mark.parametrize(
    "setting_field",
    [f for f in FLAGGED if HINTS[f.name] is not bool],
    ids=lambda f: f.name,
)
@pytest.mark.parametrize("command", ["serve", "proxy"])
def test_each_flag_reaches_its_setting(setting_field: Field[Any], command: str) -> None:
    flag = flag_name(setting_field)
    assert flag is not None
    text, expected = sample(setting_field)
    settings = parse(*BASE, flag, text, command=command)
    assert getattr(settings, setting_field.name) == expected
    assert expected != getattr(parse(*BASE, command=command), setting_field.name)


@pytest.mark.parametrize(
    "setting_field", [f for f in FLAGGED if HINTS[f.name] is bool], ids=lambda f: f.name
)
def test_boolean_settings_have_a_flag_and_its_negation(
    setting_field: Field[Any], tmp_path: Path
) -> None:
    flag = flag_name(setting_field)
    assert flag is not None
    negation = "--no-" + flag.removeprefix("--")
    assert getattr(parse(*BASE, flag), setting_field.name) is True
    assert getattr(parse(*BASE, negation), setting_field.name) is False
    config = tmp_path / "gate.toml"
    config.write_text(f"{setting_field.name} = true\n")
    assert getattr(parse(*BASE, "--config", str(config)), setting_field.name) is True
    assert getattr(parse(*BASE, "--config", str(config), negation), setting_field.name) is False


@pytest.mark.parametrize("name", sorted(FILE_ONLY))
def test_file_only_settings_have_no_flag(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--" + name.replace("_", "-"), "x"])
    assert exited.value.code == ExitCode.CANNOT_RUN
    assert "unrecognized arguments" in capsys.readouterr().err


def test_flags_not_given_leave_the_file_in_force(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        'identity = "trusted-headers"\nmode = "audit"\nworkers = 3\ncustom_reasons = ["HOLD"]\n'
    )
    settings = parse("--config", str(config), "--workers", "2")
    assert (settings.mode.value, settings.workers, settings.custom_reasons) == (
        "audit",
        2,
        ("HOLD",),
    )


def test_flag_values_are_checked_like_file_values() -> None:
    with pytest.raises(ConfigError, match="setting 'verdict_cache_size'"):
        parse(*BASE, "--verdict-cache-size", "-1")
    with pytest.raises(ConfigError, match="setting 'negative_cache_ttl_seconds'"):
        parse(*BASE, "--negative-cache-ttl-seconds", "0")


def test_only_a_grpc_listen_flag_turns_off_the_proxy_private_socket() -> None:
    proxy = ["proxy", "--upstream", "http://db:1", "--listen", "127.0.0.1:1"]
    assert build_parser().parse_args(proxy).grpc_listen is None  # a private unix socket
    given = build_parser().parse_args([*proxy, "--grpc-listen", "127.0.0.1:9009"])
    assert given.grpc_listen == "127.0.0.1:9009"


def test_exit_codes_keep_their_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert [int(code) for code in ExitCode] == [0, 1, 2, 130]
    assert (STOPPED, DIED) == (ExitCode.OK, ExitCode.FAILED)  # what serve and proxy return
    assert main(["serve"]) == ExitCode.CANNOT_RUN  # no identity
    assert "'identity' is required" in capsys.readouterr().err
    proxy = ["proxy", "--identity", "trusted-headers", "--upstream", "ftp://x", "--listen", "h:1"]
    assert main(proxy) == ExitCode.CANNOT_RUN
    assert "upstream must be" in capsys.readouterr().err
