"""Milvus gRPC responses: ``Search``, ``HybridSearch`` and ``Query`` of ``MilvusService``.

pymilvus speaks only gRPC: ``search`` calls ``/milvus.proto.milvus.MilvusService/
Search``, ``hybrid_search`` ``HybridSearch``, ``query`` and ``get`` ``Query``.
The replies hold rows column by column:

- ``SearchResults.results`` (``schema.SearchResultData``): the hits of every
  query vector one after the other, ``topks`` saying how many belong to each;
  per hit ``ids`` (int64 or string primary keys), ``scores``, ``distances``,
  ``element_indices``; per output field a column in ``fields_data``
  (``milvus_grpc_columns``: scalar, vector, nullable, struct columns, and the
  dynamic field ``$meta``, a JSON object per row); group-by values
  (``group_by_field_value``, ``group_by_field_values``), per-field
  ``highlight_results``, an iterator's ``search_iterator_v2_results``.
- ``QueryResults``: ``fields_data`` columns (the primary key always among
  them), ``element_indices`` per row.

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
out. An iterator's ``last_bound`` becomes the score of the last row that goes
out when rows were removed and some went out (the next page starts there,
re-reading rejected rows rather than revealing their scores). A reply with search aggregation
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
values) and nothing else; an error status in a reply with rows is refused. A
reply from which nothing was removed, with no field the gate does not know,
goes out byte for byte.

Every method of ``MilvusService`` (pymilvus 3.0.2's proto) is classified in
``KINDS``: FILTERED the three above; READ what returns no chunk content
(schemas, names, states, health, the caller's own text run through an
analyzer); CONTENT what returns data the gate cannot filter or counts every
tenant's rows (collection, partition, namespace and index statistics, segment
infos, import states with their row ids, distances between stored vectors,
metrics, snapshots, which copy or export whole collections, RBAC backups,
replication settings with other clusters' tokens, WAL dumps, ``Dummy``, which
runs a query given as text); WRITE the rest. A method the gate does not know
is CONTENT. Paths outside the service are not claimed. Requests are
rewritten by ``milvus_grpc_request``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sidecar.core.hits import Replacement, Route, RouteKind
from sidecar.formats import grpc_adapter, grpc_messages
from sidecar.formats.base import (
    MalformedBody,
    ResponseAdapter,
    id_field_option,
    text_field_option,
)
from sidecar.formats.body import Selection
from sidecar.formats.hits import (
    Field,
    FieldPath,
    Found,
    HitLayout,
    Hits,
    ReleasedFields,
    usable_id,
    usable_text,
)
from sidecar.formats.milvus_grpc_columns import Column, place
from sidecar.formats.milvus_grpc_request import (
    HYBRID_SEARCH,
    QUERY,
    SEARCH,
    MilvusGrpcRequests,
    method,
)

ERROR_MESSAGE: Final = "retrieval_gate: the database answered an error"

_F, _R, _C, _W = RouteKind.FILTERED, RouteKind.READ, RouteKind.CONTENT, RouteKind.WRITE
KINDS: Final[Mapping[str, RouteKind]] = {
    # Collections.
    "CreateCollection": _W,
    "DropCollection": _W,
    "HasCollection": _R,
    "LoadCollection": _W,
    "ReleaseCollection": _W,
    "DescribeCollection": _R,
    "BatchDescribeCollection": _R,
    "GetCollectionStatistics": _C,  # row counts of every tenant
    "ShowCollections": _R,
    "AlterCollection": _W,
    "AlterCollectionField": _W,
    "AddCollectionFunction": _W,
    "AlterCollectionFunction": _W,
    "DropCollectionFunction": _W,
    "TruncateCollection": _W,
    "AddCollectionField": _W,
    "AddCollectionStructField": _W,
    "AlterCollectionSchema": _W,
    "RenameCollection": _W,
    "RefreshExternalCollection": _W,
    "GetRefreshExternalCollectionProgress": _R,
    "ListRefreshExternalCollectionJobs": _R,
    "BatchUpdateManifest": _W,
    # Partitions.
    "CreatePartition": _W,
    "DropPartition": _W,
    "HasPartition": _R,
    "LoadPartitions": _W,
    "ReleasePartitions": _W,
    "GetPartitionStatistics": _C,  # row counts
    "ShowPartitions": _R,
    "Prewarm": _W,
    "DescribePrewarmTask": _R,
    # Namespaces: names (one per tenant, often) with entity counts.
    "CreateNamespace": _W,
    "DescribeNamespace": _C,
    "ListNamespaces": _C,
    "DropNamespace": _W,
    "HasNamespace": _R,
    "GetNamespaceStats": _C,
    # Loading.
    "GetLoadingProgress": _R,
    "GetLoadState": _R,
    # Aliases.
    "CreateAlias": _W,
    "DropAlias": _W,
    "AlterAlias": _W,
    "DescribeAlias": _R,
    "ListAliases": _R,
    # Indexes: descriptions and progress count indexed and total rows.
    "CreateIndex": _W,
    "AlterIndex": _W,
    "DescribeIndex": _C,
    "GetIndexStatistics": _C,
    "GetIndexState": _R,
    "GetIndexBuildProgress": _C,
    "DropIndex": _W,
    # Entities.
    "Insert": _W,
    "Delete": _W,
    "Upsert": _W,
    "Search": _F,
    "HybridSearch": _F,
    "Query": _F,
    "CalcDistance": _C,  # distances between stored vectors, by id
    # Flush, segments, compaction, import.
    "Flush": _W,
    "FlushAll": _W,
    "GetFlushState": _R,
    "GetFlushAllState": _R,
    "GetPersistentSegmentInfo": _C,  # rows per segment
    "GetQuerySegmentInfo": _C,  # rows per segment
    "GetReplicas": _R,
    "LoadBalance": _W,
    "GetCompactionState": _R,
    "ManualCompaction": _W,
    "GetCompactionStateWithPlans": _R,
    "Import": _W,
    "GetImportState": _C,  # row counts and the ids of imported rows
    "ListImportTasks": _C,
    "ListIndexedSegment": _R,
    "DescribeSegmentIndexData": _C,  # index data (vectors)
    # Cluster, health, connection.
    "Dummy": _C,  # runs a query given as text, past the gate
    "RegisterLink": _R,
    "GetMetrics": _C,  # system metrics, which count rows
    "GetComponentStates": _R,
    "GetVersion": _R,
    "CheckHealth": _R,
    "Connect": _R,
    "AllocTimestamp": _R,
    "RunAnalyzer": _R,  # the caller's own text, tokenised
    "ComputePhraseMatchSlop": _R,  # the caller's own texts
    # Users, roles, privileges, RBAC, row policies.
    "CreateCredential": _W,
    "UpdateCredential": _W,
    "DeleteCredential": _W,
    "ListCredUsers": _R,
    "CreateRole": _W,
    "AlterRole": _W,
    "DropRole": _W,
    "OperateUserRole": _W,
    "SelectRole": _R,
    "SelectUser": _R,
    "OperatePrivilege": _W,
    "OperatePrivilegeV2": _W,
    "SelectGrant": _R,
    "BackupRBAC": _C,  # users with their passwords
    "RestoreRBAC": _W,
    "CreatePrivilegeGroup": _W,
    "DropPrivilegeGroup": _W,
    "ListPrivilegeGroups": _R,
    "OperatePrivilegeGroup": _W,
    "AddUserTags": _W,
    "DeleteUserTags": _W,
    "GetUserTags": _R,
    "ListUsersWithTag": _R,
    "CreateRowPolicy": _W,
    "DropRowPolicy": _W,
    "ListRowPolicies": _R,
    # Resource groups.
    "CreateResourceGroup": _W,
    "DropResourceGroup": _W,
    "UpdateResourceGroups": _W,
    "TransferNode": _W,
    "TransferReplica": _W,
    "ListResourceGroups": _R,
    "DescribeResourceGroup": _R,
    # Databases.
    "CreateDatabase": _W,
    "DropDatabase": _W,
    "ListDatabases": _R,
    "AlterDatabase": _W,
    "DescribeDatabase": _R,
    # Files.
    "AddFileResource": _W,
    "RemoveFileResource": _W,
    "ListFileResources": _R,
    # Replication: messages and streams carry rows; the configuration holds
    # other clusters' tokens.
    "ReplicateMessage": _W,
    "UpdateReplicateConfiguration": _W,
    "GetReplicateConfiguration": _C,
    "GetReplicateInfo": _R,
    "CreateReplicateStream": _W,
    "DumpMessages": _C,  # the write-ahead log: every inserted row
    # Snapshots copy, restore or export whole collections, every tenant's rows.
    "CreateSnapshot": _C,
    "DropSnapshot": _C,
    "ListSnapshots": _C,
    "DescribeSnapshot": _C,
    "RestoreSnapshot": _C,
    "RestoreExternalSnapshot": _C,
    "ExportSnapshot": _C,
    "GetExportSnapshotState": _C,
    "GetRestoreSnapshotState": _C,
    "ListRestoreSnapshotJobs": _C,
    "PinSnapshotData": _C,
    "UnpinSnapshotData": _C,
}
_REPLIES: Final[Mapping[str, str]] = {
    SEARCH: "milvus.proto.milvus.SearchResults",
    HYBRID_SEARCH: "milvus.proto.milvus.SearchResults",
    QUERY: "milvus.proto.milvus.QueryResults",
}
_ABSENT: Final = object()


def _message(name: str) -> Any:
    return grpc_messages.message_class(name)


@dataclass(frozen=True, slots=True)
class _Options:
    """What a reply releases: the id and text fields and the declared paths."""

    text_field: str
    id_field: str | None
    fields: ReleasedFields


class _Fields:
    """The ``fields_data`` of a reply: how each row's fields are read, and which
    columns go out (whole, or JSON documents projected onto some paths)."""

    def __init__(self, fields_data: Sequence[Any], options: _Options, primary: str) -> None:
        self._options = options
        # The id as a field: ``id_field``, or the primary key column (a query's id).
        self.id_name = options.id_field or primary
        paths: list[FieldPath] = [(options.text_field,)]
        if self.id_name:
            paths.append((self.id_name,))
        paths += [*options.fields.hashed, *options.fields.releasable]
        self._declared = {*options.fields.hashed, *options.fields.releasable}
        self.whole = {path[0] for path in paths if len(path) == 1}
        dynamic = [data for data in fields_data if data.is_dynamic]
        if len(dynamic) > 1:
            raise MalformedBody("a reply has two dynamic fields")
        self._named = {data.field_name: data for data in fields_data if not data.is_dynamic}
        if len(self._named) + len(dynamic) != len(fields_data):
            # Which of two same-named columns would a client read?
            raise MalformedBody("two result columns hold the same field")
        self._columns: dict[str, Column] = {}
        self.dynamic: Column | None = None
        self._dynamic_paths: tuple[FieldPath, ...] = ()
        # (column, paths into its JSON documents; None: the whole column), in reply order.
        self.released: list[tuple[Column, tuple[FieldPath, ...] | None]] = []
        for data in fields_data:
            if data.is_dynamic:
                inner = _outermost(tuple(path for path in paths if path[0] not in self._named))
                if inner:
                    self.dynamic = Column(data)
                    if not self.dynamic.is_json:
                        raise MalformedBody("the dynamic field is not a JSON column")
                    self._dynamic_paths = inner
                    self.released.append((self.dynamic, inner))
                continue
            name = data.field_name
            subpaths = tuple(path[1:] for path in paths if path[0] == name)
            if not subpaths:
                continue
            column = self._column(name)
            if () in subpaths:
                self.released.append((column, None))
            elif column.is_json:
                self.released.append((column, _outermost(subpaths)))
        self._documents: dict[int, Any] = {}

    def _column(self, name: str) -> Column:
        column = self._columns.get(name)
        if column is None:
            column = self._columns[name] = Column(self._named[name])
        return column

    def columns(self) -> list[Column]:
        """Every column read or released, to check that they hold one value per row."""
        used = [column for column, _ in self.released]
        return used + [c for c in self._columns.values() if all(c is not u for u in used)]

    def names(self) -> set[str]:
        """The fields that go out (columns, and keys of the dynamic field's object)."""
        out = {column.name for column, _ in self.released if not column.is_dynamic}
        out.update(path[0] for path in self._dynamic_paths)
        return out

    def get(self, row: int, name: str, label: str) -> tuple[Any, str | None]:
        """``(value, None)`` of field ``name`` in ``row``: ``_ABSENT`` when the reply
        does not hold the field, None when it is null; or ``(None, problem)``."""
        try:
            if name in self._named:
                return self._column(name).value(row), None
            if self.dynamic is None:
                return _ABSENT, None
            document = self._document(row)
        except ValueError:
            return None, f"{label} has no JSON form"
        if document is None:
            return _ABSENT, None
        if not isinstance(document, dict):
            return None, "the dynamic field is not a JSON object"
        return document.get(name, _ABSENT), None

    def _document(self, row: int) -> Any:
        if row not in self._documents:
            assert self.dynamic is not None
            self._documents[row] = self.dynamic.value(row)
        return self._documents[row]

    def read(self, hits: Hits, row: int, chunk_id: Found | None) -> None:
        """Register ``row`` as the next candidate; ``chunk_id`` when the reply holds it
        beside the fields (a search's ``ids``)."""
        options = self._options
        if chunk_id is None:
            if not self.id_name:
                chunk_id = (None, "the reply names no primary key field")
            else:
                label = f"field {self.id_name!r}"
                value, problem = self.get(row, self.id_name, label)
                chunk_id = (None, problem) if problem else usable_id(_none(value), label)
        label = f"field {options.text_field!r}"
        value, problem = self.get(row, options.text_field, label)
        text = (None, problem) if problem else usable_text(_none(value), label)
        hashed: Found = (None, None)
        if options.fields.hashed:
            holder: dict[str, Any] = {}
            for key in dict.fromkeys(path[0] for path in options.fields.hashed):
                value, problem = self.get(row, key, f"field {key!r}")
                if problem:
                    hashed = (None, "hashed fields have no canonical form")
                    break
                if value is not _ABSENT:
                    # A null is a value, as the REST API's JSON writes it.
                    holder[key] = value
            else:
                hashed = hits.hashed(holder)
        hits.add_found(chunk_id, text, hashed)

    def cut(self, rows: Sequence[int], replaced: Mapping[int, Replacement]) -> list[Any]:
        """The released columns with only ``rows``; ``replaced`` maps an index of
        ``rows`` to the substitute that takes that row's place."""
        options = self._options
        by_row = {rows[index]: replacement for index, replacement in replaced.items()}
        out = []
        for column, paths in self.released:
            if paths is None:
                role = column.name
                own = role in (options.text_field, self.id_name)
                # A substitute's declared fields describe the document it replaced.
                declared = not own and (role,) in self._declared and column.nullable
                cut = column.cut(rows, set(by_row) if declared else ())
                for index, replacement in replaced.items():
                    if role == options.text_field:
                        place(cut, index, replacement.text)
                    elif role == self.id_name:
                        place(cut, index, replacement.chunk_id)
                out.append(cut)
            else:
                out.append(column.cut(rows, transform=self._projection(column, paths, by_row)))
        return out

    def _projection(
        self,
        column: Column,
        paths: tuple[FieldPath, ...],
        replaced: Mapping[int, Replacement],
    ) -> Callable[[int, Any], Any]:
        """What one JSON document of ``column`` becomes: projected onto ``paths``, and
        for a substitute without its declared fields, with its text and id."""
        options = self._options
        own = {
            (options.text_field,): "text",
            **({(options.id_field,): "id"} if options.id_field and column.is_dynamic else {}),
        }
        prefix = () if column.is_dynamic else (column.name,)
        declared = {path for path in self._declared if path[: len(prefix)] == prefix}

        def transform(row: int, document: Any) -> Any:
            projected = _project(document, paths)
            replacement = replaced.get(row)
            if replacement is None or not isinstance(projected, dict):
                return projected
            for path in declared:
                projected = _without(projected, path[len(prefix) :])
            if column.is_dynamic:
                for path, what in own.items():
                    if path in paths:
                        projected[path[0]] = (
                            replacement.text if what == "text" else replacement.chunk_id
                        )
            return projected

        return transform


def _none(value: Any) -> Any:
    return None if value is _ABSENT else value


def _outermost(paths: tuple[FieldPath, ...]) -> tuple[FieldPath, ...]:
    """``paths`` without those inside another one (which goes out whole with it)."""
    return tuple(
        path
        for path in dict.fromkeys(paths)
        if not any(other != path and path[: len(other)] == other for other in paths)
    )


def _project(document: Any, paths: tuple[FieldPath, ...]) -> Any:
    """The values of the JSON object ``document`` at ``paths``, nested as they were."""
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = document
        for key in path:
            value = value.get(key, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is _ABSENT:
            continue
        target = out
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value
    return out


def _without(document: dict[str, Any], path: FieldPath) -> dict[str, Any]:
    first, *rest = path
    if first not in document:
        return document
    if not rest:
        return {key: value for key, value in document.items() if key != first}
    inner = document[first]
    if not isinstance(inner, dict):
        return document
    return {**document, first: _without(inner, tuple(rest))}


def _failed(status: Any) -> bool:
    return bool(status.code != 0 or status.error_code != 0)


def _ok_status(status: Any) -> Any:
    """A success status without its extra info (cost and scanned bytes of the
    unfiltered search) or text."""
    return _message("milvus.proto.common.Status")(error_code=status.error_code, code=status.code)


def _error_status(status: Any) -> Any:
    """An error status with Milvus' codes and the gate's text."""
    return _message("milvus.proto.common.Status")(
        error_code=status.error_code,
        code=status.code,
        retriable=status.retriable,
        reason=ERROR_MESSAGE,
    )


def _counted(values: Sequence[Any], rows: int, what: str) -> None:
    if len(values) not in (0, rows):
        raise MalformedBody(f"{what} does not hold one value per row")


def _columns_of(rows: int, columns: Sequence[Column]) -> None:
    for column in columns:
        if column.rows != rows:
            raise MalformedBody("a result column does not hold one value per row")


@dataclass(eq=False)
class _Rows(grpc_adapter.RebuiltReply):
    """A parsed reply, rebuilt column by column."""

    def _substituted(self, hit: Any, replacement: Replacement) -> Any:
        # ``send`` only says which substitute takes a row; the columns take it in.
        return replacement


def _kept(
    selection: Selection, groups: Sequence[int]
) -> tuple[list[int], list[int], dict[int, Replacement]]:
    """The rows that go out, how many per group (query vector), and the substitutes
    by index into those rows."""
    limit = selection.limits[0]
    rows: list[int] = []
    counts: list[int] = []
    replaced: dict[int, Replacement] = {}
    start = 0
    for size in groups:
        kept = selection.kept(range(start, start + size))[:limit]
        for row in kept:
            replacement = selection.send(row, None)
            if replacement is not None:
                replaced[len(rows)] = replacement
            rows.append(row)
        counts.append(len(kept))
        start += size
    return rows, counts, replaced


def _error(reply: Any, reply_name: str) -> Callable[[Selection], Any]:
    def rebuild(selection: Selection) -> Any:
        return _message(reply_name)(status=_error_status(reply.status))

    return rebuild


def _search(reply: Any, hits: Hits, options: _Options) -> Callable[[Selection], Any]:
    """``SearchResults``: check the rows, register them, return the rebuild."""
    results = reply.results
    id_kind = results.ids.WhichOneof("id_field")
    ids = list(getattr(results.ids, id_kind).data) if id_kind else []
    rows = len(ids)
    topks = tuple(results.topks)
    if _failed(reply.status):
        if rows or any(topks):
            raise MalformedBody("an error status in a reply with rows")
        return _error(reply, _REPLIES[SEARCH])
    if len(results.agg_buckets) or len(results.agg_topks):
        # Buckets summarise every hit: what is left could not be told apart.
        raise MalformedBody("search aggregation results are not supported")
    if any(topk < 0 for topk in topks) or sum(topks) != rows:
        raise MalformedBody("'topks' does not add up to the rows in 'ids'")
    if len(results.scores) != rows:
        raise MalformedBody("'scores' does not hold one value per row")
    _counted(results.distances, rows, "'distances'")
    _counted(results.element_indices.data, rows, "'element_indices'")
    fields = _Fields(results.fields_data, options, results.primary_field_name)
    # Group-by values and highlights go out for the fields released whole.
    group: Column | None = None
    if (
        results.HasField("group_by_field_value")
        and results.group_by_field_value.field_name in fields.whole
    ):
        group = Column(results.group_by_field_value)
    groups = [
        Column(data) for data in results.group_by_field_values if data.field_name in fields.whole
    ]
    highlights = [h for h in results.highlight_results if h.field_name in fields.whole]
    for highlight in highlights:
        if len(highlight.datas) != rows:
            raise MalformedBody("a highlight does not hold one value per row")
    _columns_of(rows, [*fields.columns(), *groups, *([group] if group else [])])
    for row, key in enumerate(ids):
        found = usable_id(key, "primary key") if options.id_field is None else None
        fields.read(hits, row, found)
    names = fields.names()
    empty_highlight = _message("milvus.proto.common.HighlightData")

    def rebuild(selection: Selection) -> Any:
        kept, counts, replaced = _kept(selection, topks or (rows,))
        limit = selection.limits[0]
        out = _message("milvus.proto.schema.SearchResultData")(
            num_queries=results.num_queries,
            top_k=results.top_k if limit is None else min(results.top_k, limit),
            topks=counts if topks else [],
            output_fields=[name for name in results.output_fields if name in names],
            primary_field_name=results.primary_field_name,
        )
        out.fields_data.extend(fields.cut(kept, replaced))
        out.scores.extend(results.scores[row] for row in kept)
        if len(results.distances):
            out.distances.extend(results.distances[row] for row in kept)
        if id_kind is not None:
            target = getattr(out.ids, id_kind)
            target.SetInParent()
            target.data.extend(ids[row] for row in kept)
            if options.id_field is None:
                for index, replacement in replaced.items():
                    target.data[index] = _key(id_kind, replacement.chunk_id)
        if len(results.element_indices.data):
            out.element_indices.data.extend(results.element_indices.data[row] for row in kept)
        if group is not None:
            out.group_by_field_value.CopyFrom(group.cut(kept))
        out.group_by_field_values.extend(column.cut(kept) for column in groups)
        for highlight in highlights:
            sent = out.highlight_results.add(field_name=highlight.field_name)
            for index, row in enumerate(kept):
                sent.datas.append(empty_highlight() if index in replaced else highlight.datas[row])
        if results.HasField("search_iterator_v2_results"):
            iterator = results.search_iterator_v2_results
            bound = iterator.last_bound
            if kept and len(kept) < rows:
                bound = results.scores[kept[-1]]
            out.search_iterator_v2_results.token = iterator.token
            out.search_iterator_v2_results.last_bound = bound
        sent_reply = _message(_REPLIES[SEARCH])(
            status=_ok_status(reply.status),
            collection_name=reply.collection_name,
            session_ts=reply.session_ts,
        )
        if reply.HasField("results"):
            sent_reply.results.CopyFrom(out)
        return sent_reply

    return rebuild


def _key(kind: str, chunk_id: str) -> Any:
    """A substitute's primary key, as the reply's keys are (int64 or string)."""
    if kind == "str_id":
        return chunk_id
    if chunk_id.isascii() and chunk_id.lstrip("-").isdigit():
        value = int(chunk_id)
        if -(2**63) <= value < 2**63:
            return value
    raise MalformedBody("a replacement id is not an integer, as the primary keys are")


def _query(reply: Any, hits: Hits, options: _Options) -> Callable[[Selection], Any]:
    """``QueryResults``: check the rows, register them, return the rebuild."""
    fields = _Fields(reply.fields_data, options, reply.primary_field_name)
    used = fields.columns()
    if used:
        rows = used[0].rows
    elif len(reply.fields_data):
        rows = Column(reply.fields_data[0]).rows
    else:
        rows = 0
    if _failed(reply.status):
        if rows:
            raise MalformedBody("an error status in a reply with rows")
        return _error(reply, _REPLIES[QUERY])
    _columns_of(rows, used)
    _counted(reply.element_indices, rows, "'element_indices'")
    for row in range(rows):
        fields.read(hits, row, None)
    names = fields.names()

    def rebuild(selection: Selection) -> Any:
        kept, _, replaced = _kept(selection, (rows,))
        out = _message(_REPLIES[QUERY])(
            status=_ok_status(reply.status),
            collection_name=reply.collection_name,
            output_fields=[name for name in reply.output_fields if name in names],
            session_ts=reply.session_ts,
            primary_field_name=reply.primary_field_name,
        )
        out.fields_data.extend(fields.cut(kept, replaced))
        if len(reply.element_indices):
            out.element_indices.extend(reply.element_indices[row] for row in kept)
        return out

    return rebuild


class MilvusGrpcFormat(ResponseAdapter[str], MilvusGrpcRequests):
    """Adapter for Milvus' gRPC API (``MilvusService``): filters ``Search``,
    ``HybridSearch`` and ``Query`` replies, rewrites their requests."""

    name = "milvus_grpc"

    def __init__(
        self,
        *,
        text_field: str = "text",
        id_field: str | None = None,
        hashed_fields: list[str] | None = None,
        releasable_fields: list[str] | None = None,
    ) -> None:
        """``id_field`` None: the chunk id is the primary key. ``hashed_fields`` and
        ``releasable_fields`` name the fields (dotted paths into JSON fields and the
        dynamic field) that go out beside the text and id: checked against the chunk
        record's ``payload_sha256``, or unverified. Every other field is dropped."""
        self.text_field = text_field_option(text_field)
        self.id_field = id_field_option(id_field, self.text_field)
        fields = ReleasedFields.from_options(hashed_fields, releasable_fields)
        self._options = _Options(self.text_field, self.id_field, fields)
        # Candidates are read column by column; the layout is for the shared
        # Hits collector (hashed fields) and says what a problem calls a row.
        self._layout = HitLayout(
            "row",
            Field((self.id_field or "id",), "primary key"),
            Field((self.text_field,), f"field {self.text_field!r}"),
            None,
            fields=fields,
        )

    def route_kind(self, route: Route) -> RouteKind | None:
        """What a ``MilvusService`` method does (``KINDS``; see the module docstring);
        CONTENT for a method the gate does not know, None for other paths."""
        called = method(route)
        if called is None:
            return None
        return KINDS.get(called, RouteKind.CONTENT)

    def _shape(self, route: Route) -> str | None:
        called = method(route)
        return called if called in _REPLIES else None

    def _load(self, body: bytes, shape: str) -> tuple[bytes, Any]:
        # The body goes along: a reply with nothing removed is sent as it came.
        return body, grpc_adapter.decode_unary(body, _REPLIES[shape])

    def _read(self, document: tuple[bytes, Any], shape: str) -> _Rows:
        body, reply = document
        hits = Hits(self._layout)
        if shape == QUERY:
            rebuild = _query(reply, hits, self._options)
        else:
            rebuild = _search(reply, hits, self._options)
        unknown = grpc_messages.has_unknown_fields(reply)
        return _Rows(hits, body, reply, unknown, rebuild, sub_results=1)
