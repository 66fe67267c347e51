"""`retrieval-gate check`, run as an operator runs it: the real CLI process on real files,
and a real Milvus (Milvus Lite) for the tenant field.

Each case asserts the exit status (0 all ok, 1 a check failed, 2 the
settings cannot be loaded) and the line that names the cause. The demo's
configuration (``sidecar.demo.run``: its settings and its store) must pass;
Qdrant's collection info comes from the demo's fixture upstream, a fake.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from milvus_lite.adapter.grpc.server import start_server_in_thread
from pymilvus import DataType, MilvusClient

from sidecar.demo.run import demo_corpus, demo_settings, write_demo_store
from sidecar.demo.upstream import CannedResponse, FixtureUpstream
from tests.fixtures.bundles import make_bundle, policy_files
from tests.fixtures.fake_opa import FakeOpa
from tests.fixtures.postgres import fresh_database
from tests.fixtures.settings import write_settings_file

CLI = [sys.executable, "-m", "sidecar.cli", "check"]


def check(*args: str) -> tuple[int, list[str]]:
    """Run ``retrieval-gate check`` with ``args``: its exit status and its report lines."""
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout.splitlines()


def line(lines: list[str], start: str) -> str:
    """The one report line that starts with ``start``."""
    found = [text for text in lines if text.startswith(start)]
    assert len(found) == 1, (start, lines)
    return found[0]


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[Path, FixtureUpstream]]:
    """The demo's settings file (its store written) and its fixture upstream (a fake Qdrant)."""
    store_url = write_demo_store(tmp_path, demo_corpus())
    values = demo_settings(store_url, tmp_path / "decisions.jsonl", "127.0.0.1:9464")
    config = write_settings_file(tmp_path / "gate.toml", values)
    upstream = FixtureUpstream().start()
    yield config, upstream
    upstream.stop()


def test_the_demo_configuration_passes(demo: tuple[Path, FixtureUpstream]) -> None:
    config, upstream = demo
    # Qdrant's collection info, as its API reference shows it: the tenant field's index.
    info = {
        "result": {
            "status": "green",
            "points_count": 12,
            "payload_schema": {
                "tenant": {"data_type": "keyword", "params": {"type": "keyword", "is_tenant": True}}
            },
        },
        "status": "ok",
        "time": 0.0001,
    }
    upstream.respond("GET", "/collections/docs", CannedResponse(orjson.dumps(info)))

    code, lines = check(
        "--config",
        str(config),
        "--upstream",
        upstream.url,
        "--database",
        "qdrant",
        "--collection",
        "docs",
    )

    assert code == 0, lines
    assert not [text for text in lines if text.startswith("FAIL")]
    assert line(lines, "ok store").endswith(", schema version 3, 11 records")
    assert line(lines, "ok policy tests").endswith("passed")
    assert line(lines, "ok upstream").endswith("accepts connections")
    assert line(lines, "ok tenant field in docs") == (
        "ok tenant field in docs — tenant has a keyword index (is_tenant)"
    )


def test_what_cannot_be_checked_is_said_and_does_not_fail(
    demo: tuple[Path, FixtureUpstream],
) -> None:
    config, _ = demo

    code, lines = check("--config", str(config), "--collection", "docs", "--database", "chroma")

    assert code == 0, lines
    assert line(lines, "not checked upstream").endswith(
        "give --upstream URL (with serve: the database your Envoy forwards to)"
    )
    assert line(lines, "not checked tenant field") == (
        "not checked tenant field — Chroma keeps no schema of record metadata"
    )


def test_a_typo_in_policy_data_fails_naming_it(
    demo: tuple[Path, FixtureUpstream], tmp_path: Path
) -> None:
    config, _ = demo
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"retrieval_gate": {"colections": {"docs": {"tenants": ["acme"]}}}}))

    code, lines = check("--config", str(config), "--policy-data", str(data))

    assert code == 1
    assert line(lines, "FAIL policy data").endswith(
        "data.retrieval_gate.colections: unknown key; did you mean collections?"
    )
    assert line(lines, "ok policy —")


def test_a_missing_store_file_fails_and_is_not_created(
    demo: tuple[Path, FixtureUpstream], tmp_path: Path
) -> None:
    config, _ = demo
    missing = tmp_path / "typo.db"

    code, lines = check("--config", str(config), "--store", f"sqlite:///{missing}")

    assert code == 1
    assert line(lines, "FAIL store") == (
        f"FAIL store — SQLite metadata store {missing} does not exist; create it with: "
        f"retrieval-gate store migrate --store sqlite:///{missing}"
    )
    assert not missing.exists()


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ("[broken\n", "gate.toml: Expected ']'"),
        ("[cache]\nsizee = 5\n", "cache.sizee: unknown setting; did you mean cache.size?"),
        ("[listen]\ngrpc = '0.0.0.0:9001'\n", "is believed as Envoy"),
    ],
)
def test_settings_that_cannot_be_loaded_exit_2(
    demo: tuple[Path, FixtureUpstream], document: str, problem: str
) -> None:
    config, _ = demo
    config.write_text(config.read_text() + document)

    code, lines = check("--config", str(config))

    assert code == 2
    assert lines and all(text.startswith("FAIL settings — ") for text in lines), lines
    assert problem in "\n".join(lines)


def test_an_unreadable_settings_file_exits_2(tmp_path: Path) -> None:
    code, lines = check("--config", str(tmp_path / "absent.toml"))

    assert code == 2
    assert lines == [
        f"FAIL settings — {tmp_path / 'absent.toml'}: [Errno 2] No such file or "
        f"directory: '{tmp_path / 'absent.toml'}'"
    ]


# --- the tenant field, asked of a real Milvus -------------------------------------------

MILVUS_COLLECTIONS: dict[str, dict[str, Any]] = {
    "with_tenant": {"tenant": DataType.VARCHAR, "dynamic": False},
    "without_tenant": {"tenant": None, "dynamic": False},
    "dynamic_only": {"tenant": None, "dynamic": True},
    "numeric_tenant": {"tenant": DataType.INT64, "dynamic": False},
}


@pytest.fixture(scope="module")
def milvus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Milvus Lite server holding MILVUS_COLLECTIONS; its URL."""
    server, db, port = start_server_in_thread(
        str(tmp_path_factory.mktemp("milvus-lite")), "127.0.0.1", 0
    )
    client = MilvusClient(uri=f"http://127.0.0.1:{port}")
    for name, shape in MILVUS_COLLECTIONS.items():
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=shape["dynamic"])
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=2)
        if shape["tenant"] is DataType.VARCHAR:
            schema.add_field("tenant", DataType.VARCHAR, max_length=64)
        elif shape["tenant"] is not None:
            schema.add_field("tenant", shape["tenant"])
        client.create_collection(name, schema=schema)
    client.close()
    yield f"http://127.0.0.1:{port}"
    server.stop(grace=2)
    db.close()


def test_a_milvus_collection_without_the_tenant_field_fails(
    demo: tuple[Path, FixtureUpstream], milvus: str
) -> None:
    config, _ = demo

    code, lines = check(
        "--config",
        str(config),
        "--upstream",
        milvus,
        "--database",
        "milvus",
        "--collection",
        "with_tenant",
        "--collection",
        "without_tenant",
    )

    assert code == 1
    assert line(lines, "ok tenant field in with_tenant") == (
        "ok tenant field in with_tenant — tenant is VarChar"
    )
    assert line(lines, "FAIL tenant field in without_tenant") == (
        "FAIL tenant field in without_tenant — no field tenant (fields: id, vec) and no "
        "dynamic field: add it, or set the tenant_key of the route (filter.tenant_key) to the "
        "field that holds the tenant"
    )


@pytest.mark.parametrize(
    ("collection", "expected"),
    [
        ("with_tenant", "ok tenant field in with_tenant — tenant is VarChar"),
        (
            "numeric_tenant",
            "FAIL tenant field in numeric_tenant — tenant is Int64; push-down compares it with "
            "a quoted string: declare it VarChar",
        ),
        (
            "dynamic_only",
            "not checked tenant field in dynamic_only — tenant is not declared, and the dynamic "
            "field's keys are in no schema: declare tenant as a VarChar field to have it checked",
        ),
        (
            "no_such_collection",
            "FAIL tenant field in no_such_collection — milvus answered: collection "
            "'no_such_collection' does not exist",
        ),
    ],
)
def test_what_milvus_says_of_each_collection(
    demo: tuple[Path, FixtureUpstream], milvus: str, collection: str, expected: str
) -> None:
    config, _ = demo

    _, lines = check(
        "--config",
        str(config),
        "--grpc-upstream",
        milvus,
        "--database",
        "milvus",
        "--collection",
        collection,
    )

    assert line(lines, expected.split(" — ")[0]) == expected


def test_the_field_checked_is_the_one_the_routes_push_down(
    demo: tuple[Path, FixtureUpstream], milvus: str
) -> None:
    config, _ = demo
    # pymilvus' searches are gRPC calls: a route of the service names another field.
    config.write_text(
        config.read_text()
        + '[routes."/milvus.proto.milvus.MilvusService/"]\ntenant_key = "org"\n'
        + '[routes."/v2/vectordb/"]\npush_down = false\n'
    )

    code, lines = check(
        "--config",
        str(config),
        "--upstream",
        milvus,
        "--database",
        "milvus",
        "--collection",
        "with_tenant",
    )

    assert code == 1
    assert line(lines, "FAIL tenant field in with_tenant").startswith(
        "FAIL tenant field in with_tenant — no field org (fields: id, vec, tenant)"
    )


def test_collections_come_from_the_policy_data_and_the_metric_settings(
    demo: tuple[Path, FixtureUpstream], milvus: str, tmp_path: Path
) -> None:
    config, _ = demo
    data = tmp_path / "data.json"
    data.write_text(
        json.dumps({"retrieval_gate": {"collections": {"with_tenant": {"tenants": []}}}})
    )

    code, lines = check(
        "--config",
        str(config),
        "--upstream",
        milvus,
        "--database",
        "milvus",
        "--policy-data",
        str(data),
        "--metric-collections",
        "without_tenant",
    )

    assert code == 1
    assert [text.split(" — ")[0] for text in lines if "tenant field" in text] == [
        "FAIL tenant field in without_tenant",
        "ok tenant field in with_tenant",
    ]


def test_the_database_is_asked_with_the_credential_envoy_adds(
    demo: tuple[Path, FixtureUpstream], tmp_path: Path
) -> None:
    config, upstream = demo
    credential = tmp_path / "es.key"
    credential.write_text("c2VjcmV0LWFwaS1rZXk=\n")
    mapping = {"docs": {"mappings": {"properties": {"tenant": {"type": "keyword"}}}}}
    upstream.respond("GET", "/docs/_mapping", CannedResponse(orjson.dumps(mapping)))

    code, lines = check(
        "--config", str(config), "--upstream", upstream.url, "--database", "elasticsearch",
        "--collection", "docs", "--upstream-credential-file", str(credential),
        "--upstream-credential-header", "authorization", "--upstream-credential-prefix", "ApiKey ",
    )  # fmt: skip

    assert code == 0, lines
    assert line(lines, "ok upstream credential") == f"ok upstream credential — {credential}"
    assert line(lines, "ok tenant field in docs") == (
        "ok tenant field in docs — tenant is mapped (docs: keyword)"
    )
    [seen] = [request for request in upstream.requests if request.path == "/docs/_mapping"]
    assert seen.headers["authorization"] == "ApiKey c2VjcmV0LWFwaS1rZXk="
    assert "c2VjcmV0LWFwaS1rZXk" not in "\n".join(lines)


@pytest.mark.postgres
def test_a_postgresql_store_is_counted_and_an_unmigrated_one_fails(
    demo: tuple[Path, FixtureUpstream],
) -> None:
    config, _ = demo
    with fresh_database() as url:
        code, lines = check("--config", str(config), "--store", url)

        assert code == 1
        assert line(lines, "FAIL store").endswith(
            "has no retrieval-gate schema; create it with: retrieval-gate store migrate --store URL"
        )

        subprocess.run(
            [sys.executable, "-m", "sidecar.cli", "store", "migrate", "--store", url], check=True
        )
        code, lines = check("--config", str(config), "--store", url)

        assert code == 0, lines
        assert line(lines, "ok store").startswith(f"ok store — postgresql {url}, schema version ")
        assert "0 records (empty" in line(lines, "ok store")


def test_a_store_password_is_never_printed(demo: tuple[Path, FixtureUpstream]) -> None:
    config, _ = demo
    # Port 1: nothing listens there.
    url = "postgresql://gate:never-print-this@127.0.0.1:1/gate?connect_timeout=2"

    code, lines = check("--config", str(config), "--store", url)

    assert code == 1
    assert line(lines, "FAIL store").startswith(
        "FAIL store — PostgreSQL metadata store postgresql://gate:***@127.0.0.1:1/gate"
    )
    assert "never-print-this" not in "\n".join(lines)


def test_json_output_is_one_object_per_check(demo: tuple[Path, FixtureUpstream]) -> None:
    config, _ = demo

    code, lines = check("--config", str(config), "--store", "sqlite:///absent.db", "--json")

    assert code == 1
    checks = [json.loads(text) for text in lines]
    assert all(set(found) == {"check", "outcome", "detail"} for found in checks)
    assert {"check": "store", "outcome": "FAIL"}.items() <= checks[5].items()
    assert [found["check"] for found in checks] == [
        "settings", "identity", "policy data", "policy", "policy tests", "store", "upstream",
        "tenant field",
    ]  # fmt: skip


# --- where the policy comes from: a bundle, or OPA ---------------------------------------


def test_a_bundle_is_read_verified_compiled_and_tested(
    demo: tuple[Path, FixtureUpstream], tmp_path: Path
) -> None:
    config, _ = demo
    data = {"retrieval_gate": {"collections": {"sops": {"tenants": ["acme"]}}}}
    bundle = tmp_path / "bundle.tar.gz"
    bundle.write_bytes(make_bundle({**policy_files(), "data.json": orjson.dumps(data)}))

    code, lines = check("--config", str(config), "--policy-bundle", str(bundle))

    assert code == 0, lines
    assert line(lines, "ok policy bundle") == f"ok policy bundle — bundle {bundle} revision 'r1'"
    assert line(lines, "ok policy data") == "ok policy data — the bundle's data matches its schema"
    assert line(lines, "ok policy —").startswith("ok policy — bundle:r1@sha256:")
    assert line(lines, "ok policy tests").endswith(" passed")
    # The collections the bundle's data describes are the ones to ask about.
    assert line(lines, "not checked tenant field").endswith("to ask about sops")


def test_a_typo_in_a_bundles_data_fails_naming_it(
    demo: tuple[Path, FixtureUpstream], tmp_path: Path
) -> None:
    config, _ = demo
    data = {"retrieval_gate": {"colections": {"sops": {"tenants": ["acme"]}}}}
    bundle = tmp_path / "bundle.tar.gz"
    bundle.write_bytes(make_bundle({**policy_files(), "data.json": orjson.dumps(data)}))

    code, lines = check("--config", str(config), "--policy-bundle", str(bundle))

    assert code == 1
    assert line(lines, "FAIL policy data") == (
        "FAIL policy data — revision 'r1': data.retrieval_gate.colections: unknown key; "
        "did you mean collections?"
    )


def test_a_policy_decided_by_opa_is_asked_of_opa(demo: tuple[Path, FixtureUpstream]) -> None:
    config, _ = demo
    opa = FakeOpa().start()
    try:
        code, lines = check(
            "--config", str(config), "--policy-engine", "opa", "--opa-url", opa.url
        )  # fmt: skip
        assert code == 0, lines
        assert line(lines, "ok policy") == f"ok policy — OPA at {opa.url} serves the chunk policy"
        assert line(lines, "not checked policy tests").endswith("where they are built (opa test)")

        opa.down()
        code, lines = check(
            "--config", str(config), "--policy-engine", "opa", "--opa-url", opa.url
        )  # fmt: skip
        assert code == 1
        assert line(lines, "FAIL policy").startswith(f"FAIL policy — OPA at {opa.url}: ")
    finally:
        opa.stop()
