"""Settings: grouped TOML tables, flags, and problems reported all at once by name."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields
from pathlib import Path

import pytest

from sidecar.config import (
    GROUPS,
    SETTINGS,
    CacheSettings,
    ConfigError,
    EventLoopName,
    FilterSettings,
    IdentityMode,
    ListenSettings,
    PolicySettings,
    RouteOptions,
    Setting,
    Settings,
    StoreSettings,
    load_settings,
)
from sidecar.core.modes import Mode

TRUSTED = '[identity]\nmode = "trusted-headers"\n'


def with_identity(text: str) -> str:
    """``text`` with an identity mode: in its [identity] table, or one after its own."""
    if "[identity]\n" in text:
        return text.replace("[identity]\n", TRUSTED, 1)
    return text + TRUSTED


def load_text(tmp_path: Path, text: str) -> Settings:
    config = tmp_path / "gate.toml"
    config.write_text(text)
    return load_settings(config)


def problems_of(tmp_path: Path, text: str) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as raised:
        load_text(tmp_path, text)
    return raised.value.problems


def test_identity_is_required_and_its_modes_are_listed() -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(None, {})
    assert raised.value.problems == (
        "identity.mode is required (--identity): jwt, envoy-jwt, trusted-headers or mesh-mtls",
    )


def test_every_setting_is_in_exactly_one_group() -> None:
    assert len(SETTINGS) == 83  # with routes and formats: 85
    assert len({spec.path for spec in SETTINGS}) == len(SETTINGS)
    assert len({spec.name for spec in SETTINGS}) == len(SETTINGS)
    assert [f.name for f in fields(Settings)] == [*GROUPS, "routes", "formats"]
    assert {spec.group for spec in SETTINGS} == set(GROUPS)


def test_groups_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(FrozenInstanceError):
        settings.cache.size = 1  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        settings.cache = settings.cache  # type: ignore[misc]


def test_a_group_checks_its_values_when_it_is_made() -> None:
    with pytest.raises(ConfigError) as raised:
        CacheSettings(size=0, ttl_seconds=-1, request_size=True)
    assert raised.value.problems == (
        "cache.ttl_seconds: must be > 0",
        "cache.size: must be >= 1",
        "cache.request_size: must be an integer",
    )
    with pytest.raises(ConfigError, match=r"filter\.mode: 'lax' is not one of"):
        FilterSettings(mode="lax")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"store\.url: must be given"):
        StoreSettings(url=None)  # type: ignore[arg-type]


def test_a_group_converts_what_its_fields_accept() -> None:
    policy = PolicySettings(dir="rego", custom_reasons=["HOLD"])  # type: ignore[arg-type]
    assert (policy.dir, policy.custom_reasons) == (Path("rego"), ("HOLD",))
    assert FilterSettings(overfetch_factor=2).overfetch_factor == 2.0
    assert ListenSettings(event_loop="asyncio").event_loop is EventLoopName.ASYNCIO  # type: ignore[arg-type]


def test_a_grouped_file(tmp_path: Path) -> None:
    settings = load_text(
        tmp_path,
        TRUSTED
        + 'tenant_claim = "org"\n'
        + '[store]\nurl = "postgresql://gate@db/gate"\n'
        + "[cache]\nttl_seconds = 5\nverdict_size = 0\n"
        + '[listen]\ngrpc = "unix:/run/gate.sock"\nworkers = 2\n'
        + '[policy]\nengine = "regorus"\ncustom_reasons = ["HOLD"]\n'
        + '[audit]\nlog = "/var/spool.jsonl"\nchain_id = "gate-0"\n'
        + '[telemetry]\nmetrics = "127.0.0.1:9464"\n'
        + '[filter]\nmode = "strict"\ntenant-key = "tenant_id"\n'
        + '[identity.principal_claims]\nsub = "user"\n',
    )
    assert settings.identity.mode is IdentityMode.TRUSTED_HEADERS
    assert settings.identity.tenant_claim == "org"
    assert settings.identity.principal_claims == {"sub": "user"}
    assert settings.store.url == "postgresql://gate@db/gate"
    assert (settings.cache.ttl_seconds, settings.cache.verdict_size) == (5.0, 0)
    assert (settings.listen.grpc, settings.listen.workers) == ("unix:/run/gate.sock", 2)
    assert settings.policy.custom_reasons == ("HOLD",)
    assert settings.audit.log == Path("/var/spool.jsonl")
    assert settings.telemetry.metrics == "127.0.0.1:9464"
    assert settings.filter.mode is Mode.STRICT
    assert settings.filter.tenant_key == "tenant_id"  # dashes read as underscores


def test_file_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        TRUSTED + '[filter]\nmode = "audit"\n[cache]\nttl_seconds = 5\n'
        '[routes."/collections/sops/"]\nmode = "strict"\n'
    )
    settings = load_settings(config, {"mode": "enforce", "store": None})
    assert settings.filter.mode is Mode.ENFORCE  # the flag wins over the file
    assert settings.cache.ttl_seconds == 5.0
    assert settings.store.url == "sqlite:///retrieval-gate.db"  # None flags leave the default
    assert settings.route_policy("/collections/sops/points/search").mode is Mode.STRICT
    assert settings.route_policy("/collections/other/points/search").mode is Mode.ENFORCE


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    problems = problems_of(
        tmp_path,
        'tenant_claim = "org"\n'
        '[identity]\nmode = "jwt"\njwks = "k.json"\naudinece = "gate"\n'
        '[cache]\nttl_seconds = 0\nsize = "big"\n'
        '[listen]\nworkers = 1.5\nevent_loop = "trio"\n'
        '[polcy]\nengine = "opa"\n'
        '[routes."/x/"]\nmod = "audit"\n',
    )
    assert problems == (
        "tenant_claim is now identity.tenant_claim (in the [identity] table: tenant_claim = ...)",
        "identity.audinece: unknown setting; did you mean identity.audience?",
        "cache.ttl_seconds: must be > 0",
        "cache.size: must be an integer",
        "listen.workers: must be an integer",
        "listen.event_loop: 'trio' is not one of auto, uvloop or asyncio",
        "polcy: unknown setting; did you mean [policy]?",
        'routes."/x/".mod: unknown route option; did you mean mode?',
        "identity.mode 'jwt' needs identity.issuer and identity.audience (--issuer, --audience)",
    )


def test_problems_are_one_line_each() -> None:
    error = ConfigError("cache.size: must be >= 1", "listen.workers: must be >= 1")
    assert str(error) == "cache.size: must be >= 1\nlisten.workers: must be >= 1"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[filter]\nmod = "audit"\n', "filter.mod: unknown setting; did you mean filter.mode?"),
        ("[cache]\nverdict_cache_size = 3\n", "did you mean cache.verdict_size?"),
        ('[identity]\nstore = "x"\n', "identity.store: unknown setting; did you mean store.url?"),
        ('[store]\nurl = "x"\n[audit]\nstor = "y"\n', "did you mean audit.store?"),
        ("[cahce]\nsize = 1\n", "cahce: unknown setting; did you mean [cache]?"),
        ('[routes."/x/"]\nformt = "qdrant"\n', 'routes."/x/".formt: unknown route option; did'),
        ("[filter]\nzzz = 1\n", "filter.zzz: unknown setting"),
    ],
)
def test_unknown_keys_suggest_the_nearest_known_one(
    tmp_path: Path, text: str, problem: str
) -> None:
    problems = problems_of(tmp_path, with_identity(text))
    assert len(problems) == 1
    assert problems[0].startswith(problem) or problem in problems[0]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '[filter]\nmode = "lenient"\n',
            "filter.mode: 'lenient' is not one of enforce, strict or audit",
        ),
        (
            '[policy]\nengine = "wasm"\n',
            "policy.engine: 'wasm' is not one of regorus or opa",
        ),
        ('[routes."/x/"]\nmode = "lax"\n', "'lax' is not one of enforce, strict or audit"),
    ],
)
def test_enum_problems_list_the_valid_values(tmp_path: Path, text: str, problem: str) -> None:
    (found,) = problems_of(tmp_path, with_identity(text))
    assert problem in found


@pytest.mark.parametrize("spec", SETTINGS, ids=lambda spec: spec.name)
def test_every_flat_key_is_refused_with_its_new_place(tmp_path: Path, spec: Setting) -> None:
    text = f"{spec.name} = 1\n"
    # identity = ... and an [identity] table cannot both be in one file.
    problems = problems_of(tmp_path, text if spec.name == "identity" else with_identity(text))
    assert problems == (
        f"{spec.name} is now {spec.path} (in the [{spec.group}] table: {spec.key} = ...)",
    )


def test_the_old_flat_tables_are_refused_with_their_new_place(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, with_identity('[principal_claims]\nsub = "user"\n'))
    assert problems == (
        "principal_claims is now identity.principal_claims "
        "(in the [identity] table: principal_claims = ...)",
    )


def test_a_group_must_be_a_table(tmp_path: Path) -> None:
    assert problems_of(tmp_path, with_identity("cache = 3\n")) == (
        "cache must be a table ([cache])",
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[listen]\nmax_body_bytes = -1\n", "listen.max_body_bytes: must be >= 1"),
        ("[listen]\nworkers = 0\n", "listen.workers: must be >= 1"),
        ("[cache]\nttl_seconds = 0\n", "cache.ttl_seconds: must be > 0"),
        ("[cache]\nverdict_size = -1\n", "cache.verdict_size: must be >= 0"),
        ("[cache]\nsize = true\n", "cache.size: must be an integer"),
        ("[filter]\noverfetch_factor = 0.5\n", "filter.overfetch_factor: must be >= 1"),
        ('[filter]\ntenant_key = ""\n', "filter.tenant_key: must be a non-empty field name"),
        ('[identity]\njwt_payload_key = ""\n', "identity.jwt_payload_key: must not be empty"),
        ('[identity]\njwt_credentials = ["cookie"]\n', "identity.jwt_credentials: unknown"),
        ('[policy]\nbundle = ""\n', "policy.bundle: must not be empty"),
        ("[policy]\nallow_plain_http = 1\n", "policy.allow_plain_http: must be true or false"),
        ("[telemetry]\nmetric_collections = [1]\n", "telemetry.metric_collections: must be a list"),
        ('[telemetry]\nmetric_collections = ["other"]\n', "reserved label value"),
        ("[store]\nurl = 5\n", "store.url: must be a string"),
        ('formats = "qdrant"\n', "formats: must be a table of format name = {options}"),
        ('routes = "x"\n', "routes: must be a table of path prefix = {options}"),
    ],
)
def test_impossible_values_are_named(tmp_path: Path, text: str, problem: str) -> None:
    (found,) = problems_of(tmp_path, with_identity(text))
    assert problem in found


def test_every_problem_of_a_route_is_named(tmp_path: Path) -> None:
    problems = problems_of(
        tmp_path,
        with_identity(
            '[routes."/x/"]\nmode = "lax"\noverfetch_factor = 0.5\npush_down = "no"\n'
            'hashed_fields = "title"\n'
        ),
    )
    assert problems == (
        "routes.\"/x/\".mode: 'lax' is not one of enforce, strict or audit",
        'routes."/x/".overfetch_factor: must be >= 1',
        'routes."/x/".push_down: must be true or false',
        'routes."/x/".hashed_fields: must be a list of strings',
    )


def test_route_options_check_their_values_when_they_are_made() -> None:
    with pytest.raises(ConfigError, match=r"routes\.overfetch_factor: must be >= 1"):
        RouteOptions(overfetch_factor=0.5)
    assert RouteOptions(mode="strict").mode is Mode.STRICT  # type: ignore[arg-type]


def test_a_file_that_is_not_toml_is_named(tmp_path: Path) -> None:
    (found,) = problems_of(tmp_path, "[identity]\nmode = \n")
    assert "gate.toml" in found


def test_flag_values_name_the_flag() -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(None, {"identity": "trusted-headers", "verdict_cache_size": -1})
    assert raised.value.problems == ("cache.verdict_size (--verdict-cache-size): must be >= 0",)


def test_grpc_limit_exceeds_body_limit() -> None:
    settings = load_settings(None, {"identity": "trusted-headers", "max_body_bytes": 1024})
    assert settings.listen.grpc_max_message_bytes > settings.listen.max_body_bytes


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
        (
            {"identity": "jwt", "issuer": "i", "audience": "a"},
            "identity.mode 'jwt' needs exactly one of identity.jwks",
        ),
        (
            {
                "identity": "envoy-jwt",
                "jwks": "k.json",
                "jwt_public_key": "k.pem",
                "issuer": "i",
                "audience": "a",
            },
            "needs exactly one of identity.jwks",
        ),
        (
            {"identity": "jwt", "jwks": "k.json", "audience": "a"},
            "needs identity.issuer and identity.audience",
        ),
        ({"identity": "mesh-mtls"}, "needs an [identity.workloads] table"),
        (
            {"identity": "trusted-headers", "audit_store": "postgresql://db/gate"},
            "audit.store needs audit.log",
        ),
        (
            {"identity": "trusted-headers", "policy_engine": "opa"},
            "policy.engine 'opa' needs policy.opa_url (--opa-url)",
        ),
        (
            {"identity": "trusted-headers", "store_pool_min": 5, "store_pool_max": 4},
            "store.pool_min must not be above store.pool_max",
        ),
        (
            {
                "identity": "trusted-headers",
                "store": "postgresql://pgbouncer/gate",
                "store_pgbouncer": True,
            },
            "store.pgbouncer needs store.listen_url (--store-listen-url)",
        ),
        (
            {"identity": "trusted-headers", "store_listen_url": "sqlite:///x.db"},
            "store.listen_url must be a postgresql:// URL",
        ),
        (
            {
                "identity": "trusted-headers",
                "policy_engine": "opa",
                "opa_url": "http://127.0.0.1:8181",
                "policy_data": "d.json",
            },
            "policy.data is not used with policy.engine 'opa'",
        ),
        (
            {
                "identity": "trusted-headers",
                "policy_engine": "opa",
                "opa_url": "http://127.0.0.1:8181",
                "opa_timeout_ms": 2000,
            },
            "policy.opa_timeout_ms must be below listen.message_timeout_ms",
        ),
        (
            {
                "identity": "trusted-headers",
                "policy_engine": "opa",
                "opa_url": "http://127.0.0.1:8181",
                "policy_bundle": "b.tar.gz",
            },
            "policy.bundle is not used with policy.engine 'opa'",
        ),
        (
            {"identity": "trusted-headers", "policy_bundle": "b.tar.gz", "policy_data": "d.json"},
            "policy.data is not used with policy.bundle",
        ),
        (
            {"identity": "trusted-headers", "policy_bundle_public_key": "k.pem"},
            "policy.bundle_public_key needs policy.bundle",
        ),
        ({"identity": "trusted-headers", "routes": {"/x/": {"tenant_key": ""}}}, "tenant_key"),
        (
            {"identity": "trusted-headers", "routes": {"/x/": {"releasable_fields": "title"}}},
            "releasable_fields: must be a list",
        ),
        (
            {"identity": "trusted-headers", "routes": {"/x/": {"hashed_fields": ["a..b"]}}},
            "hashed_fields",
        ),
    ],
)
def test_cross_field_problems_are_named(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(None, overrides)
    (problem,) = raised.value.problems
    assert message in problem


def test_store_connection_settings() -> None:
    settings = load_settings(
        None,
        {
            "identity": "trusted-headers",
            "store": "postgresql://gate@pgbouncer:6432/gate",
            "store_pgbouncer": True,
            "store_listen_url": "postgresql://gate@db:5432/gate",
            "store_pool_min": 0,
            "store_pool_max": 2,
        },
    )
    store = settings.store
    assert (store.pool_min, store.pool_max, store.pgbouncer) == (0, 2, True)
    assert store.listen_url == "postgresql://gate@db:5432/gate"
    defaults = load_settings(None, {"identity": "trusted-headers"}).store
    assert (defaults.pool_min, defaults.pool_max, defaults.pgbouncer) == (1, 4, False)
    assert defaults.listen_url is None  # the store's own URL
    # With SQLite the PostgreSQL settings are not read, so not refused either.
    load_settings(None, {"identity": "trusted-headers", "store_pgbouncer": True})


def test_cross_field_checks_skip_a_refused_setting() -> None:
    # The mode is wrong: that it lacks its keys would only repeat the problem.
    with pytest.raises(ConfigError) as raised:
        load_settings(None, {"identity": "jwtt"})
    (problem,) = raised.value.problems
    assert problem.startswith("identity.mode (--identity): 'jwtt' is not one of")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("[formats.qdrant]\nbogus_option = 1\n", "formats.qdrant: unknown option 'bogus_option'"),
        ('[formats.weaviate]\ngenerative = "maybe"\n', "formats.weaviate: generative"),
        ('[formats.qdrant]\nenabled = "yes"\n', "option 'enabled' must be true or false"),
    ],
)
def test_bad_format_options_are_named(tmp_path: Path, table: str, message: str) -> None:
    (problem,) = problems_of(tmp_path, with_identity(table))
    assert problem.startswith("formats: ")
    assert message in problem


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


def test_defaults_are_unchanged() -> None:
    settings = Settings()
    assert settings.store.url == "sqlite:///retrieval-gate.db"
    assert settings.filter.mode is Mode.ENFORCE
    assert settings.listen.grpc == "unix:/run/retrieval-gate/envoy.sock"
    assert (settings.listen.workers, settings.listen.gate) == (1, None)
    assert settings.listen.max_body_bytes == 4 * 1024 * 1024
    assert settings.listen.message_timeout_ms == 2000
    assert not settings.listen.expose_grpc and not settings.policy.allow_plain_http
    assert (settings.cache.ttl_seconds, settings.cache.size) == (30.0, 100_000)
    assert (settings.cache.negative_ttl_seconds, settings.cache.negative_size) == (30.0, 100_000)
    assert settings.cache.stale_if_error_seconds == 0.0
    assert (settings.cache.verdict_size, settings.cache.request_size) == (20_000, 10_000)
    assert settings.policy.opa_timeout_ms == 500
    assert settings.policy.bundle_poll_seconds == 10.0
    assert (settings.filter.overfetch_factor, settings.filter.overfetch_cap) == (2.0, 1000)
    assert settings.filter.max_hits == 10_000
    assert settings.identity.jwt_leeway_seconds == 30.0
    assert settings.identity.jwt_credentials == ("bearer", "base64", "api-key")
    assert settings.identity.jwks_relay == "127.0.0.1:9902"
    assert settings.identity.principal_claims == {"sub": "user", "groups": "group", "roles": "role"}
