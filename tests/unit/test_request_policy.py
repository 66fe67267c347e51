"""RequestPolicy against the real request policy in policies/, and its failure modes."""

from __future__ import annotations

import re
import shutil
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import regorus

from sidecar.config import default_policy_dir
from sidecar.core.policy import PolicyError
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.rego.request_policy import RequestPolicy

FORBIDDEN = ["COLLECTION_FORBIDDEN"]
DATA: dict[str, Any] = {
    "retrieval_gate": {
        "collections": {
            "sops": {"tenants": ["acme", "initech"]},
            "finance": {"tenants": ["globex"]},
        }
    }
}


def make_request(collection: Any = "sops", tenant: Any = "acme", **fields: Any) -> dict[str, Any]:
    """A search request on ``collection`` (None: none) by a caller of ``tenant``."""
    return {
        "caller": {"tenant": tenant, "principals": ["user:alice"], "drafts_allowed": False},
        "method": "POST",
        "path": f"/collections/{collection}/points/search",
        "collections": [] if collection is None else [collection],
        "route_kind": "filtered",
        **fields,
    }


def with_collections(collections: Any) -> dict[str, Any]:
    return {"retrieval_gate": {"collections": collections}}


@pytest.fixture(scope="module")
def policy() -> RequestPolicy:
    return RequestPolicy.from_directory(default_policy_dir(), data=DATA)


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """A private copy of policies/ that a test may edit."""
    copy = tmp_path / "policies"
    shutil.copytree(default_policy_dir(), copy)
    return copy


# Collection ownership


@pytest.mark.parametrize(
    ("collection", "tenant", "expected"),
    [
        ("sops", "acme", []),
        ("sops", "initech", []),
        ("sops", "globex", FORBIDDEN),
        ("sops", "ACME", FORBIDDEN),
        ("finance", "acme", FORBIDDEN),
        ("public", "globex", []),
        (None, "globex", []),
    ],
    ids=[
        "owner",
        "second-owner",
        "other-tenant",
        "case",
        "other-collection",
        "undescribed",
        "none",
    ],
)
def test_collection_ownership(
    policy: RequestPolicy, collection: str | None, tenant: str, expected: list[str]
) -> None:
    assert policy.evaluate(make_request(collection, tenant)) == expected


@pytest.mark.parametrize("tenant", [None, "", 7, ["acme"]], ids=repr)
def test_a_null_empty_or_mistyped_caller_tenant_is_forbidden(
    policy: RequestPolicy, tenant: Any
) -> None:
    assert policy.evaluate(make_request("sops", tenant)) == FORBIDDEN


def test_a_caller_without_tenant_is_forbidden(policy: RequestPolicy) -> None:
    request = make_request("sops", caller={"principals": ["user:alice"]})
    assert policy.evaluate(request) == FORBIDDEN


@pytest.mark.parametrize("collection", [0, ["sops"], {"name": "sops"}, True], ids=repr)
def test_a_mistyped_collection_is_forbidden(policy: RequestPolicy, collection: Any) -> None:
    assert policy.evaluate(make_request(collection)) == FORBIDDEN


@pytest.mark.parametrize("collections", ["sops", None, {"sops": True}], ids=repr)
def test_collections_that_are_not_a_list_are_forbidden(
    policy: RequestPolicy, collections: Any
) -> None:
    assert policy.evaluate(make_request(collections=collections)) == FORBIDDEN


@pytest.mark.parametrize(
    ("collections", "tenant", "expected"),
    [
        (["sops", "public"], "acme", []),
        (["sops", "finance"], "acme", FORBIDDEN),  # every named collection must pass
        (["*"], "acme", FORBIDDEN),  # every index: finance is globex's
        (["fin*"], "acme", FORBIDDEN),
        (["fin*"], "globex", []),
        (["so*", "pub*"], "initech", []),
    ],
    ids=["two-allowed", "one-forbidden", "everything", "pattern-other", "pattern-own", "mixed"],
)
def test_every_collection_and_pattern_is_checked(
    policy: RequestPolicy, collections: list[str], tenant: str, expected: list[str]
) -> None:
    assert policy.evaluate(make_request(tenant=tenant, collections=collections)) == expected


def test_a_missing_collection_is_forbidden_even_without_data() -> None:
    request = make_request()
    del request["collections"]
    assert RequestPolicy.from_directory(default_policy_dir()).evaluate(request) == FORBIDDEN


@pytest.mark.parametrize("data", [None, {}, {"other": {"x": 1}}], ids=repr)
def test_without_collection_data_everything_is_allowed(data: dict[str, Any] | None) -> None:
    policy = RequestPolicy.from_directory(default_policy_dir(), data=data)
    assert policy.evaluate(make_request("sops", "globex")) == []
    assert policy.evaluate(make_request("finance", "acme")) == []


@pytest.mark.parametrize(
    "description",
    [{}, {"tenants": "acme"}, {"tenants": {"acme": True}}, {"tenants": None}, ["acme"], None],
    ids=repr,
)
def test_a_malformed_description_forbids_its_collection(description: Any) -> None:
    policy = RequestPolicy.from_directory(
        default_policy_dir(), data=with_collections({"sops": description})
    )
    assert policy.evaluate(make_request("sops", "acme")) == FORBIDDEN
    assert policy.evaluate(make_request("public", "acme")) == []


@pytest.mark.parametrize("collections", [["sops"], "sops", False, 0], ids=repr)
def test_collections_that_are_not_an_object_forbid_every_collection(collections: Any) -> None:
    policy = RequestPolicy.from_directory(default_policy_dir(), data=with_collections(collections))
    assert policy.evaluate(make_request("public", "acme")) == FORBIDDEN
    assert policy.evaluate(make_request(None, "acme")) == []


# Policy data validation


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"retrieval_gate": {"request": {"denials": []}}},
            "at package data.retrieval_gate.request",
        ),
        ({"retrieval_gate": {"chunks": {}}}, "at package data.retrieval_gate.chunks"),
        ({"retrieval_gate": 5}, "non-object value above package"),
        ({"retrieval_gate": {"collections": {1: {"tenants": []}}}}, "not JSON-serialisable"),
        ({"when": object()}, "not JSON-serialisable"),
        (["sops"], "must be a JSON object"),
    ],
    ids=["shadows-denials", "inside-chunks", "non-object-above", "int-key", "object", "array"],
)
def test_invalid_policy_data_is_rejected_at_load(data: Any, message: str) -> None:
    # Data at a package's path would replace its rules in regorus: data that
    # set `denials` to [] would allow every request.
    with pytest.raises(PolicyError, match=re.escape(message)):
        RequestPolicy.from_directory(default_policy_dir(), data=data)
    with pytest.raises(PolicyError, match=re.escape(message)):
        RegorusEngine.from_directory(default_policy_dir(), data=data)


# Version


def test_version_is_shared_with_the_chunk_engine_for_the_same_directory_and_data(
    policy: RequestPolicy,
) -> None:
    assert policy.version == RegorusEngine.from_directory(default_policy_dir(), data=DATA).version
    assert (
        RequestPolicy.from_directory(default_policy_dir()).version
        == RegorusEngine.from_directory(default_policy_dir()).version
    )


def test_version_changes_with_data(policy: RequestPolicy) -> None:
    without = RequestPolicy.from_directory(default_policy_dir())
    other = RequestPolicy.from_directory(default_policy_dir(), data=with_collections({}))
    assert re.fullmatch(r"sha256:[0-9a-f]{16}", policy.version)
    assert len({without.version, policy.version, other.version}) == 3


def test_empty_data_is_no_data() -> None:
    assert (
        RequestPolicy.from_directory(default_policy_dir(), data={}).version
        == RequestPolicy.from_directory(default_policy_dir()).version
    )


def test_version_ignores_the_key_order_of_the_data(policy: RequestPolicy) -> None:
    collections = DATA["retrieval_gate"]["collections"]
    reordered = with_collections(dict(reversed(list(collections.items()))))
    assert RequestPolicy.from_directory(default_policy_dir(), data=reordered).version == (
        policy.version
    )


def test_version_changes_when_the_request_policy_changes(policy_dir: Path) -> None:
    before = RequestPolicy.from_directory(policy_dir).version
    request = policy_dir / "request.rego"
    request.write_text(request.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert RequestPolicy.from_directory(policy_dir).version != before


# Directories


def test_a_directory_with_only_the_request_policy_works(tmp_path: Path) -> None:
    shutil.copy(default_policy_dir() / "request.rego", tmp_path)
    policy = RequestPolicy.from_directory(tmp_path, data=DATA)
    assert policy.evaluate(make_request("sops", "globex")) == FORBIDDEN


def test_a_directory_without_the_request_policy_is_rejected(policy_dir: Path) -> None:
    (policy_dir / "request.rego").unlink()
    with pytest.raises(PolicyError, match=r"data\.retrieval_gate\.request\.denials"):
        RequestPolicy.from_directory(policy_dir)


def test_a_request_test_file_is_not_loaded(policy_dir: Path) -> None:
    (policy_dir / "request_test.rego").write_text("this is not Rego", encoding="utf-8")
    assert RequestPolicy.from_directory(policy_dir).evaluate(make_request()) == []


# Output shape and evaluation errors


def policy_with(rules: str) -> RequestPolicy:
    return RequestPolicy(
        {"p.rego": f"package retrieval_gate.request\n\nimport rego.v1\n\n{rules}\n"}
    )


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("denials := [1]", "array of strings"),
        ('denials := "COLLECTION_FORBIDDEN"', "got str"),
        ('denials := {"COLLECTION_FORBIDDEN"}', "got set"),
        ("denials := {}", "got dict"),
        ("denials := [] if false", "got undefined"),
    ],
)
def test_a_rule_of_the_wrong_shape_is_rejected_at_load(rules: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        policy_with(rules)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"COLLECTION_FORBIDDEN"}', "got set"),
        ('"COLLECTION_FORBIDDEN"', "got str"),
        ("[null]", "array of strings"),
        ('{"reason": "X"}', "got dict"),
    ],
)
def test_a_result_of_the_wrong_shape_is_a_policy_error(value: str, message: str) -> None:
    # Well-formed for the load-time sample (no collections), malformed otherwise.
    policy = policy_with(f"denials := [] if input.collections == [] else := {value}")
    with pytest.raises(PolicyError, match=message):
        policy.evaluate(make_request())


def test_an_undefined_result_is_a_policy_error() -> None:
    policy = policy_with("denials := [] if input.collections == []")
    with pytest.raises(PolicyError, match="got undefined"):
        policy.evaluate(make_request())


def test_a_runtime_error_is_a_policy_error_that_does_not_quote_the_input() -> None:
    policy = policy_with(
        "denials := [] if input.collections == [] else := [] if { some part in input.path }"
    )
    secret = "merger-plan-confidential"
    with pytest.raises(PolicyError) as caught:
        policy.evaluate(make_request(secret))
    assert "p.rego:5" in str(caught.value)
    assert "confidential" not in str(caught.value)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


def test_an_input_that_is_not_json_is_a_policy_error(policy: RequestPolicy) -> None:
    with pytest.raises(PolicyError, match="JSON"):
        policy.evaluate(make_request(method=object()))


# Threads and engine sharing


def test_each_thread_gets_its_own_engine(policy: RequestPolicy) -> None:
    def evaluate(i: int) -> tuple[int, list[str]]:
        return i, policy.evaluate(make_request("sops", "acme" if i % 2 else "globex"))

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(evaluate, range(200)))

    for i, denials in results:
        assert denials == ([] if i % 2 else FORBIDDEN)


def test_the_chunk_and_request_policies_share_one_engine_per_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_engine = regorus.Engine
    built: list[int] = []

    def counting_engine() -> Any:
        built.append(threading.get_ident())
        return real_engine()

    monkeypatch.setattr(regorus, "Engine", counting_engine)
    # Sources of their own, so that no engine cached for this thread is reused.
    sources = {
        path.name: path.read_text(encoding="utf-8")
        for path in default_policy_dir().glob("*.rego")
        if not path.name.endswith("_test.rego")
    }
    sources["unique.rego"] = f"package unique\n\n# {uuid.uuid4()}\n"

    chunks = RegorusEngine(sources, data=DATA)
    request = RequestPolicy(sources, data=DATA)

    assert len(built) == 1
    assert request.evaluate(make_request("sops", "globex")) == FORBIDDEN
    assert chunks.evaluate({"caller": {}, "now_ns": 0, "chunks": []}) == {}
    assert len(built) == 1
