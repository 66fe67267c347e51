"""Adversarial identity and tenancy cases (issue 16, item 2), at a reduced count.

The cases come from the generator in ``tests/adversarial`` (seed ``SEED``):
header and token cases go through a real Envoy and ``retrieval-gate serve``,
once per JWT mode, in front of a database that ignores the pushed-down
tenant and answers with every tenant's points; record cases go through the
record loader, chunk-id collisions across loads through a sidecar assembled
in process as ``serve`` assembles it. Every run is one test and must keep
every invariant of ``tests.fixtures.adversarial.verdicts``: nothing of another tenant
released, a forged or ambiguous identity refused before the database, a
valid one served exactly what the record contract admits, a bad record
rejected with its line, chunk and field named.

The full count (1,200 cases, about 2,700 runs) is a benchmark:
``.venv/bin/python bench/adversarial.py``.

``FINDINGS`` are invariants the gate does not keep yet; their cases, and the
smallest case of each (at the end), are ``xfail(strict=True)``: once the gate
is fixed they fail until the finding and its markers are removed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.fixtures.adversarial.cases import generate
from tests.fixtures.adversarial.model import BEARER, Case, HttpCase, RecordCase, StoreCase
from tests.fixtures.adversarial.runner import MODES, EnvoyStacks, InProcessSidecar, run_record_case
from tests.fixtures.adversarial.tokens import Keys, Rel, TokenSpec
from tests.fixtures.adversarial.verdicts import Outcome
from tests.fixtures.adversarial.world import build_world

SEED = 16
ENVOY_COUNT = 24  # 20 header and token cases (every class), each through both modes
IN_PROCESS_COUNT = 240  # 20 record cases and 20 store cases: milliseconds each

HTTP_CASES = [c for c in generate(SEED, ENVOY_COUNT) if isinstance(c, HttpCase)]
_IN_PROCESS = generate(SEED, IN_PROCESS_COUNT)
RECORD_CASES = [c for c in _IN_PROCESS if isinstance(c, RecordCase)]
STORE_CASES = [c for c in _IN_PROCESS if isinstance(c, StoreCase)]

# Invariants the gate does not keep yet (none open): finding -> the runs it breaks.
FINDINGS: dict[str, Callable[[Case, str], bool]] = {}


def _params(cases: Sequence[Case], places: Sequence[str]) -> list[object]:
    return [
        pytest.param(
            case,
            where,
            id=f"{case.case_id}-{where}",
            marks=[
                pytest.mark.xfail(strict=True, reason=finding)
                for finding, applies in FINDINGS.items()
                if applies(case, where)
            ],
        )
        for case in cases
        for where in places
    ]


def _assert_kept(outcomes: Sequence[Outcome]) -> None:
    for outcome in outcomes:
        assert outcome.cross_tenant == 0, (outcome.what, outcome.problems)
        assert outcome.problems == [], (outcome.what, outcome.refusal, outcome.problems)


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvoyStacks]:
    running = EnvoyStacks(tmp_path_factory.mktemp("adversarial"), build_world(), Keys()).start()
    yield running
    running.stop()


@pytest.mark.envoy
@pytest.mark.parametrize(("case", "where"), _params(HTTP_CASES, MODES))
def test_header_and_token_case_through_envoy(
    stacks: EnvoyStacks, case: HttpCase, where: str
) -> None:
    _assert_kept(stacks.run(case, (where,)))


@pytest.mark.parametrize(("case", "where"), _params(RECORD_CASES, ("loader",)))
def test_record_case_through_the_loader(case: RecordCase, where: str, tmp_path: Path) -> None:
    _assert_kept([run_record_case(case, tmp_path)])


@pytest.fixture(scope="module")
def in_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[asyncio.AbstractEventLoop, InProcessSidecar]]:
    loop = asyncio.new_event_loop()
    sidecar = InProcessSidecar(tmp_path_factory.mktemp("collisions"))
    yield loop, sidecar
    loop.run_until_complete(sidecar.close())
    loop.close()


@pytest.mark.parametrize("case", STORE_CASES, ids=[c.case_id for c in STORE_CASES])
def test_chunk_id_loaded_for_two_tenants(
    in_process: tuple[asyncio.AbstractEventLoop, InProcessSidecar], case: StoreCase
) -> None:
    loop, sidecar = in_process
    _assert_kept(loop.run_until_complete(sidecar.run(case)))


def test_the_generator_is_deterministic_and_covers_every_class() -> None:
    again = generate(SEED, ENVOY_COUNT)
    assert [c.case_id for c in again] == [c.case_id for c in generate(SEED, ENVOY_COUNT)]
    assert [(c.what, getattr(c, "lines", ())) for c in again] == [
        (c.what, getattr(c, "lines", ())) for c in generate(SEED, ENVOY_COUNT)
    ]
    kinds = {c.kind for c in again}
    assert kinds == {
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
    }
    assert generate(SEED + 1, ENVOY_COUNT) != again


# --- Findings of this generator, fixed: each as its smallest case ----------------------------


def _minimal(what: str, lines: Sequence[bytes], tokens: Sequence[TokenSpec]) -> HttpCase:
    return HttpCase(
        f"finding-{what}", "finding", what, tuple(lines), tuple(tokens), "refuse", frozenset()
    )


@pytest.mark.envoy
def test_envoy_jwt_refuses_a_second_token_as_jwt_mode_does(stacks: EnvoyStacks) -> None:
    acme = TokenSpec("rsa", claims={"tenant": "acme"})
    globex = TokenSpec("ec", claims={"tenant": "globex"})
    case = _minimal("bearer acme, api-key globex", [BEARER, b"api-key: {{t1}}"], [acme, globex])
    (outcome,) = stacks.run(case, ("envoy-jwt",))
    assert outcome.code == "token_ambiguous", outcome.refusal


@pytest.mark.envoy
def test_envoy_jwt_refuses_an_iat_beyond_the_leeway(stacks: EnvoyStacks) -> None:
    future = TokenSpec("rsa", claims={"tenant": "acme", "iat": Rel(3600)})
    (outcome,) = stacks.run(_minimal("iat in an hour", [BEARER], [future]), ("envoy-jwt",))
    assert outcome.code == "token_not_yet_valid", outcome.refusal


@pytest.mark.envoy
def test_jwt_mode_refuses_a_tenant_claim_written_twice(stacks: EnvoyStacks) -> None:
    twice = TokenSpec("rsa", claims={"tenant": "acme"}, repeat={"tenant": "globex"})
    case = _minimal("tenant acme, then globex", [BEARER], [twice])
    outcomes = {o.where: o for o in stacks.run(case)}
    assert outcomes["envoy-jwt"].code == "token_malformed"  # Envoy's JSON parser refuses it
    assert outcomes["jwt"].code == "token_malformed", outcomes["jwt"].refusal


def test_a_repeated_key_error_names_the_chunk(tmp_path: Path) -> None:
    line = b'{"chunk_id": "c-1", "status": "approved", "status": "revoked"}'
    case = RecordCase("finding", "finding", "status twice", (line,), "reject", 1, "status", "c-1")
    _assert_kept([run_record_case(case, tmp_path)])
