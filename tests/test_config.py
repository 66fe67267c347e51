"""Settings: file, flags, validation errors that name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import ConfigError, IdentityMode, Mode, load_settings


def test_identity_is_required() -> None:
    with pytest.raises(ConfigError, match="'identity' is required"):
        load_settings(None, {})


def test_file_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        'identity = "trusted-headers"\nmode = "audit"\ncache_ttl_seconds = 5\n'
        '[route_modes]\n"/collections/sops/" = "strict"\n'
    )
    settings = load_settings(config, {"mode": "enforce", "store": None})
    assert settings.identity is IdentityMode.TRUSTED_HEADERS
    assert settings.mode is Mode.ENFORCE  # the flag wins over the file
    assert settings.cache_ttl_seconds == 5.0
    assert settings.store == "sqlite:///retrieval-gate.db"  # None flags leave the default
    assert settings.mode_for("/collections/sops/points/search") is Mode.STRICT
    assert settings.mode_for("/collections/other/points/search") is Mode.ENFORCE


def test_longest_route_prefix_wins() -> None:
    settings = load_settings(
        None,
        {
            "identity": "trusted-headers",
            "route_modes": {"/collections/": "audit", "/collections/sops/": "strict"},
        },
    )
    assert settings.mode_for("/collections/sops/points/query") is Mode.STRICT
    assert settings.mode_for("/collections/x/points/query") is Mode.AUDIT


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('identity = "trusted-headers"\nmod = "audit"\n', "unknown setting 'mod'"),
        ('identity = "trusted-headers"\nmode = "lenient"\n', "setting 'mode'"),
        ('identity = "trusted-headers"\nmax_body_bytes = -1\n', "setting 'max_body_bytes'"),
        ('identity = "anyone"\n', "setting 'identity'"),
        ("identity = \n", "gate.toml"),
    ],
)
def test_bad_settings_are_named(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(config)


def test_grpc_limit_exceeds_body_limit() -> None:
    settings = load_settings(None, {"identity": "trusted-headers", "max_body_bytes": 1024})
    assert settings.grpc_max_message_bytes > settings.max_body_bytes
