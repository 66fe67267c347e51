"""Which database's schema can say whether a collection holds the tenant field.

By database name, as ``retrieval-gate check --database`` takes it: a probe for
those that can tell, and the reason for those that cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sidecar.formats.elasticsearch.schema import ElasticsearchSchemaProbe
from sidecar.formats.milvus.schema import MilvusSchemaProbe
from sidecar.formats.qdrant.schema import QdrantSchemaProbe
from sidecar.formats.schema_probe import SchemaProbe
from sidecar.formats.weaviate.schema import WeaviateSchemaProbe

SCHEMA_PROBES: Final[Mapping[str, SchemaProbe]] = {
    probe.database: probe
    for probe in (
        QdrantSchemaProbe(),
        MilvusSchemaProbe(),
        WeaviateSchemaProbe(),
        ElasticsearchSchemaProbe(),
    )
}
NO_SCHEMA: Final[Mapping[str, str]] = {
    "chroma": "Chroma keeps no schema of record metadata",
    "pinecone": "Pinecone keeps no schema of vector metadata",
}
DATABASES: Final = (*SCHEMA_PROBES, *NO_SCHEMA)
