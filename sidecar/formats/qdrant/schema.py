"""Whether a Qdrant collection indexes the tenant field: ``GET /collections/<name>``.

Qdrant keeps no schema of payloads: ``payload_schema`` in the collection's
info lists the payload *indexes* only. Push-down adds ``{"key": <field>,
"match": {"value": <tenant>}}``, which a ``keyword`` index serves (Qdrant's
multitenancy guide: a keyword index with ``is_tenant``). A field without an
index may still be on every point: the schema cannot tell, and says so.
"""

from __future__ import annotations

from urllib.parse import quote

from sidecar.formats.qdrant.grpc_request import SERVICE
from sidecar.formats.schema_probe import (
    FieldReport,
    Presence,
    SchemaAnswerError,
    SchemaRequest,
    error_text,
    load_json,
)


class QdrantSchemaProbe:
    """Reads the tenant field's payload index from a collection's info."""

    database = "qdrant"

    def search_paths(self, collection: str) -> tuple[str, ...]:
        """The REST query under the collection, and the gRPC ``Query``."""
        return (f"/collections/{collection}/points/query", f"/{SERVICE}/Query")

    def request(self, collection: str) -> SchemaRequest:
        """``GET /collections/<name>`` (REST: the gRPC port is not asked)."""
        return SchemaRequest("GET", f"/collections/{quote(collection, safe='')}")

    def read(self, status: int, body: bytes, field: str) -> FieldReport:
        """FOUND for a keyword (or uuid) index on ``field``; UNKNOWN without one, or
        with an index of another type."""
        if status != 200:
            raise SchemaAnswerError(error_text(status, body, "status", "error"))
        info = load_json(body, "the collection info")
        result = info.get("result") if isinstance(info, dict) else None
        schema = result.get("payload_schema") if isinstance(result, dict) else None
        if not isinstance(schema, dict):
            raise SchemaAnswerError("the collection info has no payload_schema")
        index = schema.get(field)
        if not isinstance(index, dict):
            return FieldReport(
                Presence.UNKNOWN,
                f"{field} has no payload index, and Qdrant lists indexed fields only: create "
                f'one (PUT /collections/<name>/index, field_name "{field}", field_schema '
                "keyword, is_tenant true) to have it checked",
            )
        kind = index.get("data_type")
        if kind not in ("keyword", "uuid"):
            return FieldReport(
                Presence.UNKNOWN,
                f"{field} is indexed as {kind}, not keyword: whether points hold the tenant "
                "as a string the index serves cannot be told",
            )
        params = index.get("params")
        tenant = isinstance(params, dict) and params.get("is_tenant") is True
        return FieldReport(
            Presence.FOUND, f"{field} has a {kind} index" + (" (is_tenant)" if tenant else "")
        )
