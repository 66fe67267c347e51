"""Whether a Weaviate class has the tenant property: ``GET /v1/schema/<class>``.

Push-down adds ``{path: [<field>], operator: Equal, valueText: <tenant>}``.
An ``Equal`` on a ``text`` property compares tokens as the property's
tokenization makes them: only ``field`` keeps the whole value as one token,
so with the default ``word``, ``acme`` also matches ``acme-labs``.
"""

from __future__ import annotations

from urllib.parse import quote

from sidecar.formats.schema_probe import (
    FieldReport,
    Presence,
    SchemaAnswerError,
    SchemaRequest,
    error_text,
    load_json,
)
from sidecar.formats.weaviate.grpc_request import SERVICE


class WeaviateSchemaProbe:
    """Reads the tenant property from a class's schema."""

    database = "weaviate"

    def search_paths(self, collection: str) -> tuple[str, ...]:
        """GraphQL and the gRPC ``Search`` (neither path names the class)."""
        return ("/v1/graphql", f"/{SERVICE}/Search")

    def request(self, collection: str) -> SchemaRequest:
        """``GET /v1/schema/<class>``."""
        return SchemaRequest("GET", f"/v1/schema/{quote(collection, safe='')}")

    def read(self, status: int, body: bytes, field: str) -> FieldReport:
        """FOUND for a ``text`` property with ``field`` tokenization (or ``string``);
        MISSING for none, another tokenization or another type."""
        if status == 404:
            raise SchemaAnswerError("HTTP 404: no such class")
        if status != 200:
            raise SchemaAnswerError(error_text(status, body, "error"))
        described = load_json(body, "the class schema")
        properties = described.get("properties") if isinstance(described, dict) else None
        if not isinstance(properties, list):
            raise SchemaAnswerError("the class schema has no properties list")
        named = {p.get("name"): p for p in properties if isinstance(p, dict)}
        found = named.get(field)
        if found is None:
            names = ", ".join(sorted(str(name) for name in named)) or "none"
            return FieldReport(
                Presence.MISSING,
                f"no property {field} (properties: {names}): add it as text with "
                "tokenization field, or set tenant_key to the property that holds the tenant",
            )
        data_type = found.get("dataType")
        kind = data_type[0] if isinstance(data_type, list) and data_type else None
        tokenization = found.get("tokenization")
        if kind == "string":
            return FieldReport(Presence.FOUND, f"{field} is string")
        if kind != "text":
            return FieldReport(
                Presence.MISSING,
                f"{field} is {kind}; push-down compares it with valueText: make it text "
                "with tokenization field",
            )
        if tokenization != "field":
            return FieldReport(
                Presence.MISSING,
                f"{field} is text with tokenization {tokenization or 'word'}: Equal matches "
                "any tenant sharing a word; use tokenization field",
            )
        return FieldReport(Presence.FOUND, f"{field} is text, tokenization field")
