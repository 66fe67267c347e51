"""Header cases: forged identity headers, two credentials in one request, odd header syntax."""

from __future__ import annotations

import base64
import json
import random

from tests.adversarial.model import (
    ADMIT,
    API_KEY,
    API_KEY_1,
    BEARER,
    BEARER_1,
    EITHER,
    REFUSE,
    Draw,
    HttpCase,
    http_case,
    pick_other,
    pick_tenant,
    valid_token,
)
from tests.adversarial.tokens import Rel, TokenSpec

# Headers a client might hope the gate, Envoy or the database reads as identity.
FORGED_NAMES = (
    "x-gate-tenant",
    "x-gate-principals",
    "x-gate-caller",
    "x-gate-drafts",
    "x-retrieval-gate-tenant",
    "x-retrieval-gate-principals",
    "x-retrieval-gate-caller",
    "x-retrieval-gate-decision-id",
    "x-retrieval-gate-admitted",
    "x-tenant",
    "x-tenant-id",
    "x-forwarded-user",
    "x-forwarded-client-cert",
    "x-jwt-payload",
    "x-auth-request-user",
    "x-envoy-internal",
    "tenant",
)


def _cased(rng: random.Random, name: str) -> str:
    style = rng.choice(("lower", "upper", "title", "mixed"))
    if style == "upper":
        return name.upper()
    if style == "title":
        return "-".join(part.capitalize() for part in name.split("-"))
    if style == "mixed":
        return "".join(c.upper() if rng.random() < 0.5 else c for c in name)
    return name


def _forged_value(name: str, victim: str) -> str:
    if "principals" in name:
        return "group:hr,user:root,group:qa"
    if name == "x-forwarded-client-cert":
        return f"URI=spiffe://cluster.local/ns/{victim}/sa/rag"
    if name == "x-jwt-payload":
        claims = json.dumps({"tenant": victim, "groups": ["hr"]}).encode()
        return base64.b64encode(claims).decode()
    if name == "x-gate-drafts" or name == "x-envoy-internal":
        return "true"
    return victim


def forged_headers(draw: Draw) -> HttpCase:
    """A valid token (or none) plus headers naming another tenant or more principals."""
    rng = draw.rng
    actor = pick_tenant(rng)
    victim = pick_tenant(rng, header_safe=True)
    names = rng.sample(FORGED_NAMES, rng.randint(1, 3))
    forged = [
        f"{_cased(rng, name)}: {_forged_value(name, victim)}".encode() for name in sorted(names)
    ]
    if rng.random() < 0.15:
        return http_case(draw, f"no token; forged {names}", forged, (), REFUSE, set())
    lines = [*forged, BEARER] if rng.random() < 0.5 else [BEARER, *forged]
    return http_case(
        draw,
        f"valid token; forged {names}",
        lines,
        [valid_token(rng, actor)],
        ADMIT,
        {actor},
        actor,
    )


def duplicate_credentials(draw: Draw) -> HttpCase:
    """Two credentials in one request: two tokens, a token and a forgery, one token twice."""
    rng = draw.rng
    actor = pick_tenant(rng)
    other = pick_other(rng, actor)
    mine, theirs = valid_token(rng, actor), valid_token(rng, other)
    forged = TokenSpec(rng.choice(("unsigned", "attacker-rsa")), claims={"tenant": other})
    expired = valid_token(rng, other, exp=Rel(-3600), iat=Rel(-7200))
    both = {actor, other}
    variants: list[tuple[str, list[bytes], list[TokenSpec], str, set[str]]] = [
        ("two bearer lines, two tenants", [BEARER, BEARER_1], [mine, theirs], REFUSE, both),
        ("bearer and api-key, two tenants", [BEARER, API_KEY_1], [mine, theirs], REFUSE, both),
        ("api-key and bearer, two tenants", [API_KEY, BEARER_1], [mine, theirs], REFUSE, both),
        ("two api-key lines, two tenants", [API_KEY, API_KEY_1], [mine, theirs], REFUSE, both),
        (
            "base64 authorization and api-key, two tenants",
            [b"authorization: {{b64-t1}}", API_KEY],
            [mine, theirs],
            REFUSE,
            both,
        ),
        (
            "one authorization line, two tokens",
            [b"authorization: Bearer {{t0}}, Bearer {{t1}}"],
            [mine, theirs],
            REFUSE,
            both,
        ),
        ("valid bearer, forged api-key", [BEARER, API_KEY_1], [mine, forged], REFUSE, {actor}),
        ("forged bearer, valid api-key", [BEARER_1, API_KEY], [mine, forged], REFUSE, {actor}),
        ("valid bearer, expired api-key", [BEARER, API_KEY_1], [mine, expired], REFUSE, both),
        (
            "valid bearer, junk api-key",
            [BEARER, b"api-key: not-a-token"],
            [mine],
            REFUSE,
            {actor},
        ),
        ("one token in both places", [BEARER, API_KEY], [mine], ADMIT, {actor}),
        ("one token in two bearer lines", [BEARER, BEARER], [mine], EITHER, {actor}),
        ("valid bearer, empty api-key", [BEARER, b"api-key: "], [mine], EITHER, {actor}),
    ]
    what, lines, specs, expect, actors = rng.choice(variants)
    return http_case(draw, what, lines, specs, expect, actors, actor if expect != REFUSE else None)


def header_syntax(draw: Draw) -> HttpCase:
    """A valid token written with odd case or whitespace, beside malformed or huge lines."""
    rng = draw.rng
    actor = pick_tenant(rng)
    victim = pick_tenant(rng, header_safe=True).encode()
    variants: list[tuple[str, list[bytes], str]] = [
        ("header name Authorization", [b"Authorization: Bearer {{t0}}"], ADMIT),
        ("header name AUTHORIZATION", [b"AUTHORIZATION: Bearer {{t0}}"], ADMIT),
        ("header name aUtHoRiZaTiOn", [b"aUtHoRiZaTiOn: Bearer {{t0}}"], ADMIT),
        ("header name API-Key", [b"API-Key: {{t0}}"], ADMIT),
        ("spaces around the value", [b"authorization:    Bearer {{t0}}   "], ADMIT),
        ("tabs around the value", [b"authorization:\tBearer {{t0}}\t"], ADMIT),
        ("scheme bearer", [b"authorization: bearer {{t0}}"], EITHER),
        ("scheme BEARER", [b"authorization: BEARER {{t0}}"], EITHER),
        ("two spaces after the scheme", [b"authorization: Bearer  {{t0}}"], EITHER),
        ("a tab after the scheme", [b"authorization: Bearer\t{{t0}}"], EITHER),
        ("space before the colon", [b"authorization : Bearer {{t0}}"], REFUSE),
        ("obs-fold before the token", [b"authorization: Bearer\r\n {{t0}}"], EITHER),
        ("token in quotes", [b'authorization: Bearer "{{t0}}"'], REFUSE),
        ("scheme without token", [b"authorization: Bearer"], REFUSE),
        ("token and a comma", [b"authorization: Bearer {{t0}},"], EITHER),
        ("api-key with a scheme", [b"api-key: Bearer {{t0}}"], EITHER),
        ("forged tenant with NUL", [BEARER, b"x-gate-tenant: " + victim + b"\x00acme"], EITHER),
        ("forged tenant with CR", [BEARER, b"x-gate-tenant: " + victim + b"\racme"], EITHER),
        ("forged tenant with \\x01", [BEARER, b"x-gate-tenant: \x01" + victim], EITHER),
        ("forged tenant with DEL", [BEARER, b"x-gate-tenant: " + victim + b"\x7f"], EITHER),
        ("forged tenant, invalid UTF-8", [BEARER, b"x-gate-tenant: glob\xe9x\xff"], EITHER),
        ("header name with spaces", [BEARER, b"x gate tenant: " + victim], EITHER),
        ("header name with underscores", [BEARER, b"x_gate_tenant: " + victim], ADMIT),
        ("8 KB forged tenant", [BEARER, b"x-gate-tenant: " + b"g" * 8_000], ADMIT),
        ("70 KB forged tenant", [BEARER, b"x-gate-tenant: " + b"g" * 70_000], EITHER),
        ("150 forged tenant lines", [BEARER, *[b"x-gate-tenant: " + victim] * 150], EITHER),
    ]
    what, lines, expect = rng.choice(variants)
    tenant = actor if expect != REFUSE else None
    return http_case(draw, what, lines, [valid_token(rng, actor)], expect, {actor}, tenant)
