"""The Rego unit tests in policies/ (one pytest case per test rule) and their runner."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.config import default_policy_dir
from sidecar.core.policy import PolicyError
from sidecar.rego.rego_tests import RegoTestResult, run_rego_tests

POLICY_DIR = default_policy_dir()
RESULTS = run_rego_tests(POLICY_DIR)


def short_name(result: RegoTestResult) -> str:
    """``chunks_test.test_expired``: test files may share rule names, not packages."""
    return ".".join(result.name.rsplit(".", 2)[-2:])


@pytest.mark.parametrize("result", RESULTS, ids=[short_name(r) for r in RESULTS])
def test_policy_rule(result: RegoTestResult) -> None:
    assert result.passed, f"{result.name} ({result.location}): {result.message}"


def test_runner_finds_every_test_rule_in_the_policy_dir() -> None:
    # A cross-check of the AST walk against the rule heads written in each file.
    written = {
        (path.name, name)
        for path in POLICY_DIR.glob("*_test.rego")
        for name in re.findall(r"^(test_\w+)\b", path.read_text(encoding="utf-8"), re.MULTILINE)
    }
    found = {
        (result.location.split(":", 1)[0], result.name.rsplit(".", 1)[-1]) for result in RESULTS
    }
    assert {file for file, _ in written} >= {"chunks_test.rego", "request_test.rego"}
    assert found == written


def write(directory: Path, name: str, text: str) -> None:
    (directory / name).write_text(text, encoding="utf-8")


def results_by_rule(policy_dir: Path) -> dict[str, RegoTestResult]:
    return {result.name.rsplit(".", 1)[-1]: result for result in run_rego_tests(policy_dir)}


def test_runner_reports_pass_false_undefined_and_error(tmp_path: Path) -> None:
    write(tmp_path, "p.rego", "package p\n\nimport rego.v1\n\nanswer := 42\n")
    write(
        tmp_path,
        "p_test.rego",
        """package p_test

import rego.v1

import data.p

test_passes if p.answer == 42

test_is_false := p.answer == 41

test_is_undefined if p.missing == 1

test_errors if {
	print("dividing")
	1 / 0 == 1
}

test_is_a_number := 1
""",
    )

    results = results_by_rule(tmp_path)

    assert results["test_passes"].passed
    assert results["test_passes"].message == ""
    assert results["test_passes"].name == "data.p_test.test_passes"
    assert results["test_passes"].location == "p_test.rego:7"
    assert not results["test_is_false"].passed
    assert "evaluated to False" in results["test_is_false"].message
    assert not results["test_is_undefined"].passed
    assert "undefined" in results["test_is_undefined"].message
    assert not results["test_errors"].passed
    assert "divide by zero" in results["test_errors"].message
    assert "dividing" in results["test_errors"].message
    assert "Stack backtrace" not in results["test_errors"].message
    assert "evaluated to 1" in results["test_is_a_number"].message


def test_runner_counts_only_complete_test_rules_once(tmp_path: Path) -> None:
    write(
        tmp_path,
        "t_test.rego",
        """package a["b-c"]

import rego.v1

test_two_bodies if false

test_two_bodies if true

test_helper(x) if x

test_set contains 1

default test_default := false

not_a_test if false
""",
    )

    results = run_rego_tests(tmp_path)

    assert [r.name for r in results] == ['data.a["b-c"].test_two_bodies']
    assert results[0].passed


def test_runner_reports_a_compile_error_with_its_file(tmp_path: Path) -> None:
    write(tmp_path, "broken_test.rego", "package t\n\ntest_x if {\n")

    with pytest.raises(PolicyError, match=r"broken_test\.rego"):
        run_rego_tests(tmp_path)
