"""Settings: defaults, an optional TOML file, then command-line overrides.

The settings come in groups, one TOML table each (``[listen]``,
``[identity]``, ``[policy]``, ``[store]``, ``[cache]``, ``[audit]``,
``[telemetry]``, ``[filter]``, ``[upstream]``), plus the tables ``[routes."<prefix>"]`` and
``[formats.<name>]``. Modules: ``_schema`` (how a setting is declared and one
value checked; :class:`Group`), ``groups`` (the group classes), ``settings``
(:class:`Settings`, the per-route options, the format table), ``checks``
(every check between settings) and ``load`` (:func:`load_settings`: the file
and the flags, every problem at once).
"""

from sidecar.config._schema import ConfigError, Group, Setting
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
    UpstreamSettings,
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
    "Group",
    "IdentityMode",
    "IdentitySettings",
    "ListenSettings",
    "PolicyEngineName",
    "PolicySettings",
    "RouteOptions",
    "Setting",
    "Settings",
    "StoreSettings",
    "TelemetrySettings",
    "UpstreamSettings",
    "default_policy_dir",
    "format_table",
    "grouped",
    "load_settings",
]
