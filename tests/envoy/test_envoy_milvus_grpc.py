"""The unchanged pymilvus client, through a real Envoy, against a real Milvus Lite server.

Milvus Lite (``milvus_lite.adapter.grpc.server``) runs here as a real gRPC
server on TCP; the collections are loaded with pymilvus straight into it.
``retrieval-gate`` sits in front with no format configured (the gRPC method
path picks the adapter) and identity ``jwt``: the client passes the caller's
JWT as its ``token``, which pymilvus sends base64-encoded in ``authorization``
metadata. ``search`` (several query vectors), ``hybrid_search``, ``query``
and ``get`` return only admitted chunks, with their columns aligned, for an
int64 and a varchar primary key; the text field is nullable, and a row whose
text is null is never released.

Every row's tenant sits in the indexed field ``tenant``, so the default
push-down (``tenant == "<caller's tenant>" and (...)``) hides other tenants'
rows inside Milvus: a row indexed under another tenant whose chunk record
would admit it never comes back. A gate whose ``tenant_key`` names a field the
collections lack gets Milvus' error inside an OK reply: the client is told
``tenant_field_missing``, the audit record and a WARNING line say what Milvus
answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import orjson
import pytest
from milvus_lite.adapter.grpc.server import start_server_in_thread
from pymilvus import AnnSearchRequest, DataType, MilvusClient, MilvusException, RRFRanker

from sidecar.audit.record import UPSTREAM_TEXT_BYTES
from sidecar.formats.milvus.rest import ERROR_MESSAGE
from tests.fixtures import tokens
from tests.fixtures.harness import GateStack
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

SECRET = tokens.hmac_secret()
NUMBERS = range(101, 111)
# Row number -> record overrides (None: the store has no record).
RECORDS: dict[int, dict[str, Any] | None] = {
    101: {},
    102: {"status": "revoked"},
    103: {"tenant_id": "globex"},
    104: {},
    105: {},  # its text was edited in the index
    106: None,
    107: {"allowed_principals": ["group:hr"]},
    108: {},
    109: {},  # its text is null in the index
    110: {},  # indexed under another tenant: push-down hides it
}
ADMITTED = [101, 104, 108]


def _text(chunk_id: str, number: int) -> str | None:
    if number == 105:
        return text_for(chunk_id) + " (edited in the index)"
    return None if number == 109 else text_for(chunk_id)


class Collection:
    """One collection of the corpus: its name, and the chunk id of each row number."""

    def __init__(self, name: str, key_type: DataType, key: Callable[[int], Any]) -> None:
        self.name = name
        self.key_type = key_type
        self.key = key

    def chunk_id(self, number: int) -> str:
        return str(self.key(number))

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "id": self.key(n),
                "vec": [float(n), 0.0],
                "vec2": [float(n), 1.0],
                "text": _text(self.chunk_id(n), n),
                "tenant": "globex" if n == 110 else "acme",
                "note": f"SECRET-note-{n}" if n % 2 else None,
            }
            for n in NUMBERS
        ]

    def load(self, client: MilvusClient) -> None:
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        if self.key_type == DataType.VARCHAR:
            schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=32)
        else:
            schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=2)
        schema.add_field("vec2", DataType.FLOAT_VECTOR, dim=2)
        schema.add_field("text", DataType.VARCHAR, max_length=200, nullable=True)
        schema.add_field("tenant", DataType.VARCHAR, max_length=32)
        schema.add_field("note", DataType.VARCHAR, max_length=32, nullable=True)
        index = client.prepare_index_params()
        index.add_index("vec", metric_type="L2", index_type="FLAT")
        index.add_index("vec2", metric_type="L2", index_type="FLAT")
        client.create_collection(self.name, schema=schema, index_params=index)
        client.insert(self.name, self.rows())
        client.load_collection(self.name)


INT_KEYS = Collection("docs", DataType.INT64, lambda n: n)
STR_KEYS = Collection("docs_str", DataType.VARCHAR, lambda n: f"chunk-{n}")
COLLECTIONS = [INT_KEYS, STR_KEYS]


def jwt(**claims: Any) -> str:
    return tokens.token(SECRET, tokens.claims(groups=["qa"], **claims))


@pytest.fixture(scope="module")
def milvus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A Milvus Lite server on 127.0.0.1, loaded with both collections; its port."""
    data_dir = tmp_path_factory.mktemp("milvus-lite")
    server, db, port = start_server_in_thread(str(data_dir), "127.0.0.1", 0)
    direct = MilvusClient(uri=f"http://127.0.0.1:{port}")
    for collection in COLLECTIONS:
        collection.load(direct)
    direct.close()
    yield port
    server.stop(grace=2)
    db.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, milvus: int) -> Iterator[GateStack]:
    workdir = tmp_path_factory.mktemp("milvus-grpc")
    records = [
        record_dict(collection.chunk_id(n), **overrides)
        for collection in COLLECTIONS
        for n, overrides in RECORDS.items()
        if overrides is not None
    ]
    gate = GateStack(
        workdir,
        records,
        config={
            **tokens.hmac_identity(workdir, SECRET),
            "overfetch_factor": 2,
        },
        upstream_url=f"http://127.0.0.1:{milvus}",
    ).start()
    yield gate
    gate.stop()


@pytest.fixture(scope="module")
def client(stack: GateStack) -> Iterator[MilvusClient]:
    """The unchanged client, with the caller's JWT as its token."""
    milvus = MilvusClient(uri=stack.url, token=jwt(), timeout=20)
    yield milvus
    milvus.close()


def _numbers(collection: Collection, hits: list[Any], key: str = "id") -> list[int]:
    by_id = {collection.chunk_id(n): n for n in NUMBERS}
    return [by_id[str(hit[key])] for hit in hits]


def _any_row(collection: Collection) -> str:
    """An app filter every row passes."""
    return 'id != ""' if collection is STR_KEYS else "id > 0"


def _check_hit(collection: Collection, hit: Any, query: list[float]) -> None:
    """The hit's columns are the row's: text, distance; nothing undeclared."""
    number = _numbers(collection, [hit])[0]
    assert hit["entity"]["text"] == text_for(collection.chunk_id(number))
    assert hit["distance"] == pytest.approx((number - query[0]) ** 2 + query[1] ** 2)
    assert not {"note", "tenant", "vec"} & set(hit["entity"])


@pytest.mark.parametrize("collection", COLLECTIONS, ids=lambda c: c.name)
def test_search_with_several_vectors_returns_only_admitted_rows(
    client: MilvusClient, stack: GateStack, collection: Collection
) -> None:
    queries = [[100.0, 0.0], [109.0, 0.0]]
    result = client.search(
        collection.name,
        data=queries,
        limit=10,
        anns_field="vec",
        output_fields=["text", "note", "tenant"],
    )
    assert [_numbers(collection, hits) for hits in result] == [[101, 104, 108], [108, 104, 101]]
    for hits, query in zip(result, queries, strict=True):
        for hit in hits:
            _check_hit(collection, hit, query)
    record = stack.audit_records()[-1]
    assert sorted(record["released"]) == sorted(collection.chunk_id(n) for n in ADMITTED * 2)
    assert record["tenant_filter"] is True


def test_search_is_over_fetched_and_trimmed_to_k(client: MilvusClient) -> None:
    # Milvus is asked for 4: 101-104 come back, 101 and 104 are admitted.
    result = client.search(
        INT_KEYS.name, data=[[100.0, 0.0]], limit=2, anns_field="vec", output_fields=["text"]
    )
    assert [_numbers(INT_KEYS, hits) for hits in result] == [[101, 104]]


@pytest.mark.parametrize("collection", COLLECTIONS, ids=lambda c: c.name)
def test_hybrid_search_returns_only_admitted_rows(
    client: MilvusClient, collection: Collection
) -> None:
    requests = [
        AnnSearchRequest([[100.0, 0.0]], "vec", {}, 10),
        AnnSearchRequest([[100.0, 1.0]], "vec2", {}, 10, expr=_any_row(collection)),
    ]
    result = client.hybrid_search(
        collection.name, requests, RRFRanker(), limit=10, output_fields=["text", "note"]
    )
    assert [_numbers(collection, hits) for hits in result] == [ADMITTED]
    for hit in result[0]:
        number = _numbers(collection, [hit])[0]
        assert hit["entity"] == {"text": text_for(collection.chunk_id(number))}


@pytest.mark.parametrize("collection", COLLECTIONS, ids=lambda c: c.name)
def test_query_returns_only_admitted_rows(client: MilvusClient, collection: Collection) -> None:
    rows = client.query(
        collection.name, filter=_any_row(collection), output_fields=["text", "note"], limit=20
    )
    assert sorted(_numbers(collection, rows)) == ADMITTED
    for row in rows:
        number = _numbers(collection, [row])[0]
        assert row == {"id": collection.key(number), "text": text_for(collection.chunk_id(number))}


@pytest.mark.parametrize("collection", COLLECTIONS, ids=lambda c: c.name)
def test_get_returns_only_admitted_rows(client: MilvusClient, collection: Collection) -> None:
    keys = [collection.key(n) for n in NUMBERS]
    missing = "chunk-999" if collection is STR_KEYS else 999
    rows = client.get(collection.name, ids=[*keys, missing], output_fields=["text", "note"])
    assert sorted(_numbers(collection, rows)) == ADMITTED
    for row in rows:
        number = _numbers(collection, [row])[0]
        assert row["text"] == text_for(collection.chunk_id(number))
        assert "note" not in row
    # A rejected row is answered as a missing one.
    rejected = client.get(collection.name, ids=[collection.key(102)], output_fields=["text"])
    assert rejected == client.get(collection.name, ids=[missing], output_fields=["text"]) == []


def test_a_milvus_error_keeps_its_code_and_loses_its_text(client: MilvusClient) -> None:
    with pytest.raises(MilvusException) as raised:
        client.search(INT_KEYS.name, data=[[1.0, 0.0]], limit=3, filter="nope == 1")
    assert raised.value.code != 0
    assert raised.value.message == ERROR_MESSAGE


@pytest.mark.parametrize(
    ("token", "code"),
    [
        ("not-a-jwt", "token_missing"),  # no JWT where pymilvus puts its token
        (tokens.token(tokens.hmac_secret(), tokens.claims()), "signature_invalid"),
        (tokens.token(SECRET, tokens.claims(exp=1_000_000_000, iat=999_999_000)), "token_expired"),
    ],
    ids=["garbage", "bad-signature", "expired"],
)
def test_a_bad_token_fails_fast_with_a_clear_error(stack: GateStack, token: str, code: str) -> None:
    started = time.monotonic()
    with pytest.raises(MilvusException) as raised:
        bad = MilvusClient(uri=stack.url, token=token, timeout=20)
        bad.search(INT_KEYS.name, data=[[100.0, 0.0]], limit=3, anns_field="vec")
    # UNAUTHENTICATED is not retried: the client gives up at once.
    assert time.monotonic() - started < 10
    # pymilvus says it could not connect; the gRPC status it chains says why.
    cause = raised.value.__cause__
    assert isinstance(cause, grpc.RpcError)
    assert cause.code() is grpc.StatusCode.UNAUTHENTICATED
    assert code in cause.details()


# -- with released fields: every column of a row stays that row's -----------------------


@pytest.fixture(scope="module")
def releasing(tmp_path_factory: pytest.TempPathFactory, milvus: int) -> Iterator[MilvusClient]:
    """A second gate in front of the same Milvus, releasing more of each row."""
    workdir = tmp_path_factory.mktemp("milvus-grpc-fields")
    records = [
        record_dict(INT_KEYS.chunk_id(n), **overrides)
        for n, overrides in RECORDS.items()
        if overrides is not None
    ]
    gate = GateStack(
        workdir,
        records,
        config={
            **tokens.hmac_identity(workdir, SECRET),
            "formats": {"milvus_grpc": {"releasable_fields": ["note", "vec2", "tenant"]}},
        },
        upstream_url=f"http://127.0.0.1:{milvus}",
    ).start()
    milvus_client = MilvusClient(uri=gate.url, token=jwt(), timeout=20)
    yield milvus_client
    milvus_client.close()
    gate.stop()


def _row_fields(number: int) -> dict[str, Any]:
    row = INT_KEYS.rows()[number - NUMBERS[0]]
    return {key: row[key] for key in ("text", "note", "vec2", "tenant")}


def test_released_columns_stay_aligned_in_search_and_query(releasing: MilvusClient) -> None:
    fields = ["text", "note", "vec2", "tenant", "vec"]
    result = releasing.search(
        INT_KEYS.name,
        data=[[100.0, 0.0], [109.0, 0.0]],
        limit=10,
        anns_field="vec",
        output_fields=fields,
    )
    for hits in result:
        for hit in hits:
            number = _numbers(INT_KEYS, [hit])[0]
            assert hit["entity"] == _row_fields(number)  # "vec" is not declared
    assert [_numbers(INT_KEYS, hits) for hits in result] == [[101, 104, 108], [108, 104, 101]]
    rows = releasing.query(INT_KEYS.name, filter="id > 0", output_fields=fields, limit=20)
    assert sorted(_numbers(INT_KEYS, rows)) == ADMITTED
    for row in rows:
        number = _numbers(INT_KEYS, [row])[0]
        assert row == {"id": number, **_row_fields(number)}


# -- a tenant_key the collections lack ---------------------------------------------------


@pytest.fixture(scope="module")
def misconfigured(tmp_path_factory: pytest.TempPathFactory, milvus: int) -> Iterator[GateStack]:
    """A gate in front of the same Milvus pushing the tenant into ``org_id``, a field
    no collection has, with the per-decision log line on."""
    workdir = tmp_path_factory.mktemp("milvus-grpc-no-field")
    gate = GateStack(
        workdir,
        [record_dict(INT_KEYS.chunk_id(n)) for n in ADMITTED],
        config={
            **tokens.hmac_identity(workdir, SECRET),
            "tenant_key": "org_id",
            "log_decisions": True,
        },
        upstream_url=f"http://127.0.0.1:{milvus}",
    ).start()
    yield gate
    gate.stop()


def _sidecar_log(stack: GateStack) -> list[str]:
    return (stack.workdir / "sidecar.log").read_text().splitlines()


@pytest.mark.parametrize("call", ["search", "query"])
def test_a_tenant_field_the_collection_lacks_is_named_audited_and_logged(
    misconfigured: GateStack, call: str
) -> None:
    client = MilvusClient(uri=misconfigured.url, token=jwt(), timeout=20)
    started = time.monotonic()
    # pymilvus raises a gRPC status it does not retry as it came.
    with pytest.raises(grpc.RpcError) as raised:
        if call == "search":
            client.search(INT_KEYS.name, data=[[100.0, 0.0]], limit=3, anns_field="vec")
        else:
            client.query(INT_KEYS.name, filter="id > 0", limit=3)
    client.close()
    # PERMISSION_DENIED: pymilvus gives up at once instead of retrying for minutes.
    assert time.monotonic() - started < 10
    error: Any = raised.value
    assert error.code() is grpc.StatusCode.PERMISSION_DENIED
    record = misconfigured.audit_records()[-1]
    # Milvus' text (which names the field and quotes the expression) stays in the record.
    assert orjson.loads(error.details()) == {
        "error": "tenant_field_missing",
        "decision_id": record["decision_id"],
    }
    assert (record["outcome"], record["error"]) == ("error", "tenant_field_missing")
    # Milvus Lite answers OK with its error class in the status (6), and names the field.
    assert (record["upstream_status"], record["upstream_code"]) == (200, "milvus:6")
    assert record["upstream_text"].startswith("unknown field 'org_id'")
    assert len(record["upstream_text"].encode()) <= UPSTREAM_TEXT_BYTES
    assert not {"candidates", "released"} & record.keys()
    lines = _sidecar_log(misconfigured)
    (warning,) = [line for line in lines if "WARNING" in line and record["decision_id"] in line]
    assert "upstream code milvus:6" in warning and "gate code tenant_field_missing" in warning
    (decision,) = [line for line in lines if f"decision {record['decision_id']} " in line]
    assert "outcome=error code=tenant_field_missing upstream_code=milvus:6" in decision
    # Neither line carries Milvus' text, which quotes the expression and the tenant.
    for line in (warning, decision):
        assert "unknown field" not in line and "acme" not in line
