"""Settings: defaults, an optional TOML file, then command-line overrides.

Every setting has one name, used both as the TOML key and (with dashes) as the
command-line flag. Unknown keys in the file are an error, so a typo never
silently leaves a default (possibly a less safe one) in force.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from sidecar.core.modes import Mode, RoutePolicy
from sidecar.formats.registry import FormatTable, build_format_table
from sidecar.identity.claims import DEFAULT_PRINCIPAL_CLAIMS


class ConfigError(ValueError):
    """The configuration is invalid; the message names the setting."""


class IdentityMode(StrEnum):
    JWT = "jwt"  # the sidecar verifies the bearer token
    ENVOY_JWT = "envoy-jwt"  # Envoy's jwt_authn verifies it; the sidecar reads the payload
    TRUSTED_HEADERS = "trusted-headers"  # development only: x-gate-tenant / x-gate-principals


def default_policy_dir() -> Path:
    """The bundled policies: ``sidecar/policies``, a link to the checkout's ``policies/``
    that wheels carry as a copy."""
    return Path(__file__).resolve().parent / "policies"


@dataclass(frozen=True)
class RouteOptions:
    """Per-route overrides (a path prefix in ``routes``); None keeps the global value."""

    mode: Mode | None = None
    tenant_key: str | None = None
    push_down: bool | None = None
    overfetch_factor: float | None = None
    substitute_superseded: bool | None = None
    # The one format that owns paths under this prefix (route detection is skipped).
    format: str | None = None


@dataclass(frozen=True)
class Settings:
    identity: IdentityMode | None = None
    store: str = "sqlite:///retrieval-gate.db"
    mode: Mode = Mode.ENFORCE
    text_field: str = "text"
    id_field: str | None = None
    policy_dir: Path = field(default_factory=default_policy_dir)
    policy_data: Path | None = None  # JSON document loaded as Rego `data`
    custom_reasons: tuple[str, ...] = ()
    # Identity: JWT verification (identity jwt) and Envoy's jwt_authn (envoy-jwt).
    jwks: str | None = None  # file path or http(s) URL
    jwt_public_key: Path | None = None
    jwt_hmac_secret_file: Path | None = None
    issuer: str | None = None
    audience: str | None = None
    jwt_leeway_seconds: float = 30.0
    tenant_claim: str = "tenant"
    principal_claims: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_PRINCIPAL_CLAIMS))
    drafts_scope: str | None = None
    # Request path: push the caller's tenant down into the vector DB query and
    # over-fetch so that filtering does not return short pages.
    tenant_key: str | None = None  # payload field holding the tenant; None: no push-down
    overfetch_factor: float = 1.0
    overfetch_cap: int = 1000
    substitute_superseded: bool = False
    # Longest matching path prefix wins, e.g. {"/collections/sops/": RouteOptions(mode=STRICT)}.
    routes: dict[str, RouteOptions] = field(default_factory=dict)
    # Format adapters' options by format name (README, "Formats"); a name that
    # is not built in defines a generic adapter.
    formats: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Policy verdicts remembered per (caller, record) for a time-pure policy; 0: off.
    verdict_cache_size: int = 20_000
    cache_ttl_seconds: float = 30.0
    cache_size: int = 100_000
    negative_cache_ttl_seconds: float = 5.0
    negative_cache_size: int = 100_000
    # How long past its TTL a cached record may still be served while the store
    # is failing. 0 (the default) fails closed: METADATA_UNAVAILABLE.
    stale_if_error_seconds: float = 0.0
    # Largest response body the gate will inspect. Envoy's buffer limit and the
    # gRPC message limits are derived from it; a larger body is an error.
    max_body_bytes: int = 4 * 1024 * 1024
    grpc_listen: str = "127.0.0.1:9001"
    # Sidecar processes; with N > 1 each listens on its own address
    # (sidecar.runtime.workers.worker_addresses) and Envoy balances across them.
    workers: int = 1
    metrics: str | None = None  # host:port for /metrics; None disables
    audit_log: Path | None = None
    # PostgreSQL URL for the durable audit trail; audit_log is then the local spool.
    audit_store: str | None = None
    audit_chain_id: str | None = None  # default: hostname + spool path digest
    message_timeout_ms: int = 2000  # Envoy's per-message wait for the sidecar

    @property
    def grpc_max_message_bytes(self) -> int:
        """Body limit plus room for headers and metadata in the same message."""
        return self.max_body_bytes + 256 * 1024

    def route_policy(self, path: str) -> RoutePolicy:
        """Mode, push-down and over-fetch for a request path (longest route prefix wins)."""
        best = max((p for p in self.routes if path.startswith(p)), key=len, default=None)
        options = self.routes[best] if best is not None else RouteOptions()
        push_down = options.push_down if options.push_down is not None else True
        tenant_key = options.tenant_key or self.tenant_key
        return RoutePolicy(
            mode=options.mode or self.mode,
            tenant_key=tenant_key if push_down else None,
            overfetch_factor=(
                options.overfetch_factor
                if options.overfetch_factor is not None
                else self.overfetch_factor
            ),
            substitute_superseded=(
                options.substitute_superseded
                if options.substitute_superseded is not None
                else self.substitute_superseded
            ),
        )


_POSITIVE_INTS = (
    "workers",
    "cache_size",
    "negative_cache_size",
    "max_body_bytes",
    "message_timeout_ms",
    "overfetch_cap",
)
# A zero TTL would make the cache unusable, not off: a fresh entry must live a while.
_POSITIVE_FLOATS = ("cache_ttl_seconds", "negative_cache_ttl_seconds")
_NON_NEGATIVE_FLOATS = ("jwt_leeway_seconds", "stale_if_error_seconds")
_PATHS = ("policy_dir", "policy_data", "audit_log", "jwt_public_key", "jwt_hmac_secret_file")


def _factor(value: Any) -> float:
    number = float(value)
    if number < 1:
        raise ValueError("must be >= 1 (1 disables over-fetch)")
    return number


def _route_options(value: Any) -> RouteOptions:
    if not isinstance(value, dict):
        raise TypeError("each route must be a table")
    unknown = set(value) - {f.name for f in fields(RouteOptions)}
    if unknown:
        raise ValueError(f"unknown route option {sorted(unknown)[0]!r}")
    if value.get("format") is not None and not isinstance(value["format"], str):
        raise TypeError("format must be a format name")
    for flag in ("push_down", "substitute_superseded"):
        if value.get(flag) is not None and not isinstance(value[flag], bool):
            raise TypeError(f"{flag} must be true or false")
    factor = value.get("overfetch_factor")
    return RouteOptions(
        mode=Mode(value["mode"]) if "mode" in value else None,
        tenant_key=value.get("tenant_key"),
        push_down=value.get("push_down"),
        overfetch_factor=None if factor is None else _factor(factor),
        substitute_superseded=value.get("substitute_superseded"),
        format=value.get("format"),
    )


def _convert(name: str, value: Any) -> Any:
    try:
        if name == "identity":
            return None if value is None else IdentityMode(value)
        if name == "mode":
            return Mode(value)
        if name == "routes":
            if not isinstance(value, dict):
                raise TypeError("must be a table of path prefix = {options}")
            return {str(prefix): _route_options(options) for prefix, options in value.items()}
        if name == "formats":
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise TypeError("must be a table of format name = {options}")
            return {str(k): dict(v) for k, v in value.items()}
        if name == "principal_claims":
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items()
            ):
                raise TypeError("must be a table of claim = principal prefix")
            return dict(value)
        if name in _PATHS:
            return None if value is None else Path(value)
        if name == "custom_reasons":
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise TypeError("must be a list of strings")
            return tuple(value)
        if name == "overfetch_factor":
            return _factor(value)
        if name == "substitute_superseded":
            if not isinstance(value, bool):
                raise TypeError("must be true or false")
            return value
        if name in _POSITIVE_FLOATS:
            if isinstance(value, bool) or float(value) <= 0:
                raise ValueError("must be > 0")
            return float(value)
        if name in _NON_NEGATIVE_FLOATS:
            number = float(value)
            if number < 0:
                raise ValueError("must be >= 0")
            return number
        if name == "verdict_cache_size":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError("must be a non-negative integer (0 turns the cache off)")
            return value
        if name in _POSITIVE_INTS:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError("must be a positive integer")
            return value
        if value is not None and not isinstance(value, str):
            raise TypeError("must be a string")
        return value
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"setting {name!r}: {exc}") from exc


def _check_identity(settings: Settings) -> None:
    if settings.identity is None:
        raise ConfigError(
            "setting 'identity' is required (--identity); available: "
            + ", ".join(m.value for m in IdentityMode)
        )
    if settings.identity in (IdentityMode.JWT, IdentityMode.ENVOY_JWT):
        keys = [settings.jwks, settings.jwt_public_key, settings.jwt_hmac_secret_file]
        if sum(k is not None for k in keys) != 1:
            raise ConfigError(
                f"identity {settings.identity.value!r} needs exactly one of --jwks, "
                "--jwt-public-key, --jwt-hmac-secret-file"
            )
        if not settings.issuer or not settings.audience:
            raise ConfigError(f"identity {settings.identity.value!r} needs --issuer and --audience")


def _check_audit(settings: Settings) -> None:
    if settings.audit_store is not None and settings.audit_log is None:
        raise ConfigError(
            "setting 'audit_store' needs 'audit_log' (--audit-log): the local spool that "
            "every decision is written to before it is shipped"
        )


def _check_formats(settings: Settings) -> None:
    try:
        format_table(settings)
    except ValueError as exc:
        raise ConfigError(f"setting 'formats': {exc}") from exc


def format_table(settings: Settings) -> FormatTable:
    """The format adapters these settings configure; raises ValueError naming the option."""
    pinned = {prefix: o.format for prefix, o in settings.routes.items() if o.format is not None}
    return build_format_table(
        settings.formats, pinned, text_field=settings.text_field, id_field=settings.id_field
    )


def load_settings(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Defaults, then the TOML file at ``path`` (if any), then non-None ``overrides``."""
    known = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {}
    if path is not None:
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        for key, value in document.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ConfigError(f"{path}: unknown setting {key!r}")
            values[name] = _convert(name, value)
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = _convert(name, value)
    settings = replace(Settings(), **values)
    _check_identity(settings)
    _check_audit(settings)
    _check_formats(settings)
    return settings
