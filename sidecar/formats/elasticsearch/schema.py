"""Whether an Elasticsearch (or OpenSearch) index maps the tenant field: ``GET /<index>/_mapping``.

Push-down adds the term query ``{"term": {<field>: <tenant>}}``. The field
must be mapped, and as a ``keyword`` (or another type whose term query matches
the whole value): a ``text`` field is analysed into tokens, and a term matches
any tenant sharing one. A dotted field name is looked up through object
``properties`` and multi-field ``fields`` (``tenant.keyword``). An alias or a
pattern answers with every index behind it; each must map the field.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import quote

from sidecar.formats.schema_probe import (
    FieldReport,
    Presence,
    SchemaAnswerError,
    SchemaRequest,
    error_text,
    load_json,
)

# Analysed into tokens: a term query matches a token, not the value.
_ANALYSED: Final = frozenset({"text", "match_only_text", "search_as_you_type", "semantic_text"})
# Containers, not values: a term on them matches nothing.
_CONTAINERS: Final = frozenset({"object", "nested", "flattened"})


class ElasticsearchSchemaProbe:
    """Reads the tenant field from an index's mapping."""

    database = "elasticsearch"

    def search_paths(self, collection: str) -> tuple[str, ...]:
        """``/<index>/_search``."""
        return (f"/{collection}/_search",)

    def request(self, collection: str) -> SchemaRequest:
        """``GET /<index>/_mapping`` (wildcards and comma lists kept)."""
        return SchemaRequest("GET", f"/{quote(collection, safe='*,')}/_mapping")

    def read(self, status: int, body: bytes, field: str) -> FieldReport:
        """FOUND when every index maps ``field`` as a value a term matches whole;
        MISSING when one does not map it, or maps it analysed."""
        if status != 200:
            raise SchemaAnswerError(error_text(status, body, "error", "reason"))
        indices = load_json(body, "the mapping")
        if not isinstance(indices, dict) or not indices:
            raise SchemaAnswerError("the mapping names no index")
        types = {}
        for index, described in sorted(indices.items()):
            mappings = described.get("mappings") if isinstance(described, dict) else None
            if not isinstance(mappings, dict):
                raise SchemaAnswerError(f"the mapping of {index} has no mappings")
            found = _field_type(mappings, field.split("."))
            if found is None:
                return FieldReport(
                    Presence.MISSING,
                    f"index {index} does not map {field}: no document holds it, so push-down "
                    "finds nothing; index the tenant into it, or set tenant_key to the field "
                    "that holds it",
                )
            if found in _CONTAINERS:
                return FieldReport(
                    Presence.MISSING,
                    f"index {index} maps {field} as {found}, which holds fields, not a value: "
                    "set tenant_key to the field inside it that holds the tenant",
                )
            if found in _ANALYSED:
                hint = (
                    f" (with dynamic mapping: tenant_key = {field + '.keyword'!r})"
                    if found == "text"
                    else ""
                )
                return FieldReport(
                    Presence.MISSING,
                    f"index {index} maps {field} as {found}: a term query matches any tenant "
                    f"sharing a token; map it as keyword{hint}",
                )
            types[index] = found
        listed = ", ".join(f"{index}: {kind}" for index, kind in types.items())
        return FieldReport(Presence.FOUND, f"{field} is mapped ({listed})")


def _field_type(mappings: dict[str, Any], segments: list[str]) -> str | None:
    """The mapped type of the field at ``segments``, through ``properties`` and multi-field
    ``fields``; None when it is not mapped. A field name may itself hold dots."""
    if not segments:
        found = mappings.get("type", "object")
        return found if isinstance(found, str) else None
    for taken in range(len(segments), 0, -1):
        name = ".".join(segments[:taken])
        for container in ("properties", "fields"):
            children = mappings.get(container)
            child = children.get(name) if isinstance(children, dict) else None
            if isinstance(child, dict):
                found = _field_type(child, segments[taken:])
                if found is not None:
                    return found
    return None
