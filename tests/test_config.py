"""Settings: file, flags, validation errors that name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import ConfigError, IdentityMode, load_settings
from sidecar.core.modes import Mode


def test_identity_is_required() -> None:
    with pytest.raises(ConfigError, match="'identity' is required"):
        load_settings(None, {})


def test_file_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        'identity = "trusted-headers"\nmode = "audit"\ncache_ttl_seconds = 5\n'
        '[routes."/collections/sops/"]\nmode = "strict"\n'
    )
    settings = load_settings(config, {"mode": "enforce", "store": None})
    assert settings.identity is IdentityMode.TRUSTED_HEADERS
    assert settings.mode is Mode.ENFORCE  # the flag wins over the file
    assert settings.cache_ttl_seconds == 5.0
    assert settings.store == "sqlite:///retrieval-gate.db"  # None flags leave the default
    assert settings.route_policy("/collections/sops/points/search").mode is Mode.STRICT
    assert settings.route_policy("/collections/other/points/search").mode is Mode.ENFORCE


def test_longest_route_prefix_wins() -> None:
    settings = load_settings(
        None,
        {
            "identity": "trusted-headers",
            "routes": {
                "/collections/": {"mode": "audit"},
                "/collections/sops/": {"mode": "strict"},
            },
        },
    )
    assert settings.route_policy("/collections/sops/points/query").mode is Mode.STRICT
    assert settings.route_policy("/collections/x/points/query").mode is Mode.AUDIT


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('identity = "trusted-headers"\nmod = "audit"\n', "unknown setting 'mod'"),
        ('identity = "trusted-headers"\nmode = "lenient"\n', "setting 'mode'"),
        ('identity = "trusted-headers"\nmax_body_bytes = -1\n', "setting 'max_body_bytes'"),
        ('identity = "trusted-headers"\nworkers = 0\n', "setting 'workers'"),
        ('identity = "trusted-headers"\ncache_ttl_seconds = 0\n', "setting 'cache_ttl_seconds'"),
        ('identity = "trusted-headers"\nverdict_cache_size = -1\n', "'verdict_cache_size'"),
        ('identity = "trusted-headers"\nworkers = 1.5\n', "setting 'workers'"),
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


def test_route_policy_resolves_push_down_and_overfetch() -> None:
    settings = load_settings(
        None,
        {
            "identity": "trusted-headers",
            "tenant_key": "tenant_id",
            "overfetch_factor": 2,
            "routes": {
                "/collections/public/": {"push_down": False, "overfetch_factor": 1},
                "/collections/legacy/": {"tenant_key": "owner"},
            },
        },
    )
    default = settings.route_policy("/collections/docs/points/search")
    assert (default.tenant_key, default.overfetch_factor) == ("tenant_id", 2.0)
    public = settings.route_policy("/collections/public/points/search")
    assert (public.tenant_key, public.overfetch_factor) == (None, 1.0)
    assert settings.route_policy("/collections/legacy/points/query").tenant_key == "owner"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"identity": "jwt", "issuer": "i", "audience": "a"}, "exactly one of --jwks"),
        (
            {
                "identity": "envoy-jwt",
                "jwks": "k.json",
                "jwt_public_key": "k.pem",
                "issuer": "i",
                "audience": "a",
            },
            "exactly one of --jwks",
        ),
        ({"identity": "jwt", "jwks": "k.json", "audience": "a"}, "needs --issuer and --audience"),
        ({"identity": "trusted-headers", "overfetch_factor": 0.5}, "'overfetch_factor'"),
        ({"identity": "trusted-headers", "routes": {"/x/": {"mod": "audit"}}}, "'mod'"),
        ({"identity": "trusted-headers", "tenant_key": ""}, "'tenant_key'"),
        ({"identity": "trusted-headers", "routes": {"/x/": {"tenant_key": ""}}}, "tenant_key"),
        (
            {"identity": "trusted-headers", "routes": {"/x/": {"releasable_fields": "title"}}},
            "releasable_fields must be a list",
        ),
        (
            {"identity": "trusted-headers", "routes": {"/x/": {"hashed_fields": ["a..b"]}}},
            "hashed_fields",
        ),
    ],
)
def test_identity_and_route_settings_are_checked(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(None, overrides)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("[formats.qdrant]\nbogus_option = 1\n", "formats.qdrant: unknown option 'bogus_option'"),
        ('[formats.weaviate]\ngenerative = "maybe"\n', "formats.weaviate: generative"),
        ('[formats.qdrant]\nenabled = "yes"\n', "option 'enabled' must be true or false"),
        ('formats = "qdrant"\n', "setting 'formats': must be a table"),
    ],
)
def test_bad_format_options_are_named(tmp_path: Path, table: str, message: str) -> None:
    config = tmp_path / "gate.toml"
    config.write_text('identity = "trusted-headers"\n' + table)
    with pytest.raises(ConfigError, match=message):
        load_settings(config)


@pytest.mark.parametrize(
    ("prefix", "path", "covered"),
    [
        ("/collections/public", "/collections/public/points/search", True),
        ("/collections/public", "/collections/public", True),
        ("/collections/public", "/collections/public-hr/points/search", False),
        ("/collections/public/", "/collections/public/points/search", True),
        ("/collections/public/", "/collections/public-hr/points/search", False),
    ],
)
def test_route_settings_match_whole_path_segments(prefix: str, path: str, covered: bool) -> None:
    settings = load_settings(
        overrides={"identity": "trusted-headers", "routes": {prefix: {"mode": "audit"}}}
    )
    assert (settings.route_policy(path).mode is Mode.AUDIT) is covered


def test_push_down_is_on_by_default_with_the_tenant_field() -> None:
    settings = load_settings(None, {"identity": "trusted-headers", "routes": {"/x/": {}}})
    assert settings.route_policy("/collections/docs/points/search").tenant_key == "tenant"
    # A route with its own field, and one without push-down.
    settings = load_settings(
        None,
        {
            "identity": "trusted-headers",
            "routes": {"/a/": {"tenant_key": "owner"}, "/b/": {"push_down": False}},
        },
    )
    assert settings.route_policy("/a/search").tenant_key == "owner"
    assert settings.route_policy("/b/search").tenant_key is None
