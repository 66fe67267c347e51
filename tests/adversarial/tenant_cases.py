"""Tenant cases: confusable, control-character and very long tenants, and colliding chunk ids."""

from __future__ import annotations

from tests.adversarial.model import (
    ADMIT,
    API_KEY,
    BEARER,
    EITHER,
    REFUSE,
    Draw,
    HttpCase,
    http_case,
    pick_tenant,
    valid_token,
)
from tests.adversarial.tokens import TokenSpec
from tests.adversarial.world import GHOSTS, TENANTS

_PRINCIPAL_VARIANTS: tuple[tuple[str, list[str]], ...] = (
    ("groups qa", ["qa"]),
    ("groups qa and hr", ["qa", "hr"]),
    ("group Cyrillic shha-r", ["\u04bbr"]),
    ("group HR", ["HR"]),
    ("group 'hr '", ["hr "]),
    ("group fullwidth hr", ["\uff48\uff52"]),
    ("group hr + zero-width space", ["hr\u200b"]),
    ("group qa + NUL", ["qa\x00"]),
)


def unicode_tenants(draw: Draw) -> HttpCase:
    """A valid token for a tenant confusable with another (stored or not), and odd groups."""
    rng = draw.rng
    pool = [t for t in (*TENANTS.values(), *GHOSTS.values()) if len(t) < 100]
    tenant = rng.choice(pool)
    what, groups = rng.choice(_PRINCIPAL_VARIANTS)
    principals = frozenset({"user:alice", *(f"group:{g}" for g in groups)})
    spec = valid_token(rng, tenant, groups=groups)
    location = rng.choice((BEARER, API_KEY))
    return http_case(
        draw,
        f"tenant {tenant!r}, {what}",
        [location],
        [spec],
        ADMIT,
        {tenant},
        tenant,
        principals=principals,
    )


def control_and_long(draw: Draw) -> HttpCase:
    """Tenants and claims with control characters or of great length."""
    rng = draw.rng
    long_tenants = [TENANTS["long"], TENANTS["long-near-miss"], GHOSTS["long-ghost"]]
    control = [TENANTS[k] for k in ("nul", "newline", "right-to-left")]
    control += [GHOSTS[k] for k in ("tab", "nul-joined")]
    control.append("".join(chr(c) for c in range(1, 32)) + "acme")
    variant = rng.randrange(6)
    if variant <= 2:
        tenant = rng.choice(control if variant < 2 else long_tenants)
        shown = f"{len(tenant)}-character tenant" if len(tenant) > 40 else f"tenant {tenant!r}"
        return http_case(draw, shown, [BEARER], [valid_token(rng, tenant)], ADMIT, {tenant}, tenant)
    if variant == 3:
        size = rng.choice((40_000, 100_000))
        tenant = "t" * size
        expect = EITHER if size == 40_000 else REFUSE  # Envoy's 60 KiB header limit
        served = tenant if expect == EITHER else None
        return http_case(
            draw,
            f"{size}-character tenant",
            [BEARER],
            [valid_token(rng, tenant)],
            expect,
            {tenant},
            served,
        )
    if variant == 4:
        tenant = pick_tenant(rng)
        groups = [f"g{i}" for i in range(rng.choice((500, 2_000)))] + ["qa"]
        principals = frozenset({"user:alice", *(f"group:{g}" for g in groups)})
        spec = valid_token(rng, tenant, groups=groups)
        return http_case(
            draw,
            f"{len(groups)} groups",
            [BEARER],
            [spec],
            EITHER,
            {tenant},
            tenant,
            principals=principals,
        )
    tenant = pick_tenant(rng)
    spec = TokenSpec("rsa", claims={"tenant": tenant}, header={"kid": "rsa-1" + "x" * 20_000})
    return http_case(draw, "20,000-character kid", [BEARER], [spec], REFUSE, {tenant})


_COLLISION_TENANTS = ("acme", "globex", "cyrillic-a", "fullwidth", "upper", "nfd")


def chunk_collisions(draw: Draw) -> HttpCase:
    """Callers of the tenants whose chunk ids collide in the database (see ``world``)."""
    rng = draw.rng
    tenant = TENANTS[rng.choice(_COLLISION_TENANTS)]
    groups = rng.choice((["qa"], ["qa", "hr"]))
    principals = frozenset({"user:alice", *(f"group:{g}" for g in groups)})
    location = rng.choice((BEARER, API_KEY))
    spec = valid_token(rng, tenant, groups=groups)
    return http_case(
        draw,
        f"tenant {tenant!r}, groups {groups}",
        [location],
        [spec],
        ADMIT,
        {tenant},
        tenant,
        principals=principals,
    )
