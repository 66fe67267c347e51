"""The Rego unit tests in policies/, evaluated by OPA's own engine as well as regorus.

The gate runs the same policy in process (regorus) or on an OPA server: a
rule that OPA reads differently (OPA hoists a reference out of `not`, so
`not c.status in S` is undefined for a chunk without `status`, while
regorus finds it true) would enforce one policy in one deployment and
another in the next. Every test rule must pass under both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import default_policy_dir
from sidecar.core.chunk_record import Status
from sidecar.core.policy import PolicyError
from sidecar.rego.rego_tests import RegoTestResult, run_rego_tests
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.rego.request_policy import RequestPolicy
from tests.fixtures.opa_go import GoPolicy, run_rego_tests_on_opa

POLICY_DIR = default_policy_dir()
NAMES = [result.name for result in run_rego_tests(POLICY_DIR)]


def short_name(name: str) -> str:
    return ".".join(name.rsplit(".", 2)[-2:])


@pytest.fixture(scope="module")
def under_opa() -> dict[str, RegoTestResult]:
    return {result.name: result for result in run_rego_tests_on_opa(POLICY_DIR)}


@pytest.mark.parametrize("name", NAMES, ids=[short_name(n) for n in NAMES])
def test_policy_rule_under_opa(under_opa: dict[str, RegoTestResult], name: str) -> None:
    result = under_opa[name]
    assert result.passed, f"{result.name} ({result.location}): {result.message}"


@pytest.fixture(scope="module")
def go_policy() -> GoPolicy:
    return GoPolicy.from_directory(POLICY_DIR)


CALLER = {"tenant": "acme", "principals": ["group:qa"], "drafts_allowed": False}
APPROVED = {
    "id": "c1",
    "tenant_id": "acme",
    "allowed_principals": ["group:qa"],
    "status": Status.APPROVED.value,
    "effective_at_ns": 0,
    "expires_at_ns": None,
}


@pytest.mark.parametrize(
    "chunk",
    [
        {k: v for k, v in APPROVED.items() if k != "status"},
        {**APPROVED, "status": None},
        {**APPROVED, "status": ["approved"]},
        {**APPROVED, "status": {"approved": True}},
        {**APPROVED, "status": 1},
    ],
    ids=["absent", "null", "array", "object", "number"],
)
def test_a_chunk_without_a_usable_status_is_denied_under_both_engines(
    go_policy: GoPolicy, chunk: dict[str, object]
) -> None:
    document = {"caller": CALLER, "now_ns": 1, "chunks": [chunk]}
    regorus = RegorusEngine.from_directory(POLICY_DIR).evaluate(document)
    opa = go_policy.evaluate("data.retrieval_gate.chunks.reasons", document)
    assert opa == regorus == {"c1": ["POLICY_DENY"]}


def test_an_approved_chunk_is_admitted_under_both_engines(go_policy: GoPolicy) -> None:
    # The check above must be able to pass: the same chunk with its status is admitted.
    document = {"caller": CALLER, "now_ns": 1, "chunks": [APPROVED]}
    assert go_policy.evaluate("data.retrieval_gate.chunks.reasons", document) == {"c1": []}
    assert RegorusEngine.from_directory(POLICY_DIR).evaluate(document) == {"c1": []}


def test_the_opa_runner_reports_a_failing_rule(tmp_path: Path) -> None:
    (tmp_path / "p.rego").write_text("package p\n\nimport rego.v1\n\nx := 1\n")
    (tmp_path / "p_test.rego").write_text(
        "package p_test\n\nimport rego.v1\n\nimport data.p\n\n"
        "test_pass if p.x == 1\n\ntest_fail if p.x == 2\n"
    )
    results = {r.name.rsplit(".", 1)[-1]: r for r in run_rego_tests_on_opa(tmp_path)}
    assert results["test_pass"].passed
    assert not results["test_fail"].passed
    assert "undefined under OPA" in results["test_fail"].message


@pytest.mark.parametrize("pattern", ["fin[*", "fin{*", "fin?["])
def test_a_pattern_glob_cannot_parse_never_spares_a_reserved_collection(pattern: str) -> None:
    # OPA's server, without strict builtin errors, reads glob.match's error as
    # undefined; the policy must then still refuse, never spare "finance".
    data = {"retrieval_gate": {"collections": {"finance": {"tenants": ["globex"]}}}}
    document = {
        "caller": CALLER,
        "method": "POST",
        "path": "/x",
        "collections": [pattern],
        "route_kind": "filtered",
    }
    go = GoPolicy.from_directory(POLICY_DIR, data=data)
    local = RequestPolicy.from_directory(POLICY_DIR, data=data)
    for evaluate in (
        lambda d: go.evaluate("data.retrieval_gate.request.denials", d),
        local.evaluate,
    ):
        try:
            denials = evaluate(document)
        except PolicyError:
            continue  # an error fails the request closed
        assert denials == ["COLLECTION_FORBIDDEN"]
