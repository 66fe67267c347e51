"""A small runner for Rego unit tests (`test_*` rules), on the embedded engine.

regorus has no `opa test`: this finds the test rules in the engine's AST and
evaluates each one. A test passes when its rule evaluates to true; false,
undefined and errors fail it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from sidecar.core.policy import PolicyError
from sidecar.rego.regorus_engine import (
    compile_sources,
    engine_error_message,
    package_path,
    read_rego_sources,
    rule_path,
)

_TEST_PREFIX = "test_"
_MAX_VALUE_CHARS = 200


@dataclass(frozen=True)
class RegoTestResult:
    """The outcome of one test rule."""

    name: str
    """The rule's full path, e.g. ``data.retrieval_gate.chunks_test.test_expired``."""
    location: str
    """``file:line`` of the rule's first definition."""
    passed: bool
    message: str
    """Why it failed (with any `print` output); empty when it passed."""


@dataclass(frozen=True)
class _TestRule:
    name: str
    location: str


def run_rego_tests(policy_dir: Path) -> list[RegoTestResult]:
    """Run every `test_*` rule in the ``.rego`` files of ``policy_dir``.

    Policies and tests are loaded together, as `opa test DIR` does. Raises
    PolicyError when a file does not compile or the AST cannot be read.
    """
    return run_compiled_tests(compile_sources(read_rego_sources(policy_dir, include_tests=True)))


def run_compiled_tests(engine: Any) -> list[RegoTestResult]:
    """Run every ``test_*`` rule of a compiled regorus engine (policies, tests and data)."""
    engine.set_gather_prints(True)
    return [_run_test(engine, rule) for rule in _test_rules(engine)]


def _run_test(engine: Any, rule: _TestRule) -> RegoTestResult:
    try:
        value = engine.eval_rule(rule.name)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        message = engine_error_message(exc)
    else:
        message = "" if value is True else _describe(value)
    prints = engine.take_prints()
    if message and prints:
        message = "\n".join([message, "prints:", *prints])
    return RegoTestResult(rule.name, rule.location, passed=not message, message=message)


def _describe(value: Any) -> str:
    # eval_rule reports "undefined" as None.
    if value is None:
        return "undefined (a body failed or a reference is missing)"
    text = repr(value)
    if len(text) > _MAX_VALUE_CHARS:
        text = text[:_MAX_VALUE_CHARS] + "..."
    return f"evaluated to {text}, not true"


def _test_rules(engine: Any) -> list[_TestRule]:
    try:
        modules = orjson.loads(engine.get_ast_as_json())
        rules = [rule for module in modules for rule in _module_test_rules(module)]
    except (KeyError, TypeError, IndexError, orjson.JSONDecodeError) as exc:
        raise PolicyError(f"cannot read test rules from the regorus AST: {exc!r}") from exc
    # A rule with several bodies (`test_x if {...}` twice) is one test.
    unique: dict[str, _TestRule] = {}
    for rule in rules:
        unique.setdefault(rule.name, rule)
    return list(unique.values())


def _module_test_rules(module: dict[str, Any]) -> list[_TestRule]:
    file = module["source"]["file"]
    package = package_path(module)
    found = []
    for rule in module["ast"]["rules"]:
        # Only complete rules can be tests: skip defaults, functions, partial
        # sets/objects (`test_x contains ...`) and ref heads (`test_x.y := ...`).
        head = rule.get("Spec", {}).get("head", {}).get("Compr")
        if head is None or "Var" not in head["refr"]:
            continue
        var = head["refr"]["Var"]
        if var["value"].startswith(_TEST_PREFIX):
            name = rule_path(["data", *package, var["value"]])
            found.append(_TestRule(name, f"{file}:{var['span']['line']}"))
    return found
