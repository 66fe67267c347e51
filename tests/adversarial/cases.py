"""The adversarial case generator: ``generate(seed, count)`` gives the same cases for the same seed.

Cases are drawn round-robin over the classes in ``CYCLE`` (so a small count
still covers every class), each with parameters drawn from the seeded random
generator; ``model`` says what a case is and what it expects.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from tests.adversarial import header_cases, record_cases, tenant_cases, token_cases
from tests.adversarial.model import Case, Draw

GENERATORS: dict[str, Callable[[Draw], Case]] = {
    "forged_headers": header_cases.forged_headers,
    "duplicate_credentials": header_cases.duplicate_credentials,
    "header_syntax": header_cases.header_syntax,
    "token_confusion": token_cases.token_confusion,
    "claims": token_cases.claims,
    "time_edges": token_cases.time_edges,
    "unicode_tenants": tenant_cases.unicode_tenants,
    "control_and_long": tenant_cases.control_and_long,
    "chunk_collisions": tenant_cases.chunk_collisions,
    "record_fields": record_cases.records,
    "store_collisions": record_cases.store_collisions,
}
# One round of classes; token confusion, the largest space, comes up twice.
CYCLE = (
    "forged_headers",
    "duplicate_credentials",
    "header_syntax",
    "token_confusion",
    "claims",
    "time_edges",
    "unicode_tenants",
    "control_and_long",
    "chunk_collisions",
    "record_fields",
    "store_collisions",
    "token_confusion",
)


def generate(seed: int, count: int) -> list[Case]:
    """``count`` cases from ``seed``: the same list every time for the same arguments."""
    draw = Draw(random.Random(seed))
    for number in range(count):
        draw.number = number
        draw.kind = CYCLE[number % len(CYCLE)]
        draw.made.append(GENERATORS[draw.kind](draw))
    return draw.made
