"""Token cases: forged and confused tokens, claims, and times around the leeway's edges."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from tests.adversarial.model import (
    ADMIT,
    API_KEY,
    BEARER,
    DEFAULT_PRINCIPALS,
    EITHER,
    LEEWAY_SECONDS,
    REFUSE,
    Draw,
    HttpCase,
    http_case,
    pick_other,
    pick_tenant,
)
from tests.adversarial.tokens import (
    ABSENT,
    ATTACKER_JWK,
    ATTACKER_URL,
    ATTACKER_X5C,
    GATE_SIGNERS,
    Rel,
    TokenSpec,
)
from tests.fixtures import tokens as fixture_tokens

_KIDS: tuple[Any, ...] = (
    "../../../../dev/null",
    "' OR '1'='1",
    "rsa-1\x00",
    "RSA-1",
    "rsa-1 ",
    " rsa-1",
    "rsa-1\n",
    "*",
    "",
    "k" * 10_000,
    123,
    ["rsa-1"],
    {"kid": "rsa-1"},
    True,
)


def token_confusion(draw: Draw) -> HttpCase:
    """Forged and confused tokens: alg none, HS/RS confusion, foreign keys, kid/jku/x5u/jwk/x5c,
    nested JWTs, tampering and re-encoding."""
    rng = draw.rng
    victim = pick_tenant(rng)
    own = pick_other(rng, victim)  # the attacker's real tenant, where it holds a valid token
    claims = {"tenant": victim}
    builders: list[Callable[[], tuple[str, TokenSpec, str, set[str]]]] = [
        lambda: _alg_none(rng, claims),
        lambda: _hmac_confusion(rng, claims),
        lambda: _foreign_key(rng, claims),
        lambda: _kid_trick(rng, claims, victim),
        lambda: _key_url(rng, claims),
        lambda: _embedded_key(rng, claims),
        lambda: _nested(rng, claims, own),
        lambda: _tampered(rng, own, victim),
        lambda: _reencoded(rng, own),
        lambda: _alg_spelling(rng, own),
    ]
    what, spec, expect, actors = rng.choice(builders)()
    location = rng.choice((BEARER, API_KEY))
    tenant = next(iter(actors)) if expect != REFUSE else None
    return http_case(draw, what, [location], [spec], expect, actors, tenant)


def _alg_none(rng: random.Random, claims: dict[str, Any]) -> tuple[str, TokenSpec, str, set[str]]:
    alg = rng.choice(("none", "None", "NONE", "nOnE", "none "))
    kid = rng.choice((ABSENT, "rsa-1", "hs-1"))
    mutation = rng.choice(("", "swap-signature"))
    spec = TokenSpec("unsigned", claims, {"kid": kid}, alg=alg, mutation=mutation)
    return f"alg {alg!r}, kid {kid!r}, {mutation or 'empty signature'}", spec, REFUSE, set()


def _hmac_confusion(
    rng: random.Random, claims: dict[str, Any]
) -> tuple[str, TokenSpec, str, set[str]]:
    signer = rng.choice(("rsa-pem-as-hmac", "rsa-jwk-as-hmac", "attacker-hs"))
    alg = rng.choice(("HS256", "HS384", "HS512"))
    kid = rng.choice(("rsa-1", "hs-1", ABSENT))
    return (
        f"{signer} {alg}, kid {kid!r}",
        TokenSpec(signer, claims, {"kid": kid}, alg),
        REFUSE,
        set(),
    )


def _foreign_key(
    rng: random.Random, claims: dict[str, Any]
) -> tuple[str, TokenSpec, str, set[str]]:
    signer = rng.choice(("attacker-rsa", "attacker-ec"))
    kid = rng.choice(("rsa-1", "ec-1", "hs-1", ABSENT, "attacker-1"))
    alg = rng.choice((None, "PS256", "RS512"))
    spec = TokenSpec(signer, claims, {"kid": kid}, alg=alg)
    return f"{signer} key, kid {kid!r}, alg {alg}", spec, REFUSE, set()


def _kid_trick(
    rng: random.Random, claims: dict[str, Any], victim: str
) -> tuple[str, TokenSpec, str, set[str]]:
    kid = rng.choice(_KIDS)
    shown = f"{kid[:12]!r}... ({len(kid)})" if isinstance(kid, str) and len(kid) > 40 else repr(kid)
    if rng.random() < 0.5:
        spec = TokenSpec("attacker-rsa", claims, {"kid": kid})
        return f"attacker key, kid {shown}", spec, REFUSE, set()
    # The gate's own signature under a kid that is not its key's: the claims
    # are the issuer's, so a verifier that tries every key may admit them, for
    # the tenant they name and nobody else.
    spec = TokenSpec("rsa", claims, {"kid": kid})
    return f"gate's RSA signature, kid {shown}", spec, EITHER, {victim}


def _key_url(rng: random.Random, claims: dict[str, Any]) -> tuple[str, TokenSpec, str, set[str]]:
    member = rng.choice(("jku", "x5u"))
    kid = rng.choice(("attacker-1", "rsa-1"))
    spec = TokenSpec("attacker-rsa", claims, {member: ATTACKER_URL, "kid": kid})
    return f"{member} to the attacker's JWKS, kid {kid!r}", spec, REFUSE, set()


def _embedded_key(
    rng: random.Random, claims: dict[str, Any]
) -> tuple[str, TokenSpec, str, set[str]]:
    if rng.random() < 0.5:
        kid = rng.choice((ABSENT, "attacker-1", "rsa-1"))
        spec = TokenSpec("attacker-rsa", claims, {"jwk": ATTACKER_JWK, "kid": kid})
        return f"embedded jwk, kid {kid!r}", spec, REFUSE, set()
    kid = rng.choice((ABSENT, "ec-1"))
    spec = TokenSpec("attacker-ec", claims, {"x5c": ATTACKER_X5C, "kid": kid})
    return f"embedded x5c, kid {kid!r}", spec, REFUSE, set()


def _nested(
    rng: random.Random, claims: dict[str, Any], own: str
) -> tuple[str, TokenSpec, str, set[str]]:
    inner = TokenSpec(rng.choice(GATE_SIGNERS), claims={"tenant": own})
    outer = rng.choice(("rsa", "unsigned", "attacker-rsa"))
    variant = rng.randrange(3)
    if variant == 0:
        # The attacker's own valid token as the payload of an outer one.
        return f"nested JWT in a {outer} token", TokenSpec(outer, inner=inner), REFUSE, {own}
    if variant == 1:
        # A JWT header that announces a nested token over plain claims: the
        # gate's own signature may pass (cty is advisory), a forgery may not.
        spec = TokenSpec(outer, claims, {"cty": "JWT"})
        what = f"cty JWT on a {outer} token with JSON claims"
        if outer == "rsa":
            return what, spec, EITHER, {claims["tenant"]}
        return what, spec, REFUSE, set()
    # A valid token whose tenant claim is itself a token: the tenant is that text.
    nested_tenant = "eyJhbGciOiJub25lIn0.eyJ0ZW5hbnQiOiJhY21lIn0."
    spec = TokenSpec(rng.choice(GATE_SIGNERS), claims={"tenant": nested_tenant})
    return "tenant claim holding a JWT", spec, ADMIT, {nested_tenant}


def _tampered(rng: random.Random, own: str, victim: str) -> tuple[str, TokenSpec, str, set[str]]:
    change = rng.choice(
        (
            {"tenant": victim},
            {"groups": ["qa", "hr"]},
            {"exp": Rel(86_400)},
            {"aud": "other"},
            {"tenant": victim, "exp": Rel(600)},
        )
    )
    spec = TokenSpec(rng.choice(GATE_SIGNERS), claims={"tenant": own}, tamper=change)
    return f"claims {sorted(change)} changed after signing", spec, REFUSE, {own}


def _reencoded(rng: random.Random, own: str) -> tuple[str, TokenSpec, str, set[str]]:
    mutation = rng.choice(
        (
            "strip-signature",
            "swap-signature",
            "jwe-shape",
            "pad-payload",
            "trailing-dot",
            "space-inside",
            "pad-signature",
        )
    )
    # Padding the signature leaves the signed bytes unchanged: a decoder may accept it.
    expect = EITHER if mutation == "pad-signature" else REFUSE
    spec = TokenSpec(rng.choice(GATE_SIGNERS), claims={"tenant": own}, mutation=mutation)
    return f"valid token, {mutation}", spec, expect, {own}


def _alg_spelling(rng: random.Random, own: str) -> tuple[str, TokenSpec, str, set[str]]:
    alg = rng.choice(("rs256", "Rs256", "RS256 ", "RS1", "HS256", "ES256", "EdDSA", "none\x00"))
    spec = TokenSpec("rsa", claims={"tenant": own}, alg=alg)
    return f"gate's RSA signature, alg {alg!r}", spec, REFUSE, {own}


def claims(draw: Draw) -> HttpCase:
    """Tokens the gate's keys signed with a wrong issuer or audience, or unusable tenant or
    principal claims."""
    rng = draw.rng
    tenant = pick_tenant(rng)
    iss, aud = fixture_tokens.ISSUER, fixture_tokens.AUDIENCE
    refuse: list[tuple[str, dict[str, Any]]] = [
        *[
            (f"iss {v!r}", {"iss": v})
            for v in (
                iss + "/",
                iss.upper(),
                iss.replace("https", "http"),
                iss + ".evil",
                "https://evil.test",
                ABSENT,
                None,
                [iss],
                1,
            )
        ],
        *[
            (f"aud {v!r}", {"aud": v})
            for v in (
                "someone-else",
                ["other"],
                aud.upper(),
                aud + " ",
                aud + "-admin",
                ABSENT,
                None,
                [],
            )
        ],
        *[
            (f"tenant {v!r}", {"tenant": v})
            for v in (ABSENT, None, "", " ", "\t", 0, 1, True, [tenant], {"id": tenant})
        ],
        ("no principal claims", {"sub": ABSENT, "groups": ABSENT}),
        ("empty principal claims", {"sub": "", "groups": []}),
        ("principal claims of other types", {"sub": 7, "groups": [1, None, {"g": "qa"}]}),
    ]
    admit: list[tuple[str, dict[str, Any], frozenset[str]]] = [
        ("aud list with ours", {"aud": ["other", aud]}, DEFAULT_PRINCIPALS),
        ("aud list of ours", {"aud": [aud]}, DEFAULT_PRINCIPALS),
        (
            "other tenant claim names beside tenant",
            {
                "Tenant": pick_other(rng, tenant),
                "tenant_id": pick_other(rng, tenant),
                "x-gate-tenant": "globex",
            },
            DEFAULT_PRINCIPALS,
        ),
        ("groups as a string", {"groups": "hr"}, frozenset({"user:alice", "group:hr"})),
        ("groups with non-strings", {"groups": [1, None, "qa"]}, DEFAULT_PRINCIPALS),
        ("roles claim", {"groups": ABSENT, "roles": ["qa"]}, frozenset({"user:alice", "role:qa"})),
    ]
    spec_signer = rng.choice(GATE_SIGNERS)
    roll = rng.random()
    if roll < 0.6:
        what, change = rng.choice(refuse)
        spec = TokenSpec(spec_signer, claims={"tenant": tenant, **change})
        named = change.get("tenant", tenant)
        actors = {tenant} | ({named} if isinstance(named, str) and named != ABSENT else set())
        return http_case(draw, what, [BEARER], [spec], REFUSE, actors)
    if roll < 0.8:
        other = pick_other(rng, tenant)
        # One claim written twice: parsers keep the first or the last.
        field_name, first, second = rng.choice(
            (("tenant", tenant, other), ("exp", Rel(-3600), Rel(3600)))
        )
        spec = TokenSpec(
            spec_signer, claims={"tenant": tenant, field_name: first}, repeat={field_name: second}
        )
        expect = REFUSE if field_name == "tenant" else EITHER
        actors = {tenant, other} if field_name == "tenant" else {tenant}
        what = f"claim {field_name!r} twice in the payload"
        return http_case(
            draw, what, [BEARER], [spec], expect, actors, tenant if expect == EITHER else None
        )
    what, change, principals = rng.choice(admit)
    spec = TokenSpec(spec_signer, claims={"tenant": tenant, **change})
    return http_case(draw, what, [BEARER], [spec], ADMIT, {tenant}, tenant, principals=principals)


def time_edges(draw: Draw) -> HttpCase:
    """exp, nbf and iat at and around the leeway's edges, and of odd types.

    With the token minted at the start of second ``now`` and sent within it,
    exp = now - leeway + d expires for d <= 0 in ``jwt`` mode (PyJWT: exp <=
    now - leeway) and for d <= -1 through Envoy (now > exp + skew): d in
    -1..1 is the edge's own second, where the documents promise nothing; the
    same holds for nbf and iat at now + leeway + d.
    """
    rng = draw.rng
    tenant = pick_tenant(rng)
    roll = rng.random()
    if roll < 0.85:
        claim = rng.choice(("exp", "nbf", "iat"))
        d = rng.choice((-3600, -60, -5, -2, -1, 0, 1, 2, 5, 60, 3600))
        if claim == "exp":
            change: dict[str, Any] = {"exp": Rel(-LEEWAY_SECONDS + d), "iat": Rel(-7200)}
            expect = REFUSE if d <= -2 else ADMIT if d >= 2 else EITHER
        else:
            change = {claim: Rel(LEEWAY_SECONDS + d)}
            expect = REFUSE if d >= 2 else ADMIT if d <= 0 else EITHER
        sign = "-" if claim == "exp" else "+"
        what = f"{claim} = now {sign} leeway {d:+d} s"
        edge = expect == EITHER
    else:
        what, change, expect = rng.choice(
            (
                ("no exp", {"exp": ABSENT}, REFUSE),
                ("exp null", {"exp": None}, REFUSE),
                ("exp true", {"exp": True}, REFUSE),
                ("exp negative", {"exp": -1}, REFUSE),
                ("exp a numeric string", {"exp": "9999999999"}, EITHER),
                ("exp a float", {"exp": 4_102_444_800.5}, EITHER),
                ("exp 2**63", {"exp": 2**63}, EITHER),
                ("nbf a numeric string in the future", {"nbf": "9999999999"}, REFUSE),
                ("iat in the far past", {"iat": 1}, ADMIT),
            )
        )
        edge = False
    spec = TokenSpec(rng.choice(GATE_SIGNERS), claims={"tenant": tenant, **change})
    served = tenant if expect != REFUSE else None
    return http_case(draw, what, [BEARER], [spec], expect, {tenant}, served, edge=edge)
