"""Policy data is checked against its policy's schema: a typo is refused, never ignored.

The bundled policies' schema is policies/data.schema.json. Before it, a key
such as ``colections`` was accepted and read by no rule, so collection
ownership silently fell back to "every collection open to every tenant".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.config import ConfigError, default_policy_dir
from sidecar.rego.bundle import BundleError, read_bundle
from sidecar.rego.policy_data import (
    SCHEMA_FILE,
    PolicyDataError,
    check_policy_data,
    schema_for,
)
from sidecar.rego.reloading import prepare_revision
from sidecar.runtime.server import load_policy_data
from tests.fixtures.bundles import policy_files, tar_gz
from tests.fixtures.settings import settings_of

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = schema_for(default_policy_dir())


def problems(document: dict[str, Any]) -> list[str]:
    try:
        check_policy_data(document, SCHEMA)
    except PolicyDataError as exc:
        return exc.problems
    return []


def test_the_shipped_and_documented_data_are_valid() -> None:
    shipped = json.loads((ROOT / "deploy" / "kubernetes" / "base" / "policy-data.json").read_text())
    assert problems(shipped) == []
    assert problems({}) == []
    assert problems({"retrieval_gate": {}}) == []
    documented = {
        "retrieval_gate": {
            "collections": {"sops": {"tenants": ["acme"]}, "finance": {"tenants": ["globex"]}},
            "routes": {"allow_writes": True, "allow_unfiltered_content": False},
        }
    }
    assert problems(documented) == []


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {"retrieval_gate": {"colections": {"sops": {"tenants": ["acme"]}}}},
            ["data.retrieval_gate.colections: unknown key; did you mean collections?"],
        ),
        (
            {"retrieval_gat": {"collections": {}}},
            ["data.retrieval_gat: unknown key; did you mean retrieval_gate?"],
        ),
        (
            {"retrieval_gate": {"routes": {"allow_write": True}}},
            ["data.retrieval_gate.routes.allow_write: unknown key; did you mean allow_writes?"],
        ),
        (
            {"retrieval_gate": {"routes": {"allow_writes": "yes"}}},
            ["data.retrieval_gate.routes.allow_writes: 'yes' is not of type 'boolean'"],
        ),
        (
            {"retrieval_gate": {"collections": {"sops": {"tenants": "acme"}}}},
            ["data.retrieval_gate.collections.sops.tenants: 'acme' is not of type 'array'"],
        ),
        (
            {"retrieval_gate": {"collections": {"sops": {"tenant": ["acme"]}}}},
            [
                "data.retrieval_gate.collections.sops.tenant: unknown key; did you mean tenants?",
                "data.retrieval_gate.collections.sops: 'tenants' is a required property",
            ],
        ),
    ],
    ids=["typo", "top-level typo", "routes typo", "not a boolean", "not a list", "two problems"],
)
def test_each_problem_is_named_with_its_path(document: dict[str, Any], expected: list[str]) -> None:
    assert problems(document) == expected


def test_policy_data_with_a_typo_stops_the_start(tmp_path: Path) -> None:
    data = tmp_path / "policy-data.json"
    data.write_text('{"retrieval_gate": {"colections": {"sops": {"tenants": ["acme"]}}}}')
    with pytest.raises(ConfigError) as caught:
        load_policy_data(settings_of(policy_data=str(data)))
    assert caught.value.problems == (
        f"policy data {data}: data.retrieval_gate.colections: unknown key; "
        "did you mean collections?",
    )


def test_a_custom_policy_dir_brings_its_own_schema(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / SCHEMA_FILE).write_text(
        json.dumps({"type": "object", "properties": {"mine": {"type": "integer"}}})
    )
    data = tmp_path / "policy-data.json"
    data.write_text('{"mine": 3}')
    settings = settings_of(policy_data=str(data), policy_dir=str(policies))
    assert load_policy_data(settings) == {"mine": 3}
    data.write_text('{"mine": "three"}')
    with pytest.raises(ConfigError, match=r"data\.mine: 'three' is not of type 'integer'"):
        load_policy_data(settings)


MANIFEST = b'{"revision": "r1", "roots": ["retrieval_gate"]}'


def test_a_bundle_whose_data_has_a_typo_is_refused_on_activation() -> None:
    members = {
        **policy_files(),
        ".manifest": MANIFEST,
        "retrieval_gate/colections/data.json": b'{"sops": {"tenants": ["acme"]}}',
    }
    with pytest.raises(BundleError) as caught:
        prepare_revision(read_bundle(tar_gz(members)))
    assert caught.value.reason == "data"
    assert "data.retrieval_gate.colections: unknown key; did you mean collections?" in str(
        caught.value
    )


def test_a_bundle_with_its_own_schema_may_carry_its_own_data() -> None:
    schema = json.loads((default_policy_dir() / SCHEMA_FILE).read_text())
    schema["properties"]["retrieval_gate"]["properties"]["labels"] = {"type": "object"}
    members = {
        **policy_files(),
        ".manifest": MANIFEST,
        "retrieval_gate/labels/data.json": b'{"a": 1}',
        SCHEMA_FILE: json.dumps(schema).encode(),
    }
    assert prepare_revision(read_bundle(tar_gz(members))).tests_run > 0
    # Without that schema the same data is refused.
    del members[SCHEMA_FILE]
    with pytest.raises(BundleError, match="labels: unknown key"):
        prepare_revision(read_bundle(tar_gz(members)))


def test_a_bundle_whose_schema_is_not_a_json_schema_is_refused() -> None:
    members = {**policy_files(), ".manifest": MANIFEST, SCHEMA_FILE: b'{"type": 7}'}
    with pytest.raises(BundleError) as caught:
        read_bundle(tar_gz(members))
    assert caught.value.reason == "format" and "not a valid JSON Schema" in str(caught.value)
