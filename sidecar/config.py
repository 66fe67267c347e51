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


class ConfigError(ValueError):
    """The configuration is invalid; the message names the setting."""


class Mode(StrEnum):
    ENFORCE = "enforce"  # strip rejected chunks
    STRICT = "strict"  # any rejection fails the whole response with 403
    AUDIT = "audit"  # pass everything; count and log what would have been stripped


class IdentityMode(StrEnum):
    TRUSTED_HEADERS = "trusted-headers"  # development only: x-gate-tenant / x-gate-principals


def default_policy_dir() -> Path:
    """The bundled policies: ``sidecar/policies``, a link to the checkout's ``policies/``
    that wheels carry as a copy."""
    return Path(__file__).resolve().parent / "policies"


@dataclass(frozen=True)
class Settings:
    identity: IdentityMode | None = None
    store: str = "sqlite:///retrieval-gate.db"
    mode: Mode = Mode.ENFORCE
    # Longest matching path prefix wins, e.g. {"/collections/sops/": "strict"}.
    route_modes: dict[str, Mode] = field(default_factory=dict)
    text_field: str = "text"
    id_field: str | None = None
    policy_dir: Path = field(default_factory=default_policy_dir)
    custom_reasons: tuple[str, ...] = ()
    cache_ttl_seconds: float = 30.0
    cache_size: int = 100_000
    negative_cache_ttl_seconds: float = 5.0
    negative_cache_size: int = 100_000
    # Largest response body the gate will inspect. Envoy's buffer limit and the
    # gRPC message limits are derived from it; a larger body is an error.
    max_body_bytes: int = 4 * 1024 * 1024
    grpc_listen: str = "127.0.0.1:9001"
    metrics: str | None = None  # host:port for /metrics; None disables
    audit_log: Path | None = None
    message_timeout_ms: int = 2000  # Envoy's per-message wait for the sidecar

    @property
    def grpc_max_message_bytes(self) -> int:
        """Body limit plus room for headers and metadata in the same message."""
        return self.max_body_bytes + 256 * 1024

    def mode_for(self, path: str) -> Mode:
        """The mode for a request path: the longest matching route prefix, else the default."""
        best = ""
        for prefix in self.route_modes:
            if path.startswith(prefix) and len(prefix) > len(best):
                best = prefix
        return self.route_modes[best] if best else self.mode


def _convert(name: str, value: Any) -> Any:
    try:
        if name == "identity":
            return None if value is None else IdentityMode(value)
        if name == "mode":
            return Mode(value)
        if name == "route_modes":
            if not isinstance(value, dict):
                raise TypeError("must be a table of path prefix = mode")
            return {str(prefix): Mode(mode) for prefix, mode in value.items()}
        if name in ("policy_dir", "audit_log"):
            return None if value is None else Path(value)
        if name == "custom_reasons":
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise TypeError("must be a list of strings")
            return tuple(value)
        if name in ("cache_ttl_seconds", "negative_cache_ttl_seconds"):
            number = float(value)
            if number < 0:
                raise ValueError("must be >= 0")
            return number
        if name in ("cache_size", "negative_cache_size", "max_body_bytes", "message_timeout_ms"):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError("must be a positive integer")
            return value
        if value is not None and not isinstance(value, str):
            raise TypeError("must be a string")
        return value
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"setting {name!r}: {exc}") from exc


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
    if settings.identity is None:
        raise ConfigError(
            "setting 'identity' is required (--identity); available: "
            + ", ".join(m.value for m in IdentityMode)
        )
    return settings
