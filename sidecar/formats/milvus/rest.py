"""Milvus RESTful API v2 responses: search, hybrid search, query and get.

Every v2 endpoint is a POST under ``/v2/vectordb/`` and answers HTTP 200 with
an envelope ``{"code": 0, "data": [...], "cost": ...}``. The four filtered
endpoints return ``data`` as a flat list of rows, one per hit: the primary
key, the requested output fields and, for searches, ``distance``. A search
with several query vectors concatenates their hits and says in ``topks`` how
many rows belong to each query.

The body that goes out is rebuilt from what the gate knows, nothing else:

- ``code`` as it came (0, or 200 of the 2.3 reference);
- ``data``: the kept rows, each with only the chunk id and text fields,
  ``distance``/``score``, and the declared ``hashed_fields`` and
  ``releasable_fields`` (a row is its own free-form object: output fields
  and dynamic fields sit side by side); at most the over-fetched request's
  ``limit`` rows per query vector;
- ``topks`` recounted per query vector (null stays null);
- ``cost`` set to 0 where present: it measures work over every tenant's
  rows, and 0 is what Milvus itself reports when it does not measure.

``recalls``, the storage counters (``scannedRemoteBytes`` ...) and anything
else are dropped: they describe the unfiltered search. A failure (a
non-zero ``code`` with no rows, answered with HTTP 200) is rendered as
``{"code": <code>, "message": "retrieval_gate: the database answered an
error"}``: the code is Milvus' error class (``merr``), which clients use to
tell a retry from a bad request; the message can quote the request's
expression, field names and values, so it never reaches the client (the
body reports it as its ``reported_error``, for the audit record).

The chunk id and text are the row fields ``id_field`` (default ``"id"``, the
primary key of quick-setup collections) and ``text_field``. A substitute's
marker sits next to its fields; its id is a number where the key it
replaces is one (Int64 primary keys).

Shapes follow the Milvus RESTful v2 reference (milvus.io/api-reference/restful)
and the proxy's REST handler (milvus-io/milvus,
internal/distributed/proxy/httpserver/handler_v2.go). Requests are
rewritten by ``rest_request``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.core.hits import Route, RouteKind
from sidecar.formats.base import MalformedBody, ResponseAdapter
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.hits import Field, HitLayout, Hits
from sidecar.formats.milvus import errors as milvus_errors
from sidecar.formats.milvus.rest_request import MilvusRequests
from sidecar.formats.options import DEFAULT_OPTIONS, AdapterOptions

# The primary key field of Milvus' quick-setup collections.
_DEFAULT_ID_FIELD: Final = "id"
# A row's own keys beside its fields: the search's distance (a score in
# some versions). The id and text fields go out as the layout's own.
_ROW_KEYS: Final = frozenset({"distance", "score"})
ERROR_MESSAGE: Final = "retrieval_gate: the database answered an error"

# v2 reports success as 0; the 2.3 reference documents 200.
_SUCCESS: Final = frozenset({0, 200})
_FILTERED: Final = frozenset({"search", "hybrid_search", "advanced_search", "query", "get"})
_C, _R, _W = RouteKind.CONTENT, RouteKind.READ, RouteKind.WRITE
# Every route of the v2 API (after /v2/vectordb/), from the proxy's REST
# handler (handler_v2.go, its route table included), with what it does for
# the gate. Anything that counts, lists or names stored rows or the files
# they came from is CONTENT, as its gRPC twin is (grpc_methods): index
# descriptions count indexed and total rows, import jobs give row counts and
# file names, segment infos count rows, quota metrics measure every
# collection's data, external collection jobs name the source the rows come
# from. A route this table does not know (a newer server's) is CONTENT too.
V2_ROUTES: Final[Mapping[str, RouteKind]] = {
    "collections/list": _R,
    "collections/has": _R,
    "collections/describe": _R,  # schema, load state, index names and metric types
    "collections/get_stats": _C,  # row counts of every tenant
    "collections/get_load_state": _R,
    "collections/get_compaction_state": _R,  # plan counts, no rows
    "collections/create": _W,
    "collections/drop": _W,
    "collections/truncate": _W,
    "collections/rename": _W,
    "collections/load": _W,
    "collections/refresh_load": _W,
    "collections/release": _W,
    "collections/alter_properties": _W,
    "collections/drop_properties": _W,
    "collections/add_function": _W,
    "collections/alter_function": _W,
    "collections/drop_function": _W,
    "collections/add_function_field": _W,
    "collections/drop_function_field": _W,
    "collections/compact": _W,
    "collections/flush": _W,
    "collections/fields/alter_properties": _W,
    "collections/fields/add": _W,
    "collections/fields/drop": _W,
    "collections/struct_fields/add": _W,
    "databases/list": _R,
    "databases/describe": _R,
    "databases/create": _W,
    "databases/drop": _W,
    "databases/alter": _W,
    "databases/alter_properties": _W,
    "databases/drop_properties": _W,
    "entities/insert": _W,
    "entities/upsert": _W,
    "entities/delete": _W,
    "partitions/list": _R,
    "partitions/has": _R,
    "partitions/get_stats": _C,  # row counts
    "partitions/create": _W,
    "partitions/drop": _W,
    "partitions/load": _W,
    "partitions/release": _W,
    "users/list": _R,
    "users/describe": _R,
    "users/create": _W,
    "users/update_password": _W,
    "users/drop": _W,
    "users/grant_role": _W,
    "users/revoke_role": _W,
    "roles/list": _R,
    "roles/describe": _R,
    "roles/create": _W,
    "roles/alter": _W,
    "roles/drop": _W,
    "roles/grant_privilege": _W,
    "roles/revoke_privilege": _W,
    "roles/grant_privilege_v2": _W,
    "roles/revoke_privilege_v2": _W,
    "privilege_groups/list": _R,
    "privilege_groups/create": _W,
    "privilege_groups/drop": _W,
    "privilege_groups/add_privileges_to_group": _W,
    "privilege_groups/remove_privileges_from_group": _W,
    "indexes/list": _R,  # index names only
    "indexes/describe": _C,  # indexedRows, totalRows, pendingRows
    "indexes/create": _W,
    "indexes/drop": _W,
    "indexes/alter_properties": _W,
    "indexes/drop_properties": _W,
    "aliases/list": _R,
    "aliases/describe": _R,
    "aliases/create": _W,
    "aliases/drop": _W,
    "aliases/alter": _W,
    "jobs/import/list": _C,  # every tenant's import jobs, to describe
    "jobs/import/describe": _C,  # imported rows, file names
    "jobs/import/get_progress": _C,  # the same answer as describe
    "jobs/import/create": _W,
    "jobs/import/commit": _W,
    "jobs/import/abort": _W,
    "jobs/snapshot/restore_external": _C,  # snapshots copy whole collections
    "jobs/snapshot/export": _C,
    "jobs/snapshot/describe": _C,
    "jobs/snapshot/list": _C,
    "jobs/external_collection/refresh": _W,
    "jobs/external_collection/describe": _C,  # the external source and its spec
    "jobs/external_collection/list": _C,
    "resource_groups/list": _R,
    "resource_groups/describe": _R,
    "resource_groups/create": _W,
    "resource_groups/drop": _W,
    "resource_groups/alter": _W,
    "resource_groups/transfer_replica": _W,
    "file_resources/list": _R,  # analyzer dictionaries the operator added
    "file_resources/add": _W,
    "file_resources/remove": _W,
    "segments/describe": _C,  # rows per segment
    "quotacenter/describe": _C,  # data sizes and rows per collection
    "common/run_analyzer": _R,  # tokenises the request's own text
}
# The v1 API (after /v1/vector/): GET lists and describes, POST does the rest.
V1_ROUTES: Final[Mapping[str, RouteKind]] = {
    "collections": _R,
    "collections/describe": _R,
    "collections/create": _W,
    "collections/drop": _W,
    "search": _C,  # answered in a shape this adapter does not read
    "query": _C,
    "get": _C,
    "insert": _W,
    "upsert": _W,
    "delete": _W,
    "bulkinsert": _W,
    "bulkinsert/describe": _C,  # imported rows, their ids, file names
    "bulkinsert/list": _C,
}
_INTEGER: Final = re.compile(r"-?[0-9]+")


def _segments(route: Route) -> list[str]:
    # Lower case: a case variant of a route must not be claimed less strictly
    # than the route itself, whatever the router does with it.
    return route.path.removesuffix("/").lower().split("/")


def _typed_like(old: Any, chunk_id: str) -> Any:
    """``chunk_id`` as a number when the value it replaces is one (Int64 keys)."""
    if isinstance(old, int) and not isinstance(old, bool) and _INTEGER.fullmatch(chunk_id):
        return int(chunk_id)
    return chunk_id


@dataclass(eq=False)
class _Rows(HitBody):
    """A response with rows: ``groups`` rows per query vector, in order.

    ``topks`` is how the body said so: a list (recounted), None for a null
    (kept null), or absent. Each group keeps at most the request's limit.
    """

    code: int
    rows: list[Any]
    groups: tuple[int, ...]
    topks: str  # "list", "null" or "absent"
    cost: bool  # the body had a cost

    def _rebuild(self, selection: Selection) -> dict[str, Any]:
        limit = selection.limits[0]
        sent: list[Any] = []
        counts: list[int] = []
        start = 0
        for size in self.groups:
            kept = selection.kept(range(start, start + size))[:limit]
            sent.extend(selection.send(position, self.rows[position]) for position in kept)
            counts.append(len(kept))
            start += size
        # Keys in Milvus' order (Go maps are written sorted).
        document: dict[str, Any] = {"code": self.code}
        if self.cost:
            document["cost"] = 0
        document["data"] = sent
        if self.topks != "absent":
            document["topks"] = counts if self.topks == "list" else None
        return document


@dataclass(eq=False)
class _Error(HitBody):
    """An error answer: no rows; the gate's message in place of Milvus'."""

    code: int

    def _rebuild(self, selection: Selection) -> dict[str, Any]:
        return {"code": self.code, "message": ERROR_MESSAGE}


def _topks(value: Any, rows: int) -> tuple[int, ...]:
    """``topks`` checked against the number of rows it divides."""
    if not isinstance(value, list) or not all(
        isinstance(topk, int) and not isinstance(topk, bool) and topk >= 0 for topk in value
    ):
        raise MalformedBody("'topks' is not a list of counts")
    if sum(value) != rows:
        raise MalformedBody("'topks' does not add up to the rows in 'data'")
    return tuple(value)


class MilvusFormat(ResponseAdapter[str], MilvusRequests):
    """Adapter for the Milvus RESTful API v2: filters responses, rewrites search requests.

    ``id_field`` defaults to ``"id"``: name the collection's primary key
    field, or any output field holding chunk ids. Requests must list both
    fields in ``outputFields`` (queries and gets return all fields by default).
    """

    name = "milvus"

    def __init__(self, options: AdapterOptions = DEFAULT_OPTIONS) -> None:
        """The text, the id (None: the field ``id``) and the released fields (dotted
        paths into JSON fields) are row fields; every other field is dropped, the
        primary key too when it is not ``id_field`` (list it as releasable)."""
        self.text_field = options.text_field
        self.id_field = options.id_field or _DEFAULT_ID_FIELD
        if self.id_field == self.text_field:
            raise ValueError("id_field must differ from text_field")
        self._layout = HitLayout(
            "row",
            Field((self.id_field,), f"field {self.id_field!r}"),
            Field((self.text_field,), f"field {self.text_field!r}"),
            (),
            _typed_like,
            _ROW_KEYS,
            options.fields,
        )

    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does in Milvus' REST APIs (``V2_ROUTES``, ``V1_ROUTES``); None for
        other paths.

        FILTERED: POST ``/v2/vectordb/entities/`` search, hybrid_search
        (advanced_search, its old name), query and get; those paths with other
        methods are CONTENT. Every other route is as its table says, and a
        route under ``/v2/vectordb/`` or ``/v1/vector/`` that the tables do not
        know is CONTENT: it may return stored rows or count them.
        """
        match _segments(route):
            case ["", "v2", "vectordb", "entities", action] if action in _FILTERED:
                return RouteKind.FILTERED if route.method.upper() == "POST" else RouteKind.CONTENT
            case ["", "v2", "vectordb", _, *_] as segments:
                return V2_ROUTES.get("/".join(segments[3:]), RouteKind.CONTENT)
            case ["", "v1", "vector", _, *_] as segments:
                return V1_ROUTES.get("/".join(segments[3:]), RouteKind.CONTENT)
        return None

    def missing_field(self, error_text: str) -> str | None:
        """The field a Milvus error names as missing from the schema (``errors``)."""
        return milvus_errors.missing_field(error_text)

    def _shape(self, route: Route) -> str | None:
        """The action of a FILTERED route (search, query ...); None for others."""
        if self.route_kind(route) is not RouteKind.FILTERED:
            return None
        return _segments(route)[-1]

    def _read(self, document: dict[str, Any], shape: str) -> HitBody:
        """An error answer (non-zero ``code``, no rows) parses to a body without
        candidates that renders as the gate's error."""
        code = document.get("code")
        if isinstance(code, bool) or not isinstance(code, int):
            raise MalformedBody("no integer 'code' in body")
        rows = document.get("data")
        hits = Hits(self._layout)
        if code != 0 and rows in (None, [], {}):
            reported = milvus_errors.reported(code, document.get("message"))
            return _Error(hits, code, sub_results=1, reported_error=reported)
        if code not in _SUCCESS:
            raise MalformedBody("an error code in a body with rows")
        if "aggTopks" in document:
            # Search aggregation nests hits in buckets: a shape not read here.
            raise MalformedBody("search aggregation results are not supported")
        if not isinstance(rows, list):
            raise MalformedBody("'data' is not a list of rows")
        topks = document.get("topks", _ABSENT)
        if topks is _ABSENT or topks is None:
            # A null topks (Go's nil slice) says nothing to keep consistent:
            # the rows are one group.
            groups: tuple[int, ...] = (len(rows),)
        else:
            groups = _topks(topks, len(rows))
        hits.add_list(rows, "'data' is not a list of rows")
        return _Rows(
            hits,
            code,
            rows,
            groups,
            "absent" if topks is _ABSENT else "null" if topks is None else "list",
            "cost" in document,
            sub_results=1,
        )


_ABSENT: Final = object()
