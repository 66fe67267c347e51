"""Rendering a Qdrant body with a superseded hit replaced by its successor."""

from __future__ import annotations

import orjson

from sidecar.core.hits import Replacement
from sidecar.formats.base import SUBSTITUTED_FOR
from sidecar.formats.options import AdapterOptions
from sidecar.formats.qdrant.rest import QdrantFormat
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.qdrant_models import RESPONSE_MODELS


def test_point_id_mode_replaces_id_and_text_and_keeps_the_rest() -> None:
    body = qb.encode(qb.search_body([qb.point(1, "old", score=0.9), qb.point(2, "other")]))
    parsed = QdrantFormat().parse(body, qb.route("search"))
    out = parsed.render({0, 1}, replacements={0: Replacement("7", "new text")})
    RESPONSE_MODELS["search"].model_validate_json(out)
    first, second = orjson.loads(out)["result"]
    assert first["id"] == 7 and first["score"] == 0.9
    assert first["payload"] == {"text": "new text", SUBSTITUTED_FOR: 1}
    assert second == qb.point(2, "other")


def test_payload_id_mode_replaces_the_id_field() -> None:
    uuid = "0b2f7e6c-9a59-4cde-8a7e-3c1c5d1c6a01"
    body = qb.encode(qb.query_body([qb.point(uuid, "old", chunk_id="sop-7-v2", doc="SOP-7")]))
    parsed = QdrantFormat(AdapterOptions(id_field="chunk_id")).parse(body, qb.route("query"))
    out = parsed.render({0}, replacements={0: Replacement("sop-7-v3", "rev 3")})
    RESPONSE_MODELS["query"].model_validate_json(out)
    (hit,) = orjson.loads(out)["result"]["points"]
    assert hit["id"] == uuid
    # "doc" is no declared field: it never goes out.
    assert hit["payload"] == {"text": "rev 3", "chunk_id": "sop-7-v3", SUBSTITUTED_FOR: "sop-7-v2"}


def test_single_point_and_uuid_substitute() -> None:
    body = qb.encode(qb.get_point_body(qb.point(5, "old")))
    parsed = QdrantFormat().parse(body, qb.route("{id}", point_id=5))
    new_id = "5e9e0c1e-1f7d-4a41-9a7e-0d3b3f5f9a02"
    out = parsed.render({0}, replacements={0: Replacement(new_id, "new")})
    RESPONSE_MODELS["{id}"].model_validate_json(out)
    assert orjson.loads(out)["result"]["id"] == new_id


def test_original_document_is_not_mutated() -> None:
    body = qb.encode(qb.search_body([qb.point(1, "old")]))
    parsed = QdrantFormat().parse(body, qb.route("search"))
    parsed.render({0}, replacements={0: Replacement("2", "new")})
    assert orjson.loads(parsed.render({0}))["result"][0] == qb.point(1, "old")


def test_a_non_ascii_digit_id_stays_a_string() -> None:
    # "٣" is a digit to str.isdigit() but no Qdrant integer id.
    body = qb.encode(qb.search_body([qb.point(1, "old")]))
    parsed = QdrantFormat().parse(body, qb.route("search"))
    out = parsed.render({0}, replacements={0: Replacement("٣", "new")})
    assert orjson.loads(out)["result"][0]["id"] == "٣"
