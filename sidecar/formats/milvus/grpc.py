"""Milvus gRPC responses: ``Search``, ``HybridSearch`` and ``Query`` of ``MilvusService``.

pymilvus speaks only gRPC: ``search`` calls ``/milvus.proto.milvus.MilvusService/
Search``, ``hybrid_search`` ``HybridSearch``, ``query`` and ``get`` ``Query``.
The replies hold rows column by column: ``grpc_replies`` reads and
rebuilds them, ``grpc_fields`` their rows' fields, and
``grpc_columns`` one column.

The chunk id is the primary key (``ids`` of a search, the column
``primary_field_name`` names in a query) as a decimal string for int64 keys,
or the field ``id_field`` when set; the text is the field ``text_field``. A
field is a column of that name, or else a key of the dynamic field's object.

Replies are rebuilt from known fields only. Rows that go out keep, in every
column that goes out, the same places, so every column stays aligned with
``ids``, ``scores`` and the rest; ``topks`` are recounted per query vector, and
each query vector keeps at most the app's limit when the request was
over-fetched (``top_k`` says that limit). The columns that go out are the id
and text fields (the primary key column when it is the id) and the declared
``hashed_fields`` and ``releasable_fields`` (a dotted path into a JSON field,
or into the dynamic field, releases only what it names); group-by values and
highlights go out for fields released whole. Everything else is dropped: other
columns, ``recalls`` and ``all_search_count`` (they describe the unfiltered
search), the status' ``extra_info`` (its cost and scanned bytes too), and any
field the gate's proto does not declare. ``output_fields`` lists what went
out. A search iterator's page (``search_iterator_v2_results``) keeps its
``token`` as the request named it (the server's new one on a first page), and
its ``last_bound``, where the next page starts, is rebuilt from what goes out,
as Milvus computes it from what it returns: the score of the last row that
goes out, so the next page re-reads (and the gate refuses again) rejected rows
past it rather than learning their scores; when no row goes out, the bound
the page started from (the request's), or none on a first page, and the
empty page ends the iteration (pymilvus stops at an empty page), possibly
before the caller's last row. A reply with search aggregation
buckets (``agg_buckets``) is refused: the buckets summarise every hit. So is
one whose columns, ids, scores and per-row lists do not hold one value per
row, or with two columns of one field (a client could read either).

A substitute takes the row's text and id where they are kept (the primary key
in ``ids`` and its column, or the ``id_field`` column) and its highlights go
empty; its declared fields are made null where the column can hold a null
(or removed from a JSON object), and are kept where it cannot. A substitute
is not marked: a row has no free-form object of its own to carry the marker.

Milvus reports errors inside an OK gRPC reply (``status.code`` or
``status.error_code`` not 0): such a reply goes out with Milvus' codes and
``retriable`` flag (clients tell a retry from a bad request by them) but the
gate's own ``reason`` (Milvus' can quote the request's expression and
values) and nothing else (the body reports Milvus' as its ``reported_error``,
for the audit record); an error status in a reply with rows is refused. A
reply from which nothing was removed, with no field the gate does not know,
goes out byte for byte.

Every method of ``MilvusService`` is classified (``grpc_methods``); a
method the gate does not know is CONTENT, and paths outside the service are
not claimed. Requests are rewritten by ``grpc_request``.
"""

from __future__ import annotations

from typing import Any, Final

from sidecar.formats import grpc_messages
from sidecar.formats.grpc_adapter import GrpcAdapter
from sidecar.formats.hits import Field, HitLayout, Hits
from sidecar.formats.milvus import errors as milvus_errors
from sidecar.formats.milvus.grpc_methods import KINDS
from sidecar.formats.milvus.grpc_replies import (
    QUERY_RESULTS,
    SEARCH_RESULTS,
    ColumnarReply,
    read_query,
    read_search,
)
from sidecar.formats.milvus.grpc_request import (
    HYBRID_SEARCH,
    QUERY,
    SEARCH,
    SERVICE,
    IteratorEcho,
    MilvusGrpcRequests,
)
from sidecar.formats.options import DEFAULT_OPTIONS, AdapterOptions

_REPLIES: Final = {SEARCH: SEARCH_RESULTS, HYBRID_SEARCH: SEARCH_RESULTS, QUERY: QUERY_RESULTS}


class MilvusGrpcFormat(GrpcAdapter, MilvusGrpcRequests):
    """Adapter for Milvus' gRPC API (``MilvusService``): filters ``Search``,
    ``HybridSearch`` and ``Query`` replies, rewrites their requests."""

    name = "milvus_grpc"
    service = SERVICE
    kinds = KINDS
    replies = _REPLIES

    def __init__(self, options: AdapterOptions = DEFAULT_OPTIONS) -> None:
        """``id_field`` None: the chunk id is the primary key. The released fields are
        dotted paths into JSON fields and the dynamic field; every other field is
        dropped."""
        self.text_field = options.text_field
        self.id_field = options.distinct_id_field()
        self._options = options
        # Candidates are read column by column; the layout is for the shared
        # Hits collector (hashed fields) and says what a problem calls a row.
        self._layout = HitLayout(
            "row",
            Field((self.id_field or "id",), "primary key"),
            Field((self.text_field,), f"field {self.text_field!r}"),
            None,
            fields=options.fields,
        )

    def _read(self, document: tuple[bytes, Any], shape: str) -> ColumnarReply:
        return self._read_echoed(document, shape, None)

    def _read_echoed(self, document: tuple[bytes, Any], shape: str, echo: object) -> ColumnarReply:
        body, reply = document
        hits = Hits(self._layout)
        if shape == QUERY:
            rebuild = read_query(reply, hits, self._options)
        else:
            iteration = echo if isinstance(echo, IteratorEcho) else None
            rebuild = read_search(reply, hits, self._options, iteration)
        unknown = grpc_messages.has_unknown_fields(reply)
        status = reply.status
        reported = None
        if status.code != 0 or status.error_code != 0:
            # The error class where the server sets one, else the legacy code.
            code = status.code or status.error_code
            reported = milvus_errors.reported(code, status.reason)
        return ColumnarReply(
            hits, body, reply, unknown, rebuild, sub_results=1, reported_error=reported
        )

    def missing_field(self, error_text: str) -> str | None:
        """The field a Milvus error names as missing from the schema (``errors``)."""
        return milvus_errors.missing_field(error_text)
