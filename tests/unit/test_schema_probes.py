"""What each database's schema answer says about the tenant field (``retrieval-gate check``).

The answers are shaped as the databases' API references show them
(Elasticsearch get-mapping, Weaviate ``/v1/schema/{class}``, Qdrant collection
info); Milvus is asked for real in tests/servers/test_check_command.py.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from sidecar.formats.elasticsearch.schema import ElasticsearchSchemaProbe
from sidecar.formats.milvus.schema import MilvusSchemaProbe
from sidecar.formats.probes import DATABASES, NO_SCHEMA, SCHEMA_PROBES
from sidecar.formats.qdrant.schema import QdrantSchemaProbe
from sidecar.formats.schema_probe import Presence, SchemaAnswerError, SchemaRequest
from sidecar.formats.weaviate.schema import WeaviateSchemaProbe


def body(document: Any) -> bytes:
    return orjson.dumps(document)


def es_mapping(properties: dict[str, Any], index: str = "docs") -> bytes:
    return body({index: {"mappings": {"properties": properties}}})


ES = ElasticsearchSchemaProbe()
WEAVIATE = WeaviateSchemaProbe()
QDRANT = QdrantSchemaProbe()


def test_every_database_is_probed_or_says_why_not() -> None:
    assert set(DATABASES) == {"qdrant", "milvus", "weaviate", "elasticsearch", "chroma", "pinecone"}
    assert not set(SCHEMA_PROBES) & set(NO_SCHEMA)
    assert all(probe.database == name for name, probe in SCHEMA_PROBES.items())


def test_the_requests_name_the_collection_quoted() -> None:
    assert ES.request("logs-*") == SchemaRequest("GET", "/logs-*/_mapping")
    assert WEAVIATE.request("Article") == SchemaRequest("GET", "/v1/schema/Article")
    assert QDRANT.request("a b/c") == SchemaRequest("GET", "/collections/a%20b%2Fc")
    milvus = MilvusSchemaProbe().request("docs")
    assert milvus.grpc
    assert milvus.path == "/milvus.proto.milvus.MilvusService/DescribeCollection"


@pytest.mark.parametrize(
    ("mapping", "field", "presence", "detail"),
    [
        (
            {"tenant": {"type": "keyword"}},
            "tenant",
            Presence.FOUND,
            "tenant is mapped (docs: keyword)",
        ),
        (
            {"meta": {"properties": {"tenant": {"type": "constant_keyword"}}}},
            "meta.tenant",
            Presence.FOUND,
            "meta.tenant is mapped (docs: constant_keyword)",
        ),
        (
            {"tenant": {"type": "text", "fields": {"keyword": {"type": "keyword"}}}},
            "tenant.keyword",
            Presence.FOUND,
            "tenant.keyword is mapped (docs: keyword)",
        ),
        (
            {"tenant": {"type": "text", "fields": {"keyword": {"type": "keyword"}}}},
            "tenant",
            Presence.MISSING,
            "index docs maps tenant as text: a term query matches any tenant sharing a token; "
            "map it as keyword (with dynamic mapping: tenant_key = 'tenant.keyword')",
        ),
        (
            {"meta": {"properties": {"org": {"type": "keyword"}}}},
            "meta",
            Presence.MISSING,
            "index docs maps meta as object, which holds fields, not a value: set tenant_key "
            "to the field inside it that holds the tenant",
        ),
        (
            {"org": {"type": "keyword"}},
            "tenant",
            Presence.MISSING,
            "index docs does not map tenant: no document holds it, so push-down finds nothing; "
            "index the tenant into it, or set tenant_key to the field that holds it",
        ),
    ],
)
def test_an_elasticsearch_mapping(
    mapping: dict[str, Any], field: str, presence: Presence, detail: str
) -> None:
    report = ES.read(200, es_mapping(mapping), field)
    assert (report.presence, report.detail) == (presence, detail)


def test_every_index_behind_an_alias_must_map_the_field() -> None:
    answer = body(
        {
            "docs-2025": {"mappings": {"properties": {"tenant": {"type": "keyword"}}}},
            "docs-2026": {"mappings": {"properties": {"text": {"type": "text"}}}},
        }
    )
    report = ES.read(200, answer, "tenant")
    assert report.presence is Presence.MISSING
    assert report.detail.startswith("index docs-2026 does not map tenant")


def test_an_elasticsearch_error_is_named() -> None:
    answer = body(
        {
            "error": {"type": "index_not_found_exception", "reason": "no such index [docs]"},
            "status": 404,
        }
    )
    with pytest.raises(SchemaAnswerError, match=r"^HTTP 404: no such index \[docs\]$"):
        ES.read(404, answer, "tenant")


def weaviate_class(*properties: dict[str, Any]) -> bytes:
    return body({"class": "Article", "properties": list(properties), "vectorizer": "none"})


@pytest.mark.parametrize(
    ("properties", "presence", "detail"),
    [
        (
            [{"name": "tenant", "dataType": ["text"], "tokenization": "field"}],
            Presence.FOUND,
            "tenant is text, tokenization field",
        ),
        (
            [{"name": "tenant", "dataType": ["text"], "tokenization": "word"}],
            Presence.MISSING,
            "tenant is text with tokenization word: Equal matches any tenant sharing a word; "
            "use tokenization field",
        ),
        ([{"name": "tenant", "dataType": ["string"]}], Presence.FOUND, "tenant is string"),
        (
            [{"name": "tenant", "dataType": ["int"]}],
            Presence.MISSING,
            "tenant is int; push-down compares it with valueText: make it text with "
            "tokenization field",
        ),
        (
            [{"name": "title", "dataType": ["text"]}, {"name": "body", "dataType": ["text"]}],
            Presence.MISSING,
            "no property tenant (properties: body, title): add it as text with tokenization "
            "field, or set tenant_key to the property that holds the tenant",
        ),
    ],
)
def test_a_weaviate_class(
    properties: list[dict[str, Any]], presence: Presence, detail: str
) -> None:
    report = WEAVIATE.read(200, weaviate_class(*properties), "tenant")
    assert (report.presence, report.detail) == (presence, detail)


def test_a_missing_weaviate_class_is_named() -> None:
    with pytest.raises(SchemaAnswerError, match=r"^HTTP 404: no such class$"):
        WEAVIATE.read(404, b"", "tenant")


def qdrant_info(payload_schema: dict[str, Any]) -> bytes:
    return body(
        {
            "result": {"status": "green", "points_count": 3, "payload_schema": payload_schema},
            "status": "ok",
            "time": 0.0001,
        }
    )


@pytest.mark.parametrize(
    ("payload_schema", "presence", "detail"),
    [
        (
            {"tenant": {"data_type": "keyword", "params": {"type": "keyword", "is_tenant": True}}},
            Presence.FOUND,
            "tenant has a keyword index (is_tenant)",
        ),
        (
            {"tenant": {"data_type": "keyword", "points": 3}},
            Presence.FOUND,
            "tenant has a keyword index",
        ),
        (
            {"tenant": {"data_type": "integer", "points": 3}},
            Presence.UNKNOWN,
            "tenant is indexed as integer, not keyword: whether points hold the tenant as a "
            "string the index serves cannot be told",
        ),
        (
            {},
            Presence.UNKNOWN,
            "tenant has no payload index, and Qdrant lists indexed fields only: create one "
            '(PUT /collections/<name>/index, field_name "tenant", field_schema keyword, '
            "is_tenant true) to have it checked",
        ),
    ],
)
def test_a_qdrant_collection(
    payload_schema: dict[str, Any], presence: Presence, detail: str
) -> None:
    report = QDRANT.read(200, qdrant_info(payload_schema), "tenant")
    assert (report.presence, report.detail) == (presence, detail)


def test_a_missing_qdrant_collection_is_named() -> None:
    answer = body({"status": {"error": "Not found: Collection `docs` doesn't exist!"}, "time": 0})
    with pytest.raises(
        SchemaAnswerError, match=r"^HTTP 404: Not found: Collection `docs` doesn't exist!$"
    ):
        QDRANT.read(404, answer, "tenant")


@pytest.mark.parametrize("probe", [ES, WEAVIATE, QDRANT], ids=lambda p: p.database)
def test_an_answer_that_is_not_json_is_an_error(probe: Any) -> None:
    with pytest.raises(SchemaAnswerError, match=r"is not JSON$"):
        probe.read(200, b"<html>proxy error</html>", "tenant")


def test_a_milvus_answer_that_is_not_a_description_is_an_error() -> None:
    with pytest.raises(SchemaAnswerError, match=r"^not a DescribeCollectionResponse$"):
        MilvusSchemaProbe().read(200, b"\xff\xff\xff", "tenant")


def test_long_error_messages_are_cut_to_a_line() -> None:
    answer = body({"error": {"reason": "x\n" * 500}})
    with pytest.raises(SchemaAnswerError) as raised:
        ES.read(500, answer, "tenant")
    assert len(str(raised.value)) < 320 and "\n" not in str(raised.value)
