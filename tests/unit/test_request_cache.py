"""The request cache: a time-pure request policy is asked once per input and policy version.

The cache must never change an answer: every fact of the policy's input is
in the key (or decided by one that is), a new policy version forgets every
answer, a failed evaluation is never kept, and a policy that does not declare
itself time-pure is asked every time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from sidecar.config import default_policy_dir
from sidecar.core.caller import Caller
from sidecar.core.policy import PolicyError
from sidecar.formats.qdrant.rest import QdrantFormat
from sidecar.formats.registry import FormatTable
from sidecar.identity import AuthRequest
from sidecar.identity.headers import TrustedHeaders
from sidecar.refusals import Refusal
from sidecar.rego.request_policy import RequestPolicy
from sidecar.request.admission import RequestAdmission, RequestRefused
from sidecar.request.answers import AnswerKey, RequestAnswers

ROUTES = FormatTable([QdrantFormat()])
SEARCH = "/collections/sops/points/search"
ALICE = {"x-gate-tenant": "acme", "x-gate-principals": "user:alice"}


class Counting:
    """A request policy that denies what ``deny`` says, counts evaluations and can fail."""

    def __init__(self, *, time_pure: bool = True) -> None:
        self.time_pure = time_pure
        self.remote = False
        self.version = "v1"
        self.inputs: list[Mapping[str, Any]] = []
        self.deny: dict[str, list[str]] = {}  # path -> denials
        self.fail = False

    def evaluate(self, request_input: Mapping[str, Any]) -> list[str]:
        self.inputs.append(request_input)
        if self.fail:
            raise PolicyError("engine failed")
        return self.deny.get(str(request_input["path"]), [])


def access_with(policy: Any, size: int = 100) -> RequestAdmission:
    return RequestAdmission(
        TrustedHeaders(),
        policy,
        route_kind=ROUTES.route_kind,
        collections=ROUTES.collections,
        answers=RequestAnswers(size),
    )


def admit(access: RequestAdmission, path: str = SEARCH, **headers: str) -> None:
    asyncio.run(access.admit(AuthRequest("POST", path, {**ALICE, **headers})))


def refused(access: RequestAdmission, path: str = SEARCH, **headers: str) -> Refusal:
    with pytest.raises(RequestRefused) as refusal:
        admit(access, path, **headers)
    return refusal.value.refusal


def test_the_same_input_is_evaluated_once() -> None:
    policy = Counting()
    access = access_with(policy)
    for _ in range(3):
        admit(access)
    assert len(policy.inputs) == 1


def test_denials_are_kept_and_answered_alike() -> None:
    policy = Counting()
    policy.deny[SEARCH] = ["COLLECTION_FORBIDDEN"]
    access = access_with(policy)
    first, second = refused(access), refused(access)
    assert (first.http_status, first.code, first.reasons) == (
        second.http_status,
        second.code,
        second.reasons,
    )
    assert first.reasons == ("COLLECTION_FORBIDDEN",)
    assert len(policy.inputs) == 1


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/collections/other/points/search", {}),  # another path and collection
        (SEARCH, {"x-gate-tenant": "globex"}),
        (SEARCH, {"x-gate-principals": "user:alice,group:qa"}),
    ],
)
def test_any_other_input_fact_is_evaluated_again(path: str, headers: dict[str, str]) -> None:
    policy = Counting()
    access = access_with(policy)
    admit(access)
    admit(access, path, **headers)
    assert len(policy.inputs) == 2
    assert policy.inputs[0] != policy.inputs[1]


class Drafts:
    """An identity provider whose caller may read drafts (as a verified scope grants)."""

    strip_headers: tuple[str, ...] = ()

    async def identify(self, request: AuthRequest) -> Caller:
        return Caller("acme", frozenset({"user:alice"}), drafts_allowed=True)


def test_the_drafts_scope_is_part_of_the_key() -> None:
    policy = Counting()
    answers = RequestAnswers(100)
    for identity in (TrustedHeaders(), Drafts()):
        access = RequestAdmission(identity, policy, route_kind=ROUTES.route_kind, answers=answers)
        admit(access)
    assert [i["caller"]["drafts_allowed"] for i in policy.inputs] == [False, True]


def test_a_new_policy_version_forgets_every_answer() -> None:
    policy = Counting()
    access = access_with(policy)
    admit(access)
    policy.version = "v2"
    policy.deny[SEARCH] = ["ROUTE_FORBIDDEN"]
    assert refused(access).reasons == ("ROUTE_FORBIDDEN",)
    assert len(policy.inputs) == 2


def test_a_failed_evaluation_is_not_kept() -> None:
    policy = Counting()
    policy.fail = True
    access = access_with(policy)
    assert refused(access).code == "policy_error"
    policy.fail = False
    admit(access)
    assert len(policy.inputs) == 2


def test_a_policy_that_is_not_time_pure_is_asked_every_time() -> None:
    policy = Counting(time_pure=False)
    access = access_with(policy)
    admit(access)
    admit(access)
    assert len(policy.inputs) == 2


def test_the_cache_is_bounded_least_recently_used_first() -> None:
    answers = RequestAnswers(2)
    keys: list[AnswerKey] = [
        ("v", Caller(f"t{i}", frozenset()), "POST", "/", (), ()) for i in range(3)
    ]
    answers.put(keys[0], ())
    answers.put(keys[1], ())
    assert answers.get(keys[0]) == ()
    answers.put(keys[2], ())
    assert len(answers) == 2
    assert answers.get(keys[1]) is None
    assert answers.get(keys[0]) == ()


def test_a_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RequestAnswers(0)


def test_the_shipped_request_policy_declares_itself_time_pure() -> None:
    assert RequestPolicy.from_directory(default_policy_dir()).time_pure is True


def test_a_request_policy_without_the_declaration_is_not_time_pure() -> None:
    rules = "package retrieval_gate.request\nimport rego.v1\ndenials := []\n"
    assert RequestPolicy({"request.rego": rules}).time_pure is False


def test_a_declaration_the_policy_contradicts_is_refused_at_load() -> None:
    rules = (
        "package retrieval_gate.request\nimport rego.v1\ntime_pure := true\n"
        'denials := ["LATE"] if time.now_ns() > 0\n'
    )
    with pytest.raises(PolicyError, match=r"time\.now_ns"):
        RequestPolicy({"request.rego": rules})


def test_the_shipped_policy_answers_alike_from_the_cache() -> None:
    policy = RequestPolicy.from_directory(
        default_policy_dir(), data={"retrieval_gate": {"collections": {"sops": {"tenants": ["x"]}}}}
    )
    access = access_with(policy)
    first, second = refused(access), refused(access)
    assert first.reasons == second.reasons == ("COLLECTION_FORBIDDEN",)
