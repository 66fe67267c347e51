"""The top-level settings: the groups, the per-route options and the format tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sidecar.config._schema import Group, Setting, group_settings, setting
from sidecar.config.groups import (
    AuditSettings,
    CacheSettings,
    FilterSettings,
    IdentitySettings,
    ListenSettings,
    PolicySettings,
    StoreSettings,
    TelemetrySettings,
    UpstreamSettings,
    non_empty_field,
)
from sidecar.core.hits import path_under
from sidecar.core.modes import Mode, RoutePolicy
from sidecar.formats.registry import FormatTable, build_format_table


@dataclass(frozen=True)
class RouteOptions(Group, group="routes"):
    """Per-route overrides (a path prefix in ``routes``); None keeps the ``filter`` value."""

    mode: Mode | None = setting(None, help="the filter mode on this route")
    tenant_key: str | None = setting(
        None, check=non_empty_field, help="the field holding the tenant in this route's index"
    )
    push_down: bool | None = setting(
        None, help="false: inject no tenant filter on this route (default true)"
    )
    overfetch_factor: float | None = setting(
        None, minimum=1, help="over-fetch multiplier (1 turns it off)"
    )
    substitute_superseded: bool | None = setting(
        None, help="replace a superseded chunk by its successor"
    )
    # Upstream error bodies (non-2xx) reach the client as the database wrote them.
    pass_upstream_errors: bool | None = setting(
        None, help="true: a non-2xx upstream answer reaches the client as written"
    )
    # Document fields released on this route, in place of each format's own
    # (docs/databases.md, "Released fields").
    hashed_fields: tuple[str, ...] | None = setting(
        None, help="document fields released because their hash is checked"
    )
    releasable_fields: tuple[str, ...] | None = setting(
        None, help="document fields released unverified"
    )
    # The one format that owns paths under this prefix (route detection is skipped).
    format: str | None = setting(None, help="the one format that owns paths under this prefix")


@dataclass(frozen=True)
class Settings:
    """Every setting, by group: ``settings.cache.size`` is ``size`` of the ``[cache]`` table."""

    listen: ListenSettings = field(default_factory=ListenSettings)
    identity: IdentitySettings = field(default_factory=IdentitySettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    filter: FilterSettings = field(default_factory=FilterSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    # Longest matching path prefix wins, e.g. {"/collections/sops/": RouteOptions(mode=STRICT)}.
    routes: dict[str, RouteOptions] = field(default_factory=dict)
    # A format name that is not built in defines a generic adapter.
    formats: dict[str, dict[str, Any]] = field(default_factory=dict)

    def route_policy(self, path: str) -> RoutePolicy:
        """Mode, push-down and over-fetch for a request path.

        The longest route prefix that ``path`` is under, by whole segments, wins.
        """
        best = max((p for p in self.routes if path_under(path, p)), key=len, default=None)
        options = self.routes[best] if best is not None else RouteOptions()
        defaults = self.filter
        push_down = options.push_down if options.push_down is not None else True
        tenant_key = options.tenant_key if options.tenant_key is not None else defaults.tenant_key
        return RoutePolicy(
            mode=options.mode or defaults.mode,
            tenant_key=tenant_key if push_down else None,
            overfetch_factor=(
                options.overfetch_factor
                if options.overfetch_factor is not None
                else defaults.overfetch_factor
            ),
            substitute_superseded=(
                options.substitute_superseded
                if options.substitute_superseded is not None
                else defaults.substitute_superseded
            ),
            pass_upstream_errors=bool(options.pass_upstream_errors),
        )


# The groups in the order the documentation and --help list them.
GROUPS: dict[str, type[Group]] = {
    cls.group: cls
    for cls in (
        ListenSettings,
        IdentitySettings,
        PolicySettings,
        StoreSettings,
        CacheSettings,
        AuditSettings,
        TelemetrySettings,
        FilterSettings,
        UpstreamSettings,
    )
}
# The top-level tables of prefix or name = {options}, which only a file can express.
TABLES = {
    "routes": "per path prefix: overrides of the filter settings and the released fields",
    "formats": "per format name: the adapter's options",
}

SETTINGS: tuple[Setting, ...] = tuple(
    spec for cls in GROUPS.values() for spec in group_settings(cls)
)


def format_table(settings: Settings) -> FormatTable:
    """The format adapters these settings configure; raises ValueError naming the option."""
    pinned = {prefix: o.format for prefix, o in settings.routes.items() if o.format is not None}
    fields_per_route = {
        prefix: {
            name: list(value)
            for name in ("hashed_fields", "releasable_fields")
            if (value := getattr(options, name)) is not None
        }
        for prefix, options in settings.routes.items()
        if options.hashed_fields is not None or options.releasable_fields is not None
    }
    return build_format_table(
        settings.formats,
        pinned,
        text_field=settings.filter.text_field,
        id_field=settings.filter.id_field,
        route_options=fields_per_route,
    )
