"""Time purity: may the gate cache a chunk policy's verdicts?

A chunk policy declares itself time-pure with ``time_pure := true`` in the
package of its reasons rule (policies/README.md, "Verdict cache"): its reasons
for a chunk then depend only on that chunk, the caller and the policy, and on
time only through the chunk's validity interval. The declaration is a promise
this module cannot prove, but it refuses one the policy's own sources
contradict: a policy that calls a builtin reading the clock, chance, the
network or the runtime cannot be time-pure, whatever it declares.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

from sidecar.core.policy import PolicyError

# The rule, next to the reasons rule in its package, by which a chunk policy
# declares that its verdicts may be cached.
TIME_PURE_RULE = "time_pure"
# Builtins whose result depends on more than their arguments (the clock, chance,
# the network, the runtime), or that turn a time into calendar facts.
_IMPURE_BUILTIN_PREFIXES = (
    "time.",
    "rand.",
    "uuid.rfc4122",
    "http.send",
    "net.lookup_ip_addr",
    "opa.runtime",
)
# A rule path whose last segment is a plain name: its package is the part before it.
_SIBLING = re.compile(r"(.+)\.[A-Za-z_][A-Za-z0-9_]*")


class InspectablePolicy(Protocol):
    """What the analysis reads of a compiled policy (``CompiledPolicy`` provides it)."""

    def declared(self, path: str, sample_input: Mapping[str, Any]) -> Any:
        """The value of the rule at ``path`` for ``sample_input``; None when undefined."""
        ...

    def ast(self) -> Any:
        """The modules of the policy's abstract syntax tree, as regorus renders them in JSON."""
        ...


def time_pure_rule(query: str) -> str | None:
    """Where the policy whose reasons rule is ``query`` declares itself time-pure.

    ``data.a.b.reasons`` -> ``data.a.b.time_pure``; None when ``query`` does not
    end in a plain rule name.
    """
    match = _SIBLING.fullmatch(query)
    return f"{match.group(1)}.{TIME_PURE_RULE}" if match else None


def is_time_pure(policy: InspectablePolicy, query: str, sample_input: Mapping[str, Any]) -> bool:
    """Whether the policy declares the reasons rule ``query`` time-pure.

    The declaration is read for ``sample_input`` (any well-formed input: it is
    a constant). Raises PolicyError for a declaration that is not a boolean, or
    that the policy's own sources contradict.
    """
    rule = time_pure_rule(query)
    if rule is None:
        return False
    declared = policy.declared(rule, sample_input)
    if declared is None or declared is False:
        return False
    if declared is not True:
        raise PolicyError(f"{rule} must be true or false")
    impure = sorted(
        name for name in called_functions(policy.ast()) if name.startswith(_IMPURE_BUILTIN_PREFIXES)
    )
    if impure:
        raise PolicyError(
            f"{rule} is true, but the policy calls {', '.join(impure)}: its verdicts depend "
            "on more than the chunk, the caller and the chunk's validity interval"
        )
    return True


def called_functions(ast: Any) -> set[str]:
    """Names of every function called anywhere in ``ast`` (``time.now_ns``, ``data.p.f`` ...).

    ``ast`` is the policy's syntax tree as regorus renders it in JSON; calls
    whose function has no static name (an index into a rule) are left out.
    """
    names: set[str] = set()
    stack: list[Any] = [ast]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            call = node.get("Call")
            if isinstance(call, dict):
                name = _function_name(call.get("fcn"))
                if name is not None:
                    names.add(name)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def _function_name(node: Any) -> str | None:
    # A called function is a Var (`f`) or a chain of RefDot (`time.now_ns`,
    # `data.p.f`); anything else (an index into a rule) has no static name.
    if not isinstance(node, dict):
        return None
    if isinstance(var := node.get("Var"), dict):
        value = var.get("value")
        return value if isinstance(value, str) else None
    if isinstance(ref := node.get("RefDot"), dict):
        head = _function_name(ref.get("refr"))
        field = ref.get("field")
        if head is None or not isinstance(field, list) or len(field) != 2:
            return None
        return f"{head}.{field[1]}" if isinstance(field[1], str) else None
    return None
