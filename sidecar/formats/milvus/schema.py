"""Whether a Milvus collection has the tenant field: ``DescribeCollection`` over gRPC.

Real Milvus serves gRPC and REST on one port, Milvus Lite gRPC only, so the
question goes over gRPC. Push-down writes ``<field> == "<tenant>"``: the field
must be declared, and a string (``VarChar``); a field that is not declared
can still be a key of the dynamic field, whose keys no schema lists.
"""

from __future__ import annotations

from typing import Final

from google.protobuf.message import DecodeError

from sidecar.formats.grpc_messages import message_class
from sidecar.formats.milvus.grpc_request import SEARCH, SERVICE
from sidecar.formats.schema_probe import (
    FieldReport,
    Presence,
    SchemaAnswerError,
    SchemaRequest,
    shorten,
)

DESCRIBE_COLLECTION: Final = f"/{SERVICE}/DescribeCollection"
_REQUEST: Final = "milvus.proto.milvus.DescribeCollectionRequest"
_RESPONSE: Final = "milvus.proto.milvus.DescribeCollectionResponse"
# The types an equality with a quoted string matches exactly.
_STRING_TYPES: Final = frozenset({"VarChar", "String"})


class MilvusSchemaProbe:
    """Reads the tenant field from a collection's description (``DescribeCollection``)."""

    database = "milvus"

    def search_paths(self, collection: str) -> tuple[str, ...]:
        """The REST v2 search and the gRPC ``Search`` (neither path names the collection)."""
        return ("/v2/vectordb/entities/search", f"/{SERVICE}/{SEARCH}")

    def request(self, collection: str) -> SchemaRequest:
        """A ``DescribeCollectionRequest`` for ``collection`` in the default database."""
        message = message_class(_REQUEST)(collection_name=collection)
        return SchemaRequest("POST", DESCRIBE_COLLECTION, message.SerializeToString(), grpc=True)

    def read(self, status: int, body: bytes, field: str) -> FieldReport:
        """FOUND for a declared VarChar field; MISSING when it is not declared (and the
        collection has no dynamic field) or not a string; UNKNOWN otherwise."""
        try:
            reply = message_class(_RESPONSE).FromString(body)
        except DecodeError:
            raise SchemaAnswerError("not a DescribeCollectionResponse") from None
        # Milvus reports errors inside an OK reply: a collection that does not exist.
        if reply.status.code != 0 or reply.status.error_code != 0:
            raise SchemaAnswerError(shorten(reply.status.reason or "an error without a reason"))
        fields = {f.name: f for f in reply.schema.fields if not f.is_dynamic}
        declared = fields.get(field)
        if declared is None:
            if reply.schema.enable_dynamic_field:
                return FieldReport(
                    Presence.UNKNOWN,
                    f"{field} is not declared, and the dynamic field's keys are in no schema: "
                    f"declare {field} as a VarChar field to have it checked",
                )
            names = ", ".join(fields) or "none"
            return FieldReport(
                Presence.MISSING,
                f"no field {field} (fields: {names}) and no dynamic field: add it, or set the "
                "tenant_key of the route (filter.tenant_key) to the field that holds the tenant",
            )
        type_name = _type_name(declared.data_type)
        if type_name == "JSON":
            return FieldReport(
                Presence.UNKNOWN, f"{field} is a JSON field: its values' type is in no schema"
            )
        if type_name not in _STRING_TYPES:
            return FieldReport(
                Presence.MISSING,
                f"{field} is {type_name}; push-down compares it with a quoted string: "
                "declare it VarChar",
            )
        return FieldReport(Presence.FOUND, f"{field} is {type_name}")


def _type_name(number: int) -> str:
    enum = (
        message_class("milvus.proto.schema.FieldSchema")
        .DESCRIPTOR.fields_by_name["data_type"]
        .enum_type
    )
    value = enum.values_by_number.get(number)
    return f"type {number}" if value is None else str(value.name)
