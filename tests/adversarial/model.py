"""What a case is: the three kinds of case, and the helpers that draw them.

- :class:`HttpCase`: header lines and tokens sent through a real Envoy, in
  both JWT modes. ``expect`` is what the documentation promises: ``refuse``
  (a forged, ambiguous or invalid identity), ``admit`` (a valid identity,
  which must get exactly what the record contract admits for ``tenant``) or
  ``either`` (where the documents promise nothing: the leeway's own second,
  formatting an HTTP parser may accept or reject). ``actors`` are the tenants
  whose valid credentials the sender holds: releasing anything else is a
  cross-tenant release, whatever ``expect`` says.
- :class:`RecordCase`: a JSON Lines file for the record loader, with a
  missing, null, mistyped or otherwise bad field at a known line, or a record
  the contract accepts.
- :class:`StoreCase`: two tenants' records with one chunk id loaded one after
  the other, and both tenants' points under that id.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.adversarial.tokens import GATE_SIGNERS, TokenSpec
from tests.adversarial.world import TENANTS

LEEWAY_SECONDS = 30  # the stacks' jwt_leeway_seconds
DEFAULT_PRINCIPALS = frozenset({"user:alice", "group:qa"})

REFUSE, ADMIT, EITHER = "refuse", "admit", "either"


@dataclass(frozen=True)
class HttpCase:
    """Header lines (``{{t0}}``, ``{{b64-t0}}``: token 0, plain or base64) and their tokens."""

    case_id: str
    kind: str
    what: str
    lines: tuple[bytes, ...]
    tokens: tuple[TokenSpec, ...]
    expect: str
    actors: frozenset[str]
    tenant: str | None = None  # whom an admission must serve
    principals: frozenset[str] = DEFAULT_PRINCIPALS
    edge: bool = False  # mint at the start of a second: the case sits on a leeway edge


@dataclass(frozen=True)
class RecordCase:
    """A JSON Lines file; a rejection must name ``line``, ``field`` and ``chunk_id``."""

    case_id: str
    kind: str
    what: str
    lines: tuple[bytes, ...]
    expect: str  # "reject" or "accept"
    line: int | None = None
    field: str | None = None
    chunk_id: str | None = None  # None: the error cannot name a chunk


@dataclass(frozen=True)
class StoreCase:
    """``first`` then ``second`` store a record of ``chunk_id``; both tenants' points carry it."""

    case_id: str
    kind: str
    what: str
    chunk_id: str
    first: str
    second: str


Case = HttpCase | RecordCase | StoreCase


@dataclass
class Draw:
    """The seeded generator and the case being numbered."""

    rng: random.Random
    number: int = 0
    kind: str = ""
    made: list[Case] = field(default_factory=list)

    def case_id(self) -> str:
        """The id of the case being drawn: its class and its number in the run."""
        return f"{self.kind}-{self.number:05d}"


def pick_tenant(rng: random.Random, *, header_safe: bool = False) -> str:
    """A stored tenant (not the 4,096-character ones); ``header_safe``: one that an
    HTTP header value can carry (no control characters)."""
    tenants = [t for t in TENANTS.values() if len(t) < 100]
    if header_safe:
        tenants = [t for t in tenants if all(0x20 <= ord(c) != 0x7F for c in t)]
    return rng.choice(tenants)


def pick_other(rng: random.Random, tenant: str) -> str:
    """A stored tenant other than ``tenant``."""
    return rng.choice([t for t in TENANTS.values() if t != tenant and len(t) < 100])


def valid_token(rng: random.Random, tenant: str, **claims: Any) -> TokenSpec:
    """A token of ``tenant`` signed by one of the gate's keys, with ``claims`` changed."""
    return TokenSpec(rng.choice(GATE_SIGNERS), claims={"tenant": tenant, **claims})


def http_case(
    draw: Draw,
    what: str,
    lines: Sequence[bytes],
    tokens: Sequence[TokenSpec],
    expect: str,
    actors: set[str] | frozenset[str],
    tenant: str | None = None,
    **extra: Any,
) -> HttpCase:
    """The case being drawn; an admission must say which tenant it serves."""
    if expect == ADMIT and tenant is None:
        raise ValueError("an admission needs the tenant it serves")
    return HttpCase(
        draw.case_id(),
        draw.kind,
        what,
        tuple(lines),
        tuple(tokens),
        expect,
        frozenset(actors),
        tenant,
        **extra,
    )


# Header lines carrying token 0 or token 1 of a case.
BEARER = b"authorization: Bearer {{t0}}"
BEARER_1 = b"authorization: Bearer {{t1}}"
API_KEY = b"api-key: {{t0}}"
API_KEY_1 = b"api-key: {{t1}}"
