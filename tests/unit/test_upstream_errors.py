"""Upstream errors on the response path, in process: every kind reaches the audit record
(code and the first KiB of text, never outcome ``filtered``), one WARNING line names the
decision, and the client gets ``tenant_field_missing`` where the database says the
collection lacks the tenant field.

A real SQLite store behind the real cache, the real policy, the JSON Lines audit
sink and metrics, and the default format table; the bodies are the databases'
own shapes (the fixtures' builders). Through a real Envoy and Milvus Lite:
tests/envoy/test_envoy_milvus_grpc.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from sidecar.audit.jsonl import JsonlAuditSink
from sidecar.audit.record import UPSTREAM_TEXT_BYTES
from sidecar.audit.verify import verify_chain
from sidecar.config import Settings, default_policy_dir, format_table
from sidecar.core.caller import Caller
from sidecar.core.decision_core import DecisionCore
from sidecar.core.hits import Route
from sidecar.core.modes import Mode, RoutePolicies, RoutePolicy
from sidecar.enforcement.response_filter import FilterResult, ResponseFilter
from sidecar.formats.base import RequestRewrite, ResponseFormat
from sidecar.formats.milvus.rest import ERROR_MESSAGE
from sidecar.metrics import GateMetrics
from sidecar.refusals import GrpcStatus
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.store.cache import CachedStore
from sidecar.store.loader import parse_record
from tests.fixtures import elasticsearch_bodies as eb
from tests.fixtures import milvus_bodies as mb
from tests.fixtures import milvus_grpc_bodies as mgb
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures import weaviate_bodies as wb
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.stores import new_sqlite_store

ALICE = Caller("acme", frozenset({"user:alice", "group:qa"}))
POLICY = RegorusEngine.from_directory(default_policy_dir())
# What the request path reports after pushing the tenant down.
PUSHED = RequestRewrite(b"", (), tenant_filter=True, overfetched=False)
NOT_PUSHED = RequestRewrite(b"", (), tenant_filter=False, overfetched=False)

MILVUS_SEARCH = mb.route("search")
MILVUS_GRPC_SEARCH = mgb.SEARCH
WEAVIATE = wb.route()
WEAVIATE_GRPC_SEARCH = Route("POST", "/weaviate.v1.Weaviate/Search")
ES_SEARCH = eb.ROUTES["search"][0]
ES_MSEARCH = eb.ROUTES["msearch"][0]
QDRANT_SEARCH = Route("POST", "/collections/docs/points/search")

# What a database's error can echo: the tenant's value, the client's own filter,
# a stored text. None of it may reach a log line or the client.
TENANT_VALUE = "acme-tenant-7"
CLIENT_FILTER = 'title like "quarterly forecast%"'
# The first line of a stored text (JSON would escape the line break).
CHUNK_TEXT = text_for("2").splitlines()[0]
# Milvus, a filter on a field the collection lacks (code 1100, the field's error last).
MILVUS_FIELD_ERROR = (
    f'failed to create query plan: cannot parse expression: tenant == "{TENANT_VALUE}" '
    f"and ({CLIENT_FILTER}), error: field {{}} not exist: invalid parameter"
)
# Milvus Lite's wording, as it answers through gRPC (code 6).
LITE_FIELD_ERROR = (
    "unknown field '{}' at column 1\n"
    f'  tenant == "{TENANT_VALUE}" and ({CLIENT_FILTER})\n'
    "  ^^^^^^\navailable fields: ['id', 'text', 'vec']"
)
WEAVIATE_PROPERTY_ERROR = (
    "explorer: list class: search: invalid 'where' filter: no such prop with name '{}' "
    "found in class 'Chunk' in the schema. Check your schema files for which properties "
    "in this class are available"
)


class Gate:
    """A response filter over a real store, policy, audit log and metrics."""

    def __init__(self, tmp_path: Path, *, log_decisions: bool = False) -> None:
        self.metrics = GateMetrics()
        inner = new_sqlite_store(tmp_path / "gate.db")
        store = CachedStore(inner, ttl=3600.0, observer=self.metrics)
        store.upsert([parse_record(record_dict(i)) for i in ("1", "2")])
        self.audit_path = tmp_path / "audit.jsonl"
        # Route settings, read once per path (RoutePolicies remembers them):
        # set before the first answer.
        self.mode = Mode.ENFORCE
        self.pass_upstream_errors = False
        self.filter = ResponseFilter(
            formats=format_table(Settings()),
            store=store,
            core=DecisionCore(POLICY),
            audit=JsonlAuditSink(self.audit_path),
            metrics=self.metrics,
            policies=RoutePolicies(self._route_policy),
            log_decisions=log_decisions,
        )

    def _route_policy(self, path: str) -> RoutePolicy:
        return RoutePolicy(
            self.mode,
            "tenant",
            1.0,
            substitute_superseded=False,
            pass_upstream_errors=self.pass_upstream_errors,
        )

    def fmt(self, route: Route) -> ResponseFormat:
        fmt = self.filter.format_for(route)
        assert fmt is not None
        return fmt

    def answer(
        self, route: Route, body: bytes, rewrite: RequestRewrite | None = PUSHED
    ) -> FilterResult:
        """The gate's answer to a 2xx ``body`` on ``route``."""
        return asyncio.run(self.filter.filter(self.fmt(route), route, ALICE, "r", body, rewrite))

    def failed(
        self,
        route: Route,
        status: int,
        body: bytes,
        grpc_status: str | None = None,
        rewrite: RequestRewrite | None = PUSHED,
    ) -> FilterResult:
        """The gate's answer to an upstream error (non-2xx, or a gRPC status)."""
        return self.filter.upstream_error(
            self.fmt(route),
            route,
            ALICE,
            "r",
            status,
            body,
            rewrite=rewrite,
            grpc_status=grpc_status,
        )

    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = orjson.loads(self.audit_path.read_bytes().splitlines()[-1])
        return record

    def upstream_errors(self, route: Route) -> float:
        """Responses counted ``upstream_error`` for ``route``'s format, any collection."""
        name = self.fmt(route).name
        return sum(
            sample.value
            for metric in self.metrics.registry.collect()
            for sample in metric.samples
            if sample.name == "retrieval_gate_responses_total"
            and sample.labels.get("outcome") == "upstream_error"
            and sample.labels.get("format") == name
        )


@pytest.fixture
def gate(tmp_path: Path) -> Gate:
    return Gate(tmp_path)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def assert_no_text(caplog: pytest.LogCaptureFixture, *texts: str) -> None:
    """No log line of any logger carries any of ``texts``."""
    for line in (r.getMessage() for r in caplog.records):
        for text in texts:
            assert text not in line, line


# -- errors inside a successful answer: one case per format that reports them -----------

ENVELOPES: dict[str, tuple[Route, Callable[[str], bytes], str]] = {
    # route, the body reporting an error with this message, the database's code
    "milvus": (MILVUS_SEARCH, lambda m: mb.encode(mb.error_body(1100, m)), "milvus:1100"),
    "milvus_grpc": (
        MILVUS_GRPC_SEARCH,
        lambda m: mgb.error_body("SearchResults", code=65535, reason=m),
        "milvus:65535",
    ),
    # An older server: only the legacy error_code is set.
    "milvus_grpc_legacy": (
        mgb.QUERY,
        lambda m: mgb.error_body("QueryResults", error_code=1, reason=m),
        "milvus:1",
    ),
    "weaviate": (WEAVIATE, lambda m: wb.encode(wb.errors_body(m)), "weaviate:graphql"),
    "elasticsearch_msearch": (
        ES_MSEARCH,
        lambda m: eb.encode(
            eb.msearch_body([{"error": {"type": "parsing_exception", "reason": m}, "status": 400}])
        ),
        "elasticsearch:parsing_exception",
    ),
    "elasticsearch_shards": (
        ES_SEARCH,
        lambda m: eb.encode(
            {
                **eb.search_body([]),
                "_shards": {
                    **eb.SHARDS,
                    "failed": 1,
                    "failures": [{"shard": 0, "reason": {"type": "script_exception", "reason": m}}],
                },
            }
        ),
        "elasticsearch:script_exception",
    ),
}
QUOTING = f"search failed near '{CHUNK_TEXT}' for tenant {TENANT_VALUE}"


@pytest.mark.parametrize("case", sorted(ENVELOPES))
def test_an_error_inside_a_2xx_answer_is_an_upstream_error_in_the_record(
    gate: Gate, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    route, body_for, code = ENVELOPES[case]
    counted = gate.upstream_errors(route)
    with caplog.at_level(logging.INFO):
        result = gate.answer(route, body_for(QUOTING))
    record = gate.record()
    assert (record["outcome"], record["error"]) == ("error", "upstream_error")
    assert (record["upstream_status"], record["upstream_code"]) == (200, code)
    assert QUOTING in record["upstream_text"]
    assert not {"candidates", "released", "rejected"} & record.keys()
    assert gate.upstream_errors(route) == counted + 1
    # The client gets the database's error shape with the gate's text, and the decision id.
    assert result.status == 200 and result.body is not None
    assert CHUNK_TEXT.encode() not in result.body and TENANT_VALUE.encode() not in result.body
    assert result.headers["x-retrieval-gate-decision-id"] == record["decision_id"]
    (line,) = warnings(caplog)
    assert record["decision_id"] in line and code in line and route.path in line
    assert_no_text(caplog, CHUNK_TEXT, TENANT_VALUE, "search failed near")
    assert verify_chain(gate.audit_path).ok


def test_milvus_keeps_its_code_and_loses_its_message(gate: Gate) -> None:
    result = gate.answer(MILVUS_SEARCH, mb.encode(mb.error_body(1100, QUOTING)))
    assert orjson.loads(result.body or b"") == {"code": 1100, "message": ERROR_MESSAGE}
    grpc = gate.answer(MILVUS_GRPC_SEARCH, mgb.error_body(code=1100, reason=QUOTING))
    status = mgb.search_message(grpc.body or b"").status
    assert (status.code, status.reason) == (1100, ERROR_MESSAGE)


def test_audit_mode_passes_an_error_inside_an_answer_and_records_it(gate: Gate) -> None:
    gate.mode = Mode.AUDIT
    result = gate.answer(MILVUS_SEARCH, mb.encode(mb.error_body(1100, QUOTING)))
    assert (result.status, result.body) == (200, None)
    record = gate.record()
    assert (record["outcome"], record["error"], record["upstream_code"]) == (
        "passthrough",
        "upstream_error",
        "milvus:1100",
    )


def test_the_text_of_an_error_inside_an_answer_keeps_its_first_kib(gate: Gate) -> None:
    message = "€" * 1000  # three bytes each: the bound cuts one
    gate.answer(MILVUS_SEARCH, mb.encode(mb.error_body(1100, message)))
    text = gate.record()["upstream_text"]
    assert text == "€" * (UPSTREAM_TEXT_BYTES // 3) + "\ufffd"


# -- errors beside results: the decision stands, the error is recorded with it ----------


def test_a_multi_search_error_item_beside_results_is_recorded_with_the_decision(
    gate: Gate, caplog: pytest.LogCaptureFixture
) -> None:
    body = eb.msearch_body(
        [eb.msearch_item([eb.hit("1", text_for("1")), eb.hit("3", "unknown")]), eb.error_item()]
    )
    with caplog.at_level(logging.WARNING):
        result = gate.answer(ES_MSEARCH, eb.encode(body))
    record = gate.record()
    assert record["outcome"] == "filtered" and "error" not in record
    assert (record["released"], record["upstream_code"]) == (
        ["1"],
        "elasticsearch:index_not_found_exception",
    )
    assert "no such index [missing]" in record["upstream_text"]
    assert b"no such index" not in (result.body or b"")
    (line,) = warnings(caplog)
    assert record["decision_id"] in line and "outcome filtered" in line


def test_weaviate_errors_beside_results_are_recorded_with_the_decision(gate: Gate) -> None:
    body = wb.get_body(
        {"Chunk": [wb.hit(wb.UUIDS[1], text_for("1"))], "Other": None},
        errors=[wb.graphql_error(QUOTING, "Get", "Other")],
    )
    # The hit is decided all the same (its id, a UUID, has no record here: rejected).
    gate.answer(WEAVIATE, wb.encode(body))
    record = gate.record()
    assert (record["outcome"], record["candidates"]) == ("abstained", [wb.UUIDS[1]])
    assert "error" not in record
    assert record["upstream_code"] == "weaviate:graphql"
    assert QUOTING in record["upstream_text"]


# -- the client is told the tenant field is missing, where the database says so ---------

MISSING: dict[str, tuple[Route, Callable[[str], bytes]]] = {
    "milvus": (
        MILVUS_SEARCH,
        lambda field: mb.encode(mb.error_body(1100, MILVUS_FIELD_ERROR.format(field))),
    ),
    "milvus_grpc": (
        MILVUS_GRPC_SEARCH,
        lambda field: mgb.error_body(code=1100, reason=MILVUS_FIELD_ERROR.format(field)),
    ),
    "milvus_lite": (
        MILVUS_GRPC_SEARCH,
        lambda field: mgb.error_body(code=6, error_code=6, reason=LITE_FIELD_ERROR.format(field)),
    ),
    "weaviate": (
        WEAVIATE,
        lambda field: wb.encode(wb.errors_body(WEAVIATE_PROPERTY_ERROR.format(field))),
    ),
}


@pytest.mark.parametrize("case", sorted(MISSING))
def test_a_missing_tenant_field_is_named_to_the_client(
    gate: Gate, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    route, body_for = MISSING[case]
    with caplog.at_level(logging.WARNING):
        result = gate.answer(route, body_for("tenant"))
    record = gate.record()
    assert result.status == 500
    assert orjson.loads(result.body or b"") == {
        "error": "tenant_field_missing",
        "decision_id": record["decision_id"],
    }
    assert (record["outcome"], record["error"]) == ("error", "tenant_field_missing")
    assert "tenant" in record["upstream_text"]
    (line,) = warnings(caplog)
    assert "gate code tenant_field_missing" in line and record["decision_id"] in line
    assert_no_text(caplog, TENANT_VALUE, CLIENT_FILTER)


@pytest.mark.parametrize("case", sorted(MISSING))
def test_another_missing_field_is_an_upstream_error(gate: Gate, case: str) -> None:
    # The client's own filter named a field the collection lacks: nothing to do
    # with the gate's configuration.
    route, body_for = MISSING[case]
    result = gate.answer(route, body_for("colour"))
    assert result.status == 200
    assert gate.record()["error"] == "upstream_error"


@pytest.mark.parametrize("case", sorted(MISSING))
def test_without_push_down_the_tenant_field_is_not_the_gates_to_name(gate: Gate, case: str) -> None:
    route, body_for = MISSING[case]
    for rewrite in (None, NOT_PUSHED):
        gate.answer(route, body_for("tenant"), rewrite)
        assert gate.record()["error"] == "upstream_error"


@pytest.mark.parametrize(
    "message",
    [
        # A literal of the client's filter quoting the words, in an unrelated error.
        'failed to create query plan: cannot parse expression: tenant == "a" and (kind == '
        '"error: field tenant not exist"), error: line 1:9 mismatched input: invalid parameter',
        # The words anywhere but where Milvus puts the field's error.
        "error: field tenant not exist: invalid parameter; and then something else",
        "shard 3: unknown field 'tenant' at column 1",
    ],
)
def test_milvus_words_elsewhere_in_a_text_are_not_a_missing_field(gate: Gate, message: str) -> None:
    gate.answer(MILVUS_SEARCH, mb.encode(mb.error_body(1100, message)))
    assert gate.record()["error"] == "upstream_error"


def test_weaviate_words_quoted_mid_message_are_not_a_missing_field(gate: Gate) -> None:
    quoted = WEAVIATE_PROPERTY_ERROR.format("tenant")
    gate.answer(WEAVIATE, wb.encode(wb.errors_body(f'Syntax Error: Unexpected "{quoted}" here')))
    assert gate.record()["error"] == "upstream_error"


# -- non-2xx answers and gRPC statuses ---------------------------------------------------


def test_a_non_2xx_answer_has_its_status_as_its_code(
    gate: Gate, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        result = gate.failed(QDRANT_SEARCH, 503, qb.encode({"status": {"error": QUOTING}}))
    record = gate.record()
    assert result.status == 503 and result.grpc_status is None
    assert (record["upstream_status"], record["upstream_code"]) == (503, "http:503")
    (line,) = warnings(caplog)
    assert "upstream code http:503" in line and record["decision_id"] in line
    assert_no_text(caplog, CHUNK_TEXT, TENANT_VALUE)


@pytest.mark.parametrize(
    ("sent", "code", "kept"),
    [("5", "grpc:5", 5), ("2", "grpc:2", 2), ("99", "grpc:99", GrpcStatus.UNAVAILABLE)],
)
def test_a_grpc_error_has_its_grpc_status_as_its_code(
    gate: Gate, sent: str, code: str, kept: int
) -> None:
    result = gate.failed(MILVUS_GRPC_SEARCH, 200, QUOTING.encode(), grpc_status=sent)
    record = gate.record()
    assert (record["upstream_status"], record["upstream_code"]) == (200, code)
    assert record["upstream_text"] == QUOTING
    # The gate's body; a gRPC client keeps the upstream's status (its retries read it).
    assert (result.refusal and result.refusal.code, result.grpc_status) == ("upstream_error", kept)


def test_a_grpc_status_that_is_no_number_is_recorded_as_other(gate: Gate) -> None:
    gate.failed(MILVUS_GRPC_SEARCH, 200, b"", grpc_status="abc")
    assert gate.record()["upstream_code"] == "grpc:other"


def test_a_grpc_error_in_trailers_is_passed_where_the_route_passes_upstream_errors(
    tmp_path: Path,
) -> None:
    # Route policies are remembered per path: a gate of its own for each setting.
    for passed in (False, True):
        (tmp_path / str(passed)).mkdir()
        gate = Gate(tmp_path / str(passed))
        gate.pass_upstream_errors = passed
        result = gate.filter.trailers_error(
            gate.fmt(MILVUS_GRPC_SEARCH), MILVUS_GRPC_SEARCH, ALICE, "r", 200, "3", b"m"
        )
        assert (result is None) == passed
        assert (gate.audit_path.read_bytes() == b"") == passed


def test_a_weaviate_grpc_status_naming_the_missing_tenant_property(gate: Gate) -> None:
    message = WEAVIATE_PROPERTY_ERROR.format("tenant").encode()
    result = gate.failed(WEAVIATE_GRPC_SEARCH, 200, message, grpc_status="2")
    assert result.refusal is not None and result.refusal.code == "tenant_field_missing"
    # The gate's own answer, with its own status: PERMISSION_DENIED, never retried.
    assert result.grpc_status is None
    assert result.refusal.grpc_status == GrpcStatus.PERMISSION_DENIED
    assert (gate.record()["error"], gate.record()["upstream_code"]) == (
        "tenant_field_missing",
        "grpc:2",
    )


# -- the hash chain covers the new field --------------------------------------------------


def test_an_edited_upstream_code_breaks_the_chain(gate: Gate) -> None:
    gate.answer(MILVUS_SEARCH, mb.encode(mb.error_body(1100, QUOTING)))
    assert verify_chain(gate.audit_path).ok
    log = gate.audit_path.read_bytes()
    gate.audit_path.write_bytes(log.replace(b'"milvus:1100"', b'"milvus:0000"'))
    report = verify_chain(gate.audit_path)
    assert report.problem == "line 1: content does not match its sha256 (edited)"


# -- the per-decision log line ------------------------------------------------------------


def decision_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sidecar.decisions"]


def qdrant_search(gate: Gate) -> FilterResult:
    # Chunk 1 is admitted; point 3 has no record.
    body = qb.search_body([qb.point(1, text_for("1")), qb.point(3, "no record of it")])
    return gate.answer(QDRANT_SEARCH, qb.encode(body), None)


def test_the_decision_line_is_off_by_default(gate: Gate, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        qdrant_search(gate)
        gate.answer(MILVUS_SEARCH, mb.encode(mb.error_body(1100, QUOTING)))
    assert decision_lines(caplog) == []


def test_the_decision_line_counts_and_names_without_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gate = Gate(tmp_path, log_decisions=True)
    with caplog.at_level(logging.INFO, logger="sidecar.decisions"):
        qdrant_search(gate)
        decided = gate.record()
        gate.answer(MILVUS_SEARCH, mb.encode(mb.error_body(1100, QUOTING)))
        failed = gate.record()
    first, second = decision_lines(caplog)
    assert first == (
        f"decision {decided['decision_id']} POST /collections/docs/points/search "
        "format=qdrant mode=enforce outcome=filtered code=- upstream_code=- "
        f"candidates=2 released=1 rejected=1 latency_ms={decided['latency_ms']:.3f}"
    )
    assert second == (
        f"decision {failed['decision_id']} POST /v2/vectordb/entities/search "
        "format=milvus mode=enforce outcome=error code=upstream_error "
        f"upstream_code=milvus:1100 candidates=0 released=0 rejected=0 "
        f"latency_ms={failed['latency_ms']:.3f}"
    )
    assert_no_text(caplog, text_for("1"), "no record of it", QUOTING, "acme")


# -- the formats' reading of a missing field ----------------------------------------------


@pytest.mark.parametrize(
    ("route", "text", "field"),
    [
        (MILVUS_SEARCH, MILVUS_FIELD_ERROR.format("org_id"), "org_id"),
        (MILVUS_GRPC_SEARCH, LITE_FIELD_ERROR.format("org_id"), "org_id"),
        (MILVUS_GRPC_SEARCH, "collection not found[database=default][collection=docs]", None),
        (WEAVIATE, WEAVIATE_PROPERTY_ERROR.format("org_id"), "org_id"),
        (WEAVIATE_GRPC_SEARCH, WEAVIATE_PROPERTY_ERROR.format("org_id") + ".", "org_id"),
        # Databases that answer a filter on a missing field with no hits say nothing.
        (ES_SEARCH, MILVUS_FIELD_ERROR.format("org_id"), None),
        (QDRANT_SEARCH, WEAVIATE_PROPERTY_ERROR.format("org_id"), None),
    ],
)
def test_each_format_reads_its_own_missing_field_words(
    gate: Gate, route: Route, text: str, field: str | None
) -> None:
    assert gate.fmt(route).missing_field(text) == field
