"""Milvus tenant push-down against a real engine: hostile tenants and filters in Milvus Lite.

tests/unit/test_milvus_request.py and tests/unit/test_milvus_grpc_request.py check the
rewritten expression against the tests' own reading of the filter grammar.
Here the expression the gate's rewriters produce is evaluated by a Milvus
server (Milvus Lite, ``milvus_lite.adapter.grpc.server``, with its own lexer and
parser of the filter language): one collection holds rows of many tenants,
among them tenants whose names are injection attempts, and every caller gets
exactly the rows of its own tenant (and that satisfy its filter), or the gate
refuses the request; never a row of another tenant.

Both rewriters: the gRPC one (``MilvusGrpcFormat``; its rewritten
``QueryRequest`` and ``SearchRequest`` bytes are sent to the server as they
are) and the REST one (``MilvusFormat``; Milvus Lite speaks gRPC only, so its
rewritten ``filter`` goes to the server through pymilvus' ``query``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import grpc
import orjson
import pytest
from milvus_lite.adapter.grpc.server import start_server_in_thread
from pymilvus import DataType, MilvusClient, MilvusException
from pymilvus.client.prepare import Prepare
from pymilvus.grpc_gen import milvus_pb2

from sidecar.core.hits import Route
from sidecar.formats.base import UnfilterableRequest
from sidecar.formats.grpc_frames import frame, messages
from sidecar.formats.milvus.grpc import MilvusGrpcFormat
from sidecar.formats.milvus.rest import MilvusFormat
from tests.fixtures import milvus_grpc_bodies as mb

COLLECTION = "docs"
# Tenants stored in the index: plain ones, and names that try to end the
# gate's string literal or parenthesis, or that a wrong escaping would merge
# with another tenant (a backslash eaten, a quote left open, case or space).
TENANTS = [
    "acme",
    "globex",
    'a" or tenant != "',
    'a\\" or tenant != \\"',
    "x) or (true",
    'x") or ("1" == "1',
    "a\\b",
    "a\\\\b",
    "a\\",
    "\\",
    '\\"',
    '"',
    "'",
    "a'b",
    "' or tenant != '",
    "ünï €",
    "日本",
    "",
    "acme ",
    "ACME",
    "%",
    "a%",
]
# Callers with no row of their own: they must get nothing at all.
STRANGERS = ['nobody" or "1" == "1', "nobody') or ('1' == '1", "\\\\", "acme\\"]
KINDS = ("a", "b")


class Row(NamedTuple):
    id: int
    tenant: str
    kind: str


ROWS = [
    Row(100 * t + n, tenant, KINDS[n % 2]) for t, tenant in enumerate(TENANTS) for n in range(1, 4)
]


@pytest.fixture(scope="module")
def milvus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A Milvus Lite server on 127.0.0.1 holding ``ROWS``; its port."""
    server, db, port = start_server_in_thread(
        str(tmp_path_factory.mktemp("milvus-lite")), "127.0.0.1", 0
    )
    client = MilvusClient(uri=f"http://127.0.0.1:{port}")
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=2)
    schema.add_field("tenant", DataType.VARCHAR, max_length=64)
    schema.add_field("kind", DataType.VARCHAR, max_length=64)
    index = client.prepare_index_params()
    index.add_index("vec", metric_type="L2", index_type="FLAT")
    client.create_collection(COLLECTION, schema=schema, index_params=index)
    rows = [{**row._asdict(), "vec": [float(row.id), 0.0]} for row in ROWS]
    client.insert(COLLECTION, rows)
    client.load_collection(COLLECTION)
    # Every row is there, each tenant's name stored as it is.
    everything = client.query(COLLECTION, filter="id > 0", output_fields=["tenant", "kind"])
    assert sorted((r["id"], r["tenant"], r["kind"]) for r in everything) == sorted(ROWS)
    client.close()
    yield port
    server.stop(grace=2)
    db.close()


@pytest.fixture(scope="module")
def channel(milvus: int) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{milvus}") as opened:
        yield opened


@pytest.fixture(scope="module")
def client(milvus: int) -> Iterator[MilvusClient]:
    opened = MilvusClient(uri=f"http://127.0.0.1:{milvus}")
    yield opened
    opened.close()


def expected(tenant: str, where: Callable[[Row], bool] = lambda row: True) -> set[Row]:
    return {row for row in ROWS if row.tenant == tenant and where(row)}


# -- the gate's rewriters, then the engine -----------------------------------------------

GRPC = MilvusGrpcFormat()
REST = MilvusFormat()


def _grpc_rewrite(request: Any, route: Route, tenant: str) -> bytes:
    rewrite = GRPC.rewrite_request(
        frame(request.SerializeToString()),
        route,
        tenant=tenant,
        tenant_key="tenant",
        overfetch_factor=1,
        overfetch_cap=100,
    )
    (message,) = messages(rewrite.body)
    return message


def _rows(fields_data: Any, ids: list[int]) -> set[Row]:
    columns = {field.field_name: list(field.scalars.string_data.data) for field in fields_data}
    assert len(columns["tenant"]) == len(columns["kind"]) == len(ids)
    return {Row(*row) for row in zip(ids, columns["tenant"], columns["kind"], strict=True)}


class MilvusFailed(Exception):
    """Milvus answered the request with an error status."""


def _succeeded(status: Any) -> None:
    if status.code != 0 or status.error_code != 0:
        raise MilvusFailed(status.reason)


def grpc_query(channel: grpc.Channel, tenant: str, app_filter: str) -> set[Row]:
    """The rows Milvus answers to the gate's rewrite of the client's Query."""
    request = Prepare.query_request(COLLECTION, app_filter, ["id", "tenant", "kind"], [])
    sent = _grpc_rewrite(request, mb.QUERY, tenant)
    call = channel.unary_unary(
        "/milvus.proto.milvus.MilvusService/Query",
        response_deserializer=milvus_pb2.QueryResults.FromString,
    )
    reply = call(sent, timeout=30)
    _succeeded(reply.status)
    ids = [field for field in reply.fields_data if field.field_name == "id"]
    (id_column,) = ids
    others = [field for field in reply.fields_data if field.field_name != "id"]
    return _rows(others, list(id_column.scalars.long_data.data))


def grpc_search(channel: grpc.Channel, tenant: str, app_filter: str) -> set[Row]:
    """The rows Milvus answers to the gate's rewrite of the client's Search."""
    request = Prepare.search_requests_with_expr(
        COLLECTION,
        "vec",
        {"metric_type": "L2", "params": {}},
        len(ROWS),
        data=[[0.0, 0.0]],
        expr=app_filter,
        output_fields=["tenant", "kind"],
    )
    sent = _grpc_rewrite(request, mb.SEARCH, tenant)
    call = channel.unary_unary(
        "/milvus.proto.milvus.MilvusService/Search",
        response_deserializer=milvus_pb2.SearchResults.FromString,
    )
    reply = call(sent, timeout=30)
    _succeeded(reply.status)
    return _rows(reply.results.fields_data, list(reply.results.ids.int_id.data))


def rest_query(client: MilvusClient, tenant: str, app_filter: str) -> set[Row]:
    """The rows Milvus answers to the filter of the gate's rewrite of a REST query."""
    body = {"collectionName": COLLECTION, "filter": app_filter, "limit": len(ROWS)}
    rewrite = REST.rewrite_request(
        orjson.dumps(body),
        Route("POST", "/v2/vectordb/entities/query"),
        tenant=tenant,
        tenant_key="tenant",
        overfetch_factor=1,
        overfetch_cap=100,
    )
    sent = orjson.loads(rewrite.body)
    found = client.query(
        COLLECTION, filter=sent["filter"], output_fields=["tenant", "kind"], limit=len(ROWS)
    )
    return {Row(r["id"], r["tenant"], r["kind"]) for r in found}


Ask = Callable[[Any, str, str], set[Row]]
PATHS: dict[str, tuple[str, Ask]] = {
    "grpc-query": ("channel", grpc_query),
    "grpc-search": ("channel", grpc_search),
    "rest-query": ("client", rest_query),
}


@pytest.fixture(params=sorted(PATHS))
def ask(request: pytest.FixtureRequest) -> Callable[[str, str], set[Row]]:
    """One path into Milvus: ``ask(tenant, app_filter)`` -> the rows that came back."""
    fixture, run = PATHS[request.param]
    connection = request.getfixturevalue(fixture)
    return lambda tenant, app_filter: run(connection, tenant, app_filter)


# -- hostile tenants ---------------------------------------------------------------------


@pytest.mark.parametrize("tenant", TENANTS + STRANGERS)
def test_a_caller_gets_exactly_its_own_tenants_rows(
    ask: Callable[[str, str], set[Row]], tenant: str
) -> None:
    # None of these tenants needs refusing: each is quoted, and Milvus reads
    # back the very string, so the rows are that tenant's, all of them.
    assert ask(tenant, "") == expected(tenant)
    assert ask(tenant, 'kind == "a"') == expected(tenant, lambda row: row.kind == "a")


@pytest.mark.parametrize("tenant", ["a\nb", "a\rb", "a\x00b"])
def test_a_tenant_the_gate_cannot_quote_is_refused(
    ask: Callable[[str, str], set[Row]], tenant: str
) -> None:
    with pytest.raises(UnfilterableRequest):
        ask(tenant, "")


# -- hostile filters ---------------------------------------------------------------------

# Filters the gate forwards (inside its parentheses, behind the tenant
# condition), and which rows of the caller's tenant each one selects.
FORWARDED: list[tuple[str, Callable[[Row], bool]]] = [
    ('tenant != ""', lambda row: row.tenant != ""),
    ('kind == "a" or tenant != "acme"', lambda row: row.kind == "a" or row.tenant != "acme"),
    ('tenant in ["acme", "globex"]', lambda row: row.tenant in ("acme", "globex")),
    ('tenant like "%"', lambda row: True),
    ("id > 0 or id < 0", lambda row: True),
    # Parentheses and quotes inside a literal stay in the literal.
    ('kind == "a\\") or (tenant != \\""', lambda row: row.kind == 'a") or (tenant != "'),
    ("kind == 'a) or (true'", lambda row: row.kind == "a) or (true"),
    ('(kind == "b")', lambda row: row.kind == "b"),
]
# Filters that would close the gate's parenthesis: the gate refuses them.
REFUSED = [
    'kind == "a") or (tenant != ""',
    "id > 0) or (id > 0",
    'kind == "a")) or ((tenant != ""',
    "kind == 'a') or ('1' == '1'",
    'kind == "a") or true or (kind == "b"',
]
CALLERS = ["acme", 'a" or tenant != "', "x) or (true", "a\\", ""]


@pytest.mark.parametrize("tenant", CALLERS)
@pytest.mark.parametrize(("app_filter", "where"), FORWARDED)
def test_a_clients_filter_selects_only_within_its_tenant(
    ask: Callable[[str, str], set[Row]], tenant: str, app_filter: str, where: Callable[[Row], bool]
) -> None:
    assert ask(tenant, app_filter) == expected(tenant, where)


@pytest.mark.parametrize("tenant", CALLERS)
@pytest.mark.parametrize("app_filter", REFUSED)
def test_a_filter_that_escapes_the_parentheses_never_reaches_milvus(
    ask: Callable[[str, str], set[Row]], tenant: str, app_filter: str
) -> None:
    with pytest.raises(UnfilterableRequest):
        ask(tenant, app_filter)


@pytest.mark.parametrize("tenant", CALLERS)
@pytest.mark.parametrize("app_filter", ['kind == "a', "(kind == 'a'", "kind == ", "))"])
def test_a_broken_filter_is_refused_or_fails_in_milvus_never_widens(
    ask: Callable[[str, str], set[Row]], tenant: str, app_filter: str
) -> None:
    # Unbalanced or unfinished: the gate may forward it (Milvus then fails the
    # request) or refuse it; what comes back, if anything, is the tenant's.
    try:
        rows = ask(tenant, app_filter)
    except (UnfilterableRequest, MilvusException, MilvusFailed):
        return
    assert rows <= expected(tenant)
