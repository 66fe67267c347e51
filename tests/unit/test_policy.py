"""RegorusEngine against the real policy in policies/, and its failure modes."""

from __future__ import annotations

import gc
import re
import shutil
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import pytest
import regorus

from sidecar.config import default_policy_dir
from sidecar.core.policy import PolicyEngine, PolicyError
from sidecar.core.reasons import Reason
from sidecar.rego.purity import called_functions, is_time_pure
from sidecar.rego.regorus_engine import CompiledPolicy, RegorusEngine
from tests.fixtures.policy_inputs import CALLER, HOUR, NOW, make_chunk, make_input

ALL_CHECKS = [
    "EXPIRED",
    "NOT_YET_EFFECTIVE",
    "POLICY_DENY",
    "PRINCIPAL_MISMATCH",
    "TENANT_MISMATCH",
]


@pytest.fixture(scope="module")
def engine() -> RegorusEngine:
    return RegorusEngine.from_directory(default_policy_dir())


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """A private copy of policies/ that a test may edit."""
    copy = tmp_path / "policies"
    shutil.copytree(default_policy_dir(), copy)
    return copy


def reasons_of(engine: RegorusEngine, chunk: dict[str, Any], **input_fields: Any) -> list[str]:
    return engine.evaluate(make_input(chunk, **input_fields))[chunk["id"]]


def test_satisfies_the_policy_engine_protocol(engine: RegorusEngine) -> None:
    as_protocol: PolicyEngine = engine
    assert as_protocol.evaluate(make_input(make_chunk())) == {"c1": []}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, []),
        ({"tenant_id": "globex"}, ["TENANT_MISMATCH"]),
        ({"allowed_principals": ["group:finance"]}, ["PRINCIPAL_MISMATCH"]),
        ({"allowed_principals": ["user:bob", "user:alice"]}, []),
        ({"status": "draft"}, ["STATUS_DRAFT"]),
        ({"status": "superseded"}, ["STATUS_SUPERSEDED"]),
        ({"status": "revoked"}, ["STATUS_REVOKED"]),
        ({"status": "quarantined"}, ["STATUS_QUARANTINED"]),
        ({"status": "archived"}, ["POLICY_DENY"]),
        ({"status": "APPROVED"}, ["POLICY_DENY"]),
        ({"effective_at_ns": NOW + HOUR}, ["NOT_YET_EFFECTIVE"]),
        ({"expires_at_ns": NOW - HOUR}, ["EXPIRED"]),
    ],
    ids=lambda value: repr(value) if isinstance(value, dict) else None,
)
def test_each_reason(engine: RegorusEngine, fields: dict[str, Any], expected: list[str]) -> None:
    assert reasons_of(engine, make_chunk(**fields)) == expected


def test_emits_only_known_reasons(engine: RegorusEngine) -> None:
    statuses = ["approved", "draft", "superseded", "revoked", "quarantined", "x"]
    chunks = [make_chunk(f"c{i}", status=status) for i, status in enumerate(statuses)]
    chunks.append({"id": "bare"})
    emitted = {r for reasons in engine.evaluate(make_input(*chunks)).values() for r in reasons}
    assert emitted <= set(Reason)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"effective_at_ns": NOW}, []),
        ({"effective_at_ns": NOW + 1}, ["NOT_YET_EFFECTIVE"]),
        ({"expires_at_ns": NOW}, ["EXPIRED"]),
        ({"expires_at_ns": NOW + 1}, []),
    ],
    ids=["effective-at-now", "effective-1ns-later", "expires-at-now", "expires-1ns-later"],
)
def test_validity_boundaries_to_the_nanosecond(
    engine: RegorusEngine, fields: dict[str, Any], expected: list[str]
) -> None:
    assert reasons_of(engine, make_chunk(**fields)) == expected


def test_lists_every_failing_reason_sorted(engine: RegorusEngine) -> None:
    chunk = make_chunk(
        tenant_id="globex",
        allowed_principals=["group:finance"],
        status="revoked",
        effective_at_ns=NOW + HOUR,
        expires_at_ns=NOW,
    )
    assert reasons_of(engine, chunk) == [
        "EXPIRED",
        "NOT_YET_EFFECTIVE",
        "PRINCIPAL_MISMATCH",
        "STATUS_REVOKED",
        "TENANT_MISMATCH",
    ]


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("tenant_id", ["TENANT_MISMATCH"]),
        ("allowed_principals", ["PRINCIPAL_MISMATCH"]),
        ("status", ["POLICY_DENY"]),
        ("effective_at_ns", ["NOT_YET_EFFECTIVE"]),
        ("expires_at_ns", ["EXPIRED"]),
    ],
)
def test_a_missing_field_denies(engine: RegorusEngine, field: str, expected: list[str]) -> None:
    chunk = make_chunk()
    del chunk[field]
    assert reasons_of(engine, chunk) == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"tenant_id": None}, ["TENANT_MISMATCH"]),
        ({"tenant_id": ""}, ["TENANT_MISMATCH"]),
        ({"allowed_principals": []}, ["PRINCIPAL_MISMATCH"]),
        ({"allowed_principals": "group:qa"}, ["PRINCIPAL_MISMATCH"]),
        ({"allowed_principals": {"g": "group:qa"}}, ["PRINCIPAL_MISMATCH"]),
        ({"status": None}, ["POLICY_DENY"]),
        ({"status": ["approved"]}, ["POLICY_DENY"]),
        ({"effective_at_ns": None}, ["NOT_YET_EFFECTIVE"]),
        ({"effective_at_ns": "2026-01-01T00:00:00Z"}, ["NOT_YET_EFFECTIVE"]),
        ({"effective_at_ns": False}, ["NOT_YET_EFFECTIVE"]),
        ({"expires_at_ns": "2099-01-01T00:00:00Z"}, ["EXPIRED"]),
        ({"expires_at_ns": True}, ["EXPIRED"]),
    ],
    ids=lambda value: repr(value) if isinstance(value, dict) else None,
)
def test_a_null_or_mistyped_field_denies(
    engine: RegorusEngine, fields: dict[str, Any], expected: list[str]
) -> None:
    assert reasons_of(engine, make_chunk(**fields)) == expected


def test_a_chunk_with_only_an_id_fails_every_check(engine: RegorusEngine) -> None:
    assert reasons_of(engine, {"id": "c1"}) == ALL_CHECKS


@pytest.mark.parametrize(
    ("input_fields", "expected"),
    [
        ({"caller": {"principals": ["group:qa"]}}, ["TENANT_MISMATCH"]),
        ({"caller": {"tenant": "", "principals": ["group:qa"]}}, ["TENANT_MISMATCH"]),
        ({"caller": {"tenant": "acme"}}, ["PRINCIPAL_MISMATCH"]),
        ({"caller": {"tenant": "acme", "principals": "group:qa"}}, ["PRINCIPAL_MISMATCH"]),
        ({"caller": None}, ["PRINCIPAL_MISMATCH", "TENANT_MISMATCH"]),
        ({"now_ns": None}, ["NOT_YET_EFFECTIVE"]),
        ({"now_ns": "2026-01-01T00:00:00Z"}, ["NOT_YET_EFFECTIVE"]),
    ],
    ids=lambda value: repr(value) if isinstance(value, dict) else None,
)
def test_a_missing_or_malformed_caller_or_time_denies(
    engine: RegorusEngine, input_fields: dict[str, Any], expected: list[str]
) -> None:
    assert reasons_of(engine, make_chunk(), **input_fields) == expected


def test_a_null_tenant_never_matches_a_null_caller_tenant(engine: RegorusEngine) -> None:
    chunk = make_chunk(tenant_id=None)
    caller = {"tenant": None, "principals": ["group:qa"]}
    assert reasons_of(engine, chunk, caller=caller) == ["TENANT_MISMATCH"]


def test_output_has_an_entry_for_every_chunk_id(engine: RegorusEngine) -> None:
    variants: list[dict[str, Any]] = [
        {},
        {"status": "draft"},
        {"tenant_id": None},
        {"allowed_principals": 5},
        {"expires_at_ns": "soon"},
    ]
    chunks = [make_chunk(f"c{i}", **variants[i % len(variants)]) for i in range(100)]
    chunks.append({"id": "bare"})

    result = engine.evaluate(make_input(*chunks))

    assert set(result) == {chunk["id"] for chunk in chunks}
    assert result["c0"] == []
    assert result["c1"] == ["STATUS_DRAFT"]
    assert result["bare"] == ALL_CHECKS


def test_an_empty_batch_has_no_entries(engine: RegorusEngine) -> None:
    assert engine.evaluate(make_input()) == {}


def test_consecutive_evaluations_do_not_share_state(engine: RegorusEngine) -> None:
    assert engine.evaluate(make_input(make_chunk("a", status="draft"))) == {"a": ["STATUS_DRAFT"]}
    assert engine.evaluate(make_input(make_chunk("b"))) == {"b": []}


# Drafts


@pytest.mark.parametrize(
    ("drafts_allowed", "expected"),
    [
        (True, []),
        (False, ["STATUS_DRAFT"]),
        (None, ["STATUS_DRAFT"]),
        ("true", ["STATUS_DRAFT"]),
        (1, ["STATUS_DRAFT"]),
        ([True], ["STATUS_DRAFT"]),
    ],
    ids=repr,
)
def test_a_draft_is_admitted_only_when_drafts_allowed_is_true(
    engine: RegorusEngine, drafts_allowed: Any, expected: list[str]
) -> None:
    caller = {**CALLER, "drafts_allowed": drafts_allowed}
    assert reasons_of(engine, make_chunk(status="draft"), caller=caller) == expected


def test_a_draft_is_denied_without_drafts_allowed(engine: RegorusEngine) -> None:
    assert "drafts_allowed" not in CALLER
    assert reasons_of(engine, make_chunk(status="draft")) == ["STATUS_DRAFT"]


def test_drafts_allowed_keeps_every_other_check(engine: RegorusEngine) -> None:
    caller = {**CALLER, "drafts_allowed": True}
    chunks = [
        make_chunk("approved"),
        make_chunk("draft", status="draft"),
        make_chunk("expired-draft", status="draft", expires_at_ns=NOW, tenant_id="globex"),
        make_chunk("revoked", status="revoked"),
        make_chunk("Draft", status="Draft"),
    ]
    assert engine.evaluate(make_input(*chunks, caller=caller)) == {
        "approved": [],
        "draft": [],
        "expired-draft": ["EXPIRED", "TENANT_MISMATCH"],
        "revoked": ["STATUS_REVOKED"],
        "Draft": ["POLICY_DENY"],
    }


# Policy data

DATA = {"retrieval_gate": {"collections": {"sops": {"tenants": ["acme"]}}}}


def test_the_chunk_policy_takes_policy_data(engine: RegorusEngine) -> None:
    with_data = RegorusEngine.from_directory(default_policy_dir(), data=DATA)
    chunks = [make_chunk("a"), make_chunk("b", status="draft", tenant_id="globex")]
    assert with_data.evaluate(make_input(*chunks)) == engine.evaluate(make_input(*chunks))
    assert with_data.version != engine.version


# Every chunk gets the reasons listed in data.retrieval_gate.extra.
EXTRA_REASONS_POLICY = {
    "p.rego": (
        "package retrieval_gate.chunks\n\nimport rego.v1\n\n"
        "reasons := {c.id: [r | some r in data.retrieval_gate.extra] | some c in input.chunks}\n"
    )
}


def test_policy_data_is_visible_to_the_policy() -> None:
    engine = RegorusEngine(EXTRA_REASONS_POLICY, data={"retrieval_gate": {"extra": ["X_CUSTOM"]}})
    assert engine.evaluate(make_input(make_chunk())) == {"c1": ["X_CUSTOM"]}


def test_policy_data_is_copied_at_load() -> None:
    data = {"retrieval_gate": {"extra": ["X_CUSTOM"]}}
    engine = RegorusEngine(EXTRA_REASONS_POLICY, data=data)
    version = engine.version
    data["retrieval_gate"]["extra"] = ["CHANGED"]
    # A new thread compiles its own engine, after the change.
    with ThreadPoolExecutor(max_workers=1) as pool:
        result = pool.submit(engine.evaluate, make_input(make_chunk())).result()
    assert result == {"c1": ["X_CUSTOM"]}
    assert engine.version == version


def test_policy_data_cannot_replace_the_chunk_rule() -> None:
    # regorus would return this data instead of evaluating the rule.
    data: dict[str, Any] = {"retrieval_gate": {"chunks": {"reasons": {"c1": []}}}}
    with pytest.raises(PolicyError, match=r"data\.retrieval_gate\.chunks"):
        RegorusEngine.from_directory(default_policy_dir(), data=data)


# Version


def test_version_is_a_short_sha256(engine: RegorusEngine) -> None:
    assert re.fullmatch(r"sha256:[0-9a-f]{16}", engine.version)


def test_version_is_stable_across_loads(engine: RegorusEngine, policy_dir: Path) -> None:
    assert RegorusEngine.from_directory(policy_dir).version == engine.version


def test_version_changes_when_a_policy_file_changes(
    engine: RegorusEngine, policy_dir: Path
) -> None:
    policy = policy_dir / "chunks.rego"
    policy.write_text(policy.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert RegorusEngine.from_directory(policy_dir).version != engine.version


def test_version_ignores_test_files(engine: RegorusEngine, policy_dir: Path) -> None:
    (policy_dir / "chunks_test.rego").write_text("this is not Rego", encoding="utf-8")
    assert RegorusEngine.from_directory(policy_dir).version == engine.version


def test_version_covers_the_request_policy_loaded_beside(
    engine: RegorusEngine, policy_dir: Path
) -> None:
    (policy_dir / "request.rego").unlink()
    only_chunks = RegorusEngine.from_directory(policy_dir)
    assert only_chunks.version != engine.version
    assert only_chunks.evaluate(make_input(make_chunk())) == {"c1": []}


# Load-time errors


def test_a_compile_error_names_the_file(policy_dir: Path) -> None:
    (policy_dir / "extra.rego").write_text("package extra\n\nx := {\n", encoding="utf-8")
    with pytest.raises(PolicyError, match=r"extra\.rego"):
        RegorusEngine.from_directory(policy_dir)


def test_a_missing_rule_is_rejected_at_load(policy_dir: Path) -> None:
    with pytest.raises(PolicyError, match=r"data\.retrieval_gate\.chunks\.nope"):
        RegorusEngine.from_directory(policy_dir, query="data.retrieval_gate.chunks.nope")


@pytest.mark.parametrize("files", [{}, {"only_test.rego": "package t\n"}], ids=["empty", "tests"])
def test_a_directory_without_policies_is_rejected(tmp_path: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(PolicyError, match="no Rego policy files"):
        RegorusEngine.from_directory(tmp_path)


def test_a_missing_directory_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(PolicyError):
        RegorusEngine.from_directory(tmp_path / "absent")


def test_a_rule_that_is_not_an_object_is_rejected_at_load() -> None:
    sources = {"p.rego": "package retrieval_gate.chunks\n\nreasons := [1]\n"}
    with pytest.raises(PolicyError, match="object of string arrays, got list"):
        RegorusEngine(sources)


def test_an_undefined_rule_is_rejected_at_load() -> None:
    sources = {"p.rego": "package retrieval_gate.chunks\n\nreasons := 1 if false\n"}
    with pytest.raises(PolicyError, match="undefined"):
        RegorusEngine(sources)


# Evaluation errors


def policy_returning(value_expression: str) -> RegorusEngine:
    """An engine whose rule maps each chunk id to ``value_expression``."""
    text = (
        "package retrieval_gate.chunks\n\nimport rego.v1\n\n"
        f"reasons := {{c.id: {value_expression} | some c in input.chunks}}\n"
    )
    return RegorusEngine({"p.rego": text})


@pytest.mark.parametrize(
    "value_expression",
    ['"STATUS_DRAFT"', '{"STATUS_DRAFT"}', "[1]", "[null]", '{"reason": "X"}'],
)
def test_a_result_of_the_wrong_shape_is_a_policy_error(value_expression: str) -> None:
    engine = policy_returning(value_expression)
    with pytest.raises(PolicyError, match="object of string arrays"):
        engine.evaluate(make_input(make_chunk()))


def test_a_result_missing_a_chunk_id_is_a_policy_error() -> None:
    text = (
        "package retrieval_gate.chunks\n\nimport rego.v1\n\n"
        'reasons := {c.id: [] | some c in input.chunks; c.status == "approved"}\n'
    )
    engine = RegorusEngine({"p.rego": text})
    with pytest.raises(PolicyError, match="1 chunk ids missing"):
        engine.evaluate(make_input(make_chunk("a"), make_chunk("b", status="draft")))


def test_a_runtime_error_is_a_policy_error_that_does_not_quote_the_input() -> None:
    text = (
        "package retrieval_gate.chunks\n\nimport rego.v1\n\n"
        "reasons := {c.id: [] | some c in input.chunks; some tag in c.source_uri}\n"
    )
    engine = RegorusEngine({"p.rego": text})
    secret = "s3://confidential-bucket/merger-plan"
    with pytest.raises(PolicyError) as caught:
        engine.evaluate(make_input(make_chunk(source_uri=secret)))
    assert "p.rego:5" in str(caught.value)
    assert "confidential" not in str(caught.value)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


@pytest.mark.parametrize(
    "chunks",
    [
        [make_chunk("a"), make_chunk("a")],
        [{"doc_id": "SOP-7"}],
        [make_chunk(7)],  # type: ignore[arg-type]
        ["c1"],
    ],
    ids=["duplicate-id", "no-id", "numeric-id", "not-an-object"],
)
def test_an_input_without_unique_string_ids_is_a_policy_error(
    engine: RegorusEngine, chunks: list[Any]
) -> None:
    with pytest.raises(PolicyError, match="unique string id"):
        engine.evaluate(make_input(*chunks))


def test_an_input_that_is_not_json_is_a_policy_error(engine: RegorusEngine) -> None:
    with pytest.raises(PolicyError, match="JSON"):
        engine.evaluate(make_input(make_chunk(source_uri=object())))


class Panic(BaseException):
    """Stands in for pyo3's PanicException, which is not an Exception."""


REAL_ENGINE = regorus.Engine


class ArmedEngine:
    """A real regorus engine whose eval_rule raises ``error`` once it is set."""

    created: ClassVar[list[ArmedEngine]] = []

    def __init__(self) -> None:
        self._real = REAL_ENGINE()
        self.error: BaseException | None = None
        ArmedEngine.created.append(self)

    def add_policy(self, path: str, text: str) -> None:
        self._real.add_policy(path, text)

    def set_input_json(self, payload: str) -> None:
        self._real.set_input_json(payload)

    def eval_rule(self, rule: str) -> Any:
        if self.error is not None:
            raise self.error
        return self._real.eval_rule(rule)

    def __getattr__(self, name: str) -> Any:
        # Everything else (eval_query, get_ast_as_json for the load-time checks).
        return getattr(self._real, name)


@pytest.fixture
def armed(monkeypatch: pytest.MonkeyPatch) -> RegorusEngine:
    ArmedEngine.created.clear()
    monkeypatch.setattr(regorus, "Engine", ArmedEngine)
    # A source of its own, so that no engine cached for this thread is reused.
    text = (default_policy_dir() / "chunks.rego").read_text(encoding="utf-8")
    return RegorusEngine({"chunks.rego": f"{text}\n# {uuid.uuid4()}\n"})


def test_a_panic_is_a_policy_error_and_the_engine_is_rebuilt(armed: RegorusEngine) -> None:
    ArmedEngine.created[0].error = Panic("unsendable")

    with pytest.raises(PolicyError, match="panicked"):
        armed.evaluate(make_input(make_chunk()))
    assert armed.evaluate(make_input(make_chunk())) == {"c1": []}
    assert len(ArmedEngine.created) == 2


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(1)], ids=repr)
def test_interrupts_are_not_policy_errors(armed: RegorusEngine, error: BaseException) -> None:
    ArmedEngine.created[0].error = error
    with pytest.raises(type(error)):
        armed.evaluate(make_input(make_chunk()))


# Threads


def test_each_thread_gets_its_own_engine(engine: RegorusEngine) -> None:
    def evaluate(i: int) -> tuple[int, dict[str, list[str]]]:
        status = "approved" if i % 2 else "draft"
        return i, dict(engine.evaluate(make_input(make_chunk(f"c{i}", status=status))))

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(evaluate, range(200)))

    for i, result in results:
        assert result == {f"c{i}": [] if i % 2 else ["STATUS_DRAFT"]}


@pytest.fixture
def unraisable() -> Iterator[list[BaseException | None]]:
    seen: list[BaseException | None] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda args: seen.append(args.exc_value)
    try:
        yield seen
    finally:
        sys.unraisablehook = previous


def test_dropping_an_engine_while_its_threads_live_is_clean(
    unraisable: list[BaseException | None],
) -> None:
    # regorus engines must be dropped on the thread that made them; dropping a
    # RegorusEngine on the main thread must not drop a worker's regorus engine.
    engine: RegorusEngine | None = RegorusEngine.from_directory(default_policy_dir())
    used, release = threading.Event(), threading.Event()

    def worker() -> None:
        assert engine is not None
        engine.evaluate(make_input(make_chunk()))
        used.set()
        release.wait(timeout=10)

    thread = threading.Thread(target=worker)
    thread.start()
    assert used.wait(timeout=10)
    engine = None
    gc.collect()
    release.set()
    thread.join(timeout=10)

    assert unraisable == []


# Time purity (sidecar.rego.purity); its effect on the cache: test_verdict_cache


def test_called_functions_names_builtins_and_policy_functions() -> None:
    sources = {
        "p.rego": "package p\nimport rego.v1\n"
        "double(x) := 2 * x\n"
        "now_ok if time.now_ns() > 0\n"
        "four := double(2)\n"
        "upper := upper(input.name)\n"
        "qualified := data.p.double(3)\n"
    }
    called = called_functions(CompiledPolicy(sources).ast())
    assert {"time.now_ns", "double", "upper", "data.p.double"} <= called
    assert not any(name.startswith(("rand.", "http.")) for name in called)


class Declaring:
    """A policy as the purity analysis sees it: a declaration and a syntax tree."""

    def __init__(self, declared: Any, ast: Any) -> None:
        self._declared = declared
        self._ast = ast
        self.asked: list[str] = []

    def declared(self, path: str, sample_input: Mapping[str, Any]) -> Any:
        self.asked.append(path)
        return self._declared

    def ast(self) -> Any:
        return self._ast


def call(*names: str) -> dict[str, Any]:
    """An AST node calling ``a.b.c`` as regorus renders it (a chain of RefDot under a Var)."""
    head, *fields = names
    node: dict[str, Any] = {"Var": {"value": head}}
    for field in fields:
        node = {"RefDot": {"refr": node, "field": [{"line": 1}, field]}}
    return {"Call": {"fcn": node, "params": []}}


def test_a_declared_policy_is_time_pure_unless_its_calls_contradict_it() -> None:
    pure = Declaring(True, [{"rules": [call("count"), call("data", "p", "f")]}])
    assert is_time_pure(pure, "data.p.reasons", {}) is True
    assert pure.asked == ["data.p.time_pure"]
    clock = Declaring(True, [{"rules": [call("count"), call("time", "now_ns")]}])
    with pytest.raises(PolicyError, match=r"data\.p\.time_pure is true, but .* calls time\.now_ns"):
        is_time_pure(clock, "data.p.reasons", {})


def test_no_or_a_false_declaration_is_not_time_pure_whatever_the_calls() -> None:
    for declared in (None, False):
        assert is_time_pure(Declaring(declared, [call("time", "now_ns")]), "data.p.r", {}) is False
    # A query without a package has no sibling to declare with; nothing is asked.
    nowhere = Declaring(True, [])
    assert is_time_pure(nowhere, 'data["reasons"]', {}) is False
    assert nowhere.asked == []
