"""The one line a starting sidecar logs about what it enforces.

An operator reading the log of a running gate should see, without the
settings file, who it believes the caller is, which store and how many
records, which policy, which field push-down uses and where it is off, the
over-fetch, and which formats are on. Nothing secret: a PostgreSQL URL is
redacted, key files are not named, and no credential is read.
"""

from __future__ import annotations

import json

from sidecar.config import Settings
from sidecar.postgres.dsn import redact_url
from sidecar.store.inspection import inspect_store
from sidecar.store.open import is_postgres_url
from sidecar.store.store import StoreUnavailable


def record_count(settings: Settings) -> int | None:
    """The store's record count, or None when it cannot be had now (unreachable, slow)."""
    try:
        return inspect_store(settings.store.url, pgbouncer=settings.store.pgbouncer).records
    except (StoreUnavailable, ValueError):
        return None


def startup_summary(
    settings: Settings,
    *,
    records: int | None,
    policy_version: str,
    policy_source: str,
    formats: list[str],
) -> str:
    """``key=value`` pairs, space-separated, in a fixed order (for humans and grep); a value
    with a space in it is quoted."""
    mode = settings.identity.mode
    store = settings.store.url
    shown_store = redact_url(store) if is_postgres_url(store) else store
    pairs = [
        ("identity", mode.value if mode is not None else "none"),
        ("store", shown_store),
        ("records", "unknown" if records is None else str(records)),
        ("policy", policy_version),
        ("policy_source", policy_source),
        ("tenant_key", _tenant_keys(settings)),
        ("push_down", _push_down(settings)),
        ("overfetch", _overfetch(settings)),
        ("formats", ",".join(formats) or "none"),
    ]
    return "retrieval-gate starting: " + " ".join(f"{key}={_quoted(value)}" for key, value in pairs)


def _quoted(value: str) -> str:
    """``value``, in JSON quotes when it holds a space or a quote (a path, ``bundle <url>``)."""
    return json.dumps(value) if any(c.isspace() or c == '"' for c in value) else value


def _tenant_keys(settings: Settings) -> str:
    """The default field, and the routes that name another."""
    others = [
        f"{prefix}:{options.tenant_key}"
        for prefix, options in settings.routes.items()
        if options.tenant_key is not None and options.tenant_key != settings.filter.tenant_key
    ]
    return settings.filter.tenant_key + (f"({','.join(others)})" if others else "")


def _push_down(settings: Settings) -> str:
    off = [prefix for prefix, options in settings.routes.items() if options.push_down is False]
    return "on" + (f"(off:{','.join(off)})" if off else "")


def _overfetch(settings: Settings) -> str:
    factor = settings.filter.overfetch_factor
    routes = [
        f"{prefix}:{options.overfetch_factor:g}"
        for prefix, options in settings.routes.items()
        if options.overfetch_factor is not None and options.overfetch_factor != factor
    ]
    default = "off" if factor <= 1 else f"{factor:g}x,cap={settings.filter.overfetch_cap}"
    return default + (f"({','.join(routes)})" if routes else "")
