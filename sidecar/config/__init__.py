"""Settings: defaults, an optional TOML file, then command-line overrides.

The settings come in groups, one TOML table each (``[listen]``,
``[identity]``, ``[policy]``, ``[store]``, ``[cache]``, ``[audit]``,
``[telemetry]``, ``[filter]``), plus the tables ``[routes."<prefix>"]`` and
``[formats.<name>]``. Modules: ``_schema`` (how a setting is declared and one
value checked), ``groups`` (the group classes), ``settings`` (:class:`Settings`),
``checks`` (every check between settings) and ``load`` (:func:`load_settings`).
"""

from sidecar.config._schema import ConfigError, Setting, SettingInfo, choices
from sidecar.config.groups import (
    AuditSettings,
    CacheSettings,
    EventLoopName,
    FilterSettings,
    IdentityMode,
    IdentitySettings,
    ListenSettings,
    PolicyEngineName,
    PolicySettings,
    StoreSettings,
    TelemetrySettings,
    default_policy_dir,
)
from sidecar.config.load import grouped, load_settings
from sidecar.config.settings import GROUPS, SETTINGS, TABLES, RouteOptions, Settings, format_table

__all__ = [
    "GROUPS",
    "SETTINGS",
    "TABLES",
    "AuditSettings",
    "CacheSettings",
    "ConfigError",
    "EventLoopName",
    "FilterSettings",
    "IdentityMode",
    "IdentitySettings",
    "ListenSettings",
    "PolicyEngineName",
    "PolicySettings",
    "RouteOptions",
    "Setting",
    "SettingInfo",
    "Settings",
    "StoreSettings",
    "TelemetrySettings",
    "choices",
    "default_policy_dir",
    "format_table",
    "grouped",
    "load_settings",
]
