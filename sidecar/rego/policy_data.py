"""Policy data checked against the schema of the policy that reads it.

The bundled policies read ``data.retrieval_gate.collections`` and
``data.retrieval_gate.routes``; their schema is ``policies/data.schema.json``
(JSON Schema 2020-12). Data no rule reads is never harmless: a misspelt key
(``colections``) leaves the rule it was meant for on its default, which for
collection ownership means every collection open to every tenant. So every
problem is refused, with the path and, for an unknown key, the nearest known
one.

A custom policy brings its own schema: ``data.schema.json`` next to its Rego
files (``policy.dir``) or at the root of its bundle. Without one, the bundled
policies' schema applies.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.core.policy import PolicyError

if TYPE_CHECKING:
    import jsonschema

SCHEMA_FILE = "data.schema.json"
# The bundled policies: sidecar/policies, a link to the checkout's policies/
# that wheels carry as a copy.
BUNDLED_POLICY_DIR = Path(__file__).resolve().parents[1] / "policies"


class PolicyDataError(PolicyError):
    """Policy data its schema refuses; ``problems`` has one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def read_schema(text: str | bytes, where: str) -> dict[str, Any]:
    """A data schema from its JSON text; PolicyError when it is not a valid JSON Schema."""
    import jsonschema  # here, not at the top: see _validator

    try:
        schema = json.loads(text)
        jsonschema.Draft202012Validator.check_schema(schema)
    except (ValueError, jsonschema.SchemaError) as exc:
        message = exc.message if isinstance(exc, jsonschema.SchemaError) else str(exc)
        raise PolicyError(f"{where}: not a valid JSON Schema: {message}") from None
    if not isinstance(schema, dict):
        raise PolicyError(f"{where}: a JSON Schema must be an object")
    return schema


def schema_for(policy_dir: Path) -> dict[str, Any]:
    """The schema of the policy in ``policy_dir``: its own file, else the bundled one."""
    path = policy_dir / SCHEMA_FILE
    if not path.exists():
        path = BUNDLED_POLICY_DIR / SCHEMA_FILE
    try:
        return read_schema(path.read_bytes(), str(path))
    except OSError as exc:
        raise PolicyError(f"{path}: {exc.strerror}") from None


def check_policy_data(document: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Raise PolicyDataError naming every place where ``document`` breaks ``schema``."""
    validator = _validator(schema)
    problems = sorted(
        line for error in validator.iter_errors(document) for line in _describe(error)
    )
    if problems:
        raise PolicyDataError(problems)


def described_collections(document: Mapping[str, Any]) -> list[str]:
    """The collections the bundled policies' data describes
    (``data.retrieval_gate.collections``); none when the data has another shape."""
    gate = document.get("retrieval_gate")
    described = gate.get("collections") if isinstance(gate, Mapping) else None
    return [str(name) for name in described] if isinstance(described, Mapping) else []


def _validator(schema: Mapping[str, Any]) -> jsonschema.Draft202012Validator:
    # Imported when there is data to check, not with the package: jsonschema
    # loads its format checkers, and where an optional one is installed
    # (rfc3987-syntax builds a grammar) that alone costs about a second per
    # process start.
    import jsonschema

    return jsonschema.Draft202012Validator(schema)


def _describe(error: jsonschema.ValidationError) -> list[str]:
    where = ".".join(["data", *(str(part) for part in error.absolute_path)])
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = list(error.schema.get("properties", {}))
        allowed = set(known)
        return [
            f"{where}.{key}: unknown key{_nearest(key, known)}"
            for key in error.instance
            if key not in allowed
        ]
    return [f"{where}: {error.message}"]


def _nearest(key: str, known: list[str]) -> str:
    found = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if found:
        return f"; did you mean {found[0]}?"
    return f" (known: {', '.join(known)})" if known else ""
